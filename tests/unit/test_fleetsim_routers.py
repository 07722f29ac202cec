"""fleetsim with several routers, the publisher's change rule, the llmd scrape and client errors."""

from __future__ import annotations

import math

import pytest

from tidegate.controlplane.publisher import routing_key
from tidegate.fleetsim import results, workload
from tidegate.fleetsim.sim import CLIENT_ERROR, SimConfig, Simulation, servable, session_router
from tidegate.policy import registry
from tidegate.router.main import RouterConfig
from tidegate.simulator.profiles import get_profile
from tidegate.v1 import records_pb2

H100 = get_profile("llama3-8b-h100")
TINY = get_profile("tiny-h100")


class FakeFirstPick:
    """Records what it was shown and picks the first candidate."""

    name = "fake_first"

    def __init__(self, scrape_interval_s: float | None = None) -> None:
        self.scrape_interval_s = scrape_interval_s
        self.seen: list[tuple[str, dict[str, int]]] = []
        self.entries: list[tuple] = []
        self.max_tokens: list[int | None] = []

    def pick(self, snapshot, request, rng):
        self.seen.append((request.req_id, dict(snapshot.inflight)))
        self.max_tokens.append(request.max_tokens)
        self.entries.append(snapshot.entries)
        cands = snapshot.candidates()
        return registry.make_pick(cands[0], "first", 0.0, len(cands)) if cands else None


def reqs_with_sessions(n: int = 80, sessions: int = 5) -> list[workload.SimRequest]:
    return [workload.SimRequest(i, 0.05 * i, 300, 20, prefix_hashes=(1000 + i % sessions, i)) for i in range(n)]


@pytest.mark.parametrize(("prompt", "output", "profiles", "ok"), [
    (100, 20, [TINY], True),
    (TINY.kv_capacity_tokens + 1, 5, [TINY], False),             # beyond the only KV cache
    (TINY.kv_capacity_tokens + 1, 5, [TINY, H100], True),        # one replica can
    (H100.max_model_len - 10, 11, [H100], False),                # prompt + output beyond the context
    (H100.max_model_len - 10, 10, [H100], True),
])
def test_servable(prompt, output, profiles, ok):
    assert servable(profiles, prompt, output) is ok


@pytest.mark.parametrize(("hashes", "routers", "want"), [
    ((), 4, None),
    ((7,), 1, 0),
    ((7, 1), 4, session_router(workload.SimRequest(0, 0.0, 1, 1, (7, 2)), 4)),  # only the first hash counts
])
def test_session_router(hashes, routers, want):
    assert session_router(workload.SimRequest(0, 0.0, 1, 1, hashes), routers) == want


def test_session_router_is_stable_and_spreads():
    keys = [session_router(workload.SimRequest(0, 0.0, 1, 1, (h,)), 4) for h in range(200)]
    assert keys == [session_router(workload.SimRequest(0, 0.0, 1, 1, (h,)), 4) for h in range(200)]
    assert set(keys) == {0, 1, 2, 3}


def test_config_rejects_bad_router_settings():
    with pytest.raises(ValueError, match="routers"):
        SimConfig(routers=0)
    with pytest.raises(ValueError, match="router_spread"):
        SimConfig(router_spread="random")
    with pytest.raises(ValueError, match="router_offset"):
        SimConfig(router_offset=-1)


def test_one_policy_instance_per_router():
    pol = FakeFirstPick()
    with pytest.raises(ValueError, match="one policy instance per router"):
        Simulation([H100], [pol], reqs_with_sessions(), SimConfig(routers=2))
    with pytest.raises(ValueError, match="its own policy instance"):
        Simulation([H100], [pol, pol], reqs_with_sessions(), SimConfig(routers=2))


def test_round_robin_spread_gives_each_router_its_share_and_its_own_inflight():
    pols = [FakeFirstPick() for _ in range(4)]
    reqs = reqs_with_sessions()
    sim = Simulation([H100] * 2, pols, reqs, SimConfig(routers=4))
    res = sim.run()
    assert [len(p.seen) for p in pols] == [20, 20, 20, 20]
    assert [r.router for r in res.records] == [i % 4 for i in range(80)]
    # A router's in-flight view counts only its own requests: never more than it has sent.
    for k, p in enumerate(pols):
        for n, (_, inflight) in enumerate(p.seen):
            assert sum(inflight.values()) <= n
        assert set(sim.routers[k].inflight.values()) == {0}


