"""PostgreSQL for the lease backend and the guard store: URLs, migrations, the pooled seam.

Both live in one PostgreSQL *schema* (default ``fencing``), created and upgraded
by the versioned SQL files in :mod:`serving.migrations`; :func:`migrate` applies
them (``fencing migrate`` calls it; servers call it on open). Sharing a schema is
what lets a guard in ``strict`` mode check the live lease in its write's own
transaction, and lets your own transactions fence themselves::

    BEGIN;
    SELECT fencing.check_and_advance('orders', 42);  -- SQLSTATE FN001 if 42 is stale
    INSERT INTO orders ...;
    COMMIT;

URLs are libpq URLs plus parameters of ours, removed before connecting::

    postgresql://user:pass@host:5432/db?schema=fencing&timeout=2&pool_max=8&token_floor=off

``token_floor=clock`` makes every grant in this server's sessions take the clock floor
(``0010_token_floor.sql``, :mod:`lease_server.backends.postgres`); the default ``off``
keeps tokens 1, 2, 3.

``timeout`` (seconds) bounds every backend call: the wait for a pooled connection,
the statement on the server (``statement_timeout``) and the call as a whole, so a
request never hangs on a database that is down; the call fails with
:class:`~fencing.errors.BackendUnavailableError` instead. Connections are checked
when taken from the pool without a round trip (:func:`quiet_check`), so those the
server closed (a restart) are replaced before the call is sent, and sessions
force ``synchronous_commit = on``: a token or fence is acknowledged only once its
commit is durable.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
import select
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, LiteralString
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from fencing.errors import BackendUnavailableError, FencingError, InvalidArgumentError
from fencing.pg import (
    DEFAULT_SCHEMA,
    LEASE_HELD_SQLSTATE,
    LEASE_NOT_LIVE_SQLSTATE,
    STALE_TOKEN_SQLSTATE,
    fencing_error,
)
from serving import urls
from serving.exits import StartupError

log = logging.getLogger(__name__)

#: Seconds any one backend call may take, all included (URL parameter ``timeout``).
DEFAULT_TIMEOUT_S = 2.0
#: Largest number of pooled connections per process (URL parameter ``pool_max``).
DEFAULT_POOL_MAX = 8

_OUR_PARAMS = ("schema", "timeout", "pool_max", "token_floor")


#: A quiet LISTEN connection is pinged this often (seconds), to notice a dead one.
LISTEN_PING_S = 10.0
#: Waits before each reconnect of a lost LISTEN connection (seconds), the last repeated.
RECONNECT_DELAYS = (0.1, 0.2, 0.5, 1.0, 2.0)


@functools.cache
def _libpq_params() -> frozenset[str]:
    """The connection parameters this libpq knows (a URL's other query parameters)."""
    return frozenset(d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults())


#: ``?token_floor=`` values; the session setting ``fencing.token_floor`` the SQL reads.
TOKEN_FLOORS = ("off", "clock")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")
_MIGRATION_FILE = re.compile(r"(\d{4})_(\w+)\.sql")
#: Advisory lock key (with the schema's hash) that serialises concurrent migrators.
_MIGRATE_LOCK = 0x66656E63  # "fenc"


def check_schema_name(name: str) -> str:
    """A schema name we accept: lower-case letters, digits and ``_``, at most 40 characters.

    (The NOTIFY channel, ``fencing_released:<schema>``, must fit PostgreSQL's 63 bytes.)
    """
    if not _SCHEMA_NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"schema name {name!r} must match [a-z_][a-z0-9_]* and be at most 40 characters",
            field="schema",
        )
    return name


