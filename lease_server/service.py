"""``fencing.v1.LeaseService`` over a :class:`~lease_server.backends.base.LeaseBackend`.

Validates every request at the edge (:mod:`fencing.limits`), queues waiters per
resource (:mod:`lease_server.waiters`), and logs each grant, renewal, release and
refusal with resource, holder and token (as structured fields too), and counts
them (:mod:`lease_server.metrics`). ``Watch`` streams the backend's event log
(:mod:`lease_server.watch`); the sweeper (:mod:`lease_server.expiry`) feeds it expiries.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc
import grpc.aio
from prometheus_client import CollectorRegistry

from fencing import _status, limits
from fencing.errors import (
    AcquireTimeoutError,
    BackendUnavailableError,
    FencingError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLost,
)
from fencing.types import WATCH_LOG_KEY, WATCH_START_KEY
from fencing.v1 import lease_pb2, lease_pb2_grpc
from lease_server.backends.base import LeaseBackend, event_log_of, resource_log_of
from lease_server.batches import batches_of
from lease_server.expiry import DEFAULT_EVENT_RETENTION, Sweeper
from lease_server.grouped import GroupedLeases
from lease_server.leases import (
    AcquireItem,
    EventPage,
    Grant,
    Held,
    LoggedEvent,
    ReleaseItem,
    RenewItem,
    Scope,
    StepOutcome,
    TransitionKind,
)
from lease_server.metrics import LeaseMetrics
from lease_server.queue.jobs import parse_default_resource
from lease_server.session import CallKind, Sessions, Step
from lease_server.waiters import WaitQueues
from lease_server.watch import EventFeed, ResourceFeed
from serving.admission import DEFAULT_MAX_SESSION_IN_FLIGHT
from serving.server import rpc

log = logging.getLogger(__name__)

_LEASE = "/fencing.v1.LeaseService/"

Context = grpc.aio.ServicerContext[Any, Any]
T = TypeVar("T")


def _lease(grant: Grant, waited_ms: int = 0) -> lease_pb2.Lease:
    return lease_pb2.Lease(
        resource=grant.resource,
        holder=grant.holder,
        token=grant.token,
        ttl_ms=grant.ttl_ms,
        waited_ms=waited_ms,
    )


class _Waited:
    """How long a request waited before the backend step that decided it.

    Read just before each backend attempt, so the last reading is no later than the
    decision the grant's ttl counts from; reported rounded down. The client adds it
    to its send time (the request arrived no earlier), so a grant after a long wait
    in line starts its local deadline at the grant, not at the send.
    """

    __slots__ = ("_arrived", "_loop", "before_decision")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._arrived = self._loop.time()
        self.before_decision = self._arrived

    def attempt(self) -> None:
        self.before_decision = self._loop.time()

    @property
    def arrived(self) -> float:
        """When the request arrived, on the loop's clock."""
        return self._arrived

    @property
    def ms(self) -> int:
        return max(0, int((self.before_decision - self._arrived) * 1000))


