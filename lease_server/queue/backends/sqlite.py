"""SQLite queue backend: the embedded default, durable on one host.

Jobs live in their own file (beside the lease database: ``leases.db`` ->
``leases-queue.db``), so queue traffic does not contend with leases for SQLite's
single write lock. Each call is one ``BEGIN IMMEDIATE`` transaction that selects
rows with the named statements of ``sql/sqlite.sql``, applies the pure rules of
:mod:`lease_server.queue.jobs`, and writes the rows back (with each job's attempts,
``jobs.attempt_changes``, in the table ``job_attempts`` of schema v7); tokens come from a
counter row that is never reset. Time is this host's wall clock in milliseconds (expiries are
stored, and must mean the same after a restart).

Linked to the SQLite lease backend (:meth:`SQLiteQueue.log_events_to`, as the lease
server does), the queue attaches the lease database file and appends the events of
every claim change (``jobs.transitions``) to its event log in the same transaction as
the change: ``BEGIN IMMEDIATE`` then takes the write lock of both files, so queue
calls and lease calls commit one at a time. In WAL mode SQLite commits a transaction
over two files atomically in each file, not across both: only a crash of the host in
the middle of such a commit can keep a claim without its event (a guard in ``watch``
mode then learns of that rescue at the job's next event or the rescuer's first write).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from fencing import limits
from fencing.errors import LeaseLost
from lease_server.backends.base import LeaseBackend
from lease_server.backends.sqlite import SQLiteBackend
from lease_server.clock import Clock, SystemClock
from lease_server.leases import Transition
from lease_server.queue import jobs
from lease_server.queue.backends.base import CompleteGroup, PeriodJob, RetryDelay
from lease_server.queue.backends.sql import (
    attempt_record,
    job_record,
    load,
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
from serving.sqlite_db import SQLiteDatabase

T = TypeVar("T")

SQL = load("sqlite.sql")
MIGRATIONS = [SQL[f"migration_{n}"] for n in range(1, 8)]
#: The name the lease database is attached under, when job events are logged.
LOG_SCHEMA = "lease_log"


def _load(conn: sqlite3.Connection, job_id: int) -> JobRecord | None:
    row = conn.execute(SQL["select_job"], (job_id,)).fetchone()
    return job_record(row) if row else None


def _store(conn: sqlite3.Connection, r: JobRecord) -> None:
    conn.execute(
        SQL["update_job"],
        (
            r.state.value,
            r.attempts,
            r.max_attempts,
            r.token,
            r.available_at_ms,
            r.lease_owner,
            r.lease_until_ms,
            r.last_error,
            r.finished_at_ms,
            r.claimed_at_ms,
            r.id,
        ),
    )


def _attempt_params(a: JobAttempt) -> tuple[object, ...]:
    return (a.attempt, a.started_at_ms, a.worker, a.token, a.outcome.value, a.ended_at_ms, a.error)


def _record_attempts(
    conn: sqlite3.Connection, old: JobRecord | None, new: JobRecord, now_ms: int
) -> None:
    """Write what ``old`` -> ``new`` does to the job's attempts (``jobs.apply_attempts``
    in SQL: the running one replaced, or added when none runs; a new one added; the
    newest ``limits.MAX_JOB_ATTEMPTS_KEPT`` kept)."""
    change = jobs.attempt_changes(old, new, now_ms)
    if change.current is not None:
        params = _attempt_params(change.current)
        if conn.execute(SQL["replace_running_attempt"], (*params, new.id)).rowcount == 0:
            conn.execute(SQL["insert_attempt"], (new.id, *params))
    if change.started is not None:
        conn.execute(SQL["insert_attempt"], (new.id, *_attempt_params(change.started)))
    if change:
        conn.execute(SQL["trim_attempts"], (new.id, new.id, limits.MAX_JOB_ATTEMPTS_KEPT))


def _change(
    conn: sqlite3.Connection,
    changes: list[Transition],
    old: JobRecord | None,
    new: JobRecord,
    now_ms: int,
) -> None:
    """Store ``new`` in place of ``old`` with its attempts, and collect its events for the
    log."""
    _store(conn, new)
    _record_attempts(conn, old, new, now_ms)
    changes += jobs.transitions(old, new, now_ms)


def _append_events(conn: sqlite3.Connection, changes: Sequence[Transition]) -> int:
    """Number ``changes`` from the attached lease log's head and insert them, inside the
    caller's write transaction (which holds that file's write lock: revisions commit in
    order, as the lease backend's own appends do). Returns the new head (0: none)."""
    if not changes:
        return 0
    (head,) = conn.execute(SQL["log_head"]).fetchone()
    events = [change.numbered(int(head) + i) for i, change in enumerate(changes, start=1)]
    conn.executemany(
        SQL["log_append"],
        [
            (e.revision, e.kind.value, e.resource, e.token, e.holder, e.ttl_ms, e.job_id, e.queue)
            for e in events
        ],
    )
    conn.execute(SQL["log_set_head"], (events[-1].revision,))
    return events[-1].revision


