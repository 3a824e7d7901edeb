"""Fencing tokens for distributed ownership.

A lease server grants leases whose every grant carries a fencing token larger than
any before; a guard in front of the resource rejects writes with a stale token, so
a paused former owner that wakes up after a takeover changes nothing::

    from fencing import LeaseClient, GuardClient

    leases, guard = LeaseClient("127.0.0.1:50051"), GuardClient("127.0.0.1:50052")
    with leases.hold("orders", ttl=10) as lease:
        guard.put(lease, "last-order", b"42")

The asyncio twins (``AsyncLeaseClient``, ``AsyncGuardClient``) have the same methods,
and cancel the body of ``async with leases.hold(...)`` when the lease is lost.
Leader election fenced by its term: :class:`Election` / :class:`AsyncElection`; at most N
holders, each with its own token: :class:`Semaphore` / :class:`AsyncSemaphore`.
Errors: see :mod:`fencing.errors`.
"""

from fencing import _version
from fencing.async_election import AsyncElection, AsyncLeadership
from fencing.async_semaphore import AsyncSemaphore
from fencing.client import (
    AsyncGuardClient,
    AsyncLease,
    AsyncLeaseClient,
    AsyncQueueClient,
    GuardClient,
    Job,
    Lease,
    LeaseClient,
    LeaseEvent,
    LeaseState,
    QueueClient,
    WriteResult,
)
from fencing.election import Election, Leader, Leadership
from fencing.errors import (
    AcquireTimeoutError,
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
from fencing.semaphore import Semaphore
from fencing.tls import TLSConfig
from fencing.types import Claim, Delete, Fenced, Op, Put, Record

__version__ = _version.VERSION

__all__ = [
    "AcquireTimeoutError",
    "AsyncElection",
    "AsyncGuardClient",
    "AsyncLeadership",
    "AsyncLease",
    "AsyncLeaseClient",
    "AsyncQueueClient",
    "AsyncSemaphore",
    "BackendUnavailableError",
    "Claim",
    "DeadlineExceededError",
    "Delete",
    "Election",
    "Fenced",
    "FencingError",
    "GuardClient",
    "InvalidArgumentError",
    "Job",
    "Leader",
    "Leadership",
    "Lease",
    "LeaseClient",
    "LeaseEvent",
    "LeaseHeldError",
    "LeaseLost",
    "LeaseState",
    "NotFoundError",
    "Op",
    "PermissionDeniedError",
    "Put",
    "QueueClient",
    "Record",
    "ResourceExhaustedError",
    "Semaphore",
    "StaleTokenError",
    "TLSConfig",
    "UnauthenticatedError",
    "WriteResult",
]
