"""Group commit: how writes are packed into store transactions, and what a failure does."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from fencing.errors import BackendUnavailableError, StaleTokenError
from fencing.types import Put
from guard.commit import GroupCommit
from guard.fence import FenceMode
from guard.service import GuardService
from guard.stores.base import BatchedWrite, StoreWriteResult, Verdict
from guard.stores.memory import MemoryStore


class GatedStore(MemoryStore):
    """A memory store whose transactions wait for ``gate`` and record their sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.sizes: list[int] = []
        self.fail_next = False

    async def write_batch(
        self, writes: Sequence[BatchedWrite], mode: FenceMode = FenceMode.MONOTONIC
    ) -> list[Verdict]:
        await self.gate.wait()
        self.sizes.append(len(writes))
        if self.fail_next:
            self.fail_next = False
            raise BackendUnavailableError("down")
        return await super().write_batch(writes, mode)


def w(resource: str, token: int, ops: int = 1) -> BatchedWrite:
    return BatchedWrite(resource, token, [Put(f"k{i}", b"v") for i in range(ops)])


async def test_a_lone_write_goes_at_once_alone() -> None:
    store = GatedStore()  # write() is not gated: a batch of one is a plain write
    commit = GroupCommit(store, FenceMode.MONOTONIC)
    assert await commit.submit([w("r", 1)]) == [StoreWriteResult(1)]
    assert (commit.batches, commit.batched_writes, store.sizes) == (1, 1, [])


async def test_writes_arriving_during_a_commit_share_the_next_one() -> None:
    store = GatedStore()
    commit = GroupCommit(store, FenceMode.MONOTONIC, concurrency=1)
    first = asyncio.create_task(commit.submit([w("r", 1), w("r", 2)]))
    await asyncio.sleep(0.01)
    later = [asyncio.create_task(commit.submit([w(f"s{i}", 1)])) for i in range(10)]
    stale = asyncio.create_task(commit.submit([w("r", 1)]))
    await asyncio.sleep(0.01)
    store.gate.set()
    assert await first == [StoreWriteResult(1), StoreWriteResult(2)]
    assert [await t for t in later] == [[StoreWriteResult(1)]] * 10
    (verdict,) = await stale
    assert isinstance(verdict, StaleTokenError) and verdict.current_token == 2
    assert store.sizes == [2, 11]


async def test_batches_respect_the_op_budget() -> None:
    store = GatedStore()
    commit = GroupCommit(store, FenceMode.MONOTONIC, max_ops=10)
    store.gate.set()
    blocker = asyncio.create_task(commit.submit([w("a", 1), w("a", 1)]))
    rest = asyncio.create_task(commit.submit([w(f"b{i}", 1, ops=4) for i in range(5)]))
    await asyncio.gather(blocker, rest)
    assert all(size <= 3 for size in store.sizes[1:])
    assert commit.batched_writes == 7


async def test_a_failed_transaction_fails_its_writes_only() -> None:
    store = GatedStore()
    commit = GroupCommit(store, FenceMode.MONOTONIC)
    store.fail_next = True
    first = asyncio.create_task(commit.submit([w("r", 1), w("s", 1)]))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(commit.submit([w("t", 1), w("u", 1)]))
    await asyncio.sleep(0.01)
    store.gate.set()
    with pytest.raises(BackendUnavailableError):
        await first
    assert await second == [StoreWriteResult(1), StoreWriteResult(1)]
    assert await store.describe_fence("r") == 0


def test_strict_writes_are_never_batched() -> None:
    with pytest.raises(ValueError, match="strict"):
        GroupCommit(MemoryStore(), FenceMode.STRICT)
    assert GuardService(MemoryStore(), FenceMode.STRICT).commit is None
    assert GuardService(MemoryStore()).commit is not None
