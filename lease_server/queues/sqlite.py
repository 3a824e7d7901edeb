"""SQLite queue backend: the embedded default, durable on one host.

Jobs live in their own file (beside the lease database: ``leases.db`` ->
``leases-queue.db``), so queue traffic does not contend with leases for SQLite's
single write lock. Each call is one ``BEGIN IMMEDIATE`` transaction that selects
rows with the named statements of ``sql/sqlite.sql``, applies the pure rules of
:mod:`lease_server.jobs`, and writes the rows back; tokens come from a counter row
that is never reset. Time is this host's wall clock in milliseconds (expiries are
stored, and must mean the same after a restart).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fencing._sqlite import SQLiteDatabase
from lease_server import jobs
from lease_server.clock import Clock, SystemClock
from lease_server.jobs import Enqueued, Failed, JobRecord, JobRef, JobState, NewJob, QueueCounts
from lease_server.queues.base import RetryDelay
from lease_server.queues.sql import load

SQL = load("sqlite.sql")
MIGRATIONS = [SQL["migration_1"]]


def _record(row: Sequence[Any]) -> JobRecord:
    return JobRecord(
        id=int(row[0]),
        queue=row[1],
        payload=bytes(row[2]),
        state=JobState(row[3]),
        resource=row[4],
        ordering_key=row[5],
        idempotency_key=row[6] or "",
        priority=int(row[7]),
        attempts=int(row[8]),
        max_attempts=int(row[9]),
        token=int(row[10]),
        available_at_ms=int(row[11]),
        lease_owner=row[12],
        lease_until_ms=int(row[13]),
        last_error=row[14],
        created_at_ms=int(row[15]),
        finished_at_ms=int(row[16]),
    )


def _load(conn: sqlite3.Connection, job_id: int) -> JobRecord | None:
    row = conn.execute(SQL["select_job"], (job_id,)).fetchone()
    return _record(row) if row else None


def _store(conn: sqlite3.Connection, r: JobRecord) -> None:
    conn.execute(
        SQL["update_job"],
        (
            r.state.value,
            r.attempts,
            r.token,
            r.available_at_ms,
            r.lease_owner,
            r.lease_until_ms,
            r.last_error,
            r.finished_at_ms,
            r.id,
        ),
    )


def _promote(conn: sqlite3.Connection, queue: str, key: str) -> bool:
    """Make the head of ``key`` ready if it is waiting (after a job of the key finished)."""
    if not key:
        return False
    row = conn.execute(SQL["select_head_of_key"], (queue, key)).fetchone()
    if row is not None and row[3] == JobState.WAITING.value:
        _store(conn, jobs.promote(_record(row)))
        return True
    return False


class SQLiteQueue:
    """Jobs in one SQLite file (``sqlite:///path/to/queue.db``)."""

    name = "sqlite"

    def __init__(self, path: str | Path, clock: Clock | None = None) -> None:
        self._db = SQLiteDatabase(path, MIGRATIONS)
        self._clock = clock or SystemClock()

    @property
    def path(self) -> str:
        return self._db.path

    async def open(self) -> None:
        await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    async def enqueue(self, queue: str, specs: Sequence[NewJob]) -> list[Enqueued]:
        def tx(conn: sqlite3.Connection) -> list[Enqueued]:
            now = self._clock.now_ms()
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

        return await self._db.transaction(tx)

    async def claim(self, queue: str, worker: str, limit: int, ttl_ms: int) -> list[JobRecord]:
        def tx(conn: sqlite3.Connection) -> list[JobRecord]:
            now = self._clock.now_ms()
            picked = [
                _record(row)
                for row in conn.execute(SQL["select_rescuable"], (queue, now, limit)).fetchall()
            ]
            if len(picked) < limit:
                picked += [
                    _record(row)
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
                _store(conn, new)
                claimed.append(new)
            return claimed

        return await self._db.transaction(tx)

    async def heartbeat(self, refs: Sequence[JobRef], ttl_ms: int, queue: str = "") -> None:
        def tx(conn: sqlite3.Connection) -> None:
            now = self._clock.now_ms()
            # Judge every ref before writing any: all or nothing (the rollback covers us too).
            updated = [jobs.heartbeat(_load(conn, ref.id), ref, ttl_ms, now, queue) for ref in refs]
            for record in updated:
                _store(conn, record)

        await self._db.transaction(tx)

    async def complete(self, refs: Sequence[JobRef], queue: str = "") -> set[str]:
        def tx(conn: sqlite3.Connection) -> set[str]:
            now = self._clock.now_ms()
            updated = [jobs.complete(_load(conn, ref.id), ref, now, queue) for ref in refs]
            for record in updated:
                _store(conn, record)
            return {r.queue for r in updated if _promote(conn, r.queue, r.ordering_key)}

        return await self._db.transaction(tx)

    async def fail(
        self,
        ref: JobRef,
        error: str,
        retry_delay: RetryDelay,
        *,
        final: bool = False,
        queue: str = "",
    ) -> Failed:
        def tx(conn: sqlite3.Connection) -> Failed:
            now = self._clock.now_ms()
            record = _load(conn, ref.id)
            delay = retry_delay(record.attempts) if record is not None else 0
            new, outcome = jobs.fail(record, ref, error, delay, now, final=final, queue=queue)
            if new is not record:
                _store(conn, new)
                if new.state is JobState.DEAD:
                    _promote(conn, new.queue, new.ordering_key)
            return outcome

        return await self._db.transaction(tx)

    async def release(self, refs: Sequence[JobRef], queue: str = "") -> set[str]:
        def tx(conn: sqlite3.Connection) -> set[str]:
            now = self._clock.now_ms()
            updated = [jobs.release(_load(conn, ref.id), ref, now, queue) for ref in refs]
            for record in updated:
                _store(conn, record)
            return {r.queue for r in updated}

        return await self._db.transaction(tx)

    async def reap(self, limit: int) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            now = self._clock.now_ms()
            victims = [_record(row) for row in conn.execute(SQL["select_reapable"], (now, limit))]
            for record in victims:
                _store(conn, jobs.reap(record, now))
                _promote(conn, record.queue, record.ordering_key)
            return len(victims)

        return await self._db.transaction(tx)

    async def prune(
        self, succeeded_older_than_ms: int | None, dead_older_than_ms: int | None, limit: int
    ) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            now = self._clock.now_ms()
            deleted = 0
            for state, older_than in (
                (JobState.SUCCEEDED, succeeded_older_than_ms),
                (JobState.DEAD, dead_older_than_ms),
            ):
                if older_than is not None and deleted < limit:
                    cur = conn.execute(
                        SQL["prune"], (state.value, now - older_than, limit - deleted)
                    )
                    deleted += int(cur.rowcount)
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
                    oldest_ready_age_ms=0 if row[8] is None else max(0, now - int(row[8])),
                    retrying=int(row[9] or 0),
                    finished_in_window=int(row[10] or 0),
                    attempts_in_window=int(row[11] or 0),
                    window_ms=window_ms,
                )
                for row in rows
            ]

        return await self._db.query(q)

    async def get(self, job_id: int) -> JobRecord | None:
        return await self._db.query(lambda conn: _load(conn, job_id))
