"""The I/O-free half of the lease stream (``LeaseService.Session``), shared by the sync and
asyncio transports (:mod:`fencing.client.lease_stream`, :mod:`fencing.client.async_lease_stream`).

A lease client sends its lease calls (Acquire, Renew, Release and their batch forms)
as :class:`~fencing.v1.lease_pb2.SessionCall` messages on one stream per channel
instead of one unary RPC each. A :class:`SessionBook` keeps the calls of one open
stream (a :class:`~fencing.client._stream_book.StreamBook`): queued until the sender
packs everything waiting into one ``SessionRequest`` (several callers arriving together
share a message: that is where the stream's speed comes from), then in flight under an
id until the reader hands the reply back to the waiter of that id. What is the lease
stream's own: the server's limit on calls in flight (the stream's initial metadata),
and, when the server asks the client to move (goaway), the calls not yet sent given
back so they go out on a new stream.

What a call's reply or failure means is decided here too (:func:`outcome`): the same
result, or the same :mod:`fencing.errors` exception, the unary RPC would have given.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any, Generic, NamedTuple, TypeVar

import grpc
from google.protobuf.message import Message

from fencing import _status
from fencing.client._stream_book import StreamBook, settle
from fencing.errors import (
    BackendUnavailableError,
    DeadlineExceededError,
    FencingError,
    InvalidArgumentError,
)
from fencing.limits import MAX_DEADLINE_MS, MAX_SESSION_CALLS
from fencing.types import SESSION_MAX_IN_FLIGHT_KEY
from fencing.v1 import lease_pb2

W = TypeVar("W")  # what a transport wakes a caller with (a Future)

#: Calls in flight on a stream until its initial metadata says the server's limit.
DEFAULT_MAX_IN_FLIGHT = 64
#: Times a call not yet sent is moved to a new stream by a goaway before it fails
#: UNAVAILABLE instead (a server that drains every stream: the steps' backoff applies).
MAX_MOVES = 1
#: Seconds the release of a grant nobody waits for may take (see :func:`deliver`).
ORPHAN_RELEASE_TIMEOUT = 5.0
#: The environment variable that sets the default transport of lease clients.
TRANSPORT_ENV = "FENCING_TRANSPORT"


class Transport(StrEnum):
    """How a lease client sends its lease calls.

    ``auto`` (the default): on the lease stream, falling back to unary RPCs, for the
    life of the client, against a server without ``Session`` (an older server);
    ``stream``: on the stream only (against an older server every call fails with
    UNIMPLEMENTED); ``unary``: one unary RPC per call, as before the stream.
    """

    AUTO = "auto"
    STREAM = "stream"
    UNARY = "unary"


def transport_of(value: str | None) -> Transport:
    """Check the ``transport`` option; None is ``$FENCING_TRANSPORT``, else ``auto``."""
    if value is None:
        value = os.environ.get(TRANSPORT_ENV) or Transport.AUTO
    try:
        return Transport(value)
    except ValueError:
        choices = ", ".join(repr(t.value) for t in Transport)
        raise InvalidArgumentError(
            f"transport must be one of {choices}, got {value!r}", field="transport"
        ) from None


class Kind(NamedTuple):
    """A lease call as the stream carries it: the SessionCall field of its request, the
    SessionReply field of its result."""

    call: str
    reply: str


#: The stub methods that go on the stream, by name.
KINDS: dict[str, Kind] = {
    "Acquire": Kind("acquire", "acquired"),
    "Renew": Kind("renew", "renewed"),
    "Release": Kind("release", "released"),
    "AcquireMany": Kind("acquire_many", "acquired_many"),
    "RenewMany": Kind("renew_many", "renewed_many"),
    "ReleaseMany": Kind("release_many", "released_many"),
}


class StreamCallError(grpc.RpcError):
    """A status the SDK has no exception for (UNIMPLEMENTED...), answered on the stream or
    ending it; like the unary call's ``grpc.RpcError``, it has ``code()`` and ``details()``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class Fallback(Exception):
    """The server has no ``Session``: the call never reached a handler; send it unary."""


def deadline_ms_of(timeout: float) -> int:
    """A call's ``deadline_ms``: its timeout, rounded up to a whole millisecond (at least 1,
    at most the contract's :data:`~fencing.limits.MAX_DEADLINE_MS`)."""
    return min(MAX_DEADLINE_MS, max(1, math.ceil(timeout * 1000)))