@dataclass(frozen=True, slots=True)
class PgConfig:
    """Where and how to connect: a libpq conninfo without our parameters, and ours."""

    conninfo: str
    schema: str = DEFAULT_SCHEMA
    timeout: float = DEFAULT_TIMEOUT_S
    pool_max: int = DEFAULT_POOL_MAX
    token_floor: str = "off"

    @classmethod
    def from_url(cls, url: str, schema: str | None = None) -> PgConfig:
        """Parse ``postgres://``/``postgresql://`` URLs (or a ``key=value`` conninfo).

        An explicit ``schema`` argument wins over the URL's ``?schema=``.
        """
        params: dict[str, str] = {}
        conninfo = url
        parts = urlsplit(url)
        if urls.SCHEMES.get(parts.scheme) == urls.POSTGRES:
            params, theirs = urls.split_params(
                url,
                _OUR_PARAMS,
                driver=_libpq_params(),
                driver_hint="a libpq connection parameter (sslmode, connect_timeout, "
                "application_name, ...)",
                what="postgres",
                field="url",
            )
            # quote, not quote_plus: libpq decodes %20 in a URL, but keeps '+' as is.
            rest = urlencode(theirs, quote_via=quote)
            conninfo = urlunsplit(parts._replace(query=rest))
        try:
            timeout = float(params.get("timeout", DEFAULT_TIMEOUT_S))
            pool_max = int(params.get("pool_max", DEFAULT_POOL_MAX))
        except ValueError:
            timeout = pool_max = 0
        if not (0 < timeout < math.inf and pool_max >= 1):
            raise InvalidArgumentError(
                "a postgres URL's timeout must be positive seconds and pool_max >= 1",
                field="url",
            )
        token_floor = params.get("token_floor", "off").lower() or "off"
        if token_floor not in TOKEN_FLOORS:
            raise InvalidArgumentError(
                f"a postgres URL's token_floor must be one of {', '.join(TOKEN_FLOORS)}, "
                f"not {params['token_floor']!r}",
                field="token_floor",
            )
        return cls(
            conninfo=conninfo,
            schema=check_schema_name(schema or params.get("schema") or DEFAULT_SCHEMA),
            timeout=timeout,
            pool_max=pool_max,
            token_floor=token_floor,
        )

    def connect_kwargs(self, application_name: str) -> dict[str, Any]:
        """libpq settings we default (the URL's own settings win) for prompt failure detection."""
        given = conninfo_to_dict(self.conninfo)
        defaults: dict[str, Any] = {
            "application_name": application_name,
            "connect_timeout": max(2, math.ceil(self.timeout)),  # libpq's minimum is 2 s
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 3,
            "tcp_user_timeout": 5000,
        }
        return {k: v for k, v in defaults.items() if k not in given}


# -- migrations -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped in :mod:`serving.migrations`, in version order."""
    found = []
    for entry in resources.files("serving.migrations").iterdir():
        match = _MIGRATION_FILE.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return ordered(found)


def ordered(found: list[Migration]) -> tuple[Migration, ...]:
    """``found`` in version order. Versions must be positive and unique, but need not be
    contiguous: branches reserve numbers, and a gap left by a migration that has not
    landed yet (or never will) is fine; it is applied whenever it arrives."""
    found = sorted(found, key=lambda m: m.version)
    versions = [m.version for m in found]
    if any(v < 1 for v in versions) or len(set(versions)) != len(versions):
        raise RuntimeError(f"migration versions must be positive and unique: {versions}")
    return tuple(found)


async def _applied_versions(conn: psycopg.AsyncConnection[TupleRow], schema: str) -> set[int]:
    """Versions recorded in ``<schema>.schema_migrations`` (empty if there is no such table)."""
    table = sql.SQL("{}.schema_migrations").format(sql.Identifier(schema)).as_string(conn)
    cur = await conn.execute("SELECT to_regclass(%s)", (table,))
    row = await cur.fetchone()
    if row is None or row[0] is None:
        return set()
    cur = await conn.execute(
        sql.SQL("SELECT version FROM {}.schema_migrations").format(sql.Identifier(schema))
    )
    return {int(r[0]) for r in await cur.fetchall()}


