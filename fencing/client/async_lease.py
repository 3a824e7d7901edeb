"""``AsyncLeaseClient``: the asyncio twin of :class:`~fencing.client.lease.LeaseClient`.

Same methods, awaited (``aclose`` for ``close``), the same rules from
:mod:`fencing.client._core`. What asyncio adds is real cancellation: the body of
``async with leases.hold(...)`` runs in a scope that is cancelled when the lease
is lost (renewal refused, or the local deadline passed), and the block then ends
with :class:`LeaseLost`, the way ``asyncio.timeout`` turns its own cancellation
into ``TimeoutError``; ``async with leases.hold_many(...)`` likewise when any of its
leases is lost. A cancellation from outside stays a cancellation. Leaving either
block releases what it may still hold, lost or not, bounded by ``release_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextvars import Token
from types import TracebackType
from typing import Any, Protocol

import grpc
import grpc.aio

from fencing import propagation
from fencing._renewal import RenewalPolicy
from fencing.client import _core, _lease_stream
from fencing.client._calls import AsyncCalls
from fencing.client._closing import AsyncClosing
from fencing.client._core import Clock, LeaseEvent
from fencing.client._lease_stream import Transport
from fencing.client._session import SessionCore
from fencing.client.async_lease_stream import AsyncStreamStub
from fencing.errors import FencingError
from fencing.tls import TLSConfig
from fencing.types import Fenced, LeaseState
from fencing.v1 import lease_pb2, lease_pb2_grpc

log = logging.getLogger(__name__)

#: An asyncio lease's schedule is only used from its loop: nothing to lock (one shared
#: no-op guard, not one made per lease).
_ONE_LOOP = contextlib.nullcontext()


class AsyncFencer(Protocol):
    """A guard to promise to on acquire (an ``AsyncGuardClient``)."""

    target: str

    async def fence(self, fenced: Fenced) -> int: ...


class AsyncLease(_core.LeaseBase[asyncio.Event]):
    """A granted lease, asyncio flavour: ``lost`` is an :class:`asyncio.Event`.

    :meth:`check` raises :class:`LeaseLost` once the lease is lost or its local
    deadline passed; :meth:`wait_lost` sleeps until then; :meth:`on_lost` callbacks
    run on the event loop (from the renewal task) and must not block.
    """

    def __init__(
        self,
        client: AsyncLeaseClient,
        msg: lease_pb2.Lease,
        sent_at: float,
        policy: RenewalPolicy,
        clock: Clock,
        *,
        received_at: float | None = None,
        ttl_ms: int | None = None,
    ) -> None:
        super().__init__(
            msg,
            sent_at,
            policy,
            clock,
            asyncio.Event(),
            _ONE_LOOP,
            received_at=received_at,
            ttl_ms=ttl_ms,
        )
        self._client = client

    async def wait_lost(self) -> None:
        """Return once the lease is lost (marked so, or its local deadline passed), or
        once it is released (it can no longer be lost)."""
        while not self.lost.is_set() and not self.released:
            # Not wait_for: on Python 3.11 it drops a cancellation that comes with the loss.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(self.remaining(), 0.001)):
                    await self.lost.wait()
            if self._deadline_passed():
                self._mark_lost("local deadline passed")

    async def renew(self, ttl: float | None = None) -> None:
        """Renew now (``ttl`` seconds, default the granted ttl); ``LeaseLost`` if refused."""
        await self._client._run(self._client._steps.renew(self, ttl))

    async def release(self) -> None:
        """Give the lease up now; ``LeaseLost`` if it was no longer ours.

        As :meth:`Lease.release <fencing.client.lease.Lease.release>`: a released
        lease is not lost, and releasing it does not cancel the ``hold`` body.
        """
        await self._client._run(self._client._steps.release(self))


class _AsyncSession:
    """The client's one keepalive, a task twin of the blocking client's session thread:
    every held lease renewed by RenewMany calls (rules in
    :class:`fencing.client._session.SessionCore`). Started with the first lease."""

    def __init__(self, client: AsyncLeaseClient) -> None:
        self.client = client
        self.core: SessionCore[AsyncLease] = SessionCore()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add(self, lease: AsyncLease) -> None:
        self.core.add(lease)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="fencing-session")

    def discard(self, lease: AsyncLease) -> None:
        self.core.discard(lease)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # wait(), not await: the session's CancelledError stays its own.
            await asyncio.wait({task})

    async def _run(self) -> None:
        clock = self.client._clock
        while True:
            delay = self.core.sleep_for(clock())
            if delay is None or delay > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                continue
            due, expired = self.core.take_due(clock())
            for lease in expired:
                lease._mark_lost("local deadline passed before a renewal succeeded")
            for chunk in self.core.chunks(due):
                await self._renew(chunk)

    async def _renew(self, chunk: list[AsyncLease]) -> None:
        await self.client._run(self.core.renew(chunk, self.client._steps, contextlib.nullcontext()))

    @property
    def _one_by_one(self) -> bool:
        return self.core.one_by_one


class _BodyScope:
    """Cancels the task running a ``hold``/``hold_many`` body when one of its leases is
    lost, and tells at exit whether a ``CancelledError`` was that cancellation (as
    ``asyncio.timeout`` tells its own)."""

    def __init__(self) -> None:
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._running = False
        self._cancelled = False

    def enter(self) -> None:
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - asyncio always runs coroutines in tasks
            raise RuntimeError("hold() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._running = True

    def cancel(self, lease: AsyncLease) -> None:
        # Runs where the loss was noticed. In the renewal task (the body is suspended at
        # an await): cancel the task running the body, and remember the cancellation is
        # ours. In the body's own task (check, renew, release, wait_lost), the body
        # already learns it from that call: a cancel there would only hit a later await.
        if (
            self._running
            and not self._cancelled
            and self._task is not None
            and asyncio.current_task() is not self._task
        ):
            self._cancelled = True
            self._task.cancel(f"lease on {lease.resource!r} token {lease.token} lost")

    def exit(self, exc_type: type[BaseException] | None) -> bool:
        """The body ended: True if it ended with our cancellation (turn it into LeaseLost)."""
        self._running = False
        if not self._cancelled or self._task is None:
            return False
        # As asyncio.timeout does: the CancelledError is ours only if no other
        # cancellation was requested of this task meanwhile.
        return self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError


class _AsyncHolding:
    """What ``async with`` a hold does around its body, for one lease or many: keep them
    renewed by the session, cancel the body when one is lost (:class:`_BodyScope`),
    release them on exit and end as :func:`fencing.client._core.hold_exit_error` says."""

    def __init__(
        self, client: AsyncLeaseClient, on_lost: Callable[[AsyncLease], object] | None
    ) -> None:
        self._client = client
        self._on_lost = on_lost
        self._held: list[AsyncLease] = []
        self._scope = _BodyScope()

    def _keep(self, held: list[AsyncLease]) -> None:
        self._held = held
        self._scope.enter()
        session = self._client.session()
        for lease in held:
            if self._on_lost is not None:
                lease.on_lost(self._on_lost)
            lease.on_lost(self._scope.cancel)
            session.add(lease)

    async def _leave(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        held = self._held
        ours = self._scope.exit(exc_type)
        session = self._client.session()
        for lease in held:
            session.discard(lease)
        await self._client._run(self._client._steps.release_on_exit(held))
        error = _core.hold_exit_error(
            held, body_raised=exc_type is not None, cancelled_by_loss=ours
        )
        if error is not None and ours:
            raise error from exc
        if error is not None:
            raise error


class AsyncHold(_AsyncHolding):
    """``async with leases.hold(...) as lease``: see :meth:`AsyncLeaseClient.hold`."""

    def __init__(
        self,
        client: AsyncLeaseClient,
        resource: str,
        ttl: float,
        timeout: float | None,
        on_lost: Callable[[AsyncLease], object] | None,
        fence: Sequence[AsyncFencer],
    ) -> None:
        super().__init__(client, on_lost)
        self._resource = resource
        self._ttl = ttl
        self._timeout = timeout
        self._fence = fence
        self.lease: AsyncLease | None = None
        self._current: Token[Fenced | None] | None = None

    async def _take(self) -> AsyncLease:
        """The lease the block holds (a subclass may take it otherwise: a semaphore's slot)."""
        return await self._client.acquire(
            self._resource, self._ttl, self._timeout, fence=self._fence
        )

    async def __aenter__(self) -> AsyncLease:
        lease = await self._take()
        self.lease = lease
        self._keep([lease])
        self._current = propagation.set_current(lease)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._current is not None:
            propagation.reset_current(self._current)
        await self._leave(exc_type, exc)


class AsyncHoldMany(_AsyncHolding):
    """``async with leases.hold_many(...) as held``: see :meth:`AsyncLeaseClient.hold_many`."""

    def __init__(
        self,
        client: AsyncLeaseClient,
        resources: Sequence[str],
        ttl: float,
        timeout: float | None,
        on_lost: Callable[[AsyncLease], object] | None,
    ) -> None:
        super().__init__(client, on_lost)
        self._resources = resources
        self._ttl = ttl
        self._timeout = timeout
        self.leases: list[AsyncLease] = []

    async def __aenter__(self) -> list[AsyncLease]:
        self.leases = await self._client.acquire_many(self._resources, self._ttl, self._timeout)
        self._keep(self.leases)
        return self.leases

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._leave(exc_type, exc)


class AsyncLeaseClient(AsyncCalls):
    """An asyncio client of ``fencing.v1.LeaseService`` (create it inside a running loop).

    ::

        leases = AsyncLeaseClient("127.0.0.1:50051")
        async with leases.hold("orders", ttl=10) as lease:   # renewed every ttl/3
            await guard.put(lease, "k", b"v")                # fenced by lease.token
        # LeaseLost here if the lease was lost: the body was cancelled at that moment

    Options as for :class:`~fencing.client.lease.LeaseClient` (``tls``, ``token``,
    ``credentials``, ``holder``, ``release_timeout``, ``transport``...).
    """

    def __init__(
        self,
        target: str,
        *,
        holder: str | None = None,
        tls: TLSConfig | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        rpc_timeout: float = _core.DEFAULT_RPC_TIMEOUT,
        release_timeout: float = _core.DEFAULT_RELEASE_TIMEOUT,
        policy: RenewalPolicy | None = None,
        clock: Clock = time.monotonic,
        channel: grpc.aio.Channel | None = None,
        transport: str | None = None,
    ) -> None:
        self.target = target
        self.holder = holder or _core.default_holder()
        self.rpc_timeout = rpc_timeout
        self.release_timeout = _core.release_timeout_of(release_timeout)
        self.policy = policy or RenewalPolicy()
        self._clock = clock
        self._channel = (
            channel
            if channel is not None
            else _core.open_aio_channel(target, tls=tls, token=token, credentials=credentials)
        )
        self.transport = _lease_stream.transport_of(transport)
        # The stub of the lease calls: the unary one, or one with its signatures over the
        # lease stream (typed loosely: the two differ only in the transport).
        self._stub: Any = (
            lease_pb2_grpc.LeaseServiceStub(self._channel)
            if self.transport is Transport.UNARY
            else AsyncStreamStub(self._channel, self.transport)
        )
        self._session: _AsyncSession | None = None
        self._steps = _core.LeaseSteps(self, self._new_lease)

    def _new_lease(
        self, msg: lease_pb2.Lease, sent_at: float, received_at: float, ttl_ms: int
    ) -> AsyncLease:
        return AsyncLease(
            self, msg, sent_at, self.policy, self._clock, received_at=received_at, ttl_ms=ttl_ms
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.aclose()
        if isinstance(self._stub, AsyncStreamStub):
            await self._stub.aclose()
        await self._channel.close()

    def session(self) -> _AsyncSession:
        """The client's session: the one keepalive of every lease held through ``hold``
        and ``hold_many`` (its task starts with the first lease)."""
        if self._session is None:
            self._session = _AsyncSession(self)
        return self._session

    # -- acquiring ---------------------------------------------------------------------------

    async def acquire(
        self,
        resource: str,
        ttl: float,
        timeout: float | None = None,  # noqa: ASYNC109 - the server waits it (twin's signature)
        *,
        fence: Sequence[AsyncFencer] = (),
    ) -> AsyncLease:
        """Acquire ``resource`` for ``ttl`` seconds, waiting up to ``timeout`` (None: forever).

        As :meth:`LeaseClient.acquire <fencing.client.lease.LeaseClient.acquire>`; the
        ``fence`` guards are promised to concurrently.
        """
        plan = _core.AcquirePlan(
            resource, self.holder, ttl, timeout, self._clock, rpc_timeout=self.rpc_timeout
        )
        (lease,) = await self._acquire(plan)
        await self._promise(lease, fence)
        return lease

    async def acquire_nowait(
        self, resource: str, ttl: float, *, fence: Sequence[AsyncFencer] = ()
    ) -> AsyncLease:
        """Acquire only if free now; :class:`LeaseHeldError` at once otherwise."""
        plan = _core.AcquirePlan(
            resource, self.holder, ttl, None, self._clock, nowait=True, rpc_timeout=self.rpc_timeout
        )
        (lease,) = await self._acquire(plan)
        await self._promise(lease, fence)
        return lease

    async def _acquire(
        self, plan: _core.AcquirePlan, resources: Sequence[str] | None = None
    ) -> list[AsyncLease]:
        # On the lease stream, a grant of the plan's request id is not released on its
        # behalf while the plan goes on (a retry may be handed the same lease).
        stub = self._stub
        with (
            stub.acquiring(plan.request_id)
            if isinstance(stub, AsyncStreamStub)
            else contextlib.nullcontext()
        ):
            return await self._run(self._steps.acquire(plan, resources))

    async def _promise(self, lease: AsyncLease, guards: Sequence[AsyncFencer]) -> None:
        if not guards:
            return
        outcomes = await asyncio.gather(*(g.fence(lease) for g in guards), return_exceptions=True)
        for guard, outcome in zip(guards, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                outcome.add_note(_core.promise_note(guard.target, lease))
                with contextlib.suppress(FencingError):
                    await lease.release()
                raise outcome

    def hold(
        self,
        resource: str,
        ttl: float,
        *,
        timeout: float | None = None,
        on_lost: Callable[[AsyncLease], object] | None = None,
        fence: Sequence[AsyncFencer] = (),
    ) -> AsyncHold:
        """Acquire (promising to the ``fence`` guards), keep renewed in a task, release on exit.

        ::

            async with leases.hold("orders", ttl=10, fence=[guard]) as lease:
                ...

        If the lease is lost while the body runs, ``lease.lost`` is set, ``on_lost``
        is called, and the task running the body is cancelled at its current
        ``await``; the block then ends with :class:`LeaseLost` (chained to that
        ``CancelledError``). A cancellation from outside the block propagates as
        ``CancelledError``. Loss noticed only at exit (e.g. release refused) also
        ends the block with ``LeaseLost`` unless it raised something else. Every exit
        sends a token-checked Release of the lease, lost or not (bounded by
        ``release_timeout``); a ``lease.release()`` inside the block is not a loss.
        Inside the block the lease is :func:`fencing.propagation.current`.
        """
        return AsyncHold(self, resource, ttl, timeout, on_lost, fence)

    async def acquire_many(
        self,
        resources: Sequence[str],
        ttl: float,
        timeout: float | None = None,  # noqa: ASYNC109 - the server waits it (twin's signature)
    ) -> list[AsyncLease]:
        """Acquire every resource, all or nothing, in one call: see
        :meth:`LeaseClient.acquire_many <fencing.client.lease.LeaseClient.acquire_many>`."""
        plan = _core.AcquirePlan(
            resources[0], self.holder, ttl, timeout, self._clock, rpc_timeout=self.rpc_timeout
        )
        return await self._acquire(plan, resources)

    def hold_many(
        self,
        resources: Sequence[str],
        ttl: float,
        *,
        timeout: float | None = None,
        on_lost: Callable[[AsyncLease], object] | None = None,
    ) -> AsyncHoldMany:
        """:meth:`acquire_many`, kept renewed by the session, released in one call on exit.

        Each lease is judged on its own (``lease.lost``, ``on_lost`` per lease). As in
        :meth:`hold`, the body is cancelled as soon as any of them is lost, and the
        block then ends with :class:`LeaseLost` for it (chained to that
        ``CancelledError``); loss noticed only at exit also ends it with ``LeaseLost``
        unless it raised. Every exit releases each lease not yet released, lost or not.
        """
        return AsyncHoldMany(self, resources, ttl, timeout, on_lost)

    async def release_many(self, leases: Sequence[AsyncLease]) -> list[AsyncLease]:
        """Release ``leases``, one call per 10,000; return those refused (marked lost)."""
        return await self._run(self._steps.release_many(leases))

    # -- the other calls ---------------------------------------------------------------------

    async def describe(self, resource: str) -> LeaseState:
        """Who holds ``resource`` now, with which token, and the last token ever issued."""
        msg = await self._call(self._stub.Describe, _core.describe_request(resource))
        return _core.lease_state(msg)

    async def list_page(
        self, prefix: str = "", *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[LeaseState], str]:
        """One page of :meth:`list_held` and the next page's token; see
        ``LeaseClient.list_page``."""
        request = _core.list_request(prefix, page_size, page_token)
        page = await self._call(self._stub.List, request)
        return [_core.lease_state(msg) for msg in page.leases], page.next_page_token

    async def list_held(
        self, prefix: str = "", *, page_size: int = 0
    ) -> AsyncGenerator[LeaseState, None]:
        """Yield the held leases under ``prefix``, a page at a time; see
        ``LeaseClient.list_held``."""
        page_token = ""
        while True:
            request = _core.list_request(prefix, page_size, page_token)
            page = await self._call(self._stub.List, request)
            for msg in page.leases:
                yield _core.lease_state(msg)
            page_token = page.next_page_token
            if not page_token:
                return

    async def renew(self, resource: str, token: int, ttl: float | None = None) -> int:
        """Renew by (resource, token) without a handle for ``ttl`` seconds (None: the
        lease's own ttl, that of its grant or last renewal); returns the ttl granted in ms."""
        request = _core.renew_request(resource, token, _core.renew_ttl_ms_of(ttl))
        return int((await self._call(self._stub.Renew, request)).ttl_ms)

    async def release(self, resource: str, token: int, *, holder: str = "") -> None:
        """Release by (resource, token) without a handle (``holder`` is checked if given)."""
        await self._call(self._stub.Release, _core.release_request(resource, token, holder))

    async def watch(
        self,
        resource: str = "",
        *,
        prefix: str = "",
        after_revision: int | None = None,
        log_id: str = "",
    ) -> AsyncGenerator[LeaseEvent, None]:
        """Yield the events of ``resource`` or ``prefix``; see ``LeaseClient.watch``."""
        async with await self.watch_stream(
            resource, prefix=prefix, after_revision=after_revision, log_id=log_id
        ) as stream:
            async for event in stream:
                yield event

    async def watch_stream(
        self,
        resource: str = "",
        *,
        prefix: str = "",
        after_revision: int | None = None,
        log_id: str = "",
    ) -> AsyncWatchStream:
        """Open :meth:`watch`'s stream and return once the server has it: see
        :meth:`LeaseClient.watch_stream <fencing.client.lease.LeaseClient.watch_stream>`."""
        request = _core.watch_request(resource, prefix, after_revision, log_id)
        return await AsyncWatchStream(self._stub.Watch(request))._start()


class AsyncWatchStream(AsyncClosing):
    """An open ``Watch`` stream, asyncio flavour (from :meth:`AsyncLeaseClient.watch_stream`):
    ``start_revision``, ``log_id``, then its events (``async for``)."""

    def __init__(
        self, rpc: grpc.aio.UnaryStreamCall[lease_pb2.WatchRequest, lease_pb2.LeaseEvent]
    ) -> None:
        self._rpc = rpc
        #: The revision the stream starts after (None: the server did not say).
        self.start_revision: int | None = None
        #: The identity of the log its revisions belong to ('' if it has none).
        self.log_id: str = ""

    async def _start(self) -> AsyncWatchStream:
        try:
            start = _core.watch_start(await self._rpc.initial_metadata())
        except BaseException as exc:
            self._rpc.cancel()
            if isinstance(exc, grpc.RpcError):
                raise _core.translate(exc) from exc
            raise
        self.start_revision = start.after_revision
        self.log_id = start.log_id
        return self

    async def __aiter__(self) -> AsyncIterator[LeaseEvent]:
        try:
            async for msg in self._rpc:
                event = _core.lease_event(msg)
                if event is not None:
                    yield event
        except grpc.RpcError as err:
            raise _core.translate(err) from err

    async def aclose(self) -> None:
        """Cancel the stream."""
        self._rpc.cancel()
