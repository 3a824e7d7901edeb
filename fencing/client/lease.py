"""``LeaseClient``: acquire, renew and release leases; ``hold`` keeps one alive (blocking).

Liveness is kept apart from proof: the :class:`Lease` handle knows whether it still
*believes* it holds the lease (``lost``, ``check()``), but only a guard judges the
token. Renewal runs in a background thread every ttl/3, measured from each send on
the monotonic clock, and marks the lease lost when a renewal is refused or the local
deadline (start + ttl - margin) passes, whichever comes first. A lease starts at its
grant: the Acquire's send time plus the wait the server reports, so time spent in
line for a held resource does not count against it (see :mod:`fencing._renewal`).
Leaving ``hold``/``hold_many`` always sends a token-checked Release of what may still
be held, lost or not, bounded by ``release_timeout``.

The rules live in :mod:`fencing.client._core` (every exchange as steps of
:class:`~fencing.client._core.LeaseSteps`), shared with the asyncio twin
(:mod:`fencing.client.async_lease`); this module only runs them with blocking I/O
(:class:`~fencing.client._calls.BlockingCalls`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, Protocol

import grpc

from fencing import propagation
from fencing._renewal import RenewalPolicy
from fencing.client import _core, _lease_stream
from fencing.client._calls import BlockingCalls
from fencing.client._closing import Closing
from fencing.client._core import Clock, LeaseEvent
from fencing.client._lease_stream import Transport
from fencing.client._session import SessionCore
from fencing.client.lease_stream import StreamStub
from fencing.errors import FencingError
from fencing.tls import TLSConfig
from fencing.types import Fenced, LeaseState
from fencing.v1 import lease_pb2, lease_pb2_grpc

log = logging.getLogger(__name__)


class Fencer(Protocol):
    """A guard to promise to on acquire (a :class:`~fencing.client.guard.GuardClient`)."""

    target: str

    def fence(self, fenced: Fenced) -> int: ...


class Lease(_core.LeaseBase[threading.Event]):
    """A granted lease: ``resource``, ``holder``, ``token`` (the proof) and local liveness.

    ``lost`` is a :class:`threading.Event` set once the lease can no longer be
    trusted; :meth:`check` raises :class:`LeaseLost` from then on (and also as soon as
    the local deadline passes, even before the renewal thread notices);
    :meth:`on_lost` callbacks run in the renewal thread.
    """

    def __init__(
        self,
        client: LeaseClient,
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
            threading.Event(),
            threading.Lock(),
            received_at=received_at,
            ttl_ms=ttl_ms,
        )
        self._client = client

    def renew(self, ttl: float | None = None) -> None:
        """Renew now (``ttl`` seconds, default the granted ttl); ``LeaseLost`` if refused."""
        self._client._run(self._client._steps.renew(self, ttl))

    def release(self) -> None:
        """Give the lease up now; ``LeaseLost`` if it was no longer ours.

        A released lease is not lost: ``lost`` stays clear, and a ``hold`` block left
        after it ends normally; ``check()`` raises from now on (it is not ours to act
        on). If the call fails otherwise (the server unreachable), the lease is not
        marked released, and leaving ``hold`` tries again.
        """
        self._client._run(self._client._steps.release(self))


class _Session(threading.Thread):
    """The client's one keepalive: every held lease renewed by RenewMany calls.

    The rules (which leases, when, what a verdict or a failure does) are
    :class:`fencing.client._session.SessionCore`'s; this thread only sleeps and calls.
    Against a server without RenewMany it renews each due lease with Renew.
    """

    def __init__(self, client: LeaseClient) -> None:
        super().__init__(name="fencing-session", daemon=True)
        self.client = client
        self.core: SessionCore[Lease] = SessionCore()
        self._cond = threading.Condition()
        self._stopping = False

    def add(self, lease: Lease) -> None:
        with self._cond:
            self.core.add(lease)
            self._cond.notify()

    def discard(self, lease: Lease) -> None:
        with self._cond:
            self.core.discard(lease)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self.is_alive():
            self.join()

    def run(self) -> None:
        clock = self.client._clock
        while True:
            with self._cond:
                while not self._stopping:
                    delay = self.core.sleep_for(clock())
                    if delay is not None and delay <= 0:
                        break
                    self._cond.wait(delay)
                if self._stopping:
                    return
                due, expired = self.core.take_due(clock())
            for lease in expired:
                lease._mark_lost("local deadline passed before a renewal succeeded")
            for chunk in self.core.chunks(due):
                self._renew(chunk)

    def _renew(self, chunk: list[Lease]) -> None:
        self.client._run(self.core.renew(chunk, self.client._steps, self._cond))

    @property
    def _one_by_one(self) -> bool:
        return self.core.one_by_one


class LeaseClient(BlockingCalls):
    """A blocking client of ``fencing.v1.LeaseService``.

    ::

        leases = LeaseClient("127.0.0.1:50051")
        with leases.hold("orders", ttl=10) as lease:   # renewed every ttl/3
            guard.put(lease, "k", b"v")                # fenced by lease.token
            lease.check()                              # LeaseLost once it is gone

    ``holder`` names this client in leases (default: host-pid-random); a server with
    authentication on names the holder after the caller's principal instead. Times
    are seconds. Acquire retries on transient failures with one ``request_id``, so a
    retry never takes a second token.

    ``tls=TLSConfig(ca=..., cert=..., key=...)`` secures the channel (mTLS with a
    cert), ``token=...`` authenticates every call with a bearer token, or pass any
    ``credentials``. ``release_timeout`` bounds the release sent on leaving ``hold``
    and ``hold_many`` (default 2 s, retries included), so an unreachable server
    does not hang the exit: the lease then expires on its own.

    ``transport`` says how the lease calls (acquire, renew, release, their batch forms,
    the session's renewals) travel: ``"auto"`` (the default) on one lease stream per
    client (``LeaseService.Session``: concurrent calls share its messages), falling
    back to unary RPCs for the client's life against a server without it;
    ``"stream"`` on the stream only; ``"unary"`` one RPC per call. None takes
    ``$FENCING_TRANSPORT``, else ``"auto"``. The lease rules are the same on each.
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
        channel: grpc.Channel | None = None,
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
            else _core.open_channel(target, tls=tls, token=token, credentials=credentials)
        )
        self.transport = _lease_stream.transport_of(transport)
        # The stub of the lease calls: the unary one, or one with its signatures over the
        # lease stream (typed loosely: the two differ only in the transport).
        self._stub: Any = (
            lease_pb2_grpc.LeaseServiceStub(self._channel)
            if self.transport is Transport.UNARY
            else StreamStub(self._channel, self.transport)
        )
        self._session: _Session | None = None
        self._session_lock = threading.Lock()
        self._steps = _core.LeaseSteps(self, self._new_lease)

    def _new_lease(
        self, msg: lease_pb2.Lease, sent_at: float, received_at: float, ttl_ms: int
    ) -> Lease:
        return Lease(
            self, msg, sent_at, self.policy, self._clock, received_at=received_at, ttl_ms=ttl_ms
        )

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.stop()
        if isinstance(self._stub, StreamStub):
            self._stub.close()
        self._channel.close()

    def session(self) -> _Session:
        """The client's session (started on first use): the one keepalive of every lease
        held through ``hold`` and ``hold_many``."""
        with self._session_lock:
            if self._session is None:
                self._session = _Session(self)
                self._session.start()
            return self._session

    # -- acquiring ---------------------------------------------------------------------------

    def acquire(
        self,
        resource: str,
        ttl: float,
        timeout: float | None = None,
        *,
        fence: Sequence[Fencer] = (),
    ) -> Lease:
        """Acquire ``resource`` for ``ttl`` seconds, waiting up to ``timeout`` (None: forever).

        Raises :class:`AcquireTimeoutError` (a ``TimeoutError`` and a ``LeaseHeldError``)
        when the timeout runs out. The returned lease is *not* renewed: use :meth:`hold`
        or call ``lease.renew()``.

        ``fence``: guards to *promise* the new token to before returning (each gets
        ``Fence(resource, token)``), so from the moment this returns they reject every
        older token, even before this holder writes. If a guard cannot be fenced, the
        lease is released and that guard's error is raised (with a note naming it).
        """
        plan = _core.AcquirePlan(
            resource, self.holder, ttl, timeout, self._clock, rpc_timeout=self.rpc_timeout
        )
        (lease,) = self._acquire(plan)
        self._promise(lease, fence)
        return lease

    def acquire_nowait(self, resource: str, ttl: float, *, fence: Sequence[Fencer] = ()) -> Lease:
        """Acquire only if free now; :class:`LeaseHeldError` at once otherwise."""
        plan = _core.AcquirePlan(
            resource, self.holder, ttl, None, self._clock, nowait=True, rpc_timeout=self.rpc_timeout
        )
        (lease,) = self._acquire(plan)
        self._promise(lease, fence)
        return lease

    def _acquire(
        self, plan: _core.AcquirePlan, resources: Sequence[str] | None = None
    ) -> list[Lease]:
        # On the lease stream, a grant of the plan's request id is not released on its
        # behalf while the plan goes on (a retry may be handed the same lease).
        stub = self._stub
        with (
            stub.acquiring(plan.request_id)
            if isinstance(stub, StreamStub)
            else contextlib.nullcontext()
        ):
            return self._run(self._steps.acquire(plan, resources))

    def _promise(self, lease: Lease, guards: Sequence[Fencer]) -> None:
        for guard in guards:
            try:
                guard.fence(lease)
            except Exception as exc:
                exc.add_note(_core.promise_note(guard.target, lease))
                with contextlib.suppress(FencingError):
                    lease.release()
                raise

    @contextlib.contextmanager
    def hold(
        self,
        resource: str,
        ttl: float,
        *,
        timeout: float | None = None,
        on_lost: Callable[[Lease], object] | None = None,
        fence: Sequence[Fencer] = (),
    ) -> Iterator[Lease]:
        """Acquire (promising to the ``fence`` guards), keep renewed by the client's
        session (one background thread renewing every held lease together: see
        :meth:`session`), and release on exit.

        The lease lives its ttl from the grant, however long the acquire waited in
        line. If it is lost while the block runs, ``lease.lost`` is set, ``on_lost``
        is called, ``lease.check()`` raises, and the block ends with :class:`LeaseLost`
        (unless it raised something else). Python cannot interrupt the block from
        outside: call ``lease.check()`` between steps, and let the guard reject what a
        paused holder sends late. Every exit sends a token-checked Release, lost or
        not, bounded by ``release_timeout``; a ``lease.release()`` inside the block is
        not a loss. Inside the block the lease is :func:`fencing.propagation.current`,
        so an interceptor can carry its token.
        """
        lease = self.acquire(resource, ttl, timeout, fence=fence)
        with self._holding([lease], on_lost), propagation.bound(lease):
            yield lease

    @contextlib.contextmanager
    def _holding(
        self, held: list[Lease], on_lost: Callable[[Lease], object] | None
    ) -> Iterator[list[Lease]]:
        """Keep ``held`` renewed by the session while the block runs; on exit release
        them and end as :func:`fencing.client._core.hold_exit_error` says."""
        session = self.session()
        for lease in held:
            if on_lost is not None:
                lease.on_lost(on_lost)
            session.add(lease)
        body_raised = False
        try:
            yield held
        except BaseException:
            body_raised = True
            raise
        finally:
            for lease in held:
                session.discard(lease)
            self._run(self._steps.release_on_exit(held))
            error = _core.hold_exit_error(held, body_raised=body_raised)
            if error is not None:
                raise error

    def acquire_many(
        self, resources: Sequence[str], ttl: float, timeout: float | None = None
    ) -> list[Lease]:
        """Acquire every resource, all or nothing, in one call (at most 1,000).

        The server takes them in sorted order in one backend transaction, so two
        clients asking for overlapping sets in any order never deadlock; while any is
        held it waits (up to ``timeout``, None: forever) and tries the whole set again.
        :class:`AcquireTimeoutError` names a held resource. The leases are in the
        order of ``resources``, not renewed (use :meth:`hold_many`).
        """
        plan = _core.AcquirePlan(
            resources[0], self.holder, ttl, timeout, self._clock, rpc_timeout=self.rpc_timeout
        )
        return self._acquire(plan, resources)

    @contextlib.contextmanager
    def hold_many(
        self,
        resources: Sequence[str],
        ttl: float,
        *,
        timeout: float | None = None,
        on_lost: Callable[[Lease], object] | None = None,
    ) -> Iterator[list[Lease]]:
        """:meth:`acquire_many`, kept renewed by the session, released in one call on exit.

        Each lease is judged on its own (``lease.lost``, ``on_lost`` per lease); if any
        was lost the block ends with :class:`LeaseLost` for it (unless it raised
        something else). Leaving the block releases every lease not yet released, lost
        or not, as :meth:`hold` does; a lease released in the block is not a loss.
        """
        held = self.acquire_many(resources, ttl, timeout)
        with self._holding(held, on_lost):
            yield held

    def release_many(self, leases: Sequence[Lease]) -> list[Lease]:
        """Release ``leases``, one call per 10,000; return those refused (no longer ours:
        marked lost). The others are released, not lost."""
        return self._run(self._steps.release_many(leases))

    # -- the other calls ---------------------------------------------------------------------

    def describe(self, resource: str) -> LeaseState:
        """Who holds ``resource`` now, with which token, and the last token ever issued."""
        return _core.lease_state(self._call(self._stub.Describe, _core.describe_request(resource)))

    def list_page(
        self, prefix: str = "", *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[LeaseState], str]:
        """One page of :meth:`list_held`: the leases and the ``page_token`` of the next page
        ('' after the last), for a caller that pages on demand (a web page's "next")."""
        page = self._call(self._stub.List, _core.list_request(prefix, page_size, page_token))
        return [_core.lease_state(msg) for msg in page.leases], page.next_page_token

    def list_held(self, prefix: str = "", *, page_size: int = 0) -> Iterator[LeaseState]:
        """Yield the held leases whose resource starts with ``prefix``, in resource order.

        Asks for one page at a time (``page_size`` leases, at most 1,000; 0: the
        server's default, 100) as the iteration goes on. Each page is read on its own:
        a lease taken or released meanwhile may or may not appear, none twice.
        """
        page_token = ""
        while True:
            request = _core.list_request(prefix, page_size, page_token)
            page = self._call(self._stub.List, request)
            for msg in page.leases:
                yield _core.lease_state(msg)
            page_token = page.next_page_token
            if not page_token:
                return

    def renew(self, resource: str, token: int, ttl: float | None = None) -> int:
        """Renew by (resource, token) without a handle for ``ttl`` seconds (None: the
        lease's own ttl, that of its grant or last renewal); returns the ttl granted in ms."""
        request = _core.renew_request(resource, token, _core.renew_ttl_ms_of(ttl))
        return int(self._call(self._stub.Renew, request).ttl_ms)

    def release(self, resource: str, token: int, *, holder: str = "") -> None:
        """Release by (resource, token) without a handle (``holder`` is checked if given)."""
        self._call(self._stub.Release, _core.release_request(resource, token, holder))

    def watch(
        self,
        resource: str = "",
        *,
        prefix: str = "",
        after_revision: int | None = None,
        log_id: str = "",
    ) -> Generator[LeaseEvent, None, None]:
        """Yield the events of ``resource``, or of every resource starting with ``prefix``.

        From now (``after_revision=None``) or after a revision of an earlier event (0:
        the whole log the server still keeps, from revision 1); with
        ``log_id`` (the log that revision belongs to: :attr:`WatchStream.log_id`, or a
        RESYNC's), a server that keeps another log answers RESYNC rather than serve
        the same number from the wrong log. A ``RESYNC`` event means events were
        missed (pruned): re-read with :meth:`describe`. The stream ends only with an
        error (e.g. ``BackendUnavailableError`` when the server stops): resume it with
        the last revision seen. Closing the generator cancels the stream.
        """
        with self.watch_stream(
            resource, prefix=prefix, after_revision=after_revision, log_id=log_id
        ) as stream:
            yield from stream

    def watch_stream(
        self,
        resource: str = "",
        *,
        prefix: str = "",
        after_revision: int | None = None,
        log_id: str = "",
    ) -> WatchStream:
        """Open :meth:`watch`'s stream and return once the server has it (no event after
        this is missed), with where it starts: ``start_revision`` (for "from now", the
        revision to resume after if no event comes) and ``log_id``. Iterate it for the
        events; ``close()`` (or leaving ``with``) cancels it."""
        request = _core.watch_request(resource, prefix, after_revision, log_id)
        return WatchStream(self._stub.Watch(request))


class WatchStream(Closing):
    """An open ``Watch`` stream (from :meth:`LeaseClient.watch_stream`): where it starts,
    which log it reads, then its events (iterate it)."""

    def __init__(self, rpc: grpc.Call) -> None:
        self._rpc = rpc
        try:
            start = _core.watch_start(rpc.initial_metadata())
        except grpc.RpcError as err:
            rpc.cancel()
            raise _core.translate(err) from err
        #: The revision the stream starts after (None: the server did not say).
        self.start_revision: int | None = start.after_revision
        #: The identity of the log its revisions belong to ('' if it has none).
        self.log_id: str = start.log_id

    def __iter__(self) -> Iterator[LeaseEvent]:
        try:
            for msg in self._rpc:  # type: ignore[attr-defined]
                event = _core.lease_event(msg)
                if event is not None:
                    yield event
        except grpc.RpcError as err:
            raise _core.translate(err) from err

    def close(self) -> None:
        """Cancel the stream."""
        self._rpc.cancel()
