"""A request's priority class and SLO from its headers. Pure (headers in, decision out).

    x-tidegate-priority: critical | standard | sheddable    read only with --trust-priority-header
    x-tidegate-ttft-deadline-ms: 800                        always read: can only tighten the pool's
    x-tidegate-tpot-deadline-ms: 50                         targets (tidegate/policy/deadlines.py)

A header given more than once is a client error (400), like a garbage value: two values cannot
both be the request's own. Untrusted priority headers are not read at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidegate.errors import RequestError
from tidegate.policy.classes import PriorityError, parse_class, priority_of
from tidegate.policy.deadlines import TPOT_HEADER, TTFT_HEADER, DeadlineError, request_slo
from tidegate.policy.registry import SloTargets

PRIORITY_HEADER = "x-tidegate-priority"


class BadHeader(RequestError):
    """A tidegate header the router reads holds an invalid value (400); `header` names it."""

    def __init__(self, header: str, message: str, code: str) -> None:
        super().__init__(message)
        self.header = header
        self.error_code = code  # the OpenAI error body's "code"


@dataclass(frozen=True, slots=True)
class RequestClass:
    name: str                 # critical | standard | sheddable
    priority: int             # RequestFeatures.priority
    slo: SloTargets | None    # the request's own targets (None: the policy default)


def _one(headers: Mapping[str, str] | Any, name: str) -> str | None:
    values = headers.getall(name, []) if hasattr(headers, "getall") else (
        [headers[name]] if name in headers else [])
    if len(values) > 1:
        raise BadHeader(name, f"{name} given {len(values)} times; give it once",
                        "invalid_priority" if name == PRIORITY_HEADER else "invalid_deadline")
    return values[0] if values else None


def classify(headers: Mapping[str, str] | Any, *, trust_priority: bool, pool_slo: SloTargets | None) -> RequestClass:
    """Raises BadHeader (-> 400) for a trusted garbage priority or any invalid deadline."""
    raw = _one(headers, PRIORITY_HEADER) if trust_priority else None
    try:
        name = parse_class(raw, trusted=trust_priority)
    except PriorityError as e:
        raise BadHeader(PRIORITY_HEADER, str(e), "invalid_priority") from None
    try:
        slo = request_slo(pool_slo, _one(headers, TTFT_HEADER), _one(headers, TPOT_HEADER))
    except DeadlineError as e:
        raise BadHeader(e.header, str(e), "invalid_deadline") from None
    return RequestClass(name, priority_of(name), slo)
