"""Table-driven and property tests of the router's replica picker."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.policy.pick import Candidate, RequestFeatures, pick
from tidegate.v1.records_pb2 import RouteEntry

REQ = RequestFeatures(model="m", prompt_tokens=10, max_tokens=16, stream=False)


def c(rid: str, w: float) -> Candidate:
    return Candidate(replica_id=rid, endpoint=f"http://{rid}", weight=w)


def shares(entries, inflight, n=4000, exclude=frozenset(), seed=1) -> dict[str, float]:
    rng = random.Random(seed)
    counts = Counter()
    for _ in range(n):
        p = pick(entries, inflight, REQ, rng, exclude)
        assert p is not None
        counts[p.replica_id] += 1
    return {k: v / n for k, v in counts.items()}


@pytest.mark.parametrize(
    ("entries", "inflight", "exclude"),
    [
        pytest.param([], {}, frozenset(), id="empty-table"),
        pytest.param([c("a", 0), c("b", 0)], {}, frozenset(), id="all-zero-weight"),
        pytest.param([c("a", -1), c("b", math.nan)], {}, frozenset(), id="negative-and-nan"),
        pytest.param([c("a", 1), c("b", 2)], {}, frozenset({"a", "b"}), id="all-excluded"),
        pytest.param([c("a", 0), c("b", 2)], {}, frozenset({"b"}), id="rest-excluded"),
    ],
)
def test_no_candidate_gives_none(entries, inflight, exclude):
    assert pick(entries, inflight, REQ, random.Random(0), exclude) is None


@pytest.mark.parametrize(
    ("entries", "inflight", "exclude", "expected"),
    [
        pytest.param([c("a", 3)], {"a": 100}, frozenset(), "a", id="single-busy"),
        pytest.param([c("a", 0), c("b", 1)], {}, frozenset(), "b", id="zero-weight-skipped"),
        pytest.param([c("a", 1), c("b", 1)], {}, frozenset({"a"}), "b", id="excluded-skipped"),
        pytest.param([c("a", math.inf), c("b", 1)], {}, frozenset(), "b", id="inf-weight-skipped"),
    ],
)
def test_forced_choice(entries, inflight, exclude, expected):
    p = pick(entries, inflight, REQ, random.Random(0), exclude)
    assert p is not None and p.replica_id == expected
    assert p.endpoint == f"http://{expected}"
    assert p.reason == "only_candidate" and p.candidates == 1


@pytest.mark.parametrize(
    ("entries", "inflight", "expected"),
    [
        pytest.param([c("a", 1), c("b", 1)], {}, {"a": 0.5, "b": 0.5}, id="all-equal"),
        pytest.param([c("a", 3), c("b", 2)], {}, {"a": 0.6, "b": 0.4}, id="ties-follow-weights"),
        pytest.param([c("a", 3), c("b", 1)], {}, {"a": 1.0, "b": 0.0}, id="below-half-of-best-left-out"),
        pytest.param([c("a", 3), c("b", 1)], {"a": 50}, {"a": 1.0, "b": 0.0}, id="tier-even-when-busy"),
        pytest.param([c("a", 1), c("b", 1)], {"a": 1}, {"a": 0.0, "b": 1.0}, id="least-loaded-wins"),
        pytest.param([c("a", 2), c("b", 1), c("c", 2)], {"a": 3, "b": 0, "c": 1},
                     {"a": 0.0, "b": 1.0, "c": 0.0}, id="least-loaded-in-tier"),
        pytest.param([c("a", 1), c("b", 1)], {"a": 2, "b": 2}, {"a": 0.5, "b": 0.5}, id="equal-inflight"),
        pytest.param([c("a", 1), c("b", 1)], {"zz": 50}, {"a": 0.5, "b": 0.5}, id="unknown-inflight-ignored"),
        pytest.param([c("a", 1), c("b", 1)], {"a": -5}, {"a": 0.5, "b": 0.5}, id="negative-inflight-clamped"),
    ],
)
def test_shares(entries, inflight, expected):
    got = shares(entries, inflight)
    for rid, share in expected.items():
        assert got.get(rid, 0.0) == pytest.approx(share, abs=0.03), (rid, got)
    for p in [pick(entries, inflight, REQ, random.Random(0))]:
        assert p is not None and p.reason == "least_loaded_in_tier" and p.candidates == len(entries)


def test_entry_order_does_not_change_seeded_picks():
    a = [c("a", 1), c("b", 2), c("c", 3)]
    b = list(reversed(a))
    ra, rb = random.Random(7), random.Random(7)
    assert [pick(a, {}, REQ, ra).replica_id for _ in range(50)] == [
        pick(b, {}, REQ, rb).replica_id for _ in range(50)
    ]


def test_accepts_protobuf_route_entries():
    entries = [RouteEntry(replica_id="r1", endpoint="http://x", weight=1.0), RouteEntry(replica_id="r2")]
    p = pick(entries, {}, REQ, random.Random(0))
    assert p is not None and p.replica_id == "r1"


def test_huge_weights_do_not_overflow():
    got = shares([c("a", 1e308), c("b", 1e308)], {}, n=2000)
    assert got["a"] == pytest.approx(0.5, abs=0.05)


weights = st.one_of(
    st.floats(min_value=-10, max_value=1e6),
    st.sampled_from([0.0, math.nan, math.inf, -math.inf, 1e308, 5e-324]),
)
tables = st.lists(st.tuples(st.sampled_from("abcdefgh"), weights), max_size=8, unique_by=lambda t: t[0])


@settings(max_examples=300, deadline=None)
@given(
    table=tables,
    inflight=st.dictionaries(st.sampled_from("abcdefghz"), st.integers(-5, 10_000)),
    exclude=st.frozensets(st.sampled_from("abcdefgh")),
    seed=st.integers(0, 2**32),
)
def test_property_never_picks_zero_weight_or_excluded(table, inflight, exclude, seed):
    entries = [c(rid, w) for rid, w in table]
    p = pick(entries, inflight, REQ, random.Random(seed), exclude)
    eligible = {rid for rid, w in table if math.isfinite(w) and w > 0 and rid not in exclude}
    if not eligible:
        assert p is None
    else:
        assert p is not None
        assert p.replica_id in eligible
        assert p.endpoint == f"http://{p.replica_id}"
        assert p.candidates == len(eligible)
        assert math.isfinite(p.effective_weight) and p.effective_weight >= 0