async def _apply_migrations(
    conn: psycopg.AsyncConnection[TupleRow],
    schema: str,
    available: Sequence[Migration] | None = None,
) -> list[int]:
    """Apply the ``available`` migrations (default: :func:`migrations`) missing in ``schema``."""
    ident = sql.Identifier(schema)
    available = migrations() if available is None else ordered(list(available))
    # Up to date: no DDL, no lock, so servers may run as a role that cannot create schemas
    # once an owner has run `fencing migrate`.
    if {m.version for m in available} <= await _applied_versions(conn, schema):
        return []
    async with conn.transaction():
        # Two servers starting at once: the second waits here, then finds nothing to do.
        await conn.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_MIGRATE_LOCK, schema)
        )
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        await conn.execute(sql.SQL("SET LOCAL search_path TO {}, pg_temp").format(ident))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY,"
            " name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = await _applied_versions(conn, schema)
        applied = []
        # Every missing version, in version order, even below one already applied (a
        # migration numbered into a gap that landed later than a higher one).
        for migration in available:
            if migration.version in done:
                continue
            # A whole file, several statements, no parameters: the simple query protocol.
            await conn.execute(migration.sql.encode("utf-8"))
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration.version)
        unknown = sorted(done - {m.version for m in available})
        if unknown:
            log.info("schema %s has migrations this code does not know: %s", schema, unknown)
    return applied


async def migrate(dsn: str, schema: str | None = None) -> list[int]:
    """Create or upgrade the fencing schema at ``dsn``; return the versions applied now.

    Idempotent and safe to run from several processes at once (an advisory lock
    serialises them). ``schema`` defaults to the URL's ``?schema=`` or ``fencing``.
    All pending migrations apply in one transaction: all or none.
    """
    config = PgConfig.from_url(dsn, schema)
    try:
        conn = await psycopg.AsyncConnection.connect(
            config.conninfo, autocommit=True, **config.connect_kwargs("fencing-migrate")
        )
        async with conn:
            applied = await _apply_migrations(conn, config.schema)
    except _OUTAGES as exc:
        raise BackendUnavailableError(f"cannot migrate schema {config.schema!r}: {exc}") from exc
    except psycopg.Error as exc:
        # Reached, but refused: a role that may not create objects, a schema someone
        # else changed. Starting on a half-made schema would fail later and obscurely.
        raise StartupError(
            "MIGRATION_FAILED",
            f"migrating schema {config.schema!r} failed: {exc}",
            "",
            "run `fencing migrate URL` as a role that may create objects in the database "
            "(the schema owner), then start the server again",
        ) from exc
    if applied:
        log.info("schema %s migrated: applied %s", config.schema, applied)
    return applied


# -- errors -----------------------------------------------------------------------------------


#: Failures that mean "PostgreSQL cannot answer now" (down, restarting, overloaded,
#: read-only after a failover, a timeout, a deadlock victim): safe to retry.
_OUTAGES = (
    psycopg.OperationalError,  # also PoolTimeout, QueryCanceled, AdminShutdown, deadlocks
    psycopg.InterfaceError,
    psycopg.errors.ReadOnlySqlTransaction,
    TimeoutError,
)


def driver_error(exc: BaseException, what: str) -> FencingError | None:
    """What a driver failure becomes at the seam, or None for a fault to fix.

    Our SQLSTATEs become :class:`StaleTokenError` (``FN003``, a held lease, stays itself
    for the lease backend to read); outages (see ``_OUTAGES``) become
    :class:`BackendUnavailableError`; anything else (a missing function, bad data: a
    bug, not an outage) returns None and propagates unchanged.
    """
    mapped = fencing_error(exc)
    if mapped is not None:
        return mapped
    if getattr(exc, "sqlstate", None) == LEASE_HELD_SQLSTATE:
        return None  # an answer, not an outage: the lease backend reads it (AcquireMany)
    if isinstance(exc, TimeoutError):
        return BackendUnavailableError(f"{what}: no answer from PostgreSQL in time")
    if isinstance(exc, _OUTAGES):
        return BackendUnavailableError(f"{what}: {type(exc).__name__}: {exc}".rstrip(": "))
    return None


# -- the pooled seam --------------------------------------------------------------------------


async def quiet_check(conn: psycopg.AsyncConnection[Any]) -> None:
    """The pool's check on checkout, with no round trip: raise if ``conn`` is closed.

    An idle pooled connection has nothing to read unless the server closed it (a
    restart or ``pg_terminate_backend`` sends FATAL, then EOF). So only a readable
    socket is looked at, and then only what already arrived is read. Nothing has been
    sent, so replacing the connection (the pool takes another) can never run a
    statement twice.
    """
    pgconn = conn.pgconn
    if pgconn.status != psycopg.pq.ConnStatus.OK:
        raise psycopg.OperationalError("the connection is closed")
    # The FATAL message and the EOF can take a read each; a few reads settle it.
    for _ in range(4):
        readable, _, _ = select.select([pgconn.socket], [], [], 0)
        if not readable:
            break
        pgconn.consume_input()  # raises OperationalError at EOF
    if pgconn.status != psycopg.pq.ConnStatus.OK:
        raise psycopg.OperationalError("the server closed the connection")
    while pgconn.notifies() is not None:  # pooled sessions LISTEN to nothing; drop strays
        pass


