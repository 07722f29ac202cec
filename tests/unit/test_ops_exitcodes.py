"""Exit codes scripts rely on: gRPC status -> code, several outcomes -> one code."""

from __future__ import annotations

import grpc
import pytest

from tidegate.ops import exitcodes as ec
from tidegate.ops.client import AdminError
from tidegate.v1 import admin_pb2


def test_documented_values_do_not_change() -> None:
    assert (ec.OK, ec.ERROR, ec.USAGE, ec.REFUSED, ec.TIMEOUT, ec.AUTH, ec.NOT_FOUND) == (0, 1, 2, 3, 4, 5, 6)


@pytest.mark.parametrize(("status", "code"), [
    (grpc.StatusCode.OK, 0),
    (grpc.StatusCode.UNAVAILABLE, 1),
    (grpc.StatusCode.INTERNAL, 1),
    (grpc.StatusCode.UNIMPLEMENTED, 1),
    (grpc.StatusCode.DEADLINE_EXCEEDED, 1),
    (grpc.StatusCode.DATA_LOSS, 1),
    (grpc.StatusCode.INVALID_ARGUMENT, 2),
    (grpc.StatusCode.FAILED_PRECONDITION, 3),
    (grpc.StatusCode.UNAUTHENTICATED, 5),
    (grpc.StatusCode.PERMISSION_DENIED, 5),
    (grpc.StatusCode.NOT_FOUND, 6),
])
def test_for_status(status: grpc.StatusCode, code: int) -> None:
    assert ec.for_status(status) == code
    assert AdminError(status, "x").exit_code == code


@pytest.mark.parametrize(("codes", "code"), [
    ([], 0), ([0, 0], 0), ([0, 3], 3), ([6, 3], 3), ([3, 4], 4), ([1, 6], 6), ([5, 2, 4], 5), ([2, 1], 2),
    ([0, 1], 1), ([0, 99], 1),
], ids=str)
def test_worst(codes: list[int], code: int) -> None:
    assert ec.worst(codes) == code


def R(rid: str, *, changed: bool = True, refused: bool = False, message: str = "") -> admin_pb2.IntentResult:  # noqa: N802
    return admin_pb2.IntentResult(replica_id=rid, changed=changed, refused=refused, message=message)


@pytest.mark.parametrize(("results", "code"), [
    ([], 0),
    ([R("a", message="cordoned")], 0),
    ([R("a", changed=False, message="already cordoned")], 0),
    ([R("a", message="cordoned"), R("b", changed=False, refused=True, message="budget pool:m")], 3),
    ([R("a", changed=False, message="unknown replica (not connected here)")], 6),
    ([R("a", changed=False, message="unknown replica"), R("b", refused=True, changed=False)], 3),
], ids=["none", "changed", "idempotent", "partly-refused", "unknown", "refused-wins"])
def test_for_intent_results(results: list[admin_pb2.IntentResult], code: int) -> None:
    assert ec.for_intent_results(results) == code


def test_admin_error_text_names_status_and_address_only() -> None:
    e = AdminError(grpc.StatusCode.PERMISSION_DENIED, "local-viewer has role viewer", "127.0.0.1:1")
    assert str(e) == "PERMISSION_DENIED: local-viewer has role viewer (127.0.0.1:1)"
