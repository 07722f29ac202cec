"""The virtual-time fleet simulator's event loop (fleetsim.sim) and simulated agent."""

from __future__ import annotations

import dataclasses
import random

import pytest

from tidegate.agent.histograms import HistogramWindow
from tidegate.fleetsim import results, workload
from tidegate.fleetsim.agent import CumulativeHistogram, RollingWindow
from tidegate.fleetsim.sim import SimConfig, Simulation, Slowdown
from tidegate.policy import registry
from tidegate.policy.admission import AdmissionConfig
from tidegate.policy.registry import RouteInfo
from tidegate.simulator.profiles import get_profile
from tidegate.v1 import records_pb2

H100 = get_profile("llama3-8b-h100")
TINY = get_profile("tiny-h100")


def small_workload(n: int = 120, rate: float = 8.0, seed: int = 3, arrivals: str = "poisson") -> list:
    spec = workload.SyntheticSpec(arrivals=arrivals, rate_rps=rate, requests=n, prompt_mean=600, output_mean=60,
                                  max_prompt=4000, max_output=400)
    return workload.synthetic(spec, seed)


def run(policy: str = "tidegate", *, reqs=None, profiles=None, cfg=None, seed: int = 0):
    return Simulation(profiles or [H100] * 3, registry.create(policy), reqs or small_workload(), cfg, seed=seed).run()


def fingerprint(res) -> list:
    return [(r.req.index, r.replica, r.rejected, r.first_token_s, r.finish_s, r.preemptions) for r in res.records]


@pytest.mark.parametrize("policy", ["tidegate", "random", "llmd", "llmd_table", "clairvoyant"])
def test_same_seed_same_run(policy):
    assert fingerprint(run(policy, seed=7)) == fingerprint(run(policy, seed=7))


def test_other_seed_other_random_choices():
    a = [r.replica for r in run("random", seed=1).records]
    b = [r.replica for r in run("random", seed=2).records]
    assert a != b


@pytest.mark.parametrize("policy", registry.names())
def test_every_request_finishes_or_is_rejected(policy):
    # tiny-h100 (32k-token KV) under a burst: queueing and preemption, but nothing is lost.
    reqs = small_workload(n=150, rate=40.0, arrivals="gamma")
    res = run(policy, reqs=reqs, profiles=[TINY] * 2)
    assert len(res.records) == len(reqs)
    for r in res.records:
        assert (r.finish_s is not None) != bool(r.rejected), r
        if r.finish_s is not None:
            assert r.req.arrival_s <= r.first_token_s <= r.finish_s
    s = results.summarize(res, policy=policy, load=None, slo_ttft_s=2, slo_tpot_s=0.1)
    assert s["completed"] + s["rejected"] == s["requests"] == len(reqs)
    assert s["rejected"] == 0


def test_router_inflight_returns_to_zero():
    sim = Simulation([H100] * 3, registry.create("least_request"), small_workload())
    sim.run()
    assert set(sim.inflight.values()) == {0}


def test_preemptions_show_up_under_kv_pressure():
    reqs = [workload.SimRequest(i, i * 0.01, 3000, 1500) for i in range(40)]
    res = run("round_robin", reqs=reqs, profiles=[TINY])
    assert sum(r.preemptions for r in res.records) > 0
    assert res.replicas[0].preemptions == sum(r.preemptions for r in res.records)


def test_tables_reach_the_router_after_the_propagation_delay():
    cfg = SimConfig(propagation_s=0.25)
    res = run(cfg=cfg)
    assert res.deliveries
    for d in res.deliveries:
        assert d.delivered_s == pytest.approx(d.computed_s + 0.25, abs=1e-9)
    assert [d.delivered_s for d in res.deliveries] == sorted(d.delivered_s for d in res.deliveries)


@pytest.mark.parametrize("admission", [None, AdmissionConfig()])
def test_no_table_yet_means_no_replica(admission):
    # No warm-up: the first report is at most 1 s in, the first tick with it at <= 1.5 s, and its
    # table lands 2 s later. Requests before that find no routable replica; later ones are served.
    cfg = SimConfig(warmup_s=0.0, propagation_s=2.0, admission=admission)
    reqs = [workload.SimRequest(i, i * 0.1, 200, 20) for i in range(60)]  # 0 .. 5.9 s
    res = run(cfg=cfg, reqs=reqs)
    # Refused at once, and counted in the time to reject like the admission's rejections.
    s = results.summarize(res, policy="tidegate", load=None, slo_ttft_s=2, slo_tpot_s=0.1)
    refused = [r for r in res.records if r.rejected == "no_replica"]
    assert refused and all(r.reject_s == r.req.arrival_s for r in refused)
    assert s["rejected_within_50ms"] == len(refused)
    first_routable = min(d.delivered_s for d in res.deliveries
                         if any(e.weight > 0 for e in d.entries))
    assert 2.0 < first_routable <= 3.5 + 1e-9
    for r in res.records:
        if r.req.arrival_s < first_routable:
            assert r.rejected == "no_replica"
        else:
            assert r.finish_s is not None


