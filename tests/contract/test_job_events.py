"""Job claims in the lease event log: the rule of ``lease_server.queue.jobs.transitions``.

Runs on every queue backend of tests/backends.py ``JOB_LOGS``, each linked to the lease
backend whose log it shares (memory; SQLite's two files; one PostgreSQL schema). Every
claim, rescue, Complete, Fail, Release and reaper verdict is an event of that one log,
in the transaction of the change, numbered with the lease events in one order: a
claim is ACQUIRED, a rescue EXPIRED then ACQUIRED, an end RELEASED, the reaper EXPIRED.
A job naming its own resource is the exception: its claims are leases, logged as such.
The control (an unlinked queue) logs nothing, which is what let a watch guard miss
a rescue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from lease_server.backends.base import EventLog, LeaseBackend
from lease_server.leases import Grant, LoggedEvent, Scope, TransitionKind
from lease_server.queue.backends.base import QueueBackend
from lease_server.queue.backends.sqlite import SQLiteQueue
from lease_server.queue.jobs import REAPED_ERROR, JobRecord, JobRef, JobState, NewJob
from tests.backends import JOB_LOGS, JobLog, TimeControl

A, L, X = TransitionKind.ACQUIRED, TransitionKind.RELEASED, TransitionKind.EXPIRED
TTL = 300  # ms: short enough to expire by really sleeping on database clocks
LONG = 60_000


@pytest.fixture(params=sorted(JOB_LOGS))
async def job_log(request: pytest.FixtureRequest) -> AsyncIterator[JobLog]:
    async with JOB_LOGS[request.param]() as trio:
        yield trio


def log_of(backend: LeaseBackend) -> EventLog:
    assert isinstance(backend, EventLog)
    return backend


async def events(backend: LeaseBackend, after: int = 0, prefix: str = "") -> list[LoggedEvent]:
    page = await log_of(backend).events_after(after, Scope(prefix=prefix), 10_000)
    return list(page.events)


def seen(evs: list[LoggedEvent]) -> list[tuple[TransitionKind, str, int, str]]:
    return [(e.kind, e.resource, e.token, e.holder) for e in evs]


async def enqueue(queue: QueueBackend, name: str = "q", **kw: Any) -> int:
    (e,) = await queue.enqueue(name, [NewJob(b"x", **kw)])
    return e.id


async def claim_one(
    queue: QueueBackend, worker: str = "a", ttl: int = LONG, name: str = "q"
) -> JobRecord:
    (claimed,) = await queue.claim(name, worker, 1, ttl)
    return claimed


def ref(record: JobRecord) -> JobRef:
    return JobRef(record.id, record.token)


def no_delay(attempts: int) -> int:
    return 0


async def test_a_claim_is_acquired_naming_the_job(job_log: JobLog) -> None:
    queue, backend, _ = job_log
    job_id = await enqueue(queue, "mail")
    head = await log_of(backend).head_revision()
    assert await events(backend, head) == []  # enqueue logs nothing
    claimed = await claim_one(queue, "worker-1", name="mail")
    (event,) = await events(backend, head)
    assert (event.kind, event.resource, event.token, event.holder) == (
        A,
        f"job/mail/{job_id}",
        claimed.token,
        "worker-1",
    )
    assert (event.job_id, event.queue) == (job_id, "mail")
    assert 0 < event.ttl_ms <= LONG
    assert event.revision == await log_of(backend).head_revision()


async def test_a_job_naming_its_own_resource_logs_nothing_of_its_own(job_log: JobLog) -> None:
    """Its claims are leases on that resource (lease_server/queue/resources.py): the
    lease's acquire, release and expiry are its events. The queue's provisional claim,
    the retoken, a give-back and the end log nothing, so the resource's log holds only
    tokens of its one counter."""
    queue, backend, _ = job_log
    await enqueue(queue, resource="invoice/7")
    first = await claim_one(queue)
    await queue.put_back(ref(first), 0)
    claimed = await claim_one(queue)
    stored = await queue.retoken(ref(claimed), claimed.token + 100)
    await queue.complete([ref(stored)])
    assert seen(await events(backend)) == []
    # Control: a job of its default resource logs its claim and its end.
    job_id = await enqueue(queue)
    plain = await claim_one(queue)
    await queue.complete([ref(plain)])
    assert seen(await events(backend)) == [
        (A, f"job/q/{job_id}", plain.token, "a"),
        (L, f"job/q/{job_id}", plain.token, "a"),
    ]


async def test_complete_fail_and_release_end_the_claim_as_released(job_log: JobLog) -> None:
    queue, backend, _ = job_log
    done, failed, given_back = [await enqueue(queue) for _ in range(3)]
    claims = {c.id: c for c in await queue.claim("q", "a", 3, LONG)}
    head = await log_of(backend).head_revision()
    await queue.heartbeat([ref(c) for c in claims.values()], LONG)  # not an event
    await queue.complete([ref(claims[done])])
    await queue.fail(ref(claims[failed]), "boom", no_delay)
    await queue.release([ref(claims[given_back])])
    logged = await events(backend, head)
    assert [(e.kind, e.job_id, e.token) for e in logged] == [
        (L, done, claims[done].token),
        (L, failed, claims[failed].token),
        (L, given_back, claims[given_back].token),
    ]


async def test_replays_and_stale_calls_append_nothing(job_log: JobLog) -> None:
    queue, backend, _ = job_log
    await enqueue(queue)
    claimed = await claim_one(queue)
    await queue.complete([ref(claimed)])
    head = await log_of(backend).head_revision()
    await queue.complete([ref(claimed)])  # a retry after a lost reply: a no-op
    with pytest.raises(Exception):  # noqa: B017, PT011 (LeaseLost; the type is not the point)
        await queue.release([JobRef(claimed.id, claimed.token + 1000)])
    assert await events(backend, head) == []
    assert await log_of(backend).head_revision() == head


async def test_a_rescue_is_expired_then_acquired_as_a_lease_takeover(job_log: JobLog) -> None:
    queue, backend, time = job_log
    job_id = await enqueue(queue)
    first = await claim_one(queue, "a", TTL)
    await time.sleep(TTL)
    rescued = await claim_one(queue, "b", LONG)
    assert rescued.id == job_id and rescued.token > first.token
    resource = f"job/q/{job_id}"
    assert seen(await events(backend)) == [
        (A, resource, first.token, "a"),
        (X, resource, first.token, "a"),
        (A, resource, rescued.token, "b"),
    ]


async def test_the_reapers_verdict_is_expired(job_log: JobLog) -> None:
    queue, backend, time = job_log
    job_id = await enqueue(queue, max_attempts=1)
    claimed = await claim_one(queue, "a", TTL)
    await time.sleep(TTL)
    head = await log_of(backend).head_revision()
    assert await queue.reap(10) == 1
    record = await queue.get(job_id)
    assert record is not None and record.state is JobState.DEAD
    assert record.last_error == REAPED_ERROR
    assert [(e.kind, e.token) for e in await events(backend, head)] == [(X, claimed.token)]


async def test_a_late_final_fail_is_released_by_its_worker_not_expired(job_log: JobLog) -> None:
    """An expired claim nobody rescued is still current: its worker's own end is RELEASED."""
    queue, backend, time = job_log
    await enqueue(queue, max_attempts=1)
    claimed = await claim_one(queue, "a", TTL)
    await time.sleep(TTL)
    head = await log_of(backend).head_revision()
    failed = await queue.fail(ref(claimed), "gave up", no_delay)
    assert failed.state is JobState.DEAD
    assert [(e.kind, e.token) for e in await events(backend, head)] == [(L, claimed.token)]
    assert await queue.reap(10) == 0  # nothing left for the reaper, nothing logged twice
    assert len(await events(backend, head)) == 1


