"""Bounded waiting for end-to-end tests (every wait has a timeout and says what it waited for)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(pred: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
