"""The exceptions of the fencing SDK and servers, one tree with data on attributes.

::

    FencingError                      root: catch this to catch everything below
    ├── StaleTokenError               the guard saw a newer token (.current_token, .key_applied)
    ├── LeaseHeldError                someone else holds the lease (.holder, .remaining_ms)
    │   └── AcquireTimeoutError       ... and acquire(timeout=...) ran out (also a TimeoutError)
    ├── LeaseLost                     the lease or job claim is no longer yours (expired,
    │                                 taken, released, never granted)
    ├── InvalidArgumentError          a request field is out of its limits (.field)
    ├── BackendUnavailableError       the server or the store behind it is down; safe to retry
    ├── DeadlineExceededError         the call's deadline passed: its effect is unknown
    ├── UnauthenticatedError          no or bad credentials
    ├── PermissionDeniedError         authenticated, but not allowed this action
    ├── NotFoundError                 no such object (a job id the queue does not have)
    └── ResourceExhaustedError        a per-client cap was hit (.limit); back off and retry

Each maps to exactly one gRPC status code and ``google.rpc.ErrorInfo.reason``
through the registry in :mod:`fencing._status`, used by servers and clients alike,
so an exception raised in a server arrives as the same exception in the client.
"""

from __future__ import annotations

from typing import ClassVar


def _key_metadata(key_applied: bool | None, applied_by_token: int) -> dict[str, str]:
    """What a refusal says about the refused write's idempotency key (nothing without one)."""
    if key_applied is None:
        return {}
    return {
        "key_applied": "true" if key_applied else "false",
        "applied_by_token": str(applied_by_token),
    }


def _key_from_metadata(metadata: dict[str, str]) -> tuple[bool | None, int]:
    applied = metadata.get("key_applied")
    return (
        None if applied is None else applied == "true",
        int(metadata.get("applied_by_token", "0") or 0),
    )


class FencingError(Exception):
    """Root of every error the fencing SDK raises on purpose."""

    reason: ClassVar[str] = "UNKNOWN"

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.reason)
        self.message = message or self.reason

    def metadata(self) -> dict[str, str]:
        """Structured data sent in ``ErrorInfo.metadata`` (string values only)."""
        return {}

    @classmethod
    def from_metadata(cls, message: str, metadata: dict[str, str]) -> FencingError:
        """Rebuild the exception on the receiving side of a status."""
        return cls(message)


class StaleTokenError(FencingError):
    """A write or fence carried a token older than one the guard already saw.

    ``current_token`` is the guard's fence for the resource at rejection time.
    Nothing of the rejected request was applied.

    The token is judged before the idempotency key: a stale token is refused even when
    its key is known. For a write that carried a key, ``key_applied`` says whether a
    write with that key was applied earlier, and ``applied_by_token`` by which token
    (0 if none), so a retrying caller can tell "my earlier attempt landed"
    (``applied_by_token == token``) from "someone else's did". ``key_applied`` is None
    when the refused request carried no key.
    """

    reason = "STALE_TOKEN"

    def __init__(
        self,
        message: str = "",
        *,
        resource: str = "",
        token: int = 0,
        current_token: int = 0,
        key_applied: bool | None = None,
        applied_by_token: int = 0,
    ) -> None:
        super().__init__(
            message or f"token {token} is stale for {resource!r}: fence is {current_token}"
        )
        self.resource = resource
        self.token = token
        self.current_token = current_token
        self.key_applied = key_applied
        self.applied_by_token = applied_by_token

    def metadata(self) -> dict[str, str]:
        return {
            "resource": self.resource,
            "token": str(self.token),
            "current_token": str(self.current_token),
            **_key_metadata(self.key_applied, self.applied_by_token),
        }

    @classmethod
    def from_metadata(cls, message: str, metadata: dict[str, str]) -> StaleTokenError:
        key_applied, applied_by = _key_from_metadata(metadata)
        return cls(
            message,
            resource=metadata.get("resource", ""),
            token=int(metadata.get("token", "0") or 0),
            current_token=int(metadata.get("current_token", "0") or 0),
            key_applied=key_applied,
            applied_by_token=applied_by,
        )


class LeaseHeldError(FencingError):
    """Someone else holds an unexpired lease on the resource."""

    reason = "LEASE_HELD"

    def __init__(
        self, message: str = "", *, resource: str = "", holder: str = "", remaining_ms: int = 0
    ) -> None:
        super().__init__(message or f"{resource!r} is held by {holder!r} for {remaining_ms} ms")
        self.resource = resource
        self.holder = holder
        self.remaining_ms = remaining_ms

    def metadata(self) -> dict[str, str]:
        return {
            "resource": self.resource,
            "holder": self.holder,
            "remaining_ms": str(self.remaining_ms),
        }

    @classmethod
    def from_metadata(cls, message: str, metadata: dict[str, str]) -> LeaseHeldError:
        return cls(
            message,
            resource=metadata.get("resource", ""),
            holder=metadata.get("holder", ""),
            remaining_ms=int(metadata.get("remaining_ms", "0") or 0),
        )


