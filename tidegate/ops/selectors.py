"""Selectors (`--selector pool=M,region=R`), budget scopes and budget values."""

from __future__ import annotations

import re

from tidegate.v1 import admin_pb2, records_pb2

LABELS = ("pool", "region", "zone")
SCOPE_KINDS = ("pool", "region")
_BUDGET_VALUE = re.compile(r"^(\d+)(%?)$")

RS = records_pb2.ReplicaState


def parse_labels(items: list[str] | None) -> dict[str, str]:
    """['pool=m', 'region=r,zone=z'] -> {'pool': 'm', 'region': 'r', 'zone': 'z'}.

    Values may contain '=' and '/' (model names); keys must be known labels."""
    out: dict[str, str] = {}
    for item in items or []:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key or not value:
                raise ValueError(f"selector {part!r} is not key=value")
            if key not in LABELS:
                raise ValueError(f"unknown selector label {key!r}; valid: {', '.join(LABELS)}")
            if key in out and out[key] != value:
                raise ValueError(f"selector label {key!r} given twice with different values")
            out[key] = value
    return out


def build_selector(ids: list[str] | None, labels: list[str] | None) -> admin_pb2.Selector:
    """A Selector from positional ids and --selector items; at least one is required."""
    ids = [i for i in (ids or []) if i]
    lab = parse_labels(labels)
    if not ids and not lab:
        raise ValueError("name replica ids or give --selector key=value (pool, region, zone)")
    if ids and lab:
        raise ValueError("give replica ids or --selector, not both")
    return admin_pb2.Selector(replica_ids=sorted(set(ids)), labels=lab)


def parse_scope(text: str) -> str:
    """'pool:NAME' or 'region:NAME' (validated, returned as given)."""
    kind, sep, name = text.partition(":")
    if not sep or kind not in SCOPE_KINDS or not name:
        raise ValueError(f"scope {text!r} must be pool:NAME or region:NAME")
    return text


def parse_budget_value(text: str) -> str:
    """'3' or '25%' (percent at most 100); returned normalised (no spaces)."""
    s = text.strip()
    m = _BUDGET_VALUE.match(s)
    if not m:
        raise ValueError(f"budget value {text!r} must be N or N% (e.g. 2, 75%)")
    if m.group(2) and int(m.group(1)) > 100:
        raise ValueError(f"budget value {text!r}: a percentage is at most 100%")
    return s


def state_name(state: int) -> str:
    """REPLICA_STATE_READY -> 'ready' (unknown numbers -> 'state<N>')."""
    try:
        return RS.Name(state).removeprefix("REPLICA_STATE_").lower()
    except ValueError:
        return f"state{state}"


def parse_state(text: str) -> int:
    """'ready' / 'READY' / 'REPLICA_STATE_READY' -> the enum number."""
    name = text.strip().upper().removeprefix("REPLICA_STATE_")
    valid = [n.removeprefix("REPLICA_STATE_").lower() for n in RS.keys() if n != "REPLICA_STATE_UNSPECIFIED"]
    try:
        value = RS.Value("REPLICA_STATE_" + name)
    except ValueError:
        value = 0
    if value == 0:
        raise ValueError(f"unknown state {text!r}; valid: {', '.join(valid)}")
    return value
