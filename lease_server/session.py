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

Limits: at most ``max_in_flight`` acquires (one or many) in flight per stream, and
apart from them at most ``max_in_flight`` renewals and releases
(:data:`~fencing.types.UPKEEP_CALLS`), so that acquires waiting in line never hold up
the renewal of a lease the client already holds (both sent to the client in initial
metadata, :data:`~fencing.types.SESSION_MAX_IN_FLIGHT_KEY` and
:data:`~fencing.types.SESSION_MAX_UPKEEP_IN_FLIGHT_KEY`; an older client, which
counts every call in the first, stays under both; a call beyond its limit is answered
``RESOURCE_EXHAUSTED``), at most
:data:`~fencing.limits.MAX_SESSION_CALLS` calls per message (``INVALID_ARGUMENT``
naming ``calls``, for each of them), ``deadline_ms`` per call
(``DEADLINE_EXCEEDED``; it cuts an acquire's wait short). :meth:`Sessions.drain`
(SIGTERM) sends each stream a ``goaway``, answers new calls ``UNAVAILABLE``, lets
the calls in flight finish, then ends the stream.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

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
from fencing.types import (
    SESSION_MAX_IN_FLIGHT_KEY,
    SESSION_MAX_UPKEEP_IN_FLIGHT_KEY,
    UPKEEP_CALLS,
)
from fencing.v1 import lease_pb2
from lease_server.leases import LeaseStep, StepOutcome
from lease_server.metrics import LeaseMetrics
from serving import deadlines
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


class Step(Protocol):
    """One call, validated, as one backend step: ``item`` is the step,
    ``finish(verdict)`` the call's answer (its metrics and log line; a refusal raised
    as the call's ``FencingError``), and ``failed()`` what a failed step counts. The
    service answers a call of its unary method through the same one."""

    @property
    def item(self) -> LeaseStep: ...

    def finish(self, outcome: StepOutcome) -> Message: ...

    def failed(self) -> None: ...

    def more(self, outcome: StepOutcome) -> Coroutine[Any, Any, Message] | None:
        """None if ``outcome`` decides the call (``finish`` answers it); else the rest
        of the call (an Acquire that found the resource held and may wait), which
        answers it: it runs in a task of its own, the per-client caps held."""
        ...


@dataclass(frozen=True)
class CallKind:
    """How one kind of call is answered: ``method``, the full name of the unary method it
    stands for (admitted and named in logs as that method), and ``answer``, the
    service's function shared with that method's handler. ``step``, for a kind whose
    calls may each be one backend step: a call validated as its :class:`Step` (its
    ``FencingError`` when invalid), for each call ``is_step`` says is one;
    ``may_go_on`` says which of those may go on past their step (an acquire that may
    wait: :meth:`Step.more`), and keep their admission until answered."""

    method: str
    answer: Callable[[Any], Awaitable[Message]]
    step: Callable[[Any], Step] | None = None
    is_step: Callable[[Any], bool] = lambda request: True
    #: Whether a call's step may go on past its first verdict (``Step.more``): such a
    #: call keeps what admitted it (a per-client slot) until it is answered, as its unary
    #: method does.
    may_go_on: Callable[[Any], bool] = lambda request: False


#: Decides the steps of one message together: their verdicts, in order.
Steps = Callable[[Sequence[LeaseStep]], Awaitable[list[StepOutcome]]]


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
        steps: Steps | None = None,
    ) -> None:
        unknown = set(kinds) ^ set(REPLY_FIELDS)
        if unknown:
            raise ValueError(f"session call kinds do not match the proto: {sorted(unknown)}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.kinds = kinds
        #: Without it, every call is answered alone through its kind's ``answer``.
        self.steps = steps
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
        cap = str(self.max_in_flight)
        await context.send_initial_metadata(
            ((SESSION_MAX_IN_FLIGHT_KEY, cap), (SESSION_MAX_UPKEEP_IN_FLIGHT_KEY, cap))
        )
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


def _deadline_passed(deadline_ms: int) -> DeadlineExceededError:
    return DeadlineExceededError(
        f"deadline_ms {deadline_ms} passed before the call was decided: its "
        "effect is unknown (retry an acquire with the same request_id)"
    )


class _Stepped:
    """A call of a message that is one backend step: decided with the others of its
    message (:meth:`_Stream._decide`), answered once."""

    __slots__ = ("admitted", "answered", "call_id", "deadline", "deadline_ms", "step", "which")

    def __init__(
        self,
        call_id: int,
        which: str,
        step: Step,
        deadline_ms: int,
        admitted: AbstractContextManager[None] | None,
    ) -> None:
        self.call_id = call_id
        self.which = which
        self.step = step
        #: The admission it holds until answered (a waiter slot), if any.
        self.admitted = admitted
        self.deadline_ms = deadline_ms
        #: When its deadline passes, on the loop's clock (0: none).
        self.deadline = (
            asyncio.get_running_loop().time() + deadline_ms / 1000 if deadline_ms else 0.0
        )
        self.answered = False


def _let_go(stepped: _Stepped) -> None:
    """Release what admitted ``stepped`` (its waiter slot), once."""
    admitted, stepped.admitted = stepped.admitted, None
    if admitted is not None:
        admitted.__exit__(None, None, None)


#: What a stream's writer takes from its queue: a reply, the goaway, the end (None),
#: or the error that ends the stream.
_Out = lease_pb2.SessionReply | lease_pb2.GoAway | BaseException | None


class _Stream:
    """One open Session: its calls in flight, by id, and the queue of what to send."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self.out: asyncio.Queue[_Out] = asyncio.Queue()
        #: The task answering each call in flight, by id (None for a moment: a call of a
        #: message being read, before the task deciding its message's steps exists).
        self.in_flight: dict[int, asyncio.Task[None] | None] = {}
        #: The ids of the renewals and releases among them (counted in a limit of their own).
        self.upkeep: set[int] = set()
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
        batch: list[_Stepped] = []
        for call in message.calls:
            started = self._start(call)
            if started is not None:
                batch.append(started)
        if batch:
            task = asyncio.create_task(self._decide(batch))
            for stepped in batch:
                self.in_flight[stepped.call_id] = task

    def _start(self, call: lease_pb2.SessionCall) -> _Stepped | None:
        """Admit ``call``: a refusal is its reply at once; a call that is one backend
        step is returned, to be decided with the others of its message; any other call
        runs in a task of its own."""
        which = call.WhichOneof("call")
        if which == "ping":
            self._reply(which, lease_pb2.SessionReply(id=call.id, pong=lease_pb2.Pong()))
            return None
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
            upkeep = which in UPKEEP_CALLS
            held = len(self.upkeep) if upkeep else len(self.in_flight) - len(self.upkeep)
            if held >= cap:
                what = "renewals and releases" if upkeep else "acquires"
                raise ResourceExhaustedError(
                    f"this stream already has {cap} {what} in flight, its limit: wait for "
                    "replies before sending more",
                    limit="session_in_flight",
                )
            deadline_ms = limits.check_deadline_ms(call.deadline_ms)
            kind = self.sessions.kinds[which]
            request = getattr(call, which)
            step, admitted = self._step(kind, request)
        except FencingError as exc:
            self._error(which or "none", call.id, exc)
            return None
        except Exception:
            # A fault of ours (a validation bug): this call's INTERNAL, the stream goes on.
            known = self.sessions.kinds.get(which or "")
            method = known.method if known is not None else ""
            self._reply(which or "none", self._internal(which or "none", method, call.id))
            return None
        if upkeep:
            self.upkeep.add(call.id)
        if step is not None:
            # In flight from now: the task deciding its message is filled in once it exists.
            self.in_flight[call.id] = None
            return _Stepped(call.id, which, step, deadline_ms, admitted)
        self.in_flight[call.id] = asyncio.create_task(
            self._run(call.id, which, kind, request, deadline_ms)
        )
        return None

    def _step(
        self, kind: CallKind, request: Any
    ) -> tuple[Step | None, AbstractContextManager[None] | None]:
        """``request`` as one step, admitted then validated as its unary method is, or
        None; and, for a call that may go on past its step, its admission, held (the
        caller lets it go once the call is answered)."""
        if kind.step is None or self.sessions.steps is None or not kind.is_step(request):
            return None, None
        admitted = admit_call(kind.method, request)
        admitted.__enter__()
        try:
            step = kind.step(request)
        except BaseException:
            admitted.__exit__(*sys.exc_info())
            raise
        if kind.may_go_on(request):
            return step, admitted
        admitted.__exit__(None, None, None)
        return step, None

    async def _decide(self, batch: list[_Stepped]) -> None:
        """Decide the steps of one message together and answer each call; a call whose
        ``deadline_ms`` passes first is answered ``DEADLINE_EXCEEDED`` then (its step
        goes on: its effect is unknown, as for a unary call cut off)."""
        assert self.sessions.steps is not None
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None

        def expire() -> None:
            nonlocal timer
            now = loop.time()
            for stepped in batch:
                if stepped.deadline and stepped.deadline <= now and not stepped.answered:
                    self._settle(stepped, _deadline_passed(stepped.deadline_ms))
            due = [b.deadline for b in batch if b.deadline and not b.answered]
            timer = loop.call_at(min(due), expire) if due else None
            self._end_if_done()  # a draining stream ends once its calls are answered

        if any(stepped.deadline for stepped in batch):
            timer = loop.call_at(min(b.deadline for b in batch if b.deadline), expire)
        try:
            verdicts: list[StepOutcome] | None = await self.sessions.steps(
                [stepped.step.item for stepped in batch]
            )
            failure: BaseException | None = None
        except FencingError as exc:
            verdicts, failure = None, exc
        except Exception as exc:
            log.error("Session step failed", exc_info=True)
            verdicts, failure = None, exc
        except BaseException:  # cancelled with the stream: nobody will answer them
            for stepped in batch:
                _let_go(stepped)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        for i, stepped in enumerate(batch):
            if stepped.answered:
                continue
            if verdicts is None:
                stepped.step.failed()
                self._settle(stepped, failure)
                continue
            try:
                more = stepped.step.more(verdicts[i])
                if more is not None:
                    self.in_flight[stepped.call_id] = asyncio.create_task(
                        self._go_on(stepped, more)
                    )
                    continue
                self._settle(stepped, stepped.step.finish(verdicts[i]))
            except FencingError as exc:
                self._settle(stepped, exc)
            except Exception as exc:
                log.error(
                    "Session %s failed",
                    stepped.which,
                    exc_info=True,
                    extra={"handler": self.sessions.kinds[stepped.which].method},
                )
                self._settle(stepped, exc)
        self._end_if_done()

    async def _go_on(self, stepped: _Stepped, more: Coroutine[Any, Any, Message]) -> None:
        """The rest of a stepped call, in a task of its own: answered as a call of the
        ``_run`` path is (its caps held as its unary method holds them, its deadline
        the one it came with)."""
        kind = self.sessions.kinds[stepped.which]
        outcome: Message | BaseException
        try:
            if stepped.deadline:
                left = stepped.deadline - asyncio.get_running_loop().time()
                outcome = await self._within(stepped.deadline_ms, more, left)
            else:
                outcome = await more
        except FencingError as exc:
            outcome = exc
        except Exception as exc:
            log.error(
                "Session %s failed", stepped.which, exc_info=True, extra={"handler": kind.method}
            )
            outcome = exc
        finally:
            _let_go(stepped)  # answered below, or cancelled with the stream
        self._settle(stepped, outcome)
        self._end_if_done()

    def _settle(self, stepped: _Stepped, outcome: Message | BaseException | None) -> None:
        """Answer one call of a batch with its result or error (another exception:
        INTERNAL, already logged); it is no longer in flight."""
        stepped.answered = True
        _let_go(stepped)
        self._answered(stepped.call_id)
        which = stepped.which
        if isinstance(outcome, FencingError):
            reply = lease_pb2.SessionReply(id=stepped.call_id, error=_status.to_status(outcome))
        elif isinstance(outcome, Message):
            result: dict[str, Any] = {REPLY_FIELDS[which]: outcome}
            reply = lease_pb2.SessionReply(id=stepped.call_id, **result)
        else:
            reply = lease_pb2.SessionReply(id=stepped.call_id, error=_INTERNAL)
        self._reply(which, reply)

    def _internal(self, which: str, method: str, call_id: int) -> lease_pb2.SessionReply:
        log.error("Session %s failed", which, exc_info=True, extra={"handler": method})
        return lease_pb2.SessionReply(id=call_id, error=_INTERNAL)

    async def _run(
        self, call_id: int, which: str, kind: CallKind, request: Any, deadline_ms: int
    ) -> None:
        try:
            reply = await self._answer(call_id, which, kind, request, deadline_ms)
        finally:
            self._answered(call_id)
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
    async def _within(
        deadline_ms: int, answer: Awaitable[Message], left: float | None = None
    ) -> Message:
        """``answer`` within ``left`` seconds (default ``deadline_ms``);
        ``DeadlineExceededError`` once they pass."""
        deadline = deadlines.within(deadline_ms / 1000 if left is None else left)
        try:
            with deadline:
                return await answer
        except TimeoutError:
            if not deadline.expired():
                raise
            raise _deadline_passed(deadline_ms) from None

    def _answered(self, call_id: int) -> None:
        """``call_id`` is no longer in flight."""
        del self.in_flight[call_id]
        self.upkeep.discard(call_id)

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
        for task in set(self.in_flight.values()):
            if task is not None:
                task.cancel()
