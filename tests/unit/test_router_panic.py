"""The router's panic threshold (router.tables): a table that suddenly loses most of a pool
is suspect and the router keeps routing to the last known set."""

from __future__ import annotations

import pytest
import structlog

from tidegate import codec, keys
from tidegate.policy.registry import RouteInfo
from tidegate.router.tables import PoolTable, RoutingTables, is_suspect
from tidegate.store.api import KeyValue
from tidegate.v1.records_pb2 import ReplicaState, RouteEntry, RoutingTable

READY, STALE, JOINING = ReplicaState.REPLICA_STATE_READY, ReplicaState.REPLICA_STATE_STALE, \
    ReplicaState.REPLICA_STATE_JOINING
CORDONED, EJECTED = ReplicaState.REPLICA_STATE_CORDONED, ReplicaState.REPLICA_STATE_EJECTED


def pt(*entries: tuple[str, float, int]) -> PoolTable:
    return PoolTable("m", 1, 1, None, tuple(RouteInfo(replica_id=r, weight=w, state=s, endpoint=f"http://{r}")
                                            for r, w, s in entries))


ABC = pt(("a", 10, READY), ("b", 10, READY), ("c", 10, READY))
CASES = [
    ("same table", ABC, ()),
    ("one of three stale: not most of the pool", pt(("a", 10, READY), ("b", 10, READY), ("c", 0, STALE)), ()),
    ("two of three stale", pt(("a", 10, READY), ("b", 0, STALE), ("c", 0, STALE)), ("b", "c")),
    ("empty table", pt(), ("a", "b", "c")),
    ("two gone, back as joining", pt(("a", 10, READY), ("b", 0, JOINING)), ("b", "c")),
    ("two cordoned by SRE: a decision, not a loss", pt(("a", 10, READY), ("b", 0, CORDONED), ("c", 0, CORDONED)), ()),
    ("two ejected: a decision", pt(("a", 10, READY), ("b", 0, EJECTED), ("c", 0, EJECTED)), ()),
    ("replaced by new replicas", pt(("x", 10, READY), ("y", 10, READY), ("z", 10, READY)), ()),
]


@pytest.mark.parametrize(("new", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_is_suspect(new: PoolTable, expected: tuple[str, ...]) -> None:
    assert is_suspect(ABC, new) == expected


def kv(rev: int, *entries: tuple[str, float, int]) -> KeyValue:
    t = RoutingTable(pool="m", generation=rev, schema_version=1)
    for rid, w, s in entries:
        t.replicas.append(RouteEntry(replica_id=rid, endpoint=f"http://{rid}", weight=w, state=s))
    return KeyValue(keys.table("m"), codec.encode(t), rev)


def routable(rt: RoutingTables) -> list[str]:
    t = rt.get("m")
    assert t is not None
    return [e.replica_id for e in t.entries if e.weight > 0]


def test_suspect_table_keeps_the_last_known_set_until_it_recovers() -> None:
    now = [0.0]
    rt = RoutingTables(clock=lambda: now[0], panic_max_s=60)
    rt.on_change(keys.table("m"), kv(1, ("a", 10, READY), ("b", 10, READY), ("c", 10, READY)))
    with structlog.testing.capture_logs() as logs:
        rt.on_change(keys.table("m"), kv(2, ("a", 0, JOINING)))
        rt.on_change(keys.table("m"), kv(3, ("a", 5, READY)))
    assert routable(rt) == ["a", "b", "c"]
    assert rt.get("m").generation == 3  # type: ignore[union-attr]
    assert [e["event"] for e in logs] == ["table_suspect"]  # once, not per table
    assert set(rt.suspect()) == {"m"}
    rt.on_change(keys.table("m"), kv(4, ("a", 5, READY), ("b", 5, READY), ("c", 0, STALE)))
    assert routable(rt) == ["a", "b"] and rt.suspect() == {}


def test_panic_ends_after_panic_max_s() -> None:
    now = [0.0]
    rt = RoutingTables(clock=lambda: now[0], panic_max_s=30)
    rt.on_change(keys.table("m"), kv(1, ("a", 10, READY), ("b", 10, READY)))
    rt.on_change(keys.table("m"), kv(2))
    assert routable(rt) == ["a", "b"]
    now[0] = 31.0
    assert routable(rt) == [] and rt.suspect() == {}


def test_first_table_is_never_suspect() -> None:
    rt = RoutingTables()
    rt.on_change(keys.table("m"), kv(1, ("a", 0, STALE)))
    assert routable(rt) == [] and rt.suspect() == {}
