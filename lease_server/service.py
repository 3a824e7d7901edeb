"""``fencing.v1.LeaseService`` over a :class:`~lease_server.backends.base.LeaseBackend`.

Validates every request at the edge (:mod:`fencing.limits`), queues waiters per
resource (:mod:`lease_server.waiters`), and logs each grant, renewal, release and
refusal with resource, holder and token (as structured fields too), and counts
them (:mod:`lease_server.metrics`). ``Watch`` streams the backend's event log
(:mod:`lease_server.watch`); the sweeper (:mod:`lease_server.expiry`) feeds it expiries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
from prometheus_client import CollectorRegistry

from fencing import _status, limits
from fencing._server import rpc
from fencing.errors import (
    AcquireTimeoutError,
    BackendUnavailableError,
    FencingError,
    InvalidArgumentError,
    LeaseHeldError,
)
from fencing.types import WATCH_START_KEY
from fencing.v1 import lease_pb2, lease_pb2_grpc
from lease_server.backends.base import LeaseBackend, event_log_of
from lease_server.expiry import DEFAULT_EVENT_RETENTION, Sweeper
from lease_server.leases import EventKind, Grant, Held, LeaseEvent, Scope
from lease_server.metrics import LeaseMetrics
from lease_server.waiters import WaitQueues
from lease_server.watch import EventFeed

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


def _lease(grant: Grant) -> lease_pb2.Lease:
    return lease_pb2.Lease(
        resource=grant.resource, holder=grant.holder, token=grant.token, ttl_ms=grant.ttl_ms
    )


#: Events read from the backend per ``events_after`` call of one Watch stream.
WATCH_PAGE = 1000

_KINDS = {
    EventKind.ACQUIRED: lease_pb2.LeaseEvent.ACQUIRED,
    EventKind.RENEWED: lease_pb2.LeaseEvent.RENEWED,
    EventKind.RELEASED: lease_pb2.LeaseEvent.RELEASED,
    EventKind.EXPIRED: lease_pb2.LeaseEvent.EXPIRED,
}


def _event(event: LeaseEvent) -> lease_pb2.LeaseEvent:
    return lease_pb2.LeaseEvent(
        kind=_KINDS[event.kind],
        resource=event.resource,
        token=event.token,
        holder=event.holder,
        revision=event.revision,
        ttl_ms=event.ttl_ms,
    )


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
    ) -> None:
        self.backend = backend
        self.waiters = waiters or WaitQueues()
        self.metrics = metrics or LeaseMetrics(CollectorRegistry())
        backend.on_release(self.waiters.notify)
        self.events = event_log_of(backend)
        self.feed: EventFeed | None = None
        self.sweeper: Sweeper | None = None
        if self.events is not None:
            self.feed = EventFeed(self.events)
            self.sweeper = Sweeper(
                self.events, on_expired=self.waiters.notify, retention=event_retention
            )

    async def run(self) -> None:
        """Sweep expiries and follow the event log until cancelled."""
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
        """End every Watch stream (they finish with UNAVAILABLE: reconnect elsewhere)."""
        if self.feed is not None:
            self.feed.close()

    @rpc
    async def Acquire(self, request: lease_pb2.AcquireRequest, context: Context) -> lease_pb2.Lease:
        resource = limits.check_resource(request.resource)
        holder = limits.check_holder(request.holder)
        ttl_ms = limits.check_ttl_ms(request.ttl_ms)
        wait_ms = limits.check_wait_ms(request.wait_ms)
        request_id = limits.check_request_id(request.request_id)
        try:
            outcome = await self._acquire(resource, holder, ttl_ms, wait_ms, request_id)
        except FencingError:
            self.metrics.acquires.labels("error").inc()
            raise
        fields = {"resource": resource, "holder": holder}
        if isinstance(outcome, Held):
            if self.waiters.closed:
                self.metrics.acquires.labels("error").inc()
                raise BackendUnavailableError(
                    "the lease server is shutting down; retry (with the same request_id)"
                )
            log.info(
                "acquire refused resource=%s holder=%s held_by=%s token=%d",
                resource,
                holder,
                outcome.holder,
                outcome.token,
                extra={**fields, "held_by": outcome.holder, "token": outcome.token},
            )
            self.metrics.acquires.labels("timeout" if wait_ms > 0 else "held").inc()
            error = AcquireTimeoutError if wait_ms > 0 else LeaseHeldError
            raise error(resource=resource, holder=outcome.holder, remaining_ms=outcome.remaining_ms)
        log.info(
            "acquired resource=%s holder=%s token=%d ttl_ms=%d%s",
            resource,
            holder,
            outcome.token,
            outcome.ttl_ms,
            " (replayed)" if outcome.replayed else "",
            extra={**fields, "token": outcome.token, "ttl_ms": outcome.ttl_ms},
        )
        self.metrics.acquires.labels("replayed" if outcome.replayed else "granted").inc()
        self.metrics.granted(resource, outcome.token, outcome.ttl_ms)
        return _lease(outcome)

    async def _acquire(
        self, resource: str, holder: str, ttl_ms: int, wait_ms: int, request_id: str
    ) -> Grant | Held:
        """Try once; if held and ``wait_ms`` > 0, wait in line until granted or out of time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        outcome = await self.backend.acquire(resource, holder, ttl_ms, request_id)
        if isinstance(outcome, Held) and wait_ms > 0:
            with self.metrics.waiters.track_inprogress(), self.waiters.join(resource) as ticket:
                while isinstance(outcome, Held):
                    left = deadline - loop.time()
                    if left <= 0 or not await self.waiters.wait_turn(ticket, left):
                        break
                    outcome = await self.backend.acquire(resource, holder, ttl_ms, request_id)
                    if isinstance(outcome, Held):
                        left = deadline - loop.time()
                        if left <= 0:
                            break
                        # Re-ask just after the expiry, or earlier if nudged by a release.
                        await self.waiters.nap(
                            ticket, min(left, outcome.remaining_ms / 1000 + 0.001)
                        )
        return outcome

    @rpc
    async def Renew(self, request: lease_pb2.RenewRequest, context: Context) -> lease_pb2.Lease:
        resource = limits.check_resource(request.resource)
        token = limits.check_token(request.token)
        ttl_ms = limits.check_ttl_ms(request.ttl_ms)
        holder = limits.check_optional_holder(request.holder)
        with self.metrics.renew_seconds.time():
            grant = await self.backend.renew(resource, token, holder, ttl_ms)
        self.metrics.granted(resource, token, grant.ttl_ms)
        log.debug(
            "renewed resource=%s holder=%s token=%d",
            resource,
            grant.holder,
            token,
            extra={"resource": resource, "holder": grant.holder, "token": token},
        )
        return _lease(grant)

    @rpc
    async def Release(
        self, request: lease_pb2.ReleaseRequest, context: Context
    ) -> lease_pb2.ReleaseResponse:
        resource = limits.check_resource(request.resource)
        token = limits.check_token(request.token)
        holder = limits.check_optional_holder(request.holder)
        await self.backend.release(resource, token, holder)
        self.waiters.notify(resource)
        self.metrics.released(resource, token)
        log.info(
            "released resource=%s holder=%s token=%d",
            resource,
            holder,
            token,
            extra={"resource": resource, "holder": holder, "token": token},
        )
        return lease_pb2.ReleaseResponse()

    @rpc
    async def Describe(
        self, request: lease_pb2.DescribeRequest, context: Context
    ) -> lease_pb2.LeaseState:
        resource = limits.check_resource(request.resource)
        info = await self.backend.describe(resource)
        return lease_pb2.LeaseState(
            resource=info.resource,
            held=info.held,
            holder=info.holder,
            token=info.token,
            remaining_ms=info.remaining_ms,
            last_token=info.last_token,
        )

    async def Watch(
        self, request: lease_pb2.WatchRequest, context: Context
    ) -> AsyncIterator[lease_pb2.LeaseEvent]:
        """Stream the events of a resource or prefix, from ``after_revision`` or from now.

        A cursor the log cannot serve (pruned, or ahead of this log) gets one RESYNC
        carrying the revision the stream continues after: re-read state (Describe)
        and go on. The stream ends only when the client leaves or the server stops.
        """
        events, feed = self.events, self.feed
        if events is None or feed is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"the {self.backend.name} lease backend keeps no event log: Watch needs one",
            )
        try:
            scope = watch_scope(request)
            head = await events.head_revision()
        except FencingError as exc:
            await _status.abort(context, exc)
        cursor = request.after_revision or head
        # Headers now, so a client knows the stream is open before the first event, and
        # where it starts: a client that asked "from now" learns the revision to resume after.
        await context.send_initial_metadata(((WATCH_START_KEY, str(cursor)),))
        log.debug("watch started %s after=%d", scope, cursor)
        with feed.watching():
            while True:
                try:
                    page = await events.events_after(cursor, scope, WATCH_PAGE)
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
                    yield lease_pb2.LeaseEvent(
                        kind=lease_pb2.LeaseEvent.RESYNC, resource=scope.resource, revision=cursor
                    )
                    continue
                for event in page.events:
                    yield _event(event)
                if len(page.events) >= WATCH_PAGE:
                    cursor = page.events[-1].revision
                    continue
                cursor = max(cursor, page.head)
                if not await feed.wait_beyond(cursor):
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "lease server is stopping")
