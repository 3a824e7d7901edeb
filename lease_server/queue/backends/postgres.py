"""PostgreSQL queue backend: many lease-server processes, one database (``postgres://``).

Jobs live in the lease backend's schema (the same URL: ``?schema=``, ``timeout``,
``pool_max`` as in :mod:`serving.postgres_db`), created by ``serving/migrations/0003_queue.sql``,
where the SQL and its reasoning live. Every call but Fail is one statement calling a
function of that migration: Claim is a single ``UPDATE ... FROM (SELECT ... FOR UPDATE
SKIP LOCKED)`` taking each token from a sequence (with ``?token_floor=clock``, the
clock floor of :mod:`lease_server.backends.postgres`, per job), and storing the Claim's
request id, whose retry gets the jobs still running under it back instead
(``0025_job_claim_requests.sql``); Heartbeat, Complete
and Release lock the named rows in id order, judge every token, and change nothing if
one is stale.
Fail runs the pure rule of :mod:`lease_server.queue.jobs` in a transaction (the retry delay
depends on the attempts used, read under the row lock), and so do the operators' cancel
and retry (``0015_queue_admin.sql``: a cancel of a running job draws its fresh token from
``job_tokens``, and the trigger logs the claim's end). Expiry and due times are the
database's clock. Outages become ``BackendUnavailableError`` (bounded by ``timeout``).

Job events: a trigger on ``jobs`` (``0011_job_events.sql``) appends every change of a
claim to the schema's lease event log in the transaction that makes it, whichever path
made it (these functions, Fail, your own SQL). A lease backend on the same schema serves
them to ``Watch`` and prunes them; a queue in a schema no lease server follows still
appends them, unread and unpruned, so the lease server warns about such a setup.
Another trigger (``0026_job_attempts.sql``) keeps each job's attempts the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from fencing.errors import LeaseLost
from lease_server.backends.base import LeaseBackend
from lease_server.queue import jobs
from lease_server.queue.backends.base import CompleteGroup, PeriodJob, RetryDelay
from lease_server.queue.backends.sql import (
    attempt_record,
    job_record,
    schedule_params,
    schedule_record,
)
from lease_server.queue.jobs import (
    Administered,
    Enqueued,
    Failed,
    JobAttempt,
    JobRecord,
    JobRef,
    JobState,
    NewJob,
    QueueCounts,
)
from lease_server.queue.schedules import Schedule, ScheduleRecord
from serving.postgres_db import PgConfig, PostgresDatabase, listen_forever
from serving.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def _ids_tokens(refs: Sequence[JobRef]) -> tuple[list[int], list[int]]:
    return [r.id for r in refs], [r.token for r in refs]


def _stale(row: Sequence[Any] | None) -> LeaseLost | None:
    if row is None or row[0] is None:
        return None
    job_id, token, resource = int(row[0]), int(row[1]), str(row[2])
    message = (
        f"job {job_id}: token {token} is not its current claim"
        if resource
        else f"job {job_id} does not exist"
    )
    return LeaseLost(message, resource=resource, token=token)


class PostgresQueue:
    """Jobs in one schema of a PostgreSQL database, shared by any number of servers."""

    name = "postgres"

    def __init__(self, url: str, schema: str | None = None) -> None:
        # The lease backend's URL: with ?token_floor=clock claims take the floor too.
        self._db = PostgresDatabase(PgConfig.from_url(url, schema), "fencing-queue")
        q = self._db.qualified
        self._opened = False
        self._listener: asyncio.Task[None] | None = None
        self._enqueued_callbacks: list[Callable[[str], None]] = []
        self._channel_sql = q("SELECT {schema}.jobs_channel()")
        self._enqueue_sql = q(
            "SELECT * FROM {schema}.job_enqueue_many(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        )
        self._pause_sql = q(
            "INSERT INTO {schema}.queue_pauses (queue) VALUES (%s) ON CONFLICT DO NOTHING"
        )
        self._resume_sql = q("DELETE FROM {schema}.queue_pauses WHERE queue = %s")
        self._paused_sql = q("SELECT queue FROM {schema}.queue_pauses ORDER BY queue")
        self._is_paused_sql = q("SELECT 1 FROM {schema}.queue_pauses WHERE queue = %s")
        self._claim_sql = q("SELECT * FROM {schema}.job_claim(%s, %s, %s, %s, %s)")
        self._heartbeat_sql = q("SELECT * FROM {schema}.job_heartbeat(%s, %s, %s, %s)")
        self._complete_sql = q("SELECT * FROM {schema}.job_complete(%s, %s, %s)")
        self._complete_batch_sql = q("SELECT * FROM {schema}.job_complete_batch(%s, %s, %s, %s)")
        self._release_sql = q("SELECT * FROM {schema}.job_release(%s, %s, %s)")
        self._reap_sql = q("SELECT {schema}.job_reap(%s)")
        self._prune_sql = q("SELECT {schema}.job_prune(%s, %s, %s)")
        self._stats_sql = q("SELECT * FROM {schema}.job_stats(%s, %s)")
        self._get_sql = q("SELECT * FROM {schema}.job_rows WHERE id = %s")
        self._history_sql = q(
            "SELECT attempt, started_at_ms, worker, token, outcome, ended_at_ms, error"
            " FROM {schema}.job_attempt_rows WHERE job_id = %s ORDER BY seq"
        )
        self._lock_sql = q(
            "SELECT r.*, {schema}.job_ms(now()) FROM {schema}.job_rows AS r"
            " WHERE r.id = %s FOR UPDATE"
        )
        self._promote_sql = q("SELECT {schema}.job_promote(%s, %s)")
        # 'scheduled' and 'ready' split the stored ready jobs at now (jobs.listed).
        self._list_sql = q(
            "SELECT r.*, n.ms FROM {schema}.job_rows AS r,"
            " (SELECT {schema}.job_ms(now()) AS ms) AS n"
            " WHERE r.queue = %(queue)s AND r.id > %(after)s AND CASE %(state)s"
            " WHEN '' THEN true"
            " WHEN 'scheduled' THEN r.state = 'ready' AND r.available_at_ms > n.ms"
            " WHEN 'ready' THEN r.state = 'ready' AND r.available_at_ms <= n.ms"
            " ELSE r.state = %(state)s END ORDER BY r.id LIMIT %(limit)s"
        )
        self._lock_dead_sql = q(
            "SELECT r.*, {schema}.job_ms(now()) FROM {schema}.job_rows AS r"
            " WHERE r.queue = %s AND r.state = 'dead' ORDER BY r.id LIMIT %s"
            " FOR UPDATE SKIP LOCKED"
        )
        self._next_token_sql = q("SELECT nextval('{schema}.job_tokens')")
        self._lock_key_sql = q("SELECT {schema}.job_lock_key(%s, %s)")
        self._key_live_sql = q(
            "SELECT EXISTS (SELECT 1 FROM {schema}.jobs AS j WHERE j.queue = %s"
            " AND j.ordering_key = %s AND j.id <> %s"
            " AND j.state IN ('waiting', 'ready', 'running'))"
        )
        # Write back a job changed by a rule of jobs.py (Fail, cancel, retry): every mutable
        # column, the token too (the floor trigger of 0010 may raise a new one); returns
        # the row as stored, as job_rows gives it.
        self._store_all_sql = q(
            "UPDATE {schema}.jobs AS j SET state = %s, attempts = %s, max_attempts = %s,"
            " token = %s, available_at = to_timestamp(%s / 1000.0), lease_owner = %s,"
            " lease_until = CASE WHEN %s = 'running' THEN j.lease_until END,"
            " last_error = %s,"
            " finished_at = CASE WHEN %s > 0 THEN to_timestamp(%s / 1000.0) END"
            " WHERE j.id = %s RETURNING j.id, j.queue, j.payload, j.state, j.resource,"
            " j.ordering_key, j.idempotency_key, j.priority, j.attempts, j.max_attempts,"
            " j.token, {schema}.job_ms(j.available_at), j.lease_owner,"
            " {schema}.job_ms(j.lease_until), j.last_error, {schema}.job_ms(j.created_at),"
            " {schema}.job_ms(j.finished_at), {schema}.job_ms(j.claimed_at)"
        )
        self._last_token_sql = q(
            "SELECT greatest("
            "(SELECT max(j.token) FROM {schema}.jobs AS j"
            " WHERE j.resource = %s AND j.resource <> ''),"
            "(SELECT j.token FROM {schema}.jobs AS j"
            " WHERE j.id = %s AND j.queue = %s AND j.resource = ''), 0)"
        )
        columns = (
            "name, queue, cron, every_ms, timezone, payload, priority, max_attempts,"
            " resource, catch_up, created_at_ms, last_period_ms, last_job_id"
        )
        self._put_schedule_sql = q(
            f"SELECT {columns} FROM {{schema}}.job_schedule_put"
            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        )
        self._delete_schedule_sql = q(
            "DELETE FROM {schema}.job_schedules WHERE name = %s AND (%s = '' OR queue = %s)"
        )
        self._now_sql = q("SELECT {schema}.job_ms(now())")
        self._schedules_sql = q(f"SELECT {columns} FROM {{schema}}.job_schedules ORDER BY name")
        self._schedule_queue_sql = q("SELECT queue FROM {schema}.job_schedules WHERE name = %s")
        self._schedule_period_sql = q(
            "UPDATE {schema}.job_schedules SET last_period_ms = %s, last_job_id = %s"
            " WHERE name = %s AND last_period_ms <= %s"
        )

    @property
    def schema(self) -> str:
        return self._db.config.schema

    @property
    def token_floor(self) -> str:
        """``off`` or ``clock``: the floor this queue's claims take (``?token_floor=``)."""
        return self._db.config.token_floor

    def log_events_to(self, backend: LeaseBackend) -> bool:
        # The trigger logs into this schema's log whatever is linked: only say whether
        # that log is the one the lease backend serves.
        return getattr(backend, "name", "") == "postgres" and (
            getattr(backend, "schema", None) == self.schema
        )

    async def open(self) -> None:
        await self._db.open()
        self._opened = True
        if self._enqueued_callbacks:
            self._start_listener()

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await cancel_and_wait(listener)
        self._opened = False
        await self._db.close()

    # -- wake-ups: jobs enqueued elsewhere (other servers, the application's SQL) ---------

    def on_enqueued(self, callback: Callable[[str], None]) -> None:
        self._enqueued_callbacks.append(callback)
        if self._opened:
            self._start_listener()

    def _start_listener(self) -> None:
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(
                self._listen_forever(), name=f"fencing-queue-listen-{self.schema}"
            )

    async def _listen_forever(self) -> None:
        async def channels(conn: psycopg.AsyncConnection[TupleRow]) -> Sequence[str]:
            cur = await conn.execute(self._channel_sql)
            row = await cur.fetchone()
            assert row is not None
            return (row[0],)

        async def listening(conn: psycopg.AsyncConnection[TupleRow]) -> None:
            # Jobs enqueued while no one listened: every queue looks once.
            for callback in self._enqueued_callbacks:
                callback("")

        def note(channel: str, queue: str) -> None:
            for callback in self._enqueued_callbacks:
                callback(queue)

        await listen_forever(
            self._db,
            channels,
            note,
            on_listening=listening,
            lost=f"queue listener on schema {self.schema} lost; claims poll until it is back",
        )

    @staticmethod
    def _enqueue_params(queue: str, specs: Sequence[NewJob]) -> tuple[Any, ...]:
        return (
            queue,
            [s.payload for s in specs],
            [s.idempotency_key or None for s in specs],
            [s.ordering_key for s in specs],
            [s.priority for s in specs],
            [s.max_attempts for s in specs],
            [s.delay_ms for s in specs],
            [_timestamp(s.run_at_ms) for s in specs],
            [s.resource for s in specs],
        )

    async def enqueue(self, queue: str, specs: Sequence[NewJob]) -> list[Enqueued]:
        async with self._db.connection() as conn:
            cur = await conn.execute(self._enqueue_sql, self._enqueue_params(queue, specs))
            return _enqueued(await cur.fetchall())

    async def claim(
        self, queue: str, worker: str, limit: int, ttl_ms: int, request_id: str = ""
    ) -> list[JobRecord]:
        async with self._db.connection() as conn:
            # Checked on every claim (no cache), so a pause made through any server on
            # this database holds from the next claim on. A paused queue claims with
            # limit 0: nothing new, but a retried Claim still gets its jobs back.
            cur = await conn.execute(self._is_paused_sql, (queue,))
            if await cur.fetchone() is not None:
                limit = 0
            cur = await conn.execute(self._claim_sql, (queue, worker, limit, ttl_ms, request_id))
            rows = await cur.fetchall()
        return [job_record(r) for r in rows]  # job_claim returns them in claim order

    async def set_paused(self, queue: str, paused: bool) -> bool:
        return await self._db.execute(self._pause_sql if paused else self._resume_sql, (queue,)) > 0

    async def paused(self) -> set[str]:
        return {str(r[0]) for r in await self._db.fetchall(self._paused_sql)}

    async def heartbeat(self, refs: Sequence[JobRef], ttl_ms: int, queue: str = "") -> None:
        ids, tokens = _ids_tokens(refs)
        row = await self._db.fetchone(self._heartbeat_sql, (ids, tokens, ttl_ms, queue))
        lost = _stale(row)
        if lost is not None:
            raise lost

    async def complete(self, refs: Sequence[JobRef], queue: str = "") -> set[str]:
        ids, tokens = _ids_tokens(refs)
        row = await self._db.fetchone(self._complete_sql, (ids, tokens, queue))
        lost = _stale(row)
        if lost is not None:
            raise lost
        assert row is not None
        return set(row[3] or ())

    @staticmethod
    def _batch_params(groups: Sequence[CompleteGroup]) -> tuple[Any, ...]:
        ids: list[int] = []
        tokens: list[int] = []
        numbers: list[int] = []
        for number, (refs, _) in enumerate(groups, start=1):
            ids += [r.id for r in refs]
            tokens += [r.token for r in refs]
            numbers += [number] * len(refs)
        return (ids, tokens, numbers, [queue for _, queue in groups])

    @staticmethod
    def _verdicts(
        groups: Sequence[CompleteGroup], rows: Sequence[Sequence[Any]]
    ) -> tuple[list[LeaseLost | None], set[str]]:
        verdicts: list[LeaseLost | None] = [None] * len(groups)
        woken: set[str] = set()
        for row in rows:
            if row[0] == 0:
                woken = set(row[4] or ())
            else:
                verdicts[int(row[0]) - 1] = _stale(row[1:4])
        return verdicts, woken

    async def complete_batch(
        self, groups: Sequence[CompleteGroup]
    ) -> tuple[list[LeaseLost | None], set[str]]:
        async with self._db.connection() as conn:
            cur = await conn.execute(self._complete_batch_sql, self._batch_params(groups))
            rows = await cur.fetchall()
        return self._verdicts(groups, rows)

    async def complete_and_claim(
        self,
        groups: Sequence[CompleteGroup],
        queue: str,
        worker: str,
        limit: int,
        ttl_ms: int,
        request_id: str = "",
    ) -> tuple[list[LeaseLost | None], set[str], list[JobRecord]]:
        # Two statements, each its own transaction (the completes commit first), sent
        # together in one pipeline: one round trip.
        async with self._db.connection() as conn, conn.pipeline():
            done = await conn.execute(self._complete_batch_sql, self._batch_params(groups))
            claim = await conn.execute(self._claim_sql, (queue, worker, limit, ttl_ms, request_id))
            rows = await done.fetchall()
            claimed = await claim.fetchall()
        verdicts, woken = self._verdicts(groups, rows)
        return verdicts, woken, [job_record(r) for r in claimed]

    async def fail(
        self,
        ref: JobRef,
        error: str,
        retry_delay: RetryDelay,
        *,
        final: bool = False,
        queue: str = "",
    ) -> Failed:
        async with self._db.connection() as conn, conn.transaction():
            cur = await conn.execute(self._lock_sql, (ref.id,))
            row = await cur.fetchone()
            record = job_record(row) if row is not None else None
            now = int(row[18]) if row is not None else 0
            delay = retry_delay(record.attempts) if record is not None else 0
            new, outcome = jobs.fail(record, ref, error, delay, now, final=final, queue=queue)
            if new is not record:
                await self._store_all(conn, new)
                if new.state is JobState.DEAD and new.ordering_key:
                    await conn.execute(self._promote_sql, (new.queue, new.ordering_key))
        return outcome

    async def release(self, refs: Sequence[JobRef], queue: str = "") -> set[str]:
        ids, tokens = _ids_tokens(refs)
        row = await self._db.fetchone(self._release_sql, (ids, tokens, queue))
        lost = _stale(row)
        if lost is not None:
            raise lost
        assert row is not None
        return set(row[3] or ())

    async def reap(self, limit: int) -> int:
        row = await self._db.fetchone(self._reap_sql, (limit,))
        return int(row[0]) if row is not None else 0

    async def prune(
        self, succeeded_older_than_ms: int | None, dead_older_than_ms: int | None, limit: int
    ) -> int:
        row = await self._db.fetchone(
            self._prune_sql, (succeeded_older_than_ms, dead_older_than_ms, limit)
        )
        return int(row[0]) if row is not None else 0

    async def stats(self, queue: str, window_ms: int) -> list[QueueCounts]:
        async with self._db.connection() as conn:
            cur = await conn.execute(self._stats_sql, (queue, window_ms))
            rows = await cur.fetchall()
        return [
            QueueCounts(
                queue=r[0],
                ready=int(r[1]),
                scheduled=int(r[2]),
                waiting=int(r[3]),
                running=int(r[4]),
                expired=int(r[5]),
                succeeded=int(r[6]),
                dead=int(r[7]),
                cancelled=int(r[12]),
                oldest_ready_age_ms=max(0, int(r[8])),
                retrying=int(r[9]),
                finished_in_window=int(r[10]),
                attempts_in_window=int(r[11]),
                window_ms=window_ms,
            )
            for r in rows
        ]

    async def get(self, job_id: int) -> JobRecord | None:
        row = await self._db.fetchone(self._get_sql, (job_id,))
        return job_record(row) if row is not None else None

    async def history(self, job_id: int) -> list[JobAttempt]:
        # Written by the trigger of 0026_job_attempts.sql on every change of a claim.
        return [attempt_record(r) for r in await self._db.fetchall(self._history_sql, (job_id,))]

    async def list_jobs(
        self, queue: str, state: JobState | None, after_id: int, limit: int
    ) -> list[JobRecord]:
        name = state.value if state is not None else ""
        params = {"queue": queue, "state": name, "after": after_id, "limit": limit}
        async with self._db.connection() as conn:
            cur = await conn.execute(self._list_sql, params)
            rows = await cur.fetchall()
        return [jobs.listed(job_record(r), int(r[18])) for r in rows]

    async def _store_all(self, conn: Any, new: JobRecord) -> JobRecord:
        params = (
            new.state.value,
            new.attempts,
            new.max_attempts,
            new.token,
            new.available_at_ms,
            new.lease_owner,
            new.state.value,
            new.last_error,
            new.finished_at_ms,
            new.finished_at_ms,
            new.id,
        )
        cur = await conn.execute(self._store_all_sql, params)
        row = await cur.fetchone()
        assert row is not None  # the row is locked by the caller's transaction
        return job_record(row)

    async def _locked(self, conn: Any, job_id: int, queue: str) -> tuple[JobRecord | None, int]:
        cur = await conn.execute(self._lock_sql, (job_id,))
        row = await cur.fetchone()
        if row is None or (queue and row[1] != queue):
            return None, 0
        return job_record(row), int(row[18])

    async def cancel(self, job_id: int, queue: str, reason: str) -> Administered | None:
        async with self._db.connection() as conn, conn.transaction():
            record, now = await self._locked(conn, job_id, queue)
            if record is None:
                return None
            token = 0
            if record.state is JobState.RUNNING:
                cur = await conn.execute(self._next_token_sql)
                row = await cur.fetchone()
                assert row is not None
                # The sequence may be behind the job's token (claims that took the clock
                # floor, a server without it): pass the job's token, as its trigger makes
                # a claim do; with the floor the trigger raises it further.
                token = max(int(row[0]), record.token + 1)
            new = jobs.cancel(record, int(token), reason, now)
            if new is None:
                return jobs.administered(record, None)
            stored = await self._store_all(conn, new)
            if new.ordering_key:
                await conn.execute(self._promote_sql, (new.queue, new.ordering_key))
        return jobs.administered(record, stored)

    async def retoken(self, ref: JobRef, token: int) -> JobRecord:
        async with self._db.connection() as conn, conn.transaction():
            record, _ = await self._locked(conn, ref.id, "")
            # 0021_job_resources.sql: no token floor and no event for a job naming its
            # own resource (its lease took the floor and logged the claim).
            return await self._store_all(conn, jobs.retoken(record, ref, token))

    async def put_back(self, ref: JobRef, delay_ms: int) -> None:
        async with self._db.connection() as conn, conn.transaction():
            record, now = await self._locked(conn, ref.id, "")
            await self._store_all(conn, jobs.release(record, ref, now, delay_ms=delay_ms))

    async def _retry(self, conn: Any, record: JobRecord, now: int) -> JobRecord | None:
        blocked = False
        if record.ordering_key:
            # The key's lock, as an enqueue takes it: no promotion is missed in between.
            await conn.execute(self._lock_key_sql, (record.queue, record.ordering_key))
            cur = await conn.execute(
                self._key_live_sql, (record.queue, record.ordering_key, record.id)
            )
            (blocked,) = await cur.fetchone()
        new = jobs.retry(record, bool(blocked), now)
        return None if new is None else await self._store_all(conn, new)

    async def retry(self, job_id: int, queue: str) -> Administered | None:
        async with self._db.connection() as conn, conn.transaction():
            record, now = await self._locked(conn, job_id, queue)
            if record is None:
                return None
            stored = await self._retry(conn, record, now)
        return jobs.administered(record, stored)

    async def requeue_dead(self, queue: str, limit: int) -> int:
        done = 0
        async with self._db.connection() as conn, conn.transaction():
            cur = await conn.execute(self._lock_dead_sql, (queue, limit))
            for row in await cur.fetchall():
                done += await self._retry(conn, job_record(row), int(row[18])) is not None
        return done

    async def last_claim_token(self, resource: str) -> int:
        queue, job_id = jobs.parse_default_resource(resource) or ("", 0)
        row = await self._db.fetchone(self._last_token_sql, (resource, job_id, queue))
        return int(row[0]) if row is not None and row[0] is not None else 0

    async def put_schedule(self, schedule: Schedule) -> ScheduleRecord:
        row = await self._db.fetchone(self._put_schedule_sql, schedule_params(schedule))
        assert row is not None
        return schedule_record(row)

    async def delete_schedule(self, name: str, queue: str = "") -> bool:
        async with self._db.connection() as conn:
            cur = await conn.execute(self._delete_schedule_sql, (name, queue, queue))
            return cur.rowcount > 0

    async def list_schedules(self) -> tuple[int, list[ScheduleRecord]]:
        async with self._db.connection() as conn:
            now = await (await conn.execute(self._now_sql)).fetchone()
            rows = await (await conn.execute(self._schedules_sql)).fetchall()
        assert now is not None
        return int(now[0]), [schedule_record(r) for r in rows]

    async def enqueue_periods(self, name: str, periods: Sequence[PeriodJob]) -> list[Enqueued]:
        if not periods:
            return []
        specs = [job for _, job in periods]
        # The jobs first, then the bookkeeping (which takes the schedule's row lock): two
        # schedulers on one period each insert before either waits, and the unique key
        # alone decides which insert adds the job.
        async with self._db.connection() as conn, conn.transaction():
            row = await (await conn.execute(self._schedule_queue_sql, (name,))).fetchone()
            if row is None:
                return []
            cur = await conn.execute(self._enqueue_sql, self._enqueue_params(str(row[0]), specs))
            enqueued = _enqueued(await cur.fetchall())
            latest, job_id = max(
                zip((p for p, _ in periods), (e.id for e in enqueued), strict=True)
            )
            await conn.execute(self._schedule_period_sql, (latest, job_id, name, latest))
        return enqueued


def _enqueued(rows: Sequence[Sequence[Any]]) -> list[Enqueued]:
    return [Enqueued(int(r[0]), bool(r[1]), JobState(r[2])) for r in rows]


def _timestamp(ms: int) -> datetime | None:
    return datetime.fromtimestamp(ms / 1000, tz=UTC) if ms > 0 else None
