"""Routers' load records through the store (router/peer_load.py): the record's round trip, the
publisher's write rule and failures, and the watcher feeding real `tidegate` policy instances.
The store is the in-memory fake (`InMemoryStore`, etcd's semantics for leases and watches); the
live path through a real etcd and real router processes is tests/e2e/test_peer_load_live.py."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
import structlog

from tidegate import keys
from tidegate.policy.peer_load import LearnedBlocks, PeerReport, ReleasedBlocks, ReplicaLoadReport
from tidegate.policy.peer_queues import HeldReport
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, RouteInfo
from tidegate.policy.slo_pick import TidegatePolicy
from tidegate.router.peer_load import LoadPublisher, PeerLoadWatcher, held_reports, load_record, peer_reports
from tidegate.store.lease import LeaseKeeper
from tidegate.store.memory import InMemoryStore
from tidegate.v1.records_pb2 import RouterLoad

POOL = "m"
CAP = 400_000
FAST = dict(prefill_tokens_per_s=45_000.0, decode_step_base_ms=8.0, decode_step_per_seq_ms=0.15)


def e(rid: str) -> RouteInfo:
    return RouteInfo(replica_id=rid, weight=50.0, kv_free_tokens=CAP, kv_capacity_tokens=CAP,
                     endpoint=f"http://{rid}", **FAST)


def req(prompt: int, rid: str, out: int = 100) -> RequestFeatures:
    return RequestFeatures(prompt_tokens=prompt, max_tokens=out, req_id=rid)


async def until(cond: Callable[[], bool], timeout_s: float = 2.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


# ---------------------------------------------------------------------------- the record (pure)

def test_a_record_carries_the_reports_through_bytes_unchanged():
    reports = {POOL: PeerReport({"a": ReplicaLoadReport(1200.0, 2, 3, 5000.0, 0.25, (0.1, 0.4)),
                                 "b": ReplicaLoadReport()},
                                (LearnedBlocks("a", (1, -2, 2**63 - 1, -(2**63)), 64.0),),
                                (ReleasedBlocks("a", (-2, 2**63 - 1)), ReleasedBlocks("b", (5,)))),
               "other": PeerReport({"c": ReplicaLoadReport(decoding=1, kv=10.0)}, ())}
    rec = RouterLoad.FromString(load_record("r0", 1000.0, reports).SerializeToString())
    assert rec.router_id == "r0" and rec.updated_at.ToNanoseconds() == 1000 * 10**9
    assert peer_reports(rec) == reports


def test_learned_keys_past_the_cap_are_left_out_not_the_load():
    reports = {POOL: PeerReport({"a": ReplicaLoadReport(waiting=1)},
                                (LearnedBlocks("a", (1, 2, 3), 64.0), LearnedBlocks("b", (4, 5), 64.0)))}
    got = peer_reports(load_record("r0", 0.0, reports, max_keys=4))[POOL]
    assert got.loads == reports[POOL].loads
    assert [b.keys for b in got.learned] == [(1, 2, 3), (4,)]


@pytest.mark.parametrize(("max_keys", "learned", "released"), [
    (10, [(1, 2, 3), (4, 5)], [(1, 2, 3)]),        # all fits
    (6, [(1, 2, 3), (4, 5)], [(1,)]),               # releases share the budget, after the learned keys
    (4, [(1, 2, 3), (4,)], []),
    (2, [(1, 2)], []),
], ids=["fits", "release-cut", "no-room-for-releases", "learned-cut"])
def test_a_records_keys_learned_and_released_stay_under_the_cap(max_keys, learned, released):
    reports = {POOL: PeerReport({"a": ReplicaLoadReport(waiting=1)},
                                (LearnedBlocks("a", (1, 2, 3), 64.0), LearnedBlocks("b", (4, 5), 64.0)),
                                (ReleasedBlocks("a", (1, 2, 3)),))}
    got = peer_reports(load_record("r0", 0.0, reports, max_keys=max_keys))[POOL]
    assert got.loads == reports[POOL].loads
    assert [b.keys for b in got.learned] == learned
    assert [b.keys for b in got.released] == released
    assert sum(len(b.keys) for b in (*got.learned, *got.released)) <= max_keys


@pytest.mark.parametrize("mutate", [
    lambda r: setattr(r.pools[POOL].replicas["a"], "queued_prefill", math.nan),
    lambda r: setattr(r.pools[POOL].replicas["a"], "waiting", -3),
    lambda r: r.pools[POOL].replicas["a"].budgets.extend([0.5, 0.1]),
    lambda r: setattr(r.pools[POOL].learned[0], "tokens_per_block", -1.0),
], ids=["nan-queue", "negative-waiting", "descending-budgets", "negative-block-size"])
def test_a_record_with_garbage_is_refused_whole(mutate):
    rec = load_record("r0", 0.0, {POOL: PeerReport({"a": ReplicaLoadReport(waiting=1)},
                                                   (LearnedBlocks("a", (1,), 64.0),))})
    mutate(rec)
    with pytest.raises(ValueError):
        peer_reports(rec)


# ---------------------------------------------------------------------------- publisher

async def _leased(store: InMemoryStore) -> tuple[LeaseKeeper, asyncio.Task[None]]:
    keeper = LeaseKeeper(store, 10)
    task = asyncio.create_task(keeper.run())
    await until(lambda: keeper.lease_id != 0)
    return keeper, task


async def test_the_publisher_writes_only_what_is_new_and_survives_a_dead_store():
    store = InMemoryStore()
    keeper, task = await _leased(store)
    policy = TidegatePolicy()
    pub = LoadPublisher(store, keeper, "r0", lambda: {POOL: policy})
    try:
        assert not await pub.publish_once()                      # nothing placed yet: no record
        assert await store.get(keys.router_load("r0")) is None

        policy.on_dispatch(req(2000, "x"), "a")
        assert await pub.publish_once()
        kv = await store.get(keys.router_load("r0"))
        assert kv is not None and kv.lease == keeper.lease_id
        load = peer_reports(RouterLoad.FromString(kv.value))[POOL].loads["a"]
        assert load.waiting == 1 and load.queued_prefill > 0
        assert not await pub.publish_once()                      # the same load again: not rewritten

        policy.on_dispatch(req(500, "y"), "b")
        store.down = True
        with structlog.testing.capture_logs() as logs:
            assert not await pub.publish_once()                  # lost, logged, not raised
            policy.on_dispatch(req(500, "z"), "b")
            assert not await pub.publish_once()
        assert [entry["event"] for entry in logs] == ["peer_load_write_failed"]   # once per outage
        store.down = False
        assert await pub.publish_once()                          # the load again, as it is now
        kv = await store.get(keys.router_load("r0"))
        assert kv is not None
        assert peer_reports(RouterLoad.FromString(kv.value))[POOL].loads["b"].waiting == 2
        assert pub.writes == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------------------- watcher

async def test_a_peer_counts_the_others_load_until_its_record_goes():
    store = InMemoryStore()
    keeper, ktask = await _leased(store)
    sender, receiver = TidegatePolicy(), TidegatePolicy()
    snap = PoolSnapshot((e("a"), e("b")))
    probe = req(4000, "probe")

    def queued(rid: str) -> float:
        return next(p.queued_prefill for p in receiver.predictions(snap, probe) if p.replica_id == rid)

    receivers: dict[str, TidegatePolicy] = {}

    def policy_for(pool: str) -> TidegatePolicy:
        return receivers.setdefault(pool, receiver)

    pub = LoadPublisher(store, keeper, "r0", lambda: {POOL: sender})
    watcher = PeerLoadWatcher(store, "r1", policy_for, lambda: dict(receivers))
    wtask = asyncio.create_task(watcher.run())
    try:
        assert queued("a") == 0
        sender.on_dispatch(req(8000, "x"), "a")
        assert await pub.publish_once()
        await until(lambda: queued("a") > 0)
        assert queued("b") == 0 and watcher.peers == 1

        # its own record is not a peer's
        own = LoadPublisher(store, keeper, "r1", lambda: {POOL: sender})
        sender.on_dispatch(req(100, "y"), "b")
        assert await own.publish_once()
        await asyncio.sleep(0.05)
        assert watcher.peers == 1

        store.expire_lease(keeper.lease_id)                     # the peer's presence ended
        await until(lambda: watcher.peers == 0)
        assert queued("a") == 0
    finally:
        for t in (wtask, ktask):
            t.cancel()
        await asyncio.gather(wtask, ktask, return_exceptions=True)


async def test_a_garbage_record_is_refused_and_logged_once_then_a_good_one_counts():
    store = InMemoryStore()
    receiver = TidegatePolicy()
    watcher = PeerLoadWatcher(store, "r1", lambda pool: receiver, lambda: {POOL: receiver})
    task = asyncio.create_task(watcher.run())
    try:
        with structlog.testing.capture_logs() as logs:
            await store.put(keys.router_load("evil"), b"\xff\xfe not protobuf")
            bad = load_record("evil", 0.0, {POOL: PeerReport({"a": ReplicaLoadReport(waiting=1)}, ())})
            bad.pools[POOL].replicas["a"].kv = -1.0
            await store.put(keys.router_load("evil"), bad.SerializeToString())
            await asyncio.sleep(0.05)
        refused = [entry for entry in logs if entry["event"] == "peer_load_refused"]
        assert len(refused) == 1 and refused[0]["peer"] == "evil"
        assert watcher.peers == 0
        good = load_record("evil", 0.0, {POOL: PeerReport({"a": ReplicaLoadReport(3000.0, waiting=1)}, ())})
        await store.put(keys.router_load("evil"), good.SerializeToString())
        await until(lambda: watcher.peers == 1)
        snap = PoolSnapshot((e("a"),))
        assert receiver.predictions(snap, req(1000, "p"))[0].queued_prefill == pytest.approx(3000.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _BrokenOnceFake:
    """A policy whose first report raises (a bug), then reports like the real one."""

    def __init__(self) -> None:
        self.real = TidegatePolicy()
        self.calls = 0

    def take_report(self) -> PeerReport:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("bug")
        return self.real.take_report()


async def test_a_failing_tick_is_logged_and_the_next_one_publishes():
    store = InMemoryStore()
    keeper, ktask = await _leased(store)
    policy = _BrokenOnceFake()
    policy.real.on_dispatch(req(2000, "x"), "a")
    pub = LoadPublisher(store, keeper, "r0", lambda: {POOL: policy}, interval_s=0.01)
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(pub.run())
        try:
            await until(lambda: pub.writes >= 1)
        finally:
            for t in (task, ktask):
                t.cancel()
            await asyncio.gather(task, ktask, return_exceptions=True)
    assert [entry["event"] for entry in logs if entry["event"].startswith("peer_load")] == ["peer_load_publish_failed"]


# ---------------------------------------------------------------------------- admission queues

def test_what_the_queues_hold_goes_through_the_record():
    held = {POOL: HeldReport({"critical": 1500.0, "sheddable": 20.0}, 0.25,
                             {"critical": (0.125, 700.0), "sheddable": (2.5, 20.0)}),
            "other": HeldReport({"standard": 1.0})}
    rec = RouterLoad.FromString(load_record("r0", 0.0, {POOL: PeerReport({}, ())}, held=held).SerializeToString())
    assert held_reports(rec) == held
    assert set(peer_reports(rec)) == {POOL, "other"}     # a pool that only holds is still a pool of the record


@pytest.mark.parametrize("held", [
    {"urgent": 5.0}, {"critical": -1.0}, {"standard": math.inf},
], ids=["unknown-class", "negative", "inf"])
def test_garbage_held_tokens_refuse_the_record(held):
    rec = load_record("r0", 0.0, {})
    rec.pools[POOL].held.tokens.update(held)
    with pytest.raises(ValueError):
        held_reports(rec)


@pytest.mark.parametrize("head", [{"age_s": -1.0, "prefill_tokens": 1.0}, {"age_s": 0.1, "prefill_tokens": 0.0},
                                  {"age_s": math.nan, "prefill_tokens": 1.0}], ids=["negative-age", "no-tokens", "nan"])
def test_garbage_held_heads_refuse_the_record(head):
    rec = load_record("r0", 0.0, {})
    rec.pools[POOL].held.heads["standard"].age_s = head["age_s"]
    rec.pools[POOL].held.heads["standard"].prefill_tokens = head["prefill_tokens"]
    with pytest.raises(ValueError):
        held_reports(rec)


async def test_the_publisher_writes_when_the_queue_changes_and_the_watcher_hands_it_on():
    store = InMemoryStore()
    keeper, ktask = await _leased(store)
    queue: dict[str, HeldReport] = {}
    pub = LoadPublisher(store, keeper, "r0", lambda: {}, held=lambda: queue)
    seen: list[tuple[str, str, HeldReport | None]] = []
    watcher = PeerLoadWatcher(store, "r1", lambda pool: TidegatePolicy(), dict,
                              on_held=lambda peer, pool, r: seen.append((peer, pool, r)))
    wtask = asyncio.create_task(watcher.run())
    try:
        assert not await pub.publish_once()                       # nothing held, nothing placed
        queue[POOL] = HeldReport({"critical": 800.0}, 1.5, {"critical": (0.25, 800.0)})
        assert await pub.publish_once()
        await until(lambda: seen == [("r0", POOL, HeldReport({"critical": 800.0}, 1.5, {"critical": (0.25, 800.0)}))])
        assert not await pub.publish_once()                       # unchanged
        queue.clear()                                             # it went: peers must hear so
        assert await pub.publish_once()
        await until(lambda: seen[-1] == ("r0", POOL, None))
    finally:
        for t in (wtask, ktask):
            t.cancel()
        await asyncio.gather(wtask, ktask, return_exceptions=True)


class _ChangingFake:
    """A policy whose load changes on every report, so every tick that reports writes."""

    def __init__(self) -> None:
        self.calls = 0

    def take_report(self) -> PeerReport:
        self.calls += 1
        return PeerReport({"a": ReplicaLoadReport(waiting=self.calls)}, ())


@pytest.mark.parametrize(("alone", "most", "least"), [(True, 2, 1), (False, 1000, 10)], ids=["alone", "with-peers"])
async def test_a_router_that_hears_no_peer_writes_at_the_slow_rate(alone, most, least):
    store = InMemoryStore()
    keeper, ktask = await _leased(store)
    policy = _ChangingFake()
    pub = LoadPublisher(store, keeper, "r0", lambda: {POOL: policy}, interval_s=0.01,
                        alone=lambda: alone, lone_interval_s=10.0)
    task = asyncio.create_task(pub.run())
    try:
        await asyncio.sleep(0.3)
    finally:
        for t in (task, ktask):
            t.cancel()
        await asyncio.gather(task, ktask, return_exceptions=True)
    assert least <= pub.writes <= most
