"""Per-request SLO inputs at the router: priority classes and deadline headers (pure, table tests)."""

from __future__ import annotations

import pytest

from tidegate.policy import classes
from tidegate.policy.classes import PriorityError, class_of, parse_class, priority_of
from tidegate.policy.deadlines import TPOT_HEADER, TTFT_HEADER, DeadlineError, parse_deadline_ms, request_slo
from tidegate.policy.registry import SloTargets

CLASS_CASES = [
    # id, header value, trusted, expected class or None for PriorityError
    ("untrusted-absent", None, False, "standard"),
    ("untrusted-critical-ignored", "critical", False, "standard"),
    ("untrusted-garbage-ignored", "\x00nonsense", False, "standard"),
    ("trusted-absent", None, True, "standard"),
    ("trusted-empty", "  ", True, "standard"),
    ("trusted-critical", "critical", True, "critical"),
    ("trusted-standard", "standard", True, "standard"),
    ("trusted-sheddable", "sheddable", True, "sheddable"),
    ("trusted-case-and-blanks", "  Critical ", True, "critical"),
    ("trusted-garbage", "urgent", True, None),
    ("trusted-number", "1", True, None),
    ("trusted-list", "critical,standard", True, None),
    ("trusted-long-garbage", "x" * 500, True, None),
]


@pytest.mark.parametrize(("value", "trusted", "expected"), [c[1:] for c in CLASS_CASES],
                         ids=[c[0] for c in CLASS_CASES])
def test_parse_class(value: str | None, trusted: bool, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(PriorityError) as exc:
            parse_class(value, trusted=trusted)
        assert "valid: critical, standard, sheddable" in str(exc.value)
        assert len(str(exc.value)) < 200  # a huge header is not echoed whole
    else:
        assert parse_class(value, trusted=trusted) == expected


@pytest.mark.parametrize(("cls", "priority"), [("critical", 1), ("standard", 0), ("sheddable", -1)])
def test_priority_follows_gie_convention(cls: str, priority: int) -> None:
    assert priority_of(cls) == priority
    assert class_of(priority) == cls
    assert (priority < 0) == (cls == classes.SHEDDABLE)


def test_class_of_any_priority() -> None:
    assert [class_of(p) for p in (-7, -1, 0, 1, 9)] == ["sheddable", "sheddable", "standard", "critical", "critical"]


DEADLINE_CASES = [
    # id, value, expected seconds or None for DeadlineError
    ("absent", None, None),
    ("integer", "800", 0.8),
    ("decimal", "62.5", 0.0625),
    ("blanks", " 250 ", 0.25),
    ("one-hour", "3600000", 3600.0),
    ("zero", "0", "error"),
    ("negative", "-5", "error"),
    ("empty", "", "error"),
    ("exponent", "1e3", "error"),
    ("inf", "inf", "error"),
    ("nan", "nan", "error"),
    ("unit", "800ms", "error"),
    ("list", "800, 900", "error"),
    ("too-long", "3600001", "error"),
    ("huge-digits", "9" * 400, "error"),
]


@pytest.mark.parametrize(("value", "expected"), [c[1:] for c in DEADLINE_CASES], ids=[c[0] for c in DEADLINE_CASES])
def test_parse_deadline(value: str | None, expected: float | str | None) -> None:
    if expected == "error":
        with pytest.raises(DeadlineError) as exc:
            parse_deadline_ms(TTFT_HEADER, value)
        assert exc.value.header == TTFT_HEADER and TTFT_HEADER in str(exc.value)
        assert len(str(exc.value)) < 200
    else:
        got = parse_deadline_ms(TTFT_HEADER, value)
        assert got is None if expected is None else got == pytest.approx(expected)


POOL = SloTargets(ttft_s=2.0, tpot_s=0.1)
DEFAULT = SloTargets()

SLO_CASES = [
    # id, pool SLO, ttft header, tpot header, expected
    ("no-headers-pool", POOL, None, None, POOL),
    ("no-headers-no-pool", None, None, None, None),
    ("tighter-ttft", POOL, "800", None, SloTargets(0.8, 0.1)),
    ("looser-ttft-clamped", POOL, "5000", None, POOL),
    ("tighter-tpot", POOL, None, "50", SloTargets(2.0, 0.05)),
    ("looser-tpot-clamped", POOL, None, "250", POOL),
    ("both-tighter", POOL, "500", "40", SloTargets(0.5, 0.04)),
    ("mixed", POOL, "500", "400", SloTargets(0.5, 0.1)),
    ("no-pool-tightens-default", None, "700", None, SloTargets(0.7, DEFAULT.tpot_s)),
    ("no-pool-looser-than-default", None, "9000", None, DEFAULT),
]


@pytest.mark.parametrize(("pool", "ttft", "tpot", "expected"), [c[1:] for c in SLO_CASES],
                         ids=[c[0] for c in SLO_CASES])
def test_request_slo_never_looser(pool: SloTargets | None, ttft: str | None, tpot: str | None,
                                  expected: SloTargets | None) -> None:
    got = request_slo(pool, ttft, tpot)
    assert got == expected
    if got is not None:
        base = pool or DEFAULT
        assert got.ttft_s <= base.ttft_s and got.tpot_s <= base.tpot_s


@pytest.mark.parametrize(("ttft", "tpot", "header"), [("abc", None, TTFT_HEADER), (None, "0", TPOT_HEADER),
                                                      ("100", "-1", TPOT_HEADER)])
def test_request_slo_names_the_bad_header(ttft: str | None, tpot: str | None, header: str) -> None:
    with pytest.raises(DeadlineError) as exc:
        request_slo(POOL, ttft, tpot)
    assert exc.value.header == header
