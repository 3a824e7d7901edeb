"""The queue backend contract: every implementation in tests/backends.py passes it.

It includes a job queue's checklist of transitions, one test each (``test_seed_*``):
ready -> running on claim with attempts + 1; running -> succeeded; running -> ready
after a failure with a later due time; an expired running job -> running under a new
owner; an exhausted job -> dead. Plus ordering keys, tokens, idempotency, retention.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any

import pytest

from fencing.errors import LeaseLost
from lease_server.queue.backends.base import QueueBackend
from lease_server.queue.jobs import REAPED_ERROR, JobRecord, JobRef, JobState, NewJob
from tests.backends import TimeControl

Pair = tuple[QueueBackend, TimeControl]

TTL = 300  # ms: short enough to expire by really sleeping on database clocks
LONG = 60_000


def job(payload: bytes = b"x", **kw: Any) -> NewJob:
    return replace(NewJob(payload), **kw)


def ref(record: JobRecord) -> JobRef:
    return JobRef(record.id, record.token)


async def enqueue(backend: QueueBackend, queue: str = "q", **kw: Any) -> int:
    (e,) = await backend.enqueue(queue, [job(**kw)])
    assert e.created
    return e.id


async def claim_one(
    backend: QueueBackend, queue: str = "q", worker: str = "w", ttl: int = LONG
) -> JobRecord:
    claimed = await backend.claim(queue, worker, 1, ttl)
    assert len(claimed) == 1, claimed
    return claimed[0]


async def state_of(backend: QueueBackend, job_id: int) -> JobState:
    record = await backend.get(job_id)
    assert record is not None
    return record.state


def no_delay(attempts: int) -> int:
    return 0


# -- the checklist's transitions------------------------------------------------------------------


async def test_seed_ready_to_running_on_claim_with_attempts_plus_one(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    job_id = await enqueue(backend, payload=b"hello")
    assert await state_of(backend, job_id) is JobState.READY
    claimed = await claim_one(backend, worker="w1")
    assert claimed.id == job_id and claimed.payload == b"hello"
    assert claimed.state is JobState.RUNNING and claimed.attempts == 1
    assert claimed.lease_owner == "w1" and claimed.token >= 1
    stored = await backend.get(job_id)
    assert stored is not None and stored.state is JobState.RUNNING and stored.token == claimed.token
    assert await backend.claim("q", "w2", 10, LONG) == []


async def test_seed_running_to_succeeded_on_complete(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await enqueue(backend)
    claimed = await claim_one(backend)
    await backend.complete([ref(claimed)])
    stored = await backend.get(claimed.id)
    assert stored is not None and stored.state is JobState.SUCCEEDED
    assert stored.finished_at_ms > 0 and stored.lease_owner == "w"  # who ran it
    await backend.complete([ref(claimed)])  # a retried Complete is a no-op
    assert await backend.claim("q", "w", 10, LONG) == []


async def test_seed_running_to_ready_after_failure_with_a_later_due_time(
    queue_backend: Pair,
) -> None:
    backend, time = queue_backend
    await enqueue(backend, max_attempts=3)
    claimed = await claim_one(backend)
    failed = await backend.fail(ref(claimed), "boom", lambda attempts: 400 * attempts)
    assert failed.state is JobState.READY and failed.retry_in_ms == 400
    stored = await backend.get(claimed.id)
    assert stored is not None and stored.state is JobState.READY and stored.last_error == "boom"
    assert await backend.claim("q", "w", 1, LONG) == []  # not due yet
    await time.sleep(450)
    again = await claim_one(backend)
    assert again.id == claimed.id and again.attempts == 2 and again.token > claimed.token
    assert again.last_error == "boom"


async def test_seed_expired_running_job_is_claimed_by_a_new_owner(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await enqueue(backend)
    first = await claim_one(backend, worker="crashed", ttl=TTL)
    await time.sleep(TTL + 50)
    second = await claim_one(backend, worker="rescuer")
    assert second.id == first.id and second.lease_owner == "rescuer"
    assert second.attempts == 2 and second.token > first.token
    assert "lease expired" in second.last_error and "crashed" in second.last_error


async def test_seed_exhausted_job_goes_dead(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await enqueue(backend, max_attempts=2)
    for attempt in (1, 2):
        claimed = await claim_one(backend)
        assert claimed.attempts == attempt
        failed = await backend.fail(ref(claimed), f"fail {attempt}", no_delay)
    assert failed.state is JobState.DEAD
    stored = await backend.get(claimed.id)
    assert stored is not None and stored.state is JobState.DEAD and stored.last_error == "fail 2"
    assert await backend.claim("q", "w", 1, LONG) == []


async def test_seed_exhausted_expired_job_goes_dead_by_the_reaper(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await enqueue(backend, max_attempts=1)
    claimed = await claim_one(backend, ttl=TTL)
    assert await backend.reap(100) == 0  # the lease is still live
    await time.sleep(TTL + 50)
    assert await backend.claim("q", "w", 1, LONG) == []  # no attempt left: not rescued
    assert await backend.reap(100) == 1
    stored = await backend.get(claimed.id)
    assert stored is not None and stored.state is JobState.DEAD
    assert stored.last_error == REAPED_ERROR
    assert await backend.reap(100) == 0


# -- stale tokens --------------------------------------------------------------------------------


async def test_a_finished_or_failed_job_keeps_the_worker_that_ran_it(queue_backend: Pair) -> None:
    """lease_owner names who ran the job once it completed, failed (to retry, or dead),
    died by the reaper or was cancelled; a job given back (Release) has none until its
    next claim."""
    backend, time = queue_backend
    done, retried, dead, reaped, cancelled, back = [
        await enqueue(backend, queue=name, max_attempts=1 if name in ("dead", "reaped") else 3)
        for name in ("done", "retried", "dead", "reaped", "cancelled", "back")
    ]
    claims = {
        name: await claim_one(backend, name, worker=f"worker-{name}", ttl=TTL)
        for name in ("done", "retried", "dead", "reaped", "cancelled", "back")
    }
    await backend.complete([ref(claims["done"])], "done")
    await backend.fail(ref(claims["retried"]), "boom", lambda attempts: LONG, queue="retried")
    await backend.fail(ref(claims["dead"]), "boom", no_delay, queue="dead")
    assert await backend.cancel(cancelled, "cancelled", "operator") is not None
    await backend.release([ref(claims["back"])], "back")
    await time.sleep(TTL + 50)
    assert await backend.reap(100) == 1
    owners = {}
    for name, job_id in zip(
        ("done", "retried", "dead", "reaped", "cancelled", "back"),
        (done, retried, dead, reaped, cancelled, back),
        strict=True,
    ):
        record = await backend.get(job_id)
        assert record is not None
        owners[name] = (record.state.value, record.lease_owner)
    assert owners == {
        "done": ("succeeded", "worker-done"),
        "retried": ("ready", "worker-retried"),
        "dead": ("dead", "worker-dead"),
        "reaped": ("dead", "worker-reaped"),
        "cancelled": ("cancelled", "worker-cancelled"),
        "back": ("ready", ""),
    }
    # The next claim names its own worker.
    again = await claim_one(backend, "back", worker="next")
    assert again.lease_owner == "next"


async def test_a_stale_token_is_refused_everywhere_and_changes_nothing(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await enqueue(backend)
    old = await claim_one(backend, worker="paused", ttl=TTL)
    await time.sleep(TTL + 50)
    new = await claim_one(backend, worker="rescuer")
    before = await backend.get(new.id)
    with pytest.raises(LeaseLost) as info:
        await backend.heartbeat([ref(old)], LONG)
    assert info.value.token == old.token and info.value.resource == f"job/q/{old.id}"
    with pytest.raises(LeaseLost):
        await backend.complete([ref(old)])
    with pytest.raises(LeaseLost):
        await backend.fail(ref(old), "late", no_delay)
    with pytest.raises(LeaseLost):
        await backend.release([ref(old)])
    assert await backend.get(new.id) == before
    await backend.complete([ref(new)])
    assert await state_of(backend, new.id) is JobState.SUCCEEDED


async def test_an_expired_claim_nobody_rescued_is_still_current(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await enqueue(backend)
    claimed = await claim_one(backend, ttl=TTL)
    await time.sleep(TTL + 50)
    await backend.complete([ref(claimed)])  # nobody took it over: the late worker may finish
    assert await state_of(backend, claimed.id) is JobState.SUCCEEDED


async def test_unknown_jobs_and_wrong_tokens_are_lease_lost(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    with pytest.raises(LeaseLost):
        await backend.complete([JobRef(987654, 1)])
    await enqueue(backend)
    claimed = await claim_one(backend)
    with pytest.raises(LeaseLost):
        await backend.heartbeat([JobRef(claimed.id, claimed.token + 1)], LONG)
    with pytest.raises(LeaseLost):
        await backend.complete([JobRef(claimed.id, claimed.token - 1 or 999_999)])


async def test_batch_calls_are_all_or_nothing(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await backend.enqueue("q", [job(b"a"), job(b"b")])
    a = await claim_one(backend, ttl=TTL)
    b = await claim_one(backend, ttl=LONG)
    await time.sleep(TTL + 50)
    a2 = await claim_one(backend)  # a is rescued: its first token is stale
    with pytest.raises(LeaseLost) as info:
        await backend.complete([ref(b), ref(a)])
    assert info.value.token == a.token
    assert await state_of(backend, b.id) is JobState.RUNNING  # b was not completed either
    with pytest.raises(LeaseLost):
        await backend.heartbeat([ref(b), ref(a)], LONG)
    with pytest.raises(LeaseLost):
        await backend.release([ref(b), ref(a)])
    assert await state_of(backend, b.id) is JobState.RUNNING
    await backend.complete([ref(b), ref(a2)])
    assert await state_of(backend, a.id) is JobState.SUCCEEDED


async def test_complete_batch_judges_each_group_alone(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await backend.enqueue("q", [job(b"a"), job(b"b"), job(b"c")])
    await backend.enqueue("other", [job(b"o")])
    a = await claim_one(backend, ttl=TTL)
    b = await claim_one(backend)
    c = await claim_one(backend)
    o = await claim_one(backend, "other")
    await time.sleep(TTL + 50)
    a2 = await claim_one(backend, worker="rescuer")  # a's first token is stale now
    verdicts, _ = await backend.complete_batch(
        [([ref(a)], "q"), ([ref(b)], "q"), ([ref(o)], "q"), ([ref(c), ref(a)], ""), ([ref(b)], "")]
    )
    # The stale claim, the job of another queue and the group holding a stale claim are
    # refused alone; b completes, and naming it again is a replay, not a refusal.
    assert [v is None for v in verdicts] == [False, True, False, False, True]
    stale, other, mixed = verdicts[0], verdicts[2], verdicts[3]
    assert stale is not None and stale.token == a.token and stale.resource == f"job/q/{a.id}"
    assert other is not None and other.token == o.token and other.resource == ""
    assert mixed is not None and mixed.token == a.token
    assert await state_of(backend, b.id) is JobState.SUCCEEDED
    assert await state_of(backend, c.id) is JobState.RUNNING  # its group was refused whole
    rescued = await backend.get(a.id)
    assert rescued is not None and rescued.state is JobState.RUNNING
    assert rescued.token == a2.token
    assert await state_of(backend, o.id) is JobState.RUNNING
    verdicts, _ = await backend.complete_batch([([ref(c)], "q"), ([ref(a2)], "q")])
    assert verdicts == [None, None]
    assert await state_of(backend, a.id) is JobState.SUCCEEDED


async def test_complete_batch_wakes_the_next_job_of_an_ordering_key(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await backend.enqueue("q", [job(b"k1", ordering_key="k"), job(b"k2", ordering_key="k")])
    k1 = await claim_one(backend)
    assert await backend.complete_batch([]) == ([], set())
    verdicts, woken = await backend.complete_batch([([ref(k1)], "q")])
    assert verdicts == [None] and woken == {"q"}
    k2 = await claim_one(backend)
    assert k2.payload == b"k2"


async def test_complete_and_claim_completes_first_and_claims_on(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await backend.enqueue("q", [job(b"k1", ordering_key="k"), job(b"k2", ordering_key="k")])
    await backend.enqueue("q", [job(b"free")])
    k1 = await claim_one(backend)
    free = await claim_one(backend, ttl=TTL)
    await time.sleep(TTL + 50)
    rescued = await claim_one(backend, worker="rescuer")
    assert rescued.id == free.id
    verdicts, woken, claimed = await backend.complete_and_claim(
        [([ref(free)], "q"), ([ref(k1)], "q")], "q", "w", 5, LONG
    )
    # The stale complete is refused alone; k1 completes, so k2 (behind it on its
    # ordering key) is ready for the claim of the same call.
    assert verdicts[1] is None and woken == {"q"}
    stale = verdicts[0]
    assert stale is not None and stale.token == free.token
    assert [r.payload for r in claimed] == [b"k2"]
    assert await state_of(backend, k1.id) is JobState.SUCCEEDED
    still = await backend.get(free.id)
    assert still is not None and still.token == rescued.token
    assert still.state is JobState.RUNNING
    assert await backend.complete_and_claim([], "q", "w", 5, LONG) == ([], set(), [])


async def test_heartbeat_keeps_a_job_from_being_rescued(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await enqueue(backend)
    claimed = await claim_one(backend, ttl=TTL)
    for _ in range(3):
        await time.sleep(TTL // 2)
        await backend.heartbeat([ref(claimed)], TTL)
    assert await backend.claim("q", "other", 1, LONG) == []
    stored = await backend.get(claimed.id)
    assert stored is not None and stored.token == claimed.token


# -- tokens --------------------------------------------------------------------------------------


async def test_every_claim_takes_a_larger_token(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await backend.enqueue("q", [job() for _ in range(5)])
    await backend.enqueue("other", [job()])
    first = await backend.claim("q", "w", 3, TTL)
    other = await backend.claim("other", "w", 3, LONG)
    await time.sleep(TTL + 50)
    later = await backend.claim("q", "w", 10, LONG)
    assert (len(first), len(other), len(later)) == (3, 1, 5)
    earlier = [r.token for r in first + other]
    assert len(set(earlier)) == 4
    # Rescues first (each a larger token than its job's previous claim), then the rest.
    assert [r.id for r in later[:3]] == sorted(r.id for r in first)
    assert min(r.token for r in later) > max(earlier)
    assert len({r.token for r in later}) == 5


async def test_resource_is_the_job_or_the_one_it_names(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    plain = await enqueue(backend)
    named = await enqueue(backend, resource="accounts/7")
    claimed = {r.id: r for r in await backend.claim("q", "w", 2, LONG)}
    assert claimed[plain].fenced_resource == f"job/q/{plain}"
    assert claimed[named].fenced_resource == "accounts/7"


# -- a job naming its own resource: its token is its lease's (lease_server/queue/resources.py) ---


async def test_retoken_gives_the_claim_its_leases_token_lower_or_higher(
    queue_backend: Pair,
) -> None:
    backend, _ = queue_backend
    for _ in range(3):  # the claims' counter passes 3
        await enqueue(backend, queue="other")
        await claim_one(backend, queue="other")
    job_id = await enqueue(backend, resource="orders/1")
    provisional = await claim_one(backend)
    assert provisional.token > 1
    # A lower token (the resource's lease counter is behind the claims'): stored as given.
    stored = await backend.retoken(ref(provisional), 1)
    assert (stored.id, stored.token, stored.state) == (job_id, 1, JobState.RUNNING)
    assert stored.lease_owner == "w" and stored.attempts == 1
    got = await backend.get(job_id)
    assert got is not None and got.token == 1
    assert await backend.retoken(JobRef(job_id, provisional.token), 1) == stored  # a repeat
    with pytest.raises(LeaseLost):  # the provisional token is no claim any more
        await backend.heartbeat([ref(provisional)], LONG)
    await backend.heartbeat([JobRef(job_id, 1)], LONG)
    # A higher one, then the job is completed with it.
    higher = await backend.retoken(JobRef(job_id, 1), 10_000)
    assert higher.token == 10_000
    with pytest.raises(LeaseLost):
        await backend.retoken(JobRef(job_id, 1), 10_001)
    await backend.complete([JobRef(job_id, 10_000)])
    assert await state_of(backend, job_id) is JobState.SUCCEEDED


async def test_a_job_whose_lease_token_passed_the_claims_counter_is_rescued_and_cancelled(
    queue_backend: Pair,
) -> None:
    backend, time = queue_backend
    job_id = await enqueue(backend, resource="orders/1")
    first = await claim_one(backend, ttl=TTL)
    await backend.retoken(ref(first), 10_000)  # the resource's leases are far ahead
    await time.sleep(TTL + 50)
    # The rescue's provisional token comes from the claims' counter: below the lease's.
    rescued = await claim_one(backend, worker="rescuer")
    assert rescued.id == job_id and rescued.attempts == 2
    stored = await backend.retoken(ref(rescued), 10_002)
    assert stored.token == 10_002
    outcome = await backend.cancel(job_id, "q", "stop")
    assert outcome is not None and outcome.record.state is JobState.CANCELLED
    assert outcome.fence_token != 10_002
    with pytest.raises(LeaseLost):
        await backend.heartbeat([JobRef(job_id, 10_002)], LONG)


async def test_put_back_gives_the_job_back_due_later_without_counting_the_attempt(
    queue_backend: Pair,
) -> None:
    backend, time = queue_backend
    job_id = await enqueue(backend, resource="orders/1")
    claimed = await claim_one(backend)
    await backend.put_back(ref(claimed), 400)
    got = await backend.get(job_id)
    assert got is not None and got.state is JobState.READY and got.attempts == 0
    assert got.lease_owner == ""
    assert await backend.claim("q", "w", 1, LONG) == []  # not due yet
    await backend.put_back(ref(claimed), 0)  # a repeat changes nothing: still not due
    assert await backend.claim("q", "w", 1, LONG) == []
    with pytest.raises(LeaseLost):
        await backend.put_back(JobRef(job_id, claimed.token + 1), 0)
    await time.sleep(450)
    again = await claim_one(backend)
    assert again.id == job_id and again.attempts == 1


# -- enqueue -------------------------------------------------------------------------------------


async def test_idempotency_key_returns_the_first_job(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    (first,) = await backend.enqueue("q", [job(b"1", idempotency_key="k")])
    (second,) = await backend.enqueue("q", [job(b"2", idempotency_key="k")])
    assert first.created and not second.created and second.id == first.id
    # ... also within one batch, and after the job finished.
    batch = await backend.enqueue(
        "q", [job(b"3", idempotency_key="j"), job(b"4", idempotency_key="j")]
    )
    assert batch[0].created and not batch[1].created and batch[1].id == batch[0].id
    claimed = await backend.claim("q", "w", 10, LONG)
    assert sorted(r.payload for r in claimed) == [b"1", b"3"]
    await backend.complete([ref(r) for r in claimed])
    (third,) = await backend.enqueue("q", [job(b"5", idempotency_key="k")])
    assert not third.created and third.id == first.id and third.state is JobState.SUCCEEDED
    # Keys are per queue.
    (elsewhere,) = await backend.enqueue("other", [job(b"6", idempotency_key="k")])
    assert elsewhere.created and elsewhere.id != first.id


async def test_claim_order_is_priority_then_due_time_then_enqueue_order(
    queue_backend: Pair,
) -> None:
    backend, time = queue_backend
    ids = [
        e.id
        for e in await backend.enqueue(
            "q",
            [
                job(b"low", priority=-1),
                job(b"a"),
                job(b"b"),
                job(b"high", priority=5),
                job(b"later", delay_ms=200),
            ],
        )
    ]
    await time.sleep(250)
    order = [r.payload for r in await backend.claim("q", "w", 10, LONG)]
    assert order == [b"high", b"a", b"b", b"later", b"low"]
    assert ids == sorted(ids) and len(set(ids)) == 5  # ids follow the batch order


async def test_a_delayed_job_waits_for_its_due_time(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await enqueue(backend, delay_ms=300)
    assert await backend.claim("q", "w", 1, LONG) == []
    await time.sleep(350)
    assert len(await backend.claim("q", "w", 1, LONG)) == 1


async def test_queues_are_separate(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await enqueue(backend, "a", payload=b"for a")
    assert await backend.claim("b", "w", 1, LONG) == []
    assert (await claim_one(backend, "a")).payload == b"for a"


# -- fail and release ----------------------------------------------------------------------------


async def test_fail_final_is_dead_at_once_and_repeats_are_noops(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await enqueue(backend, max_attempts=5)
    claimed = await claim_one(backend)
    assert (
        await backend.fail(ref(claimed), "bad input", no_delay, final=True)
    ).state is JobState.DEAD
    again = await backend.fail(ref(claimed), "bad input", no_delay, final=True)
    assert again.state is JobState.DEAD


async def test_retry_delay_sees_the_attempts_used(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await enqueue(backend, max_attempts=4)
    seen: list[int] = []

    def delay(attempts: int) -> int:
        seen.append(attempts)
        return 10

    for _ in range(3):
        claimed = await claim_one(backend)
        await backend.fail(ref(claimed), "e", delay)
        await time.sleep(20)
    assert seen == [1, 2, 3]


async def test_release_gives_the_job_back_now_without_counting_the_attempt(
    queue_backend: Pair,
) -> None:
    backend, _ = queue_backend
    await enqueue(backend, max_attempts=1)
    claimed = await claim_one(backend)
    await backend.release([ref(claimed)])
    await backend.release([ref(claimed)])  # a retried Release is a no-op
    stored = await backend.get(claimed.id)
    assert stored is not None and stored.state is JobState.READY and stored.attempts == 0
    again = await claim_one(backend)
    assert again.id == claimed.id and again.attempts == 1 and again.token > claimed.token
    with pytest.raises(LeaseLost):
        await backend.complete([ref(claimed)])


# -- ordering keys -------------------------------------------------------------------------------


async def test_ordering_key_runs_one_job_at_a_time_in_enqueue_order(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    enqueued = await backend.enqueue(
        "q",
        [
            job(b"k1", ordering_key="k"),
            job(b"free"),
            job(b"k2", ordering_key="k"),
            job(b"k3", ordering_key="k", priority=100),
        ],
    )
    assert [e.state for e in enqueued] == [
        JobState.READY,
        JobState.READY,
        JobState.WAITING,
        JobState.WAITING,
    ]
    first = await backend.claim("q", "w", 10, LONG)
    assert sorted(r.payload for r in first) == [b"free", b"k1"]
    k1 = next(r for r in first if r.payload == b"k1")
    assert await backend.claim("q", "w", 10, LONG) == []
    await backend.complete([ref(k1)])
    (k2,) = await backend.claim("q", "w", 10, LONG)
    assert k2.payload == b"k2"
    (late,) = await backend.enqueue("q", [job(b"k4", ordering_key="k")])
    assert late.state is JobState.WAITING
    await backend.complete([ref(k2)])
    (k3,) = await backend.claim("q", "w", 10, LONG)
    assert k3.payload == b"k3"


async def test_a_failing_head_keeps_its_key_in_order_and_a_dead_one_lets_it_go(
    queue_backend: Pair,
) -> None:
    backend, time = queue_backend
    await backend.enqueue(
        "q", [job(b"h", ordering_key="k", max_attempts=2), job(b"n", ordering_key="k")]
    )
    head = await claim_one(backend)
    await backend.fail(ref(head), "e", lambda attempts: 100)
    await time.sleep(150)
    retried = await claim_one(backend)
    assert retried.payload == b"h"  # not overtaken by the next job of its key
    await backend.fail(ref(retried), "e", no_delay)  # dead
    nxt = await claim_one(backend)
    assert nxt.payload == b"n"


async def test_an_expired_head_is_rescued_before_its_key_moves_on(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await backend.enqueue("q", [job(b"h", ordering_key="k"), job(b"n", ordering_key="k")])
    head = await claim_one(backend, ttl=TTL)
    await time.sleep(TTL + 50)
    claimed = await backend.claim("q", "w", 10, LONG)
    assert [r.payload for r in claimed] == [b"h"] and claimed[0].token > head.token


async def test_the_reaper_lets_an_ordering_key_move_on(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await backend.enqueue(
        "q", [job(b"h", ordering_key="k", max_attempts=1), job(b"n", ordering_key="k")]
    )
    await claim_one(backend, ttl=TTL)
    await time.sleep(TTL + 50)
    assert await backend.claim("q", "w", 10, LONG) == []
    assert await backend.reap(10) == 1
    assert (await claim_one(backend)).payload == b"n"


async def test_ordering_keys_hold_under_concurrent_claimers(queue_backend: Pair) -> None:
    """8 claimers on 4 keys x 12 jobs: per key, one job at a time and in enqueue order."""
    backend, _ = queue_backend
    keys = ["a", "b", "c", "d"]
    specs = [job(f"{k}{i}".encode(), ordering_key=k) for i in range(12) for k in keys]
    enqueued = await backend.enqueue("q", specs)
    expected = {
        k: [e.id for e, s in zip(enqueued, specs, strict=True) if s.ordering_key == k] for k in keys
    }
    running: dict[str, int] = {}
    order: dict[str, list[int]] = {k: [] for k in keys}
    violations: list[str] = []
    rng = random.Random(7)

    async def claimer(name: str) -> None:
        for _ in range(400):
            if sum(map(len, order.values())) == len(specs):
                return
            claimed = await backend.claim("q", name, rng.randint(1, 3), LONG)
            if not claimed:
                await asyncio.sleep(0.002)
                continue
            for r in claimed:
                if r.ordering_key in running:
                    violations.append(f"{r.id} claimed while {running[r.ordering_key]} runs")
                running[r.ordering_key] = r.id
                order[r.ordering_key].append(r.id)
            await asyncio.sleep(rng.random() * 0.003)
            for r in claimed:
                del running[r.ordering_key]  # before Complete: the next may come at once
            await backend.complete([ref(r) for r in claimed])

    await asyncio.wait_for(asyncio.gather(*(claimer(f"w{i}") for i in range(8))), 60)
    assert violations == []
    assert order == expected


async def test_concurrent_claimers_never_share_a_job(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await backend.enqueue("q", [job(str(i).encode()) for i in range(200)])
    seen: list[int] = []

    async def claimer(name: str) -> None:
        for _ in range(200):
            claimed = await backend.claim("q", name, 7, LONG)
            if not claimed:
                return
            seen.extend(r.id for r in claimed)

    await asyncio.wait_for(asyncio.gather(*(claimer(f"w{i}") for i in range(10))), 60)
    assert len(seen) == 200 and len(set(seen)) == 200


# -- retention and stats -------------------------------------------------------------------------


async def test_prune_deletes_finished_jobs_past_their_retention(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await backend.enqueue("q", [job(b"ok", idempotency_key="ok"), job(b"bad"), job(b"open")])
    by_payload = {r.payload: r for r in await backend.claim("q", "w", 2, LONG)}
    await backend.complete([ref(by_payload[b"ok"])])
    await backend.fail(ref(by_payload[b"bad"]), "e", no_delay, final=True)
    assert await backend.prune(60_000, 60_000, 100) == 0
    await time.sleep(300)
    assert await backend.prune(200, None, 100) == 1  # succeeded only; dead kept forever
    assert await backend.get(by_payload[b"ok"].id) is None
    assert await state_of(backend, by_payload[b"bad"].id) is JobState.DEAD
    assert await backend.prune(None, 200, 100) == 1
    stats = await backend.stats("q", 60_000)
    assert stats[0].ready == 1 and stats[0].succeeded == 0 and stats[0].dead == 0
    # The idempotency key went with the row: the same key now makes a new job.
    (again,) = await backend.enqueue("q", [job(b"ok", idempotency_key="ok")])
    assert again.created


async def test_stats_count_every_state(queue_backend: Pair) -> None:
    backend, time = queue_backend
    await backend.enqueue(
        "q",
        [
            job(b"run"),
            job(b"expire"),
            job(b"done"),
            job(b"dead", max_attempts=1),
            job(b"retry", max_attempts=3),
            job(b"head", ordering_key="k", priority=-5),
            job(b"waits", ordering_key="k"),
            job(b"later", delay_ms=LONG),
        ],
    )
    await backend.enqueue("other", [job()])
    claimed = {r.payload: r for r in await backend.claim("q", "w", 5, TTL)}
    assert set(claimed) == {b"run", b"expire", b"done", b"dead", b"retry"}
    await backend.heartbeat([ref(claimed[b"run"])], LONG)
    await backend.complete([ref(claimed[b"done"])])
    await backend.fail(ref(claimed[b"dead"]), "e", no_delay)
    await backend.fail(ref(claimed[b"retry"]), "e", lambda attempts: LONG)
    await time.sleep(TTL + 100)
    (q,) = await backend.stats("q", 60_000)
    assert (q.queue, q.running, q.expired, q.succeeded, q.dead) == ("q", 2, 1, 1, 1)
    assert (q.ready, q.scheduled, q.waiting, q.retrying) == (1, 2, 1, 1)
    assert q.oldest_ready_age_ms >= TTL
    assert q.finished_in_window == 2 and q.attempts_in_window == 2 and q.retry_rate == 0.0
    every = await backend.stats("", 60_000)
    assert [s.queue for s in every] == ["other", "q"]
    assert every[0].ready == 1


async def test_a_drained_queue_has_no_oldest_job_age(queue_backend: Pair) -> None:
    # A queue with rows but no due job (every job finished) has nothing waiting: its
    # oldest-job age is 0, not the time since the Unix epoch.
    backend, _ = queue_backend
    await enqueue(backend)
    await backend.complete([ref(await claim_one(backend))])
    (q,) = await backend.stats("q", 60_000)
    assert (q.ready, q.succeeded) == (0, 1)
    assert q.oldest_ready_age_ms == 0


async def test_a_queue_of_only_later_jobs_has_no_oldest_job_age(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await enqueue(backend, delay_ms=LONG)
    (q,) = await backend.stats("q", 60_000)
    assert (q.ready, q.scheduled) == (0, 1)
    assert q.oldest_ready_age_ms == 0


async def test_calls_naming_another_queue_are_refused(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    await enqueue(backend, "emails")
    claimed = await claim_one(backend, "emails")
    with pytest.raises(LeaseLost):
        await backend.heartbeat([ref(claimed)], LONG, "billing")
    with pytest.raises(LeaseLost):
        await backend.complete([ref(claimed)], "billing")
    with pytest.raises(LeaseLost):
        await backend.fail(ref(claimed), "e", no_delay, queue="billing")
    with pytest.raises(LeaseLost):
        await backend.release([ref(claimed)], "billing")
    assert await state_of(backend, claimed.id) is JobState.RUNNING
    await backend.heartbeat([ref(claimed)], LONG, "emails")
    await backend.complete([ref(claimed)], "emails")
    await backend.complete([ref(claimed)], "emails")  # the repeat, named the same way
    assert await state_of(backend, claimed.id) is JobState.SUCCEEDED


async def test_a_paused_queue_accepts_enqueues_and_hands_out_no_claims(
    queue_backend: Pair,
) -> None:
    backend, _ = queue_backend
    running = await claim_one(backend) if await enqueue(backend) else None
    assert running is not None
    other = await enqueue(backend, "other")
    assert await backend.set_paused("q", True)
    assert not await backend.set_paused("q", True)  # already paused: no change
    assert await backend.paused() == {"q"}
    waiting = await enqueue(backend)  # enqueues still land
    assert await state_of(backend, waiting) == JobState.READY
    assert await backend.claim("q", "w", 10, LONG) == []
    # other queues go on; the running job of the paused one heartbeats and completes
    assert [r.id for r in await backend.claim("other", "w", 10, LONG)] == [other]
    await backend.heartbeat([ref(running)], LONG, "q")
    await backend.complete([ref(running)], "q")
    assert await state_of(backend, running.id) == JobState.SUCCEEDED
    assert await backend.set_paused("q", False)
    assert not await backend.set_paused("q", False)
    assert await backend.paused() == set()
    assert [r.id for r in await backend.claim("q", "w", 10, LONG)] == [waiting]


async def test_a_retried_claim_of_a_paused_queue_gets_its_jobs_back(queue_backend: Pair) -> None:
    backend, _ = queue_backend
    first = await enqueue(backend)
    await enqueue(backend)
    (claimed,) = await backend.claim("q", "w", 1, LONG, request_id="r1")
    assert claimed.id == first
    await backend.set_paused("q", True)
    (again,) = await backend.claim("q", "w", 1, LONG, request_id="r1")
    assert (again.id, again.token) == (claimed.id, claimed.token)
    assert await backend.claim("q", "w", 1, LONG, request_id="r2") == []
