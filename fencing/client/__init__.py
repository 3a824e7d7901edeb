"""The fencing clients: :class:`LeaseClient`, :class:`GuardClient` and :class:`QueueClient`
(blocking) and their asyncio twins :class:`AsyncLeaseClient`, :class:`AsyncGuardClient`
and :class:`AsyncQueueClient`.

The clients are imported on first use (``from fencing.client import LeaseClient`` loads
the blocking lease client, not the asyncio twins).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fencing.client._core import (
        EventKind,
        LeaseEvent,
        WriteResult,
    )
    from fencing.client._queue import (
        EnqueuedJob,
        FailOutcome,
        Job,
        JobAction,
        JobAttempt,
        JobInfo,
        QueueStats,
        ScheduleInfo,
        new_job,
    )
    from fencing.client._writes import (
        FenceReset,
        GuardInfo,
        ManyResult,
        Refusal,
    )
    from fencing.client.async_guard import (
        AsyncGuardClient,
    )
    from fencing.client.async_lease import (
        AsyncLease,
        AsyncLeaseClient,
        AsyncWatchStream,
    )
    from fencing.client.async_queue import (
        AsyncQueueClient,
    )
    from fencing.client.async_write_stream import (
        AsyncWriteStream,
    )
    from fencing.client.guard import (
        GuardClient,
    )
    from fencing.client.lease import (
        Lease,
        LeaseClient,
        WatchStream,
    )
    from fencing.client.queue import (
        QueueClient,
    )
    from fencing.client.write_stream import (
        WriteStream,
    )
    from fencing.types import (
        LeaseState,
    )

#: Each name this package exports and the module it comes from, imported on first use.
_LAZY = {
    "EventKind": "fencing.client._core",
    "LeaseEvent": "fencing.client._core",
    "WriteResult": "fencing.client._core",
    "EnqueuedJob": "fencing.client._queue",
    "FailOutcome": "fencing.client._queue",
    "new_job": "fencing.client._queue",
    "Job": "fencing.client._queue",
    "JobAction": "fencing.client._queue",
    "JobAttempt": "fencing.client._queue",
    "JobInfo": "fencing.client._queue",
    "QueueStats": "fencing.client._queue",
    "ScheduleInfo": "fencing.client._queue",
    "FenceReset": "fencing.client._writes",
    "ManyResult": "fencing.client._writes",
    "GuardInfo": "fencing.client._writes",
    "Refusal": "fencing.client._writes",
    "AsyncGuardClient": "fencing.client.async_guard",
    "AsyncLease": "fencing.client.async_lease",
    "AsyncLeaseClient": "fencing.client.async_lease",
    "AsyncWatchStream": "fencing.client.async_lease",
    "AsyncQueueClient": "fencing.client.async_queue",
    "AsyncWriteStream": "fencing.client.async_write_stream",
    "GuardClient": "fencing.client.guard",
    "Lease": "fencing.client.lease",
    "LeaseClient": "fencing.client.lease",
    "WatchStream": "fencing.client.lease",
    "QueueClient": "fencing.client.queue",
    "WriteStream": "fencing.client.write_stream",
    "LeaseState": "fencing.types",
}


def __getattr__(name: str) -> Any:
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
    "JobAttempt",
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
    "new_job",
]
