"""The attempts' history of a job (``QueueBackend.history``), on every queue backend.

Every claim is an attempt: its number, when it started and ended, its worker and token,
how it ended (``jobs.AttemptOutcome``) and its error. The rule is
``jobs.attempt_changes``; PostgreSQL applies it in a trigger, so its SQL paths (claim,
complete, release, reap) are held to it here too. Bounded: the newest
``limits.MAX_JOB_ATTEMPTS_KEPT`` attempts, each error at most ``limits.MAX_ERROR_BYTES``.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path
from time import time_ns

from fencing import limits
from lease_server.queue.backends import sqlite as sqlite_queue
from lease_server.queue.backends.sqlite import SQLiteQueue
from lease_server.queue.jobs import (
    EXPIRED_PREFIX,
    REAPED_ERROR,
    AttemptOutcome,
    JobAttempt,
    JobRef,
    JobState,
)
from tests.contract.test_queue_backend import (
    LONG,
    TTL,
    Pair,
    claim_one,
    enqueue,
    no_delay,
    ref,
)


def outline(history: list[JobAttempt]) -> list[tuple[int, str, int, AttemptOutcome, str]]:
    return [(a.attempt, a.worker, a.token, a.outcome, a.error) for a in history]


async def test_claim_fail_claim_complete_is_two_attempts(queue_backend: Pair) -> None:
    backend, time = queue_backend
    job_id = await enqueue(backend, max_attempts=3)
    assert await backend.history(job_id) == []  # enqueued, never claimed
    first = await claim_one(backend, worker="w1")
    (running,) = await backend.history(job_id)
    assert running == JobAttempt(1, first.claimed_at_ms, "w1", first.token)
    assert running.outcome is AttemptOutcome.RUNNING and running.ended_at_ms == 0
    await backend.heartbeat([ref(first)], LONG)  # not an attempt of its own
    await backend.fail(ref(first), "boom", no_delay)
    await time.sleep(5)
    second = await claim_one(backend, worker="w2")
    await backend.complete([ref(second)])
    history = await backend.history(job_id)
    assert outline(history) == [
        (1, "w1", first.token, AttemptOutcome.FAILED, "boom"),
        (2, "w2", second.token, AttemptOutcome.SUCCEEDED, ""),
    ]
    one, two = history
    assert 0 < one.started_at_ms <= one.ended_at_ms <= two.started_at_ms <= two.ended_at_ms
    assert two.started_at_ms == second.claimed_at_ms
    await backend.complete([ref(second)])  # a repeat changes nothing
    assert await backend.history(job_id) == history


async def test_a_rescued_attempt_shows_its_lease_expired(queue_backend: Pair) -> None:
    backend, time = queue_backend
    job_id = await enqueue(backend)
    first = await claim_one(backend, worker="crashed", ttl=TTL)
    await time.sleep(TTL + 50)
    second = await claim_one(backend, worker="rescuer")
    expired, running = await backend.history(job_id)
    assert (expired.attempt, expired.worker, expired.token) == (1, "crashed", first.token)
    assert expired.outcome is AttemptOutcome.EXPIRED
    assert expired.error.startswith(EXPIRED_PREFIX) and "crashed" in expired.error
    assert expired.ended_at_ms >= expired.started_at_ms + TTL
    assert (running.attempt, running.worker, running.token) == (2, "rescuer", second.token)
    assert running.outcome is AttemptOutcome.RUNNING and running.ended_at_ms == 0


async def test_a_reaped_attempt_shows_its_lease_expired(queue_backend: Pair) -> None:
    backend, time = queue_backend
    job_id = await enqueue(backend, max_attempts=1)
    claimed = await claim_one(backend, worker="gone", ttl=TTL)
    await time.sleep(TTL + 50)
    assert await backend.reap(100) == 1
    assert outline(await backend.history(job_id)) == [
        (1, "gone", claimed.token, AttemptOutcome.EXPIRED, REAPED_ERROR)
    ]


async def test_a_released_attempt_does_not_count_and_a_cancel_ends_one(
    queue_backend: Pair,
) -> None:
    backend, _ = queue_backend
    job_id = await enqueue(backend)
    first = await claim_one(backend, worker="a")
    await backend.release([ref(first)])
    second = await claim_one(backend, worker="b")
    done = await backend.cancel(job_id, "q", "operator says no")
    assert done is not None and done.changed
    assert outline(await backend.history(job_id)) == [
        (1, "a", first.token, AttemptOutcome.RELEASED, ""),
        (1, "b", second.token, AttemptOutcome.CANCELLED, "operator says no"),
    ]
    await backend.retry(job_id, "q")  # due again: no attempt until claimed
    assert len(await backend.history(job_id)) == 2


async def test_complete_batch_and_complete_and_claim_end_and_start_attempts(
    queue_backend: Pair,
) -> None:
    backend, _ = queue_backend
    one = await enqueue(backend)
    two = await enqueue(backend)
    first = await claim_one(backend)
    verdicts, _, claimed = await backend.complete_and_claim(
        [([ref(first)], "q")], "q", "x", 1, LONG
    )
    assert verdicts == [None] and [c.id for c in claimed] == [two]
    verdicts, _ = await backend.complete_batch([([ref(claimed[0])], "q")])
    assert verdicts == [None]
    assert outline(await backend.history(one)) == [
        (1, "w", first.token, AttemptOutcome.SUCCEEDED, "")
    ]
    assert outline(await backend.history(two)) == [
        (1, "x", claimed[0].token, AttemptOutcome.SUCCEEDED, "")
    ]


async def test_a_job_naming_its_resource_keeps_its_attempt_under_the_lease_token(
    queue_backend: Pair,
) -> None:
    backend, _ = queue_backend
    job_id = await enqueue(backend, resource="printer")
    claimed = await claim_one(backend)
    lease_token = 7
    await backend.retoken(ref(claimed), lease_token)
    (running,) = await backend.history(job_id)
    assert (running.attempt, running.token, running.outcome) == (
        1,
        lease_token,
        AttemptOutcome.RUNNING,
    )


async def test_only_the_newest_attempts_are_kept(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    total = limits.MAX_JOB_ATTEMPTS_KEPT + 3
    job_id = await enqueue(backend, max_attempts=total)
    tokens = []
    for n in range(1, total + 1):
        claimed = await claim_one(backend)
        tokens.append(claimed.token)
        await backend.fail(ref(claimed), f"fail {n}", no_delay)
    history = await backend.history(job_id)
    assert len(history) == limits.MAX_JOB_ATTEMPTS_KEPT
    assert [a.attempt for a in history] == list(range(4, total + 1))
    assert [a.token for a in history] == tokens[3:]
    assert history[-1].error == f"fail {total}"
    assert all(a.outcome is AttemptOutcome.FAILED for a in history[:-1])
    assert history[-1].outcome is AttemptOutcome.FAILED  # the last one: dead


async def test_an_attempt_keeps_at_most_4_kib_of_its_error(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    job_id = await enqueue(backend, max_attempts=1)
    claimed = await claim_one(backend)
    await backend.fail(ref(claimed), "é" * limits.MAX_ERROR_BYTES, no_delay)
    (attempt,) = await backend.history(job_id)
    assert attempt.outcome is AttemptOutcome.FAILED
    size = len(attempt.error.encode())
    assert limits.MAX_ERROR_BYTES - 4 <= size <= limits.MAX_ERROR_BYTES
    assert attempt.error.endswith("...") and attempt.error.startswith("éé")


async def test_the_history_goes_with_its_pruned_job(queue_backend: Pair) -> None:
    backend, time = queue_backend
    job_id = await enqueue(backend)
    claimed = await claim_one(backend)
    await backend.complete([ref(claimed)])
    await time.sleep(300)
    assert await backend.prune(200, None, 100) == 1
    assert await backend.get(job_id) is None
    assert await backend.history(job_id) == []
    assert await backend.history(10**12) == []  # never existed


# -- the SQLite schema upgrade ------------------------------------------------------------------


def previous_sqlite_schema(path: Path) -> int:
    """A queue file as the previous release left it: its schema, written by hand (its code
    is gone), with a succeeded job (1) and a job running under token 5 of worker "old" (2).
    Returns its schema version."""
    previous = len(sqlite_queue.MIGRATIONS) - 1
    with sqlite3.connect(path) as conn:
        for number, script in enumerate(sqlite_queue.MIGRATIONS[:previous], start=1):
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version={number}")
        columns = (
            "queue, payload, state, attempts, max_attempts, token, available_at_ms,"
            " lease_owner, lease_until_ms, created_at_ms, finished_at_ms, claimed_at_ms"
        )
        now = time_ns() // 1_000_000
        conn.execute(
            f"INSERT INTO jobs ({columns}) VALUES ('q', x'00', 'succeeded', 1, 5, 4, ?, 'w',"
            " 0, ?, ?, ?)",
            (now, now, now, now),
        )
        conn.execute(
            f"INSERT INTO jobs ({columns}) VALUES ('q', x'00', 'running', 1, 5, 5, ?, 'old',"
            " ?, ?, 0, ?)",
            (now, now + LONG, now, now),
        )
        conn.execute("UPDATE counters SET value = 5 WHERE name = 'token'")
    return previous


async def test_a_sqlite_queue_of_the_previous_schema_upgrades_with_empty_histories() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "queue.db"
        previous = previous_sqlite_schema(path)
        new = SQLiteQueue(path)
        await new.open()
        try:
            with sqlite3.connect(path) as conn:
                (version,) = conn.execute("PRAGMA user_version").fetchone()
            assert version == previous + 1
            assert await new.history(1) == []  # finished before: no history, no crash
            assert await new.history(2) == []
            stored = await new.get(1)
            assert stored is not None and stored.state is JobState.SUCCEEDED
            # A claim made before the upgrade still ends as an attempt.
            await new.fail(JobRef(2, 5), "late", no_delay)
            assert outline(await new.history(2)) == [(1, "old", 5, AttemptOutcome.FAILED, "late")]
            again = await claim_one(new)
            assert again.id == 2 and again.token > 5
            assert [a.attempt for a in await new.history(2)] == [1, 2]
        finally:
            await new.close()
