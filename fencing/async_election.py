"""Leader election on a lease, fenced by its term: the asyncio twin of
:mod:`fencing.election` (same names, ``Async`` prefixed, coroutines for the calls)::

    election = AsyncElection(leases, guard, "scheduler", ttl=10)
    async with await election.campaign("10.0.0.7:8080") as leader:
        await guard.put(leader, "plan", b"...")          # fenced by leader.term

    async for leader in election.observe():              # current at once, then changes
        ...

As ``AsyncLeaseClient.hold`` does, a lost leadership cancels the task that
campaigned (it is where the leadership's body runs), and ``async with`` then ends
with :class:`~fencing.errors.LeaseLost` instead of the ``CancelledError``. Where the
value is stored, and why: see :mod:`fencing.election`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from types import TracebackType
from typing import Any

from fencing.client.async_guard import AsyncGuardClient
from fencing.client.async_lease import AsyncHold, AsyncLease, AsyncLeaseClient
from fencing.election import DEFAULT_POLL_S, LEADER_KEY, Leader, leader_of
from fencing.errors import InvalidArgumentError, LeaseLost


class AsyncLeadership:
    """A won election (asyncio): see :class:`fencing.election.Leadership`."""

    def __init__(self, election: AsyncElection, lease: AsyncLease, hold: AsyncHold) -> None:
        self.election = election
        self.lease = lease
        self._hold: AsyncHold | None = hold

    @property
    def resource(self) -> str:
        return self.lease.resource

    @property
    def token(self) -> int:
        return self.lease.token

    @property
    def term(self) -> int:
        """This leadership's term: the lease's fencing token."""
        return self.lease.token

    @property
    def lost(self) -> Any:
        """Set once the leadership is lost (an :class:`asyncio.Event`)."""
        return self.lease.lost

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the leadership is lost, resigned, or past its
        local deadline."""
        self.lease.check()

    async def proclaim(self, value: str) -> None:
        """Publish ``value`` as this term's, fenced by the term; see
        :meth:`fencing.election.Leadership.proclaim`."""
        self.lease.check()
        await self.election.guard.put(self, LEADER_KEY, value.encode())

    async def resign(self) -> None:
        """Give the leadership up now. Never raises ``LeaseLost``."""
        with contextlib.suppress(LeaseLost):
            await self.__aexit__(None, None, None)

    async def __aenter__(self) -> AsyncLeadership:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Resign; a block ended by the loss (or left normally after one) raises
        ``LeaseLost``. The block's exception goes to the hold, which tells by it
        whether the loss ended the block."""
        hold, self._hold = self._hold, None
        if hold is not None:
            await hold.__aexit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<AsyncLeadership {self.resource!r} term={self.term} {self.lease!r}>"


class AsyncElection:
    """Leader election on the lease named ``name`` (asyncio); see
    :class:`fencing.election.Election`."""

    def __init__(
        self, leases: AsyncLeaseClient, guard: AsyncGuardClient, name: str, *, ttl: float = 10.0
    ) -> None:
        self.leases = leases
        self.guard = guard
        self.name = name
        self.ttl = ttl

    async def campaign(
        self,
        value: str | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the server waits it (twin's signature)
        on_lost: Callable[[AsyncLeadership], object] | None = None,
    ) -> AsyncLeadership:
        """Wait until this client leads (up to ``timeout``; then
        :class:`AcquireTimeoutError`), then proclaim ``value`` if given; see
        :meth:`fencing.election.Election.campaign`."""
        hold = self.leases.hold(self.name, self.ttl, timeout=timeout, fence=[self.guard])
        lease = await hold.__aenter__()
        leadership = AsyncLeadership(self, lease, hold)
        try:
            if on_lost is not None:
                lease.on_lost(lambda _lease: on_lost(leadership))
            if value is not None:
                await leadership.proclaim(value)
        except BaseException as exc:
            await leadership.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return leadership

    async def leader(self) -> Leader | None:
        """The current leader, or None if nobody leads."""
        state = await self.leases.describe(self.name)
        if not state.held:
            return None
        return leader_of(self.name, state, await self.guard.read(self.name, LEADER_KEY))

    async def observe(self, *, poll: float = DEFAULT_POLL_S) -> AsyncGenerator[Leader | None, None]:
        """Yield the current leader at once, then each change; see
        :meth:`fencing.election.Election.observe`."""
        if poll <= 0:
            raise InvalidArgumentError(f"poll must be > 0, got {poll}", field="poll")
        events: asyncio.Queue[BaseException | None] = asyncio.Queue()
        stream = await self.leases.watch_stream(self.name)

        async def follow() -> None:
            try:
                async for _event in stream:
                    events.put_nowait(None)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # handed to the reader, which raises it
                events.put_nowait(exc)

        reader = asyncio.create_task(follow())
        try:
            last = await self.leader()
            yield last
            while True:
                failure = None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll):
                        failure = await events.get()
                if failure is not None:
                    raise failure
                now = await self.leader()
                if now != last:
                    last = now
                    yield now
        finally:
            reader.cancel()
            await stream.aclose()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


__all__ = ["AsyncElection", "AsyncLeadership"]
