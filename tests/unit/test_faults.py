"""Fault policy (tidegate.policy.faults): eject, cut, re-admission backoff, with a fake clock."""

from __future__ import annotations

import pytest

from tidegate.policy.faults import (
    FaultPolicyConfig,
    FaultSignals,
    FaultState,
    backoff_s,
    reconnected,
    step,
    view_reasons,
)

CFG = FaultPolicyConfig(unhealthy_reports=3, preemption_storm_per_s=5, pressure_eject_after_s=30,
                        backoff_initial_s=10, backoff_max_s=300, backoff_reset_after_s=3600)
OK = FaultSignals()


def run(signals: list[tuple[float, FaultSignals]], state: FaultState | None = None) -> tuple[FaultState, list[str]]:
    s = state or FaultState()
    kinds: list[str] = []
    for now, sig in signals:
        r = step(s, sig, now, CFG)
        s = r.state
        kinds += [f"{e.kind}@{now:g}" for e in r.events]
    return s, kinds


CASES = [
    # id, (time, signals) sequence, ejected at the end, events
    ("healthy", [(0, OK), (1, OK)], False, []),
    ("critical-xid-ejects-then-readmits", [(0, FaultSignals(xid_events=(48,))), (5, OK), (10, OK)], False,
     ["eject@0", "readmit@10"]),
    ("non-critical-xid-ignored", [(0, FaultSignals(xid_events=(13, 31)))], False, []),
    ("xid-79-not-recoverable", [(0, FaultSignals(xid_events=(79,))), (1000, OK)], True, ["eject@0"]),
    ("gpu-lost-not-recoverable", [(0, FaultSignals(gpu_lost=True)), (1000, OK)], True, ["eject@0"]),
    ("row-remap-failure-not-recoverable", [(0, FaultSignals(row_remap_failed=True)), (1000, OK)], True, ["eject@0"]),
    ("ecc-holds-until-cleared", [(0, FaultSignals(ecc_uncorrected=1)), (20, FaultSignals(ecc_uncorrected=1)),
                                 (21, OK)], False, ["eject@0", "readmit@21"]),
    ("unhealthy-two-is-not-enough", [(0, FaultSignals(healthy=False)), (1, FaultSignals(healthy=False)), (2, OK)],
     False, []),
    ("unhealthy-three-ejects", [(t, FaultSignals(healthy=False, engine_error="conn refused")) for t in (0, 1, 2)],
     True, ["eject@2"]),
    ("readmit-needs-healthy", [(0, FaultSignals(xid_events=(48,))), (50, FaultSignals(healthy=False))], True,
     ["eject@0"]),
    ("oom-persisting-ejects", [(0, FaultSignals(oom=True)), (29, FaultSignals(oom=True)), (30, FaultSignals(oom=True))],
     True, ["eject@30"]),
    ("oom-clears-resets-timer", [(0, FaultSignals(oom=True)), (20, OK), (25, FaultSignals(oom=True)),
                                 (50, FaultSignals(oom=True))], False, []),
    ("storm-ejects", [(0, FaultSignals(preemptions_per_s=9)), (31, FaultSignals(preemptions_per_s=9))], True,
     ["eject@31"]),
]


@pytest.mark.parametrize(("signals", "ejected", "events"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fault_table(signals: list[tuple[float, FaultSignals]], ejected: bool, events: list[str]) -> None:
    s, kinds = run(signals)
    assert (s.ejected, kinds) == (ejected, events)


def test_cut_reason_then_eject_reason() -> None:
    s, _ = run([(0, FaultSignals(preemptions_per_s=9))])
    assert view_reasons(s, 0) == ("", "weight cut: preemption storm 9.0/s > 5/s")
    s, _ = run([(31, FaultSignals(preemptions_per_s=9))], s)
    ejected, cut = view_reasons(s, 31)
    assert ejected.startswith("ejected: preemption storm") and "in 10s" in ejected and cut == ""


def test_backoff_doubles_caps_and_resets() -> None:
    assert [backoff_s(n, CFG) for n in (1, 2, 3, 4, 5, 6, 7)] == [10, 20, 40, 80, 160, 300, 300]
    fault = FaultSignals(xid_events=(48,))
    s, t = FaultState(), 0.0
    waits = []
    for _ in range(3):
        s = step(s, fault, t, CFG).state
        waits.append(s.readmit_at - t)
        t = s.readmit_at
        s = step(s, OK, t, CFG).state
        assert not s.ejected
    assert waits == [10, 20, 40]
    # A healthy hour since the last re-admission resets the count.
    t += 3600
    s = step(s, fault, t, CFG).state
    assert s.readmit_at - t == 10 and s.ejections == 1


def test_reconnect_clears_only_permanent() -> None:
    lost = step(FaultState(), FaultSignals(gpu_lost=True), 0, CFG).state
    r = reconnected(lost, 5)
    assert not r.state.ejected and [e.kind for e in r.events] == ["readmit"]
    ecc = step(FaultState(), FaultSignals(ecc_uncorrected=2), 0, CFG).state
    assert reconnected(ecc, 5).state == ecc


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        FaultPolicyConfig(unhealthy_reports=0)
    with pytest.raises(ValueError):
        FaultPolicyConfig(backoff_initial_s=10, backoff_max_s=5)
