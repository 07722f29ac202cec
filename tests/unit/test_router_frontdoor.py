"""The router's front-door bookkeeping, log rate limits and connect-refusal avoidance: pure logic."""

from __future__ import annotations

import json
import logging

import pytest

from tidegate.router.frontdoor import (
    BUSY_RESPONSE,
    EVICT_SCAN,
    HEADER_TIMEOUT_RESPONSE,
    ConnectionTable,
    RateLimitFilter,
    fd_budget,
)
from tidegate.router.ratelog import MAX_KEYS, OVERFLOW_KEY, LogRateLimiter
from tidegate.router.refusals import ConnectRefusals


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_table_admits_below_the_limit():
    t: ConnectionTable[str] = ConnectionTable(2, min_idle_s=1)
    assert t.make_room(lambda c: True, 0) == (True, None)
    t.add("a", 0)
    assert t.make_room(lambda c: True, 0) == (True, None)


def test_table_evicts_the_least_recently_active_idle_connection():
    t: ConnectionTable[str] = ConnectionTable(3, min_idle_s=1)
    for c in "abc":
        t.add(c, 0)
    t.touch("a", 1)  # a is now the most recently active
    assert t.make_room(lambda c: True, 5) == (True, "b")
    assert len(t) == 2 and not t.remove("b") and t.remove("c")


def test_table_never_evicts_a_connection_quiet_for_less_than_min_idle():
    t: ConnectionTable[str] = ConnectionTable(2, min_idle_s=1)
    t.add("a", 0)
    t.add("b", 0.5)
    assert t.make_room(lambda c: True, 0.9) == (False, None)   # flood: refuse, keep the newcomers' elders
    assert t.make_room(lambda c: True, 1.0) == (True, "a")


def test_table_skips_busy_connections_and_refuses_when_all_are_busy():
    t: ConnectionTable[str] = ConnectionTable(3, min_idle_s=1)
    for c in "abc":
        t.add(c, 0)
    busy = {"a", "b"}
    assert t.make_room(lambda c: c not in busy, 5) == (True, "c")
    t.add("d", 5)
    busy = {"a", "b", "d"}
    assert t.make_room(lambda c: c not in busy, 10) == (False, None)
    assert len(t) == 3


def test_table_scan_is_bounded():
    t: ConnectionTable[int] = ConnectionTable(EVICT_SCAN * 2, min_idle_s=1)
    for i in range(EVICT_SCAN * 2):
        t.add(i, 0)
    seen: list[int] = []

    def idle(c: int) -> bool:
        seen.append(c)
        return c == EVICT_SCAN * 2 - 1  # the newest: beyond the scan

    assert t.make_room(idle, 5) == (False, None)
    assert len(seen) == EVICT_SCAN


def test_table_limit_must_be_positive():
    with pytest.raises(ValueError):
        ConnectionTable(0)


@pytest.mark.parametrize("raw,status", [(BUSY_RESPONSE, 503), (HEADER_TIMEOUT_RESPONSE, 408)])
def test_canned_responses_are_complete_http_with_an_openai_body(raw: bytes, status: int):
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} ")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert int(headers["Content-Length"]) == len(body)
    assert headers["Connection"] == "close"
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("nofile,clients,engines,reserve,want", [
    (100_000, 8192, 10_000, 2304, (8192, 10_000)),     # fits
    (20_000, 10_000, 10_000, 2000, (9000, 9000)),      # scaled down in proportion
    (20_000, 8192, 10_000, 2304, (7968, 9727)),
    (2304 + 2, 8192, 10_000, 2304, (1, 1)),            # barely anything left
])
def test_fd_budget(nofile: int, clients: int, engines: int, reserve: int, want: tuple[int, int]):
    got = fd_budget(nofile, clients, engines, reserve)
    assert got == want
    assert sum(got) <= max(2, nofile - reserve)


def test_fd_budget_refuses_a_limit_below_the_reserve():
    with pytest.raises(ValueError, match="ulimit"):
        fd_budget(1024, 10, 10, reserve=1024)


def test_rate_limiter_logs_once_per_interval_and_counts_the_rest():
    clock = FakeClock()
    rl = LogRateLimiter(clock, interval_s=10)
    assert rl.check("x") == 0
    assert [rl.check("x") for _ in range(5)] == [None] * 5
    assert rl.check("y") == 0  # keys are independent
    clock.now = 10.0
    assert rl.check("x") == 5
    assert rl.check("x") is None


def test_rate_limiter_key_table_is_bounded():
    clock = FakeClock()
    rl = LogRateLimiter(clock, interval_s=10)
    for i in range(MAX_KEYS):
        assert rl.check(f"k{i}") == 0
    assert rl.check("one-more") == 0     # folded into the overflow key
    assert rl.check("and-another") is None
    assert rl.check(OVERFLOW_KEY) is None


def test_rate_limit_filter_drops_repeats_and_reports_them():
    clock = FakeClock()
    f = RateLimitFilter(clock, interval_s=1)

    def rec(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    assert f.filter(rec("socket.accept() out of system resource"))
    assert not any(f.filter(rec("socket.accept() out of system resource")) for _ in range(100))
    clock.now = 1.0
    r = rec("socket.accept() out of system resource")
    assert f.filter(r) and "100 similar lines suppressed" in r.getMessage()


def test_refused_replica_is_avoided_with_doubling_cooldown_until_a_success():
    clock = FakeClock()
    r = ConnectRefusals(clock, base_s=1.0, max_s=4.0)
    assert r.avoided() == frozenset()
    r.refused("a")
    assert r.avoided() == {"a"}
    clock.now = 1.0
    assert r.avoided() == frozenset()      # cooldown over: may be tried again
    r.refused("a")                         # refused again: 2 s now
    clock.now = 2.9
    assert r.avoided() == {"a"}
    clock.now = 3.0
    r.refused("a")
    r.refused("a")                         # capped at max_s
    clock.now = 6.9
    assert r.avoided() == {"a"}
    clock.now = 7.0
    assert r.avoided() == frozenset()
    r.refused("a")
    r.succeeded("a")
    assert r.avoided() == frozenset()
    r.refused("a")                         # after a success the cooldown starts over
    clock.now = 8.0
    assert r.avoided() == frozenset()


def test_refusals_need_a_sane_cooldown():
    with pytest.raises(ValueError):
        ConnectRefusals(FakeClock(), base_s=0)
    with pytest.raises(ValueError):
        ConnectRefusals(FakeClock(), base_s=2, max_s=1)
