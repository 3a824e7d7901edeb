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
from fencing.types import (
    SESSION_MAX_IN_FLIGHT_KEY,
    SESSION_MAX_UPKEEP_IN_FLIGHT_KEY,
    UPKEEP_CALLS,
)
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


def _count(headers: Iterable[tuple[str, str | bytes]] | None, name: str) -> int | None:
    """The positive count of initial metadata ``name`` (None if absent or not one)."""
    for key, value in headers or ():
        if key == name:
            text = value.decode() if isinstance(value, bytes) else value
            if text.isdigit() and int(text) > 0:
                return int(text)
    return None


def max_in_flight_of(headers: Iterable[tuple[str, str | bytes]] | None) -> int:
    """The server's limit of calls in flight from a stream's initial metadata (the default
    if it says none): of acquires, if it keeps a limit apart for renewals and releases
    (:func:`max_upkeep_of`), else of every call."""
    found = _count(headers, SESSION_MAX_IN_FLIGHT_KEY)
    return DEFAULT_MAX_IN_FLIGHT if found is None else found


def max_upkeep_of(headers: Iterable[tuple[str, str | bytes]] | None) -> int | None:
    """The server's limit of renewals and releases in flight apart from the acquires, from
    a stream's initial metadata; None from a server without one (every call counts in
    :func:`max_in_flight_of`)."""
    return _count(headers, SESSION_MAX_UPKEEP_IN_FLIGHT_KEY)


class Moved(NamedTuple, Generic[W]):
    """A call a goaway moves to a new stream."""

    waiter: W
    call: lease_pb2.SessionCall
    moves: int


class Received(NamedTuple, Generic[W]):
    """What one SessionResponse does to a stream's calls: the replies to hand out (each
    with the request id of its call, empty but for an acquire's), and on a goaway (the
    stream then takes no new calls) the unsent calls to move and those to fail (moved
    too often, with their request ids)."""

    settled: list[tuple[W, lease_pb2.SessionReply, str]]
    goaway: bool
    moved: list[Moved[W]]
    failed: list[tuple[W, str]]


def request_id_of(call: lease_pb2.SessionCall) -> str:
    """The ``request_id`` of an acquire (one or many); empty for any other call."""
    which = call.WhichOneof("call")
    if which == "acquire":
        return call.acquire.request_id
    if which == "acquire_many":
        return call.acquire_many.request_id
    return ""


def grants_of(reply: lease_pb2.SessionReply) -> list[lease_pb2.Lease]:
    """The leases ``reply`` grants (none if it is no acquire's grant)."""
    which = reply.WhichOneof("outcome")
    if which == "acquired":
        return [reply.acquired]
    if which == "acquired_many":
        return list(reply.acquired_many.leases)
    return []


