"""The queue backend contract for retried claims: a Claim carrying the request id of an
earlier one whose jobs still run under it gets those jobs back (same tokens, same
attempts, leases extended) and claims nothing new, in every backend, as a retried
Acquire gets its lease back. Each safety test keeps its control: the same retry with a
fresh request id (what every client sent before) burns an attempt.
"""

from __future__ import annotations

from fencing.errors import LeaseLost
from lease_server.queue.jobs import JobRef, JobState
from tests.contract.test_queue_backend import LONG, TTL, Pair, enqueue, ref, state_of


async def test_a_retry_with_the_same_request_id_gets_the_same_jobs(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    ids = [await enqueue(backend, payload=b"%d" % i) for i in range(5)]
    first = await backend.claim("q", "w", 2, LONG, "req-1")
    assert [r.id for r in first] == ids[:2]
    again = await backend.claim("q", "w", 2, LONG, "req-1")
    assert [(r.id, r.token, r.attempts) for r in again] == [
        (r.id, r.token, r.attempts) for r in first
    ]
    assert all(r.state is JobState.RUNNING and r.lease_owner == "w" for r in again)
    # Nothing more was claimed: the other three are still ready.
    assert [await state_of(backend, i) for i in ids[2:]] == [JobState.READY] * 3
    # Control: a fresh request id claims new jobs, as any Claim does.
    fresh = await backend.claim("q", "w", 2, LONG, "req-2")
    assert [r.id for r in fresh] == ids[2:4]
    assert all(r.attempts == 1 for r in fresh)


async def test_a_replayed_claim_is_still_current_and_its_lease_extended(
    queue_backend: Pair,
) -> None:
    backend, time = queue_backend
    job_id = await enqueue(backend)
    (first,) = await backend.claim("q", "w", 1, TTL, "req-1")
    await time.sleep(TTL // 2)
    (again,) = await backend.claim("q", "w", 1, LONG, "req-1")
    assert (again.id, again.token, again.attempts) == (job_id, first.token, 1)
    stored = await backend.get(job_id)
    assert stored is not None and stored.lease_until_ms > first.lease_until_ms
    # The token is the claim's: heartbeat and complete take it.
    await backend.heartbeat([ref(again)], LONG, "q")
    await backend.complete([ref(again)], "q")
    assert await state_of(backend, job_id) is JobState.SUCCEEDED


async def test_a_lost_reply_past_the_ttl_burns_no_attempt(queue_backend: Pair) -> None:
    """The retry arrives after the lease of the claim it lost ran out: nobody rescued the
    job yet, so the claim is still current and the retry gets it, attempt 1, not 2."""
    backend, time = queue_backend
    job_id = await enqueue(backend, max_attempts=3)
    (first,) = await backend.claim("q", "w", 1, TTL, "req-1")
    await time.sleep(TTL + 50)
    (again,) = await backend.claim("q", "w", 1, LONG, "req-1")
    assert (again.id, again.token, again.attempts) == (job_id, first.token, 1)
    assert "lease expired" not in again.last_error
    record = await backend.get(job_id)
    assert record is not None and record.attempts == 1 and not record.expired(0)


async def test_control_a_fresh_request_id_burns_an_attempt(queue_backend: Pair) -> None:
    """What a client without request ids did: its retry rescues the job it had been
    granted, counting a second attempt for a job that never ran."""
    backend, time = queue_backend
    job_id = await enqueue(backend, max_attempts=3)
    (first,) = await backend.claim("q", "w", 1, TTL, "req-1")
    await time.sleep(TTL + 50)
    (again,) = await backend.claim("q", "w", 1, LONG, "req-2")
    assert again.id == job_id and again.attempts == 2 and again.token > first.token
    assert "lease expired" in again.last_error


async def test_on_the_last_attempt_a_lost_reply_does_not_kill_the_job(
    queue_backend: Pair,
) -> None:
    backend, time = queue_backend
    job_id = await enqueue(backend, max_attempts=1)
    (first,) = await backend.claim("q", "w", 1, TTL, "req-1")
    await time.sleep(TTL + 50)
    (again,) = await backend.claim("q", "w", 1, LONG, "req-1")
    assert (again.id, again.token, again.attempts) == (job_id, first.token, 1)
    assert await backend.reap(10) == 0
    assert await state_of(backend, job_id) is JobState.RUNNING


async def test_control_on_the_last_attempt_a_fresh_id_leaves_the_job_to_die(
    queue_backend: Pair,
) -> None:
    backend, time = queue_backend
    job_id = await enqueue(backend, max_attempts=1)
    await backend.claim("q", "w", 1, TTL, "req-1")
    await time.sleep(TTL + 50)
    assert await backend.claim("q", "w", 1, LONG, "req-2") == []
    assert await backend.reap(10) == 1
    assert await state_of(backend, job_id) is JobState.DEAD


async def test_a_claim_that_ended_is_not_replayed(queue_backend: Pair) -> None:
    """Completed, failed, released or cancelled: the retry claims afresh (the jobs it
    finds are others, or the same job as a new claim after a release)."""
    backend, _ = queue_backend
    a, b, c = [await enqueue(backend) for _ in range(3)]
    claimed = await backend.claim("q", "w", 3, LONG, "req-1")
    assert [r.id for r in claimed] == [a, b, c]
    await backend.complete([ref(claimed[0])], "q")
    await backend.fail(ref(claimed[1]), "boom", lambda _: LONG, queue="q")
    await backend.cancel(c, "q", "no")
    assert await backend.claim("q", "w", 3, LONG, "req-1") == []
    d = await enqueue(backend)
    (released,) = await backend.claim("q", "w", 1, LONG, "req-2")
    assert released.id == d
    await backend.release([ref(released)], "q")
    (reclaimed,) = await backend.claim("q", "w", 1, LONG, "req-2")
    assert reclaimed.id == d and reclaimed.token > released.token


async def test_a_rescued_claim_is_not_replayed(queue_backend: Pair) -> None:
    backend, time = queue_backend
    job_id = await enqueue(backend, max_attempts=3)
    (first,) = await backend.claim("q", "w1", 1, TTL, "req-1")
    await time.sleep(TTL + 50)
    (rescue,) = await backend.claim("q", "w2", 1, LONG, "req-2")
    assert rescue.id == job_id and rescue.attempts == 2
    # w1's late retry finds its claim taken over: nothing to replay, nothing to claim.
    assert await backend.claim("q", "w1", 1, LONG, "req-1") == []
    try:
        await backend.heartbeat([JobRef(job_id, first.token)], LONG, "q")
    except LeaseLost:
        pass
    else:
        raise AssertionError("the rescued claim's token is still current")


async def test_a_request_id_replays_only_for_its_worker_and_queue(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    a = await enqueue(backend)
    b = await enqueue(backend)
    other = await enqueue(backend, queue="other")
    (mine,) = await backend.claim("q", "w1", 1, LONG, "req-1")
    assert mine.id == a
    # Another worker with the same id (a bug, or a guess) gets no one else's claim.
    (theirs,) = await backend.claim("q", "w2", 1, LONG, "req-1")
    assert theirs.id == b and theirs.token != mine.token
    (elsewhere,) = await backend.claim("other", "w1", 1, LONG, "req-1")
    assert elsewhere.id == other


async def test_no_request_id_never_replays(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    a = await enqueue(backend)
    b = await enqueue(backend)
    assert [r.id for r in await backend.claim("q", "w", 1, LONG)] == [a]
    assert [r.id for r in await backend.claim("q", "w", 1, LONG, "")] == [b]


async def test_complete_and_claim_replays_its_claim_and_its_completes(
    queue_backend: Pair,
) -> None:
    backend, _ = queue_backend
    done_id = await enqueue(backend)
    (done,) = await backend.claim("q", "w", 1, LONG, "req-0")
    ids = [await enqueue(backend) for _ in range(3)]
    verdicts, _, first = await backend.complete_and_claim(
        [([ref(done)], "q")], "q", "w", 2, LONG, "req-1"
    )
    assert verdicts == [None] and [r.id for r in first] == ids[:2]
    verdicts, _, again = await backend.complete_and_claim(
        [([ref(done)], "q")], "q", "w", 2, LONG, "req-1"
    )
    assert verdicts == [None]  # a repeat complete is a no-op
    assert [(r.id, r.token, r.attempts) for r in again] == [
        (r.id, r.token, r.attempts) for r in first
    ]
    assert await state_of(backend, done_id) is JobState.SUCCEEDED
    assert await state_of(backend, ids[2]) is JobState.READY


async def test_a_replay_keeps_the_original_claims_apart_from_new_work(
    queue_backend: Pair,
) -> None:
    """A batch that claimed fewer jobs than asked is replayed as it was: work enqueued
    since is left for the next Claim (a replay answers the lost reply, no more)."""
    backend, _ = queue_backend
    a = await enqueue(backend)
    first = await backend.claim("q", "w", 5, LONG, "req-1")
    assert [r.id for r in first] == [a]
    b = await enqueue(backend)
    again = await backend.claim("q", "w", 5, LONG, "req-1")
    assert [r.id for r in again] == [a]
    assert await state_of(backend, b) is JobState.READY
