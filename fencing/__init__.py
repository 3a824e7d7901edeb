"""Fencing tokens for distributed ownership.

A lease server grants leases whose every grant carries a fencing token larger than
any before; a guard in front of the resource rejects writes with a stale token, so
a paused former owner that wakes up after a takeover changes nothing::

    from fencing import LeaseClient, GuardClient

    leases, guard = LeaseClient("127.0.0.1:50051"), GuardClient("127.0.0.1:50052")
    with leases.hold("orders", ttl=10) as lease:
        guard.put(lease, "last-order", b"42")

Errors: see :mod:`fencing.errors`.
"""

from fencing.client import (
    AsyncQueueClient,
    GuardClient,
    Job,
    Lease,
    LeaseClient,
    LeaseState,
    QueueClient,
    WriteResult,
)
from fencing.errors import (
    AcquireTimeoutError,
    BackendUnavailableError,
    DeadlineExceededError,
    FencingError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLost,
    PermissionDeniedError,
    StaleTokenError,
    UnauthenticatedError,
)
from fencing.types import Claim, Delete, Fenced, Op, Put, Record

__version__ = "0.1.0"

__all__ = [
    "AcquireTimeoutError",
    "AsyncQueueClient",
    "BackendUnavailableError",
    "Claim",
    "DeadlineExceededError",
    "Delete",
    "Fenced",
    "FencingError",
    "GuardClient",
    "InvalidArgumentError",
    "Job",
    "Lease",
    "LeaseClient",
    "LeaseHeldError",
    "LeaseLost",
    "LeaseState",
    "Op",
    "PermissionDeniedError",
    "Put",
    "QueueClient",
    "Record",
    "StaleTokenError",
    "UnauthenticatedError",
    "WriteResult",
]