class AcquireTimeoutError(LeaseHeldError, TimeoutError):
    """``acquire(timeout=...)`` waited the whole timeout and the lease stayed held."""


class LeaseLost(FencingError):
    """The lease is no longer the caller's: it expired, was taken over, or was released.

    Raised by ``Renew``/``Release`` with a token that is not the current unexpired
    lease, by ``Lease.check()`` once renewal failed or the local deadline passed,
    and out of ``hold(...)`` blocks whose lease was lost. A ``strict`` guard raises it
    for a write or ``Fence`` whose token is not below the fence but is not the live
    lease or job claim either (expired, released, taken over, never granted): nobody
    newer necessarily owns the resource, but the caller does not. ``key_applied`` and
    ``applied_by_token`` as on :class:`StaleTokenError` (a refused write's key).
    """

    reason = "LEASE_LOST"

    def __init__(
        self,
        message: str = "",
        *,
        resource: str = "",
        token: int = 0,
        key_applied: bool | None = None,
        applied_by_token: int = 0,
    ) -> None:
        super().__init__(message or f"lease on {resource!r} with token {token} is lost")
        self.resource = resource
        self.token = token
        self.key_applied = key_applied
        self.applied_by_token = applied_by_token

    def metadata(self) -> dict[str, str]:
        return {
            "resource": self.resource,
            "token": str(self.token),
            **_key_metadata(self.key_applied, self.applied_by_token),
        }

    @classmethod
    def from_metadata(cls, message: str, metadata: dict[str, str]) -> LeaseLost:
        key_applied, applied_by = _key_from_metadata(metadata)
        return cls(
            message,
            resource=metadata.get("resource", ""),
            token=int(metadata.get("token", "0") or 0),
            key_applied=key_applied,
            applied_by_token=applied_by,
        )


class InvalidArgumentError(FencingError, ValueError):
    """A request field is outside its documented limits; ``field`` names it."""

    reason = "INVALID_ARGUMENT"

    def __init__(self, message: str = "", *, field: str = "") -> None:
        super().__init__(message or f"invalid {field}")
        self.field = field

    def metadata(self) -> dict[str, str]:
        return {"field": self.field}

    @classmethod
    def from_metadata(cls, message: str, metadata: dict[str, str]) -> InvalidArgumentError:
        return cls(message, field=metadata.get("field", ""))


class BackendUnavailableError(FencingError):
    """The store behind the server is unreachable; the request had no effect or
    its effect is unknown only where the docs of the call say so. Safe to retry."""

    reason = "BACKEND_UNAVAILABLE"


class DeadlineExceededError(FencingError, TimeoutError):
    """The call's deadline passed before an answer came: it may or may not have taken
    effect (a chaos history records it as ``info``). Retrying an ``Acquire`` with the
    same ``request_id`` is safe; a ``Write`` is safe to retry with an idempotency key."""

    reason = "DEADLINE_EXCEEDED"


class UnauthenticatedError(FencingError):
    """The call carried no valid credentials."""

    reason = "UNAUTHENTICATED"


class PermissionDeniedError(FencingError):
    """The caller is authenticated but not allowed this action on this resource."""

    reason = "PERMISSION_DENIED"


class NotFoundError(FencingError, LookupError):
    """The object the call names does not exist (a job id unknown to the queue, or of
    another queue than the one named); nothing was done."""

    reason = "NOT_FOUND"


class ResourceExhaustedError(FencingError):
    """The caller hit a per-client cap (``limit`` names it: ``waiters``, ``watch_streams``),
    or sent a message larger than the server accepts. Nothing was done; retry after some
    of the caller's own calls have finished."""

    reason = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str = "", *, limit: str = "") -> None:
        super().__init__(message or f"limit {limit or 'unknown'} reached")
        self.limit = limit

    def metadata(self) -> dict[str, str]:
        return {"limit": self.limit}

    @classmethod
    def from_metadata(cls, message: str, metadata: dict[str, str]) -> ResourceExhaustedError:
        return cls(message, limit=metadata.get("limit", ""))


__all__ = [
    "AcquireTimeoutError",
    "BackendUnavailableError",
    "DeadlineExceededError",
    "FencingError",
    "InvalidArgumentError",
    "LeaseHeldError",
    "LeaseLost",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "StaleTokenError",
    "UnauthenticatedError",
]
