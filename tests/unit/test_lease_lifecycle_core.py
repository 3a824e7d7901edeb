"""The lease handle's lifecycle rules on an injected clock, without a network: the
deadline from the grant, renewal due on arrival, a grant lost in transit, the bounded
exit release, and a released lease that is not lost."""

from __future__ import annotations

import threading

import pytest

from fencing._renewal import RenewalPolicy
from fencing.client import _core
from fencing.errors import (
    AcquireTimeoutError,
    BackendUnavailableError,
    InvalidArgumentError,
    LeaseLost,
)
from fencing.v1 import lease_pb2


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lease(
    clock: FakeClock, *, ttl_ms: int = 10_000, waited_ms: int = 0, sent_at: float = 100.0
) -> _core.LeaseBase[threading.Event]:
    msg = lease_pb2.Lease(resource="r", holder="me", token=7, ttl_ms=ttl_ms, waited_ms=waited_ms)
    return _core.LeaseBase(
        msg,
        sent_at,
        RenewalPolicy(),
        clock,
        threading.Event(),
        threading.Lock(),
        received_at=clock(),
        ttl_ms=ttl_ms,
    )


def test_a_grant_that_waited_starts_its_deadline_at_the_grant() -> None:
    clock = FakeClock()
    clock.now = 129.0  # the reply of an Acquire sent at 100, which waited 29 s in line
    held = lease(clock, waited_ms=29_000)
    held.check()
    assert not held._due_on_arrival()
    assert held.remaining() == pytest.approx(10 - 0.505 - 29 * 0.05, abs=1e-6)


def test_control_the_same_grant_without_the_reported_wait_is_lost_on_arrival() -> None:
    clock = FakeClock()
    clock.now = 129.0
    old = lease(clock)  # what a server that does not report its wait gives
    assert old._due_on_arrival()  # so the twins renew it before handing it out
    with pytest.raises(LeaseLost):
        old.check()


def test_a_released_lease_is_not_lost_and_stays_so() -> None:
    clock = FakeClock()
    held = lease(clock)
    fired: list[object] = []
    held.on_lost(fired.append)
    held.released = True
    clock.now += 60  # far past the deadline
    assert not held._deadline_passed()
    with pytest.raises(LeaseLost, match="released"):
        held.check()
    held._mark_lost("renewal refused")  # a renewal in flight answered after the release
    assert not held.lost.is_set() and fired == []
    assert held.remaining() == 0.0
    held._mark_lost("release refused", refused_release=True)  # it had been lost before
    assert held.lost.is_set() and fired == [held]


def test_renewals_ask_for_the_requested_ttl_not_what_a_replay_had_left() -> None:
    clock = FakeClock()
    msg = lease_pb2.Lease(resource="r", holder="me", token=7, ttl_ms=1_200)  # a replay
    replayed = _core.LeaseBase(
        msg, 100.0, RenewalPolicy(), clock, threading.Event(), threading.Lock(), ttl_ms=10_000
    )
    assert replayed._renewal(None, 5.0)[0] == 10_000
    assert replayed.remaining() == pytest.approx(1.2 - RenewalPolicy().margin(1.2))


def test_a_renewal_on_arrival_gets_a_whole_call_even_past_the_deadline() -> None:
    clock = FakeClock()
    clock.now = 200.0
    late = lease(clock)  # its local deadline passed before the reply arrived
    ttl_ms, sent_at, timeout = late._renewal(None, 5.0, on_arrival=True)
    assert (ttl_ms, sent_at, timeout) == (10_000, 200.0, 5.0)
    with pytest.raises(LeaseLost):
        late._renewal(None, 5.0)  # an ordinary renewal refuses a lease past its deadline


def test_a_grant_lost_in_transit_is_asked_for_again_a_bounded_number_of_times() -> None:
    clock = FakeClock()
    plan = _core.AcquirePlan("r", "me", 1.0, None, clock)
    for _ in range(_core.MAX_LOST_ON_ARRIVAL):
        assert plan.retry_after(LeaseLost(resource="r", token=1)) == 0.0
    last = LeaseLost(resource="r", token=4)
    assert plan.retry_after(last) is None
    assert "round trip longer than the ttl" in " ".join(last.__notes__)


def test_a_grant_lost_in_transit_after_the_timeout_is_not_asked_for_again() -> None:
    clock = FakeClock()
    plan = _core.AcquirePlan("r", "me", 1.0, 5.0, clock)
    clock.now += 6
    assert plan.retry_after(LeaseLost(resource="r", token=1)) is None
    with pytest.raises(AcquireTimeoutError):  # a held lease still times out as before
        plan.retry_after(AcquireTimeoutError(resource="r", holder="x", remaining_ms=1))


def test_the_exit_release_retries_transient_failures_within_its_bound() -> None:
    down = BackendUnavailableError("down")
    assert _core.exit_release_pause(down, 0, now=0.0, end=2.0) == _core.RETRY_BACKOFF.base
    assert _core.exit_release_pause(down, 0, now=1.99, end=2.0) is None  # would pass the bound
    assert _core.exit_release_pause(down, 5, now=0.0, end=99.0) is None  # out of retries
    refused = LeaseLost(resource="r", token=1)
    assert _core.exit_release_pause(refused, 0, now=0.0, end=2.0) is None


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_the_release_bound_must_be_positive(bad: float) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        _core.release_timeout_of(bad)
    assert err.value.field == "release_timeout"
