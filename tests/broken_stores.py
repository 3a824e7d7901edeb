"""Deliberately broken fenced stores: the contract suite's controls.

Each is the in-memory store with one guarantee of :mod:`guard.stores.base` broken, the
way real stores get it wrong. tests/contract/test_store_suite_control.py asserts that the
shipped suite (:mod:`fencing.testing.stores`) fails each of them, on the cases that say
why. Never use them anywhere else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fencing.types import Op
from guard import fence as fence_rule
from guard.fence import FenceMode
from guard.stores.base import StoreWriteResult
from guard.stores.memory import MemoryStore


class UnlockedStore(MemoryStore):
    """Checks the fence in one step and writes in another (read, then write in a
    second call): a concurrent writer with a higher token slips in between."""

    name = "broken-unlocked"

    async def write(
        self,
        resource: str,
        token: int,
        ops: Sequence[Op],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> StoreWriteResult:
        fence = await self.describe_fence(resource)
        fence_rule.admit(resource, token, fence, mode)
        await asyncio.sleep(0)  # the round trip between the check and the write
        return await MemoryStore.write(self, resource, token, ops, idempotency_key, FenceMode.OFF)


class UnfencedStore(MemoryStore):
    """Never judges the token: every write lands (what ``mode=off`` does on purpose)."""

    name = "broken-unfenced"

    async def write(
        self,
        resource: str,
        token: int,
        ops: Sequence[Op],
        idempotency_key: str = "",
        mode: FenceMode = FenceMode.MONOTONIC,
    ) -> StoreWriteResult:
        return await MemoryStore.write(self, resource, token, ops, idempotency_key, FenceMode.OFF)
