"""Exit codes of the operations commands. Scripts may rely on them (docs/OPERATIONS.md).

When one command meets several outcomes (e.g. one replica refused by a budget and one
unknown), the most specific failure wins in the order of `worst`.
"""

from __future__ import annotations

from typing import Any

import grpc

OK = 0
ERROR = 1          # server or transport error (unreachable, UNAVAILABLE, INTERNAL, UNIMPLEMENTED...)
USAGE = 2          # bad flags, bad config, no control-plane address, invalid argument
REFUSED = 3        # refused (e.g. by a disruption budget), wholly or for some replicas
TIMEOUT = 4        # drain did not finish before --timeout
AUTH = 5           # no token, unknown token (UNAUTHENTICATED) or role too weak (PERMISSION_DENIED)
NOT_FOUND = 6      # an unknown replica id (or scope)

NAMES = {OK: "ok", ERROR: "error", USAGE: "usage", REFUSED: "refused", TIMEOUT: "timeout",
         AUTH: "auth", NOT_FOUND: "not_found"}

_BY_STATUS = {
    grpc.StatusCode.OK: OK,
    grpc.StatusCode.INVALID_ARGUMENT: USAGE,
    grpc.StatusCode.OUT_OF_RANGE: USAGE,
    grpc.StatusCode.FAILED_PRECONDITION: REFUSED,
    grpc.StatusCode.UNAUTHENTICATED: AUTH,
    grpc.StatusCode.PERMISSION_DENIED: AUTH,
    grpc.StatusCode.NOT_FOUND: NOT_FOUND,
}

# Precedence when gathering several outcomes: auth problems hide everything else, then usage,
# then a timeout, refusals, not-found, generic errors.
_PRECEDENCE = (AUTH, USAGE, TIMEOUT, REFUSED, NOT_FOUND, ERROR)


def for_status(code: grpc.StatusCode) -> int:
    """Exit code for a gRPC status (anything not listed is a server/transport error)."""
    return _BY_STATUS.get(code, ERROR)


def worst(codes: list[int] | tuple[int, ...]) -> int:
    """One exit code for several outcomes: 0 if all are 0, else the highest in precedence."""
    for code in _PRECEDENCE:
        if code in codes:
            return code
    return OK if all(c == OK for c in codes) else ERROR


def for_intent_results(results: Any) -> int:
    """Exit code of a cordon/uncordon/drain answer: REFUSED if any replica was refused (e.g. by a
    disruption budget), NOT_FOUND if any was unknown to the control plane, else OK."""
    codes = []
    for r in results:
        if r.refused:
            codes.append(REFUSED)
        elif r.message.lower().startswith(("unknown", "not found", "no such")):
            codes.append(NOT_FOUND)
        else:
            codes.append(OK)
    return worst(codes)