def test_tables_carry_the_real_weight_policy_states():
    res = run()
    last = res.deliveries[-1].entries
    assert {e.replica_id for e in last} == {"replica-00", "replica-01", "replica-02"}
    assert all(e.state == records_pb2.REPLICA_STATE_READY and 0 < e.weight <= 100 for e in last)
    assert all(e.kv_capacity_tokens == H100.kv_capacity_tokens for e in last)


def test_given_replica_ids_name_the_replicas_and_move_the_prefix_homes():
    """Rendezvous homes hash the ids: a live fleet's ids (replica-0, ...) place the same prefixes
    elsewhere than the default ones, so a cross-check must name its replicas as the live fleet does."""
    reqs = [workload.SimRequest(i, i * 0.2, 600, 20, prefix_hashes=(i % 8, 100 + i % 8)) for i in range(80)]
    named = run(reqs=reqs, cfg=SimConfig(replica_ids=("replica-0", "replica-1", "replica-2")))
    assert {e.replica_id for e in named.deliveries[-1].entries} == {"replica-0", "replica-1", "replica-2"}
    assert {r.replica for r in named.records} <= {"replica-0", "replica-1", "replica-2"}
    default = run(reqs=reqs)
    homes = [r.replica[-1] for r in default.records]
    assert [r.replica[-1] for r in named.records] != homes


@pytest.mark.parametrize("ids", [("a", "a", "b"), ("a", "", "b")])
def test_replica_ids_must_be_distinct_and_named(ids):
    with pytest.raises(ValueError, match="distinct and non-empty"):
        SimConfig(replica_ids=ids)


def test_replica_ids_must_name_every_replica():
    with pytest.raises(ValueError, match="2 replica ids for 3 replicas"):
        run(cfg=SimConfig(replica_ids=("a", "b")))


def test_step_by_step_path_matches_the_engine_fast_path():
    reqs = small_workload(n=80, rate=20.0)
    fast = run("least_request", reqs=reqs, cfg=SimConfig(engine_fast_path=True))
    slow = run("least_request", reqs=reqs, cfg=SimConfig(engine_fast_path=False))
    assert fast.engine_fast_path and not slow.engine_fast_path
    for a, b in zip(fast.records, slow.records, strict=True):
        assert a.replica == b.replica
        assert a.first_token_s == pytest.approx(b.first_token_s, abs=1e-6)
        assert a.finish_s == pytest.approx(b.finish_s, abs=1e-6)
    fb = {r.replica_id: r.busy_s for r in fast.replicas}
    for r in slow.replicas:
        assert fb[r.replica_id] == pytest.approx(r.busy_s, rel=1e-6, abs=1e-6)


def test_mixed_profiles():
    res = run(profiles=[H100, get_profile("llama3-8b-h200")])
    assert [r.profile for r in res.replicas] == ["llama3-8b-h100", "llama3-8b-h200"]
    assert all(r.finish_s is not None for r in res.records)


def test_prompt_larger_than_every_kv_cache_is_a_client_error():
    reqs = [workload.SimRequest(0, 0.0, TINY.kv_capacity_tokens + 1, 5), workload.SimRequest(1, 0.1, 100, 5)]
    res = run(reqs=reqs, profiles=[TINY])
    assert [r.rejected for r in res.records] == ["client_error", ""]


def test_rolling_window_equals_the_agents_histogram_window():
    rng = random.Random(5)
    hist = CumulativeHistogram((0.01, 0.1, 1.0, 10.0))
    ours, theirs = RollingWindow(5.0), HistogramWindow(5.0)
    for step in range(60):
        t = step * 0.7
        for _ in range(rng.randrange(0, 4)):
            hist.observe(rng.expovariate(2.0))
        cum = hist.cumulative()
        ours.observe(t, cum)
        theirs.observe(t, cum)
        got, want = ours.buckets(t), theirs.buckets(t)
        if want:
            assert [le for le, _ in got] == [le for le, _ in want]
            assert [c for _, c in got] == pytest.approx([c for _, c in want])
        else:
            assert all(c == 0 for _, c in got)
        a, b = ours.summary(t), theirs.summary(t)
        assert (a.p50_ms, a.p95_ms, a.p99_ms, a.count) == pytest.approx((b.p50_ms, b.p95_ms, b.p99_ms, b.count))


