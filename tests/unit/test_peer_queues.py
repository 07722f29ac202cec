"""PeerQueues: the peers' reports as the admission rules across routers read them (pure; the
rules themselves, through AdmissionQueue, are in test_admission.py)."""

from __future__ import annotations

import pytest

from tidegate.policy.classes import CLASSES
from tidegate.policy.peer_queues import HeldReport, PeerQueues

STANDARD, SHEDDABLE = CLASSES.index("standard"), CLASSES.index("sheddable")


def peers(*reports: tuple[str, HeldReport, float]) -> PeerQueues:
    q = PeerQueues(fifo_share=0.1, report_s=0.055)
    for name, report, at in reports:
        q.on_report(name, report, at)
    return q


@pytest.mark.parametrize(("case", "reports", "rank", "own_above", "holds", "ahead"), [
    ("no peer", [], STANDARD, 0.0, False, 0.0),
    ("a peer's critical is above standard", [{"critical": 900.0}], STANDARD, 0.0, True, 900.0),
    ("only what outlasts our own counts", [{"critical": 900.0}], STANDARD, 400.0, True, 500.0),
    ("our own outlasts it: nothing", [{"critical": 900.0}], STANDARD, 1200.0, True, 0.0),
    ("the same class is not above", [{"standard": 900.0}], STANDARD, 0.0, False, 0.0),
    ("sheddable counts both classes above", [{"critical": 100.0, "standard": 800.0}], SHEDDABLE, 0.0, True, 900.0),
    ("the largest peer, not the sum", [{"critical": 900.0}, {"critical": 700.0}], STANDARD, 0.0, True, 900.0),
    ("critical has nothing above", [{"critical": 900.0}], 0, 0.0, False, 0.0),
])
def test_what_peers_hold_above_a_class(case: str, reports: list, rank: int, own_above: float, holds: bool,
                                       ahead: float) -> None:
    q = peers(*((f"router-{i}", HeldReport(r), 0.0) for i, r in enumerate(reports)))
    assert q.holds_above(rank) is holds, case
    assert q.ahead(rank, {"critical": own_above}) == pytest.approx(ahead), case


@pytest.mark.parametrize(("case", "slack", "now", "near"), [
    ("plenty of slack", 5.0, 1.0, False),
    ("short of slack", 0.1, 1.0, True),
    ("just past its last start", -0.1, 1.0, True),
    ("long past it: it went, or waits to go late", -1.0, 1.0, False),
])
def test_a_peers_critical_head_near_its_last_start(case: str, slack: float, now: float, near: bool) -> None:
    q = peers(("router-1", HeldReport({"critical": 10.0}, critical_slack_s=slack), now))
    assert q.critical_near(now, 0.5) is near, case


@pytest.mark.parametrize(("case", "head", "reported_at", "arrival", "tokens", "now", "longer"), [
    # gate = max(0.1 x 2 s, 2 x 0.055 s) = 0.2 s; a head's arrival = report time - its age
    ("held 0.5 s longer, no larger", (0.6, 800.0), 1.0, 0.9, 1000.0, 1.0, True),
    ("within the gate", (0.25, 800.0), 1.0, 0.9, 1000.0, 1.0, False),
    ("larger than the request", (0.6, 1200.0), 1.0, 0.9, 1000.0, 1.0, False),
    ("yielded for two gates already", (0.8, 800.0), 1.0, 0.5, 1000.0, 1.0, False),
    ("a report two ages old: a silent peer", (0.6, 800.0), 0.85, 0.8, 1000.0, 1.0, False),
])
def test_a_peers_older_head(case: str, head: tuple, reported_at: float, arrival: float, tokens: float, now: float,
                            longer: bool) -> None:
    q = peers(("router-1", HeldReport({"standard": head[1]}, None, {"standard": head}), reported_at))
    assert q.held_longer("standard", arrival, tokens, now, 2.0) is longer, case
    assert not q.held_longer("critical", arrival, tokens, now, 2.0)     # only its own class's heads


def test_off_or_forgotten_a_peer_holds_nothing_back() -> None:
    report = HeldReport({"critical": 900.0, "standard": 800.0}, 0.1, {"standard": (0.6, 800.0)})
    off = PeerQueues(fifo_share=None, report_s=0.055)
    off.on_report("router-1", report, 1.0)
    assert not off.held_longer("standard", 0.9, 1000.0, 1.0, 2.0)       # arrival order across routers off
    assert off.holds_above(STANDARD)                                    # class order still on
    q = peers(("router-1", report, 1.0))
    q.forget("router-1")
    assert (q.holds_above(SHEDDABLE), q.ahead(SHEDDABLE, {}), q.critical_near(1.0, 0.5),
            q.held_longer("standard", 0.9, 1000.0, 1.0, 2.0)) == (False, 0.0, False, False)
    q.on_report("router-1", report, 1.0)
    q.on_report("router-1", HeldReport({}), 1.0)                        # it holds nothing now
    assert not q.holds_above(SHEDDABLE) and not q.critical_near(1.0, 0.5)