async def test_jobs_and_leases_share_one_log_in_commit_order(job_log: JobLog) -> None:
    queue, backend, _ = job_log
    await enqueue(queue)
    grant = await backend.acquire("orders", "h", LONG, "")
    assert isinstance(grant, Grant)
    claimed = await claim_one(queue)
    await backend.release("orders", grant.token, "h")
    await queue.complete([ref(claimed)])
    logged = await events(backend)
    assert [(e.kind, e.resource.split("/")[0]) for e in logged] == [
        (A, "orders"),
        (A, "job"),
        (L, "orders"),
        (L, "job"),
    ]
    revisions = [e.revision for e in logged]
    assert revisions == list(range(revisions[0], revisions[0] + 4))  # dense, one counter
    assert [e.job_id == 0 for e in logged] == [True, False, True, False]
    # A watch guard following "job/" sees the jobs' events alone.
    assert [e.kind for e in await events(backend, prefix="job/")] == [A, L]


async def test_listeners_hear_each_job_append(job_log: JobLog) -> None:
    queue, backend, _ = job_log
    heads: list[int] = []
    log_of(backend).on_events(heads.append)
    await enqueue(queue)
    await asyncio.sleep(0.1)  # a PostgreSQL listener reports the head it finds on start
    await claim_one(queue)
    head = await log_of(backend).head_revision()
    for _ in range(200):  # PostgreSQL: the NOTIFY arrives on the listener's connection
        if head in heads:
            break
        await asyncio.sleep(0.02)
    assert head in heads


async def test_control_an_unlinked_queue_logs_no_claim(
    tmp_path: Any, sqlite_pair: tuple[LeaseBackend, TimeControl]
) -> None:
    """The old path: a queue beside the leases but not linked to their log (what every
    lease server did before), so a rescue leaves no trace a watch guard could follow."""
    backend, time = sqlite_pair
    queue = SQLiteQueue(tmp_path / "queue.db", cast(Any, backend)._clock)
    await queue.open()
    try:
        await enqueue(queue)
        first = await claim_one(queue, "a", TTL)
        await time.sleep(TTL)
        rescued = await claim_one(queue, "b")
        assert rescued.token > first.token
        assert await events(backend) == []  # nobody can learn of the rescue
    finally:
        await queue.close()


@pytest.fixture
async def sqlite_pair() -> AsyncIterator[tuple[LeaseBackend, TimeControl]]:
    from tests.backends import sqlite_backend

    async with sqlite_backend() as pair:
        yield pair


async def test_the_last_claim_token_of_a_job_resource(job_log: JobLog) -> None:
    """What the lease service's Describe adds to ``last_token`` for a job's resource, so a
    guard asking whether a token was ever granted hears of job claims too."""
    queue, _, time = job_log
    job_id = await enqueue(queue, "mail")
    custom = await enqueue(queue, "mail", resource="invoice/7")
    assert await queue.last_claim_token(f"job/mail/{job_id}") == 0  # never claimed
    claims = {c.id: c for c in await queue.claim("mail", "a", 2, TTL)}
    await time.sleep(TTL)
    rescued = {c.id: c for c in await queue.claim("mail", "b", 2, LONG)}
    assert await queue.last_claim_token(f"job/mail/{job_id}") == rescued[job_id].token
    assert rescued[job_id].token > claims[job_id].token
    assert await queue.last_claim_token("invoice/7") == rescued[custom].token
    assert await queue.last_claim_token(f"job/mail/{custom}") == 0  # it fences invoice/7
    assert await queue.last_claim_token(f"job/other/{job_id}") == 0  # another queue's name
    assert await queue.last_claim_token("orders") == 0