class _Acquire:
    """An Acquire: its first attempt is one step; one that may wait (``wait_ms``) makes
    more, in the service's line for the resource."""

    __slots__ = ("item", "service", "wait_ms", "waited")

    def __init__(self, service: LeaseService, item: AcquireItem, wait_ms: int) -> None:
        self.service = service
        self.item = item
        self.wait_ms = wait_ms
        self.waited = _Waited()

    def failed(self) -> None:
        self.service.metrics.acquires.labels("error").inc()

    def more(self, outcome: StepOutcome) -> Coroutine[Any, Any, lease_pb2.Lease] | None:
        """After a first attempt that found the resource held, an Acquire that may wait
        is not answered yet: the rest of it (waiting in line, its attempts, its answer).
        None for any other outcome: :meth:`finish` answers it."""
        if not isinstance(outcome, Held) or self.wait_ms <= 0:
            return None
        return self._wait(outcome)

    async def _wait(self, held: Held) -> lease_pb2.Lease:
        service, item = self.service, self.item
        try:
            outcome = await service._wait_in_line(
                lambda: service.backend.acquire(
                    item.resource, item.holder, item.ttl_ms, item.request_id
                ),
                held,
                self.wait_ms,
                self.waited.arrived + self.wait_ms / 1000,
                self.waited,
            )
        except FencingError:
            self.failed()
            raise
        return self.finish(outcome)

    def finish(self, outcome: StepOutcome) -> lease_pb2.Lease:
        assert isinstance(outcome, Grant | Held)
        outcome = self.service._unless_closing(outcome)
        metrics, item = self.service.metrics, self.item
        resource, holder = item.resource, item.holder
        if isinstance(outcome, Held):
            log.info(
                "acquire refused resource=%s holder=%s held_by=%s token=%d",
                resource,
                holder,
                outcome.holder,
                outcome.token,
                extra={
                    "resource": resource,
                    "holder": holder,
                    "held_by": outcome.holder,
                    "token": outcome.token,
                },
            )
            metrics.acquires.labels("timeout" if self.wait_ms > 0 else "held").inc()
            error = AcquireTimeoutError if self.wait_ms > 0 else LeaseHeldError
            raise error(resource=resource, holder=outcome.holder, remaining_ms=outcome.remaining_ms)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "acquired resource=%s holder=%s token=%d ttl_ms=%d%s",
                resource,
                holder,
                outcome.token,
                outcome.ttl_ms,
                " (replayed)" if outcome.replayed else "",
                extra={
                    "resource": resource,
                    "holder": holder,
                    "token": outcome.token,
                    "ttl_ms": outcome.ttl_ms,
                },
            )
        metrics.acquires.labels("replayed" if outcome.replayed else "granted").inc()
        metrics.granted(resource, outcome.token, outcome.ttl_ms)
        return _lease(outcome, self.waited.ms)


class _Renew:
    """A Renew: one step."""

    __slots__ = ("item", "service", "started")

    def __init__(self, service: LeaseService, item: RenewItem) -> None:
        self.service = service
        self.item = item
        self.started = time.perf_counter()

    def more(self, outcome: StepOutcome) -> None:
        """One step answers it."""

    def failed(self) -> None:
        self._timed()

    def _timed(self) -> None:
        # The histogram times every renewal: granted, refused or failed.
        self.service.metrics.renew_seconds.observe(time.perf_counter() - self.started)

    def finish(self, outcome: StepOutcome) -> lease_pb2.Lease:
        self._timed()
        if isinstance(outcome, LeaseLost):
            raise outcome
        assert isinstance(outcome, Grant)
        item = self.item
        self.service.metrics.granted(item.resource, item.token, outcome.ttl_ms)
        log.debug(
            "renewed resource=%s holder=%s token=%d",
            item.resource,
            outcome.holder,
            item.token,
            extra={"resource": item.resource, "holder": outcome.holder, "token": item.token},
        )
        return _lease(outcome)


class _Release:
    """A Release: one step; a released lease wakes the resource's line."""

    __slots__ = ("item", "service")

    def __init__(self, service: LeaseService, item: ReleaseItem) -> None:
        self.service = service
        self.item = item

    def more(self, outcome: StepOutcome) -> None:
        """One step answers it."""

    def failed(self) -> None:
        return None

    def finish(self, outcome: StepOutcome) -> lease_pb2.ReleaseResponse:
        if isinstance(outcome, LeaseLost):
            raise outcome
        item = self.item
        self.service.waiters.notify(item.resource)
        self.service.metrics.released(item.resource, item.token)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "released resource=%s holder=%s token=%d",
                item.resource,
                item.holder,
                item.token,
                extra={"resource": item.resource, "holder": item.holder, "token": item.token},
            )
        return lease_pb2.ReleaseResponse()


#: Events read from the backend per ``events_after`` call of one Watch stream.
WATCH_PAGE = 1000

_KINDS = {
    TransitionKind.ACQUIRED: lease_pb2.LeaseEvent.ACQUIRED,
    TransitionKind.RENEWED: lease_pb2.LeaseEvent.RENEWED,
    TransitionKind.RELEASED: lease_pb2.LeaseEvent.RELEASED,
    TransitionKind.EXPIRED: lease_pb2.LeaseEvent.EXPIRED,
}


def _event(event: LoggedEvent) -> lease_pb2.LeaseEvent:
    return lease_pb2.LeaseEvent(
        kind=_KINDS[event.kind],
        resource=event.resource,
        token=event.token,
        holder=event.holder,
        revision=event.revision,
        ttl_ms=event.ttl_ms,
        job_id=event.job_id,
        queue=event.queue,
    )