class Acquires:
    """Who may still take a grant, by the ``request_id`` of the acquire it answers: the
    acquires of one lease client on all its streams (the sync twin guards it with its
    stub's lock). I/O-free.

    Every attempt of one ``acquire`` carries the same request id, and the server answers
    a retry of a granted one with the same token (a replay). So a grant whose own caller
    stopped waiting (its attempt timed out, and the acquire tried again) may be the very
    lease another attempt of the same acquire is handed: it is released on the caller's
    behalf (:func:`deliver`) only if nobody can take it any more. It is kept while the
    acquire that sent it is still going (:meth:`begin`/:meth:`end`: it may be between
    attempts, and its next one would be answered with the token a release frees), and
    when a reply with the same request id and token was handed to a caller (the replies
    of an acquire's attempts come in the order the server finishes them, not the order
    they were sent). A kept grant the acquire never took is released when it ends.
    """

    __slots__ = ("_calls", "_kept", "_parked", "_plans")

    def __init__(self) -> None:
        #: Acquires going on, by request id (their attempts may still come).
        self._plans: dict[str, int] = {}
        #: Calls sent (or queued) without their outcome yet, by request id.
        self._calls: dict[str, int] = {}
        #: The grants handed to a caller, by request id: (resource, token).
        self._kept: dict[str, set[tuple[str, int]]] = {}
        #: Grants nobody waited for, kept while their acquire goes on.
        self._parked: dict[str, list[lease_pb2.Lease]] = {}

    def __len__(self) -> int:
        """Request ids remembered (none once every acquire ended and its calls came back)."""
        return len(self._plans.keys() | self._calls.keys() | self._kept.keys())

    def begin(self, request_id: str) -> None:
        """An acquire with ``request_id`` starts: its grants are kept until :meth:`end`."""
        self._plans[request_id] = self._plans.get(request_id, 0) + 1

    def end(self, request_id: str) -> list[lease_pb2.SessionCall]:
        """The acquire of ``request_id`` returned or gave up: the releases of the grants
        it left (none it was handed)."""
        left = self._plans.pop(request_id, 1) - 1
        if left:
            self._plans[request_id] = left
            return []
        kept = self._kept.get(request_id, set())
        parked = self._parked.pop(request_id, [])
        self._forget(request_id)
        return releases_of([g for g in parked if (g.resource, g.token) not in kept])

    def sent(self, request_id: str) -> None:
        """A call with ``request_id`` is queued on a stream (its outcome will come)."""
        if request_id:
            self._calls[request_id] = self._calls.get(request_id, 0) + 1

    def gone(self, request_id: str) -> None:
        """A call with ``request_id`` will have no reply (never sent, or its stream ended)."""
        if request_id:
            left = self._calls.pop(request_id, 1) - 1
            if left:
                self._calls[request_id] = left
            self._forget(request_id)

    def keeps(self, request_id: str, grant: lease_pb2.Lease) -> bool:
        """Whether a grant nobody waited for may still be someone's: its acquire goes on,
        or a caller was handed the same lease."""
        if not request_id:
            return False
        return request_id in self._plans or (grant.resource, grant.token) in self._kept.get(
            request_id, ()
        )

    def answered(
        self, waiter: Any, reply: lease_pb2.SessionReply, request_id: str
    ) -> list[lease_pb2.SessionCall]:
        """Hand ``reply`` to ``waiter`` (the call's caller, unless it gave up); the
        releases of the grants in it that nobody can take."""
        grants = grants_of(reply)
        added: set[tuple[str, int]] = set()
        if grants and request_id and not waiter.done():
            # Recorded before the caller wakes: its acquire may end at once.
            kept = self._kept.setdefault(request_id, set())
            added = {(g.resource, g.token) for g in grants} - kept
            kept |= added
        if settle(waiter, outcome(reply)):
            grants = []
        elif added:  # its caller gave up meanwhile: not handed out after all
            self._kept[request_id] -= added
        orphans: list[lease_pb2.Lease] = []
        for grant in grants:
            if not self.keeps(request_id, grant):
                orphans.append(grant)
            elif (grant.resource, grant.token) not in self._kept.get(request_id, ()):
                self._parked.setdefault(request_id, []).append(grant)
        if request_id:
            self.gone(request_id)
        return releases_of(orphans)

    def _forget(self, request_id: str) -> None:
        if request_id not in self._plans and not self._calls.get(request_id):
            self._kept.pop(request_id, None)
            self._parked.pop(request_id, None)


def deliver(received: Received[Any], acquires: Acquires) -> list[lease_pb2.SessionCall]:
    """Hand out the replies of ``received``, and fail the calls it could not move.

    Returns the releases to send for grants nobody can take (see :class:`Acquires`):
    the caller of an acquire gave up (its timeout, a cancelled task) while the server
    still had the call, since a stream cannot cancel one call as a unary RPC's
    cancellation does; the server granted it later, and the lease would otherwise
    block its resource for its whole ttl.
    """
    releases: list[lease_pb2.SessionCall] = []
    for waiter, reply, request_id in received.settled:
        releases += acquires.answered(waiter, reply, request_id)
    for waiter, request_id in received.failed:
        acquires.gone(request_id)
        settle(waiter, draining_error())
    return releases


def releases_of(grants: list[lease_pb2.Lease]) -> list[lease_pb2.SessionCall]:
    """The release of ``grants`` (none if empty), token-checked so it frees only them."""
    releases = [
        lease_pb2.ReleaseRequest(resource=g.resource, token=g.token, holder=g.holder)
        for g in grants
    ]
    if not releases:
        return []
    if len(releases) == 1:
        return [session_call("Release", releases[0], ORPHAN_RELEASE_TIMEOUT)]
    many = lease_pb2.ReleaseManyRequest(releases=releases)
    return [session_call("ReleaseMany", many, ORPHAN_RELEASE_TIMEOUT)]


