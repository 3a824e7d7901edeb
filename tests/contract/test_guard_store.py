"""The fenced-store contract: every implementation in tests/backends.py passes it."""

from __future__ import annotations

import time

import pytest

from fencing.errors import StaleTokenError
from fencing.types import Delete, Put, Record
from guard.fence import FenceMode
from guard.stores.base import GuardStore


async def test_write_applies_and_advances_the_fence(guard_store: GuardStore) -> None:
    result = await guard_store.write("r", 5, [Put("k", b"v")])
    assert result.fence == 5 and not result.replayed
    assert await guard_store.read("r", "k") == Record(b"v", 5)
    assert await guard_store.describe_fence("r") == 5
    assert await guard_store.describe_fence("other") == 0
    assert await guard_store.read("r", "missing") is None


async def test_equal_token_writes_again(guard_store: GuardStore) -> None:
    await guard_store.write("r", 3, [Put("k", b"1")])
    assert (await guard_store.write("r", 3, [Put("k", b"2")])).fence == 3
    assert await guard_store.read("r", "k") == Record(b"2", 3)


async def test_stale_write_is_rejected_and_applies_nothing(guard_store: GuardStore) -> None:
    await guard_store.write("r", 7, [Put("a", b"new-a"), Put("b", b"new-b")])
    with pytest.raises(StaleTokenError) as stale:
        await guard_store.write("r", 6, [Put("a", b"stale"), Delete("b"), Put("c", b"stale")])
    assert stale.value.current_token == 7 and stale.value.token == 6
    assert stale.value.resource == "r"
    assert await guard_store.read("r", "a") == Record(b"new-a", 7)
    assert await guard_store.read("r", "b") == Record(b"new-b", 7)
    assert await guard_store.read("r", "c") is None
    assert await guard_store.describe_fence("r") == 7


async def test_ops_apply_in_order_within_a_write(guard_store: GuardStore) -> None:
    await guard_store.write("r", 1, [Put("k", b"x"), Delete("k"), Put("j", b"y"), Put("j", b"z")])
    assert await guard_store.read("r", "k") is None
    assert await guard_store.read("r", "j") == Record(b"z", 1)


async def test_fences_are_per_resource(guard_store: GuardStore) -> None:
    await guard_store.write("r1", 10, [Put("k", b"v")])
    await guard_store.write("r2", 1, [Put("k", b"w")])
    assert await guard_store.read("r2", "k") == Record(b"w", 1)


async def test_fence_advances_never_lowers_and_is_idempotent(guard_store: GuardStore) -> None:
    assert await guard_store.fence("r", 4) == 4
    assert await guard_store.fence("r", 4) == 4
    with pytest.raises(StaleTokenError) as stale:
        await guard_store.fence("r", 3)
    assert stale.value.current_token == 4
    assert await guard_store.describe_fence("r") == 4
    with pytest.raises(StaleTokenError):
        await guard_store.write("r", 3, [Put("k", b"late")])
    assert await guard_store.read("r", "k") is None
    assert (await guard_store.write("r", 4, [Put("k", b"ok")])).fence == 4


async def test_idempotency_key_replays_the_first_outcome(guard_store: GuardStore) -> None:
    first = await guard_store.write("r", 2, [Put("k", b"first")], "op-1")
    await guard_store.write("r", 3, [Put("other", b"x")])
    again = await guard_store.write("r", 2, [Put("k", b"second")], "op-1")
    assert again.replayed and again.fence == first.fence == 2
    assert await guard_store.read("r", "k") == Record(b"first", 2)
    # The same key on another resource is another write.
    assert not (await guard_store.write("r2", 1, [Put("k", b"v")], "op-1")).replayed


async def test_rejected_write_records_no_idempotency_key(guard_store: GuardStore) -> None:
    await guard_store.write("r", 5, [Put("k", b"v")])
    with pytest.raises(StaleTokenError):
        await guard_store.write("r", 4, [Put("k", b"stale")], "op-x")
    result = await guard_store.write("r", 6, [Put("k", b"fresh")], "op-x")
    assert not result.replayed and result.fence == 6


async def test_prune_forgets_old_idempotency_keys(guard_store: GuardStore) -> None:
    await guard_store.write("r", 1, [Put("k", b"v")], "old")
    assert await guard_store.prune_idempotency(time.time_ns() // 1_000_000 - 60_000) == 0
    assert await guard_store.prune_idempotency(time.time_ns() // 1_000_000 + 1000) == 1
    assert not (await guard_store.write("r", 1, [Put("k", b"v2")], "old")).replayed


async def test_mode_off_accepts_stale_tokens(guard_store: GuardStore) -> None:
    """The chaos control: with fencing off a stale write lands (and the fence never drops)."""
    await guard_store.write("r", 9, [Put("k", b"new")])
    result = await guard_store.write("r", 2, [Put("k", b"stale")], mode=FenceMode.OFF)
    assert result.fence == 9
    assert await guard_store.read("r", "k") == Record(b"stale", 2)
