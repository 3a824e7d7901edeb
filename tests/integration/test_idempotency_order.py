"""The token is judged before the idempotency key, over real gRPC, in Write, WriteMany and
WriteStream, through the sync and asyncio SDK (the guard fixture runs both flavours).

The scenario is the README's: keys derived from state (``order-{next_id}``) collide, so a
paused former holder re-sends the key a newer holder already used. It must get
STALE_TOKEN saying whose write that key was, never a plain success.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fencing import AsyncGuardClient, Claim, GuardClient, Put, StaleTokenError
from fencing.testing import RunningServers, running_servers
from guard.fence import FenceMode


def test_write_refuses_a_stale_token_with_a_known_key(guard: GuardClient) -> None:
    guard.write(Claim("orders", 2), Put("order-7", b"newer holder"), idempotency_key="order-7")
    with pytest.raises(StaleTokenError) as stale:
        guard.write(Claim("orders", 1), Put("order-7", b"paused"), idempotency_key="order-7")
    assert (stale.value.token, stale.value.current_token) == (1, 2)
    assert stale.value.key_applied is True and stale.value.applied_by_token == 2
    record = guard.read("orders", "order-7")
    assert record is not None and record.value == b"newer holder"
    # The newer holder's retry is a replay naming its own token.
    again = guard.write(Claim("orders", 2), Put("order-7", b"x"), idempotency_key="order-7")
    assert again.replayed and again.replayed_by_token == 2
    # A token that may write now, re-sending it, learns the write was token 2's.
    later = guard.write(Claim("orders", 3), Put("order-7", b"x"), idempotency_key="order-7")
    assert later.replayed and later.replayed_by_token == 2
    fresh = guard.write(Claim("orders", 3), Put("order-8", b"y"), idempotency_key="order-8")
    assert not fresh.replayed and fresh.replayed_by_token == 0


def test_write_many_refuses_a_stale_token_with_a_known_key(guard: GuardClient) -> None:
    guard.write_many(
        [(Claim("a", 2), Put("k", b"new")), (Claim("b", 2), Put("k", b"new"))],
        idempotency_key="move-7",
    )
    with pytest.raises(StaleTokenError) as stale:
        guard.write_many(
            [(Claim("a", 1), Put("k", b"old")), (Claim("b", 2), Put("k", b"old"))],
            idempotency_key="move-7",
        )
    assert stale.value.resource == "a"
    assert stale.value.key_applied is True and stale.value.applied_by_token == 2


def test_write_stream_refuses_a_stale_token_with_a_known_key(guard: GuardClient) -> None:
    if not isinstance(guard, GuardClient):
        pytest.skip("the stream of the asyncio twin: test_async_write_stream_... below")
    guard.write(Claim("s", 2), Put("order-7", b"newer"), idempotency_key="order-7")
    with guard.stream() as stream:
        with pytest.raises(StaleTokenError) as stale:
            stream.write(Claim("s", 1), Put("order-7", b"paused"), idempotency_key="order-7")
        replay = stream.write(Claim("s", 2), Put("order-7", b"x"), idempotency_key="order-7")
    assert (stale.value.key_applied, stale.value.applied_by_token) == (True, 2)
    assert replay.replayed and replay.replayed_by_token == 2


def test_async_write_stream_refuses_a_stale_token_with_a_known_key(
    servers: RunningServers,
) -> None:
    async def scenario() -> None:
        async with AsyncGuardClient(servers.guard_address) as guard:
            await guard.write(Claim("t", 2), Put("order-7", b"newer"), idempotency_key="order-7")
            async with guard.stream() as stream:
                with pytest.raises(StaleTokenError) as stale:
                    await stream.write(
                        Claim("t", 1), Put("order-7", b"paused"), idempotency_key="order-7"
                    )
                replay = await stream.write(
                    Claim("t", 2), Put("order-7", b"x"), idempotency_key="order-7"
                )
            assert (stale.value.key_applied, stale.value.applied_by_token) == (True, 2)
            assert replay.replayed and replay.replayed_by_token == 2

    asyncio.run(scenario())


def test_control_an_unfenced_guard_tells_the_stale_owner_success(tmp_path: Path) -> None:
    """The control: a guard with fencing off answers the key first, as the old order did:
    the paused holder is told its write succeeded although the newer holder's landed."""
    with (
        running_servers(
            f"sqlite:{tmp_path / 'leases.db'}",
            f"sqlite:{tmp_path / 'guard.db'}",
            mode=FenceMode.OFF,
        ) as servers,
        GuardClient(servers.guard_address) as guard,
    ):
        guard.write(Claim("orders", 2), Put("order-7", b"newer"), idempotency_key="order-7")
        told = guard.write(Claim("orders", 1), Put("order-7", b"paused"), idempotency_key="order-7")
        assert told.replayed  # "success" for someone else's write
        assert told.replayed_by_token == 2


def test_sqlite_keys_recorded_before_the_upgrade_replay_by_their_fence(tmp_path: Path) -> None:
    """A guard file from before the token column: its keys replay, and refuse a stale
    token, with the recorded fence standing in for the token."""
    import sqlite3

    from guard.stores.sqlite import MIGRATIONS, SQLiteStore

    path = tmp_path / "guard.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0].split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("PRAGMA user_version=1")
    conn.execute("INSERT INTO fences VALUES ('r', 4)")
    conn.execute("INSERT INTO idempotency VALUES ('r', 'old', 4, 0)")
    conn.close()

    async def scenario() -> None:
        store = SQLiteStore(path)
        await store.open()
        try:
            again = await store.write("r", 4, [Put("k", b"x")], "old")
            assert again.replayed and again.replayed_by_token == 4
            await store.fence("r", 5)
            with pytest.raises(StaleTokenError) as stale:
                await store.write("r", 4, [Put("k", b"x")], "old")
            assert (stale.value.key_applied, stale.value.applied_by_token) == (True, 4)
        finally:
            await store.close()

    asyncio.run(scenario())
