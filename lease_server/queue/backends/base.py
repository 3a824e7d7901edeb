"""The seam between the queue service and storage: one small Protocol.

A queue backend makes each call one transaction on its own clock: claim takes
every token from one counter that only grows (so a job's tokens grow across
claims, restarts and pruning), and every call that names claimed jobs checks
their tokens in the same transaction as its change (all named jobs or none).
It applies the rules of :mod:`lease_server.queue.jobs` (in Python or in SQL) and wraps
its driver's errors once into ``BackendUnavailableError`` with the cause chained.
Validation, waiting for work, backoff policy and the wire live above it, in the
service.

A queue backend that shares a database with the lease backend also appends every
change of a claim to the lease backend's event log (``jobs.transitions``), in the same
transaction as the change, so ``Watch`` streams and guards in ``watch`` mode see
claims, rescues and their ends as they see leases (:class:`LogsJobEvents`). To add a
backend, add a file beside this one and a branch in
:func:`lease_server.queue.backends.open_queue`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from fencing.errors import LeaseLost
from lease_server.backends.base import LeaseBackend
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

#: Maps the attempts a failed job has used to the delay (ms) before it is due again.
RetryDelay = Callable[[int], int]
#: One Complete in a batch: its jobs and the queue it names ("" for any).
CompleteGroup = tuple[Sequence[JobRef], str]
#: One period of a schedule to enqueue: its start (Unix ms) and its job.
PeriodJob = tuple[int, NewJob]


class QueueBackend(Protocol):
    """Durable jobs for many named queues."""

    #: Short name for logs and metrics ("memory", "sqlite", "postgres").
    name: str

    async def open(self) -> None:
        """Connect and create or upgrade the schema. Idempotent."""

    async def close(self) -> None:
        """Release connections. Idempotent."""

    def on_enqueued(self, callback: Callable[[str], None]) -> None:
        """Register ``callback(queue)`` for ready jobs enqueued by *other* processes or
        by the application's own transactions, once they commit.

        PostgreSQL calls it from the event loop on its NOTIFY (waiting claims wake at
        once instead of at their next poll); embedded backends, which only see their own
        process's enqueues (woken by the service itself), keep it and never call it.
        """

    async def enqueue(self, queue: str, jobs: Sequence[NewJob]) -> list[Enqueued]:
        """Add ``jobs`` in order, in one transaction.

        A job whose non-empty idempotency key already names a job of ``queue`` (or an
        earlier job of the same batch) is not added: that job is returned with
        ``created=False``. A job whose ordering key has a live job starts ``waiting``.
        """

    async def claim(
        self, queue: str, worker: str, limit: int, ttl_ms: int, request_id: str = ""
    ) -> list[JobRecord]:
        """Claim up to ``limit`` claimable jobs of ``queue`` (see ``jobs.claim_order``),
        each with a fresh token and a lease until now + ``ttl_ms``; in one transaction.

        Each claim stores ``request_id``. A non-empty one that jobs of ``queue`` still
        running under it store (claimed by ``worker``: ``jobs.replays``) is a retry:
        those jobs are returned by id (``jobs.replay``: leases extended, nothing new
        claimed, no event), in the same transaction."""

    async def set_paused(self, queue: str, paused: bool) -> bool:
        """Pause (or resume) ``queue``; return whether that changed anything. A paused
        queue accepts enqueues, lets running jobs heartbeat, complete and fail, and hands
        out no claims (``claim`` returns none) until resumed. Persisted in the backend,
        so every server sharing it honours it."""

    async def paused(self) -> set[str]:
        """The paused queues."""

    async def heartbeat(self, refs: Sequence[JobRef], ttl_ms: int, queue: str = "") -> None:
        """Extend every named claim to now + ``ttl_ms``, or raise ``LeaseLost`` (naming the
        first stale one) and change nothing. With ``queue``, a job of another queue is
        stale too (so is it for complete, fail and release)."""

    async def complete(self, refs: Sequence[JobRef], queue: str = "") -> set[str]:
        """Mark every named claim succeeded (repeats are no-ops), or raise ``LeaseLost``
        and change nothing. The next job of a finished job's ordering key becomes ready:
        returns the queues where that happened."""

    async def complete_batch(
        self, groups: Sequence[CompleteGroup]
    ) -> tuple[list[LeaseLost | None], set[str]]:
        """Several Completes in one transaction: each group is judged alone, as
        :meth:`complete` would judge it (all of its jobs or none), in order.

        Returns one verdict per group (None: done; ``LeaseLost``: refused, naming its
        first stale job, and that group changed nothing) and the queues where the next
        job of an ordering key became ready.
        """

    async def complete_and_claim(
        self,
        groups: Sequence[CompleteGroup],
        queue: str,
        worker: str,
        limit: int,
        ttl_ms: int,
        request_id: str = "",
    ) -> tuple[list[LeaseLost | None], set[str], list[JobRecord]]:
        """:meth:`complete_batch` then :meth:`claim`, in one round trip where the backend
        can: the completes commit first (so a job they let become ready can be claimed),
        and a refused group does not stop the claim. Returns the verdicts, the queues
        woken and the jobs claimed."""

    async def fail(
        self,
        ref: JobRef,
        error: str,
        retry_delay: RetryDelay,
        *,
        final: bool = False,
        queue: str = "",
    ) -> Failed:
        """Record a failed attempt (``jobs.fail``), or raise ``LeaseLost``."""

    async def release(self, refs: Sequence[JobRef], queue: str = "") -> set[str]:
        """Give every named claim back, due now, or raise ``LeaseLost`` and change nothing.
        Returns the queues of the released jobs."""

    async def retoken(self, ref: JobRef, token: int) -> JobRecord:
        """Give the current claim ``ref`` of a job naming its own resource ``token``, the
        token of the lease on that resource the claim took (``jobs.retoken``), in one
        transaction; ``LeaseLost`` if ``ref`` is not current. Logs nothing (the lease's
        acquire did), and ``token`` may be below the job's provisional one."""

    async def put_back(self, ref: JobRef, delay_ms: int) -> None:
        """Give the current claim ``ref`` back, due in ``delay_ms`` (``jobs.release`` with
        a delay: the attempt does not count), or raise ``LeaseLost``: a claim whose
        resource's lease is held by someone else."""

    async def reap(self, limit: int) -> int:
        """Move up to ``limit`` running jobs whose final attempt's lease expired to dead;
        return how many."""

    async def prune(
        self, succeeded_older_than_ms: int | None, dead_older_than_ms: int | None, limit: int
    ) -> int:
        """Delete up to ``limit`` jobs finished longer ago than their state's retention
        (None: keep forever); return how many."""

    async def stats(self, queue: str, window_ms: int) -> list[QueueCounts]:
        """Counts per queue (only ``queue`` if non-empty), sorted by queue name."""

    async def get(self, job_id: int) -> JobRecord | None:
        """One job as stored (for operators and tests)."""

    async def history(self, job_id: int) -> list[JobAttempt]:
        """The job's attempts kept (``jobs.attempt_changes``: the newest
        ``limits.MAX_JOB_ATTEMPTS_KEPT``), oldest first; [] for an unknown job, or one
        that has not run since the history was kept. Each change of a claim updates
        them in its own transaction, and they go with the job when it is pruned."""

    # -- admin ---------------------------------------------------------------------------

    async def list_jobs(
        self, queue: str, state: JobState | None, after_id: int, limit: int
    ) -> list[JobRecord]:
        """Up to ``limit`` jobs of ``queue`` (of ``state`` only, if given) with id >
        ``after_id``, in id order: a page, read on its own (no snapshot across pages)."""

    async def cancel(self, job_id: int, queue: str, reason: str) -> Administered | None:
        """``jobs.cancel`` the job (None: no such job, or not of ``queue`` when named),
        in one transaction: a running job takes a fresh token from the claims' counter
        (its claim's end is logged as EXPIRED, as a rescue's is), and the next job of its
        ordering key becomes ready."""

    async def retry(self, job_id: int, queue: str) -> Administered | None:
        """``jobs.retry`` the job (None: no such job, or not of ``queue``), in one
        transaction with the check of its ordering key."""

    async def requeue_dead(self, queue: str, limit: int) -> int:
        """``jobs.retry`` up to ``limit`` dead jobs of ``queue``, lowest id first, in one
        transaction; return how many."""

    async def last_claim_token(self, resource: str) -> int:
        """The highest token a claim of a job fencing ``resource`` got (0: none), so the
        lease service's Describe can report job claims in ``last_token``: a job named by
        its default resource, and every job enqueued with ``resource``. Pruned jobs are
        forgotten."""

    async def put_schedule(self, schedule: Schedule) -> ScheduleRecord:
        """Add ``schedule`` or replace the one of that name (validated above); a
        replaced schedule keeps its creation time and its last period, so changing it
        does not enqueue a period again."""

    async def delete_schedule(self, name: str, queue: str = "") -> bool:
        """Remove a schedule (its jobs stay); False if there was none. With ``queue``, a
        schedule of another queue is not removed (False)."""

    async def list_schedules(self) -> tuple[int, list[ScheduleRecord]]:
        """The backend's clock now (Unix ms) and every schedule, sorted by name."""

    async def enqueue_periods(self, name: str, periods: Sequence[PeriodJob]) -> list[Enqueued]:
        """Enqueue the jobs of some periods of schedule ``name`` into its queue, as
        :meth:`enqueue` does (a job whose idempotency key names a job already there is
        not added: that is what makes one job per period), and in the same transaction
        raise the schedule's last period to the latest of ``periods`` (never lower it),
        with that period's job id. Nothing, and ``[]``, if the schedule is gone."""


@runtime_checkable
class LogsJobEvents(Protocol):
    """A queue backend that can append its job events to a lease backend's event log."""

    def log_events_to(self, backend: LeaseBackend) -> bool:
        """From :meth:`QueueBackend.open` on, append the events of every claim change to
        ``backend``'s event log in the same transaction as the change; call before open.

        False (and no job events) when this queue cannot reach that log in its own
        transactions: another kind of backend, another database or schema, or none.
        """
