"""The asyncio lease stream: the twin of :mod:`fencing.client.lease_stream`.

:class:`AsyncStreamStub` stands where the ``AsyncLeaseClient``'s stub stood (the same
awaitable ``Acquire``, ``Renew``, ``Release`` and batch forms). One ``Session`` call per
channel, opened on the first call; one sender task packs every call queued since its
last message into the next, one reader task hands each reply to the future of its
call. The same rules as the blocking twin (a broken stream, a goaway, a server without
``Session``), from :mod:`fencing.client._lease_stream`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message

from fencing.client import _lease_stream
from fencing.client._calls import finish_stream
from fencing.client._lease_stream import Fallback, Moved, SessionBook, Transport
from fencing.client._stream_book import settle
from fencing.errors import DeadlineExceededError
from fencing.v1 import lease_pb2, lease_pb2_grpc

#: Seconds ``aclose`` waits for the replies in flight before it cancels the stream.
CLOSE_TIMEOUT = 2.0


class _AsyncStream:
    """One open ``Session`` call on a ``grpc.aio`` channel (made in the running loop)."""

    def __init__(self, owner: AsyncStreamStub) -> None:
        self._owner = owner
        self._book: SessionBook[asyncio.Future[Message]] = SessionBook()
        #: Callers waiting for room (the server's limit): woken when calls end.
        self._room: list[asyncio.Future[None]] = []
        #: The idle sender's wake-up (None while it sends).
        self._wake: asyncio.Future[None] | None = None
        #: No new calls: closing, moved away (goaway) or ended.
        self.retired = False
        self._call: Any = owner._unary.Session()
        self._tasks = [
            asyncio.create_task(self._send(), name="fencing-lease-stream-send"),
            asyncio.create_task(self._read(), name="fencing-lease-stream-read"),
        ]

    def add(
        self, call: lease_pb2.SessionCall, future: asyncio.Future[Message], moves: int = 0
    ) -> bool:
        """Queue ``call`` now if this stream takes it and has room (else False: see
        :meth:`submit`), and wake the sender."""
        if self.retired or not self._book.has_room(call):
            return False
        self._book.add_call(call, future, moves)
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set_result(None)
        return True

    async def submit(
        self,
        call: lease_pb2.SessionCall,
        future: asyncio.Future[Message],
        end: float,
        moves: int = 0,
    ) -> bool:
        """Queue ``call`` once the server's limit leaves room (until ``end``, loop time);
        False if this stream takes no new calls."""
        loop = asyncio.get_running_loop()
        while not self.retired and not self._book.has_room(call):
            remaining = end - loop.time()
            if remaining <= 0:
                raise DeadlineExceededError(
                    "deadline exceeded: the lease stream had no room for the call"
                )
            room = loop.create_future()
            self._room.append(room)
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await room
            finally:
                if not room.done():
                    self._room.remove(room)
        return self.add(call, future, moves)

    def _room_changed(self) -> None:
        """Calls ended, the limit came, or the stream retired: the waiting callers look again."""
        rooms, self._room = self._room, []
        for room in rooms:
            if not room.done():
                room.set_result(None)

    async def _send(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self.retired:
                while (message := self._book.message()) is not None:
                    await self._call.write(message)
                if not self.retired:
                    self._wake = wake = loop.create_future()
                    await wake
            await self._call.done_writing()  # half-close: the replies in flight still come
        except (grpc.RpcError, asyncio.InvalidStateError):
            return  # the reader sees the same end and settles every waiter

    async def _read(self) -> None:
        error: Callable[[], Exception] = _lease_stream.ended_error
        try:
            headers = await self._call.initial_metadata()
            self._book.limit(headers)
            self._room_changed()
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    break
                received = self._book.receive(response)
                if received.goaway:  # new calls, and the unsent, elsewhere
                    self._retire()
                self._owner._deliver(received)
                for move in received.moved:
                    self._owner._resubmit(move)
                if self._room:
                    self._room_changed()
        except grpc.RpcError as err:
            error = self._owner._broken(err)
        self._retire()
        waiters, request_ids = self._book.end()
        self._owner._ended(self, request_ids)
        for future in waiters:
            settle(future, error())
        self._room_changed()

    def _retire(self) -> None:
        """No new calls on this stream: the sender half-closes, callers waiting for room
        go elsewhere."""
        if not self.retired:
            self.retired = True
            self._owner._retired(self)
            wake, self._wake = self._wake, None
            if wake is not None:
                wake.set_result(None)
            self._room_changed()

    async def aclose(self) -> None:
        """Half-close; wait (up to CLOSE_TIMEOUT) for the replies in flight, then cancel."""
        self._retire()
        await finish_stream(self._call, self._tasks, CLOSE_TIMEOUT)


class AsyncStreamStub:
    """An asyncio ``LeaseServiceStub`` whose lease calls go on the lease stream; see
    :class:`fencing.client.lease_stream.StreamStub`."""

    def __init__(self, channel: grpc.aio.Channel, transport: Transport) -> None:
        self._unary = lease_pb2_grpc.LeaseServiceStub(channel)
        self._transport = transport
        self._stream: _AsyncStream | None = None
        self._streams: set[_AsyncStream] = set()
        self._closed = False
        self._moving: set[asyncio.Task[Any]] = set()  # resubmissions (a goaway) under way
        self._deadlines = _Deadlines()
        #: The client's acquires, for the grants nobody waits for.
        self._acquires = _lease_stream.Acquires()
        #: Set once the server answered UNIMPLEMENTED to Session (``auto``: unary from then on).
        self.unary_only = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._unary, name)

    # -- the lease calls: the unary stub's signatures -------------------------------------

    async def Acquire(self, request: Message, timeout: float) -> Message:  # noqa: ASYNC109
        return await self._call("Acquire", request, timeout)

    async def Renew(self, request: Message, timeout: float) -> Message:  # noqa: ASYNC109
        return await self._call("Renew", request, timeout)

    async def Release(self, request: Message, timeout: float) -> Message:  # noqa: ASYNC109
        return await self._call("Release", request, timeout)

    async def AcquireMany(self, request: Message, timeout: float) -> Message:  # noqa: ASYNC109
        return await self._call("AcquireMany", request, timeout)

    async def RenewMany(self, request: Message, timeout: float) -> Message:  # noqa: ASYNC109
        return await self._call("RenewMany", request, timeout)

    async def ReleaseMany(self, request: Message, timeout: float) -> Message:  # noqa: ASYNC109
        return await self._call("ReleaseMany", request, timeout)

    @contextlib.contextmanager
    def acquiring(self, request_id: str) -> Iterator[None]:
        """Around an acquire whose attempts all carry ``request_id``; see
        :meth:`fencing.client.lease_stream.StreamStub.acquiring`."""
        self._acquires.begin(request_id)
        try:
            yield
        finally:
            for release in self._acquires.end(request_id):
                self._release_orphan(release)

    async def _call(
        self,
        method: str,
        request: Message,
        timeout: float,  # noqa: ASYNC109 - the call's deadline, as the unary stub takes it
    ) -> Message:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        if not self.unary_only or self._transport is Transport.STREAM:
            future: asyncio.Future[Message] = loop.create_future()
            call = _lease_stream.session_call(method, request, timeout)
            request_id = _lease_stream.request_id_of(call)
            self._acquires.sent(request_id)
            queued = False
            try:
                stream = self._stream
                queued = stream is not None and stream.add(call, future)
                # No stream, or no room:
                queued = queued or await self._submit(call, future, end)
            finally:
                if not queued:
                    self._acquires.gone(request_id)
            # Not asyncio.timeout around a shield: the future expires at ``end`` itself. A
            # task cancelled while it waits cancels the future (it is awaited directly);
            # either way the future is done, so a late grant is released, not handed out.
            self._deadlines.add(loop, end, future, timeout)
            try:
                return await future
            except Fallback:
                pass
        result: Message = await getattr(self._unary, method)(
            request, timeout=max(0.001, end - loop.time())
        )
        return result

    async def _submit(
        self,
        call: lease_pb2.SessionCall,
        future: asyncio.Future[Message],
        end: float,
        moves: int = 0,
    ) -> bool:
        """Queue ``call`` on the current stream (a new one if none); False if it cannot go
        on a stream (``future`` then has the refusal)."""
        while True:
            stream = self._current()
            if stream is None:  # closed, or the server has no Session
                future.set_exception(self._refusal())
                return False
            if await stream.submit(call, future, end, moves):
                return True

    def _current(self) -> _AsyncStream | None:
        if self._closed or self.unary_only:
            return None
        if self._stream is None:
            self._stream = _AsyncStream(self)
            self._streams.add(self._stream)
        return self._stream

    # -- what the streams report ----------------------------------------------------------

    def _resubmit(self, move: Moved[asyncio.Future[Message]]) -> None:
        """A call not sent before a goaway: on the next stream (its deadline as it was)."""
        if move.waiter.done():
            self._acquires.gone(_lease_stream.request_id_of(move.call))
            return
        end = asyncio.get_running_loop().time() + move.call.deadline_ms / 1000
        task = asyncio.create_task(self._submit(move.call, move.waiter, end, move.moves))
        self._moving.add(task)
        task.add_done_callback(self._moving.discard)
        task.add_done_callback(functools.partial(_fail_with, move.waiter))
        task.add_done_callback(functools.partial(self._moved, move.call))

    def _moved(self, call: lease_pb2.SessionCall, task: asyncio.Task[bool]) -> None:
        """A moved call that was not queued again will have no reply."""
        if task.cancelled() or task.exception() is not None or not task.result():
            self._acquires.gone(_lease_stream.request_id_of(call))

    def _deliver(self, received: _lease_stream.Received[asyncio.Future[Message]]) -> None:
        """Hand out the replies of one response; release the grants nobody can take."""
        for release in _lease_stream.deliver(received, self._acquires):
            self._release_orphan(release)

    def _release_orphan(self, call: lease_pb2.SessionCall) -> None:
        """Send the release of a grant nobody waits for (never waiting for room; without
        room the lease expires by itself)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Message] = loop.create_future()
        future.add_done_callback(_ignore)
        task = asyncio.create_task(self._submit(call, future, loop.time()))
        self._moving.add(task)
        task.add_done_callback(self._moving.discard)
        task.add_done_callback(_ignore_task)

    def _retired(self, stream: _AsyncStream) -> None:
        if self._stream is stream:
            self._stream = None

    def _ended(self, stream: _AsyncStream, request_ids: list[str]) -> None:
        """``stream`` ended; the acquires among its calls left will have no reply."""
        self._streams.discard(stream)
        for request_id in request_ids:
            self._acquires.gone(request_id)

    def _broken(self, err: grpc.RpcError) -> Callable[[], Exception]:
        """The stream ended with ``err``: what each of its calls in flight fails with."""
        error = _lease_stream.ended_by(err)
        if error is not None:
            return error
        self.unary_only = True  # no Session here: remember it
        return self._refusal

    def _refusal(self) -> Exception:
        return _lease_stream.refusal(self._closed, self._transport)

    async def aclose(self) -> None:
        """End every stream (the replies in flight get CLOSE_TIMEOUT to come)."""
        self._closed = True
        streams = list(self._streams)
        await asyncio.gather(*(stream.aclose() for stream in streams), return_exceptions=True)
        self._deadlines.close()


