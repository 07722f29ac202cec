"""Durations as operators type them: 10m, 30s, 1h30m, 500ms, 1.5s; a bare number is seconds."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(text: str) -> float:
    """Seconds in `text`; raises ValueError naming the accepted forms."""
    s = text.strip().lower()
    if not s:
        raise ValueError("empty duration")
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if value < 0:
            raise ValueError(f"negative duration {text!r}")
        return value
    total = 0.0
    pos = 0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        raise ValueError(f"invalid duration {text!r} (examples: 30s, 10m, 1h30m, 500ms)")
    return total


def format_duration(seconds: float) -> str:
    """Short human form: 850ms, 12s, 4m05s, 2h03m."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    if seconds < 3600:
        m, s = divmod(int(seconds), 60)
        return f"{m}m{s:02d}s"
    h, rest = divmod(int(seconds), 3600)
    return f"{h}h{rest // 60:02d}m"
