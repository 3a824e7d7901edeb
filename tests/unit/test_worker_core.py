"""The worker's I/O-free core on a fake clock: slots, heartbeats at ttl/3, deadlines,
backoff while the server is unavailable, settling each job once, graceful stop."""

from __future__ import annotations

import pytest

from fencing.client import _queue
from fencing.client._queue import Job
from fencing.v1 import queue_pb2
from fencing.worker._core import UNAVAILABLE_BACKOFF, Phase, WorkerCore


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_job(clock: FakeClock, job_id: int, ttl_ms: int = 3000, token: int = 0) -> Job:
    msg = queue_pb2.Job(
        id=job_id,
        queue="q",
        token=token or job_id,
        attempt=1,
        max_attempts=5,
        resource=f"job/q/{job_id}",
        ttl_ms=ttl_ms,
    )
    return Job(msg, clock.now, clock=clock)


def core(clock: FakeClock, concurrency: int = 2) -> WorkerCore:
    return WorkerCore(concurrency, clock, lambda: 0.5)


def test_slots_fill_and_free() -> None:
    clock = FakeClock()
    c = core(clock, 3)
    assert c.free_slots() == 3
    a, b = make_job(clock, 1), make_job(clock, 2)
    assert c.claimed([a, b]) == []
    assert c.free_slots() == 1
    assert c.settle(a) and not c.settle(a)  # settled once only
    c.done(a)
    assert c.free_slots() == 2


def test_heartbeats_are_due_at_a_third_of_the_ttl_and_batched() -> None:
    clock = FakeClock()
    c = core(clock)
    a = make_job(clock, 1, ttl_ms=3000)
    clock.now += 0.03
    b = make_job(clock, 2, ttl_ms=3000)
    c.claimed([a, b])
    assert c.due() == []
    assert c.next_wakeup(cap=10) == pytest.approx(0.97)  # a's first heartbeat
    clock.now += 0.97
    assert c.due() == [a, b]  # b is due within the coalescing window: one batch
    a.renewed(clock.now, 3000)
    b.renewed(clock.now, 3000)
    assert c.due() == []
    assert c.next_wakeup(cap=10) == pytest.approx(1.0)


def test_a_job_is_lost_at_its_local_deadline() -> None:
    clock = FakeClock()
    c = core(clock)
    a = make_job(clock, 1, ttl_ms=1000)
    c.claimed([a])
    a.renew_failed(clock.now + 0.4)
    clock.now += 0.9
    assert c.expire() == []
    clock.now += 0.1  # 1 s minus the safety margin has passed
    assert c.expire() == [a]
    assert a.lost.is_set()
    with pytest.raises(Exception, match="lost"):
        a.check()
    assert c.expire() == []  # reported once


def test_unavailable_backoff_grows_is_bounded_and_resets() -> None:
    clock = FakeClock()
    c = core(clock)
    delays = [c.unavailable() for _ in range(12)]
    assert delays == sorted(delays)
    assert delays[0] == pytest.approx(UNAVAILABLE_BACKOFF.delay(1, 0.5))
    assert max(delays) <= UNAVAILABLE_BACKOFF.cap
    c.reachable()
    assert c.unavailable() == delays[0]


def test_stop_refuses_new_work_and_gives_back_the_rest_after_the_grace() -> None:
    clock = FakeClock()
    c = core(clock, 3)
    a, b = make_job(clock, 1), make_job(clock, 2)
    c.claimed([a, b])
    assert c.start(a)
    assert c.stop(grace=5.0) and not c.stop(grace=1.0)
    assert c.phase is Phase.STOPPING and c.free_slots() == 0
    assert not c.start(b)  # claimed but not started: never starts now
    late = make_job(clock, 3)
    assert c.claimed([late]) == [late]  # a claim that returned after the stop: give back
    assert not c.grace_over()
    assert c.next_wakeup(cap=60) <= 5.0
    clock.now += 5.0
    assert c.grace_over()
    assert c.settle(b)  # b's own path took charge of it first
    assert c.give_back() == [a]
    assert c.give_back() == []
    assert not c.settle(a)  # a's handler, finishing late, must not send anything


def test_rpc_timeouts_stay_inside_the_lease_budget() -> None:
    """Timeouts stay below the lease; a heartbeat never waits past a deadline."""
    clock = FakeClock()
    a = make_job(clock, 1, ttl_ms=2000)
    b = make_job(clock, 2, ttl_ms=9000)
    clock.now += 1.5
    timeout = _queue.heartbeat_timeout([a, b], cap=5.0)
    assert 0 < timeout <= a.remaining() < 0.5
    live, lost = _queue.split_expired([a, b])
    assert live == [a, b] and lost == []
    clock.now += 1.0
    live, lost = _queue.split_expired([a, b])
    assert live == [b] and lost == [a] and a.lost.is_set()


def test_stale_job_is_found_by_token() -> None:
    from fencing.errors import LeaseLost

    clock = FakeClock()
    a, b = make_job(clock, 1, token=10), make_job(clock, 2, token=11)
    assert _queue.stale_job([a, b], LeaseLost(resource="job/q/2", token=11)) is b
    assert _queue.stale_job([a, b], LeaseLost(resource="", token=10)) is a
    assert _queue.stale_job([a, b], LeaseLost(resource="x", token=10)) is None


def test_error_text_never_includes_a_traceback() -> None:
    assert _queue.error_text(ValueError("bad")) == "ValueError: bad"
    assert _queue.error_text(KeyError()) == "KeyError"
    assert _queue.error_text("plain") == "plain"


def test_completes_queue_behind_one_sender_and_keep_their_slots() -> None:
    clock = FakeClock()
    c = core(clock, 3)
    a, b, d = make_job(clock, 1), make_job(clock, 2), make_job(clock, 3)
    assert c.claimed([a, b, d]) == []
    assert c.settle(a) and c.finished(a)  # nobody sends: the caller becomes the sender
    assert c.settle(b) and not c.finished(b)  # the sender takes it
    assert c.free_slots() == 0  # a finished job holds its slot until its call is answered
    assert c.next_completes() == [a, b]
    assert not c.may_wait(2)  # d still runs: a call waiting for work would hold its complete
    assert c.settle(d) and not c.finished(d)  # a call is in flight: d rides on the next
    assert c.next_completes() == [d]
    assert c.next_completes() == []  # the sender's turn ends
    assert c.finished(d)  # and the next finisher sends again
    assert c.next_completes() == [d] and c.next_completes() == []
    assert c.may_wait(3)  # every slot in one call: nothing else can finish meanwhile
    c.stop(1.0)
    assert not c.may_wait(3)  # a stopping worker claims nothing


def test_a_settled_job_is_not_expired_while_its_outcome_is_sent() -> None:
    clock = FakeClock()
    c = core(clock, 2)
    running, finished = make_job(clock, 1, ttl_ms=1000), make_job(clock, 2, ttl_ms=1000)
    assert c.claimed([running, finished]) == []
    assert c.settle(finished) and c.finished(finished)
    clock.now += 5.0  # both local deadlines passed; the complete is still in flight
    assert c.expire() == [running]
    assert not finished.lost.is_set()