def session_call(method: str, request: Message, timeout: float) -> lease_pb2.SessionCall:
    """``request`` (of stub method ``method``) as a SessionCall with its deadline (id set
    when it is queued)."""
    kind: dict[str, Any] = {KINDS[method].call: request}  # copied once, as it is built
    return lease_pb2.SessionCall(deadline_ms=deadline_ms_of(timeout), **kind)


def status_error(code: grpc.StatusCode | None, details: str) -> Exception:
    """The exception of a status without our ErrorInfo, as the unary call raises it."""
    known = _status.from_code(code, details)
    if known is not None:
        return known
    return StreamCallError(code or grpc.StatusCode.UNKNOWN, details)


def outcome(reply: lease_pb2.SessionReply) -> Message | Exception:
    """A reply as what the unary call would have returned, or the exception it raises."""
    which = reply.WhichOneof("outcome")
    if which is None:
        return BackendUnavailableError("the lease stream answered a call with nothing")
    if which != "error":
        result: Message = getattr(reply, which)
        return result
    ours = _status.from_status(reply.error)
    if ours is not None:
        return ours
    return status_error(_status.CODES.get(reply.error.code), reply.error.message)


def ended_error(err: Exception | None = None) -> Exception:
    """What the calls still in flight on a stream that ended fail with: their outcome is
    unknown (UNAVAILABLE, retried as the unary path retries it)."""
    why = f": {err}" if err is not None else ""
    return BackendUnavailableError(
        f"the lease stream ended before the reply{why}; the call may or may not have been done"
    )


def ended_by(err: grpc.RpcError) -> Callable[[], Exception] | None:
    """What each call in flight on a stream that ended with ``err`` fails with (one
    exception per call); None for UNIMPLEMENTED (the server has no Session: remember
    it, and see :func:`refusal`).

    The stream's own verdict (UNAUTHENTICATED, ...) is what the unary call would have
    said, and is raised as such; a stream that broke (UNAVAILABLE, a reset, a cancel,
    a server error) leaves its calls' outcome unknown: :func:`ended_error`.
    """
    call: Any = err
    if call.code() == grpc.StatusCode.UNIMPLEMENTED:
        return None

    def error() -> Exception:
        exc = _status.from_rpc_error(err)
        if isinstance(exc, FencingError) and not isinstance(
            exc, BackendUnavailableError | DeadlineExceededError
        ):
            return exc
        ended = ended_error(exc)
        # Chained as the unary path chains it, so a status no server of ours sent (a
        # refused connection) still reads as "unreachable", not as a backend outage.
        ended.__cause__ = err
        return ended

    return error


def refusal(closed: bool, transport: Transport) -> Exception:
    """Why a call cannot go on a stream: the client is closed, or the server has no
    Session (``auto``: :class:`Fallback`, send it unary; ``stream``: UNIMPLEMENTED)."""
    if closed:
        return BackendUnavailableError("the lease client is closed")
    if transport is Transport.STREAM:
        return StreamCallError(
            grpc.StatusCode.UNIMPLEMENTED,
            "the server has no lease stream (Session) and the client's transport is 'stream'",
        )
    return Fallback()


def max_in_flight_of(headers: Iterable[tuple[str, str | bytes]] | None) -> int:
    """The server's limit of calls in flight from a stream's initial metadata (the default
    if it says none)."""
    for key, value in headers or ():
        if key == SESSION_MAX_IN_FLIGHT_KEY:
            text = value.decode() if isinstance(value, bytes) else value
            if text.isdigit() and int(text) > 0:
                return int(text)
    return DEFAULT_MAX_IN_FLIGHT


class Moved(NamedTuple, Generic[W]):
    """A call a goaway moves to a new stream."""

    waiter: W
    call: lease_pb2.SessionCall
    moves: int


class Received(NamedTuple, Generic[W]):
    """What one SessionResponse does to a stream's calls: the replies to hand out, and on
    a goaway (the stream then takes no new calls) the unsent calls to move and those to
    fail (moved too often)."""

    settled: list[tuple[W, lease_pb2.SessionReply]]
    goaway: bool
    moved: list[Moved[W]]
    failed: list[W]


