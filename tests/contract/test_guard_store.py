"""The fenced-store contract: every implementation in tests/backends.py passes it."""

from __future__ import annotations

import time

import pytest

from fencing.errors import LeaseLost, StaleTokenError
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
    again = await guard_store.write("r", 2, [Put("k", b"second")], "op-1")
    assert again.replayed and again.fence == first.fence == 2
    assert again.replayed_by_token == 2 and first.replayed_by_token == 0
    assert await guard_store.read("r", "k") == Record(b"first", 2)
    # The same key on another resource is another write.
    assert not (await guard_store.write("r2", 1, [Put("k", b"v")], "op-1")).replayed


async def test_a_stale_token_is_refused_even_when_its_key_is_known(
    guard_store: GuardStore,
) -> None:
    """A paused former holder (token 1) re-sends the key a newer holder (token 2) already
    used (keys derived from state collide like that): it is refused, never told
    "success" for someone else's write, and the refusal says whose write it was."""
    await guard_store.write("orders", 1, [Put("next_id", b"7")])
    await guard_store.write("orders", 2, [Put("order-7", b"newer holder")], "order-7")
    with pytest.raises(StaleTokenError) as stale:
        await guard_store.write("orders", 1, [Put("order-7", b"paused holder")], "order-7")
    assert (stale.value.token, stale.value.current_token) == (1, 2)
    assert stale.value.key_applied is True and stale.value.applied_by_token == 2
    assert await guard_store.read("orders", "order-7") == Record(b"newer holder", 2)


async def test_a_stale_refusal_says_whether_its_own_attempt_landed(
    guard_store: GuardStore,
) -> None:
    await guard_store.write("r", 3, [Put("k", b"mine")], "attempt")  # landed; reply lost
    await guard_store.fence("r", 4)  # a newer holder took over
    with pytest.raises(StaleTokenError) as retried:
        await guard_store.write("r", 3, [Put("k", b"mine")], "attempt")
    assert retried.value.key_applied is True and retried.value.applied_by_token == 3
    with pytest.raises(StaleTokenError) as unknown:
        await guard_store.write("r", 3, [Put("k", b"never")], "other-attempt")
    assert unknown.value.key_applied is False and unknown.value.applied_by_token == 0
    with pytest.raises(StaleTokenError) as keyless:
        await guard_store.write("r", 3, [Put("k", b"never")])
    assert keyless.value.key_applied is None
    assert await guard_store.read("r", "k") == Record(b"mine", 3)


async def test_a_replay_to_a_newer_token_names_the_token_that_applied_it(
    guard_store: GuardStore,
) -> None:
    """A token that may write now (at or above the fence) is answered the replay, with
    the older token that applied the key: it can tell its own write was not applied."""
    await guard_store.write("r", 5, [Put("k", b"by five")], "op")
    again = await guard_store.write("r", 6, [Put("k", b"by six")], "op")
    assert again.replayed and again.replayed_by_token == 5 and again.fence == 5
    assert await guard_store.read("r", "k") == Record(b"by five", 5)
    assert await guard_store.describe_fence("r") == 5


async def test_control_without_fencing_a_stale_owner_is_told_success(
    guard_store: GuardStore,
) -> None:
    """The control: with the token not judged first (mode off takes the key's answer
    as the old order did), the paused holder's re-sent key reads as a success."""
    await guard_store.write("orders", 2, [Put("order-7", b"newer holder")], "order-7")
    result = await guard_store.write(
        "orders", 1, [Put("order-7", b"paused holder")], "order-7", FenceMode.OFF
    )
    assert result.replayed and result.replayed_by_token == 2  # "success", someone else's


async def test_strict_without_a_lease_backend_fails_closed_as_lease_lost(
    guard_store: GuardStore,
) -> None:
    """A strict write whose token nobody holds is LEASE_LOST, not STALE_TOKEN: the
    resource was never granted here, so nobody newer owns it. A token below the fence
    stays STALE_TOKEN. (Stores with a lease backend: tests/integration.)"""
    if guard_store.supports_strict:
        pytest.skip("checked against a real lease backend in tests/integration")
    await guard_store.write("r", 4, [Put("k", b"v")])
    with pytest.raises(LeaseLost) as lost:
        await guard_store.write("r", 5, [Put("k", b"x")], "op", FenceMode.STRICT)
    assert lost.value.token == 5 and lost.value.key_applied is False
    with pytest.raises(StaleTokenError):
        await guard_store.write("r", 3, [Put("k", b"x")], mode=FenceMode.STRICT)
    with pytest.raises(LeaseLost):
        await guard_store.fence("r", 2**63 - 1, FenceMode.STRICT)
    assert await guard_store.describe_fence("r") == 4


async def test_reset_fence_sets_the_fence_lower_or_higher(guard_store: GuardStore) -> None:
    """An operator's recovery from a fence a token nobody was granted wedged."""
    await guard_store.write("w", 2, [Put("k", b"real holder")])
    await guard_store.write("w", 2**63 - 1, [Put("k", b"wedge")])
    with pytest.raises(StaleTokenError):
        await guard_store.write("w", 3, [Put("k", b"next holder")])
    assert await guard_store.reset_fence("w", 3) == 2**63 - 1
    assert await guard_store.describe_fence("w") == 3
    assert (await guard_store.write("w", 3, [Put("k", b"next holder")])).fence == 3
    with pytest.raises(StaleTokenError):  # the former holder stays fenced
        await guard_store.write("w", 2, [Put("k", b"former")])
    assert await guard_store.read("w", "k") == Record(b"next holder", 3)
    assert await guard_store.reset_fence("fresh", 9) == 0
    assert await guard_store.describe_fence("fresh") == 9


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


async def test_list_records_in_code_point_order_under_a_prefix_after_a_cursor(
    guard_store: GuardStore,
) -> None:
    # Mixed case, a non-ASCII key and a LIKE wildcard: the order is the code points'
    # on every store (whatever the database's locale), and "%" and "_" are literal.
    keys = ["cfg/b", "cfg/B", "cfg/a", "cfg/é", "cfg/_x", "cfg%", "other", "cfg/a/deep"]
    await guard_store.write("r", 3, [Put(k, k.encode()) for k in keys])
    await guard_store.write("r2", 1, [Put("cfg/zz", b"elsewhere")])
    under = sorted(k for k in keys if k.startswith("cfg/"))
    assert under == ["cfg/B", "cfg/_x", "cfg/a", "cfg/a/deep", "cfg/b", "cfg/é"]
    page = await guard_store.list_records("r", "cfg/", "", 10)
    assert page == [(k, Record(k.encode(), 3)) for k in under]
    assert [k for k, _ in await guard_store.list_records("r", "cfg/", "", 2)] == under[:2]
    after = await guard_store.list_records("r", "cfg/", "cfg/a", 10)
    assert [k for k, _ in after] == under[3:]
    assert [k for k, _ in await guard_store.list_records("r", "", "", 100)] == sorted(keys)
    assert await guard_store.list_records("r", "cfg/", "cfg/é", 10) == []
    assert await guard_store.list_records("none", "", "", 10) == []
    await guard_store.write("r", 3, [Delete("cfg/b")])
    assert "cfg/b" not in [k for k, _ in await guard_store.list_records("r", "cfg/", "", 10)]
