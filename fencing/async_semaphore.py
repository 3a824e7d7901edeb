"""A counting semaphore on leases, asyncio flavour: the twin of :mod:`fencing.semaphore`
(same design, names and rules; see there)::

    crawlers = AsyncSemaphore(leases, "crawlers", limit=3, ttl=10, fence=[guard])
    async with crawlers.hold() as slot:           # waits while 3 others hold it
        await guard.put(slot, "progress", b"...")  # fenced by the slot's token
    # LeaseLost here if the slot was lost: the body was cancelled at that moment
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

from fencing.client.async_lease import (
    AsyncFencer,
    AsyncHold,
    AsyncLease,
    AsyncLeaseClient,
    AsyncWatchStream,
)
from fencing.errors import FencingError, LeaseHeldError
from fencing.semaphore import (
    RESCAN_S,
    slot_prefix,
    slot_resources,
    timeout_error,
    try_order,
)
from fencing.types import LeaseState


class _AsyncWakeups:
    """Sets :attr:`event` on every event of the semaphore's slots (a task reading a watch)."""

    def __init__(self, stream: AsyncWatchStream) -> None:
        self.event = asyncio.Event()
        self._stream = stream
        self._task = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, leases: AsyncLeaseClient, prefix: str) -> _AsyncWakeups:
        return cls(await leases.watch_stream(prefix=prefix))

    async def _read(self) -> None:
        with contextlib.suppress(FencingError):  # the waiter rescans every RESCAN_S
            async for _event in self._stream:
                self.event.set()

    async def aclose(self) -> None:
        await self._stream.aclose()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


class AsyncSemaphoreHold(AsyncHold):
    """``async with semaphore.hold(...) as slot``: a slot held as ``leases.hold`` holds a lease."""

    def __init__(
        self,
        semaphore: AsyncSemaphore,
        timeout: float | None,
        on_lost: Callable[[AsyncLease], object] | None,
    ) -> None:
        super().__init__(
            semaphore.leases, semaphore.name, semaphore.ttl, timeout, on_lost, semaphore.fence
        )
        self._semaphore = semaphore

    async def _take(self) -> AsyncLease:
        return await self._semaphore.acquire(self._timeout)


class AsyncSemaphore:
    """At most ``limit`` holders of ``name`` at once, each with its own slot lease and
    token: see :class:`fencing.semaphore.Semaphore`."""

    def __init__(
        self,
        leases: AsyncLeaseClient,
        name: str,
        limit: int,
        ttl: float,
        *,
        fence: Sequence[AsyncFencer] = (),
    ) -> None:
        self.leases = leases
        self.name = name
        self.limit = limit
        self.ttl = ttl
        self.fence = list(fence)
        self.slots = slot_resources(name, limit)

    async def acquire_nowait(self) -> AsyncLease:
        """A free slot's lease now (not renewed), or :class:`LeaseHeldError` if all are held."""
        for resource in try_order(self.slots):
            with contextlib.suppress(LeaseHeldError):
                return await self.leases.acquire_nowait(resource, self.ttl, fence=self.fence)
        raise LeaseHeldError(f"all {self.limit} slots of semaphore {self.name!r} are held")

    async def acquire(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 - the twin's signature
    ) -> AsyncLease:
        """A slot's lease (not renewed: use :meth:`hold`), waiting up to ``timeout``
        seconds (None: forever) while all are held; then :class:`AcquireTimeoutError`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wakeups: _AsyncWakeups | None = None
        try:
            while True:
                try:
                    return await self.acquire_nowait()
                except LeaseHeldError:
                    pass
                if wakeups is None:  # watch first, then look again: no release is missed
                    wakeups = await _AsyncWakeups.open(self.leases, slot_prefix(self.name))
                    continue
                wait = RESCAN_S
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        raise timeout_error(self.name, self.limit, timeout)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await wakeups.event.wait()
                wakeups.event.clear()
        finally:
            if wakeups is not None:
                await wakeups.aclose()

    def hold(
        self,
        *,
        timeout: float | None = None,
        on_lost: Callable[[AsyncLease], object] | None = None,
    ) -> AsyncSemaphoreHold:
        """Take a slot, keep it renewed, release it on exit; loss as for
        ``AsyncLeaseClient.hold`` (the body is cancelled, the block ends with ``LeaseLost``)."""
        return AsyncSemaphoreHold(self, timeout, on_lost)

    async def holders(self) -> list[LeaseState]:
        """The slots held now, in slot order (one ``List`` of the slots' prefix)."""
        mine = set(self.slots)
        return [
            s async for s in self.leases.list_held(slot_prefix(self.name)) if s.resource in mine
        ]
