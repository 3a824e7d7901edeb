"""``fencing.v1.GuardService`` over a :class:`~guard.stores.base.GuardStore`.

Validates each request whole before the store sees it (a bad op anywhere means
nothing is applied), and logs each acceptance and each stale-token rejection with
resource and tokens (as structured fields too), never values, and counts them
(:mod:`guard.metrics`).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc.aio
from prometheus_client import CollectorRegistry

from fencing import limits
from fencing._admission import current_principal
from fencing._server import rpc
from fencing.errors import FencingError, InvalidArgumentError, StaleTokenError
from fencing.types import Delete, Op, Put
from fencing.v1 import guard_pb2, guard_pb2_grpc
from guard.fence import FenceMode
from guard.metrics import GuardMetrics
from guard.stores.base import GuardStore

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]


def ops_from_proto(ops: Any, field: str = "ops") -> list[Op]:
    """Validate and convert repeated ``Op``; the error names the op's index and field."""
    limits.check_op_count(len(ops), field)
    result: list[Op] = []
    for i, op in enumerate(ops):
        which = op.WhichOneof("op")
        if which == "put":
            limits.check_key(op.put.key, f"{field}[{i}].put.key")
            limits.check_value(op.put.value, f"{field}[{i}].put.value")
            result.append(Put(op.put.key, op.put.value))
        elif which == "delete":
            limits.check_key(op.delete.key, f"{field}[{i}].delete.key")
            result.append(Delete(op.delete.key))
        else:
            raise InvalidArgumentError(
                f"{field}[{i}] must be a put or a delete", field=f"{field}[{i}]"
            )
    return result


class GuardService(guard_pb2_grpc.GuardServiceServicer):
    """The guard's RPC handlers."""

    def __init__(
        self,
        store: GuardStore,
        mode: FenceMode = FenceMode.MONOTONIC,
        metrics: GuardMetrics | None = None,
    ) -> None:
        self.store = store
        self.mode = mode
        self.stale_rejections = 0
        self.metrics = metrics or GuardMetrics(CollectorRegistry())

    def _rejected(self, what: str, resource: str, token: int, exc: StaleTokenError) -> None:
        self.stale_rejections += 1
        self.metrics.stale(resource)
        log.warning(
            "stale %s rejected resource=%s token=%d fence=%d",
            what,
            resource,
            token,
            exc.current_token,
            extra={
                "resource": resource,
                "token": token,
                "current_token": exc.current_token,
                "principal": current_principal() or "",
            },
        )

    @rpc
    async def Write(
        self, request: guard_pb2.WriteRequest, context: Context
    ) -> guard_pb2.WriteResponse:
        resource = limits.check_resource(request.resource)
        token = limits.check_token(request.token)
        ops = ops_from_proto(request.ops)
        key = limits.check_idempotency_key(request.idempotency_key)
        try:
            result = await self.store.write(resource, token, ops, key, self.mode)
        except StaleTokenError as exc:
            self.metrics.writes.labels("stale").inc()
            self._rejected("write", resource, token, exc)
            raise
        except FencingError:
            self.metrics.writes.labels("error").inc()
            raise
        self.metrics.writes.labels("replayed" if result.replayed else "accepted").inc()
        log.debug(
            "write accepted resource=%s token=%d ops=%d fence=%d%s",
            resource,
            token,
            len(ops),
            result.fence,
            " (replayed)" if result.replayed else "",
            extra={
                "resource": resource,
                "token": token,
                "op_count": len(ops),
                "fence": result.fence,
            },
        )
        return guard_pb2.WriteResponse(fence=result.fence, replayed=result.replayed)

    @rpc
    async def Read(
        self, request: guard_pb2.ReadRequest, context: Context
    ) -> guard_pb2.ReadResponse:
        resource = limits.check_resource(request.resource)
        key = limits.check_key(request.key)
        record = await self.store.read(resource, key)
        if record is None:
            return guard_pb2.ReadResponse(found=False)
        return guard_pb2.ReadResponse(
            found=True, value=record.value, written_by_token=record.written_by_token
        )

    @rpc
    async def Fence(
        self, request: guard_pb2.FenceRequest, context: Context
    ) -> guard_pb2.FenceState:
        resource = limits.check_resource(request.resource)
        token = limits.check_token(request.token)
        try:
            fence = await self.store.fence(resource, token)
        except StaleTokenError as exc:
            self._rejected("fence", resource, token, exc)
            raise
        self.metrics.fence_advanced("fence")
        log.info(
            "fenced resource=%s token=%d",
            resource,
            fence,
            extra={"resource": resource, "token": token, "fence": fence},
        )
        return guard_pb2.FenceState(resource=resource, fence=fence)

    @rpc
    async def DescribeFence(
        self, request: guard_pb2.DescribeFenceRequest, context: Context
    ) -> guard_pb2.FenceState:
        resource = limits.check_resource(request.resource)
        return guard_pb2.FenceState(
            resource=resource, fence=await self.store.describe_fence(resource)
        )