class _Recorder:
    """A policy that records what it was shown and picks the first candidate."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[RouteInfo, ...]] = []

    def pick(self, snapshot, request, rng):
        self.seen.append(snapshot.entries)
        cands = snapshot.candidates()
        return registry.make_pick(cands[0], "first", 0.0, len(cands)) if cands else None


def test_router_scrape_refreshes_queue_and_kv_but_not_weights():
    reqs = [workload.SimRequest(i, i * 0.02, 2000, 200) for i in range(100)]  # 50 rps onto one replica
    plain, scraped = _Recorder(), _Recorder()
    Simulation([H100] * 2, plain, reqs, SimConfig()).run()
    Simulation([H100] * 2, scraped, reqs, SimConfig(scrape_interval_s=0.05)).run()
    # Between tables the table's figures stand still; the scrape sees the queue build up.
    assert len({e[0].running + e[0].waiting for e in plain.seen}) < len({e[0].running + e[0].waiting
                                                                          for e in scraped.seen})
    assert [tuple(x.weight for x in e) for e in plain.seen] == [tuple(x.weight for x in e) for e in scraped.seen]


def test_transport_hops_add_to_ttft_not_tpot():
    # Sparse arrivals on an idle fleet: each request alone, so only the hops differ.
    reqs = [workload.SimRequest(i, 5.0 + 2.0 * i, 500, 20) for i in range(5)]
    ideal = run(reqs=reqs, cfg=SimConfig(hop_s=0.0))
    hops = run(reqs=reqs, cfg=SimConfig(hop_s=0.004))
    for a, b in zip(sorted(ideal.records, key=lambda r: r.req.req_id),
                    sorted(hops.records, key=lambda r: r.req.req_id), strict=True):
        assert b.ttft_s == pytest.approx(a.ttft_s + 0.008, abs=1e-9)
        assert b.tpot_s == pytest.approx(a.tpot_s, abs=1e-9)


def test_negative_hop_is_rejected():
    with pytest.raises(ValueError, match="hop_s"):
        SimConfig(hop_s=-0.001)


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_slowdown_applies_from_its_onset_to_its_replica_only(fast_path):
    reqs = small_workload(n=160, rate=8.0)  # ~20 s of arrivals
    onset = 10.0
    cfg = SimConfig(engine_fast_path=fast_path)
    healthy = run("round_robin", reqs=reqs, profiles=[H100] * 2, cfg=cfg)
    slowed = run("round_robin", reqs=reqs, profiles=[H100] * 2,
                 cfg=dataclasses.replace(cfg, slowdowns=(Slowdown(1, 3.0, onset),)))
    first = min(r.arrival_s for r in reqs)

    def tpot(res, replica: str, after: bool) -> list[float]:
        return [r.tpot_s for r in res.records if r.replica == replica and r.tpot_s is not None
                and (r.first_token_s - first > onset + 1 if after else r.finish_s - first < onset)]

    assert tpot(slowed, "replica-00", True) == tpot(healthy, "replica-00", True)  # round_robin: same requests
    assert tpot(slowed, "replica-01", False) == tpot(healthy, "replica-01", False)  # before the onset
    late_h, late_s = tpot(healthy, "replica-01", True), tpot(slowed, "replica-01", True)
    assert late_h and sum(late_s) / len(late_s) > 2.5 * sum(late_h) / len(late_h)


def test_a_slowdown_must_name_a_replica_of_the_fleet():
    with pytest.raises(ValueError, match="fleet has 2"):
        run(profiles=[H100] * 2, cfg=SimConfig(slowdowns=(Slowdown(2, 2.0),)))
    with pytest.raises(ValueError, match="at most one per replica"):
        SimConfig(slowdowns=(Slowdown(0, 2.0), Slowdown(0, 3.0, 5.0)))
    with pytest.raises(ValueError, match="factor"):
        Slowdown(0, 1.0)


def test_tidegate_learns_a_replica_slowed_mid_run_from_its_telemetry_and_steers_around_it():
    # 1.8x: below outlier ejection's 3x latency factor, so only the learned rates can tell. Ten
    # workloads, judged together: on one 40 s run of 4 replicas a fit that crosses from one regime
    # to the other is fragile, and which runs end with the slowed replica's prefill fit still off
    # is the luck of its traffic (measured before the rule that holds first fits of a faster kind
    # to the pool's median, predict.unbacked_prefill: 0 of these ten at simulator seed 0, 3 and 3
    # at seeds 1 and 2; with it 2 at seed 0). What must hold: its fits show it slower on most
    # runs, it is never ejected, and it gets well under least_request's share (before the rule
    # 0.51 of it over these ten, with it 0.59).
    cfg = SimConfig(slowdowns=(Slowdown(3, 1.8, 10.0),))
    sent: dict[str, list[float]] = {"tidegate": [], "least_request": []}
    slower = 0
    for wseed in range(3, 13):
        spec = workload.SyntheticSpec(arrivals="poisson", rate_rps=12.0, requests=480, prompt_mean=1500,
                                      output_mean=120, max_prompt=6000, max_output=600)
        reqs = workload.synthetic(spec, wseed)
        first = reqs[0].arrival_s
        for policy in sent:
            sim = Simulation([H100] * 4, registry.create(policy), reqs, cfg, seed=0)
            res = sim.run()
            late = [r.replica for r in res.records if r.req.arrival_s - first > 20]
            sent[policy].append(late.count("replica-03") / len(late))
            if policy == "tidegate":
                table = {e.replica_id: e for e in sim.routers[0].table}
                slowed = table.pop("replica-03")
                slower += (0 < slowed.prefill_tokens_per_s < min(e.prefill_tokens_per_s for e in table.values())
                           and slowed.decode_step_base_ms > max(e.decode_step_base_ms for e in table.values()))
                assert slowed.weight > 0  # not ejected: routed around
    assert slower >= 7, slower
    assert min(sent["least_request"]) > 0.1
    assert sum(sent["tidegate"]) < sum(sent["least_request"]) * 2 / 3, sent