@pytest.mark.parametrize(("hide", "want"), [(False, 20), (True, None)])
def test_hide_max_tokens_sends_requests_without_the_true_output_length(hide, want):
    pol = FakeFirstPick()
    res = Simulation([H100], [pol], reqs_with_sessions(8), SimConfig(hide_max_tokens=hide)).run()
    assert pol.max_tokens == [want] * 8
    # The replica still generates the trace's output length: only what the router sees changes.
    assert all(r.finish_s is not None for r in res.records)


@pytest.mark.parametrize(("cap", "want"), [(None, 20), (4096, 4096), (5, 20)])
def test_a_max_tokens_cap_is_sent_above_the_true_output_never_below(cap, want):
    pol = FakeFirstPick()
    res = Simulation([H100], [pol], reqs_with_sessions(8), SimConfig(max_tokens_cap=cap)).run()
    assert pol.max_tokens == [want] * 8
    # The engines write the trace's output whatever the cap.
    assert all(r.finish_s is not None for r in res.records)


def test_a_max_tokens_cap_must_be_positive():
    with pytest.raises(ValueError, match="max_tokens_cap"):
        SimConfig(max_tokens_cap=0)


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 1.0])
def test_a_share_of_the_requests_comes_without_max_tokens_chosen_by_the_seed(share):
    def hidden(seed: int) -> list[int]:
        pol = FakeFirstPick()
        Simulation([H100], [pol], reqs_with_sessions(400), SimConfig(hide_max_tokens_share=share), seed=seed).run()
        assert set(pol.max_tokens) <= {None, 20}
        return [i for i, m in enumerate(pol.max_tokens) if m is None]

    first = hidden(0)
    assert len(first) == pytest.approx(400 * share, abs=30)
    assert hidden(0) == first                       # the same requests for the same seed
    if 0.0 < share < 1.0:
        assert hidden(1) != first                   # others for another


def test_hide_max_tokens_share_must_be_a_share():
    with pytest.raises(ValueError, match="hide_max_tokens_share"):
        SimConfig(hide_max_tokens_share=1.5)


def test_hash_spread_keeps_a_session_on_one_router():
    pols = [FakeFirstPick() for _ in range(3)]
    res = Simulation([H100] * 2, pols, reqs_with_sessions(sessions=5), SimConfig(routers=3, router_spread="hash")).run()
    by_session: dict[int, set[int]] = {}
    for r in res.records:
        by_session.setdefault(r.req.prefix_hashes[0], set()).add(r.router)
    assert all(len(v) == 1 for v in by_session.values())
    assert len({next(iter(v)) for v in by_session.values()}) > 1  # five sessions do not all meet one router


@pytest.mark.parametrize(("routers", "offset", "want"), [
    (2, 0, [0, 1, 0, 1, 0, 1]),
    (2, 1, [1, 0, 1, 0, 1, 0]),
    (3, 2, [2, 0, 1, 2, 0, 1]),
    (3, 5, [2, 0, 1, 2, 0, 1]),   # modulo the routers
])
def test_router_offset_picks_the_first_router(routers, offset, want):
    pols = [FakeFirstPick() for _ in range(routers)]
    reqs = [workload.SimRequest(i, 0.05 * i, 300, 20) for i in range(6)]
    res = Simulation([H100], pols, reqs, SimConfig(routers=routers, router_offset=offset)).run()
    assert [r.router for r in sorted(res.records, key=lambda r: r.req.arrival_s)] == want


def test_hash_spread_without_prefix_hashes_falls_back_to_round_robin():
    pols = [FakeFirstPick() for _ in range(2)]
    reqs = [workload.SimRequest(i, 0.05 * i, 300, 20) for i in range(10)]
    res = Simulation([H100], pols, reqs, SimConfig(routers=2, router_spread="hash")).run()
    assert [r.router for r in res.records] == [0, 1] * 5


def test_each_router_keeps_its_own_prefix_index():
    pols = [registry.create("sglang_cache_aware") for _ in range(2)]
    Simulation([H100] * 2, pols, reqs_with_sessions(), SimConfig(routers=2)).run()
    sizes = [sum(t.size_tokens for t in p._trees.values()) for p in pols]
    assert sizes[0] > 0 and sizes[1] > 0
    assert sizes[0] == pytest.approx(sizes[1], rel=0.2)  # each saw half: not the whole stream


