"""Where an agent streams next after its stream ended (agent.stream.next_target), as a table."""

from __future__ import annotations

import pytest

from tidegate.agent.stream import Ended, next_target

T = ["cp0:1", "cp1:1", "cp2:1"]
NOW = 100.0

CASES = [
    # id, current, ended, failed_at, expected
    ("cut stream: next target", "cp0:1", Ended(), {}, ("cp1:1", "failover")),
    ("wraps around", "cp2:1", Ended(), {}, ("cp0:1", "failover")),
    ("skips a target that failed just now", "cp0:1", Ended(), {"cp1:1": 99.0}, ("cp2:1", "failover")),
    ("all failed recently: plain rotation", "cp0:1", Ended(), {"cp1:1": 99.0, "cp2:1": 99.0}, ("cp1:1", "failover")),
    ("a failure long ago does not count", "cp0:1", Ended(), {"cp1:1": 10.0}, ("cp1:1", "failover")),
    ("a named leader: go at once", "cp0:1", Ended(leader_hint="cp2:1", standby=True), {}, ("cp2:1", "leader")),
    ("a leader outside the list is trusted", "cp0:1", Ended(leader_hint="10.0.0.9:5"), {}, ("10.0.0.9:5", "leader")),
    ("standby names the leader that just died: stay, retry soon", "cp1:1",
     Ended(leader_hint="cp0:1", standby=True), {"cp0:1": 99.5}, ("cp1:1", "standby")),
    ("standby without a leader: stay", "cp1:1", Ended(standby=True), {}, ("cp1:1", "standby")),
    ("handed off by a deposed leader with the new one", "cp0:1", Ended(leader_hint="cp1:1"), {}, ("cp1:1", "leader")),
]


@pytest.mark.parametrize(("current", "ended", "failed_at", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_next_target(current: str, ended: Ended, failed_at: dict[str, float], expected: tuple[str, str]) -> None:
    assert next_target(T, current, ended, failed_at, NOW) == expected


def test_single_target_stays() -> None:
    assert next_target(["only:1"], "only:1", Ended(), {"only:1": 99.0}, NOW) == ("only:1", "failover")
