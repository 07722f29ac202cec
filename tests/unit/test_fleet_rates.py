"""Fitted engine rates through the control plane: FleetState feeds each replica's estimator with
its reports' EngineWork windows, the views carry the published figures, route entries and the
publisher's change rule include them; the virtual-time simulator's agent fills the same windows."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest

from tidegate.controlplane.fleet import FleetState
from tidegate.fleetsim.agent import SimAgent
from tidegate.policy.rates import RateEstimatorConfig
from tidegate.policy.weights import ReplicaView, WeightPolicyConfig, compute_pool_tables, routing_key
from tidegate.simulator.engine import Engine
from tidegate.simulator.profiles import get_profile
from tidegate.v1 import telemetry_pb2


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def hello(endpoint: str = "http://127.0.0.1:9", **prior: float) -> telemetry_pb2.Hello:
    return telemetry_pb2.Hello(replica_id="r1", pool="m", endpoint=endpoint, protocol_version=1, **prior)


def report(seq: int, batch: float = 30.0, prefill_per_step: float = 200.0,
           tokens_per_ms: float = 47.6) -> telemetry_pb2.Report:
    """A second's work of an engine with step_ms = 7.5 + 0.07 * batch + prefill / tokens_per_ms
    (47.6: 47,600 prefill tokens/s)."""
    step_ms = 7.5 + 0.07 * batch + prefill_per_step / tokens_per_ms
    steps = round(1000.0 / step_ms)
    work = telemetry_pb2.EngineWork(interval_s=1.0, steps=steps, prompt_tokens=steps * prefill_per_step,
                                    generation_tokens=steps * batch, itl_sum_s=steps * batch * step_ms / 1000.0,
                                    itl_count=steps * batch)
    return telemetry_pb2.Report(seq=seq, engine=telemetry_pb2.EngineStats(
        healthy=True, num_requests_running=int(batch), kv_capacity_tokens=1000, kv_free_tokens=500,
        has_kv_capacity=True, work=work))


# 1 s reports the estimator merges before each fit (rates.py: min_window_s; off by default, on
# here, without the default's lead term, so that the control plane's handling of a pending merge
# is exercised), published from the first fit on (min_windows: the evidence rule has its own
# tests in test_rates.py) so that these tests see each merge's fit.
RATES = RateEstimatorConfig(min_window_s=2.0, min_windows=1, lead=False)
MERGED = max(1, math.ceil(RATES.min_window_s))


@pytest.fixture
def fleet() -> tuple[FleetState, FakeClock]:
    clock = FakeClock()
    return FleetState(WeightPolicyConfig(), now=clock, rate_config=RATES), clock


def _feed(fs: FleetState, clock: FakeClock, h: telemetry_pb2.Hello, n: int, start: int = 1) -> None:
    for i in range(start, start + n):
        clock.t += 1.0
        # Each load held for the span the estimator merges (as load moves over seconds, not from
        # one report to the next): a pattern that repeats within a merge would average out.
        k = (i - 1) // MERGED
        fs.on_report(h, report(i, batch=10 + 7 * (k % 9), prefill_per_step=50 * (k % 5)))


def test_reports_teach_the_view_and_the_table(fleet: tuple[FleetState, FakeClock]) -> None:
    fs, clock = fleet
    h = hello()
    fs.on_hello(h)
    first = max(MERGED, RATES.min_windows)  # reports before the decode figures are published
    for seq in range(1, first + 1):
        assert fs.view("r1").decode_step_base_ms == 0
        clock.t += 1.0
        fs.on_report(h, report(seq, prefill_per_step=0.0))
    v = fs.view("r1")
    assert v.decode_step_base_ms > 0 and v.decode_step_per_seq_ms > 0
    assert v.prefill_tokens_per_s == 0  # no prefill seen yet: unknown, not the prior
    _feed(fs, clock, h, 40, start=first + 1)
    v = fs.view("r1")
    assert v.decode_step_base_ms == pytest.approx(7.5, rel=0.1)
    assert v.decode_step_per_seq_ms == pytest.approx(0.07, rel=0.1)
    assert v.prefill_tokens_per_s == pytest.approx(47_600, rel=0.1)
    (entry,) = compute_pool_tables([v], WeightPolicyConfig())["m"]
    assert (entry.prefill_tokens_per_s, entry.decode_step_base_ms, entry.decode_step_per_seq_ms) == (
        v.prefill_tokens_per_s, v.decode_step_base_ms, v.decode_step_per_seq_ms)


def test_a_new_endpoint_forgets_what_was_learnt(fleet: tuple[FleetState, FakeClock]) -> None:
    fs, clock = fleet
    h = hello()
    fs.on_hello(h)
    _feed(fs, clock, h, 30)
    assert fs.view("r1").decode_step_base_ms > 0
    fs.on_hello(h)  # the same engine reconnecting keeps its fit
    assert fs.view("r1").decode_step_base_ms > 0
    moved = hello(endpoint="http://127.0.0.1:10")
    fs.on_hello(moved)
    v = fs.view("r1")
    assert (v.prefill_tokens_per_s, v.decode_step_base_ms, v.decode_step_per_seq_ms) == (0, 0, 0)


def test_a_profile_prior_in_the_hello_is_published_with_the_first_report(fleet: tuple[FleetState, FakeClock]) -> None:
    fs, clock = fleet
    h = hello(prior_prefill_tokens_per_s=40_000, prior_decode_step_base_ms=8.0, prior_decode_step_per_seq_ms=0.08)
    fs.on_hello(h)
    clock.t += 1.0
    fs.on_report(h, telemetry_pb2.Report(seq=1, engine=telemetry_pb2.EngineStats(healthy=True)))
    v = fs.view("r1")
    assert v.prefill_tokens_per_s == pytest.approx(40_000, rel=0.03)
    assert v.decode_step_base_ms == pytest.approx(8.0, rel=0.03)


def test_rates_are_routing_relevant_but_informational_noise_is_not() -> None:
    v = ReplicaView(replica_id="r1", pool="m", has_report=True, healthy=True, kv_capacity_tokens=100,
                    kv_free_tokens=100, decode_step_base_ms=7.5, decode_step_per_seq_ms=0.07,
                    prefill_tokens_per_s=47_000)
    cfg = WeightPolicyConfig()

    def key(view: ReplicaView) -> tuple:
        return routing_key(compute_pool_tables([view], cfg)["m"])

    assert key(replace(v, running=7)) == key(v)
    assert key(replace(v, prefill_tokens_per_s=30_000)) != key(v)
    assert key(replace(v, decode_step_per_seq_ms=0.09)) != key(v)


def test_fleetsim_agent_reports_engine_work_windows() -> None:
    engine = Engine(get_profile("llama3-8b-h100"))
    agent = SimAgent("replica-0", "m")
    first = agent.report(engine, 0.0)
    assert first.engine.work == telemetry_pb2.EngineWork()  # the first report is only a baseline
    for i in range(4):
        engine.add_request(f"r{i}", 500, 50, 0.0)
    engine.advance(1.0)
    w = agent.report(engine, 1.0).engine.work
    s = engine.stats()
    assert w.interval_s == 1.0
    assert (w.steps, w.itl_count, w.prompt_tokens) == (s.steps_total, s.itl_count, s.prompt_tokens_total)
    assert w.itl_sum_s == pytest.approx(s.itl_sum_s)
    assert w.busy_s == 0  # the simulated agent mirrors a vLLM engine: no busy-time counter


def test_a_new_stream_or_a_counter_reset_drops_the_pending_merge(fleet: tuple[FleetState, FakeClock]) -> None:
    fs, clock = fleet
    h = hello()
    fs.on_hello(h)
    fs.stream_opened("r1")
    _feed(fs, clock, h, MERGED - 1)
    fs.stream_opened("r1")  # reports sent while no stream was open are lost: no merge across
    _feed(fs, clock, h, MERGED - 1, start=MERGED)
    assert fs.view("r1").decode_step_base_ms == 0  # not yet min_window_s since the new stream
    _feed(fs, clock, h, 1, start=2 * MERGED - 1)
    assert fs.view("r1").decode_step_base_ms > 0
    _feed(fs, clock, h, MERGED - 1, start=2 * MERGED)
    assert fs._replicas["r1"].rates._pending is not None or MERGED == 1
    clock.t += 1.0
    fs.on_report(h, telemetry_pb2.Report(seq=3 * MERGED, engine=telemetry_pb2.EngineStats(
        healthy=True, work=telemetry_pb2.EngineWork())))  # the agent's empty window: a counter went down
    assert fs._replicas["r1"].rates._pending is None


def test_a_new_stream_drops_the_window_waiting_for_its_lead() -> None:
    """With the default lead term a report's window waits for the next report's count; a new
    stream means reports may have been lost between, so the waiting window is dropped, not fitted
    with a lead from another span."""
    clock = FakeClock()
    fs = FleetState(WeightPolicyConfig(), now=clock, rate_config=RateEstimatorConfig(min_windows=1))
    h = hello()
    fs.on_hello(h)
    fs.stream_opened("r1")
    clock.t += 1.0
    fs.on_report(h, report(1, batch=30, prefill_per_step=100))
    rates = fs._replicas["r1"].rates
    assert rates._held is not None and rates.windows == 0
    fs.stream_opened("r1")
    assert rates._held is None and rates.windows == 0
    clock.t += 1.0
    fs.on_report(h, report(2, batch=30, prefill_per_step=100))
    clock.t += 1.0
    fs.on_report(h, report(3, batch=30, prefill_per_step=100))
    assert rates.windows == 1  # the second report's window, with the third's count as its lead


def test_a_replica_claiming_a_faster_kind_of_gpu_shows_the_pools_median_until_its_fit_backs_it(
        fleet: tuple[FleetState, FakeClock]) -> None:
    """predict.unbacked_prefill, wired into the views every table is built from: a replica whose
    engine really prefills 4x faster publishes the pool's median while its fit is a few windows
    old, and its own figure once the windows back it."""
    fs, clock = fleet
    hellos = {rid: telemetry_pb2.Hello(replica_id=rid, pool="m", endpoint=f"http://127.0.0.1:{9 + i}",
                                       protocol_version=1) for i, rid in enumerate(("a", "b", "c", "fast"))}
    for h in hellos.values():
        fs.on_hello(h)
    seen = []
    for i in range(1, 41):
        clock.t += 1.0
        k = (i - 1) // MERGED
        for rid, h in hellos.items():
            prefill = 50 * (k % 5) + (rid != "fast") * 3 * (i % 2)
            fs.on_report(h, report(i, batch=10 + 7 * (k % 9), prefill_per_step=prefill,
                                   tokens_per_ms=190.4 if rid == "fast" else 47.6))
        views = {v.replica_id: v for v in fs.views()}
        fitted = {rid: fs.get(rid).rates.published.prefill_tokens_per_s for rid in hellos}  # type: ignore[union-attr]
        if fitted["fast"] > 1.5 * fitted["a"] > 0:
            seen.append((views["fast"].prefill_tokens_per_s, fitted["fast"], statistics.median(fitted.values())))
    assert seen, "the fast replica's fit claimed another kind"
    first_shown, first_fitted, median = seen[0]
    assert first_shown == median != first_fitted      # unbacked: the pool's median is shown
    last_shown, last_fitted, median = seen[-1]
    assert last_shown == last_fitted > 2.5 * median   # backed: its own
    assert fs.view("fast").prefill_tokens_per_s == last_fitted  # type: ignore[union-attr]