def test_tables_are_written_only_when_the_routing_key_changes():
    reqs = [workload.SimRequest(i, i * 0.02, 2000, 200) for i in range(300)]  # queues build, KV moves
    res = Simulation([H100] * 2, registry.create("least_request"), reqs).run()
    keys = [routing_key(_entries(d.entries)) for d in res.deliveries]
    assert keys and all(a != b for a, b in zip(keys, keys[1:], strict=False))
    # Queue and KV moved at every tick; the tables were written at far fewer of them.
    ticks = (res.end_s - res.deliveries[0].computed_s) / SimConfig().tick_s
    assert len(res.deliveries) < ticks / 2


def _entries(infos) -> list[records_pb2.RouteEntry]:
    return [records_pb2.RouteEntry(replica_id=e.replica_id, endpoint=e.endpoint, state=e.state, weight=e.weight)
            for e in infos]


def test_llmd_scrapes_every_50ms_by_default_and_llmd_table_does_not():
    reqs = reqs_with_sessions()
    assert Simulation([H100], registry.create("llmd"), reqs).routers[0].scrape_s == 0.05
    assert Simulation([H100], registry.create("llmd_table"), reqs).routers[0].scrape_s is None
    assert Simulation([H100], registry.create("least_kv"), reqs).routers[0].scrape_s is None
    # --scrape-ms overrides every policy's own choice.
    assert Simulation([H100], registry.create("llmd_table"), reqs,
                      SimConfig(scrape_interval_s=0.2)).routers[0].scrape_s == 0.2


def test_a_scraping_policy_sees_fresher_queues_than_the_table():
    reqs = [workload.SimRequest(i, i * 0.02, 2000, 200) for i in range(100)]
    plain, scraping = FakeFirstPick(), FakeFirstPick(scrape_interval_s=0.05)
    Simulation([H100] * 2, plain, reqs).run()
    Simulation([H100] * 2, scraping, reqs).run()
    distinct = [len({e[0].running + e[0].waiting for e in p.entries}) for p in (plain, scraping)]
    assert distinct[0] < distinct[1]


def test_only_the_clairvoyant_reads_live_state():
    reqs = reqs_with_sessions()
    assert Simulation([H100], registry.create("clairvoyant"), reqs).routers[0].wants_live
    assert not Simulation([H100], registry.create("llmd"), reqs).routers[0].wants_live


def test_client_errors_are_reported_apart_and_left_out_of_attainment():
    big = TINY.max_model_len
    reqs = [workload.SimRequest(0, 0.0, big, 10)] + [workload.SimRequest(i, 0.2 * i, 200, 10) for i in range(1, 10)]
    res = Simulation([TINY], registry.create("least_request"), reqs).run()
    assert res.records[0].rejected == CLIENT_ERROR and res.records[0].replica is None
    s = results.summarize(res, policy="least_request", load=None, slo_ttft_s=10.0, slo_tpot_s=1.0)
    assert s["client_errors"] == 1 and s["rejected"] == 0 and "client_error" not in s["rejected_by_reason"]
    assert s["slo_attainment"] == 1.0  # 9 of 9 servable, not 9 of 10
    assert s["requests"] == 10 and s["completed"] == 9


def test_offered_and_goodput_share_one_denominator():
    reqs = [workload.SimRequest(i, 0.5 * i, 200, 10) for i in range(11)]  # span 5 s
    res = Simulation([H100], registry.create("least_request"), reqs).run()
    s = results.summarize(res, policy="least_request", load=None, slo_ttft_s=10.0, slo_tpot_s=1.0)
    assert s["offered_rps"] == pytest.approx(11 / 5) == s["goodput_rps"] == s["throughput_rps"]
    assert workload.native_rate(reqs) == pytest.approx(11 / 5)


def test_prefix_hit_rate_counts_cached_prompt_tokens():
    shared = tuple(range(1, 20))  # 19 blocks of 16 tokens shared by every request
    reqs = [workload.SimRequest(i, 1.0 * i, 320, 5, prefix_hashes=shared + (100 + i,)) for i in range(5)]
    res = Simulation([H100], registry.create("least_request"), reqs).run()
    s = results.summarize(res, policy="least_request", load=None, slo_ttft_s=10.0, slo_tpot_s=1.0)
    cached = sum(r.cached_tokens for r in res.records)
    assert cached > 0
    assert s["prefix_hit_rate"] == pytest.approx(cached / (5 * 320), abs=1e-4)
    assert 0.6 < s["prefix_hit_rate"] < 0.95  # the first request misses; the rest hit 19 of 20 blocks
    cold = [workload.SimRequest(i, 1.0 * i, 320, 5) for i in range(5)]
    s0 = results.summarize(Simulation([H100], registry.create("least_request"), cold).run(), policy="x", load=None,
                           slo_ttft_s=10.0, slo_tpot_s=1.0)
    assert s0["prefix_hit_rate"] == 0.0


