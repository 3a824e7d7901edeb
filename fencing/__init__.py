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

Names are imported on first use: ``import fencing`` alone costs little, and a
program using only the blocking clients never loads asyncio or the twins.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fencing.async_election import (
        AsyncElection,
        AsyncLeadership,
    )
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
    from fencing.election import (
        Election,
        Leader,
        Leadership,
    )
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
    from fencing.tls import (
        TLSConfig,
    )
    from fencing.types import (
        Claim,
        Delete,
        Fenced,
        Op,
        Put,
        Record,
    )

#: Each name this package exports and the module it comes from, imported on first use.
_LAZY = {
    "AsyncElection": "fencing.async_election",
    "AsyncLeadership": "fencing.async_election",
    "AsyncSemaphore": "fencing.async_semaphore",
    "Semaphore": "fencing.semaphore",
    "AsyncGuardClient": "fencing.client",
    "AsyncLease": "fencing.client",
    "AsyncLeaseClient": "fencing.client",
    "AsyncQueueClient": "fencing.client",
    "GuardClient": "fencing.client",
    "Job": "fencing.client",
    "Lease": "fencing.client",
    "LeaseClient": "fencing.client",
    "LeaseEvent": "fencing.client",
    "LeaseState": "fencing.client",
    "QueueClient": "fencing.client",
    "WriteResult": "fencing.client",
    "Election": "fencing.election",
    "Leader": "fencing.election",
    "Leadership": "fencing.election",
    "AcquireTimeoutError": "fencing.errors",
    "BackendUnavailableError": "fencing.errors",
    "DeadlineExceededError": "fencing.errors",
    "FencingError": "fencing.errors",
    "InvalidArgumentError": "fencing.errors",
    "LeaseHeldError": "fencing.errors",
    "LeaseLost": "fencing.errors",
    "NotFoundError": "fencing.errors",
    "PermissionDeniedError": "fencing.errors",
    "ResourceExhaustedError": "fencing.errors",
    "StaleTokenError": "fencing.errors",
    "UnauthenticatedError": "fencing.errors",
    "TLSConfig": "fencing.tls",
    "Claim": "fencing.types",
    "Delete": "fencing.types",
    "Fenced": "fencing.types",
    "Op": "fencing.types",
    "Put": "fencing.types",
    "Record": "fencing.types",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from fencing._version import VERSION

        return VERSION
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # once: the next lookup is a plain attribute
        return value
    try:  # a submodule not imported yet (``fencing.errors`` after ``import fencing``)
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
