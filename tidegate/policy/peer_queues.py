"""What the peer routers' admission queues hold, as their reports say: the state behind the rules
across routers of tidegate/policy/admission.py ("Class order across routers", "Arrival order
across routers"). A router's `AdmissionQueue` owns one `PeerQueues`; its own queue stays there.

Kept apart from the queue because it is a different kind of state: what other processes said, a
report interval old, replaced whole by each report and forgotten with the peer; the queue's own
state is exact and changes with every decision. Pure: the caller passes the clock's `now`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from tidegate.policy.classes import CLASSES, PRIORITY

# Arrival order across routers (AdmissionConfig.peer_fifo_share): how much longer than a request
# a peer's head of its class must have been held to hold it back, as a share of the TTFT target.
# Measured, not derived: see "Arrival order across routers" in admission.py.
PEER_FIFO_SHARE = 0.1
# ... and for how long a request yields to them, in gates.
PEER_FIFO_YIELD = 2.0


@dataclass(frozen=True, slots=True)
class HeldReport:
    """What a router's queue tells its peers' (see "Class order across routers")."""

    tokens: Mapping[str, float]             # prefill tokens held per class; classes holding none left out
    critical_slack_s: float | None = None   # its critical head's last start - now at the report (None: none)
    # Per class holding something: how long its head has been held at the report, and its prefill
    # tokens (arrival order across routers).
    heads: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for c, t in self.tokens.items():
            if c not in PRIORITY or not (t > 0 and math.isfinite(t)):
                raise ValueError(f"admission: held tokens want a class and a finite value > 0, got {c!r}={t!r}")
        for c, (age, t) in self.heads.items():
            if c not in PRIORITY or not (age >= 0 and math.isfinite(age) and t > 0 and math.isfinite(t)):
                raise ValueError(f"admission: a held head wants a class, a finite age >= 0 and finite tokens > 0, "
                                 f"got {c!r}=({age!r}, {t!r})")
        if self.critical_slack_s is not None and not math.isfinite(self.critical_slack_s):
            raise ValueError(f"admission: critical_slack_s must be finite, got {self.critical_slack_s!r}")


class PeerQueues:
    """Every peer's latest `HeldReport`, as the rules across routers read it.

    `fifo_share`: AdmissionConfig.peer_fifo_share (None: no arrival order across routers);
    `report_s`: how old a report may be when it arrives (AdmissionConfig.peer_report_s)."""

    def __init__(self, fifo_share: float | None, report_s: float) -> None:
        self._fifo_share = fifo_share
        self._report_s = report_s
        # Per peer router: the prefill tokens it holds per class, from its latest report.
        self._held: dict[str, dict[str, float]] = {}
        # Per peer router holding critical requests: its critical head's last start, in our clock.
        self._critical: dict[str, float] = {}
        # Per peer router: when its latest report came, and per class it holds its head's arrival
        # (our clock) and prefill tokens.
        self._heads: dict[str, tuple[float, dict[str, tuple[float, float]]]] = {}

    def on_report(self, peer: str, report: HeldReport, now: float) -> None:
        """A peer's latest report, received at `now` (replaces its previous one)."""
        if report.tokens:
            self._held[peer] = dict(report.tokens)
        else:
            self._held.pop(peer, None)
        if report.critical_slack_s is None:
            self._critical.pop(peer, None)
        else:
            self._critical[peer] = now + report.critical_slack_s
        if report.heads:
            self._heads[peer] = (now, {c: (now - age, t) for c, (age, t) in report.heads.items()})
        else:
            self._heads.pop(peer, None)

    def forget(self, peer: str) -> None:
        """A peer is gone (its presence expired): what it held no longer holds ours back."""
        self._held.pop(peer, None)
        self._critical.pop(peer, None)
        self._heads.pop(peer, None)

    def holds_above(self, rank: int) -> bool:
        """Whether some peer holds a class served before class rank `rank`."""
        above = CLASSES[:rank]
        return any(c in held for held in self._held.values() for c in above)

    def ahead(self, rank: int, own: Mapping[str, float]) -> float:
        """Prefill tokens of the classes above rank `rank` that a peer holds beyond what this router
        holds of them (`own`: its held prefill tokens per class): a request of that rank does not
        go while a peer holds them (class order across routers), so they are ahead of it. The
        largest peer's, not the sum: peers drain their queues in parallel, as this router drains
        its own beside them."""
        if rank == 0 or not self._held:
            return 0.0
        above = CLASSES[:rank]
        peer = max(sum(held.get(c, 0.0) for c in above) for held in self._held.values())
        return max(0.0, peer - sum(own.get(c, 0.0) for c in above))

    def critical_near(self, now: float, window_s: float) -> bool:
        """Whether a peer's critical head's last start is within `window_s` of `now`, either side:
        short of slack, or past its last start by less than that (one further past went, was
        rejected or, committed, waits to go late, when holding others back no longer saves it)."""
        return any(-window_s < last - now < window_s for last in self._critical.values())

    def held_longer(self, cls: str, arrival_s: float, tokens: float, now: float, horizon_s: float) -> bool:
        """Whether a peer's head of class `cls`, no larger than `tokens`, has been held longer than
        a request of it that arrived at `arrival_s`, by more than the gate (see "Arrival order
        across routers" in admission.py; `horizon_s`: the TTFT target), and the request has
        yielded for less than PEER_FIFO_YIELD gates. A peer whose latest report is more than two
        report ages old missed a write (a holding router writes every interval): its heads no
        longer count, so a frozen or cut-off peer holds nobody back while its presence lasts."""
        share = self._fifo_share
        if share is None or not self._heads:
            return False
        stale_s = 2 * self._report_s   # the gate's floor and a silent peer's limit alike
        gate = max(share * horizon_s, stale_s)
        if now - arrival_s >= PEER_FIFO_YIELD * gate:
            return False
        before, fresh = arrival_s - gate, now - stale_s
        return any(at >= fresh and (head := heads.get(cls)) is not None and head[0] < before and head[1] <= tokens
                   for at, heads in self._heads.values())