def _fail_with(future: asyncio.Future[Message], task: asyncio.Task[Any]) -> None:
    """A moved call whose resubmission failed (e.g. no room before its deadline)."""
    if not task.cancelled() and task.exception() is not None and not future.done():
        exc = task.exception()
        assert exc is not None
        future.set_exception(exc)


class _Deadlines:
    """When the callers of a stub's calls stop waiting (``DeadlineExceededError``): one
    timer, at the earliest deadline, for all of them, not a timer made and cancelled per
    call. A call whose future is done by its deadline (its reply came, its caller was
    cancelled) is passed over; the done ones ahead of the next deadline are dropped
    whenever the timer fires."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[Message], float]] = []
        self._order = itertools.count()  # ties on the deadline: never compare futures
        self._timer: asyncio.TimerHandle | None = None

    def add(
        self,
        loop: asyncio.AbstractEventLoop,
        end: float,
        future: asyncio.Future[Message],
        timeout: float,  # the call's, for its error message
    ) -> None:
        """Fail ``future`` at ``end`` (loop time) unless it is done by then."""
        heapq.heappush(self._heap, (end, next(self._order), future, timeout))
        timer = self._timer
        if timer is None or end < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(end, self._expire, loop)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        # Everything due when this timer was (the loop may run it a clock tick early).
        due = loop.time() if self._timer is None else max(loop.time(), self._timer.when())
        self._timer = None
        heap = self._heap
        while heap and (heap[0][0] <= due or heap[0][2].done()):
            _, _, future, timeout = heapq.heappop(heap)
            if not future.done():
                future.set_exception(
                    DeadlineExceededError(
                        f"deadline exceeded: no reply on the lease stream within {timeout:.3f} s"
                    )
                )
        if heap:
            self._timer = loop.call_at(heap[0][0], self._expire, loop)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()


def _ignore(future: asyncio.Future[Message]) -> None:
    """Nobody awaits an orphan's release: retrieve its outcome so none is reported lost."""
    if not future.cancelled():
        future.exception()


def _ignore_task(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
