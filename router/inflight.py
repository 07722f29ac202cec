"""Per-replica upstream bookkeeping, owned by the proxy: requests in flight (acquired per attempt,
released in finally) and upstream errors in a row (reset by a success), which the presence
record carries to the control plane's outlier ejection."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType


class InflightCounter:
    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._errors: dict[str, int] = {}

    def failed(self, replica_id: str) -> None:
        self._errors[replica_id] = self._errors.get(replica_id, 0) + 1

    def succeeded(self, replica_id: str) -> None:
        self._errors.pop(replica_id, None)

    def error_streaks(self) -> Mapping[str, int]:
        return MappingProxyType(dict(self._errors))

    def acquire(self, replica_id: str) -> None:
        self._counts[replica_id] = self._counts.get(replica_id, 0) + 1

    def release(self, replica_id: str) -> None:
        n = self._counts.get(replica_id, 0) - 1
        if n < 0:  # a bug elsewhere; never report a negative load
            n = 0
        self._counts[replica_id] = n

    def get(self, replica_id: str) -> int:
        return self._counts.get(replica_id, 0)

    def snapshot(self) -> Mapping[str, int]:
        return MappingProxyType(dict(self._counts))

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def prune(self, keep: set[str]) -> None:
        """Forget idle replicas that left every table (bounds the map and metric labels)."""
        for rid in [r for r, n in self._counts.items() if n == 0 and r not in keep]:
            del self._counts[rid]
        for rid in [r for r in self._errors if r not in keep]:
            del self._errors[rid]
