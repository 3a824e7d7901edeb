"""The fencing clients: :class:`LeaseClient` and :class:`GuardClient` (blocking) and their
asyncio twins :class:`AsyncLeaseClient` and :class:`AsyncGuardClient`."""

from fencing.client._core import EventKind, LeaseEvent, LeaseState, WriteResult
from fencing.client.async_guard import AsyncGuardClient
from fencing.client.async_lease import AsyncLease, AsyncLeaseClient
from fencing.client.guard import GuardClient
from fencing.client.lease import Lease, LeaseClient

__all__ = [
    "AsyncGuardClient",
    "AsyncLease",
    "AsyncLeaseClient",
    "EventKind",
    "GuardClient",
    "Lease",
    "LeaseClient",
    "LeaseEvent",
    "LeaseState",
    "WriteResult",
]
