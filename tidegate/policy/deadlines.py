"""A request's own SLO: the pool's targets, tightened (never loosened) by request headers.

    x-tidegate-ttft-deadline-ms: 800     time to first token, milliseconds
    x-tidegate-tpot-deadline-ms: 50      time per output token, milliseconds

Rules (`request_slo`):
- No header: the pool's targets as they are (None when the pool has none: the policy then
  uses its own default, `SloTargets()`).
- A header value: a plain decimal number of milliseconds (`800`, `62.5`), > 0 and at most
  `MAX_DEADLINE_MS`; anything else (empty, negative, zero, `1e3`, `inf`, a list) is a
  DeadlineError (400 at the router, naming the header).
- The request's target is min(header, pool target): a header can only tighten. When the pool
  has no SLO the header tightens the policy default `SloTargets()` and the other target keeps
  that default.

Why trusted without configuration (unlike the priority class): a tighter deadline can only
make the request harder to admit, never easier, and it takes nothing from other requests.
Pure: no I/O.
"""

from __future__ import annotations

import math
import re

from tidegate.policy.registry import SloTargets

TTFT_HEADER = "x-tidegate-ttft-deadline-ms"
TPOT_HEADER = "x-tidegate-tpot-deadline-ms"
MAX_DEADLINE_MS = 3_600_000.0  # one hour: beyond, the value is a mistake, not a deadline
_NUMBER = re.compile(r"[0-9]{1,10}(?:\.[0-9]{1,6})?")


class DeadlineError(ValueError):
    """A deadline header that is not a positive number of milliseconds; `header` names it."""

    def __init__(self, header: str, message: str) -> None:
        super().__init__(message)
        self.header = header


def parse_deadline_ms(header: str, value: str | None) -> float | None:
    """Seconds from one header value in milliseconds; None when the header is absent."""
    if value is None:
        return None
    text = value.strip()
    shown = value if len(value) <= 40 else value[:40] + "..."
    if not _NUMBER.fullmatch(text):
        raise DeadlineError(header, f"{header} must be a positive number of milliseconds, got {shown!r}")
    ms = float(text)
    if not (math.isfinite(ms) and 0 < ms <= MAX_DEADLINE_MS):
        raise DeadlineError(header, f"{header} must be > 0 and <= {MAX_DEADLINE_MS:.0f} ms, got {shown!r}")
    return ms / 1000.0


def request_slo(pool: SloTargets | None, ttft_header: str | None, tpot_header: str | None) -> SloTargets | None:
    """The SLO one request is held to (see the module rules). Raises DeadlineError."""
    ttft = parse_deadline_ms(TTFT_HEADER, ttft_header)
    tpot = parse_deadline_ms(TPOT_HEADER, tpot_header)
    if ttft is None and tpot is None:
        return pool
    base = pool if pool is not None else SloTargets()
    return SloTargets(ttft_s=min(base.ttft_s, ttft) if ttft is not None else base.ttft_s,
                      tpot_s=min(base.tpot_s, tpot) if tpot is not None else base.tpot_s)