def deliver(received: Received[Any]) -> list[lease_pb2.SessionCall]:
    """Hand out the replies of ``received``, and fail the calls it could not move.

    Returns the releases to send for grants nobody waits for any more: the caller of
    an acquire gave up (its timeout, a cancelled task) while the server still had the
    call, since a stream cannot cancel one call as a unary RPC's cancellation does;
    the server granted it later, and the lease would otherwise block its resource for
    its whole ttl.
    """
    orphans: list[lease_pb2.SessionCall] = []
    for waiter, reply in received.settled:
        if waiter.done() or not settle(waiter, outcome(reply)):
            orphans += orphan_releases(reply)
    for waiter in received.failed:
        settle(waiter, draining_error())
    return orphans


def orphan_releases(reply: lease_pb2.SessionReply) -> list[lease_pb2.SessionCall]:
    """The release of the grant in ``reply`` (none if it granted nothing), token-checked
    so it frees only that grant."""
    which = reply.WhichOneof("outcome")
    if which == "acquired":
        grants = [reply.acquired]
    elif which == "acquired_many":
        grants = list(reply.acquired_many.leases)
    else:
        return []
    releases = [
        lease_pb2.ReleaseRequest(resource=g.resource, token=g.token, holder=g.holder)
        for g in grants
    ]
    if len(releases) == 1:
        return [session_call("Release", releases[0], ORPHAN_RELEASE_TIMEOUT)]
    many = lease_pb2.ReleaseManyRequest(releases=releases)
    return [session_call("ReleaseMany", many, ORPHAN_RELEASE_TIMEOUT)]


def draining_error() -> Exception:
    """What a call fails with when every stream it is moved to is draining."""
    return BackendUnavailableError("the lease server is draining: every stream was moved away")


class SessionBook(StreamBook[tuple[lease_pb2.SessionCall, int], W]):
    """The calls of one lease stream: each queued with how many goaways moved it here.

    A call counts against ``max_in_flight`` from the moment it is queued until its
    reply (or the stream's end): a caller gives up waiting without freeing its slot,
    since the server still has the call until it answers (at the call's deadline at the
    latest).
    """

    __slots__ = ("max_in_flight",)

    def __init__(self) -> None:
        super().__init__()
        #: One call (the one that opens the stream) until the initial metadata says the
        #: server's limit (:meth:`limit`): callers arriving together must not overrun it.
        self.max_in_flight = 1

    def limit(self, headers: Iterable[tuple[str, str | bytes]] | None) -> None:
        """The stream's initial metadata came: take the server's limit from it."""
        self.max_in_flight = max_in_flight_of(headers)

    @property
    def has_room(self) -> bool:
        return len(self._waiting) < self.max_in_flight

    def add_call(self, call: lease_pb2.SessionCall, waiter: W, moves: int = 0) -> None:
        """Queue ``call`` (its id set); ``waiter`` is handed back with its outcome.
        ``moves``: how many goaways moved it here from another stream."""
        call.id = self.add((call, moves), waiter)

    def message(self) -> lease_pb2.SessionRequest | None:
        """The next message: every call queued, up to :data:`MAX_SESSION_CALLS`; None
        if none is."""
        if not self._queued:
            return None
        return lease_pb2.SessionRequest(
            calls=[call for _, (call, _) in self.take(MAX_SESSION_CALLS)]
        )

    def receive(self, response: lease_pb2.SessionResponse) -> Received[W]:
        """Take in one response (see :class:`Received`; hand it on with :func:`deliver`)."""
        settled = self.settle(response.replies)
        if not response.HasField("goaway"):
            return Received(settled, False, [], [])
        moved, failed = self.take_unsent()
        return Received(settled, True, moved, failed)

    def take_unsent(self) -> tuple[list[Moved[W]], list[W]]:
        """A goaway: the calls not sent yet, to move to a new stream, and the waiters of
        those moved :data:`MAX_MOVES` times already, to fail with :func:`draining_error`."""
        moved: list[Moved[W]] = []
        failed: list[W] = []
        for _, (call, moves), waiter in self.unsent():
            if moves < MAX_MOVES:
                moved.append(Moved(waiter, call, moves + 1))
            else:
                failed.append(waiter)
        return moved, failed
