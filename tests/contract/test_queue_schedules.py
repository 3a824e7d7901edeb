"""The schedules of periodic jobs, on every queue backend (tests/backends.py).

A schedule is stored by name (upsert keeps its creation time and last period), and
``enqueue_periods`` adds each period's job through the queue's idempotency key, in one
transaction with the schedule's bookkeeping: a period enqueued twice, or by several
callers at once, has one job. The control leaves the key out and gets duplicates.
"""

from __future__ import annotations

import asyncio

from lease_server.queue.backends.base import QueueBackend
from lease_server.queue.jobs import JobState
from lease_server.queue.schedules import Schedule, period_job, period_key
from tests.backends import TimeControl

Pair = tuple[QueueBackend, TimeControl]

EVERY = Schedule(
    name="tick",
    queue="periodic",
    every_ms=1000,
    payload=b"p",
    priority=7,
    max_attempts=3,
    resource="res/tick",
)


async def test_put_list_delete(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    assert (await backend.list_schedules())[1] == []
    record = await backend.put_schedule(EVERY)
    assert record.schedule == EVERY and record.last_period_ms == 0 and record.last_job_id == 0
    cron = Schedule(name="a-cron", queue="q2", cron="*/5 * * * *", timezone="Europe/Riga")
    await backend.put_schedule(cron)
    now, listed = await backend.list_schedules()
    assert now > 0 and abs(now - record.created_at_ms) < 60_000
    assert [r.schedule for r in listed] == [cron, EVERY]  # sorted by name
    assert await backend.delete_schedule("a-cron", queue="periodic") is False  # not its queue
    assert await backend.delete_schedule("a-cron", queue="q2") is True
    assert await backend.delete_schedule("a-cron") is False
    assert [r.name for r in (await backend.list_schedules())[1]] == ["tick"]


async def test_put_replaces_and_keeps_creation_and_last_period(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    first = await backend.put_schedule(EVERY)
    (e,) = await backend.enqueue_periods("tick", [(5000, period_job(EVERY, 5000))])
    changed = Schedule(name="tick", queue="other", cron="0 * * * *", payload=b"new")
    record = await backend.put_schedule(changed)
    assert record.schedule == changed
    assert record.created_at_ms == first.created_at_ms
    assert (record.last_period_ms, record.last_job_id) == (5000, e.id)


async def test_a_period_has_one_job_however_often_it_is_enqueued(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await backend.put_schedule(EVERY)
    (first,) = await backend.enqueue_periods("tick", [(7000, period_job(EVERY, 7000))])
    (again,) = await backend.enqueue_periods("tick", [(7000, period_job(EVERY, 7000))])
    assert first.created and not again.created and again.id == first.id
    job = await backend.get(first.id)
    assert job is not None and job.queue == "periodic" and job.state is JobState.READY
    assert job.idempotency_key == period_key("tick", 7000) == "periodic:tick:7000"
    assert (job.payload, job.priority, job.max_attempts, job.resource) == (
        b"p",
        7,
        3,
        "res/tick",
    )
    assert job.available_at_ms == 7000  # due at the period's start
    (_, (record,)) = await backend.list_schedules()
    assert (record.last_period_ms, record.last_job_id) == (7000, first.id)


async def test_concurrent_enqueues_of_one_period_add_one_job(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await backend.put_schedule(EVERY)
    results = await asyncio.gather(
        *(backend.enqueue_periods("tick", [(9000, period_job(EVERY, 9000))]) for _ in range(6))
    )
    created = [e for (e,) in results if e.created]
    assert len(created) == 1
    assert {e.id for (e,) in results} == {created[0].id}
    stats = await backend.stats("periodic", 60_000)
    assert stats[0].ready == 1


async def test_control_without_the_key_a_period_gets_duplicates(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await backend.put_schedule(EVERY)
    results = await asyncio.gather(
        *(
            backend.enqueue_periods("tick", [(9000, period_job(EVERY, 9000, unique=False))])
            for _ in range(3)
        )
    )
    assert sum(e.created for (e,) in results) == 3  # what the key prevents


async def test_last_period_only_rises(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await backend.put_schedule(EVERY)
    periods = [(p, period_job(EVERY, p)) for p in (1000, 2000, 3000)]
    enqueued = await backend.enqueue_periods("tick", periods)
    assert [e.created for e in enqueued] == [True, True, True]
    await backend.enqueue_periods("tick", [(1000, period_job(EVERY, 1000))])  # a late one
    (_, (record,)) = await backend.list_schedules()
    assert (record.last_period_ms, record.last_job_id) == (3000, enqueued[2].id)


async def test_a_deleted_schedule_enqueues_nothing(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await backend.put_schedule(EVERY)
    await backend.delete_schedule("tick")
    assert await backend.enqueue_periods("tick", [(1000, period_job(EVERY, 1000))]) == []
    assert await backend.stats("periodic", 60_000) == []
