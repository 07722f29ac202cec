"""Replicas this router has just failed to connect to, avoided without waiting for the control plane.

An engine that died (kill -9, OOM kill, node loss) refuses connections at once, but the
control plane only notices when its agent's reports stop (the stale timeout). Until then every
pick of that replica would cost a retry from the retry budget, and under load the budget runs
out and requests fail. So a replica whose connect failed is avoided for a cooldown that doubles
on each further failure (`base_s`, 2*base_s, ... up to `max_s`) and is forgotten on the first
success. Picks treat avoided replicas as already tried; when every candidate is avoided the
pick ignores this (the router never refuses a request because of its own guess).

Pure state over an injected clock; the proxy records outcomes. Entries last until a success:
one per replica id that failed and never came back (small).
"""

from __future__ import annotations

from collections.abc import Callable

_NONE: frozenset[str] = frozenset()


class ConnectRefusals:
    def __init__(self, clock: Callable[[], float], base_s: float = 1.0, max_s: float = 30.0) -> None:
        if base_s <= 0 or max_s < base_s:
            raise ValueError("need 0 < base_s <= max_s")
        self._clock = clock
        self._base_s = base_s
        self._max_s = max_s
        self._until: dict[str, float] = {}
        self._cooldown: dict[str, float] = {}

    def refused(self, replica_id: str) -> None:
        cooldown = min(self._max_s, self._cooldown.get(replica_id, self._base_s / 2) * 2)
        self._cooldown[replica_id] = cooldown
        self._until[replica_id] = self._clock() + cooldown

    def succeeded(self, replica_id: str) -> None:
        if replica_id in self._cooldown:
            del self._cooldown[replica_id]
            self._until.pop(replica_id, None)

    def avoided(self) -> frozenset[str]:
        """Replicas in their cooldown now (a past cooldown is kept, to double the next one)."""
        if not self._until:
            return _NONE
        now = self._clock()
        return frozenset(rid for rid, until in self._until.items() if until > now)

