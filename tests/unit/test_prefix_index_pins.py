"""The router's prefix index evicts as the engine's prefix cache does: blocks of requests in flight
on a replica stay (the engine cannot evict blocks in use), the others leave least recently
released first (tidegate/policy/affinity.py, `_ReplicaCache`; simulator/engine.py)."""

from __future__ import annotations

import random

import pytest

from tidegate.policy.affinity import PrefixBlocks, PrefixIndex
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, RouteInfo
from tidegate.policy.slo_pick import TidegatePolicy

# Four 512-token blocks per prompt, room for two prompts.
CAP = 4096.0
PROMPTS = {name: PrefixBlocks(tuple(range(10 * i, 10 * i + 4)), 2048) for i, name in enumerate("ABCDE", start=1)}


def run(ops: list[tuple[str, str]]) -> dict[str, int]:
    idx = PrefixIndex()
    for op, name in ops:
        if op == "pin":
            idx.learn("r", PROMPTS[name], CAP, pin=True)
        elif op == "release":
            idx.release("r", PROMPTS[name])
        elif op == "learn":           # a peer's report: resident, in use by nobody we know of
            idx.learn("r", PROMPTS[name], CAP)
        else:
            raise AssertionError(op)
    return {name: idx.cached_tokens("r", b) for name, b in PROMPTS.items() if idx.cached_tokens("r", b)}


def served(*names: str) -> list[tuple[str, str]]:
    return [op for n in names for op in (("pin", n), ("release", n))]


@pytest.mark.parametrize(("ops", "cached"), [
    # Nothing in flight: least recently released leaves first (the LRU it always was).
    (served("A", "B", "C"), {"B": 2048, "C": 2048}),
    # A request still running keeps its prefix however much traffic passes (a dispatch-time LRU
    # dropped A here, where the engine must keep it, and kept B, which the engine had evicted).
    ([("pin", "A")] + served("B", "C", "D"), {"A": 2048, "D": 2048}),
    # Released blocks leave in release order, not dispatch order.
    ([("pin", "A"), ("pin", "B"), ("release", "B"), ("release", "A")] + served("C"), {"A": 2048, "C": 2048}),
    # A later request on the same prefix pins it again: it is in use until both are done.
    ([("pin", "A"), ("pin", "A"), ("release", "A")] + served("B", "C"), {"A": 2048, "C": 2048}),
    ([("pin", "A"), ("pin", "A"), ("release", "A"), ("release", "A")] + served("B", "C"), {"B": 2048, "C": 2048}),
    # Blocks learned from a peer are in use by nobody this router knows of: evictable at once.
    ([("learn", "A"), ("pin", "B"), ("pin", "C")], {"B": 2048, "C": 2048}),
    # Releasing what was never pinned (a peer's blocks, an unknown replica) changes nothing.
    ([("learn", "A"), ("release", "A"), ("release", "E")] + served("B"), {"A": 2048, "B": 2048}),
], ids=["lru-by-release", "running-request-keeps-its-prefix", "release-order", "pinned-twice-held",
        "pinned-twice-released", "peer-blocks-evictable", "release-unpinned-is-noop"])
def test_index_evicts_as_the_engine_does(ops, cached) -> None:
    assert run(ops) == cached


def test_policy_pins_a_dispatched_requests_prefix_until_it_completes() -> None:
    pol = TidegatePolicy()
    # The table's KV capacity bounds the index (the pick reads it).
    snap = PoolSnapshot((RouteInfo("r", 50.0, kv_capacity_tokens=int(CAP), kv_free_tokens=int(CAP)),), {})
    features = {name: RequestFeatures(prompt_tokens=2048, max_tokens=10, prefix_hashes=tuple(range(10 * i, 10 * i + 4)),
                                      req_id=name)
                for i, name in enumerate("ABCDE", start=1)}

    def cached(name: str) -> int:
        return next(p.cached_tokens for p in pol.predictions(snap, features[name]))

    def serve(*names: str) -> None:
        for name in names:
            assert pol.pick(snap, features[name], random.Random(0)) is not None
            pol.on_dispatch(features[name], "r")
            pol.on_complete(features[name], "r")

    assert pol.pick(snap, features["A"], random.Random(0)) is not None
    pol.on_dispatch(features["A"], "r")      # A runs long
    serve("B", "C", "D")
    assert cached("A") == 2047               # (at least one prompt token is computed)
    pol.on_complete(features["A"], "r")
    serve("B", "C", "D")
    assert cached("A") == 0


# Room for four 512-token blocks: a 4-block prompt fills it, a 2-block one then takes two of them.
HEAD4, TWO = PrefixBlocks((1, 2, 3, 4), 2048), PrefixBlocks((5, 6), 1024)


@pytest.mark.parametrize("ops", [
    [("learn", HEAD4)],                                             # a peer's report
    [("pin", HEAD4), ("release", HEAD4), ("learn", HEAD4)],         # ours, done, then a peer's again
], ids=["peer-report", "peer-report-of-released-blocks"])
def test_released_blocks_leave_tail_first(ops) -> None:
    """Blocks no request here holds leave tail first, as the engine frees a request's blocks: the
    room a later prompt needs takes the end of a prefix and leaves its head reusable (head first,
    the blocks left behind could never match: a prefix matches from its first block)."""
    idx = PrefixIndex()
    for op, blocks in ops:
        if op == "pin":
            idx.learn("r", blocks, 2048.0, pin=True)
        elif op == "release":
            idx.release("r", blocks)
        else:
            idx.learn("r", blocks, 2048.0)
    idx.learn("r", TWO, 2048.0)
    assert (idx.cached_tokens("r", HEAD4), idx.cached_tokens("r", TWO)) == (1024, 1024)
