"""The fencing clients: :class:`LeaseClient`, :class:`GuardClient` and :class:`QueueClient`
(blocking) and their asyncio twins :class:`AsyncLeaseClient`, :class:`AsyncGuardClient`
and :class:`AsyncQueueClient`."""

from fencing.client._core import EventKind, LeaseEvent, WriteResult
from fencing.client._queue import (
    EnqueuedJob,
    FailOutcome,
    Job,
    JobAction,
    JobInfo,
    QueueStats,
    ScheduleInfo,
)
from fencing.client._writes import FenceReset, GuardInfo, ManyResult, Refusal
from fencing.client.async_guard import AsyncGuardClient
from fencing.client.async_lease import AsyncLease, AsyncLeaseClient, AsyncWatchStream
from fencing.client.async_queue import AsyncQueueClient
from fencing.client.async_write_stream import AsyncWriteStream
from fencing.client.guard import GuardClient
from fencing.client.lease import Lease, LeaseClient, WatchStream
from fencing.client.queue import QueueClient
from fencing.client.write_stream import WriteStream
from fencing.types import LeaseState

__all__ = [
    "AsyncGuardClient",
    "AsyncLease",
    "AsyncLeaseClient",
    "AsyncQueueClient",
    "AsyncWatchStream",
    "AsyncWriteStream",
    "EnqueuedJob",
    "EventKind",
    "FailOutcome",
    "FenceReset",
    "GuardClient",
    "GuardInfo",
    "Job",
    "JobAction",
    "JobInfo",
    "Lease",
    "LeaseClient",
    "LeaseEvent",
    "LeaseState",
    "ManyResult",
    "QueueClient",
    "QueueStats",
    "Refusal",
    "ScheduleInfo",
    "WatchStream",
    "WriteResult",
    "WriteStream",
]