class PostgresDatabase:
    """A connection pool on one schema, migrated on open; every call bounded and wrapped.

    Driver failures are translated here, once, with the cause chained (see
    :func:`driver_error`): outages become :class:`BackendUnavailableError`,
    SQLSTATEs ``FN001``/``FN002`` become ``StaleTokenError``.
    """

    def __init__(self, config: PgConfig, application_name: str) -> None:
        self.config = config
        self.application_name = application_name
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]] | None = None

    @property
    def schema(self) -> sql.Identifier:
        return sql.Identifier(self.config.schema)

    def qualified(self, template: LiteralString) -> sql.Composed:
        """``template`` with ``{schema}`` replaced by the quoted schema name."""
        return sql.SQL(template).format(schema=self.schema)

    async def open(self) -> None:
        """Migrate the schema and fill the pool. Idempotent."""
        if self._pool is not None:
            return
        await migrate(self.config.conninfo, self.config.schema)
        pool: AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]] = AsyncConnectionPool(
            make_conninfo(
                self.config.conninfo, **self.config.connect_kwargs(self.application_name)
            ),
            min_size=1,
            max_size=self.config.pool_max,
            open=False,
            kwargs={"autocommit": True},
            configure=self._configure,
            # No check here: the pool's own loop backs off a second and more after each
            # failed check, so a pool of connections a restart closed would time calls
            # out. connection() checks with quiet_check instead, and retries at once.
            timeout=self.config.timeout,
            # Give up a reconnection chain soon, so the first request after an outage
            # starts a fresh attempt at once instead of waiting out a long backoff.
            reconnect_timeout=5.0,
            name=f"{self.application_name}:{self.config.schema}",
        )
        try:
            await pool.open(wait=True, timeout=self.config.timeout)
        except BaseException as exc:
            await pool.close()
            error = driver_error(exc, f"cannot connect to PostgreSQL ({self.application_name})")
            if error is None:
                raise
            raise error from exc
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _configure(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        ms = str(round(self.config.timeout * 1000))
        await conn.execute(
            "SELECT set_config('statement_timeout', %s, false),"
            " set_config('idle_in_transaction_session_timeout', %s, false),"
            " set_config('synchronous_commit', 'on', false),"
            " set_config('fencing.token_floor', %s, false)",
            (ms, ms, self.config.token_floor),
        )

    async def connect(self) -> psycopg.AsyncConnection[TupleRow]:
        """A new autocommit connection outside the pool (for LISTEN), bounded by the timeout."""
        try:
            async with asyncio.timeout(self.config.timeout + 2):
                return await psycopg.AsyncConnection.connect(
                    self.config.conninfo,
                    autocommit=True,
                    **self.config.connect_kwargs(self.application_name),
                )
        except _OUTAGES as exc:
            raise BackendUnavailableError(f"cannot connect to PostgreSQL: {exc}") from exc

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
        """A pooled autocommit connection for one bounded call; errors wrapped once."""
        pool = self._pool
        if pool is None:
            raise BackendUnavailableError(f"{self.application_name}: database is closed")
        try:
            async with asyncio.timeout(self.config.timeout):
                conn = await self._checkout(pool)
                try:
                    yield conn
                finally:
                    await pool.putconn(conn)
        except (psycopg.Error, TimeoutError) as exc:
            error = driver_error(exc, f"{self.application_name} on PostgreSQL")
            if error is None:
                raise
            if isinstance(error, BackendUnavailableError):
                # Every call of an outage fails so: the health probe's "backend down"
                # is the line an operator reads, once.
                log.debug("%s", error)
            raise error from exc

    async def _checkout(
        self, pool: AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]]
    ) -> psycopg.AsyncConnection[TupleRow]:
        """A pooled connection not known to be closed, with no round trip spent on it.

        A connection the server already closed (a restart, ``pg_terminate_backend``) has
        its FATAL and EOF waiting on the socket: :func:`quiet_check` reads them, and the
        connection goes back to the pool, which drops it and opens another, while this
        call takes the next one at once. Nothing was sent on it, so nothing can run
        twice. One that died silently (no FIN reached us) fails the call it is used for
        and is dropped when it comes back broken; that call is not retried, since its
        statement may have run.
        """
        for _ in range(self.config.pool_max):
            conn = await pool.getconn()
            try:
                await quiet_check(conn)
            except psycopg.OperationalError as exc:
                log.info("%s: replacing a pooled connection the server closed (%s)", pool.name, exc)
                await pool.putconn(conn)
                continue
            except BaseException:
                await pool.putconn(conn)
                raise
            return conn
        return await pool.getconn()  # every one was closed: a fresh one, as it comes

    async def fetchone(
        self, query: sql.Composed, params: Sequence[object] = ()
    ) -> tuple[Any, ...] | None:
        """Run one statement (its own transaction) and return its first row."""
        async with self.connection() as conn:
            cur = await conn.execute(query, params)
            return await cur.fetchone()

    async def healthy(self) -> bool:
        """True if a pooled connection answers ``SELECT 1`` (the server's health probe)."""
        try:
            await self.fetchone(self.qualified("SELECT 1"))
        except FencingError:
            return False
        return True

    async def fetchall(
        self, query: sql.Composed, params: Sequence[object] = ()
    ) -> list[tuple[Any, ...]]:
        """Run one statement (its own transaction) and return every row."""
        async with self.connection() as conn:
            cur = await conn.execute(query, params)
            return await cur.fetchall()

    async def execute(self, query: sql.Composed, params: Sequence[object] = ()) -> int:
        """Run one statement (its own transaction) and return its row count."""
        async with self.connection() as conn:
            cur = await conn.execute(query, params)
            return cur.rowcount