def _promote(conn: sqlite3.Connection, queue: str, key: str) -> bool:
    """Make the head of ``key`` ready if it is waiting (after a job of the key finished)."""
    if not key:
        return False
    row = conn.execute(SQL["select_head_of_key"], (queue, key)).fetchone()
    if row is not None and row[3] == JobState.WAITING.value:
        _store(conn, jobs.promote(job_record(row)))
        return True
    return False


def _enqueue(
    conn: sqlite3.Connection, queue: str, specs: Sequence[NewJob], now: int
) -> list[Enqueued]:
    """Add ``specs`` to ``queue`` inside the caller's write transaction (see enqueue)."""
    out: list[Enqueued] = []
    for spec in specs:
        if spec.idempotency_key:
            row = conn.execute(
                SQL["select_by_idempotency_key"], (queue, spec.idempotency_key)
            ).fetchone()
            if row is not None:
                out.append(Enqueued(int(row[0]), False, JobState(row[1])))
                continue
        blocked = bool(spec.ordering_key) and (
            conn.execute(SQL["select_head_of_key"], (queue, spec.ordering_key)).fetchone()
            is not None
        )
        record = jobs.new_job(0, queue, spec, blocked, now)
        (job_id,) = conn.execute(
            SQL["insert_job"],
            (
                queue,
                record.payload,
                record.state.value,
                record.resource,
                record.ordering_key,
                record.idempotency_key or None,
                record.priority,
                record.max_attempts,
                record.available_at_ms,
                record.created_at_ms,
            ),
        ).fetchone()
        out.append(Enqueued(int(job_id), True, record.state))
    return out


