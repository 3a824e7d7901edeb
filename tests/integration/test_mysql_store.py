"""The MySQL store beyond the shared suite: a cancelled write (a client gone, the guard
stopping) leaves nothing half-applied and no connection stuck in a transaction."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from fencing.types import Put, Record
from guard.stores.base import GuardStore
from tests import mysql

pytestmark = pytest.mark.mysql


@pytest.fixture
async def store() -> AsyncIterator[GuardStore]:
    async with mysql.fresh_store() as opened:
        yield opened


async def test_a_write_cancelled_anywhere_leaves_whole_writes_and_a_usable_store(
    store: GuardStore,
) -> None:
    token = 0
    # Cancel at many points of a 20-op transaction (before it starts, between
    # statements, around the commit); each write either landed whole or not at all.
    for pause in (0, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016):
        for _ in range(3):
            token += 1
            value = str(token).encode()
            task = asyncio.create_task(
                store.write("r", token, [Put(f"k{j}", value) for j in range(20)])
            )
            await asyncio.sleep(pause)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            fence = await store.describe_fence("r")
            if fence:
                landed = Record(str(fence).encode(), fence)
                assert [await store.read("r", f"k{j}") for j in range(20)] == [landed] * 20
    # Every pooled connection still works (none was returned mid-transaction).
    writes = [store.write(f"after-{i}", token + 1, [Put("k", b"v")]) for i in range(8)]
    assert [r.fence for r in await asyncio.gather(*writes)] == [token + 1] * 8