#: A LISTEN connection's channels, read once it is open (from the schema's own SQL).
Channels = Callable[[psycopg.AsyncConnection[TupleRow]], Awaitable[Sequence[str]]]


async def listen_forever(
    db: PostgresDatabase,
    channels: Channels,
    on_note: Callable[[str, str], None],
    *,
    on_listening: Callable[[psycopg.AsyncConnection[TupleRow]], Awaitable[None]] | None = None,
    lost: str,
) -> None:
    """LISTEN on ``channels`` on a connection of its own, calling ``on_note(channel,
    payload)`` for each notification, for as long as the task runs: a quiet connection is
    pinged every :data:`LISTEN_PING_S`, a lost one reconnected after
    :data:`RECONNECT_DELAYS`. ``on_listening`` runs each time the LISTENs are in force
    (what was sent while nobody listened is then looked at once). ``lost`` says in the
    log what was lost and what goes on meanwhile: once per loss at INFO, each failed
    reconnect of an outage at DEBUG (the health probe's "backend down" is the
    operator's line)."""
    failures = 0
    while True:
        try:
            conn = await db.connect()
            async with conn:
                for channel in await channels(conn):
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                failures = 0
                if on_listening is not None:
                    await on_listening(conn)
                while True:
                    async for note in conn.notifies(timeout=LISTEN_PING_S):
                        on_note(note.channel, note.payload)
                    # Quiet for a while: prove the connection still works.
                    async with asyncio.timeout(db.config.timeout):
                        await conn.execute("SELECT 1")
        except (psycopg.Error, FencingError, TimeoutError) as exc:
            log.log(logging.INFO if failures == 0 else logging.DEBUG, "%s (%s)", lost, exc)
        await asyncio.sleep(RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)])
        failures += 1


__all__ = [
    "DEFAULT_SCHEMA",
    "LEASE_HELD_SQLSTATE",
    "LEASE_NOT_LIVE_SQLSTATE",
    "STALE_TOKEN_SQLSTATE",
    "Migration",
    "PgConfig",
    "PostgresDatabase",
    "driver_error",
    "fencing_error",
    "listen_forever",
    "migrate",
    "migrations",
    "quiet_check",
]
