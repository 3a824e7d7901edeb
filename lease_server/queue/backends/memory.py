"""In-memory queue backend: the honest fake for unit tests (no durability).

Every call is atomic because it never awaits inside; the rules are the pure ones
of :mod:`lease_server.queue.jobs`, and the contract suite holds this fake to the same
behaviour as the durable backends. Linked to a :class:`MemoryBackend`
(:meth:`MemoryQueue.log_events_to`), it appends its job events to that backend's log
in the same atomic step as each change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from fencing.errors import LeaseLost
from lease_server.backends.base import LeaseBackend
from lease_server.backends.memory import MemoryBackend
from lease_server.clock import Clock, SystemClock
from lease_server.queue import jobs
from lease_server.queue.backends.base import CompleteGroup, PeriodJob, RetryDelay
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


class MemoryQueue:
    name = "memory"
    #: Read by ``--require-durable`` (see ``serving.server.require_durability``).
    durability_warning = "in-memory jobs are lost on restart"

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._jobs: dict[int, JobRecord] = {}
        self._keys: dict[tuple[str, str], int] = {}
        self._last_id = 0
        self._last_token = 0
        self._log: MemoryBackend | None = None
        self._schedules: dict[str, ScheduleRecord] = {}
        #: The request id of the Claim that made each job's current (or last) claim.
        self._claim_requests: dict[int, str] = {}
        self._paused: set[str] = set()
        #: Each job's attempts (jobs.attempt_changes), oldest first.
        self._attempts: dict[int, list[JobAttempt]] = {}

    def log_events_to(self, backend: LeaseBackend) -> bool:
        if isinstance(backend, MemoryBackend):
            self._log = backend
            return True
        return False

    def _put(self, records: Sequence[JobRecord], now_ms: int) -> None:
        """Store ``records``, their attempts and log what changed, in one step (nothing
        awaits)."""
        changes = []
        for record in records:
            old = self._jobs.get(record.id)
            changes += jobs.transitions(old, record, now_ms)
            attempts = jobs.attempt_changes(old, record, now_ms)
            if attempts:
                history = self._attempts.get(record.id, [])
                self._attempts[record.id] = jobs.apply_attempts(history, attempts)
            self._jobs[record.id] = record
        if changes and self._log is not None:
            self._log.append(changes)

    def on_enqueued(self, callback: Callable[[str], None]) -> None:
        """Only this process enqueues here, and the service wakes its own claims."""

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _live_of_key(self, queue: str, key: str) -> list[JobRecord]:
        return sorted(
            (
                r
                for r in self._jobs.values()
                if r.queue == queue and r.ordering_key == key and r.state in jobs.LIVE_STATES
            ),
            key=lambda r: r.id,
        )

    def _promote(self, queue: str, key: str) -> bool:
        if not key:
            return False
        live = self._live_of_key(queue, key)
        if live and live[0].state is JobState.WAITING:
            self._jobs[live[0].id] = jobs.promote(live[0])
            return True
        return False

    async def enqueue(self, queue: str, specs: Sequence[NewJob]) -> list[Enqueued]:
        now = self._clock.now_ms()
        out: list[Enqueued] = []
        for spec in specs:
            if spec.idempotency_key:
                existing = self._keys.get((queue, spec.idempotency_key))
                if existing is not None:
                    out.append(Enqueued(existing, False, self._jobs[existing].state))
                    continue
            blocked = bool(spec.ordering_key) and bool(self._live_of_key(queue, spec.ordering_key))
            self._last_id += 1
            record = jobs.new_job(self._last_id, queue, spec, blocked, now)
            self._jobs[record.id] = record
            if spec.idempotency_key:
                self._keys[(queue, spec.idempotency_key)] = record.id
            out.append(Enqueued(record.id, True, record.state))
        return out

    async def set_paused(self, queue: str, paused: bool) -> bool:
        changed = (queue in self._paused) != paused
        if paused:
            self._paused.add(queue)
        else:
            self._paused.discard(queue)
        return changed

    async def paused(self) -> set[str]:
        return set(self._paused)

    async def claim(
        self, queue: str, worker: str, limit: int, ttl_ms: int, request_id: str = ""
    ) -> list[JobRecord]:
        now = self._clock.now_ms()
        if request_id:
            replayed = [
                jobs.replay(r, ttl_ms, now)
                for job_id, r in sorted(self._jobs.items())
                if r.queue == queue
                and self._claim_requests.get(job_id) == request_id
                and jobs.replays(r, worker)
            ]
            if replayed:
                self._put(replayed, now)
                return replayed
        if queue in self._paused:
            return []
        candidates = sorted(
            (r for r in self._jobs.values() if r.queue == queue and jobs.claimable(r, now)),
            key=jobs.claim_order,
        )[:limit]
        claimed = []
        for record in candidates:
            self._last_token += 1
            claimed.append(jobs.claim(record, worker, ttl_ms, self._last_token, now))
            self._claim_requests[record.id] = request_id
        self._put(claimed, now)
        return claimed

    async def heartbeat(self, refs: Sequence[JobRef], ttl_ms: int, queue: str = "") -> None:
        now = self._clock.now_ms()
        updated = [jobs.heartbeat(self._jobs.get(ref.id), ref, ttl_ms, now, queue) for ref in refs]
        for record in updated:
            self._jobs[record.id] = record

    async def complete(self, refs: Sequence[JobRef], queue: str = "") -> set[str]:
        now = self._clock.now_ms()
        updated = [jobs.complete(self._jobs.get(ref.id), ref, now, queue) for ref in refs]
        self._put(updated, now)
        return {r.queue for r in updated if self._promote(r.queue, r.ordering_key)}

    async def complete_batch(
        self, groups: Sequence[CompleteGroup]
    ) -> tuple[list[LeaseLost | None], set[str]]:
        now = self._clock.now_ms()
        verdicts: list[LeaseLost | None] = []
        woken: set[str] = set()
        for refs, queue in groups:  # nothing awaits: the whole batch is one atomic step
            try:
                updated = [jobs.complete(self._jobs.get(ref.id), ref, now, queue) for ref in refs]
            except LeaseLost as exc:
                verdicts.append(exc)
                continue
            self._put(updated, now)
            woken |= {r.queue for r in updated if self._promote(r.queue, r.ordering_key)}
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
        verdicts, woken = await self.complete_batch(groups)
        return verdicts, woken, await self.claim(queue, worker, limit, ttl_ms, request_id)

    async def fail(
        self,
        ref: JobRef,
        error: str,
        retry_delay: RetryDelay,
        *,
        final: bool = False,
        queue: str = "",
    ) -> Failed:
        now = self._clock.now_ms()
        record = self._jobs.get(ref.id)
        delay = retry_delay(record.attempts) if record is not None else 0
        new, outcome = jobs.fail(record, ref, error, delay, now, final=final, queue=queue)
        self._put([new], now)
        if new.state is JobState.DEAD:
            self._promote(new.queue, new.ordering_key)
        return outcome

    async def release(self, refs: Sequence[JobRef], queue: str = "") -> set[str]:
        now = self._clock.now_ms()
        updated = [jobs.release(self._jobs.get(ref.id), ref, now, queue) for ref in refs]
        self._put(updated, now)
        return {r.queue for r in updated}

    async def retoken(self, ref: JobRef, token: int) -> JobRecord:
        now = self._clock.now_ms()
        new = jobs.retoken(self._jobs.get(ref.id), ref, token)
        self._put([new], now)
        return new

    async def put_back(self, ref: JobRef, delay_ms: int) -> None:
        now = self._clock.now_ms()
        self._put([jobs.release(self._jobs.get(ref.id), ref, now, delay_ms=delay_ms)], now)

    async def reap(self, limit: int) -> int:
        now = self._clock.now_ms()
        victims = sorted(
            (r for r in self._jobs.values() if jobs.reapable(r, now)), key=lambda r: r.id
        )[:limit]
        for record in victims:
            self._put([jobs.reap(record, now)], now)
            self._promote(record.queue, record.ordering_key)
        return len(victims)

    async def prune(
        self, succeeded_older_than_ms: int | None, dead_older_than_ms: int | None, limit: int
    ) -> int:
        now = self._clock.now_ms()
        succeeded_before = (
            None if succeeded_older_than_ms is None else now - succeeded_older_than_ms
        )
        dead_before = None if dead_older_than_ms is None else now - dead_older_than_ms
        victims = [
            r for r in self._jobs.values() if jobs.prunable(r, succeeded_before, dead_before)
        ][:limit]
        for record in victims:
            del self._jobs[record.id]
            self._claim_requests.pop(record.id, None)
            self._attempts.pop(record.id, None)
            if record.idempotency_key:
                self._keys.pop((record.queue, record.idempotency_key), None)
        return len(victims)

    async def stats(self, queue: str, window_ms: int) -> list[QueueCounts]:
        now = self._clock.now_ms()
        names = sorted({r.queue for r in self._jobs.values() if not queue or r.queue == queue})
        return [
            jobs.count(name, [r for r in self._jobs.values() if r.queue == name], now, window_ms)
            for name in names
        ]

    async def get(self, job_id: int) -> JobRecord | None:
        return self._jobs.get(job_id)

    async def history(self, job_id: int) -> list[JobAttempt]:
        return list(self._attempts.get(job_id, ()))

    async def list_jobs(
        self, queue: str, state: JobState | None, after_id: int, limit: int
    ) -> list[JobRecord]:
        now = self._clock.now_ms()
        shown = (jobs.listed(r, now) for r in self._jobs.values())
        return sorted(
            (
                r
                for r in shown
                if r.queue == queue and r.id > after_id and (state is None or r.state is state)
            ),
            key=lambda r: r.id,
        )[:limit]

    def _named(self, job_id: int, queue: str) -> JobRecord | None:
        record = self._jobs.get(job_id)
        return None if record is None or (queue and record.queue != queue) else record

    async def cancel(self, job_id: int, queue: str, reason: str) -> Administered | None:
        now = self._clock.now_ms()
        record = self._named(job_id, queue)
        if record is None:
            return None
        token = self._last_token + 1 if record.state is JobState.RUNNING else 0
        new = jobs.cancel(record, token, reason, now)
        if new is None:
            return jobs.administered(record, None)
        self._last_token = max(self._last_token, token)
        self._put([new], now)
        self._promote(new.queue, new.ordering_key)
        return jobs.administered(record, new)

    def _retry(self, record: JobRecord, now: int) -> JobRecord | None:
        blocked = bool(record.ordering_key) and any(
            r.id != record.id for r in self._live_of_key(record.queue, record.ordering_key)
        )
        new = jobs.retry(record, blocked, now)
        if new is not None:
            self._put([new], now)
        return new

    async def retry(self, job_id: int, queue: str) -> Administered | None:
        record = self._named(job_id, queue)
        if record is None:
            return None
        return jobs.administered(record, self._retry(record, self._clock.now_ms()))

    async def requeue_dead(self, queue: str, limit: int) -> int:
        now = self._clock.now_ms()
        dead = await self.list_jobs(queue, JobState.DEAD, 0, limit)
        return sum(self._retry(record, now) is not None for record in dead)

    async def last_claim_token(self, resource: str) -> int:
        return max(
            (r.token for r in self._jobs.values() if r.fenced_resource == resource), default=0
        )

    async def put_schedule(self, schedule: Schedule) -> ScheduleRecord:
        old = self._schedules.get(schedule.name)
        record = (
            ScheduleRecord(schedule, self._clock.now_ms())
            if old is None
            else replace(old, schedule=schedule)
        )
        self._schedules[schedule.name] = record
        return record

    async def delete_schedule(self, name: str, queue: str = "") -> bool:
        record = self._schedules.get(name)
        if record is None or queue not in ("", record.schedule.queue):
            return False
        del self._schedules[name]
        return True

    async def list_schedules(self) -> tuple[int, list[ScheduleRecord]]:
        return self._clock.now_ms(), [self._schedules[n] for n in sorted(self._schedules)]

    async def enqueue_periods(self, name: str, periods: Sequence[PeriodJob]) -> list[Enqueued]:
        record = self._schedules.get(name)
        if record is None or not periods:
            return []
        # Nothing awaits in between: the enqueue and the bookkeeping are one atomic step.
        enqueued = await self.enqueue(record.schedule.queue, [job for _, job in periods])
        latest, job_id = max(zip((p for p, _ in periods), (e.id for e in enqueued), strict=True))
        if latest >= record.last_period_ms:
            self._schedules[name] = replace(record, last_period_ms=latest, last_job_id=job_id)
        return enqueued
