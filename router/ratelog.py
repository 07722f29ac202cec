"""Rate limit for repeated log events, so hostile or broken clients cannot flood the log.

A key (an event name, maybe with a reason) logs at most once per interval; the line that
does log carries how many were suppressed since the previous one. Pure logic over an
injected clock; the caller logs.
"""

from __future__ import annotations

from collections.abc import Callable

# More distinct keys than this are folded into one key, so the table itself stays bounded.
MAX_KEYS = 1024
OVERFLOW_KEY = "_other"


class LogRateLimiter:
    def __init__(self, clock: Callable[[], float], interval_s: float = 10.0) -> None:
        self._clock = clock
        self._interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def check(self, key: str) -> int | None:
        """None: drop this line. Otherwise log it, with the returned count of lines
        suppressed under this key since the last one logged."""
        if key not in self._last and len(self._last) >= MAX_KEYS:
            key = OVERFLOW_KEY
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._suppressed.pop(key, 0)
