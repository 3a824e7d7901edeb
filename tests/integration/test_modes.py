"""One scenario per fence mode: the window each mode leaves open (docs/modes.md).

The story: the old holder writes, then is paused past its ttl (its renewals stop
with it: here it simply never renews); a new holder acquires and has *not* written
yet; the old holder resumes and writes.

- monotonic ACCEPTS that late write: the control that shows the window;
- promise (``acquire(..., fence=[guard])``) and watch (the guard follows Watch)
  REJECT it, although the new holder never wrote;
- strict is covered where it can run, with the PostgreSQL and Redis stores
  (tests/integration/test_postgres.py::test_strict_after_a_takeover, test_redis_store.py).

Each runs with both SDK twins (the ``flavor`` fixture of conftest.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import (
    BackendUnavailableError,
    Claim,
    Fenced,
    GuardClient,
    LeaseClient,
    StaleTokenError,
)
from fencing.testing import RunningServers, running_servers
from guard.fence import FenceMode
from tests.integration.conftest import GuardClientFactory, LeaseClientFactory

HANG_GUARD = 30.0  # seconds: only a bug waits this long


@pytest.fixture
def servers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningServers]:
    """The conftest servers, in the fence mode the test asks for (indirect parameter)."""
    mode = getattr(request, "param", FenceMode.MONOTONIC)
    with running_servers(
        f"sqlite:{tmp_path / 'leases.db'}", f"sqlite:{tmp_path / 'guard.db'}", mode=mode
    ) as running:
        yield running


def old_holder_writes_then_pauses(leases: LeaseClient, guard: GuardClient) -> Claim:
    old = leases.acquire("account", ttl=0.3)  # never renewed: paused, keepalive and all
    guard.put(old, "balance", b"old: 100")
    return Claim(old.resource, old.token)


def late_write_is_rejected(guard: GuardClient, old: Claim, new: Fenced) -> None:
    """The old holder's late write is refused, and the new holder never wrote."""
    with pytest.raises(StaleTokenError) as stale:
        guard.put(old, "balance", b"old: 150")
    assert stale.value.current_token == new.token
    record = guard.read("account", "balance")
    assert record is not None and record.value == b"old: 100"


def wait_for_fence(guard: GuardClient, resource: str, fence: int) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while guard.describe_fence(resource) < fence:
        assert time.monotonic() < deadline, f"fence of {resource} never reached {fence}"
        time.sleep(0.02)


def test_monotonic_accepts_the_late_write_of_a_former_holder(
    lease_client: LeaseClientFactory, guard: GuardClient
) -> None:
    old = old_holder_writes_then_pauses(lease_client(holder="old"), guard)
    new = lease_client(holder="new").acquire("account", ttl=5, timeout=HANG_GUARD)
    assert new.token > old.token
    # The window: the guard has not seen the new token, so the old one still passes.
    assert guard.put(old, "balance", b"old: 150") == old.token
    record = guard.read("account", "balance")
    assert record is not None and record.written_by_token == old.token
    # It closes at the new holder's first write, after the damage.
    guard.put(new, "balance", b"new: 200")
    with pytest.raises(StaleTokenError):
        guard.put(old, "balance", b"old: 175")


def test_promise_rejects_it_from_the_moment_acquire_returns(
    lease_client: LeaseClientFactory, guard: GuardClient
) -> None:
    old = old_holder_writes_then_pauses(lease_client(holder="old"), guard)
    new = lease_client(holder="new").acquire("account", ttl=5, timeout=HANG_GUARD, fence=[guard])
    assert guard.describe_fence("account") == new.token  # promised before returning
    late_write_is_rejected(guard, old, new)


@pytest.mark.parametrize("servers", [FenceMode.WATCH], indirect=True)
def test_watch_rejects_it_once_the_grant_is_delivered(
    lease_client: LeaseClientFactory, guard: GuardClient
) -> None:
    old = old_holder_writes_then_pauses(lease_client(holder="old"), guard)
    new = lease_client(holder="new").acquire("account", ttl=5, timeout=HANG_GUARD)
    # The window is the event's delivery: wait for it, never for a fixed time.
    wait_for_fence(guard, "account", new.token)
    late_write_is_rejected(guard, old, new)


@pytest.mark.parametrize("servers", [FenceMode.WATCH], indirect=True)
def test_watch_rejects_it_after_expiry_even_with_no_successor(
    lease_client: LeaseClientFactory, guard: GuardClient
) -> None:
    old = old_holder_writes_then_pauses(lease_client(holder="old"), guard)
    wait_for_fence(guard, "account", old.token + 1)  # EXPIRED(t) fences past t
    with pytest.raises(StaleTokenError):
        guard.put(old, "balance", b"old: 150")


# -- the promise step itself ----------------------------------------------------------------


def test_hold_promises_to_the_guards_before_the_body_runs(
    leases: LeaseClient, guard_client: GuardClientFactory
) -> None:
    leases.acquire("r", ttl=5).release()  # token 1 is over
    guards = [guard_client(), guard_client()]
    with leases.hold("r", ttl=5, fence=guards) as lease:
        assert lease.token == 2
        assert guards[0].describe_fence("r") == 2
        with pytest.raises(StaleTokenError):
            guards[1].put(Claim("r", 1), "k", b"late")


def test_a_guard_that_cannot_be_fenced_fails_the_acquire_and_the_lease_is_released(
    leases: LeaseClient, guard: GuardClient
) -> None:
    guard.fence(Claim("r", 100))  # a newer token already fenced it (another lease server?)
    with pytest.raises(StaleTokenError) as stale:
        leases.acquire("r", ttl=5, fence=[guard])
    assert stale.value.current_token == 100
    assert any(guard.target in note for note in stale.value.__notes__)
    state = leases.describe("r")
    assert not state.held and state.last_token == 1
    body_ran = False
    with pytest.raises(StaleTokenError), leases.hold("r", ttl=5, fence=[guard]):
        body_ran = True
    assert not body_ran
    assert not leases.describe("r").held


def test_an_unreachable_guard_fails_the_acquire_and_the_lease_is_released(
    leases: LeaseClient, guard: GuardClient, guard_client: GuardClientFactory
) -> None:
    gone = guard_client(target="127.0.0.1:1", rpc_timeout=1.0)
    with pytest.raises(BackendUnavailableError):
        leases.acquire("r", ttl=5, fence=[guard, gone])
    assert not leases.describe("r").held
