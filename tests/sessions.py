"""A raw ``LeaseService.Session`` stream for tests: send calls, await each reply by id,
and see every response as it came (its order, a goaway)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from google.rpc import error_details_pb2, status_pb2

from fencing import _status
from fencing.v1 import lease_pb2, lease_pb2_grpc
from tests.waiting import HANG_GUARD


@dataclass
class Stream:
    """A raw Session stream: send calls, await each reply by id."""

    call: Any
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    pending: dict[int, asyncio.Future[lease_pb2.SessionReply]] = field(default_factory=dict)
    responses: list[lease_pb2.SessionResponse] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    @classmethod
    def open(cls, channel: grpc.aio.Channel, metadata: Sequence[tuple[str, str]] = ()) -> Stream:
        """A stream on ``channel``, its replies read from now on."""
        stream = cls(lease_pb2_grpc.LeaseServiceStub(channel).Session(metadata=tuple(metadata)))
        stream.start()
        return stream

    def start(self) -> None:
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for response in self.call:
            self.responses.append(response)
            for reply in response.replies:
                self.order.append(reply.id)
                future = self.pending.pop(reply.id, None)
                if future is not None and not future.done():
                    future.set_result(reply)

    async def send(self, *calls: lease_pb2.SessionCall) -> list[asyncio.Future[Any]]:
        futures = []
        for call in calls:
            if not call.id:
                call.id = next(self.ids)
            future = asyncio.get_running_loop().create_future()
            self.pending[call.id] = future
            futures.append(future)
        await self.call.write(lease_pb2.SessionRequest(calls=calls))
        return futures

    async def ask(self, call: lease_pb2.SessionCall) -> lease_pb2.SessionReply:
        (future,) = await self.send(call)
        reply: lease_pb2.SessionReply = await asyncio.wait_for(future, HANG_GUARD)
        return reply


def acquire(resource: str, holder: str = "h", *, wait_ms: int = 0, ttl_ms: int = 60_000,
            request_id: str = "", deadline_ms: int = 0) -> lease_pb2.SessionCall:  # fmt: skip
    return lease_pb2.SessionCall(
        deadline_ms=deadline_ms,
        acquire=lease_pb2.AcquireRequest(
            resource=resource, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms, request_id=request_id
        ),
    )


def ping() -> lease_pb2.SessionCall:
    """A new ping call (a call object takes the id it is sent with: never share one)."""
    return lease_pb2.SessionCall(ping=lease_pb2.Ping())


def error(reply: lease_pb2.SessionReply) -> Exception:
    assert reply.WhichOneof("outcome") == "error", reply
    found = _status.from_status(reply.error)
    assert found is not None, reply.error
    return found


def info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo:
    for detail in status.details:
        found = error_details_pb2.ErrorInfo()
        if detail.Unpack(found):
            return found
    raise AssertionError(f"no ErrorInfo in {status}")


def release(resource: str, token: int) -> lease_pb2.SessionCall:
    return lease_pb2.SessionCall(release=lease_pb2.ReleaseRequest(resource=resource, token=token))
