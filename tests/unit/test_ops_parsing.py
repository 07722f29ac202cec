"""Pure parsing of the operations commands: durations, selectors, scopes, budget values, states."""

from __future__ import annotations

import pytest

from tidegate.ops.durations import format_duration, parse_duration
from tidegate.ops.selectors import (
    build_selector,
    parse_budget_value,
    parse_labels,
    parse_scope,
    parse_state,
    state_name,
)
from tidegate.v1 import records_pb2

RS = records_pb2.ReplicaState


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30.0), ("10m", 600.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1.5s", 1.5), ("2", 2.0),
    ("0.25", 0.25), ("1d", 86400.0), (" 5M ", 300.0), ("1h0m30s", 3630.0), ("0s", 0.0),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "m", "10x", "s10", "1h 30m", "-5", "10m-", "1.s", "ms"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [
    (0.05, "50ms"), (1.5, "1.5s"), (42, "42s"), (65, "1m05s"), (3 * 3600 + 120, "3h02m"), (-2, "-2.0s"),
])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(("items", "labels"), [
    (["pool=m"], {"pool": "m"}),
    (["pool=meta-llama/Llama-3.1-8B", "region=eu"], {"pool": "meta-llama/Llama-3.1-8B", "region": "eu"}),
    (["region=eu,zone=eu-a"], {"region": "eu", "zone": "eu-a"}),
    (["pool=a=b"], {"pool": "a=b"}),
    ([], {}),
    (["pool=m", "pool=m"], {"pool": "m"}),
])
def test_parse_labels(items: list[str], labels: dict[str, str]) -> None:
    assert parse_labels(items) == labels


@pytest.mark.parametrize(("items", "needle"), [
    (["pool"], "key=value"), (["=m"], "key=value"), (["pool="], "key=value"),
    (["gpu=h100"], "unknown selector label"), (["pool=a", "pool=b"], "twice"),
])
def test_parse_labels_rejects(items: list[str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_labels(items)


def test_build_selector() -> None:
    sel = build_selector(["replica-1", "replica-0", "replica-1"], [])
    assert list(sel.replica_ids) == ["replica-0", "replica-1"] and not sel.labels
    sel = build_selector([], ["zone=local-b"])
    assert dict(sel.labels) == {"zone": "local-b"} and not sel.replica_ids
    with pytest.raises(ValueError, match="name replica ids"):
        build_selector([], [])
    with pytest.raises(ValueError, match="not both"):
        build_selector(["replica-0"], ["pool=m"])


@pytest.mark.parametrize(("text", "ok"), [
    ("pool:meta-llama/Llama-3.1-8B", True), ("region:eu-west", True), ("pool:", False), ("zone:a", False),
    ("eu-west", False), (":x", False),
])
def test_parse_scope(text: str, ok: bool) -> None:
    if ok:
        assert parse_scope(text) == text
    else:
        with pytest.raises(ValueError, match="pool:NAME or region:NAME"):
            parse_scope(text)


@pytest.mark.parametrize(("text", "value"), [("3", "3"), ("75%", "75%"), (" 0 ", "0"), ("100%", "100%")])
def test_parse_budget_value(text: str, value: str) -> None:
    assert parse_budget_value(text) == value


@pytest.mark.parametrize("text", ["", "-1", "1.5", "101%", "%", "x", "3 %"])
def test_parse_budget_value_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_budget_value(text)


@pytest.mark.parametrize(("text", "value"), [
    ("ready", RS.REPLICA_STATE_READY), ("CORDONED", RS.REPLICA_STATE_CORDONED),
    ("replica_state_draining", RS.REPLICA_STATE_DRAINING), ("stale", RS.REPLICA_STATE_STALE),
])
def test_parse_state(text: str, value: int) -> None:
    assert parse_state(text) == value
    assert state_name(value) == text.lower().removeprefix("replica_state_")


@pytest.mark.parametrize("text", ["unspecified", "up", ""])
def test_parse_state_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="valid: joining, ready"):
        parse_state(text)


def test_state_name_of_unknown_number() -> None:
    assert state_name(99) == "state99"