class SQLiteQueue:
    """Jobs in one SQLite file (``sqlite:///path/to/queue.db``)."""

    name = "sqlite"

    def __init__(self, path: str | Path, clock: Clock | None = None) -> None:
        self._db = SQLiteDatabase(path, MIGRATIONS)
        self._clock = clock or SystemClock()
        self._log: SQLiteBackend | None = None

    @property
    def path(self) -> str:
        return self._db.path

    def log_events_to(self, backend: LeaseBackend) -> bool:
        if not isinstance(backend, SQLiteBackend) or ":memory:" in (backend.path, self.path):
            return False  # a private in-memory database cannot be attached
        self._log = backend
        return True

    def on_enqueued(self, callback: Callable[[str], None]) -> None:
        """Only this process enqueues here, and the service wakes its own claims."""

    async def open(self) -> None:
        await self._db.open()
        if self._log is not None:
            path = self._log.path

            def attach(conn: sqlite3.Connection) -> None:
                names = {row[1] for row in conn.execute("PRAGMA database_list")}
                if LOG_SCHEMA not in names:
                    conn.execute(f"ATTACH DATABASE ? AS {LOG_SCHEMA}", (path,))

            await self._db.query(attach)

    async def _logged(self, fn: Callable[[sqlite3.Connection, list[Transition]], T]) -> T:
        """Run ``fn(conn, changes)`` in a write transaction that also appends the events
        ``fn`` collected in ``changes`` to the lease log (when linked); tell its listeners."""
        log = self._log

        def tx(conn: sqlite3.Connection) -> tuple[T, int]:
            changes: list[Transition] = []
            result = fn(conn, changes)
            return result, _append_events(conn, changes) if log is not None else 0

        result, head = await self._db.transaction(tx)
        if head and log is not None:
            log.appended(head)
        return result

    async def close(self) -> None:
        await self._db.close()

    async def enqueue(self, queue: str, specs: Sequence[NewJob]) -> list[Enqueued]:
        def tx(conn: sqlite3.Connection) -> list[Enqueued]:
            return _enqueue(conn, queue, specs, self._clock.now_ms())

        return await self._db.transaction(tx)

    async def set_paused(self, queue: str, paused: bool) -> bool:
        now = self._clock.now_ms()

        def tx(conn: sqlite3.Connection) -> bool:
            if paused:
                return conn.execute(SQL["pause_queue"], (queue, now)).rowcount > 0
            return conn.execute(SQL["resume_queue"], (queue,)).rowcount > 0

        return await self._db.transaction(tx)

    async def paused(self) -> set[str]:
        def read(conn: sqlite3.Connection) -> set[str]:
            return {str(r[0]) for r in conn.execute(SQL["select_paused_all"])}

        return await self._db.query(read)

    async def claim(
        self, queue: str, worker: str, limit: int, ttl_ms: int, request_id: str = ""
    ) -> list[JobRecord]:
        def tx(conn: sqlite3.Connection, changes: list[Transition]) -> list[JobRecord]:
            return self._claim(conn, changes, queue, worker, limit, ttl_ms, request_id)

        return await self._logged(tx)

    def _claim(
        self,
        conn: sqlite3.Connection,
        changes: list[Transition],
        queue: str,
        worker: str,
        limit: int,
        ttl_ms: int,
        request_id: str,
    ) -> list[JobRecord]:
        now = self._clock.now_ms()
        if request_id:
            found = [
                job_record(row)
                for row in conn.execute(SQL["select_claim_replay"], (queue, request_id))
            ]
            replayed = [jobs.replay(r, ttl_ms, now) for r in found if jobs.replays(r, worker)]
            if replayed:
                for record in replayed:
                    _store(conn, record)  # a heartbeat's change: nothing to log
                return replayed
        if conn.execute(SQL["select_paused"], (queue,)).fetchone() is not None:
            return []
        picked = [
            job_record(row)
            for row in conn.execute(SQL["select_rescuable"], (queue, now, limit)).fetchall()
        ]
        if len(picked) < limit:
            picked += [
                job_record(row)
                for row in conn.execute(
                    SQL["select_ready"], (queue, now, limit - len(picked))
                ).fetchall()
            ]
        if not picked:
            return []
        (last,) = conn.execute(SQL["take_tokens"], (len(picked),)).fetchone()
        first = int(last) - len(picked) + 1
        claimed = []
        for offset, record in enumerate(picked):
            new = jobs.claim(record, worker, ttl_ms, first + offset, now)
            _change(conn, changes, record, new, now)
            claimed.append(new)
        conn.executemany(SQL["set_claim_request"], [(request_id, r.id) for r in claimed])
        return claimed

    async def heartbeat(self, refs: Sequence[JobRef], ttl_ms: int, queue: str = "") -> None:
        def tx(conn: sqlite3.Connection) -> None:
            now = self._clock.now_ms()
            # Judge every ref before writing any: all or nothing (the rollback covers us too).
            updated = [jobs.heartbeat(_load(conn, ref.id), ref, ttl_ms, now, queue) for ref in refs]
            for record in updated:
                _store(conn, record)

        await self._db.transaction(tx)

    async def complete(self, refs: Sequence[JobRef], queue: str = "") -> set[str]:
        def tx(conn: sqlite3.Connection, changes: list[Transition]) -> set[str]:
            now = self._clock.now_ms()
            updated = [jobs.complete(_load(conn, ref.id), ref, now, queue) for ref in refs]
            for record in updated:
                # Against the row as stored now (a job named twice changes once).
                _change(conn, changes, _load(conn, record.id), record, now)
            return {r.queue for r in updated if _promote(conn, r.queue, r.ordering_key)}

        return await self._logged(tx)

    async def complete_batch(
        self, groups: Sequence[CompleteGroup]
    ) -> tuple[list[LeaseLost | None], set[str]]:
        def tx(
            conn: sqlite3.Connection, changes: list[Transition]
        ) -> tuple[list[LeaseLost | None], set[str]]:
            return self._complete_groups(conn, changes, groups)

        return await self._logged(tx)

    def _complete_groups(
        self, conn: sqlite3.Connection, changes: list[Transition], groups: Sequence[CompleteGroup]
    ) -> tuple[list[LeaseLost | None], set[str]]:
        now = self._clock.now_ms()
        verdicts: list[LeaseLost | None] = []
        woken: set[str] = set()
        for refs, queue in groups:
            try:  # judge the whole group before writing any of it
                updated = [jobs.complete(_load(conn, ref.id), ref, now, queue) for ref in refs]
            except LeaseLost as exc:
                verdicts.append(exc)
                continue
            for record in updated:
                _change(conn, changes, _load(conn, record.id), record, now)
            woken |= {r.queue for r in updated if _promote(conn, r.queue, r.ordering_key)}
            verdicts.append(None)
        return verdicts, woken

    async def complete_and_claim(
        self,
        groups: Sequence[CompleteGroup],
        queue: str,
        worker: str,
        limit: int,
        ttl_ms: int,
        request_id: str = "",
    ) -> tuple[list[LeaseLost | None], set[str], list[JobRecord]]:
        def tx(
            conn: sqlite3.Connection, changes: list[Transition]
        ) -> tuple[list[LeaseLost | None], set[str], list[JobRecord]]:
            verdicts, woken = self._complete_groups(conn, changes, groups)
            claimed = self._claim(conn, changes, queue, worker, limit, ttl_ms, request_id)
            return verdicts, woken, claimed

        return await self._logged(tx)

    async def fail(
        self,
        ref: JobRef,
        error: str,
        retry_delay: RetryDelay,
        *,
        final: bool = False,
        queue: str = "",
    ) -> Failed:
        def tx(conn: sqlite3.Connection, changes: list[Transition]) -> Failed:
            now = self._clock.now_ms()
            record = _load(conn, ref.id)
            delay = retry_delay(record.attempts) if record is not None else 0
            new, outcome = jobs.fail(record, ref, error, delay, now, final=final, queue=queue)
            if new is not record:
                _change(conn, changes, record, new, now)
                if new.state is JobState.DEAD:
                    _promote(conn, new.queue, new.ordering_key)
            return outcome

        return await self._logged(tx)

    async def release(self, refs: Sequence[JobRef], queue: str = "") -> set[str]:
        def tx(conn: sqlite3.Connection, changes: list[Transition]) -> set[str]:
            now = self._clock.now_ms()
            updated = [jobs.release(_load(conn, ref.id), ref, now, queue) for ref in refs]
            for record in updated:
                _change(conn, changes, _load(conn, record.id), record, now)
            return {r.queue for r in updated}

        return await self._logged(tx)

    async def retoken(self, ref: JobRef, token: int) -> JobRecord:
        def tx(conn: sqlite3.Connection) -> JobRecord:
            old = _load(conn, ref.id)
            new = jobs.retoken(old, ref, token)
            _store(conn, new)  # a job naming its own resource: its lease logged the claim
            _record_attempts(conn, old, new, self._clock.now_ms())
            return new

        return await self._db.transaction(tx)

    async def put_back(self, ref: JobRef, delay_ms: int) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            now = self._clock.now_ms()
            old = _load(conn, ref.id)
            new = jobs.release(old, ref, now, delay_ms=delay_ms)
            _store(conn, new)  # a job naming its own resource: its lease logs the end
            _record_attempts(conn, old, new, now)

        await self._db.transaction(tx)

    async def reap(self, limit: int) -> int:
        def tx(conn: sqlite3.Connection, changes: list[Transition]) -> int:
            now = self._clock.now_ms()
            victims = [
                job_record(row) for row in conn.execute(SQL["select_reapable"], (now, limit))
            ]
            for record in victims:
                _change(conn, changes, record, jobs.reap(record, now), now)
                _promote(conn, record.queue, record.ordering_key)
            return len(victims)

        return await self._logged(tx)

    async def prune(
        self, succeeded_older_than_ms: int | None, dead_older_than_ms: int | None, limit: int
    ) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            now = self._clock.now_ms()
            deleted = 0
            for state, older_than in (
                (JobState.SUCCEEDED, succeeded_older_than_ms),
                (JobState.DEAD, dead_older_than_ms),
                (JobState.CANCELLED, dead_older_than_ms),
            ):
                if older_than is not None and deleted < limit:
                    ids = conn.execute(
                        SQL["prune"], (state.value, now - older_than, limit - deleted)
                    ).fetchall()
                    conn.executemany(SQL["delete_attempts"], ids)
                    deleted += len(ids)
            return deleted

        return await self._db.transaction(tx)

    async def stats(self, queue: str, window_ms: int) -> list[QueueCounts]:
        def q(conn: sqlite3.Connection) -> list[QueueCounts]:
            now = self._clock.now_ms()
            rows = conn.execute(
                SQL["stats"], {"now": now, "since": now - window_ms, "queue": queue}
            ).fetchall()
            return [
                jobs.QueueCounts(
                    queue=row[0],
                    ready=int(row[1] or 0),
                    scheduled=int(row[2] or 0),
                    waiting=int(row[3] or 0),
                    running=int(row[4] or 0),
                    expired=int(row[5] or 0),
                    succeeded=int(row[6] or 0),
                    dead=int(row[7] or 0),
                    cancelled=int(row[8] or 0),
                    oldest_ready_age_ms=0 if row[9] is None else max(0, now - int(row[9])),
                    retrying=int(row[10] or 0),
                    finished_in_window=int(row[11] or 0),
                    attempts_in_window=int(row[12] or 0),
                    window_ms=window_ms,
                )
                for row in rows
            ]

        return await self._db.query(q)

    async def get(self, job_id: int) -> JobRecord | None:
        return await self._db.query(lambda conn: _load(conn, job_id))

    async def history(self, job_id: int) -> list[JobAttempt]:
        def q(conn: sqlite3.Connection) -> list[JobAttempt]:
            return [attempt_record(row) for row in conn.execute(SQL["select_attempts"], (job_id,))]

        return await self._db.query(q)

    async def list_jobs(
        self, queue: str, state: JobState | None, after_id: int, limit: int
    ) -> list[JobRecord]:
        params = {
            "queue": queue,
            "state": state.value if state is not None else "",
            "after": after_id,
            "limit": limit,
        }

        def q(conn: sqlite3.Connection) -> list[JobRecord]:
            now = self._clock.now_ms()
            rows = conn.execute(SQL["list_jobs"], {**params, "now": now})
            return [jobs.listed(job_record(row), now) for row in rows]

        return await self._db.query(q)

    async def cancel(self, job_id: int, queue: str, reason: str) -> Administered | None:
        def tx(conn: sqlite3.Connection, changes: list[Transition]) -> Administered | None:
            now = self._clock.now_ms()
            record = _load(conn, job_id)
            if record is None or (queue and record.queue != queue):
                return None
            token = 0
            if record.state is JobState.RUNNING:
                (token,) = conn.execute(SQL["take_tokens"], (1,)).fetchone()
            new = jobs.cancel(record, int(token), reason, now)
            if new is not None:
                _change(conn, changes, record, new, now)
                _promote(conn, new.queue, new.ordering_key)
            return jobs.administered(record, new)

        return await self._logged(tx)

    def _retry(self, conn: sqlite3.Connection, record: JobRecord, now: int) -> JobRecord | None:
        blocked = False
        if record.ordering_key:
            head = conn.execute(
                SQL["select_head_of_key"], (record.queue, record.ordering_key)
            ).fetchone()
            blocked = head is not None and int(head[0]) != record.id
        new = jobs.retry(record, blocked, now)
        if new is not None:
            _store(conn, new)  # not a claim change: nothing to log
        return new

    async def retry(self, job_id: int, queue: str) -> Administered | None:
        def tx(conn: sqlite3.Connection) -> Administered | None:
            record = _load(conn, job_id)
            if record is None or (queue and record.queue != queue):
                return None
            return jobs.administered(record, self._retry(conn, record, self._clock.now_ms()))

        return await self._db.transaction(tx)

    async def requeue_dead(self, queue: str, limit: int) -> int:
        params = {"queue": queue, "state": JobState.DEAD.value, "after": 0, "limit": limit}

        def tx(conn: sqlite3.Connection) -> int:
            now = self._clock.now_ms()
            rows = conn.execute(SQL["list_jobs"], {**params, "now": now}).fetchall()
            dead = [job_record(row) for row in rows]
            return sum(self._retry(conn, record, now) is not None for record in dead)

        return await self._db.transaction(tx)

    async def last_claim_token(self, resource: str) -> int:
        named = jobs.parse_default_resource(resource)

        def q(conn: sqlite3.Connection) -> int:
            (own,) = conn.execute(SQL["last_token_of_resource"], (resource,)).fetchone()
            by_id = 0
            if named is not None:
                row = conn.execute(
                    SQL["token_of_default_resource"], (named[1], named[0])
                ).fetchone()
                by_id = int(row[0]) if row else 0
            return max(int(own or 0), by_id)

        return await self._db.query(q)

    async def put_schedule(self, schedule: Schedule) -> ScheduleRecord:
        def tx(conn: sqlite3.Connection) -> ScheduleRecord:
            params = (*schedule_params(schedule), self._clock.now_ms())
            return schedule_record(conn.execute(SQL["put_schedule"], params).fetchone())

        return await self._db.transaction(tx)

    async def delete_schedule(self, name: str, queue: str = "") -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            return int(conn.execute(SQL["delete_schedule"], (name, queue, queue)).rowcount) > 0

        return await self._db.transaction(tx)

    async def list_schedules(self) -> tuple[int, list[ScheduleRecord]]:
        def q(conn: sqlite3.Connection) -> tuple[int, list[ScheduleRecord]]:
            rows = conn.execute(SQL["select_schedules"]).fetchall()
            return self._clock.now_ms(), [schedule_record(r) for r in rows]

        return await self._db.query(q)

    async def enqueue_periods(self, name: str, periods: Sequence[PeriodJob]) -> list[Enqueued]:
        def tx(conn: sqlite3.Connection) -> list[Enqueued]:
            row = conn.execute(SQL["select_schedule"], (name,)).fetchone()
            if row is None or not periods:
                return []
            queue = schedule_record(row).schedule.queue
            enqueued = _enqueue(conn, queue, [job for _, job in periods], self._clock.now_ms())
            latest, job_id = max(
                zip((p for p, _ in periods), (e.id for e in enqueued), strict=True)
            )
            conn.execute(SQL["set_schedule_period"], (latest, job_id, name, latest))
            return enqueued

        return await self._db.transaction(tx)
