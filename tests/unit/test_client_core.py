"""The SDK's I/O-free core: the acquire plan and the renewal verdicts both twins follow."""

from __future__ import annotations

import pytest

from fencing.client import _core
from fencing.errors import (
    AcquireTimeoutError,
    BackendUnavailableError,
    DeadlineExceededError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLost,
)
from fencing.limits import MAX_WAIT_MS


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def held() -> LeaseHeldError:
    return LeaseHeldError(resource="r", holder="other", remaining_ms=500)


def test_one_request_id_and_the_wait_left_of_the_timeout() -> None:
    clock = FakeClock()
    plan = _core.AcquirePlan("r", "me", 2.0, 10.0, clock)
    first = plan.request()
    assert (first.resource, first.holder, first.ttl_ms, first.wait_ms) == ("r", "me", 2000, 10_000)
    clock.now += 4
    again = plan.request()
    assert again.request_id == first.request_id and again.wait_ms == 6000
    assert plan.rpc_timeout(again, 5.0) == 11.0
    assert _core.AcquirePlan("r", "me", 1, None, clock).request().wait_ms == MAX_WAIT_MS
    assert _core.AcquirePlan("r", "me", 1, None, clock, nowait=True).request().wait_ms == 0


def test_held_is_asked_again_until_the_timeout_then_times_out() -> None:
    clock = FakeClock()
    plan = _core.AcquirePlan("r", "me", 1, 3.0, clock)
    assert plan.retry_after(held()) == 0.0
    clock.now += 3
    with pytest.raises(AcquireTimeoutError) as timed_out:
        plan.retry_after(held())
    assert timed_out.value.holder == "other" and timed_out.value.remaining_ms == 500
    # nowait gives up at once: the caller re-raises LeaseHeldError.
    assert _core.AcquirePlan("r", "me", 1, None, clock, nowait=True).retry_after(held()) is None


def test_transient_failures_back_off_a_bounded_number_of_times() -> None:
    plan = _core.AcquirePlan("r", "me", 1, None, FakeClock())
    assert _core.RETRY_BACKOFF.retries == 5
    expected = [0.05, 0.1, 0.2, 0.4, 0.8]
    assert [plan.retry_after(BackendUnavailableError("down")) for _ in expected] == expected
    assert plan.retry_after(BackendUnavailableError("down")) is None
    assert plan.retry_after(InvalidArgumentError("bad", field="ttl_ms")) is None


def test_a_transient_failure_after_the_timeout_is_raised() -> None:
    clock = FakeClock()
    plan = _core.AcquirePlan("r", "me", 1, 1.0, clock)
    clock.now += 2
    assert plan.retry_after(DeadlineExceededError("slow")) is None


def test_renewal_verdicts() -> None:
    assert _core.renewal_failure(LeaseLost(resource="r", token=1)) == "renewal refused"
    assert _core.renewal_failure(BackendUnavailableError("down")) is None
    assert _core.renewal_failure(DeadlineExceededError("slow")) is None
    why = _core.renewal_failure(InvalidArgumentError("bad", field="ttl_ms"))
    assert why is not None and why.startswith("renewal failed")
