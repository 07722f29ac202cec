"""Router-wide retry budget: a token bucket, so retries cannot multiply load in an outage.

Every request deposits `ratio` tokens (0.2: retries stay <= ~20% of requests) and time
adds `min_per_s` tokens per second (so a quiet router can still retry now and then);
the bucket holds at most `capacity`. A retry spends one whole token or is refused.
The clock is injected; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable


class RetryBudget:
    def __init__(self, clock: Callable[[], float], ratio: float = 0.2, min_per_s: float = 1.0,
                 capacity: float = 10.0) -> None:
        if ratio < 0 or min_per_s < 0 or capacity < 1:
            raise ValueError("ratio and min_per_s must be >= 0, capacity >= 1")
        self._clock = clock
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.capacity = capacity
        self._tokens = capacity
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._last)
        self._last = now
        self._tokens = min(self.capacity, self._tokens + elapsed * self.min_per_s)

    def on_request(self) -> None:
        self._refill()
        self._tokens = min(self.capacity, self._tokens + self.ratio)

    def try_spend(self) -> bool:
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens
