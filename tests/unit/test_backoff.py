"""One backoff type for every retry loop: its pauses, cap, jitter, bound and reset."""

from __future__ import annotations

from typing import Any

import pytest

from fencing._backoff import Backoff
from fencing.client import _core
from fencing.errors import InvalidArgumentError
from fencing.worker._core import UNAVAILABLE_BACKOFF
from guard.follower import RECONNECT_BACKOFF, reconnect_delay
from lease_server.queue.jobs import DEFAULT_RETRY_BACKOFF


def test_every_retry_loop_uses_the_one_type() -> None:
    for policy in (
        _core.RETRY_BACKOFF,
        RECONNECT_BACKOFF,
        UNAVAILABLE_BACKOFF,
        DEFAULT_RETRY_BACKOFF,
    ):
        assert isinstance(policy, Backoff)


def test_pauses_double_up_to_the_cap() -> None:
    attempts = Backoff(base=1, cap=5, jitter=0).attempts()
    assert [attempts.pause() for _ in range(5)] == [1, 2, 4, 5, 5]


def test_a_bounded_loop_gives_up_after_its_retries_and_starts_again_after_a_reset() -> None:
    attempts = Backoff(base=1, cap=100, jitter=0, retries=2).attempts()
    assert [attempts.next(), attempts.next(), attempts.next()] == [1, 2, None]
    attempts.reset()
    assert attempts.failures == 0
    assert attempts.next() == 1


def test_jitter_only_shortens_a_pause_by_at_most_its_share() -> None:
    policy = Backoff(base=1, cap=8, jitter=0.25)
    draws = iter([0.0, 0.999, 0.5])
    attempts = policy.attempts(lambda: next(draws))
    pauses = [attempts.pause() for _ in range(3)]
    assert pauses[0] == 1
    assert 2 * 0.75 <= pauses[1] < 2
    assert pauses[2] == pytest.approx(4 * (1 - 0.25 * 0.5))


def test_the_client_retries_are_the_old_fixed_schedule() -> None:
    attempts = _core.RETRY_BACKOFF.attempts()
    assert [attempts.next() for _ in range(6)] == [0.05, 0.1, 0.2, 0.4, 0.8, None]


def test_the_follower_reconnects_as_before() -> None:
    # Doubling from 50 ms to 5 s, jittered down by up to half.
    assert [reconnect_delay(n, lambda: 1.0) for n in range(8)] == [
        0.05,
        0.1,
        0.2,
        0.4,
        0.8,
        1.6,
        3.2,
        5.0,
    ]
    assert reconnect_delay(3, lambda: 0.0) == 0.2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": 0, "cap": 1},
        {"base": 2, "cap": 1},
        {"base": 1, "cap": 2, "jitter": 2},
        {"base": 1, "cap": 2, "factor": 0.5},
        {"base": 1, "cap": 2, "retries": -1},
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        Backoff(**kwargs)
    assert refused.value.field == "backoff"
