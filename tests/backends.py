"""The implementations every contract suite runs against, one factory each.

A factory is an async context manager yielding a fresh, opened, isolated instance
and a ``Clock`` to move its time: embedded backends take a manual clock, servers
with their own clock (PostgreSQL, Redis) are moved by really sleeping. To run the
suites on a new implementation, add a factory here: nothing else changes.
Tests that get a ``postgres`` instance are marked ``postgres`` (tests/conftest.py);
each gets its own schema, dropped afterwards (tests/pg.py).
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
from guard.stores.redis import RedisStore
from guard.stores.sqlite import SQLiteStore
from lease_server.backends.base import LeaseBackend
from lease_server.backends.memory import MemoryBackend
from lease_server.backends.redis import RedisBackend
from lease_server.backends.sqlite import SQLiteBackend
from lease_server.clock import ManualClock
from lease_server.queue.backends.base import QueueBackend
from lease_server.queue.backends.memory import MemoryQueue
from lease_server.queue.backends.sqlite import SQLiteQueue
from tests import redis_server


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


def _real_time(ms: int) -> None:
    """Servers with their own clock cannot be moved: ``TimeControl.sleep`` really sleeps."""


@asynccontextmanager
async def postgres_backend() -> AsyncIterator[tuple[LeaseBackend, TimeControl]]:
    from lease_server.backends.postgres import PostgresBackend
    from tests import pg

    async with pg.fresh_schema() as (dsn, schema):
        backend = PostgresBackend(dsn, schema)
        await backend.open()
        try:
            yield backend, TimeControl(_real_time, manual=False)
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


@asynccontextmanager
async def postgres_store() -> AsyncIterator[GuardStore]:
    from guard.stores.postgres import PostgresStore
    from tests import pg

    async with pg.fresh_schema() as (dsn, schema):
        store = PostgresStore(dsn, schema)
        await store.open()
        try:
            yield store
        finally:
            await store.close()


@asynccontextmanager
async def redis_backend_at(
    url: str, *, clock_floor: bool = True
) -> AsyncIterator[tuple[LeaseBackend, TimeControl]]:
    # A private key prefix per instance; the clock floor on, as it ships (tokens are
    # sparse on Redis: the contract only asks that they grow).
    prefix = redis_server.unique_prefix()
    backend = RedisBackend(url, prefix=prefix, clock_floor=clock_floor)
    await backend.open()
    try:
        yield backend, TimeControl(_real_time, manual=False)
    finally:
        await backend.close()
        await redis_server.drop_prefix(url, prefix)


@asynccontextmanager
async def _redis_store(url: str) -> AsyncIterator[GuardStore]:
    prefix = redis_server.unique_prefix()
    store = RedisStore(url, prefix=prefix)
    await store.open()
    try:
        yield store
    finally:
        await store.close()
        await redis_server.drop_prefix(url, prefix)


@asynccontextmanager
async def mysql_store() -> AsyncIterator[GuardStore]:
    from tests import mysql

    async with mysql.fresh_store() as store:
        yield store


def redis_backend() -> AbstractAsyncContextManager[tuple[LeaseBackend, TimeControl]]:
    return redis_backend_at(redis_server.SERVERS.standalone_url())


def redis_cluster_backend() -> AbstractAsyncContextManager[tuple[LeaseBackend, TimeControl]]:
    return redis_backend_at(redis_server.SERVERS.cluster_url())


def redis_store() -> AbstractAsyncContextManager[GuardStore]:
    return _redis_store(redis_server.SERVERS.standalone_url())


def redis_cluster_store() -> AbstractAsyncContextManager[GuardStore]:
    return _redis_store(redis_server.SERVERS.cluster_url())


@asynccontextmanager
async def postgres_queue() -> AsyncIterator[tuple[QueueBackend, TimeControl]]:
    from lease_server.queue.backends.postgres import PostgresQueue
    from tests import pg

    async with pg.fresh_schema() as (dsn, schema):
        queue = PostgresQueue(dsn, schema)
        await queue.open()
        try:
            yield queue, TimeControl(_real_time, manual=False)
        finally:
            await queue.close()


BackendFactory = Callable[[], AbstractAsyncContextManager[tuple[LeaseBackend, TimeControl]]]
StoreFactory = Callable[[], AbstractAsyncContextManager[GuardStore]]
QueueFactory = Callable[[], AbstractAsyncContextManager[tuple[QueueBackend, TimeControl]]]

LEASE_BACKENDS: dict[str, BackendFactory] = {
    "memory": memory_backend,
    "sqlite": sqlite_backend,
    "postgres": postgres_backend,
    "redis": redis_backend,
    "redis-cluster": redis_cluster_backend,
}

GUARD_STORES: dict[str, StoreFactory] = {
    "memory": memory_store,
    "sqlite": sqlite_store,
    "postgres": postgres_store,
    "redis": redis_store,
    "redis-cluster": redis_cluster_store,
    "mysql": mysql_store,
}

#: Registry name -> pytest marker name, added to every test parametrized with it.
MARKS: dict[str, str] = {
    "mysql": "mysql",
    "postgres": "postgres",
    "redis": "redis",
    "redis-cluster": "redis",
}

QUEUE_BACKENDS: dict[str, QueueFactory] = {
    "memory": memory_queue,
    "sqlite": sqlite_queue,
    "postgres": postgres_queue,
}


# -- a queue and a lease backend sharing one event log (job events) ---------------------------

#: What a job-log factory yields: the queue, the lease backend whose log it appends to, and
#: the clock of both.
JobLog = tuple[QueueBackend, LeaseBackend, TimeControl]


@asynccontextmanager
async def memory_job_log() -> AsyncIterator[JobLog]:
    clock = ManualClock()
    backend = MemoryBackend(clock)
    queue = MemoryQueue(clock)
    assert queue.log_events_to(backend)
    yield queue, backend, TimeControl(clock.advance, manual=True)


@asynccontextmanager
async def sqlite_job_log() -> AsyncIterator[JobLog]:
    """Two files, as the lease server keeps them: leases.db and leases-queue.db."""
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as tmp:
        backend = SQLiteBackend(Path(tmp) / "leases.db", clock)
        queue = SQLiteQueue(Path(tmp) / "leases-queue.db", clock)
        assert queue.log_events_to(backend)
        await backend.open()
        await queue.open()
        try:
            yield queue, backend, TimeControl(clock.advance, manual=True)
        finally:
            await queue.close()
            await backend.close()


@asynccontextmanager
async def postgres_job_log() -> AsyncIterator[JobLog]:
    """One schema, as the lease server keeps it."""
    from lease_server.backends.postgres import PostgresBackend
    from lease_server.queue.backends.postgres import PostgresQueue
    from tests import pg

    async with pg.fresh_schema() as (dsn, schema):
        backend = PostgresBackend(dsn, schema)
        queue = PostgresQueue(dsn, schema)
        assert queue.log_events_to(backend)
        await backend.open()
        await queue.open()
        try:
            yield queue, backend, TimeControl(_real_time, manual=False)
        finally:
            await queue.close()
            await backend.close()


JobLogFactory = Callable[[], AbstractAsyncContextManager[JobLog]]

#: Every queue backend that appends its job events to a lease backend's log. Redis keeps
#: no jobs (a lease server on Redis hosts a queue only on a named SQLite or PostgreSQL
#: URL), so no queue can share a Redis log in one transaction.
JOB_LOGS: dict[str, JobLogFactory] = {
    "memory": memory_job_log,
    "sqlite": sqlite_job_log,
    "postgres": postgres_job_log,
}
