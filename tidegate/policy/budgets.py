"""Disruption budgets (like Kubernetes PodDisruptionBudgets): may an SRE take replicas out?

Pure: no I/O, no clock. A budget has a scope ("pool:<name>" or "region:<name>") and either
`min_available` or `max_unavailable`, each a count ("3") or a percent ("75%") of the replicas
in the scope. Percentages round like Kubernetes: min_available rounds up, max_unavailable
rounds down (both err on the side of keeping replicas). "Available" means READY or DEGRADED.
A request is checked against every budget whose scope contains a replica it takes out.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from tidegate.v1 import records_pb2

SCOPE_KINDS = ("pool", "region")


@dataclass(frozen=True)
class Member:
    """One replica as budgets see it."""

    replica_id: str
    pool: str
    region: str
    available: bool


@dataclass(frozen=True)
class Amount:
    value: int
    percent: bool

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


def parse_amount(text: str) -> Amount:
    """'3' -> 3 replicas, '75%' -> 75 percent. Raises ValueError naming the bad text."""
    t = text.strip()
    percent = t.endswith("%")
    digits = t[:-1].strip() if percent else t
    if not digits.isdigit():
        raise ValueError(f"{text!r} is not a count or a percent (e.g. '3' or '75%')")
    value = int(digits)
    if percent and value > 100:
        raise ValueError(f"{text!r}: a percent must be between 0% and 100%")
    return Amount(value, percent)


def parse_scope(scope: str) -> tuple[str, str]:
    kind, sep, name = scope.partition(":")
    if not sep or kind not in SCOPE_KINDS or not name:
        raise ValueError(f"scope {scope!r} must be 'pool:<name>' or 'region:<name>'")
    return kind, name


def validate(budget: records_pb2.DisruptionBudget) -> None:
    """Raises ValueError unless the scope is valid and exactly one of the two fields is set."""
    parse_scope(budget.scope)
    if bool(budget.min_available) == bool(budget.max_unavailable):
        raise ValueError("set exactly one of min_available and max_unavailable")
    parse_amount(budget.min_available or budget.max_unavailable)


def min_required(amount: Amount, total: int) -> int:
    """Replicas that must stay available under min_available (percent rounds up)."""
    return math.ceil(amount.value * total / 100) if amount.percent else amount.value


def max_out(amount: Amount, total: int) -> int:
    """Replicas that may be unavailable under max_unavailable (percent rounds down)."""
    return math.floor(amount.value * total / 100) if amount.percent else amount.value


def in_scope(member: Member, scope: str) -> bool:
    kind, name = parse_scope(scope)
    return (member.pool if kind == "pool" else member.region) == name


def violations(
    budgets: Iterable[records_pb2.DisruptionBudget],
    members: Collection[Member],
    taking_out: Collection[str],
) -> list[str]:
    """Messages for each budget that taking `taking_out` out of service would break.

    Only replicas that are available now count as taken out (a STALE or already cordoned
    replica is unavailable either way). A budget is only checked when this request takes at
    least one of its available replicas out, so an already-violated budget does not block
    operations elsewhere. Malformed budgets are skipped (SetBudget validates them)."""
    out = []
    leaving = set(taking_out)
    for b in sorted(budgets, key=lambda b: b.scope):
        try:
            parse_scope(b.scope)
            amount = parse_amount(b.min_available or b.max_unavailable)
        except ValueError:
            continue
        scoped = [m for m in members if in_scope(m, b.scope)]
        total = len(scoped)
        available = sum(1 for m in scoped if m.available)
        removed = sum(1 for m in scoped if m.available and m.replica_id in leaving)
        if removed == 0:
            continue
        remain = available - removed
        if b.min_available:
            need = min_required(amount, total)
            if remain < need:
                out.append(f"{b.scope} min_available={amount} would be violated "
                           f"({remain} of {total} would remain available, {need} required)")
        else:
            allowed = max_out(amount, total)
            if total - remain > allowed:
                out.append(f"{b.scope} max_unavailable={amount} would be violated "
                           f"({total - remain} of {total} would be unavailable, at most {allowed} allowed)")
    return out


def for_scope(budgets: Mapping[str, records_pb2.DisruptionBudget], kind: str,
              name: str) -> list[records_pb2.DisruptionBudget]:
    b = budgets.get(f"{kind}:{name}")
    return [] if b is None else [b]
