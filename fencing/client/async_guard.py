"""``AsyncGuardClient``: the asyncio twin of :class:`~fencing.client.guard.GuardClient`.

Same methods, awaited, and ``aclose`` for ``close``; requests and results come
from :mod:`fencing.client._core`, so only the waiting differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import TypeVar

import grpc
import grpc.aio

from fencing.client import _core, _writes
from fencing.client._calls import AsyncCalls
from fencing.client._core import WriteResult
from fencing.client._writes import FenceReset, GuardInfo, ManyResult, Refusal
from fencing.client.async_write_stream import AsyncWriteStream
from fencing.limits import MAX_STREAM_WRITES
from fencing.tls import TLSConfig
from fencing.types import Delete, Fenced, Op, Put, Record
from fencing.v1 import guard_pb2, guard_pb2_grpc

Resp = TypeVar("Resp")


class AsyncGuardClient(AsyncCalls):
    """An asyncio client of ``fencing.v1.GuardService`` (create it inside a running loop).

    ::

        async with AsyncGuardClient("127.0.0.1:50052") as guard:
            await guard.put(lease, "balance", b"100")   # StaleTokenError if a newer token wrote
    """

    def __init__(
        self,
        target: str,
        *,
        tls: TLSConfig | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        rpc_timeout: float = _core.DEFAULT_RPC_TIMEOUT,
        channel: grpc.aio.Channel | None = None,
        coalesce: bool = False,
    ) -> None:
        self.target = target
        self.rpc_timeout = rpc_timeout
        self.coalesce = coalesce
        self._channel = (
            channel
            if channel is not None
            else _core.open_aio_channel(target, tls=tls, token=token, credentials=credentials)
        )
        self._stub = guard_pb2_grpc.GuardServiceStub(self._channel)
        self._shared_stream: AsyncWriteStream | None = None

    async def aclose(self) -> None:
        if self._shared_stream is not None:
            await self._shared_stream.aclose()
        await self._channel.close()

    async def write(
        self, fenced: Fenced, ops: Sequence[Op] | Op, *, idempotency_key: str = ""
    ) -> WriteResult:
        """Apply ``ops`` atomically under ``fenced.token``; ``StaleTokenError`` if stale.

        With ``coalesce=True`` on the client, concurrent writes share one
        ``WriteStream`` and travel together (same verdicts, fewer messages).
        """
        if self.coalesce:
            stream = await self._stream()
            async with asyncio.timeout(self.rpc_timeout):
                return await stream.write(fenced, ops, idempotency_key=idempotency_key)
        request = _core.write_request(fenced, _core.ops_list(ops), idempotency_key)
        return _core.write_result(await self._call(self._stub.Write, request))

    async def put(
        self, fenced: Fenced, key: str, value: bytes, *, idempotency_key: str = ""
    ) -> int:
        """Store one value; returns the fence after the write."""
        return (await self.write(fenced, Put(key, value), idempotency_key=idempotency_key)).fence

    async def delete(self, fenced: Fenced, key: str, *, idempotency_key: str = "") -> int:
        """Remove one key; returns the fence after the write."""
        return (await self.write(fenced, Delete(key), idempotency_key=idempotency_key)).fence

    async def read(self, resource: str, key: str) -> Record | None:
        """The value under ``key`` with the token that wrote it, or None."""
        msg = await self._call(self._stub.Read, _core.read_request(resource, key))
        return _core.read_result(msg)

    async def list_records(
        self, resource: str, prefix: str = "", *, page_size: int = 0
    ) -> AsyncGenerator[tuple[str, Record], None]:
        """Yield ``(key, record)`` under ``prefix``, a page at a time; see
        ``GuardClient.list_records``."""
        page_token = ""
        while True:
            request = _core.list_records_request(resource, prefix, page_size, page_token)
            page = await self._call(self._stub.ListRecords, request)
            for item in _core.key_records(page):
                yield item
            page_token = page.next_page_token
            if not page_token:
                return

    async def fence(self, fenced: Fenced) -> int:
        """Promise: from now on reject every token older than ``fenced.token``."""
        return (await self._call(self._stub.Fence, _core.fence_request(fenced))).fence

    async def describe_fence(self, resource: str) -> int:
        """The guard's fence for ``resource`` (0 if never written or fenced)."""
        msg = await self._call(self._stub.DescribeFence, _core.describe_fence_request(resource))
        return msg.fence

    async def describe_guard(self) -> GuardInfo:
        """What the guard says of itself: fence mode, store, follower, refusal counts."""
        request = guard_pb2.DescribeGuardRequest()
        return _writes.guard_info(await self._call(self._stub.DescribeGuard, request))

    async def list_refusals(self, resource: str) -> list[Refusal]:
        """The guard's recent refusals of ``resource``, newest first: a bounded ring per
        resource in the guard's memory (see :mod:`guard.refusals`), empty after a restart."""
        request = _writes.list_refusals_request(resource)
        return _writes.refusals(await self._call(self._stub.ListRefusals, request))

    async def reset_fence(self, resource: str, to_token: int) -> FenceReset:
        """An operator's recovery: set ``resource``'s fence to ``to_token``, lower or higher.

        Pass the lease server's ``last_token`` for the resource
        (``LeaseClient.describe(resource).last_token``, as ``fencing fence reset`` does):
        the highest token ever granted, so every former holder stays fenced while a
        fence a token nobody was granted wedged comes down. Needs the ``reset_fence``
        permission; the guard logs it at WARNING and counts it.
        """
        request = _writes.reset_fence_request(resource, to_token)
        return _writes.fence_reset(await self._call(self._stub.ResetFence, request))

    # -- several resources, many writes ----------------------------------------------------

    async def write_many(
        self,
        writes: Sequence[tuple[Fenced, Sequence[Op] | Op]],
        *,
        idempotency_key: str = "",
    ) -> ManyResult:
        """Write several resources atomically, each under its own token: all or nothing."""
        request = _writes.write_many_request(writes, idempotency_key)
        return _writes.many_result(await self._call(self._stub.WriteMany, request))

    def stream(self, *, max_batch: int = MAX_STREAM_WRITES) -> AsyncWriteStream:
        """An :class:`AsyncWriteStream` on this channel: ``async with guard.stream() as s``."""
        return AsyncWriteStream(self._channel, max_batch=max_batch)

    async def _stream(self) -> AsyncWriteStream:
        if self._shared_stream is None or self._shared_stream.broken:
            self._shared_stream = await AsyncWriteStream(self._channel).start()
        return self._shared_stream
