"""Disruption budgets (tidegate.policy.budgets): table tests, Kubernetes-style rounding."""

from __future__ import annotations

import pytest

from tidegate.policy.budgets import Member, max_out, min_required, parse_amount, validate, violations
from tidegate.v1 import records_pb2

B = records_pb2.DisruptionBudget


def pool(n_available: int, n_out: int = 0, name: str = "m", region: str = "eu") -> list[Member]:
    return ([Member(f"{name}-a{i}", name, region, True) for i in range(n_available)]
            + [Member(f"{name}-o{i}", name, region, False) for i in range(n_out)])


ROUNDING = [
    # amount, total, min_required (rounds up), max_out (rounds down)
    ("3", 10, 3, 3),
    ("50%", 3, 2, 1),
    ("75%", 4, 3, 3),
    ("34%", 3, 2, 1),
    ("0%", 5, 0, 0),
    ("100%", 5, 5, 5),
]


@pytest.mark.parametrize(("text", "total", "need", "allowed"), ROUNDING)
def test_percent_rounding(text: str, total: int, need: int, allowed: int) -> None:
    a = parse_amount(text)
    assert (min_required(a, total), max_out(a, total)) == (need, allowed)


CASES = [
    # id, budgets, members, taking out, expected messages
    ("min-ok", [B(scope="pool:m", min_available="3")], pool(4), {"m-a0"}, []),
    ("min-violated", [B(scope="pool:m", min_available="3")], pool(3, 1), {"m-a0"},
     ["pool:m min_available=3 would be violated (2 of 4 would remain available, 3 required)"]),
    ("min-percent-rounds-up", [B(scope="pool:m", min_available="50%")], pool(3), {"m-a0", "m-a1"},
     ["pool:m min_available=50% would be violated (1 of 3 would remain available, 2 required)"]),
    ("max-ok", [B(scope="pool:m", max_unavailable="1")], pool(4), {"m-a0"}, []),
    ("max-counts-already-out", [B(scope="pool:m", max_unavailable="1")], pool(3, 1), {"m-a0"},
     ["pool:m max_unavailable=1 would be violated (2 of 4 would be unavailable, at most 1 allowed)"]),
    ("max-percent-rounds-down", [B(scope="pool:m", max_unavailable="30%")], pool(3), {"m-a0"},
     ["pool:m max_unavailable=30% would be violated (1 of 3 would be unavailable, at most 0 allowed)"]),
    ("unavailable-replica-is-free", [B(scope="pool:m", min_available="100%")], pool(2, 1), {"m-o0"}, []),
    ("other-pool-unaffected", [B(scope="pool:x", min_available="100%")], pool(2), {"m-a0"}, []),
    ("region-scope", [B(scope="region:eu", min_available="2")], pool(1) + pool(1, name="n"), {"n-a0"},
     ["region:eu min_available=2 would be violated (1 of 2 would remain available, 2 required)"]),
    ("region-other", [B(scope="region:us", min_available="2")], pool(2), {"m-a0"}, []),
    ("two-budgets-both-named", [B(scope="pool:m", min_available="2"), B(scope="region:eu", max_unavailable="0")],
     pool(2), {"m-a0"},
     ["pool:m min_available=2 would be violated (1 of 2 would remain available, 2 required)",
      "region:eu max_unavailable=0 would be violated (1 of 2 would be unavailable, at most 0 allowed)"]),
    ("malformed-skipped", [B(scope="pool:m", min_available="lots")], pool(1), {"m-a0"}, []),
]


@pytest.mark.parametrize(("budgets", "members", "out", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_violations_table(budgets: list[records_pb2.DisruptionBudget], members: list[Member], out: set[str],
                          expected: list[str]) -> None:
    assert violations(budgets, members, out) == expected


@pytest.mark.parametrize(("budget", "error"), [
    (B(scope="m", min_available="1"), "scope"),
    (B(scope="zone:x", min_available="1"), "scope"),
    (B(scope="pool:m"), "exactly one"),
    (B(scope="pool:m", min_available="1", max_unavailable="1"), "exactly one"),
    (B(scope="pool:m", min_available="150%"), "percent"),
    (B(scope="pool:m", max_unavailable="-1"), "count or a percent"),
])
def test_validate_rejects(budget: records_pb2.DisruptionBudget, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        validate(budget)
