"""What only the asyncio twin does: ``async with hold`` cancels its body on loss.

(The rest of the async SDK runs the shared client suite through tests/integration/flavors.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from fencing import AsyncLease, AsyncLeaseClient, LeaseLost, propagation
from fencing.testing import RunningServers

HANG_GUARD = 30.0  # seconds a body would sleep if nobody cancelled it


@pytest.fixture
async def aleases(servers: RunningServers) -> AsyncIterator[AsyncLeaseClient]:
    async with AsyncLeaseClient(servers.lease_address, holder="tester") as client:
        yield client


@pytest.fixture
async def thief(servers: RunningServers) -> AsyncIterator[AsyncLeaseClient]:
    async with AsyncLeaseClient(servers.lease_address, holder="thief") as client:
        yield client


async def test_the_body_is_cancelled_when_the_lease_is_taken(
    aleases: AsyncLeaseClient, thief: AsyncLeaseClient
) -> None:
    reached_the_end = False
    lost_calls: list[AsyncLease] = []
    with pytest.raises(LeaseLost) as lost:
        async with aleases.hold("r", ttl=0.6, on_lost=lost_calls.append) as lease:
            await thief.release("r", lease.token)  # an operator frees it behind our back
            await thief.acquire("r", ttl=10)
            await asyncio.sleep(HANG_GUARD)  # the next renewal is refused: cancelled here
            reached_the_end = True
    assert not reached_the_end
    assert isinstance(lost.value.__cause__, asyncio.CancelledError)
    assert lost.value.token == lease.token
    assert lease.lost.is_set()
    assert lost_calls == [lease]
    with pytest.raises(LeaseLost):
        lease.check()
    # The task is not left cancelling: it can await again.
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    await asyncio.sleep(0)


async def test_the_body_is_cancelled_at_the_local_deadline_when_the_server_is_gone(
    servers: RunningServers,
) -> None:
    async with AsyncLeaseClient(servers.lease_address, rpc_timeout=0.2) as client:
        with pytest.raises(LeaseLost):
            async with client.hold("r", ttl=0.6) as lease:
                await asyncio.to_thread(servers.call, servers.lease.built.server.stop(0))
                await asyncio.sleep(HANG_GUARD)
        assert lease.lost.is_set()
        assert lease.remaining() == 0.0


async def test_an_outer_cancellation_stays_a_cancellation(
    aleases: AsyncLeaseClient, thief: AsyncLeaseClient
) -> None:
    entered = asyncio.Event()

    async def worker() -> None:
        async with aleases.hold("r", ttl=5):
            entered.set()
            await asyncio.sleep(HANG_GUARD)

    task = asyncio.create_task(worker())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert not (await thief.describe("r")).held  # released on the way out


async def test_outer_cancellation_racing_the_loss_is_not_swallowed(
    aleases: AsyncLeaseClient, thief: AsyncLeaseClient
) -> None:
    entered = asyncio.Event()

    async def worker() -> None:
        task = asyncio.current_task()
        assert task is not None
        # Someone cancels this task at the very moment the lease is lost.
        async with aleases.hold("r", ttl=0.6, on_lost=lambda _: task.cancel()) as lease:
            entered.set()
            await thief.release("r", lease.token)
            await asyncio.sleep(HANG_GUARD)

    task = asyncio.create_task(worker())
    await entered.wait()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_a_body_that_swallows_the_cancellation_still_ends_with_lease_lost(
    aleases: AsyncLeaseClient, thief: AsyncLeaseClient
) -> None:
    swallowed = False
    with pytest.raises(LeaseLost):
        async with aleases.hold("r", ttl=0.6) as lease:
            await thief.release("r", lease.token)
            try:
                await asyncio.sleep(HANG_GUARD)
            except asyncio.CancelledError:
                swallowed = True  # bad manners, but the block still reports the loss
    assert swallowed


async def test_the_lease_is_current_inside_the_block_and_its_tasks(
    aleases: AsyncLeaseClient,
) -> None:
    assert propagation.current() is None
    async with aleases.hold("r", ttl=5) as lease:
        assert propagation.current() is lease

        async def child() -> object:
            return propagation.current()

        assert await asyncio.create_task(child()) is lease
    assert propagation.current() is None


async def test_wait_lost_returns_at_the_local_deadline_without_renewals(
    aleases: AsyncLeaseClient,
) -> None:
    lease = await aleases.acquire("r", ttl=0.3)  # acquire alone does not renew
    await asyncio.wait_for(lease.wait_lost(), HANG_GUARD)
    assert lease.lost.is_set()
    with pytest.raises(LeaseLost):
        lease.check()


async def test_loss_noticed_by_the_body_itself_is_a_plain_lease_lost(
    aleases: AsyncLeaseClient, thief: AsyncLeaseClient
) -> None:
    with pytest.raises(LeaseLost) as lost:
        async with aleases.hold("r", ttl=5) as lease:
            await thief.release("r", lease.token)
            await lease.renew()  # refused: the body learns it first, in its own task
    assert not isinstance(lost.value.__cause__, asyncio.CancelledError)
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    await asyncio.sleep(0)  # no cancellation left pending on this task


async def test_wait_lost_cancelled_as_the_loss_comes_stays_cancelled(
    aleases: AsyncLeaseClient,
) -> None:
    """The loss and a cancellation in the same turn of the loop: the cancellation wins
    (Python 3.11's ``asyncio.wait_for`` returned instead and dropped it)."""
    lease = await aleases.acquire("r", ttl=30)
    waiting = asyncio.create_task(lease.wait_lost())
    await asyncio.sleep(0.01)  # asleep on lease.lost
    lease._mark_lost("taken in the test")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
