"""The scheduler's steps on the in-memory queue and a manual clock: what it enqueues, when
it wakes, what it counts, and that a failing step does not stop it."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from lease_server.clock import ManualClock
from lease_server.queue.backends.memory import MemoryQueue
from lease_server.queue.metrics import QueueMetrics
from lease_server.queue.scheduler import WAKE_SLACK_MS, Scheduler
from lease_server.queue.schedules import Schedule, ScheduleRecord
from lease_server.queue.service import QueueOptions

EVERY = Schedule(name="tick", queue="q", every_ms=1000)


def counted(registry: CollectorRegistry, outcome: str) -> float | None:
    return registry.get_sample_value("fencing_queue_periodic_total", {"outcome": outcome})


async def jobs_of(queue: MemoryQueue) -> int:
    return sum(s.ready + s.scheduled for s in await queue.stats("q", 60_000))


async def test_steps_enqueue_each_period_once_across_schedulers() -> None:
    clock = ManualClock(10_500)
    queue = MemoryQueue(clock)
    registries = [CollectorRegistry() for _ in range(2)]
    first, second = (Scheduler(queue, QueueOptions(), QueueMetrics(r)) for r in registries)
    await queue.put_schedule(EVERY)
    assert await first.step() == (500 + WAKE_SLACK_MS) / 1000  # sleeps to the next period
    assert await jobs_of(queue) == 0
    clock.advance(500)
    await first.step()
    await second.step()  # another server, same period: finds the job
    assert await jobs_of(queue) == 1
    assert counted(registries[0], "enqueued") == 1 and counted(registries[1], "enqueued") == 0
    clock.advance(5000)  # every scheduler down for five periods
    await second.step()
    _, (record,) = await queue.list_schedules()
    assert record.last_period_ms == 16_000 and await jobs_of(queue) == 2
    assert counted(registries[1], "skipped") == 1


@pytest.mark.parametrize("unique", [True, False], ids=["keyed", "control-no-key"])
async def test_two_schedulers_that_read_before_either_enqueued(unique: bool) -> None:
    clock = ManualClock(10_500)
    queue = MemoryQueue(clock)
    await queue.put_schedule(EVERY)
    clock.advance(500)
    registry = CollectorRegistry()
    options = QueueOptions(periodic_unique=unique)
    # Both read the schedule before either enqueued: as two servers waking together do.
    _, records = await queue.list_schedules()
    for scheduler in (Scheduler(queue, options), Scheduler(queue, options, QueueMetrics(registry))):
        await scheduler._enqueue(records[0], [11_000], skipped=False)
    if unique:
        assert await jobs_of(queue) == 1
        assert counted(registry, "already_enqueued") == 1
    else:
        assert await jobs_of(queue) == 2  # what the key prevents


async def test_the_wait_is_capped_by_the_refresh_interval() -> None:
    queue = MemoryQueue(ManualClock(0))
    scheduler = Scheduler(queue, QueueOptions(schedule_refresh_s=0.25))
    assert await scheduler.step() == (250 + WAKE_SLACK_MS) / 1000  # no schedule at all
    await queue.put_schedule(Schedule(name="h", queue="q", cron="0 * * * *"))
    assert await scheduler.step() == (250 + WAKE_SLACK_MS) / 1000


class FlakyQueue(MemoryQueue):
    """Its first list_schedules fails, as a backend outage would."""

    failures = 1

    async def list_schedules(self) -> tuple[int, list[ScheduleRecord]]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("backend down")
        return await super().list_schedules()


async def test_a_failing_step_is_logged_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(11_000)
    queue = FlakyQueue(clock)
    await queue.put_schedule(EVERY)
    clock.advance(1000)
    scheduler = Scheduler(queue, QueueOptions(schedule_refresh_s=0.01))
    with caplog.at_level(logging.ERROR):
        task = asyncio.create_task(scheduler.run())
        for _ in range(200):
            if await jobs_of(queue):
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await jobs_of(queue) == 1
    assert "scheduler step failed" in caplog.text


async def test_wake_steps_at_once() -> None:
    clock = ManualClock(10_000)
    queue = MemoryQueue(clock)
    scheduler = Scheduler(queue, QueueOptions(schedule_refresh_s=60))
    task = asyncio.create_task(scheduler.run())
    await asyncio.sleep(0.05)  # the first step ran, and sleeps for a minute
    await queue.put_schedule(EVERY)
    clock.advance(1000)
    scheduler.wake()
    for _ in range(100):
        if await jobs_of(queue):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert await jobs_of(queue) == 1
