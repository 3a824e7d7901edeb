"""``LeaseService.Session``: a client's lease calls over one bidirectional stream.

Each ``SessionCall`` is a unary call in another envelope. The service answers it
with the very function its unary handler runs (validation at the edge, admission of
the call as its unary method: authorization, ``holder`` bound to the principal, the
per-client waiter cap; ``waited_ms``, metrics, logs), and the reply bearing the
call's id carries the result, or the unary call's error as a ``google.rpc.Status``
(:func:`fencing._status.to_status`). Calls run concurrently, so a waiting acquire
holds up nothing else on the stream, and replies come in the order calls finish;
replies ready together share one ``SessionResponse``.

A stream keeps nothing but its calls in flight: a broken stream's calls have unknown
outcomes, and a client retries them on a new stream, to any server (an acquire with
the same ``request_id`` and holder returns the lease already granted).

Limits: at most ``max_in_flight`` calls in flight per stream (sent to the client in
initial metadata :data:`~fencing.types.SESSION_MAX_IN_FLIGHT_KEY`; a call beyond
it is answered ``RESOURCE_EXHAUSTED``), at most
:data:`~fencing.limits.MAX_SESSION_CALLS` calls per message (``INVALID_ARGUMENT``
naming ``calls``, for each of them), ``deadline_ms`` per call
(``DEADLINE_EXCEEDED``; it cuts an acquire's wait short). :meth:`Sessions.drain`
(SIGTERM) sends each stream a ``goaway``, answers new calls ``UNAVAILABLE``, lets
the calls in flight finish, then ends the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message
from google.rpc import status_pb2
from prometheus_client import CollectorRegistry, Counter

from fencing import _status, limits
from fencing.errors import (
    BackendUnavailableError,
    DeadlineExceededError,
    FencingError,
    InvalidArgumentError,
    ResourceExhaustedError,
)
from fencing.types import SESSION_MAX_IN_FLIGHT_KEY
from fencing.v1 import lease_pb2
from lease_server.metrics import LeaseMetrics
from serving.admission import DEFAULT_MAX_SESSION_IN_FLIGHT, admit_call

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

#: The SessionCall field of each kind of call -> the SessionReply field of its result.
REPLY_FIELDS: Mapping[str, str] = {
    "acquire": "acquired",
    "renew": "renewed",
    "release": "released",
    "acquire_many": "acquired_many",
    "renew_many": "renewed_many",
    "release_many": "released_many",
}


@dataclass(frozen=True)
class CallKind:
    """How one kind of call is answered: ``method``, the full name of the unary method it
    stands for (admitted and named in logs as that method), and ``answer``, the
    service's function shared with that method's handler."""

    method: str
    answer: Callable[[Any], Awaitable[Message]]


_INTERNAL = status_pb2.Status(
    code=grpc.StatusCode.INTERNAL.value[0], message="internal error: see the server's log"
)


class Sessions:
    """The Session streams of one service: ``serve`` runs one, ``drain`` moves them all."""

    def __init__(
        self,
        kinds: Mapping[str, CallKind],
        max_in_flight: int = DEFAULT_MAX_SESSION_IN_FLIGHT,
        metrics: LeaseMetrics | None = None,
    ) -> None:
        unknown = set(kinds) ^ set(REPLY_FIELDS)
        if unknown:
            raise ValueError(f"session call kinds do not match the proto: {sorted(unknown)}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.kinds = kinds
        self.max_in_flight = max_in_flight
        self.metrics = metrics or LeaseMetrics(CollectorRegistry())
        self._codes = {code.value[0]: code.name for code in grpc.StatusCode}
        self._counters: dict[tuple[str, int], Counter] = {}
        self.draining = False
        self._open: set[_Stream] = set()

    @property
    def open_streams(self) -> int:
        return len(self._open)

    def count(self, kind: str, reply: lease_pb2.SessionReply) -> None:
        """Count an answered call of ``kind`` (its SessionCall field) by its code."""
        code = reply.error.code if reply.WhichOneof("outcome") == "error" else 0
        counter = self._counters.get((kind, code))
        if counter is None:
            name = self._codes.get(code, "UNKNOWN")
            counter = self._counters[kind, code] = self.metrics.session_calls.labels(kind, name)
        counter.inc()

    def drain(self, reason: str = "draining") -> None:
        """Tell every stream (and every stream opened from now) to move: a goaway, new
        calls answered UNAVAILABLE, the stream ended once its calls in flight finish."""
        self.draining = True
        for stream in list(self._open):
            stream.drain(reason)

    async def serve(
        self, requests: AsyncIterator[lease_pb2.SessionRequest], context: Context
    ) -> AsyncIterator[lease_pb2.SessionResponse]:
        """The replies of one stream, until the client half-closes and every call is
        answered, or the server drains; a message the server cannot read ends it
        with that error (``INVALID_ARGUMENT`` for bytes that are no SessionRequest)."""
        stream = _Stream(self)
        await context.send_initial_metadata(((SESSION_MAX_IN_FLIGHT_KEY, str(self.max_in_flight)),))
        self._open.add(stream)
        self.metrics.session_streams.set(len(self._open))
        if self.draining:
            stream.drain("draining")
        reader = asyncio.create_task(stream.read(requests))
        try:
            while True:
                items = [await stream.out.get()]
                while not stream.out.empty():
                    items.append(stream.out.get_nowait())
                response = lease_pb2.SessionResponse()
                end: BaseException | bool = False
                for item in items:
                    if isinstance(item, lease_pb2.SessionReply):
                        response.replies.append(item)
                    elif isinstance(item, lease_pb2.GoAway):
                        response.goaway.CopyFrom(item)
                    else:
                        end = item or True
                if response.replies or response.HasField("goaway"):
                    yield response
                if isinstance(end, FencingError):
                    await _status.abort(context, end)
                if isinstance(end, BaseException):
                    raise end
                if end:
                    return
        finally:
            self._open.discard(stream)
            self.metrics.session_streams.set(len(self._open))
            reader.cancel()
            stream.cancel()


#: What a stream's writer takes from its queue: a reply, the goaway, the end (None),
#: or the error that ends the stream.
_Out = lease_pb2.SessionReply | lease_pb2.GoAway | BaseException | None


class _Stream:
    """One open Session: its calls in flight, by id, and the queue of what to send."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self.out: asyncio.Queue[_Out] = asyncio.Queue()
        self.in_flight: dict[int, asyncio.Task[None]] = {}
        self.read_all = False
        self.draining = False
        self.ended = False

    async def read(self, requests: AsyncIterator[lease_pb2.SessionRequest]) -> None:
        try:
            async for message in requests:
                self.receive(message)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.out.put_nowait(exc)
            return
        self.read_all = True
        self._end_if_done()

    def receive(self, message: lease_pb2.SessionRequest) -> None:
        try:
            limits.check_session_calls(len(message.calls))
        except InvalidArgumentError as exc:
            for call in message.calls:
                self._error(call.WhichOneof("call") or "none", call.id, exc)
            return
        for call in message.calls:
            self._start(call)

    def _start(self, call: lease_pb2.SessionCall) -> None:
        which = call.WhichOneof("call")
        if which == "ping":
            self._reply(which, lease_pb2.SessionReply(id=call.id, pong=lease_pb2.Pong()))
            return
        try:
            if which is None:
                raise InvalidArgumentError(
                    "a call must set one of " + ", ".join([*REPLY_FIELDS, "ping"]), field="call"
                )
            if self.draining:
                raise BackendUnavailableError(
                    "the lease server is draining: send new calls on a new stream"
                )
            if call.id in self.in_flight:
                raise InvalidArgumentError(
                    f"call id {call.id} is already in flight on this stream", field="id"
                )
            cap = self.sessions.max_in_flight
            if len(self.in_flight) >= cap:
                raise ResourceExhaustedError(
                    f"this stream already has {cap} calls in flight, its limit: wait for "
                    "replies before sending more",
                    limit="session_in_flight",
                )
            deadline_ms = limits.check_deadline_ms(call.deadline_ms)
        except FencingError as exc:
            self._error(which or "none", call.id, exc)
            return
        kind = self.sessions.kinds[which]
        request = getattr(call, which)
        self.in_flight[call.id] = asyncio.create_task(
            self._run(call.id, which, kind, request, deadline_ms)
        )

    async def _run(
        self, call_id: int, which: str, kind: CallKind, request: Any, deadline_ms: int
    ) -> None:
        try:
            reply = await self._answer(call_id, which, kind, request, deadline_ms)
        finally:
            del self.in_flight[call_id]
        self._reply(which, reply)
        self._end_if_done()

    async def _answer(
        self, call_id: int, which: str, kind: CallKind, request: Any, deadline_ms: int
    ) -> lease_pb2.SessionReply:
        try:
            with admit_call(kind.method, request):
                if deadline_ms:
                    result = await self._within(deadline_ms, kind.answer(request))
                else:  # no timer to arm: the common case, kept cheap
                    result = await kind.answer(request)
        except FencingError as exc:
            return lease_pb2.SessionReply(id=call_id, error=_status.to_status(exc))
        except Exception:
            # As a unary handler's (serving.server.rpc): logged once with its traceback,
            # answered INTERNAL without its text.
            log.error("Session %s failed", which, exc_info=True, extra={"handler": kind.method})
            return lease_pb2.SessionReply(id=call_id, error=_INTERNAL)
        outcome: dict[str, Any] = {REPLY_FIELDS[which]: result}
        return lease_pb2.SessionReply(id=call_id, **outcome)

    @staticmethod
    async def _within(deadline_ms: int, answer: Awaitable[Message]) -> Message:
        timer = asyncio.timeout(deadline_ms / 1000)
        try:
            async with timer:
                return await answer
        except TimeoutError:
            if not timer.expired():
                raise
            raise DeadlineExceededError(
                f"deadline_ms {deadline_ms} passed before the call was decided: its "
                "effect is unknown (retry an acquire with the same request_id)"
            ) from None

    def _error(self, kind: str, call_id: int, exc: FencingError) -> None:
        self._reply(kind, lease_pb2.SessionReply(id=call_id, error=_status.to_status(exc)))

    def _reply(self, kind: str, reply: lease_pb2.SessionReply) -> None:
        if not self.ended:
            self.sessions.count(kind, reply)
            self.out.put_nowait(reply)

    def _send(self, item: _Out) -> None:
        if not self.ended:
            self.out.put_nowait(item)

    def _end_if_done(self) -> None:
        if (self.read_all or self.draining) and not self.in_flight and not self.ended:
            self._send(None)
            self.ended = True

    def drain(self, reason: str) -> None:
        if self.draining:
            return
        self.draining = True
        self._send(lease_pb2.GoAway(reason=reason))
        self._end_if_done()

    def cancel(self) -> None:
        for task in list(self.in_flight.values()):
            task.cancel()
