"""Priority classes of requests: `critical`, `standard` (the default), `sheddable`.

A request's class comes from a header (`x-tidegate-priority` at the router) only where the
operator says that header can be trusted (a router behind an authenticating gateway); anywhere
else every request is `standard`, so a client cannot promote itself. The class maps to
`RequestFeatures.priority` with the Gateway API Inference Extension convention: higher is more
important, below 0 may be shed (GIE `InferenceObjective.priority`).

| class     | priority |
|-----------|----------|
| critical  | 1        |
| standard  | 0        |
| sheddable | -1       |

Pure: no I/O, no clock.
"""

from __future__ import annotations

CRITICAL = "critical"
STANDARD = "standard"
SHEDDABLE = "sheddable"
DEFAULT = STANDARD

PRIORITY = {CRITICAL: 1, STANDARD: 0, SHEDDABLE: -1}
CLASSES = tuple(PRIORITY)  # most important first: the order in which classes are served


class PriorityError(ValueError):
    """A priority header the router trusts holds something other than a class name."""


def parse_class(value: str | None, *, trusted: bool) -> str:
    """The class named by a header value. Untrusted: always `standard` (the value is not even
    read, so garbage cannot fail a request either). Trusted: absent or empty -> `standard`;
    otherwise one class name, case and surrounding blanks ignored, else PriorityError."""
    if not trusted or value is None:
        return DEFAULT
    name = value.strip().lower()
    if not name:
        return DEFAULT
    if name not in PRIORITY:
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise PriorityError(f"invalid priority {shown!r}; valid: {', '.join(CLASSES)}")
    return name


def priority_of(cls: str) -> int:
    """`RequestFeatures.priority` of a class (KeyError for an unknown class)."""
    return PRIORITY[cls]


def class_of(priority: int) -> str:
    """The class a priority value falls in: > 0 critical, 0 standard, < 0 sheddable."""
    if priority > 0:
        return CRITICAL
    if priority < 0:
        return SHEDDABLE
    return STANDARD
