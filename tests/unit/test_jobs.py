"""The pure job rules and the backoff: examples, and properties with Hypothesis."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencing import limits
from fencing._backoff import Backoff
from fencing.errors import InvalidArgumentError, LeaseLost
from lease_server.queue import jobs
from lease_server.queue.jobs import JobRecord, JobRef, JobState, NewJob


def ready(**kw: object) -> JobRecord:
    """A ready job due at 1000, with fields overridden."""
    return replace(jobs.new_job(1, "q", NewJob(b"p"), blocked=False, now_ms=1000), **kw)  # type: ignore[arg-type]


# -- backoff --------------------------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap() -> None:
    b = Backoff(base=1000, cap=10_000, jitter=0)
    assert [b.delay(n, 0.5) for n in range(1, 7)] == [1000, 2000, 4000, 8000, 10_000, 10_000]


def test_backoff_jitter_only_shortens() -> None:
    b = Backoff(base=100, cap=1000, jitter=0.2)
    assert b.delay(1, 0.0) == 100
    assert b.delay(1, 0.999999) == pytest.approx(80, abs=0.01)


@given(
    attempt=st.integers(min_value=-5, max_value=10_000),
    rand=st.floats(min_value=0, max_value=1),
    base=st.floats(min_value=0.001, max_value=1000),
    factor=st.floats(min_value=1, max_value=10),
    jitter=st.floats(min_value=0, max_value=1),
)
def test_backoff_stays_between_its_jittered_floor_and_the_cap(
    attempt: int, rand: float, base: float, factor: float, jitter: float
) -> None:
    b = Backoff(base=base, cap=base * 100, factor=factor, jitter=jitter)
    raw = b.raw(attempt)
    assert base <= raw <= b.cap
    assert raw * (1 - jitter) - 1e-9 <= b.delay(attempt, rand) <= raw + 1e-9
    assert b.raw(attempt + 1) >= raw  # never shrinks as attempts grow


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(InvalidArgumentError):
        Backoff(base=0, cap=1)
    with pytest.raises(InvalidArgumentError):
        Backoff(base=2, cap=1)
    with pytest.raises(InvalidArgumentError):
        Backoff(base=1, cap=2, jitter=2)


def test_retry_delay_prefers_the_workers_choice() -> None:
    policy = Backoff(base=1000, cap=60_000, jitter=0)
    assert jobs.retry_delay_ms(3, policy, 0.5) == 4000
    assert jobs.retry_delay_ms(3, policy, 0.5, retry_in_ms=250) == 250


# -- transitions ----------------------------------------------------------------------------------


def test_new_job_is_ready_or_waiting_and_due_now_later_or_at() -> None:
    spec = NewJob(b"p", delay_ms=500)
    assert jobs.new_job(1, "q", spec, False, 1000).available_at_ms == 1500
    assert jobs.new_job(1, "q", spec, True, 1000).state is JobState.WAITING
    at = NewJob(b"p", delay_ms=500, run_at_ms=9999)
    assert jobs.new_job(1, "q", at, False, 1000).available_at_ms == 9999


def test_claim_needs_a_larger_token_and_a_claimable_job() -> None:
    r = ready(token=5)
    with pytest.raises(ValueError, match="does not exceed"):
        jobs.claim(r, "w", 1000, 5, 1000)
    running = jobs.claim(r, "w", 1000, 6, 1000)
    assert (running.state, running.attempts, running.lease_until_ms) == (JobState.RUNNING, 1, 2000)
    with pytest.raises(ValueError, match="not claimable"):
        jobs.claim(running, "w", 1000, 7, 1500)
    rescued = jobs.claim(running, "x", 1000, 7, 2000)  # lease ends at 2000: expired
    assert rescued.attempts == 2 and "attempt 1 by w" in rescued.last_error


def test_exhausted_expired_jobs_are_not_claimable_but_reapable() -> None:
    r = jobs.claim(ready(max_attempts=1), "w", 100, 1, 1000)
    assert not jobs.claimable(r, 5000)
    assert jobs.reapable(r, 5000) and not jobs.reapable(r, 1050)
    dead = jobs.reap(r, 5000)
    assert dead.state is JobState.DEAD and dead.last_error == jobs.REAPED_ERROR


def test_calls_need_the_current_token() -> None:
    r = jobs.claim(ready(), "w", 1000, 3, 1000)
    for call in (
        lambda: jobs.heartbeat(r, JobRef(1, 2), 100, 1000),
        lambda: jobs.complete(r, JobRef(1, 2), 1000),
        lambda: jobs.fail(r, JobRef(1, 2), "e", 0, 1000),
        lambda: jobs.release(r, JobRef(1, 2), 1000),
        lambda: jobs.complete(None, JobRef(1, 3), 1000),
    ):
        with pytest.raises(LeaseLost):
            call()


def test_repeats_after_the_fact_are_noops() -> None:
    r = jobs.claim(ready(), "w", 1000, 3, 1000)
    done = jobs.complete(r, JobRef(1, 3), 1100)
    assert jobs.complete(done, JobRef(1, 3), 1200) is done
    failed, outcome = jobs.fail(r, JobRef(1, 3), "e", 500, 1100)
    assert outcome == jobs.Failed(JobState.READY, 500)
    again, outcome2 = jobs.fail(failed, JobRef(1, 3), "e", 999, 1200)
    assert again is failed and outcome2 == jobs.Failed(JobState.READY, 400)
    released = jobs.release(r, JobRef(1, 3), 1100)
    assert jobs.release(released, JobRef(1, 3), 1200) is released
    with pytest.raises(LeaseLost):  # completing what you gave back is refused
        jobs.complete(released, JobRef(1, 3), 1200)


def test_fail_truncates_the_error_text() -> None:
    r = jobs.claim(ready(), "w", 1000, 3, 1000)
    failed, _ = jobs.fail(r, JobRef(1, 3), "é" * 10_000, 0, 1100)
    assert len(failed.last_error.encode()) <= limits.MAX_ERROR_BYTES
    assert failed.last_error.endswith("...")


def test_truncate_error_keeps_utf8_whole_and_drops_controls() -> None:
    assert limits.truncate_error("a\x00b\nc") == "a b\nc"
    cut = limits.truncate_error("€" * 100, max_bytes=10)
    assert cut == "€€..." and len(cut.encode()) <= 10


def test_count_reports_each_state() -> None:
    now = 10_000
    records = [
        ready(id=1, available_at_ms=now - 300),
        ready(id=2, available_at_ms=now + 300),
        ready(id=3, state=JobState.WAITING, attempts=1),
        jobs.claim(ready(id=4), "w", 100, 1, now - 1000),  # expired
        ready(id=5, state=JobState.SUCCEEDED, attempts=3, finished_at_ms=now - 10),
        ready(id=6, state=JobState.DEAD, attempts=1, finished_at_ms=now - 99_999),
        ready(id=7, state=JobState.CANCELLED, finished_at_ms=now - 10),
    ]
    c = jobs.count("q", records, now, 60_000)
    assert c.cancelled == 1
    assert (c.ready, c.scheduled, c.waiting, c.running, c.expired) == (1, 1, 1, 1, 1)
    assert (c.succeeded, c.dead, c.retrying, c.oldest_ready_age_ms) == (1, 1, 1, 300)
    assert c.finished_in_window == 1 and c.attempts_in_window == 3
    assert c.retry_rate == pytest.approx(2 / 3)


def test_cancel_fences_a_running_claim_with_a_larger_token() -> None:
    running = jobs.claim(ready(), "w", 1000, 5, 1000)
    with pytest.raises(ValueError, match="does not exceed"):
        jobs.cancel(running, 5, "", 1500)  # a backend bug: the token must be fresh
    cancelled = jobs.cancel(running, 6, "", 1500)
    assert cancelled is not None
    assert (cancelled.state, cancelled.token, cancelled.last_error) == (
        JobState.CANCELLED,
        6,
        jobs.CANCELLED_ERROR,
    )
    assert cancelled.finished_at_ms == 1500 and cancelled.lease_owner == "w"  # who ran it
    outcome = jobs.administered(running, cancelled)
    assert outcome.changed and outcome.fence_token == 6
    # The claim's end is an EXPIRED of its token, as a rescue's is: a watch guard fences it.
    (event,) = jobs.transitions(running, cancelled, 1500)
    assert (event.kind.name, event.token, event.holder) == ("EXPIRED", 5, "w")
    for call in (
        lambda: jobs.heartbeat(cancelled, JobRef(1, 5), 1000, 1600),
        lambda: jobs.complete(cancelled, JobRef(1, 5), 1600),
        lambda: jobs.fail(cancelled, JobRef(1, 5), "late", 0, 1600),
        lambda: jobs.release(cancelled, JobRef(1, 5), 1600),
    ):
        with pytest.raises(LeaseLost):
            call()
    ready_one = jobs.cancel(ready(), 99, "why", 1500)
    assert ready_one is not None and ready_one.token == 0 and ready_one.last_error == "why"
    assert jobs.transitions(ready(), ready_one, 1500) == []
    assert jobs.cancel(cancelled, 7, "", 1600) is None  # finished: nothing to cancel
    assert not jobs.administered(cancelled, None).changed


def test_retry_keeps_attempts_and_allows_one_more_when_they_ran_out() -> None:
    dead = ready(state=JobState.DEAD, attempts=3, max_attempts=3, finished_at_ms=900, token=4)
    again = jobs.retry(dead, False, 2000)
    assert again is not None
    assert (again.state, again.attempts, again.max_attempts) == (JobState.READY, 3, 4)
    assert (again.available_at_ms, again.finished_at_ms, again.token) == (2000, 0, 4)
    assert jobs.claimable(again, 2000)
    waits = jobs.retry(dead, True, 2000)
    assert waits is not None and waits.state is JobState.WAITING  # behind its key's live job
    failed = ready(attempts=1, available_at_ms=60_000)
    due = jobs.retry(failed, True, 2000)  # already live: it keeps its place in its key
    assert due is not None and due.state is JobState.READY and due.available_at_ms == 2000
    assert jobs.retry(ready(available_at_ms=60_000), False, 2000) is None  # never failed
    assert jobs.retry(jobs.claim(ready(), "w", 1000, 1, 1000), False, 1500) is None
    assert jobs.retry(ready(state=JobState.SUCCEEDED), False, 1500) is None
    assert jobs.transitions(dead, again, 2000) == []


@given(
    st.lists(
        st.sampled_from(
            ["claim", "fail", "complete", "release", "expire", "reap", "cancel", "retry"]
        ),
        max_size=40,
    )
)
def test_a_job_walk_keeps_its_invariants(steps: list[str]) -> None:
    """Random walks over the transitions, an operator's cancel and retry among them:
    tokens only grow, ready jobs have attempts left, a finished job changes only by a
    retry, and a cancelled claim's token is refused from then on."""
    now, token = 1000, 0
    r = ready(max_attempts=3)
    fenced: list[JobRef] = []
    for step in steps:
        before = r
        if step == "claim" and jobs.claimable(r, now):
            token += 1
            r = jobs.claim(r, "w", 100, token, now)
        elif step == "fail" and r.state is JobState.RUNNING:
            r, _ = jobs.fail(r, JobRef(r.id, r.token), "e", 10, now)
        elif step == "complete" and r.state is JobState.RUNNING:
            r = jobs.complete(r, JobRef(r.id, r.token), now)
        elif step == "release" and r.state is JobState.RUNNING:
            r = jobs.release(r, JobRef(r.id, r.token), now)
        elif step == "expire":
            now += 500
        elif step == "reap" and jobs.reapable(r, now):
            r = jobs.reap(r, now)
        elif step == "cancel":
            cancelled = jobs.cancel(r, token + 1, "", now)
            if cancelled is not None:
                if r.state is JobState.RUNNING:
                    token += 1
                    fenced.append(JobRef(r.id, r.token))
                r = cancelled
        elif step == "retry":
            r = jobs.retry(r, False, now) or r
        assert r.token >= before.token
        if before.state in (*jobs.FINISHED_STATES, JobState.CANCELLED) and step != "retry":
            assert r == before
        for stale in fenced:
            with pytest.raises(LeaseLost):
                jobs.require_current(r, stale)
        if r.state is JobState.READY:
            assert r.attempts < r.max_attempts
        assert 0 <= r.attempts <= r.max_attempts


