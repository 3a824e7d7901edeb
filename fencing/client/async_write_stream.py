"""``AsyncWriteStream``: the asyncio twin of :class:`~fencing.client.write_stream.WriteStream`.

Any number of tasks ``await stream.write(...)``; one sender task packs whatever is
waiting into each message, one reader task hands verdicts back. Same verdicts, same
failure rule (a write pending when the stream breaks may or may not have landed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Self

import grpc
import grpc.aio

from fencing.client import _core
from fencing.client._calls import finish_stream
from fencing.client._closing import AsyncClosing
from fencing.client._core import WriteResult
from fencing.client._stream_book import settle
from fencing.client._writes import WriteBook
from fencing.errors import BackendUnavailableError
from fencing.limits import MAX_STREAM_WRITES
from fencing.types import Fenced, Op
from fencing.v1 import guard_pb2_grpc

#: Seconds ``aclose`` waits for outstanding verdicts before it cancels the call.
CLOSE_TIMEOUT = 10.0


class AsyncWriteStream(AsyncClosing):
    """One open ``WriteStream`` call on a ``grpc.aio`` channel; use ``async with``::

    async with AsyncWriteStream(channel) as stream:
        await asyncio.gather(*(stream.write(lease, Put(f"k{i}", b"v")) for i in range(100)))
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        max_batch: int = MAX_STREAM_WRITES,
        timeout: float | None = None,
    ) -> None:
        self._stub = guard_pb2_grpc.GuardServiceStub(channel)
        self._timeout = timeout
        self._book: WriteBook[asyncio.Future[WriteResult]] = WriteBook(max_batch)
        self._ready = asyncio.Event()
        self._closing = False
        self.error: Exception | None = None
        self._call: Any = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> Self:
        if self._call is None:
            self._call = self._stub.WriteStream(timeout=self._timeout)
            self._tasks = [
                asyncio.create_task(self._send(), name="fencing-write-stream-send"),
                asyncio.create_task(self._read(), name="fencing-write-stream-read"),
            ]
        return self

    @property
    def broken(self) -> bool:
        return self.error is not None

    async def write(
        self, fenced: Fenced, ops: Sequence[Op] | Op, *, idempotency_key: str = ""
    ) -> WriteResult:
        """Write and wait for the verdict, exactly like ``AsyncGuardClient.write``."""
        if self.error is not None:
            raise self.error
        if self._closing or self._call is None:
            raise BackendUnavailableError("the write stream is not open")
        future: asyncio.Future[WriteResult] = asyncio.get_running_loop().create_future()
        self._book.add_write(fenced, ops, idempotency_key, future)
        self._ready.set()
        return await future

    async def _send(self) -> None:
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                while (message := self._book.message()) is not None:
                    await self._call.write(message)
                if self._closing:
                    await self._call.done_writing()
                    return
        except grpc.RpcError:
            return  # the reader sees the same failure and settles every waiter

    async def _read(self) -> None:
        error: Exception = BackendUnavailableError("the write stream ended before its verdict")
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    break
                for future, outcome in self._book.verdicts(response):
                    settle(future, outcome)
        except grpc.RpcError as err:
            translated = _core.translate(err)
            error = translated if isinstance(translated, Exception) else error
            if not self._closing:
                self.error = error
        self._closing = True
        self._ready.set()
        for future in self._book.abandon():
            settle(future, error)

    async def aclose(self) -> None:
        """Send what is queued, wait (up to ``CLOSE_TIMEOUT`` s) for its verdicts, end."""
        if self._call is None:
            return
        self._closing = True
        self._ready.set()
        await finish_stream(self._call, self._tasks, CLOSE_TIMEOUT)

    async def __aenter__(self) -> Self:
        return await self.start()