async def _no_identity() -> str:
    """Per-resource logs (a Redis Cluster) have no identity: their cursors go unchecked."""
    return ""


def watch_scope(request: lease_pb2.WatchRequest) -> Scope:
    """One resource, or a prefix (empty: every resource); not both."""
    if request.resource and request.prefix:
        raise InvalidArgumentError("set resource or prefix, not both", field="prefix")
    if request.resource:
        return Scope(resource=limits.check_resource(request.resource))
    return Scope(prefix=limits.check_prefix(request.prefix))


class LeaseService(lease_pb2_grpc.LeaseServiceServicer):
    """The lease server's RPC handlers, and the background work they rely on.

    :meth:`run` (started by :func:`lease_server.server.start_lease_server`) sweeps
    expiries and polls the event log for watchers; :meth:`close` ends the streams.
    """

    def __init__(
        self,
        backend: LeaseBackend,
        waiters: WaitQueues | None = None,
        metrics: LeaseMetrics | None = None,
        *,
        event_retention: int = DEFAULT_EVENT_RETENTION,
        session_max_in_flight: int = DEFAULT_MAX_SESSION_IN_FLIGHT,
    ) -> None:
        #: ``await job_claims(resource)``: the highest job claim token of a resource (the
        #: queue hosted beside the leases), reported by Describe in ``last_token``. Set,
        #: it also reserves the jobs' default resources (:meth:`_leasable`).
        self.job_claims: Callable[[str], Awaitable[int]] | None = None
        self.batches = batches_of(backend)
        self.waiters = waiters or WaitQueues()
        self.metrics = metrics or LeaseMetrics(CollectorRegistry())
        #: Lease calls (acquire attempts, renewals, releases: unary or streamed) go through
        #: group commit: what arrives while a step is in flight shares the next one.
        self.grouped = GroupedLeases(backend, on_step=self.metrics.stepped)
        self.backend: LeaseBackend = self.grouped
        backend.on_release(self.waiters.notify)
        self.events = event_log_of(backend)
        self.feed: EventFeed | None = None
        self.sweeper: Sweeper | None = None
        if self.events is not None:
            self.feed = EventFeed(self.events)
            self.sweeper = Sweeper(
                self.events, on_expired=self.waiters.notify, retention=event_retention
            )
        # Only one log per resource (a Redis Cluster): Watch of one resource at a time.
        self.resource_events = resource_log_of(backend) if self.events is None else None
        self.resource_feed: ResourceFeed | None = None
        if self.resource_events is not None:
            self.resource_feed = ResourceFeed(self.resource_events)
        #: The Session streams; each kind of call is answered by the unary method's function.
        self.sessions = Sessions(
            {
                "acquire": CallKind(
                    _LEASE + "Acquire",
                    self.acquire,
                    self._acquire_call,
                    # The first attempt is a step of its message; one that found the
                    # resource held and may wait goes on alone (``_Acquire.more``),
                    # holding its waiter slot from admission to answer.
                    may_go_on=lambda request: request.wait_ms > 0,
                ),
                "renew": CallKind(_LEASE + "Renew", self.renew, self._renew_call),
                "release": CallKind(_LEASE + "Release", self.release, self._release_call),
                "acquire_many": CallKind(_LEASE + "AcquireMany", self.acquire_many),
                "renew_many": CallKind(_LEASE + "RenewMany", self.renew_many),
                "release_many": CallKind(_LEASE + "ReleaseMany", self.release_many),
            },
            session_max_in_flight,
            self.metrics,
            steps=self.grouped.steps,
        )

    async def run(self) -> None:
        """Sweep expiries and follow the event log until cancelled."""
        if self.resource_events is not None:
            log.info(
                "the %s lease backend keeps one event log per resource: Watch serves one "
                "resource at a time, and guards in watch mode (a prefix) cannot follow "
                "this server",
                self.backend.name,
            )
            return
        if self.feed is None or self.sweeper is None:
            log.warning(
                "the %s lease backend keeps no event log: Watch is unavailable and guards "
                "in watch mode cannot follow this server",
                self.backend.name,
            )
            return
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.sweeper.run())
            tasks.create_task(self.feed.run())

    def close(self) -> None:
        """End every Watch stream (they finish with UNAVAILABLE: reconnect elsewhere), and
        drain every Session stream (a goaway; their calls in flight finish)."""
        self.sessions.drain()
        if self.feed is not None:
            self.feed.close()
        if self.resource_feed is not None:
            self.resource_feed.close()

    @rpc
    async def Acquire(self, request: lease_pb2.AcquireRequest, context: Context) -> lease_pb2.Lease:
        return await self.acquire(request)

    @rpc
    async def Renew(self, request: lease_pb2.RenewRequest, context: Context) -> lease_pb2.Lease:
        return await self.renew(request)

    @rpc
    async def Release(
        self, request: lease_pb2.ReleaseRequest, context: Context
    ) -> lease_pb2.ReleaseResponse:
        return await self.release(request)

    @rpc
    async def AcquireMany(
        self, request: lease_pb2.AcquireManyRequest, context: Context
    ) -> lease_pb2.AcquireManyResponse:
        return await self.acquire_many(request)

    @rpc
    async def RenewMany(
        self, request: lease_pb2.RenewManyRequest, context: Context
    ) -> lease_pb2.RenewManyResponse:
        return await self.renew_many(request)

    @rpc
    async def ReleaseMany(
        self, request: lease_pb2.ReleaseManyRequest, context: Context
    ) -> lease_pb2.ReleaseManyResponse:
        return await self.release_many(request)

    async def Session(
        self, request_iterator: AsyncIterator[lease_pb2.SessionRequest], context: Context
    ) -> AsyncIterator[lease_pb2.SessionResponse]:
        """The lease calls of one client over one stream (:mod:`lease_server.session`)."""
        async for response in self.sessions.serve(request_iterator, context):
            yield response

    # -- one function per call, shared by its unary handler and the Session stream --------
    # Each raises FencingError for its error; validation, logs and metrics live here once.

    async def acquire(self, request: lease_pb2.AcquireRequest) -> lease_pb2.Lease:
        call = self._acquire_call(request)
        item = call.item
        try:
            outcome = await self._acquire(
                lambda: self.backend.acquire(
                    item.resource, item.holder, item.ttl_ms, item.request_id
                ),
                call.wait_ms,
                call.waited,
            )
        except FencingError:
            call.failed()
            raise
        return call.finish(outcome)

    def _leasable(self, resource: str, field: str = "resource") -> str:
        """``resource``, unless it is a job's default resource (``job/<queue>/<id>``):
        that name's tokens come from its queue's claims alone, so a lease on it would
        repeat them (G1). Refused on every server, a server without the queue too: it
        may share its lease backend with one that hosts the queue."""
        if parse_default_resource(resource) is not None:
            raise InvalidArgumentError(
                f"{field}: {resource!r} is the resource of a job (job/<queue>/<id>), "
                "which only the job's claims hold; lease another name",
                field=field,
            )
        return resource

    def _acquire_call(self, request: lease_pb2.AcquireRequest) -> _Acquire:
        return _Acquire(
            self,
            AcquireItem(
                self._leasable(limits.check_resource(request.resource)),
                limits.check_holder(request.holder),
                limits.check_ttl_ms(request.ttl_ms),
                limits.check_request_id(request.request_id),
            ),
            limits.check_wait_ms(request.wait_ms),
        )

    async def _acquire(
        self, attempt: Callable[[], Awaitable[T | Held]], wait_ms: int, waited: _Waited
    ) -> T | Held:
        """Try once; while held and ``wait_ms`` lasts, wait in the held resource's line
        (woken by its release or expiry), then try again. For many resources the whole
        set is tried again: never holding some while waiting for others is what keeps
        two such callers from deadlocking. Still held once the server is shutting down
        raises ``BackendUnavailableError`` (retryable with the same request id)."""
        deadline = asyncio.get_running_loop().time() + wait_ms / 1000
        return await self._wait_in_line(attempt, await attempt(), wait_ms, deadline, waited)

    async def _wait_in_line(
        self,
        attempt: Callable[[], Awaitable[T | Held]],
        outcome: T | Held,
        wait_ms: int,
        deadline: float,
        waited: _Waited,
    ) -> T | Held:
        """After an attempt's ``outcome``: while held and the wait lasts (until
        ``deadline``, loop time), wait in line and try again (see :meth:`_acquire`)."""
        loop = asyncio.get_running_loop()
        while isinstance(outcome, Held) and wait_ms > 0:
            held = outcome.resource
            with self.metrics.waiters.track_inprogress(), self.waiters.join(held) as ticket:
                while isinstance(outcome, Held) and outcome.resource == held:
                    left = deadline - loop.time()
                    if left <= 0 or not await self.waiters.wait_turn(ticket, left):
                        return self._unless_closing(outcome)
                    waited.attempt()
                    self.waiters.asking(ticket)
                    outcome = await attempt()
                    if isinstance(outcome, Held) and outcome.resource == held:
                        left = deadline - loop.time()
                        if left <= 0:
                            return self._unless_closing(outcome)
                        # Re-ask just after the expiry, or earlier if nudged by a release.
                        await self.waiters.nap(
                            ticket, min(left, outcome.remaining_ms / 1000 + 0.001)
                        )
        return self._unless_closing(outcome)

    def _unless_closing(self, outcome: T | Held) -> T | Held:
        """``outcome``, but a refusal while shutting down is the server's, not the holder's."""
        if isinstance(outcome, Held) and self.waiters.closed:
            raise BackendUnavailableError(
                "the lease server is shutting down; retry (with the same request_id)"
            )
        return outcome

    async def _step(self, call: Step) -> StepOutcome:
        """The verdict of ``call``'s one step; a failed step counted, then raised."""
        try:
            (outcome,) = await self.grouped.steps([call.item])
        except FencingError:
            call.failed()
            raise
        return outcome

    async def renew(self, request: lease_pb2.RenewRequest) -> lease_pb2.Lease:
        call = self._renew_call(request)
        return call.finish(await self._step(call))

    def _renew_call(self, request: lease_pb2.RenewRequest) -> _Renew:
        return _Renew(
            self,
            RenewItem(
                limits.check_resource(request.resource),
                limits.check_token(request.token),
                limits.check_optional_holder(request.holder),
                limits.check_renew_ttl_ms(request.ttl_ms),
            ),
        )

    async def release(self, request: lease_pb2.ReleaseRequest) -> lease_pb2.ReleaseResponse:
        call = self._release_call(request)
        return call.finish(await self._step(call))

    def _release_call(self, request: lease_pb2.ReleaseRequest) -> _Release:
        return _Release(
            self,
            ReleaseItem(
                limits.check_resource(request.resource),
                limits.check_token(request.token),
                limits.check_optional_holder(request.holder),
            ),
        )

    @rpc
    async def Describe(
        self, request: lease_pb2.DescribeRequest, context: Context
    ) -> lease_pb2.LeaseState:
        resource = limits.check_resource(request.resource)
        info = await self.backend.describe(resource)
        last_token = info.last_token
        if self.job_claims is not None:
            # A job's resource: its claims' tokens were granted too (by the queue).
            last_token = max(last_token, await self.job_claims(resource))
        return lease_pb2.LeaseState(
            resource=info.resource,
            held=info.held,
            holder=info.holder,
            token=info.token,
            remaining_ms=info.remaining_ms,
            last_token=last_token,
            ttl_ms=info.ttl_ms,
        )

    @rpc
    async def List(
        self, request: lease_pb2.ListRequest, context: Context
    ) -> lease_pb2.ListResponse:
        """A page of the held leases under a prefix, in resource order.

        Asks the backend for one more than the page, so a full page says whether another
        follows; the cursor is the page's last resource (each page starts after it).
        """
        prefix = limits.check_prefix(request.prefix)
        size = limits.check_page_size(request.page_size)
        after = limits.check_page_token(request.page_token)
        infos = await self.backend.list_held(prefix, after, size + 1)
        page, more = infos[:size], len(infos) > size
        return lease_pb2.ListResponse(
            leases=[
                lease_pb2.LeaseState(
                    resource=i.resource,
                    held=i.held,
                    holder=i.holder,
                    token=i.token,
                    remaining_ms=i.remaining_ms,
                    last_token=i.last_token,
                    ttl_ms=i.ttl_ms,
                )
                for i in page
            ],
            next_page_token=page[-1].resource if more else "",
        )

    # -- many leases per call: AcquireMany, and sessions (RenewMany, ReleaseMany) -------------

    async def acquire_many(
        self, request: lease_pb2.AcquireManyRequest
    ) -> lease_pb2.AcquireManyResponse:
        resources = limits.check_many(
            [
                self._leasable(limits.check_resource(r, f"resources[{i}]"), f"resources[{i}]")
                for i, r in enumerate(request.resources)
            ],
            "resources",
            limits.MAX_ACQUIRE_MANY,
        )
        holder = limits.check_holder(request.holder)
        ttl_ms = limits.check_ttl_ms(request.ttl_ms)
        wait_ms = limits.check_wait_ms(request.wait_ms)
        request_id = limits.check_request_id(request.request_id)
        waited = _Waited()
        try:
            outcome = await self._acquire(
                lambda: self.batches.acquire_many(sorted(resources), holder, ttl_ms, request_id),
                wait_ms,
                waited,
            )
        except FencingError:
            self.metrics.acquires.labels("error").inc(len(resources))
            raise
        fields = {"holder": holder, "count": len(resources)}
        if isinstance(outcome, Held):
            log.info(
                "acquire of %d resources refused holder=%s: %s held by %s token=%d",
                len(resources),
                holder,
                outcome.resource,
                outcome.holder,
                outcome.token,
                extra={**fields, "resource": outcome.resource, "held_by": outcome.holder},
            )
            self.metrics.acquires.labels("timeout" if wait_ms > 0 else "held").inc()
            error = AcquireTimeoutError if wait_ms > 0 else LeaseHeldError
            raise error(
                resource=outcome.resource,
                holder=outcome.holder,
                remaining_ms=outcome.remaining_ms,
            )
        for grant in outcome:
            self.metrics.acquires.labels("replayed" if grant.replayed else "granted").inc()
            self.metrics.granted(grant.resource, grant.token, grant.ttl_ms)
        log.info(
            "acquired %d resources holder=%s (%s ... %s)",
            len(outcome),
            holder,
            outcome[0].resource,
            outcome[-1].resource,
            extra=fields,
        )
        by_resource = {grant.resource: grant for grant in outcome}
        return lease_pb2.AcquireManyResponse(
            leases=[_lease(by_resource[r], waited.ms) for r in resources]
        )

    async def renew_many(self, request: lease_pb2.RenewManyRequest) -> lease_pb2.RenewManyResponse:
        items = [
            RenewItem(
                limits.check_resource(r.resource, f"renewals[{i}].resource"),
                limits.check_token(r.token, f"renewals[{i}].token"),
                limits.check_optional_holder(r.holder, f"renewals[{i}].holder"),
                limits.check_renew_ttl_ms(r.ttl_ms, f"renewals[{i}].ttl_ms"),
            )
            for i, r in enumerate(request.renewals)
        ]
        limits.check_many([i.resource for i in items], "renewals", limits.MAX_RENEW_MANY)
        with self.metrics.renew_seconds.time():
            outcomes = await self.batches.renew_many(items)
        results = []
        lost = 0
        for item, outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, Grant):
                self.metrics.granted(item.resource, item.token, outcome.ttl_ms)
                results.append(lease_pb2.RenewResult(lease=_lease(outcome)))
            else:
                lost += 1
                results.append(lease_pb2.RenewResult(lost=True))
        log.debug(
            "renewed %d leases, %d lost",
            len(items) - lost,
            lost,
            extra={"count": len(items), "lost": lost},
        )
        return lease_pb2.RenewManyResponse(results=results)

    async def release_many(
        self, request: lease_pb2.ReleaseManyRequest
    ) -> lease_pb2.ReleaseManyResponse:
        items = [
            ReleaseItem(
                limits.check_resource(r.resource, f"releases[{i}].resource"),
                limits.check_token(r.token, f"releases[{i}].token"),
                limits.check_optional_holder(r.holder, f"releases[{i}].holder"),
            )
            for i, r in enumerate(request.releases)
        ]
        limits.check_many([i.resource for i in items], "releases", limits.MAX_RENEW_MANY)
        outcomes = await self.batches.release_many(items)
        released = []
        for item, outcome in zip(items, outcomes, strict=True):
            released.append(outcome is None)
            if outcome is None:
                self.waiters.notify(item.resource)
                self.metrics.released(item.resource, item.token)
        log.info(
            "released %d of %d leases",
            sum(released),
            len(items),
            extra={"count": len(items), "released": sum(released)},
        )
        return lease_pb2.ReleaseManyResponse(released=released)

    async def Watch(
        self, request: lease_pb2.WatchRequest, context: Context
    ) -> AsyncIterator[lease_pb2.LeaseEvent]:
        """Stream the events of a resource or prefix, from ``after_revision`` or from now.

        A cursor the log cannot serve (pruned, ahead of this log, or of another log:
        ``log_id`` names a log that is not this one) gets one RESYNC carrying the
        revision the stream continues after and this log's id: re-read state
        (Describe) and go on. The stream ends only when the client leaves or the
        server stops.
        """
        try:
            scope = watch_scope(request)
        except FencingError as exc:
            await _status.abort(context, exc)
        events, feed = self.events, self.feed
        identity: Callable[[], Awaitable[str]] = _no_identity
        per_resource, resource_feed = self.resource_events, self.resource_feed
        # Per mode: how to read a page after a cursor, what to note before reading, and
        # how to wait, after it, for news beyond the cursor (False: the server stops).
        read: Callable[[int], Awaitable[EventPage]]
        note: Callable[[], int]
        wait: Callable[[int, int], Awaitable[bool]]
        if events is not None and feed is not None:
            watching = feed.watching()
            start = events.head_revision
            identity = events.log_id
            read = functools.partial(events.events_after, scope=scope, limit=WATCH_PAGE)

            def note() -> int:
                return 0

            async def wait(cursor: int, noted: int) -> bool:
                return await feed.wait_beyond(cursor)

        elif per_resource is not None and resource_feed is not None:
            if not scope.resource:
                await context.abort(
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"the {self.backend.name} lease backend keeps one event log per resource "
                    "here (a Redis Cluster cannot append one log atomically with keys in "
                    "every hash slot), so events have no order across resources: watch one "
                    "resource, not a prefix",
                )
            resource = scope.resource
            watching = resource_feed.watching(resource)
            start = functools.partial(per_resource.resource_head, resource)
            read = functools.partial(per_resource.resource_events_after, resource, limit=WATCH_PAGE)
            note = functools.partial(resource_feed.version, resource)

            async def wait(cursor: int, noted: int) -> bool:
                return await resource_feed.wait_changed(resource, noted)

        else:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"the {self.backend.name} lease backend keeps no event log: Watch needs one",
            )
        try:
            log_id = await identity()
            # Absent: from now. Present, even 0: after it (0 replays from revision 1).
            resume = request.HasField("after_revision")
            cursor = request.after_revision if resume else await start()
            # A revision of another log names other events here: never resume from it.
            foreign = bool(resume and request.log_id and log_id)
            foreign = foreign and request.log_id != log_id
            if foreign:
                cursor = await start()
        except FencingError as exc:
            await _status.abort(context, exc)
        # Headers now, so a client knows the stream is open before the first event, and
        # where it starts: a client that asked "from now" learns the revision to resume
        # after, and the log that revision belongs to.
        headers = [(WATCH_START_KEY, str(cursor))]
        if log_id:
            headers.append((WATCH_LOG_KEY, log_id))
        await context.send_initial_metadata(tuple(headers))
        log.debug("watch started %s", scope, extra={"after_revision": cursor, "log_id": log_id})
        if foreign:
            log.info(
                "watch %s asked to resume after %d of log %s, but this log is %s: resync",
                scope,
                request.after_revision,
                request.log_id,
                log_id,
            )
            yield lease_pb2.LeaseEvent(
                kind=lease_pb2.LeaseEvent.RESYNC,
                resource=scope.resource,
                revision=cursor,
                log_id=log_id,
            )
        with watching:
            while True:
                noted = note()
                try:
                    page = await read(cursor)
                except FencingError as exc:
                    await _status.abort(context, exc)
                if page.gap(cursor):
                    log.info(
                        "watch %s cannot resume after %d (log keeps %d..%d): resync",
                        scope,
                        cursor,
                        page.compacted_through + 1,
                        page.head,
                    )
                    cursor = page.head
                    try:
                        # A log that went back may be a new one (a Redis that forgot).
                        log_id = await identity()
                    except FencingError as exc:
                        await _status.abort(context, exc)
                    yield lease_pb2.LeaseEvent(
                        kind=lease_pb2.LeaseEvent.RESYNC,
                        resource=scope.resource,
                        revision=cursor,
                        log_id=log_id,
                    )
                    continue
                for event in page.events:
                    yield _event(event)
                if len(page.events) >= WATCH_PAGE:
                    cursor = page.events[-1].revision
                    continue
                cursor = max(cursor, page.head)
                if not await wait(cursor, noted):
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "lease server is stopping")
