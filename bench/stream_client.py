"""A minimal client of ``LeaseService.Session`` for the benchmarks: one stream, calls by id.

Just enough to put lease calls through the stream as a client would: each call
awaited by its id while others may be in flight, and the calls queued while a
message is being written going out together in the next one (as the SDK's stream
does), so tasks that share one stream share its messages. Not the SDK's transport,
which adds retries, reconnects and the lease lifecycle.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import grpc.aio

from fencing import _status
from fencing.limits import MAX_SESSION_CALLS
from fencing.v1 import lease_pb2, lease_pb2_grpc

#: Channel options giving a channel its own connection: grpc otherwise shares one TCP
#: connection among the channels of a process with the same target and options, and
#: separate clients (processes, hosts) would each have their own.
OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)


class SessionStream:
    """One Session stream on ``channel``; :meth:`ask` sends a call and awaits its reply."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._call: Any = lease_pb2_grpc.LeaseServiceStub(channel).Session()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[lease_pb2.SessionReply]] = {}
        self._queued: list[lease_pb2.SessionCall] = []
        self._wake = asyncio.Event()
        self._closed = False
        self._reader = asyncio.create_task(self._read())
        self._writer = asyncio.create_task(self._write())

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
            self._fail_all()

    async def _write(self) -> None:
        """Everything queued since the last message goes out in the next one."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queued:
                    calls = self._queued[:MAX_SESSION_CALLS]
                    del self._queued[:MAX_SESSION_CALLS]
                    await self._call.write(lease_pb2.SessionRequest(calls=calls))
                if self._closed:
                    await self._call.done_writing()
                    return
        except Exception:  # a broken stream: its calls fail, as the reader's do
            self._fail_all()
            self._call.cancel()

    def _fail_all(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("the session stream ended"))
        self._pending.clear()

    async def ask(self, call: lease_pb2.SessionCall) -> lease_pb2.SessionReply:
        """The reply to ``call``; an error reply raises the SDK's exception for it."""
        if self._closed or self._writer.done():
            raise ConnectionError("the session stream ended")
        call.id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[call.id] = future
        self._queued.append(call)
        self._wake.set()
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
        self._closed = True
        self._wake.set()
        await asyncio.gather(self._writer, return_exceptions=True)
        await asyncio.gather(self._reader, return_exceptions=True)
