"""``fencing.v1.LeaseService`` over a :class:`~lease_server.backends.base.LeaseBackend`.

Validates every request at the edge (:mod:`fencing.limits`), queues waiters per
resource (:mod:`lease_server.waiters`), and logs each grant, renewal, release and
refusal with resource, holder and token (as structured fields too), and counts
them (:mod:`lease_server.metrics`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
from prometheus_client import CollectorRegistry

from fencing import limits
from fencing._server import rpc
from fencing.errors import (
    AcquireTimeoutError,
    BackendUnavailableError,
    FencingError,
    LeaseHeldError,
)
from fencing.v1 import lease_pb2, lease_pb2_grpc
from lease_server.backends.base import LeaseBackend
from lease_server.leases import Grant, Held
from lease_server.metrics import LeaseMetrics
from lease_server.waiters import WaitQueues

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


def _lease(grant: Grant) -> lease_pb2.Lease:
    return lease_pb2.Lease(
        resource=grant.resource, holder=grant.holder, token=grant.token, ttl_ms=grant.ttl_ms
    )


class LeaseService(lease_pb2_grpc.LeaseServiceServicer):
    """The lease server's RPC handlers."""

    def __init__(
        self,
        backend: LeaseBackend,
        waiters: WaitQueues | None = None,
        metrics: LeaseMetrics | None = None,
    ) -> None:
        self.backend = backend
        self.waiters = waiters or WaitQueues()
        self.metrics = metrics or LeaseMetrics(CollectorRegistry())
        backend.on_release(self.waiters.notify)

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
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Watch is not implemented yet")
        yield lease_pb2.LeaseEvent()  # type: ignore[unreachable]  # makes it a generator