def draining_error() -> Exception:
    """What a call fails with when every stream it is moved to is draining."""
    return BackendUnavailableError("the lease server is draining: every stream was moved away")


def is_upkeep(call: lease_pb2.SessionCall) -> bool:
    """A renewal or release (one or many): counted apart from the acquires where the
    server says so (:func:`max_upkeep_of`)."""
    return call.WhichOneof("call") in UPKEEP_CALLS


class SessionBook(StreamBook[tuple[lease_pb2.SessionCall, int], W]):
    """The calls of one lease stream: each queued with how many goaways moved it here.

    A call counts against the server's limit from the moment it is queued until its
    reply (or the stream's end): a caller gives up waiting without freeing its slot,
    since the server still has the call until it answers (at the call's deadline at the
    latest). Renewals and releases count in a limit of their own where the server keeps
    one (``max_upkeep``), so acquires waiting in line never hold up the renewal of a
    lease already held; else every call counts in ``max_in_flight``.
    """

    __slots__ = ("_request_ids", "_upkeep", "max_in_flight", "max_upkeep")

    def __init__(self) -> None:
        super().__init__()
        #: The request id of each acquire in the book, by call id.
        self._request_ids: dict[int, str] = {}
        #: The ids of the renewals and releases in the book.
        self._upkeep: set[int] = set()
        #: One call (the one that opens the stream) until the initial metadata says the
        #: server's limit (:meth:`limit`): callers arriving together must not overrun it.
        self.max_in_flight = 1
        self.max_upkeep: int | None = None

    def limit(self, headers: Iterable[tuple[str, str | bytes]] | None) -> None:
        """The stream's initial metadata came: take the server's limits from it."""
        self.max_in_flight = max_in_flight_of(headers)
        self.max_upkeep = max_upkeep_of(headers)

    def has_room(self, call: lease_pb2.SessionCall) -> bool:
        """Whether ``call`` may be queued now without passing the server's limit."""
        upkeep = len(self._upkeep)
        if self.max_upkeep is None:
            return len(self._waiting) < self.max_in_flight
        if is_upkeep(call):
            return upkeep < self.max_upkeep
        return len(self._waiting) - upkeep < self.max_in_flight

    def add_call(self, call: lease_pb2.SessionCall, waiter: W, moves: int = 0) -> None:
        """Queue ``call`` (its id set); ``waiter`` is handed back with its outcome.
        ``moves``: how many goaways moved it here from another stream."""
        call.id = self.add((call, moves), waiter)
        request_id = request_id_of(call)
        if request_id:
            self._request_ids[call.id] = request_id
        elif is_upkeep(call):
            self._upkeep.add(call.id)

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
        ids, upkeep = self._request_ids, self._upkeep
        settled = []
        for waiter, reply in self.settle(response.replies):
            upkeep.discard(reply.id)
            settled.append((waiter, reply, ids.pop(reply.id, "")))
        if not response.HasField("goaway"):
            return Received(settled, False, [], [])
        moved, failed = self.take_unsent()
        return Received(settled, True, moved, failed)

    def take_unsent(self) -> tuple[list[Moved[W]], list[tuple[W, str]]]:
        """A goaway: the calls not sent yet, to move to a new stream, and the waiters of
        those moved :data:`MAX_MOVES` times already (with their request ids), to fail
        with :func:`draining_error`."""
        moved: list[Moved[W]] = []
        failed: list[tuple[W, str]] = []
        for call_id, (call, moves), waiter in self.unsent():
            self._upkeep.discard(call_id)
            request_id = self._request_ids.pop(call_id, "")
            if moves < MAX_MOVES:
                moved.append(Moved(waiter, call, moves + 1))
            else:
                failed.append((waiter, request_id))
        return moved, failed

    def end(self) -> tuple[list[W], list[str]]:
        """The stream ended: every waiter still without a reply, and the request ids of
        the acquires among them."""
        request_ids = list(self._request_ids.values())
        self._request_ids.clear()
        self._upkeep.clear()
        return self.abandon(), request_ids
