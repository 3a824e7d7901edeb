"""PostgreSQL lease backend: many lease-server processes, one database (``postgres://``).

Each operation is one statement, and so one short transaction, calling a function
installed by :mod:`fencing.migrations` (``0001_leases.sql``, where the SQL and its
reasoning live): ``lease_acquire`` raises the resource's counter with
``INSERT ... ON CONFLICT DO UPDATE ... WHERE free or expired RETURNING`` and the
token reaches the caller only after that commit (G1; counters are never deleted,
no sequence is involved). Expiry is decided by the database's clock alone, read
with ``clock_timestamp()`` under the row lock (G7), so any number of servers on
any hosts agree (G2). URL parameters (``schema``, ``timeout``, ``pool_max``) are
described in :mod:`fencing.pg`; every call is bounded by ``timeout`` and fails
with ``BackendUnavailableError`` when the database is unreachable.

Wake-ups: a release runs ``pg_notify('fencing_released:<schema>', resource)`` in
its transaction. One dedicated autocommit connection per backend, outside the
pool, LISTENs on that channel and calls the ``on_release`` callbacks on the event
loop, so a waiter held in one server process is woken by a release through
another. Notifications sent while that connection is down are lost: it
reconnects with backoff, and meanwhile waiters fall back to their periodic
re-check (at least every 100 ms, see :mod:`lease_server.waiters`), so a lost
notification costs latency, never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import psycopg
from psycopg import sql

from fencing.errors import FencingError, LeaseLost
from fencing.pg import DEFAULT_SCHEMA, PgConfig, PostgresDatabase, migrate
from lease_server.leases import Grant, Held, LeaseInfo

log = logging.getLogger(__name__)

#: A quiet LISTEN connection is pinged this often (seconds), to notice a dead one.
LISTEN_PING_S = 10.0
_RECONNECT_DELAYS = (0.1, 0.2, 0.5, 1.0, 2.0)


class PostgresBackend:
    """Lease state in one schema of a PostgreSQL database, shared by any number of servers.

    ``PostgresBackend("postgresql://user@host/db?schema=fencing")``; an explicit
    ``schema`` argument wins over the URL's. :meth:`open` migrates the schema.
    """

    name = "postgres"

    def __init__(self, url: str, schema: str | None = None) -> None:
        self._db = PostgresDatabase(PgConfig.from_url(url, schema), "fencing-lease-server")
        q = self._db.qualified
        self._acquire_sql = q("SELECT * FROM {schema}.lease_acquire(%s, %s, %s, %s)")
        self._renew_sql = q("SELECT {schema}.lease_renew(%s, %s, %s, %s)")
        self._release_sql = q("SELECT {schema}.lease_release(%s, %s, %s)")
        self._describe_sql = q("SELECT * FROM {schema}.lease_describe(%s)")
        self._channel_sql = q("SELECT {schema}.lease_channel()")
        self._callbacks: list[Callable[[str], None]] = []
        self._listener: asyncio.Task[None] | None = None
        self._opened = False

    @property
    def schema(self) -> str:
        return self._db.config.schema

    async def open(self) -> None:
        await self._db.open()
        self._opened = True
        if self._callbacks:
            self._start_listener()

    async def close(self) -> None:
        self._opened = False
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        await self._db.close()

    async def healthy(self) -> bool:
        """PostgreSQL answers ``SELECT 1`` (see ``fencing._storage.HealthProbe``)."""
        return await self._db.healthy()

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, request_id: str
    ) -> Grant | Held:
        row = await self._db.fetchone(self._acquire_sql, (resource, holder, ttl_ms, request_id))
        assert row is not None  # lease_acquire always returns one row
        granted, replayed, current_holder, token, ms = row
        if granted:
            return Grant(resource, current_holder, token, ms, replayed)
        return Held(resource, current_holder, token, max(0, ms))

    async def renew(self, resource: str, token: int, holder: str, ttl_ms: int) -> Grant:
        row = await self._db.fetchone(self._renew_sql, (resource, token, holder, ttl_ms))
        if row is None or row[0] is None:
            raise LeaseLost(resource=resource, token=token)
        return Grant(resource, row[0], token, ttl_ms)

    async def release(self, resource: str, token: int, holder: str) -> None:
        row = await self._db.fetchone(self._release_sql, (resource, token, holder))
        if row is None or not row[0]:
            raise LeaseLost(resource=resource, token=token)

    async def describe(self, resource: str) -> LeaseInfo:
        row = await self._db.fetchone(self._describe_sql, (resource,))
        assert row is not None  # lease_describe always returns one row
        held, holder, token, remaining_ms, last_token = row
        return LeaseInfo(resource, held, holder, token, remaining_ms, last_token)

    # -- wake-ups from other processes --------------------------------------------------------

    def on_release(self, callback: Callable[[str], None]) -> None:
        self._callbacks.append(callback)
        if self._opened:
            self._start_listener()

    def _start_listener(self) -> None:
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(
                self._listen_forever(), name=f"fencing-listen-{self.schema}"
            )

    def _dispatch(self, resource: str) -> None:
        for callback in self._callbacks:
            try:
                callback(resource)
            except Exception:
                log.exception("on_release callback failed for %s", resource)

    async def _listen_forever(self) -> None:
        failures = 0
        while True:
            try:
                conn = await self._db.connect()
                async with conn:
                    cur = await conn.execute(self._channel_sql)
                    row = await cur.fetchone()
                    assert row is not None
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(row[0])))
                    log.info("listening for releases on %s", row[0])
                    failures = 0
                    while True:
                        async for note in conn.notifies(timeout=LISTEN_PING_S):
                            self._dispatch(note.payload)
                        # Quiet for a while: prove the connection still works.
                        async with asyncio.timeout(self._db.config.timeout):
                            await conn.execute("SELECT 1")
            except (psycopg.Error, FencingError, TimeoutError) as exc:
                log.warning(
                    "release listener on schema %s lost (%s); waiters poll until it is back",
                    self.schema,
                    exc,
                )
            await asyncio.sleep(_RECONNECT_DELAYS[min(failures, len(_RECONNECT_DELAYS) - 1)])
            failures += 1


__all__ = ["DEFAULT_SCHEMA", "PostgresBackend", "migrate"]
