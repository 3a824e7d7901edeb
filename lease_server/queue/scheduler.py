"""The scheduler: a periodic task of every lease server that enqueues periodic jobs.

Each step reads every schedule and the backend's clock (``list_schedules``), and for
each schedule enqueues its due periods (:func:`lease_server.queue.schedules.due_periods`:
the latest one, or the missed ones up to the schedule's ``catch_up``) in one
``enqueue_periods`` call. Every lease server runs one, with no election among them:
they all wake at a period's start, and the queue's idempotency key (schedule, period)
lets one job in whichever server commits first; the others get that job back
(``created=False``, counted as ``already_enqueued``). So one job per period holds while
any server runs, and a period is not lost while one is down.

Between steps it sleeps until the earliest next period (a few ms past it, so the
backend's clock has reached it), at most ``schedule_refresh_s`` (schedules put through
another server are seen within that), and wakes early when a schedule is put through
this one (:meth:`Scheduler.wake`). A failing step is logged and retried after
``schedule_refresh_s``; the scheduler never dies. It stops with the server's other
background tasks.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from fencing.errors import BackendUnavailableError
from lease_server.queue import schedules
from lease_server.queue.backends.base import QueueBackend
from lease_server.queue.metrics import QueueMetrics
from lease_server.queue.service import QueueOptions

log = logging.getLogger(__name__)

#: Milliseconds a scheduler wakes past a period's start: its sleep may end a little
#: early, and the backend's clock is read after it.
WAKE_SLACK_MS = 5


@dataclass
class Scheduler:
    backend: QueueBackend
    options: QueueOptions
    metrics: QueueMetrics | None = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self) -> None:
        """Step now (a schedule was put: its next period may be sooner than the sleep)."""
        self._wake.set()

    async def step(self) -> float:
        """Enqueue every due period; return the seconds until the next one is due
        (at most ``schedule_refresh_s``)."""
        now, records = await self.backend.list_schedules()
        refresh_ms = round(self.options.schedule_refresh_s * 1000)
        next_due = now + refresh_ms
        for record in records:
            periods, skipped = schedules.due_periods(record, now)
            after = record.after_ms
            if periods:
                after = periods[-1]
                await self._enqueue(record, periods, skipped)
            next_due = min(next_due, schedules.next_period(record.schedule, max(after, now)))
        return max(0, next_due - now + WAKE_SLACK_MS) / 1000

    async def _enqueue(
        self, record: schedules.ScheduleRecord, periods: list[int], skipped: bool
    ) -> None:
        s = record.schedule
        unique = self.options.periodic_unique
        jobs = [(p, schedules.period_job(s, p, unique=unique)) for p in periods]
        enqueued = await self.backend.enqueue_periods(s.name, jobs)
        created = sum(e.created for e in enqueued)
        if skipped:
            log.warning(
                "schedule %r: periods missed before %d were not enqueued (catch_up %d)",
                s.name,
                periods[0],
                s.catch_up,
            )
        if self.metrics is not None:
            self.metrics.periodic.labels("enqueued").inc(created)
            self.metrics.periodic.labels("already_enqueued").inc(len(enqueued) - created)
            self.metrics.jobs.labels("enqueued").inc(created)
            if skipped:
                self.metrics.periodic.labels("skipped").inc()
        for p, e in zip(periods, enqueued, strict=False):
            if e.created:
                log.info(
                    "periodic job enqueued",
                    extra={"schedule": s.name, "queue": s.queue, "period_ms": p, "job_id": e.id},
                )

    async def run(self) -> None:
        """Step forever (cancel to stop)."""
        while True:
            self._wake.clear()
            try:
                delay = await self.step()
            except asyncio.CancelledError:
                raise
            except BackendUnavailableError as exc:  # an outage: the health probe says so once
                log.debug("scheduler step failed, retrying: %s", exc)
            except Exception:
                log.exception("scheduler step failed; retrying")
                delay = self.options.schedule_refresh_s
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass
