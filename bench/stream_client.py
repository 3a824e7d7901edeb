"""A minimal client of ``LeaseService.Session`` for the benchmarks: one stream, calls by id.

Just enough to put lease calls through the stream as a client would (one stream per
client, each call awaited by its id while others may be in flight); not the SDK's
transport, which adds retries, reconnects and the lease lifecycle.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import grpc.aio

from fencing import _status
from fencing.v1 import lease_pb2, lease_pb2_grpc


class SessionStream:
    """One Session stream on ``channel``; :meth:`ask` sends a call and awaits its reply."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._call: Any = lease_pb2_grpc.LeaseServiceStub(channel).Session()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[lease_pb2.SessionReply]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self._call:
                for reply in response.replies:
                    future = self._pending.pop(reply.id, None)
                    if future is not None and not future.done():
                        future.set_result(reply)
        except grpc.aio.AioRpcError:
            pass  # the stream broke: every call in flight fails below
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("the session stream ended"))

    async def ask(self, call: lease_pb2.SessionCall) -> lease_pb2.SessionReply:
        """The reply to ``call``; an error reply raises the SDK's exception for it."""
        call.id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[call.id] = future
        await self._call.write(lease_pb2.SessionRequest(calls=[call]))
        reply: lease_pb2.SessionReply = await future
        if reply.WhichOneof("outcome") == "error":
            raise _status.from_status(reply.error) or RuntimeError(str(reply.error))
        return reply

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, *, wait_ms: int = 0, request_id: str = ""
    ) -> lease_pb2.Lease:
        request = lease_pb2.AcquireRequest(
            resource=resource, holder=holder, ttl_ms=ttl_ms, wait_ms=wait_ms, request_id=request_id
        )
        return (await self.ask(lease_pb2.SessionCall(acquire=request))).acquired

    async def release(self, resource: str, token: int, holder: str) -> None:
        request = lease_pb2.ReleaseRequest(resource=resource, token=token, holder=holder)
        await self.ask(lease_pb2.SessionCall(release=request))

    async def ping(self) -> None:
        await self.ask(lease_pb2.SessionCall(ping=lease_pb2.Ping()))

    async def close(self) -> None:
        """Half-close and wait for the server to end the stream (or cancel a broken one)."""
        try:
            await self._call.done_writing()
        except Exception:  # a broken stream: nothing left to close politely
            self._call.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
