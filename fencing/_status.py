"""One registry between :mod:`fencing.errors` and gRPC statuses, for servers and clients.

A server turns a :class:`~fencing.errors.FencingError` into a status whose
``google.rpc.ErrorInfo`` detail (domain ``fencing.v1``) carries the reason and the
exception's data as metadata; a client turns such a status back into the same
exception class with the same attributes. Statuses without our ErrorInfo (the
server unreachable, a deadline) map to the nearest exception of the tree.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc
import grpc.aio
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from fencing.errors import (
    BackendUnavailableError,
    DeadlineExceededError,
    FencingError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLost,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    StaleTokenError,
    UnauthenticatedError,
)

DOMAIN = "fencing.v1"

#: reason -> (exception class, gRPC status code). The single source of truth.
REGISTRY: dict[str, tuple[type[FencingError], grpc.StatusCode]] = {
    StaleTokenError.reason: (StaleTokenError, grpc.StatusCode.FAILED_PRECONDITION),
    LeaseHeldError.reason: (LeaseHeldError, grpc.StatusCode.ABORTED),
    LeaseLost.reason: (LeaseLost, grpc.StatusCode.FAILED_PRECONDITION),
    InvalidArgumentError.reason: (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    BackendUnavailableError.reason: (BackendUnavailableError, grpc.StatusCode.UNAVAILABLE),
    UnauthenticatedError.reason: (UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    PermissionDeniedError.reason: (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    ResourceExhaustedError.reason: (ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    NotFoundError.reason: (NotFoundError, grpc.StatusCode.NOT_FOUND),
    # Sent by a server only as the verdict of one call of a stream (its deadline_ms).
    DeadlineExceededError.reason: (DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
}


def _reason_of(exc: FencingError) -> str:
    # AcquireTimeoutError travels as LEASE_HELD: the server only knows "still held".
    for cls in type(exc).__mro__:
        reason = getattr(cls, "reason", None)
        if isinstance(reason, str) and reason in REGISTRY and REGISTRY[reason][0] is cls:
            return reason
    return BackendUnavailableError.reason


def to_status(exc: FencingError) -> status_pb2.Status:
    """The ``google.rpc.Status`` (with ErrorInfo) that carries ``exc`` over the wire."""
    reason = _reason_of(exc)
    code = REGISTRY[reason][1]
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=exc.metadata())
    detail = any_pb2.Any()
    detail.Pack(info)
    return status_pb2.Status(code=code.value[0], message=exc.message, details=[detail])


async def abort(context: grpc.aio.ServicerContext[object, object], exc: FencingError) -> NoReturn:
    """End the current RPC with the status for ``exc``."""
    await context.abort_with_status(rpc_status.to_status(to_status(exc)))
    raise AssertionError("abort_with_status returned")  # pragma: no cover


def from_status(status: status_pb2.Status) -> FencingError | None:
    """Rebuild our exception from a ``google.rpc.Status``; ``None`` if it is not ours."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == DOMAIN and info.reason in REGISTRY:
                cls = REGISTRY[info.reason][0]
                return cls.from_metadata(status.message, dict(info.metadata))
    return None


def from_rpc_error(err: grpc.RpcError) -> Exception:
    """Translate a failed call into the exception the SDK raises (chain ``err`` yourself).

    Ours (with ErrorInfo) come back as their class; an unreachable server becomes
    :class:`BackendUnavailableError`; a passed deadline :class:`DeadlineExceededError`;
    anything else is returned unchanged.
    """
    call: Any = err  # every RpcError raised by a call is also a grpc.Call
    status = rpc_status.from_call(call) if hasattr(call, "trailing_metadata") else None
    if status is not None:
        ours = from_status(status)
        if ours is not None:
            return ours
    code = call.code() if hasattr(call, "code") else None
    details = call.details() if hasattr(call, "details") else str(err)
    by_code = from_code(code, details)
    return err if by_code is None else by_code


def refused(exc: BaseException) -> bool:
    """Whether a failure (an RpcError, or our exception chained from one) is gRPC's own
    "failed to connect": no server accepted the connection (refused, no route, a name
    that does not resolve), so the request was never sent. Not a server's verdict."""
    err = exc if isinstance(exc, grpc.RpcError) else exc.__cause__
    if not isinstance(err, grpc.RpcError):
        return False
    call: Any = err
    if not (hasattr(call, "code") and hasattr(call, "details")):
        return False
    return call.code() == grpc.StatusCode.UNAVAILABLE and "failed to connect" in (
        call.details() or ""
    )


def from_code(code: grpc.StatusCode | None, details: str) -> FencingError | None:
    """The exception of the tree nearest to a status without our ErrorInfo; None for a
    code the SDK has no exception for (e.g. UNIMPLEMENTED)."""
    if code == grpc.StatusCode.UNAVAILABLE:
        return BackendUnavailableError(f"server unavailable: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceededError(f"deadline exceeded: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return UnauthenticatedError(details or "unauthenticated")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDeniedError(details or "permission denied")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ResourceExhaustedError(details or "resource exhausted")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgumentError(details or "invalid argument")
    return None


#: gRPC status codes by number (a ``google.rpc.Status`` carries the number).
CODES: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def to_fields(exc: FencingError) -> tuple[int, str, str, dict[str, str]]:
    """``(code number, reason, message, metadata)``: ``exc`` as one verdict of a stream
    (``fencing.v1.WriteError``), carrying what its status would carry."""
    reason = _reason_of(exc)
    return REGISTRY[reason][1].value[0], reason, exc.message, exc.metadata()


def from_fields(reason: str, message: str, metadata: dict[str, str]) -> FencingError:
    """The exception a stream verdict's ``(reason, message, metadata)`` stands for."""
    entry = REGISTRY.get(reason)
    if entry is None:
        return FencingError(message or reason)
    return entry[0].from_metadata(message, metadata)


def code_name(status: status_pb2.Status) -> str:
    """Readable name of a status code (for logs)."""
    return str(code_pb2.Code.Name(status.code))


__all__ = [
    "CODES",
    "DOMAIN",
    "REGISTRY",
    "abort",
    "code_name",
    "from_code",
    "from_fields",
    "from_rpc_error",
    "from_status",
    "to_fields",
    "to_status",
]
