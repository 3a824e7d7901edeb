"""The implementations every contract suite runs against, one factory each.

A factory is an async context manager yielding a fresh, opened, isolated instance
and a ``Clock`` to move its time: embedded backends take a manual clock, servers
with their own clock (PostgreSQL, Redis) are moved by really sleeping. To run the
suites on a new implementation, add a factory here: nothing else changes.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from guard.stores.base import GuardStore
from guard.stores.memory import MemoryStore
from guard.stores.sqlite import SQLiteStore
from lease_server.backends.base import LeaseBackend
from lease_server.backends.memory import MemoryBackend
from lease_server.backends.sqlite import SQLiteBackend
from lease_server.clock import ManualClock
from lease_server.queues.base import QueueBackend
from lease_server.queues.memory import MemoryQueue
from lease_server.queues.sqlite import SQLiteQueue


@dataclass
class TimeControl:
    """Moves a backend's notion of time forward by ``ms``."""

    advance: Callable[[int], object]
    manual: bool

    async def sleep(self, ms: int) -> None:
        if self.manual:
            self.advance(ms)
        else:
            await asyncio.sleep(ms / 1000 + 0.02)


@asynccontextmanager
async def memory_backend() -> AsyncIterator[tuple[LeaseBackend, TimeControl]]:
    clock = ManualClock()
    backend = MemoryBackend(clock)
    await backend.open()
    yield backend, TimeControl(clock.advance, manual=True)
    await backend.close()


@asynccontextmanager
async def sqlite_backend() -> AsyncIterator[tuple[LeaseBackend, TimeControl]]:
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as tmp:
        backend = SQLiteBackend(Path(tmp) / "leases.db", clock)
        await backend.open()
        try:
            yield backend, TimeControl(clock.advance, manual=True)
        finally:
            await backend.close()


@asynccontextmanager
async def memory_store() -> AsyncIterator[GuardStore]:
    store = MemoryStore()
    await store.open()
    yield store
    await store.close()


@asynccontextmanager
async def sqlite_store() -> AsyncIterator[GuardStore]:
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "guard.db")
        await store.open()
        try:
            yield store
        finally:
            await store.close()


@asynccontextmanager
async def memory_queue() -> AsyncIterator[tuple[QueueBackend, TimeControl]]:
    clock = ManualClock()
    queue = MemoryQueue(clock)
    await queue.open()
    yield queue, TimeControl(clock.advance, manual=True)
    await queue.close()


@asynccontextmanager
async def sqlite_queue() -> AsyncIterator[tuple[QueueBackend, TimeControl]]:
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as tmp:
        queue = SQLiteQueue(Path(tmp) / "queue.db", clock)
        await queue.open()
        try:
            yield queue, TimeControl(clock.advance, manual=True)
        finally:
            await queue.close()


BackendFactory = Callable[[], AbstractAsyncContextManager[tuple[LeaseBackend, TimeControl]]]
StoreFactory = Callable[[], AbstractAsyncContextManager[GuardStore]]
QueueFactory = Callable[[], AbstractAsyncContextManager[tuple[QueueBackend, TimeControl]]]

LEASE_BACKENDS: dict[str, BackendFactory] = {
    "memory": memory_backend,
    "sqlite": sqlite_backend,
}

GUARD_STORES: dict[str, StoreFactory] = {
    "memory": memory_store,
    "sqlite": sqlite_store,
}

QUEUE_BACKENDS: dict[str, QueueFactory] = {
    "memory": memory_queue,
    "sqlite": sqlite_queue,
}
