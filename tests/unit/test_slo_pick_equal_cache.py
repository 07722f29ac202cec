"""Table-driven tests of the `tidegate` pick's choice among replicas that hold a prompt's prefix
alike (slo_pick.TidegatePolicy.pick, README.md §6): the predicted cost decides there, the prefix's
home only among equal costs and for a prefix cached nowhere."""

from __future__ import annotations

import random

import pytest

from tidegate.policy.affinity import PrefixBlocks, home_order
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, RouteInfo
from tidegate.policy.slo_pick import BAND_C, COST_RESOLUTION, TidegatePolicy

CAP = 400_000
FAST = dict(prefill_tokens_per_s=45_000.0, decode_step_base_ms=8.0, decode_step_per_seq_ms=0.15)
IDS = ("a", "b", "c", "d")
SYSTEM = (1, 2, 3, 4)          # a shared system prompt: 4 blocks of 512 tokens (the home's depth is 2)
CONV = (77,)                   # one conversation's own block after it


def entry(rid: str) -> RouteInfo:
    return RouteInfo(replica_id=rid, weight=50.0, kv_free_tokens=CAP, kv_capacity_tokens=CAP,
                     endpoint=f"http://{rid}", **FAST)


def req(hashes: tuple, rid: str, prompt: int | None = None) -> RequestFeatures:
    return RequestFeatures(prompt_tokens=prompt or 512 * len(hashes), max_tokens=200, prefix_hashes=hashes,
                           req_id=rid)


def teach(pol: TidegatePolicy, rid: str, hashes: tuple, n: int) -> None:
    """A finished request with these blocks went to `rid`: they are cached there, no load left."""
    r = req(hashes, f"teach-{rid}-{n}")
    pol.on_dispatch(r, rid)
    pol.on_first_token(r, rid)
    pol.on_complete(r, rid)


def busy(pol: TidegatePolicy, rid: str, decoding: int) -> None:
    """`decoding` sequences without prefix blocks decode on `rid` (a larger batch: a dearer TPOT)."""
    for i in range(decoding):
        r = RequestFeatures(prompt_tokens=100, max_tokens=200, req_id=f"busy-{rid}-{i}")
        pol.on_dispatch(r, rid)
        pol.on_first_token(r, rid)


HOME = home_order(IDS, PrefixBlocks(SYSTEM + CONV, 512 * 5))[0]
HOME_NEW = home_order(IDS, PrefixBlocks((901, 902, 903, 904, 905), 512 * 5))[0]
OTHER = next(r for r in IDS if r != HOME)


@pytest.mark.parametrize(
    ("holders", "extra", "busy_on", "decoding", "prompt_hashes", "expect"),
    [
        pytest.param((HOME, OTHER), (), HOME, 12, SYSTEM + CONV, OTHER,
                     id="same prefix on two, home dearer within the band: the cheaper one"),
        pytest.param((HOME, OTHER), (), None, 0, SYSTEM + CONV, HOME,
                     id="same prefix on two, equal cost: the home"),
        pytest.param((HOME,), (HOME,), HOME, 30, SYSTEM + CONV + (78,), HOME,
                     id="more cached on the home, dearer within the band: the home (the most cached first)"),
        pytest.param((), (), HOME_NEW, 12, (901, 902, 903, 904, 905), HOME_NEW,
                     id="cached nowhere, home dearer within the band: the home (routers agree)"),
    ],
)
def test_choice_among_replicas_holding_the_prefix(holders, extra, busy_on, decoding, prompt_hashes, expect):
    pol = TidegatePolicy()
    snap = PoolSnapshot(tuple(entry(r) for r in IDS))
    for i, rid in enumerate(holders):
        teach(pol, rid, SYSTEM, i)
    for i, rid in enumerate(extra):             # the conversation's own block too
        teach(pol, rid, SYSTEM + CONV, 100 + i)
    if busy_on is not None:
        busy(pol, busy_on, decoding)
    request = req(prompt_hashes, "q")
    preds = {p.replica_id: p for p in pol.predictions(snap, request)}
    best = min(p.cost for p in preds.values())
    if busy_on is not None:   # the case is what its name says: the busy one is in the band, not tied
        others = min(p.cost for rid, p in preds.items() if rid != busy_on)
        assert others + COST_RESOLUTION < preds[busy_on].cost <= BAND_C * best
    assert pol.pick(snap, request, random.Random(0)).replica_id == expect


def test_a_shared_system_prompt_spreads_new_conversations_by_cost():
    """New conversations of one app (its system prompt cached on every replica) go where the
    predicted cost is least, not all to the system prompt's home."""
    pol = TidegatePolicy()
    snap = PoolSnapshot(tuple(entry(r) for r in IDS))
    for i, rid in enumerate(IDS):
        teach(pol, rid, SYSTEM, i)
    chosen = []
    for i in range(40):
        r = req(SYSTEM + (1000 + i,), f"c{i}")
        rid = pol.pick(snap, r, random.Random(i)).replica_id
        pol.on_dispatch(r, rid)
        pol.on_first_token(r, rid)
        chosen.append(rid)
    # Costs within COST_RESOLUTION (about 6 sequences of batch here) are ties the home breaks, so
    # the home may lead by that much; by rank first it led by the band's width (BAND_C).
    counts = [chosen.count(r) for r in IDS]
    assert max(counts) - min(counts) <= 8
