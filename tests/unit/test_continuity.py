"""Table tests of the publish verdict across leader changes (tidegate.policy.continuity)."""

from __future__ import annotations

import pytest

from tidegate.policy.continuity import ContinuityConfig, check
from tidegate.v1 import records_pb2

RS = records_pb2.ReplicaState
CFG = ContinuityConfig(warmup_s=5.0, stale_after_s=3.0)


def e(rid: str, weight: float = 50.0, state: int = RS.REPLICA_STATE_READY,
      endpoint: str = "") -> records_pb2.RouteEntry:
    return records_pb2.RouteEntry(replica_id=rid, weight=weight, state=state,
                                  endpoint=endpoint or f"http://{rid}")


JOINING = RS.REPLICA_STATE_JOINING
STALE = RS.REPLICA_STATE_STALE

CASES = [
    # id, previous, computed, heard, term age, publish?, expected (id, weight) pairs, carried
    ("first start: nothing to wait for", [], [e("a")], {"a"}, 0.0, True, [("a", 50)], ()),
    ("new leader, nobody heard yet: hold", [e("a"), e("b")], [], set(), 0.5, False, [], ()),
    ("new leader, one of two heard: hold", [e("a"), e("b")], [e("a", 40)], {"a"}, 1.0, False, [], ()),
    ("everyone heard: warm-up ends early", [e("a"), e("b")], [e("a", 40), e("b", 30)], {"a", "b"}, 1.0, True,
     [("a", 40), ("b", 30)], ()),
    ("warm-up over, b still unknown: b keeps its last entry", [e("a"), e("b")],
     [e("a", 40), e("b", 0, JOINING)], {"a"}, 5.0, True, [("a", 40), ("b", 50)], ("b",)),
    ("restored b missing from computed: carried, not dropped", [e("a"), e("b")], [e("a", 40)], {"a"}, 6.0,
     True, [("a", 40), ("b", 50)], ("b",)),
    ("carry window over: b is what the views say (stale)", [e("a"), e("b")],
     [e("a", 40), e("b", 0, STALE)], {"a"}, 8.0, True, [("a", 40), ("b", 0)], ()),
    ("previously non-routable replicas are not waited for", [e("a"), e("c", 0, RS.REPLICA_STATE_CORDONED)],
     [e("a", 40)], {"a"}, 0.1, True, [("a", 40), ("c", 0)], ("c",)),
    ("new replica heard in this term is added", [e("a")], [e("a", 40), e("n", 20)], {"a", "n"}, 0.1, True,
     [("a", 40), ("n", 20)], ()),
    ("etcd came back, same leader re-elected, all reporting", [e("a"), e("b"), e("c")],
     [e("a"), e("b"), e("c")], {"a", "b", "c"}, 0.0, True, [("a", 50), ("b", 50), ("c", 50)], ()),
]


@pytest.mark.parametrize(("previous", "computed", "heard", "age", "publish", "expected", "carried"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_verdict(previous: list[records_pb2.RouteEntry], computed: list[records_pb2.RouteEntry], heard: set[str],
                 age: float, publish: bool, expected: list[tuple[str, float]], carried: tuple[str, ...]) -> None:
    v = check(previous, computed, heard, age, CFG)
    assert v.publish is publish, v.reason
    assert [(x.replica_id, x.weight) for x in v.entries] == expected
    assert v.carried == carried


def test_hold_names_whom_it_waits_for() -> None:
    v = check([e("a"), e("b"), e("c", 0, STALE)], [e("a")], {"a"}, 0.0, CFG)
    assert not v.publish and v.waiting_for == ("b",) and "1 routable" in v.reason


def test_carried_entry_keeps_the_previous_endpoint() -> None:
    v = check([e("b", endpoint="http://old:1")], [e("b", 0, JOINING, endpoint="http://new:2")], set(), 5.0, CFG)
    assert [x.endpoint for x in v.entries] == ["http://old:1"]


def test_zero_warmup_never_holds_but_still_carries() -> None:
    cfg = ContinuityConfig(warmup_s=0.0, stale_after_s=3.0)
    v = check([e("a")], [], set(), 0.0, cfg)
    assert v.publish and v.carried == ("a",)


def test_every_reporting_replica_is_published() -> None:
    computed = [e("a", 10), e("b", 0, STALE), e("c", 20)]
    for age in (0.0, 4.9, 5.0, 7.9, 8.0, 100.0):
        v = check([e("a"), e("b"), e("d")], computed, {"a", "b", "c"}, age, CFG)
        if v.publish:
            assert {"a", "b", "c"} <= {x.replica_id for x in v.entries}


def test_bad_config() -> None:
    with pytest.raises(ValueError):
        ContinuityConfig(warmup_s=-1)
