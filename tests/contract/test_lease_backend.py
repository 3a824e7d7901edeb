"""The lease backend contract: every implementation in tests/backends.py passes it."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest

from fencing.errors import LeaseLost
from lease_server.backends import sqlite as sqlite_backend
from lease_server.backends.base import LeaseBackend
from lease_server.backends.sqlite import SQLiteBackend
from lease_server.clock import SystemClock
from lease_server.leases import Grant, Held
from tests.backends import TimeControl

Pair = tuple[LeaseBackend, TimeControl]


async def grant(
    backend: LeaseBackend,
    resource: str,
    holder: str = "a",
    ttl_ms: int = 10_000,
    request_id: str = "",
) -> Grant:
    outcome = await backend.acquire(resource, holder, ttl_ms, request_id)
    assert isinstance(outcome, Grant), outcome
    return outcome


async def test_first_acquire_gets_a_token(lease_backend: Pair) -> None:
    backend, _ = lease_backend
    g = await grant(backend, "r")
    assert (g.resource, g.holder) == ("r", "a")
    assert g.token >= 1
    assert 0 < g.ttl_ms <= 10_000
    info = await backend.describe("r")
    assert info.held and info.holder == "a" and info.token == g.token
    assert info.last_token == g.token
    assert 0 < info.remaining_ms <= 10_000


async def test_held_lease_is_refused_with_holder_and_remaining(lease_backend: Pair) -> None:
    backend, _ = lease_backend
    g = await grant(backend, "r", "a")
    outcome = await backend.acquire("r", "b", 5000, "")
    assert isinstance(outcome, Held)
    assert outcome.holder == "a" and outcome.token == g.token and 0 < outcome.remaining_ms <= 10_000
    # The same holder asking again without its request id is refused too: not re-entrant.
    assert isinstance(await backend.acquire("r", "a", 5000, ""), Held)


async def test_expired_lease_is_taken_over_with_a_larger_token(lease_backend: Pair) -> None:
    backend, time = lease_backend
    g1 = await grant(backend, "r", "a", ttl_ms=200)
    await time.sleep(250)
    assert not (await backend.describe("r")).held
    g = await grant(backend, "r", "b")
    assert g.token > g1.token
    assert g.holder == "b"


async def test_release_frees_and_the_counter_survives(lease_backend: Pair) -> None:
    backend, _ = lease_backend
    g1 = await grant(backend, "r")
    await backend.release("r", g1.token, "a")
    info = await backend.describe("r")
    assert not info.held and info.token == 0 and info.last_token == g1.token
    g2 = await grant(backend, "r", "b")
    assert g2.token > g1.token


async def test_tokens_are_per_resource(lease_backend: Pair) -> None:
    backend, _ = lease_backend
    x = await grant(backend, "x")
    y = await grant(backend, "y")
    assert (await backend.describe("x")).last_token == x.token
    assert (await backend.describe("y")).last_token == y.token
    info = await backend.describe("never")
    assert not info.held and info.last_token == 0 and info.holder == ""


async def test_renew_extends_only_the_current_lease(lease_backend: Pair) -> None:
    backend, time = lease_backend
    g = await grant(backend, "r", ttl_ms=300)
    await time.sleep(150)
    renewed = await backend.renew("r", g.token, "a", 300)
    assert renewed.token == g.token and renewed.ttl_ms == 300
    await time.sleep(200)  # past the first expiry, within the renewed one
    assert (await backend.describe("r")).held
    with pytest.raises(LeaseLost):
        await backend.renew("r", g.token + 1, "a", 300)
    with pytest.raises(LeaseLost):
        await backend.renew("r", g.token, "someone-else", 300)
    # An empty holder skips the holder check: the token is the proof.
    assert (await backend.renew("r", g.token, "", 300)).token == g.token


async def test_a_renewal_naming_no_ttl_keeps_the_leases_own(lease_backend: Pair) -> None:
    """ttl_ms 0 renews by the ttl of the lease's grant, or of its last renewal that named
    one (an etcd keep-alive's rule), never by a default."""
    backend, _ = lease_backend
    g = await grant(backend, "r", ttl_ms=60_000)
    kept = await backend.renew("r", g.token, "a", 0)
    assert (kept.token, kept.ttl_ms) == (g.token, 60_000)
    info = await backend.describe("r")
    assert info.held and 50_000 < info.remaining_ms <= 60_000
    # A renewal that names a ttl makes it the lease's own.
    assert (await backend.renew("r", g.token, "a", 30_000)).ttl_ms == 30_000
    assert (await backend.renew("r", g.token, "", 0)).ttl_ms == 30_000
    assert 20_000 < (await backend.describe("r")).remaining_ms <= 30_000
    # A new lease has the ttl it was granted with, not the last one's.
    await backend.release("r", g.token, "a")
    g2 = await grant(backend, "r", "b", ttl_ms=2_000)
    assert (await backend.renew("r", g2.token, "b", 0)).ttl_ms == 2_000
    # A lost lease is lost whatever the ttl.
    with pytest.raises(LeaseLost):
        await backend.renew("r", g.token, "a", 0)


async def test_an_expired_lease_cannot_be_renewed_or_released(lease_backend: Pair) -> None:
    backend, time = lease_backend
    g = await grant(backend, "r", ttl_ms=150)
    await time.sleep(200)
    with pytest.raises(LeaseLost) as lost:
        await backend.renew("r", g.token, "a", 1000)
    assert lost.value.resource == "r" and lost.value.token == g.token
    with pytest.raises(LeaseLost):
        await backend.release("r", g.token, "a")
    assert (await grant(backend, "r", "b")).token > g.token


async def test_release_twice_or_by_another_holder_is_lost(lease_backend: Pair) -> None:
    backend, _ = lease_backend
    g = await grant(backend, "r")
    with pytest.raises(LeaseLost):
        await backend.release("r", g.token, "b")
    await backend.release("r", g.token, "a")
    with pytest.raises(LeaseLost):
        await backend.release("r", g.token, "a")


async def test_old_token_is_lost_after_takeover(lease_backend: Pair) -> None:
    backend, time = lease_backend
    old = await grant(backend, "r", "a", ttl_ms=150)
    await time.sleep(200)
    new = await grant(backend, "r", "b")
    with pytest.raises(LeaseLost):
        await backend.renew("r", old.token, "a", 1000)
    with pytest.raises(LeaseLost):
        await backend.release("r", old.token, "a")
    assert (await backend.describe("r")).token == new.token


async def test_retried_acquire_returns_the_same_lease(lease_backend: Pair) -> None:
    backend, time = lease_backend
    first = await grant(backend, "r", "a", request_id="req-1")
    await time.sleep(50)
    again = await grant(backend, "r", "a", request_id="req-1")
    assert again.token == first.token and again.replayed
    assert again.ttl_ms <= first.ttl_ms
    # Another holder presenting the same request id does not get the lease.
    assert isinstance(await backend.acquire("r", "b", 1000, "req-1"), Held)
    # A new request id from the same holder is a new request: refused while held.
    assert isinstance(await backend.acquire("r", "a", 1000, "req-2"), Held)
    assert (await backend.describe("r")).last_token == first.token


async def test_a_lease_held_across_the_sqlite_upgrade_renews_by_the_old_default_ttl() -> None:
    """Schema v5 keeps each lease's ttl: a lease granted before it (ttl not stored) renews
    (ttl 0: its own) by 10 s, the SDK's default its renewals sent until then."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "leases.db"
        old = SQLiteBackend(path)
        old._db._migrations = sqlite_backend.MIGRATIONS[:4]  # a database of schema v4
        await old.open()
        await old.close()
        with sqlite3.connect(path) as conn:  # a lease as the code before v5 stored it
            conn.execute(
                "INSERT INTO leases (resource, counter, holder, token, expires_at_ms)"
                " VALUES ('old', 1, 'h', 1, ?)",
                (SystemClock().now_ms() + 60_000,),
            )
        new = SQLiteBackend(path)
        await new.open()
        try:
            assert (await new.describe("old")).ttl_ms == 10_000
            assert (await new.renew("old", 1, "h", 0)).ttl_ms == 10_000
            assert (await new.renew("old", 1, "h", 30_000)).ttl_ms == 30_000
            assert (await new.renew("old", 1, "h", 0)).ttl_ms == 30_000
        finally:
            await new.close()
