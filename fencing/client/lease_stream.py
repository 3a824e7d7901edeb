"""The blocking lease stream: a :class:`LeaseClient`'s lease calls over one ``Session`` call.

:class:`StreamStub` stands where the client's ``LeaseServiceStub`` stood: its
``Acquire``, ``Renew``, ``Release``, ``AcquireMany``, ``RenewMany`` and
``ReleaseMany`` take the same request and ``timeout`` and return the same reply (or
raise the same exception), so the client's steps do not know which transport carries
them. Underneath, one stream per channel is opened on the first call; any number of
threads call at once, and what they queue while the previous message is being sent
goes out as one message (gRPC's sender thread consumes :meth:`_Stream._messages`);
a reader thread hands each reply to the future of its call.

A stream that breaks fails its calls in flight with ``BackendUnavailableError`` (their
outcome is unknown; the steps retry as for an unreachable unary server: acquire with
the same request id) and the next call opens a new one. A goaway moves new calls, and
those not sent yet, to a new stream; the old one finishes what is in flight. A server
without ``Session`` (UNIMPLEMENTED on open) is remembered: with ``transport="auto"``
every call of this client then goes unary. The rules are in
:mod:`fencing.client._lease_stream`; the asyncio twin is
:mod:`fencing.client.async_lease_stream`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import grpc
from google.protobuf.message import Message

from fencing.client import _lease_stream
from fencing.client._lease_stream import Fallback, Moved, SessionBook, Transport
from fencing.client._stream_book import settle
from fencing.errors import DeadlineExceededError
from fencing.v1 import lease_pb2, lease_pb2_grpc

#: Seconds ``close`` waits for the replies in flight before it cancels the stream.
CLOSE_TIMEOUT = 2.0


class _Stream:
    """One open ``Session`` call."""

    def __init__(self, owner: StreamStub) -> None:
        self._owner = owner
        self._book: SessionBook[Future[Message]] = SessionBook()
        self._cond = threading.Condition()
        #: No new calls: closing, moved away (goaway) or ended.
        self.retired = False
        self._call: Any = owner._unary.Session(self._messages())
        self._reader = threading.Thread(target=self._read, name="fencing-lease-stream", daemon=True)
        self._reader.start()

    def submit(
        self, call: lease_pb2.SessionCall, future: Future[Message], end: float, moves: int = 0
    ) -> bool:
        """Queue ``call`` once the server's limit leaves room (until ``end``); False if this
        stream takes no new calls."""
        with self._cond:
            while not self.retired and not self._book.has_room(call):
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceededError(
                        "deadline exceeded: the lease stream had no room for the call"
                    )
                self._cond.wait(remaining)
            if self.retired:
                return False
            self._book.add_call(call, future, moves)
            self._cond.notify_all()
            return True

    def _messages(self) -> Iterator[lease_pb2.SessionRequest]:
        # Runs in gRPC's sender thread: each message takes every call queued since the last.
        while True:
            with self._cond:
                while not self._book.queued and not self.retired:
                    self._cond.wait()
                message = None if self.retired else self._book.message()
            if message is None:  # retired: half-close, the replies in flight still come
                return
            yield message

    def _read(self) -> None:
        error: Callable[[], Exception] = _lease_stream.ended_error
        try:
            headers = self._call.initial_metadata()
            with self._cond:
                self._book.limit(headers)
                self._cond.notify_all()
            for response in self._call:
                with self._cond:
                    received = self._book.receive(response)
                    if received.goaway:  # new calls, and the unsent, elsewhere
                        self._retire()
                    self._cond.notify_all()
                self._owner._deliver(received)
                for move in received.moved:
                    self._owner._resubmit(move)
        except grpc.RpcError as err:
            error = self._owner._broken(err)
        with self._cond:
            self._retire()
            waiters, request_ids = self._book.end()
            self._cond.notify_all()
        self._owner._ended(self, request_ids)
        for future in waiters:
            settle(future, error())

    def _retire(self) -> None:
        """No new calls on this stream (under the lock)."""
        if not self.retired:
            self.retired = True
            self._owner._retired(self)

    def close(self) -> None:
        """Half-close; wait (up to CLOSE_TIMEOUT) for the replies in flight, then cancel."""
        with self._cond:
            self._retire()
            self._cond.notify_all()
        self._reader.join(CLOSE_TIMEOUT)
        if self._reader.is_alive():
            self._call.cancel()
            self._reader.join(CLOSE_TIMEOUT)


class StreamStub:
    """A ``LeaseServiceStub`` whose lease calls go on the lease stream (see the module).

    ``transport`` is ``stream`` or ``auto`` (``auto`` falls back to unary calls against
    a server without ``Session``). Calls not carried by the stream (Describe, List,
    Watch) go to the unary stub.
    """

    def __init__(self, channel: grpc.Channel, transport: Transport) -> None:
        self._unary = lease_pb2_grpc.LeaseServiceStub(channel)
        self._transport = transport
        self._lock = threading.Lock()
        self._stream: _Stream | None = None
        self._streams: set[_Stream] = set()
        self._closed = False
        #: The client's acquires, for the grants nobody waits for (under ``_lock``).
        self._acquires = _lease_stream.Acquires()
        #: Set once the server answered UNIMPLEMENTED to Session (``auto``: unary from then on).
        self.unary_only = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._unary, name)

    # -- the lease calls: the unary stub's signatures -------------------------------------

    def Acquire(self, request: Message, timeout: float) -> Message:
        return self._call("Acquire", request, timeout)

    def Renew(self, request: Message, timeout: float) -> Message:
        return self._call("Renew", request, timeout)

    def Release(self, request: Message, timeout: float) -> Message:
        return self._call("Release", request, timeout)

    def AcquireMany(self, request: Message, timeout: float) -> Message:
        return self._call("AcquireMany", request, timeout)

    def RenewMany(self, request: Message, timeout: float) -> Message:
        return self._call("RenewMany", request, timeout)

    def ReleaseMany(self, request: Message, timeout: float) -> Message:
        return self._call("ReleaseMany", request, timeout)

    @contextlib.contextmanager
    def acquiring(self, request_id: str) -> Iterator[None]:
        """Around an acquire whose attempts all carry ``request_id``: a grant of it is
        not released on the caller's behalf while the acquire goes on (see
        :class:`~fencing.client._lease_stream.Acquires`)."""
        with self._lock:
            self._acquires.begin(request_id)
        try:
            yield
        finally:
            with self._lock:
                releases = self._acquires.end(request_id)
            for release in releases:
                self._release_orphan(release)

    def _call(self, method: str, request: Message, timeout: float) -> Message:
        end = time.monotonic() + timeout
        if not self.unary_only or self._transport is Transport.STREAM:
            future: Future[Message] = Future()
            call = _lease_stream.session_call(method, request, timeout)
            request_id = _lease_stream.request_id_of(call)
            if request_id:
                with self._lock:
                    self._acquires.sent(request_id)
            queued = False
            try:
                stream = self._stream  # read without the lock: a retired one says so
                queued = stream is not None and stream.submit(call, future, end)
                queued = queued or self._submit(call, future, end)
            finally:
                if not queued and request_id:
                    with self._lock:
                        self._acquires.gone(request_id)
            try:
                return self._wait(future, end, timeout)
            except Fallback:
                pass
        result: Message = getattr(self._unary, method)(
            request, timeout=max(0.001, end - time.monotonic())
        )
        return result

    @staticmethod
    def _wait(future: Future[Message], end: float, timeout: float) -> Message:
        try:
            return future.result(max(0.0, end - time.monotonic()))
        except concurrent.futures.TimeoutError:
            if future.cancel():
                raise DeadlineExceededError(
                    f"deadline exceeded: no reply on the lease stream within {timeout:.3f} s"
                ) from None
        # The reply came as the wait ended: the caller's, not a grant for nobody.
        return future.result()

    def _submit(
        self, call: lease_pb2.SessionCall, future: Future[Message], end: float, moves: int = 0
    ) -> bool:
        """Queue ``call`` on the current stream (a new one if none); False if it cannot go
        on a stream (``future`` then has the refusal)."""
        while True:
            stream = self._current()
            if stream is None:  # closed, or the server has no Session
                future.set_exception(self._refusal())
                return False
            if stream.submit(call, future, end, moves):
                return True

    def _current(self) -> _Stream | None:
        with self._lock:
            if self._closed or self.unary_only:
                return None
            if self._stream is None:
                self._stream = _Stream(self)
                self._streams.add(self._stream)
            return self._stream

    # -- what the streams report ----------------------------------------------------------

    def _resubmit(self, move: Moved[Future[Message]]) -> None:
        """A call not sent before a goaway: on the next stream (its deadline as it was)."""
        queued = False
        try:
            if not move.waiter.done():
                end = time.monotonic() + move.call.deadline_ms / 1000
                queued = self._submit(move.call, move.waiter, end, move.moves)
        except Exception as exc:  # no room before its deadline: the caller's failure
            settle(move.waiter, exc)
        finally:
            request_id = _lease_stream.request_id_of(move.call)
            if not queued and request_id:  # never sent: no reply will come
                with self._lock:
                    self._acquires.gone(request_id)

    def _deliver(self, received: _lease_stream.Received[Future[Message]]) -> None:
        """Hand out the replies of one response; release the grants nobody can take."""
        with self._lock:
            releases = _lease_stream.deliver(received, self._acquires)
        for release in releases:
            self._release_orphan(release)

    def _release_orphan(self, call: lease_pb2.SessionCall) -> None:
        """Send the release of a grant nobody waits for (never waiting for room: from the
        reader thread; without room the lease expires by itself)."""
        with contextlib.suppress(DeadlineExceededError):
            self._submit(call, Future(), time.monotonic())

    def _retired(self, stream: _Stream) -> None:
        with self._lock:
            if self._stream is stream:
                self._stream = None

    def _ended(self, stream: _Stream, request_ids: list[str]) -> None:
        """``stream`` ended; the acquires among its calls left will have no reply."""
        with self._lock:
            self._streams.discard(stream)
            for request_id in request_ids:
                self._acquires.gone(request_id)

    def _broken(self, err: grpc.RpcError) -> Callable[[], Exception]:
        """The stream ended with ``err``: what each of its calls in flight fails with."""
        error = _lease_stream.ended_by(err)
        if error is not None:
            return error
        with self._lock:  # no Session here: remember it
            self.unary_only = True
        return self._refusal

    def _refusal(self) -> Exception:
        return _lease_stream.refusal(self._closed, self._transport)

    def close(self) -> None:
        """End every stream (the replies in flight get CLOSE_TIMEOUT to come)."""
        with self._lock:
            self._closed = True
            streams = list(self._streams)
        for stream in streams:
            stream.close()