def test_a_run_stops_once_it_is_sure_to_miss_the_target():
    reqs = [workload.SimRequest(i, i * 0.005, 3000, 300) for i in range(400)]  # far past one TINY replica
    full = Simulation([TINY], registry.create("least_request"), reqs).run()
    s_full = results.summarize(full, policy="x", load=None, slo_ttft_s=1.0, slo_tpot_s=0.1)
    assert s_full["slo_attainment"] < 0.95 and not full.stopped_early
    budget = int(400 * 0.05)
    cut = Simulation([TINY], registry.create("least_request"), reqs,
                     SimConfig(stop_after_misses=budget, stop_slo=(1.0, 0.1))).run()
    s_cut = results.summarize(cut, policy="x", load=None, slo_ttft_s=1.0, slo_tpot_s=0.1)
    assert cut.stopped_early and s_cut["stopped_early"]
    assert cut.end_s < full.end_s
    assert s_cut["slo_attainment"] < 0.95
    assert sum(1 for r in cut.records if r.rejected == "unfinished") > 0


def test_a_passing_run_is_not_cut():
    reqs = [workload.SimRequest(i, i * 0.2, 300, 20) for i in range(50)]
    plain = Simulation([H100], registry.create("least_request"), reqs).run()
    guarded = Simulation([H100], registry.create("least_request"), reqs,
                         SimConfig(stop_after_misses=2, stop_slo=(2.0, 0.1))).run()
    assert not guarded.stopped_early
    assert [(r.first_token_s, r.finish_s) for r in guarded.records] == [(r.first_token_s, r.finish_s)
                                                                         for r in plain.records]


def _heard(peer_interval_s, policy: str = "tidegate", routers: int = 2) -> tuple[list[list[str]], list]:
    """Which peers each router heard from (on_peer_load calls), and the run's fingerprint."""
    pols = [registry.create(policy) for _ in range(routers)]
    heard: list[list[str]] = [[] for _ in pols]
    for k, pol in enumerate(pols):
        if hasattr(pol, "on_peer_load"):
            inner = pol.on_peer_load

            def spy(router_id, report, _k=k, _inner=inner):
                heard[_k].append(router_id)
                _inner(router_id, report)
            pol.on_peer_load = spy
    cfg = SimConfig(routers=routers) if peer_interval_s == "default" else SimConfig(routers=routers,
                                                                                    peer_interval_s=peer_interval_s)
    res = Simulation([H100] * 2, pols, reqs_with_sessions(), cfg).run()
    return heard, [(r.req.index, r.router, r.replica, r.first_token_s, r.finish_s) for r in res.records]


def test_routers_exchange_load_reports_every_100ms_by_default_and_0_turns_it_off():
    """As deployed: the live router writes its load record every 0.1 s (--peer-load-interval-s)."""
    assert SimConfig().peer_interval_s == RouterConfig().peer_load_interval_s   # as deployed
    heard, _ = _heard("default")
    # ~4 s of arrivals plus the drain: dozens of reports each way, every one from the other router.
    assert len(heard[0]) >= 30 and len(heard[1]) >= 30
    assert set(heard[0]) == {"router-1"} and set(heard[1]) == {"router-0"}
    assert len(_heard(0.5)[0][0]) < len(heard[0]) / 3
    for off in (0, 0.0, None):
        assert _heard(off)[0] == [[], []]


def test_reports_change_the_tidegate_routing_and_leave_baselines_alone():
    assert _heard("default")[1] != _heard(0)[1]
    for policy in ("llmd", "sglang_cache_aware", "least_request"):
        assert not callable(getattr(registry.create(policy), "take_report", None))
        assert _heard("default", policy)[1] == _heard(0, policy)[1] == _heard(None, policy)[1]


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf, -math.inf])
def test_config_refuses_a_negative_or_non_finite_peer_interval(bad):
    with pytest.raises(ValueError, match="peer_interval_s"):
        SimConfig(peer_interval_s=bad)