# -- the attempts' history ----------------------------------------------------------------------


def test_steps_that_change_no_claim_change_no_attempt() -> None:
    job = ready()
    running = jobs.claim(job, "w", 1000, token=5, now_ms=2000)
    assert jobs.attempt_changes(None, job, 1000) == jobs.AttemptChanges()  # enqueue
    beat = jobs.heartbeat(running, JobRef(1, 5), 1000, now_ms=2500)
    assert not jobs.attempt_changes(running, beat, 2500)
    assert not jobs.attempt_changes(running, jobs.replay(running, 1000, 2600), 2600)
    failed, _ = jobs.fail(running, JobRef(1, 5), "e", 0, 2700, final=True)
    retried = jobs.retry(failed, blocked=False, now_ms=2800)
    assert retried is not None and not jobs.attempt_changes(failed, retried, 2800)


def test_a_rescue_ends_the_expired_attempt_and_starts_the_next() -> None:
    first = jobs.claim(ready(), "a", 1000, token=5, now_ms=2000)
    second = jobs.claim(first, "b", 1000, token=6, now_ms=3500)
    change = jobs.attempt_changes(first, second, 3500)
    assert change.current == jobs.JobAttempt(
        1, 2000, "a", 5, jobs.AttemptOutcome.EXPIRED, 3500, second.last_error
    )
    assert change.started == jobs.JobAttempt(2, 3500, "b", 6)
    history = jobs.apply_attempts([jobs.JobAttempt(1, 2000, "a", 5)], change)
    assert history == [change.current, change.started]


def test_an_attempt_without_a_running_row_is_added_and_only_the_newest_are_kept() -> None:
    old = [
        jobs.JobAttempt(n, n, "w", n, jobs.AttemptOutcome.FAILED, n, "e")
        for n in range(1, limits.MAX_JOB_ATTEMPTS_KEPT + 1)
    ]
    ended = jobs.JobAttempt(99, 1, "w", 99, jobs.AttemptOutcome.SUCCEEDED, 2)
    history = jobs.apply_attempts(old, jobs.AttemptChanges(current=ended))
    assert len(history) == limits.MAX_JOB_ATTEMPTS_KEPT
    assert history[0].attempt == 2 and history[-1] == ended
