"""The operators' calls on every queue backend: list, cancel, retry, requeue dead.

A cancel of a running job fences its claim (a fresh token, every later call of its
worker refused, the claim's end an EXPIRED event of the log a watch guard follows); a
retry keeps the attempts and allows one more when they ran out (River's JobRetry,
Oban's retry_job); pages of a list follow id order, so no job is listed twice.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest

from fencing.errors import LeaseLost
from lease_server.leases import TransitionKind
from lease_server.queue.backends import sqlite as sqlite_queue
from lease_server.queue.backends.base import QueueBackend
from lease_server.queue.backends.sqlite import SQLiteQueue
from lease_server.queue.jobs import CANCELLED_ERROR, JobRecord, JobRef, JobState, NewJob
from tests.backends import JobLog, TimeControl
from tests.contract.test_job_events import events, job_log, log_of  # noqa: F401  (fixture)

Pair = tuple[QueueBackend, TimeControl]
LONG = 60_000


async def enqueue(backend: QueueBackend, queue: str = "q", **kw: Any) -> int:
    (e,) = await backend.enqueue(queue, [NewJob(b"x", **kw)])
    return e.id


async def claim_one(backend: QueueBackend, queue: str = "q", worker: str = "w") -> JobRecord:
    (claimed,) = await backend.claim(queue, worker, 1, LONG)
    return claimed


def ref(record: JobRecord) -> JobRef:
    return JobRef(record.id, record.token)


async def stored(backend: QueueBackend, job_id: int) -> JobRecord:
    record = await backend.get(job_id)
    assert record is not None
    return record


async def dead_job(backend: QueueBackend, queue: str = "q", **kw: Any) -> JobRecord:
    job_id = await enqueue(backend, queue, max_attempts=1, **kw)
    claimed = await claim_one(backend, queue)
    assert claimed.id == job_id
    await backend.fail(ref(claimed), "boom", lambda attempts: 0)
    record = await stored(backend, job_id)
    assert record.state is JobState.DEAD
    return record


# -- list ---------------------------------------------------------------------------------------


async def test_pages_follow_id_order_and_never_list_a_job_twice(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    ids = [await enqueue(backend) for _ in range(7)]
    await enqueue(backend, "other")
    seen: list[int] = []
    after = 0
    for _ in range(10):
        page = await backend.list_jobs("q", None, after, 3)
        seen += [r.id for r in page]
        if len(page) < 3:
            break
        after = page[-1].id
        # Jobs change state and new ones arrive between pages: each page is read alone.
        await backend.claim("q", "w", 1, LONG)
        await enqueue(backend)
    assert len(seen) == 10  # the 7, and the 3 enqueued while paging
    assert seen[:7] == ids and len(seen) == len(set(seen)) and seen == sorted(seen)
    assert all(r.queue == "q" for r in await backend.list_jobs("q", None, 0, 1000))


async def test_a_state_filter_lists_only_that_state(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    ids = [await enqueue(backend) for _ in range(4)]
    running = [await claim_one(backend), await claim_one(backend)]
    got = await backend.list_jobs("q", JobState.RUNNING, 0, 10)
    assert [r.id for r in got] == [r.id for r in running] == ids[:2]
    assert got[0].claimed_at_ms > 0 and got[0].lease_owner == "w"
    assert [r.id for r in await backend.list_jobs("q", JobState.READY, 0, 10)] == ids[2:]
    assert await backend.list_jobs("q", JobState.DEAD, 0, 10) == []


async def test_a_ready_job_not_yet_due_is_listed_as_scheduled(queue_backend: Pair) -> None:
    """Delayed, or backing off before a retry: listed (and filtered) as scheduled, counted
    as scheduled by Stats, stored as ready, and claimed by the ready rule once due."""
    backend, time = queue_backend
    due = await enqueue(backend)
    later = await enqueue(backend, delay_ms=LONG)
    soon = await enqueue(backend, delay_ms=400)
    failing = await enqueue(backend, max_attempts=3, priority=9)
    claimed = await claim_one(backend)
    assert claimed.id == failing
    await backend.fail(ref(claimed), "boom", lambda attempts: LONG)
    listed = {r.id: r.state for r in await backend.list_jobs("q", None, 0, 10)}
    assert listed == {
        due: JobState.READY,
        later: JobState.SCHEDULED,
        soon: JobState.SCHEDULED,
        failing: JobState.SCHEDULED,
    }
    scheduled = await backend.list_jobs("q", JobState.SCHEDULED, 0, 10)
    assert [r.id for r in scheduled] == [later, soon, failing]
    assert [r.id for r in await backend.list_jobs("q", JobState.READY, 0, 10)] == [due]
    (counts,) = await backend.stats("q", 60_000)
    assert (counts.ready, counts.scheduled) == (1, 3)
    # Stored as ready: the claim rule is unchanged, and takes a scheduled job once due.
    assert (await stored(backend, later)).state is JobState.READY
    assert (await claim_one(backend)).id == due
    assert await backend.claim("q", "w", 10, LONG) == []
    await time.sleep(450)
    assert [r.id for r in await backend.list_jobs("q", JobState.READY, 0, 10)] == [soon]
    assert (await claim_one(backend)).id == soon


# -- cancel -------------------------------------------------------------------------------------


async def test_cancel_of_a_ready_job_ends_it_and_it_is_never_claimed(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    job_id = await enqueue(backend)
    done = await backend.cancel(job_id, "q", "")
    assert done is not None and done.changed and done.fence_token == 0
    assert done.record.state is JobState.CANCELLED and done.record.last_error == CANCELLED_ERROR
    assert done.record.finished_at_ms > 0
    assert await backend.claim("q", "w", 10, LONG) == []
    again = await backend.cancel(job_id, "q", "")  # already cancelled: nothing to do
    assert again is not None and not again.changed and again.record.state is JobState.CANCELLED


async def test_cancel_of_a_running_job_fences_its_claim(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await enqueue(backend)
    claimed = await claim_one(backend)
    done = await backend.cancel(claimed.id, "q", "operator: bad input")
    assert done is not None and done.changed
    assert done.fence_token > claimed.token and done.record.token == done.fence_token
    assert done.record.state is JobState.CANCELLED
    assert done.record.last_error == "operator: bad input" and done.record.lease_owner == "w"
    old = ref(claimed)
    with pytest.raises(LeaseLost):
        await backend.heartbeat([old], LONG, "q")
    with pytest.raises(LeaseLost):
        await backend.complete([old], "q")
    with pytest.raises(LeaseLost):
        await backend.fail(old, "late", lambda attempts: 0, queue="q")
    with pytest.raises(LeaseLost):
        await backend.release([old], "q")
    assert (await stored(backend, claimed.id)).state is JobState.CANCELLED  # nothing moved it


async def test_the_cancels_token_is_below_every_later_claim(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await enqueue(backend)
    claimed = await claim_one(backend)
    done = await backend.cancel(claimed.id, "q", "")
    assert done is not None
    await enqueue(backend)
    assert (await claim_one(backend)).token > done.fence_token


async def test_cancel_names_the_queue_and_finished_jobs_stay(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    job_id = await enqueue(backend)
    assert await backend.cancel(job_id, "other", "") is None  # not of that queue
    assert await backend.cancel(job_id + 1000, "", "") is None  # no such job
    claimed = await claim_one(backend)
    await backend.complete([ref(claimed)])
    done = await backend.cancel(job_id, "", "")
    assert done is not None and not done.changed and done.record.state is JobState.SUCCEEDED


async def test_cancel_of_an_ordering_keys_head_lets_the_next_run(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    first = await enqueue(backend, ordering_key="acct-1")
    second = await enqueue(backend, ordering_key="acct-1")
    assert (await stored(backend, second)).state is JobState.WAITING
    await claim_one(backend)
    await backend.cancel(first, "q", "")
    assert (await stored(backend, second)).state is JobState.READY
    assert (await claim_one(backend)).id == second


# -- retry and requeue --------------------------------------------------------------------------


async def test_retry_of_a_dead_job_keeps_its_attempts_and_allows_one_more(
    queue_backend: Pair,
) -> None:
    backend, _ = queue_backend
    dead = await dead_job(backend)
    done = await backend.retry(dead.id, "q")
    assert done is not None and done.changed and done.fence_token == 0
    record = done.record
    assert record.state is JobState.READY and record.finished_at_ms == 0
    assert (record.attempts, record.max_attempts) == (1, 2) and record.last_error == "boom"
    again = await claim_one(backend)
    assert again.id == dead.id and again.attempts == 2 and again.token > dead.token


async def test_retry_of_a_failed_job_makes_it_due_now(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    job_id = await enqueue(backend, max_attempts=3)
    claimed = await claim_one(backend)
    await backend.fail(ref(claimed), "boom", lambda attempts: LONG)
    assert await backend.claim("q", "w", 1, LONG) == []  # waiting out its backoff
    done = await backend.retry(job_id, "q")
    assert done is not None and done.changed and done.record.max_attempts == 3
    assert (await claim_one(backend)).id == job_id


async def test_retry_leaves_running_succeeded_and_never_failed_jobs(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    delayed = await enqueue(backend, delay_ms=LONG)
    running_id = await enqueue(backend)
    running = await claim_one(backend)
    assert running.id == running_id
    for job_id in (delayed, running_id):
        done = await backend.retry(job_id, "q")
        assert done is not None and not done.changed
    assert (await stored(backend, running_id)).token == running.token
    await backend.complete([ref(running)])
    done = await backend.retry(running_id, "")
    assert done is not None and not done.changed and done.record.state is JobState.SUCCEEDED
    assert await backend.retry(running_id, "other") is None


async def test_retry_of_a_cancelled_running_job_runs_it_with_a_newer_token(
    queue_backend: Pair,
) -> None:
    backend, _ = queue_backend
    await enqueue(backend)
    claimed = await claim_one(backend)
    cancelled = await backend.cancel(claimed.id, "q", "")
    assert cancelled is not None
    done = await backend.retry(claimed.id, "q")
    assert done is not None and done.changed and done.record.state is JobState.READY
    again = await claim_one(backend)
    assert again.id == claimed.id and again.token > cancelled.fence_token


async def test_a_retried_job_waits_behind_the_live_job_of_its_key(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    dead = await dead_job(backend, ordering_key="acct-1")
    live = await enqueue(backend, ordering_key="acct-1")
    running = await claim_one(backend)
    assert running.id == live
    done = await backend.retry(dead.id, "q")
    assert done is not None and done.record.state is JobState.WAITING
    await backend.complete([ref(running)])
    assert (await stored(backend, dead.id)).state is JobState.READY


async def test_requeue_dead_is_bounded_per_call(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    dead = [await dead_job(backend) for _ in range(3)]
    other = await dead_job(backend, "other")
    assert await backend.requeue_dead("q", 2) == 2
    assert [(await stored(backend, r.id)).state for r in dead] == [
        JobState.READY,
        JobState.READY,
        JobState.DEAD,
    ]
    assert await backend.requeue_dead("q", 2) == 1
    assert await backend.requeue_dead("q", 2) == 0
    assert (await stored(backend, other.id)).state is JobState.DEAD


# -- stats and retention ------------------------------------------------------------------------


async def test_stats_count_cancelled_jobs_apart_and_retention_prunes_them(
    queue_backend: Pair,
) -> None:
    backend, time = queue_backend
    job_id = await enqueue(backend)
    await backend.cancel(job_id, "q", "")
    await dead_job(backend)
    (counts,) = await backend.stats("q", LONG)
    assert (counts.cancelled, counts.dead, counts.ready) == (1, 1, 0)
    await time.sleep(300)
    assert await backend.prune(None, 100, 100) == 2  # the dead retention covers both
    assert await backend.get(job_id) is None


# -- events -------------------------------------------------------------------------------------


async def test_a_cancel_of_a_running_job_is_the_claims_expiry_in_the_log(
    job_log: JobLog,  # noqa: F811
) -> None:
    queue, backend, _ = job_log
    ready_id = await enqueue(queue)
    await enqueue(queue)
    claimed = await claim_one(queue, worker="a")
    assert claimed.id == ready_id
    other = await enqueue(queue)
    head = await log_of(backend).head_revision()
    await queue.cancel(other, "q", "")  # never ran: no claim ends, nothing to log
    assert await events(backend, head) == []
    done = await queue.cancel(claimed.id, "q", "")
    assert done is not None
    (event,) = await events(backend, head)
    assert (event.kind, event.resource, event.token, event.holder) == (
        TransitionKind.EXPIRED,
        f"job/q/{claimed.id}",
        claimed.token,
        "a",
    )
    head = await log_of(backend).head_revision()
    await queue.retry(claimed.id, "q")
    assert await events(backend, head) == []  # a retry starts no claim


# -- the SQLite schema upgrade ------------------------------------------------------------------


async def test_the_sqlite_upgrade_keeps_jobs_and_never_reuses_an_id() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "queue.db"
        old = SQLiteQueue(path)
        old._db._migrations = sqlite_queue.MIGRATIONS[:2]  # a database of schema v2
        await old.open()
        kept = await enqueue(old)
        doomed = await enqueue(old)
        await old.close()
        with sqlite3.connect(path) as conn:  # the highest id is gone (pruned)
            conn.execute("DELETE FROM jobs WHERE id = ?", (doomed,))
        new = SQLiteQueue(path)
        await new.open()
        try:
            assert (await stored(new, kept)).state is JobState.READY
            assert await enqueue(new) > doomed
            done = await new.cancel(kept, "q", "")
            assert done is not None and done.record.state is JobState.CANCELLED
        finally:
            await new.close()
