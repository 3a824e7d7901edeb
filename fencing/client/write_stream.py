"""``WriteStream``: many guarded writes over one ``GuardService.WriteStream`` call (blocking).

Any number of threads call :meth:`WriteStream.write` (or :meth:`~WriteStream.submit`
for a future); whatever is waiting when the sender gets to send goes out as one
message, and the guard packs writes from every stream into shared store
transactions. Each write keeps its own verdict: the same result, or the same
exception (``StaleTokenError``...), as :meth:`GuardClient.write` would give it.

If the stream breaks (the guard restarts, the network fails), every write still
waiting for its verdict fails with the translated error: it may or may not have been
applied, so retry it with an idempotency key. The stream is then closed; open another
(``GuardClient(coalesce=True)`` does that by itself).

The asyncio twin is :mod:`fencing.client.async_write_stream`; both run on
:mod:`fencing.client._writes`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import grpc

from fencing.client import _core
from fencing.client._closing import Closing
from fencing.client._core import WriteResult
from fencing.client._stream_book import settle
from fencing.client._writes import WriteBook
from fencing.errors import BackendUnavailableError
from fencing.limits import MAX_STREAM_WRITES
from fencing.types import Fenced, Op
from fencing.v1 import guard_pb2, guard_pb2_grpc


class WriteStream(Closing):
    """One open ``WriteStream`` call, shared by any number of writer threads."""

    def __init__(
        self,
        stub: guard_pb2_grpc.GuardServiceStub,
        *,
        max_batch: int = MAX_STREAM_WRITES,
        timeout: float | None = None,
    ) -> None:
        self._book: WriteBook[Future[WriteResult]] = WriteBook(max_batch)
        self._cond = threading.Condition()
        self._closing = False
        self.error: Exception | None = None
        self._call: Any = stub.WriteStream(self._messages(), timeout=timeout)
        self._reader = threading.Thread(target=self._read, name="fencing-write-stream", daemon=True)
        self._reader.start()

    @property
    def broken(self) -> bool:
        """True once the stream ended with an error (every later write fails at once)."""
        return self.error is not None

    def submit(
        self, fenced: Fenced, ops: Sequence[Op] | Op, *, idempotency_key: str = ""
    ) -> Future[WriteResult]:
        """Queue a write; the future gets its result or its exception."""
        future: Future[WriteResult] = Future()
        with self._cond:
            if self.error is not None or self._closing:
                future.set_exception(
                    self.error or BackendUnavailableError("the write stream is closed")
                )
                return future
            self._book.add_write(fenced, ops, idempotency_key, future)
            self._cond.notify()
        return future

    def write(
        self,
        fenced: Fenced,
        ops: Sequence[Op] | Op,
        *,
        idempotency_key: str = "",
        timeout: float | None = None,
    ) -> WriteResult:
        """Write and wait for the verdict, exactly like :meth:`GuardClient.write`."""
        return self.submit(fenced, ops, idempotency_key=idempotency_key).result(timeout)

    def _messages(self) -> Iterator[guard_pb2.WriteStreamRequest]:
        # Runs in a gRPC thread: each message takes everything queued since the last.
        while True:
            with self._cond:
                while not self._book.queued and not self._closing:
                    self._cond.wait()
                message = self._book.message()
                if message is None:  # closing, nothing left
                    return
            yield message

    def _read(self) -> None:
        try:
            for response in self._call:
                with self._cond:
                    verdicts = self._book.verdicts(response)
                for future, outcome in verdicts:
                    settle(future, outcome)
        except grpc.RpcError as err:
            error = _core.translate(err)
            self._finish(error if isinstance(error, Exception) else BackendUnavailableError())
            return
        self._finish(BackendUnavailableError("the write stream ended before its verdict"))

    def _finish(self, error: Exception) -> None:
        with self._cond:
            if not self._closing:  # it broke by itself, not by close()
                self.error = error
            self._closing = True
            waiters = self._book.abandon()
            self._cond.notify_all()
        for future in waiters:
            settle(future, error)

    def close(self, timeout: float | None = 10.0) -> None:
        """Send what is queued, wait for its verdicts, end the call."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._reader.join(timeout)
        if self._reader.is_alive():
            self._call.cancel()
            self._reader.join(1.0)
