"""Queue workers: :class:`Worker` (threads) and :class:`AsyncWorker` (asyncio), twins on
one I/O-free core (:mod:`fencing.worker._core`).

A handler gets a claimed :class:`~fencing.client._queue.Job`; returning completes
it, raising fails it (:class:`Retry` picks the delay, :class:`Discard` ends it now).
"""

from fencing.worker._core import Discard, Retry
from fencing.worker.aio import AsyncHandler, AsyncWorker
from fencing.worker.sync import Handler, Worker

__all__ = ["AsyncHandler", "AsyncWorker", "Discard", "Handler", "Retry", "Worker"]
