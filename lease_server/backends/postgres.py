"""PostgreSQL lease backend: many lease-server processes, one database (``postgres://``).

Each operation is one statement, and so one short transaction, calling a function
installed by :mod:`serving.migrations`, where the SQL and its reasoning live: Acquire,
Renew and Release, alone or many callers' at once, and AcquireMany, RenewMany and
ReleaseMany, are ``lease_steps`` (``0018_lease_steps_set.sql``, linear in its calls
since ``0019_lease_steps_linear.sql``) (a grant raises the resource's counter under its row
lock, and the token reaches the caller only after that commit: G1; counters are never
deleted, no sequence is involved). Expiry is decided by the database's clock alone,
read with ``clock_timestamp()`` with the row locks held (G7), so any number of servers
on any hosts agree (G2). URL parameters (``schema``, ``timeout``, ``pool_max``) are
described in :mod:`serving.postgres_db`; every call is bounded by ``timeout`` and fails
with ``BackendUnavailableError`` when the database is unreachable.

**Token floor** (``?token_floor=clock``, ``0010_token_floor.sql``). A database that
loses acknowledged writes (failover to an asynchronous standby that lagged, restore
from an earlier backup) has an older counter row and would grant a token again. With
the floor every grant, leases and job claims alike, takes ``max(counter + 1, the
database's clock_timestamp() in microseconds)`` instead, as on Redis: larger than every
earlier token unless the database's clock steps back by more than the time between
the last grant before the loss and the first after it. It is a session setting
(``fencing.token_floor``, set on every pooled connection by :mod:`serving.postgres_db`), so
it holds for every path that grants; tokens become sparse (about 1.8e15).
Synchronous replication makes it unnecessary.

**Lease calls of many callers in one round trip** (``0019_lease_steps_linear.sql``,
:meth:`PostgresBackend.lease_steps`): the calls the server's group commit
(:mod:`lease_server.grouped`) gathered go as one statement, every row locked in
resource order (the lock order), each call judged as alone, their events numbered
once at the end; a lone call is the same statement with one call.

**Event log** (:class:`~lease_server.backends.base.EventLog`, ``0005_lease_events.sql``,
numbered as ``0013_event_sequencer.sql`` says, by ``lease_events_log`` of
``0018_lease_steps_set.sql``). An acquire, release or expiry numbers its events in the
transaction of the change if the one ``lease_event_log`` row is free (``SKIP LOCKED``;
the transaction then holds it to commit); if another appender holds it, the events are
parked in ``lease_events_pending`` and the write commits without waiting.
``lease_events_sequence`` numbers what is pending: this object runs it soon after a
write that parked events, unless its next write numbered them first (and again in the
background, with backoff, while the row is taken), and before a read that could come
up short; concurrent callers in one process share one run. Revisions are dense and commit
ordered (rule 3): only the row's holder numbers, and it holds the row to commit. A
renewal is not an event. ``lease_expire_due`` clears expired leases (``FOR UPDATE SKIP
LOCKED``, re-checked under the lock) and appends their EXPIRED in the same transaction;
an acquire that takes over an expired lease first appends the EXPIRED itself, so each
expiry is logged once however many servers sweep. ``lease_events_after`` reads head,
events and ``compacted_through`` in one statement (one snapshot); ``lease_prune_events``
deletes and raises ``compacted_through`` in one transaction.

Wake-ups: whoever numbers a release runs ``pg_notify('fencing_released:<schema>',
resource)`` and ``pg_notify('fencing_events:<schema>', head)``, in its transaction; a
release wakes this process's waiters itself as soon as it committed. One
dedicated autocommit connection per backend, outside the pool, LISTENs on both
channels and calls the ``on_release`` and ``on_events`` callbacks on the event loop, so
a waiter held in one server process is woken by a release through another, and a
Watch stream on one server sees another server's appends at once. Notifications sent
while that connection is down are lost: it reconnects with backoff (and reports the
head it finds), and meanwhile waiters fall back to their periodic re-check (at least
every 100 ms, see :mod:`lease_server.waiters`) and Watch streams to the feed's poll of
``head_revision`` (every 100 ms, :mod:`lease_server.watch`), so a lost notification
costs latency, never correctness.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence

import psycopg
from psycopg.rows import TupleRow

from fencing.errors import FencingError, LeaseLost
from fencing.types import LeaseState
from lease_server.leases import (
    AcquireItem,
    EventPage,
    Grant,
    Held,
    LeaseStep,
    LoggedEvent,
    ReleaseItem,
    RenewItem,
    Scope,
    StepOutcome,
    TransitionKind,
)
from serving.postgres_db import (
    DEFAULT_SCHEMA,
    LEASE_HELD_SQLSTATE,
    PgConfig,
    PostgresDatabase,
    listen_forever,
    migrate,
)
from serving.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: Events a step parked (another server's step held the log row) wait this long (seconds)
#: for this process's next step to number them before a sequencer run of their own does.
PARKED_NUMBERING_S = 0.005


class PostgresBackend:
    """Lease state in one schema of a PostgreSQL database, shared by any number of servers.

    ``PostgresBackend("postgresql://user@host/db?schema=fencing")``; an explicit
    ``schema`` argument wins over the URL's. :meth:`open` migrates the schema.
    ``?token_floor=clock``: every grant takes the clock floor (module docstring);
    ``token_floor`` says which is in force.
    """

    name = "postgres"

    def __init__(self, url: str, schema: str | None = None) -> None:
        self._db = PostgresDatabase(PgConfig.from_url(url, schema), "fencing-lease-server")
        q = self._db.qualified
        self._describe_sql = q("SELECT * FROM {schema}.lease_describe(%s)")
        # Code point order (COLLATE "C" on UTF-8), whatever the database's collation, so
        # the cursor and the order agree; the database's clock decides what is held.
        self._list_sql = q(
            "SELECT resource, holder, token,"
            " ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint,"
            " counter, ttl_ms FROM {schema}.leases"
            ' WHERE starts_with(resource, %s) AND resource COLLATE "C" > %s'
            " AND token != 0 AND expires_at > clock_timestamp()"
            ' ORDER BY resource COLLATE "C" LIMIT %s'
        )
        self._acquire_many_sql = q(
            "SELECT * FROM {schema}.lease_acquire_many(%s::text[], %s, %s, %s)"
        )
        self._renew_many_sql = q(
            "SELECT * FROM {schema}.lease_renew_many(%s::text[], %s::bigint[], %s::text[],"
            " %s::bigint[])"
        )
        self._release_many_sql = q(
            "SELECT * FROM {schema}.lease_release_many(%s::text[], %s::bigint[], %s::text[])"
        )
        self._steps_sql = q(
            "SELECT * FROM {schema}.lease_steps(%s::text[], %s::text[], %s::text[],"
            " %s::bigint[], %s::bigint[], %s::text[])"
        )
        # The same function for a lone call, its arguments sent as values: adapting six
        # one-item lists costs this process more than the call's own SQL costs it.
        self._step_sql = q(
            "SELECT * FROM {schema}.lease_steps(ARRAY[%s::text], ARRAY[%s::text],"
            " ARRAY[%s::text], ARRAY[%s::bigint], ARRAY[%s::bigint], ARRAY[%s::text])"
        )
        self._channels_sql = q("SELECT {schema}.lease_channel(), {schema}.lease_events_channel()")
        self._head_sql = q("SELECT head FROM {schema}.lease_event_log WHERE id = 1")
        self._log_id_sql = q("SELECT log_id FROM {schema}.lease_event_log_identity WHERE id = 1")
        self._events_sql = q("SELECT * FROM {schema}.lease_events_after(%s, %s, %s, %s)")
        self._expire_sql = q("SELECT * FROM {schema}.lease_expire_due(%s)")
        self._prune_sql = q("SELECT {schema}.lease_prune_events(%s)")
        self._sequence_sql = q("SELECT * FROM {schema}.lease_events_sequence()")
        #: Callers waiting for a sequencer run that starts after they asked.
        self._sequence_wanted: list[asyncio.Future[tuple[int, dict[int, int], bool]]] = []
        self._sequencer: asyncio.Task[None] | None = None
        self._renumber: asyncio.Task[None] | None = None
        #: Sequencer runs for steps whose events another appender left pending.
        self._numbering: set[asyncio.Task[object]] = set()
        #: The sequencer run due for parked events, unless a step numbers them first.
        self._parked: asyncio.TimerHandle | None = None
        self._callbacks: list[Callable[[str], None]] = []
        self._event_callbacks: list[Callable[[int], None]] = []
        #: The highest revision reported to the ``on_events`` callbacks.
        self._reported = 0
        self._listener: asyncio.Task[None] | None = None
        self._opened = False

    @property
    def schema(self) -> str:
        return self._db.config.schema

    @property
    def token_floor(self) -> str:
        """``off`` or ``clock`` (``?token_floor=``): the floor this server's grants take."""
        return self._db.config.token_floor

    async def open(self) -> None:
        await self._db.open()
        self._opened = True
        if self._callbacks or self._event_callbacks:
            self._start_listener()

    async def close(self) -> None:
        self._opened = False
        if self._parked is not None:
            self._parked.cancel()
            self._parked = None
        await cancel_and_wait(
            *(t for t in (self._listener, self._renumber, *self._numbering) if t is not None)
        )
        self._listener = self._renumber = None
        self._numbering.clear()
        await self._db.close()

    async def healthy(self) -> bool:
        """PostgreSQL answers ``SELECT 1`` (see ``serving.storage.HealthProbe``)."""
        return await self._db.healthy()

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, request_id: str
    ) -> Grant | Held:
        (outcome,) = await self.lease_steps([AcquireItem(resource, holder, ttl_ms, request_id)])
        assert isinstance(outcome, Grant | Held)
        return outcome

    async def renew(self, resource: str, token: int, holder: str, ttl_ms: int) -> Grant:
        (outcome,) = await self.lease_steps([RenewItem(resource, token, holder, ttl_ms)])
        if isinstance(outcome, LeaseLost):
            raise outcome
        assert isinstance(outcome, Grant)
        return outcome

    async def release(self, resource: str, token: int, holder: str) -> None:
        (outcome,) = await self.lease_steps([ReleaseItem(resource, token, holder)])
        if isinstance(outcome, LeaseLost):
            raise outcome

    async def describe(self, resource: str) -> LeaseState:
        row = await self._db.fetchone(self._describe_sql, (resource,))
        assert row is not None  # lease_describe always returns one row
        held, holder, token, remaining_ms, last_token, ttl_ms = row
        return LeaseState(resource, held, holder, token, remaining_ms, last_token, ttl_ms)

    async def list_held(self, prefix: str, after: str, limit: int) -> list[LeaseState]:
        rows = await self._db.fetchall(self._list_sql, (prefix, after, limit))
        return [
            LeaseState(resource, True, holder, int(token), max(1, int(ms)), int(counter), int(ttl))
            for resource, holder, token, ms, counter, ttl in rows
        ]

    # -- many at once (0007_lease_batches.sql): one statement each, events appended -----------

    async def acquire_many(
        self, resources: Sequence[str], holder: str, ttl_ms: int, request_id: str
    ) -> list[Grant] | Held:
        try:
            rows = await self._db.fetchall(
                self._acquire_many_sql, (list(resources), holder, ttl_ms, request_id)
            )
        except psycopg.Error as exc:
            if exc.sqlstate != LEASE_HELD_SQLSTATE:
                raise
            detail = json.loads(exc.diag.message_detail or "{}")
            return Held(
                str(detail.get("resource", "")),
                str(detail.get("holder", "")),
                int(detail.get("token", 0)),
                max(0, int(detail.get("remaining_ms", 0))),
            )
        await self._after_write([int(row[4]) for row in rows])
        got = {r: Grant(r, holder, int(t), int(ms), bool(again)) for r, again, t, ms, _ in rows}
        return [got[r] for r in resources]

    async def renew_many(self, items: Sequence[RenewItem]) -> list[Grant | LeaseLost]:
        rows = await self._db.fetchall(
            self._renew_many_sql,
            (
                [i.resource for i in items],
                [i.token for i in items],
                [i.holder for i in items],
                [i.ttl_ms for i in items],
            ),
        )
        renewed = {int(row[0]): (row[1], int(row[2])) for row in rows}
        return [
            Grant(i.resource, renewed[n][0], i.token, renewed[n][1])
            if n in renewed
            else LeaseLost(resource=i.resource, token=i.token)
            for n, i in enumerate(items, start=1)
        ]

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[LeaseLost | None]:
        rows = await self._db.fetchall(
            self._release_many_sql,
            ([i.resource for i in items], [i.token for i in items], [i.holder for i in items]),
        )
        released = {int(row[0]) for row in rows}
        for n in sorted(released):
            self._dispatch(items[n - 1].resource)
        await self._after_write([int(row[1]) for row in rows])
        return [
            None if n in released else LeaseLost(resource=i.resource, token=i.token)
            for n, i in enumerate(items, start=1)
        ]

    # -- lease calls of many callers in one round trip (0019_lease_steps_linear.sql) ---------

    #: Steps in flight at once: one. While it is out, the next batch forms. Two steps
    #: at once would contend for the event log row (the second leaves its events
    #: pending, and a sequencer round trip follows): measured, two are slower than one.
    step_concurrency = 1

    async def lease_steps(self, steps: Sequence[LeaseStep]) -> list[StepOutcome]:
        kinds: list[str] = []
        holders: list[str] = []
        tokens: list[int] = []
        ttls: list[int] = []
        request_ids: list[str] = []
        for op in steps:
            if isinstance(op, AcquireItem):
                kinds.append("acquire")
                tokens.append(0)
                ttls.append(op.ttl_ms)
                request_ids.append(op.request_id)
            elif isinstance(op, RenewItem):
                kinds.append("renew")
                tokens.append(op.token)
                ttls.append(op.ttl_ms)
                request_ids.append("")
            else:
                kinds.append("release")
                tokens.append(op.token)
                ttls.append(0)
                request_ids.append("")
            holders.append(op.holder)
        resources = [op.resource for op in steps]
        args = (kinds, resources, holders, tokens, ttls, request_ids)
        if len(steps) == 1:
            rows = await self._db.fetchall(self._step_sql, [arg[0] for arg in args])
        else:
            rows = await self._db.fetchall(self._steps_sql, args)
        by_ord = {int(row[0]): row for row in rows}
        outcomes: list[StepOutcome] = []
        revisions: list[int] = []
        for n, op in enumerate(steps, start=1):
            _, ok, replayed, holder, token, ms, revision = by_ord[n]
            revisions.append(int(revision))
            if isinstance(op, AcquireItem):
                outcome: StepOutcome = (
                    Grant(op.resource, holder, int(token), int(ms), bool(replayed))
                    if ok
                    else Held(op.resource, holder, int(token), max(0, int(ms)))
                )
            elif not ok:
                outcome = LeaseLost(resource=op.resource, token=op.token)
            elif isinstance(op, RenewItem):
                outcome = Grant(op.resource, holder, op.token, int(ms))
            else:
                outcome = None
                # Committed: this process's waiters may go now, before any numbering.
                self._dispatch(op.resource)
            outcomes.append(outcome)
        if any(r < 0 for r in revisions):
            # Another appender (another server's step) held the log row: the events are
            # committed and parked. Number them in the background rather than make
            # every caller of this step wait one more round trip (a reader numbers what
            # it needs before it reads; a watch guard asks for a token it has not seen).
            self._park()
            return outcomes
        if self._parked is not None and any(r > 0 for r in revisions):
            # This step took the log row after the parked events committed (steps of a
            # process run one after another), so it numbered them first: no run needed.
            self._parked.cancel()
            self._parked = None
        await self._after_write(revisions)
        return outcomes

    def _park(self) -> None:
        """A step's events were parked: have them numbered soon. Under load the next
        step of this process (or another server's) numbers them on its way, moving every
        committed pending event before its own, so the run of their own waits
        ``PARKED_NUMBERING_S`` for that first; concurrent ones share one run (see
        :meth:`_sequence`), which retries while another transaction holds the row."""
        if self._parked is None:
            self._parked = asyncio.get_running_loop().call_later(
                PARKED_NUMBERING_S, self._number_parked
            )

    def _number_parked(self) -> None:
        self._parked = None
        task = asyncio.get_running_loop().create_task(self._after_write([-1]))
        self._numbering.add(task)
        task.add_done_callback(self._numbering.discard)

    # -- the event log -----------------------------------------------------------------------

    async def head_revision(self) -> int:
        known = self._reported
        # Number what committed since (another process's appends, your own SQL's, job
        # claims), so the head read is the log's, not only what someone numbered.
        head, _, _ = await self._sequence()
        if head < known:
            # Every reported head was committed before this read: the log went back (a
            # restored database). Report from here on, or no head would be news again.
            self._reported = head
        return head

    async def log_id(self) -> str:
        """Drawn once by ``0009_watch_cursors.sql`` (rule 5 of the event log)."""
        row = await self._db.fetchone(self._log_id_sql)
        return str(row[0]) if row is not None else ""

    async def events_after(self, revision: int, scope: Scope, limit: int) -> EventPage:
        if self._reported - revision < limit:
            # The page may not fill with what is numbered already: number what committed
            # until now first, so a short page means "nothing more committed". (A full
            # page skips the round trip: its reader comes straight back for the rest.)
            await self._sequence()
        async with self._db.connection() as conn:
            cur = await conn.execute(
                self._events_sql, (revision, scope.resource, scope.prefix, max(1, limit))
            )
            rows = await cur.fetchall()
        head, compacted = (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)
        events = tuple(
            LoggedEvent(rev, TransitionKind(kind), resource, token, holder, ttl_ms, job_id, queue)
            for _, _, rev, kind, resource, token, holder, ttl_ms, job_id, queue in rows
            if rev is not None
        )
        return EventPage(events, head, compacted)

    async def expire_due(self, limit: int) -> list[LoggedEvent]:
        async with self._db.connection() as conn:
            cur = await conn.execute(self._expire_sql, (limit,))
            rows = await cur.fetchall()
        if not rows:
            return []
        head, numbered = await self._after_write([int(row[0]) for row in rows])
        # Numbered in the sweep's transaction (the head through it), by this process's
        # sequencer run, or else by another's or later (then the head known now).
        return [
            LoggedEvent(
                rev if rev > 0 else numbered.get(-rev, head), TransitionKind.EXPIRED, res, tok, who
            )
            for rev, res, tok, who in rows
        ]

    async def prune_events(self, keep: int) -> int:
        row = await self._db.fetchone(self._prune_sql, (max(0, keep),))
        return int(row[0]) if row is not None else 0

    def on_events(self, callback: Callable[[int], None]) -> None:
        """``callback(head)`` after this object's appends, at once, and after any other
        process's, when their NOTIFY arrives. Heads only grow: a head already reported
        (this process's own append, echoed by NOTIFY) is not reported again."""
        self._event_callbacks.append(callback)
        if self._opened:
            self._start_listener()

    async def _after_write(self, revisions: Sequence[int]) -> tuple[int, dict[int, int]]:
        """After a write committed, with what its SQL returned per item (0013): a head
        its transaction numbered through (> 0: report it), minus a pending event's seq
        (< 0: number it now, or soon), or 0 (nothing appended). Returns the head and
        the revisions a sequencer run gave (pending seq -> revision). The write has
        committed, so a failure here fails nothing: the events stay pending until the
        next run (any server's, any read)."""
        if not any(r < 0 for r in revisions):
            head = max(revisions, default=0)
            self._appended(head)
            return head, {}
        try:
            head, numbered, _ = await self._sequence()
        except FencingError as exc:
            log.warning("appended events not numbered yet (%s); the next read numbers them", exc)
            return 0, {}
        return head, numbered

    async def _sequence(self) -> tuple[int, dict[int, int], bool]:
        """One run of ``lease_events_sequence`` that starts after this call: the head
        after it, the revisions it gave (pending seq -> revision), and whether another
        transaction held the log row (then what it could not number is numbered by a
        retry in the background, so no caller waits for that transaction). Calls that
        arrive while a run is under way share the next one, so one process has at most
        one run in flight and concurrent writers share its round trip and commit."""
        done: asyncio.Future[tuple[int, dict[int, int], bool]] = (
            asyncio.get_running_loop().create_future()
        )
        self._sequence_wanted.append(done)
        if self._sequencer is None or self._sequencer.done():
            self._sequencer = asyncio.get_running_loop().create_task(self._run_sequencer())
        return await done

    async def _run_sequencer(self) -> None:
        while self._sequence_wanted:
            batch, self._sequence_wanted = self._sequence_wanted, []
            try:
                row = await self._db.fetchone(self._sequence_sql)
            except BaseException as exc:
                for waiter in batch:
                    if not waiter.done():
                        waiter.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            head = int(row[0]) if row is not None else 0
            seqs: list[int] = list(row[1]) if row is not None and row[1] else []
            busy = bool(row[2]) if row is not None else False
            numbered = {seq: head - len(seqs) + i for i, seq in enumerate(seqs, start=1)}
            self._appended(head)
            if busy and (self._renumber is None or self._renumber.done()):
                self._renumber = asyncio.get_running_loop().create_task(self._number_later())
            for waiter in batch:
                if not waiter.done():
                    waiter.set_result((head, numbered, busy))

    async def _number_later(self) -> None:
        """Another transaction held the log row: run again until a run gets it (that
        holder commits soon; one that stays open, your own SQL's, is waited out with
        backoff). Then what committed meanwhile is numbered and reported."""
        delay = 0.002
        while self._opened:
            await asyncio.sleep(delay)
            try:
                _, _, busy = await self._sequence()
            except FencingError:
                busy = True
            if not busy:
                return
            delay = min(delay * 2, 0.1)

    def _appended(self, head: int) -> None:
        """Report ``head`` (from an own append, a NOTIFY, or the head found on
        reconnecting) if it is news: each head once, in increasing order."""
        if head <= self._reported:
            return
        self._reported = head
        for callback in self._event_callbacks:
            try:
                callback(head)
            except Exception:
                log.exception("on_events callback failed at revision %d", head)

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
        events_channel = ""

        async def channels(conn: psycopg.AsyncConnection[TupleRow]) -> Sequence[str]:
            nonlocal events_channel
            cur = await conn.execute(self._channels_sql)
            row = await cur.fetchone()
            assert row is not None
            released, events_channel = row
            log.info("listening for releases on %s and events on %s", released, events_channel)
            return (released, events_channel)

        async def listening(conn: psycopg.AsyncConnection[TupleRow]) -> None:
            if self._event_callbacks:
                # Appends made while no one listened: report the head now.
                cur = await conn.execute(self._head_sql)
                head = await cur.fetchone()
                self._appended(int(head[0]) if head else 0)

        def note(channel: str, payload: str) -> None:
            if channel == events_channel:
                if payload.isdigit():
                    self._appended(int(payload))
            else:
                self._dispatch(payload)

        await listen_forever(
            self._db,
            channels,
            note,
            on_listening=listening,
            lost=f"listener on schema {self.schema} lost; waiters and watchers poll until it "
            "is back",
        )


__all__ = ["DEFAULT_SCHEMA", "PostgresBackend", "migrate"]
