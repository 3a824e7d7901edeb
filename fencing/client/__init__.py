"""The fencing clients: :class:`LeaseClient`, :class:`GuardClient` and :class:`QueueClient`
(blocking), and :class:`AsyncQueueClient`."""

from fencing.client._core import LeaseState, WriteResult
from fencing.client._queue import EnqueuedJob, FailOutcome, Job, QueueStats
from fencing.client.async_queue import AsyncQueueClient
from fencing.client.guard import GuardClient
from fencing.client.lease import Lease, LeaseClient
from fencing.client.queue import QueueClient

__all__ = [
    "AsyncQueueClient",
    "EnqueuedJob",
    "FailOutcome",
    "GuardClient",
    "Job",
    "Lease",
    "LeaseClient",
    "LeaseState",
    "QueueClient",
    "QueueStats",
    "WriteResult",
]
