"""The error tree shared by Tidegate's packages. Map to HTTP/gRPC codes only at the edge.

    TidegateError
    ├── ConfigError            (tidegate.config; a ValueError)  -> exit code 2
    ├── StoreError             etcd unreachable/timeout -> routers keep last tables; CLI exit 1
    │   └── CompactedError     a watch start revision was compacted: re-list
    ├── RequestError           the client's request is wrong         -> HTTP 400
    │   ├── UnknownModelError  no pool for the model                  -> HTTP 404
    │   └── PromptTooLargeError                                       -> HTTP 400 (context_length_exceeded)
    ├── NoCapacityError        no routable replica                    -> HTTP 503
    ├── AdmissionError         shed by admission                      -> HTTP 429 + Retry-After
    ├── UpstreamError          the engine failed before the first byte -> HTTP 502 / 504 on timeout
    └── AuthError              a caller is refused (controlplane/telemetry_auth.py)
        ├── UnauthenticatedError   no or unknown credential           -> gRPC UNAUTHENTICATED
        └── PermissionDeniedError  known caller, not allowed this     -> gRPC PERMISSION_DENIED
            └── ReplicaHeldError   another identity's stream holds the replica id -> gRPC ALREADY_EXISTS
"""

from __future__ import annotations


class TidegateError(Exception):
    """Base of every error Tidegate raises on purpose."""


class StoreError(TidegateError):
    """etcd could not be reached or answered with an error."""


class CompactedError(StoreError):
    """The requested revision was compacted; the caller must re-list."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revision compacted (compact revision {compact_revision})")
        self.compact_revision = compact_revision


class RequestError(TidegateError):
    """The client's request is malformed or not allowed."""

    code = "invalid_request_error"


class UnknownModelError(RequestError):
    code = "model_not_found"


class PromptTooLargeError(RequestError):
    code = "context_length_exceeded"


class NoCapacityError(TidegateError):
    """No replica of the pool can take the request now."""


class AdmissionError(TidegateError):
    """The request was shed by admission control."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UpstreamError(TidegateError):
    """The engine failed before sending the first byte."""

    def __init__(self, message: str, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


class AuthError(TidegateError):
    """A caller is refused. Messages never contain the credential."""


class UnauthenticatedError(AuthError):
    """No credential, or one nobody issued."""


class PermissionDeniedError(AuthError):
    """The caller is known but may not do this."""


class ReplicaHeldError(PermissionDeniedError):
    """Another identity's open stream holds the replica id."""
