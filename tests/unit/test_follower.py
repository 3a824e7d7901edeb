"""The watch follower's pure rules: which fence each event calls for, and the backoff."""

from __future__ import annotations

import pytest

from fencing import limits
from fencing.client._core import EventKind, LeaseEvent
from fencing.errors import BackendUnavailableError, InvalidArgumentError
from guard import __main__ as guard_main
from guard.follower import (
    INITIAL_BACKOFF,
    MAX_BACKOFF,
    SHARED_CURSOR,
    LeaseFollower,
    cursor_resource,
    fence_for,
    reconnect_delay,
)
from guard.stores.memory import MemoryStore


def event(kind: EventKind, token: int = 7) -> LeaseEvent:
    return LeaseEvent(kind, "r", token, "h", 1, 0)


@pytest.mark.parametrize(
    ("kind", "fence"),
    [
        (EventKind.ACQUIRED, 7),  # the new token is live: everything older is dead
        (EventKind.RENEWED, 7),  # still live
        (EventKind.RELEASED, 8),  # 7 is dead as well; the next grant gets >= 8
        (EventKind.EXPIRED, 8),
        (EventKind.RESYNC, None),
    ],
)
def test_each_event_calls_for_a_fence(kind: EventKind, fence: int | None) -> None:
    assert fence_for(event(kind)) == fence


def test_backoff_doubles_to_a_cap_with_jitter_below() -> None:
    assert reconnect_delay(0, lambda: 1.0) == INITIAL_BACKOFF
    assert reconnect_delay(1, lambda: 1.0) == 2 * INITIAL_BACKOFF
    assert reconnect_delay(50, lambda: 1.0) == MAX_BACKOFF
    assert reconnect_delay(50, lambda: 0.0) == MAX_BACKOFF / 2
    delays = [reconnect_delay(n, lambda: 1.0) for n in range(20)]
    assert delays == sorted(delays)


def test_watch_mode_needs_a_lease_server(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        guard_main.main(["--fence-mode", "watch"])
    assert exit_.value.code == 2
    assert "--lease-addr" in capsys.readouterr().err


def test_each_log_and_prefix_has_its_own_cursor_name() -> None:
    names = {cursor_resource(log, prefix) for log in ("L1", "L2") for prefix in ("", "a/", "b/")}
    assert len(names) == 6 and SHARED_CURSOR not in names
    # No request can name a cursor: resource names with control characters are refused.
    for name in names:
        with pytest.raises(InvalidArgumentError):
            limits.check_resource(name)


async def test_tokens_seen_granted_need_no_question_and_others_outside_the_prefix_neither() -> None:
    follower = LeaseFollower(MemoryStore(), "127.0.0.1:1", prefix="a/")
    assert follower.vouched("b/x", 2**63 - 1)  # not followed: the monotonic rule alone
    assert not follower.vouched("a/x", 1)  # nothing seen yet: must ask
    await follower._apply(LeaseEvent(EventKind.ACQUIRED, "a/x", 5, "h", 1, 1000))
    assert follower.vouched("a/x", 5) and follower.vouched("a/x", 4)
    assert not follower.vouched("a/x", 6)
    # Not running: it cannot ask, and says so (retryable), never admits on a guess.
    with pytest.raises(BackendUnavailableError, match="cannot check"):
        await follower.vouch("a/x", 6)
