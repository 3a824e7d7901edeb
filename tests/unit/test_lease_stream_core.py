"""The I/O-free half of the lease stream: the book of calls, what a reply means, the
transport option."""

from __future__ import annotations

import concurrent.futures

import grpc
import pytest

from fencing import _status
from fencing.client import _lease_stream
from fencing.client._lease_stream import Fallback, SessionBook, StreamCallError, Transport
from fencing.errors import (
    BackendUnavailableError,
    DeadlineExceededError,
    InvalidArgumentError,
    LeaseHeldError,
    UnauthenticatedError,
)
from fencing.limits import MAX_DEADLINE_MS, MAX_SESSION_CALLS
from fencing.types import SESSION_MAX_IN_FLIGHT_KEY, SESSION_MAX_UPKEEP_IN_FLIGHT_KEY
from fencing.v1 import lease_pb2


def acquire_call(resource: str = "r", timeout: float = 1.5) -> lease_pb2.SessionCall:
    request = lease_pb2.AcquireRequest(resource=resource, holder="h", ttl_ms=1000)
    return _lease_stream.session_call("Acquire", request, timeout)


def test_a_call_carries_its_request_and_its_deadline() -> None:
    call = acquire_call("orders", timeout=0.0004)
    assert call.WhichOneof("call") == "acquire"
    assert call.acquire.resource == "orders"
    assert call.deadline_ms == 1  # rounded up, never 0 (that would be no deadline)
    assert acquire_call(timeout=10 * 3600).deadline_ms == MAX_DEADLINE_MS
    for method, kind in _lease_stream.KINDS.items():
        assert kind.call in lease_pb2.SessionCall.DESCRIPTOR.fields_by_name, method
        assert kind.reply in lease_pb2.SessionReply.DESCRIPTOR.fields_by_name, method


def test_what_arrives_together_goes_in_one_message_and_each_reply_finds_its_waiter() -> None:
    book: SessionBook[str] = SessionBook()
    book.limit([(SESSION_MAX_IN_FLIGHT_KEY, "10")])
    for name in ("a", "b", "c"):
        book.add_call(acquire_call(name), f"waiter-{name}")
    message = book.message()
    assert message is not None
    assert [c.acquire.resource for c in message.calls] == ["a", "b", "c"]
    assert len({c.id for c in message.calls}) == 3
    assert book.message() is None
    ids = {c.acquire.resource: c.id for c in message.calls}
    response = lease_pb2.SessionResponse(
        replies=[
            lease_pb2.SessionReply(id=ids["c"], acquired=lease_pb2.Lease(token=7)),
            lease_pb2.SessionReply(id=ids["a"], error=_status.to_status(LeaseHeldError("a"))),
            lease_pb2.SessionReply(id=999, acquired=lease_pb2.Lease(token=1)),  # not ours
        ]
    )
    settled = {w: _lease_stream.outcome(reply) for w, reply in book.settle(response.replies)}
    assert set(settled) == {"waiter-c", "waiter-a"}
    assert settled["waiter-c"] == lease_pb2.Lease(token=7)
    assert isinstance(settled["waiter-a"], LeaseHeldError)
    assert book.in_flight == 1
    assert book.abandon() == ["waiter-b"]


def test_a_message_holds_at_most_the_contracts_calls() -> None:
    book: SessionBook[int] = SessionBook()
    book.limit([(SESSION_MAX_IN_FLIGHT_KEY, str(MAX_SESSION_CALLS + 5))])
    for i in range(MAX_SESSION_CALLS + 5):
        book.add_call(acquire_call(f"r{i}"), i)
    first, second = book.message(), book.message()
    assert first is not None and second is not None
    assert (len(first.calls), len(second.calls)) == (MAX_SESSION_CALLS, 5)


def test_one_call_in_flight_until_the_server_says_its_limit() -> None:
    book: SessionBook[int] = SessionBook()
    rooms = [book.has_room(acquire_call())]
    book.add_call(acquire_call(), 1)
    rooms.append(book.has_room(acquire_call()))
    assert rooms == [True, False]  # the others wait for the initial metadata
    book.limit([(SESSION_MAX_IN_FLIGHT_KEY, b"3")])
    book.add_call(acquire_call(), 2)
    book.add_call(acquire_call(), 3)
    assert not book.has_room(acquire_call())
    assert not book.has_room(renew_call())  # one limit for every call: an older server
    book.limit([])  # a server that says nothing: the default
    assert book.max_in_flight == _lease_stream.DEFAULT_MAX_IN_FLIGHT


def renew_call() -> lease_pb2.SessionCall:
    request = lease_pb2.RenewRequest(resource="r", token=1, ttl_ms=1000)
    return _lease_stream.session_call("Renew", request, 1.0)


def release_call() -> lease_pb2.SessionCall:
    request = lease_pb2.ReleaseRequest(resource="r", token=1)
    return _lease_stream.session_call("Release", request, 1.0)


def test_renewals_and_releases_have_a_limit_apart_from_the_acquires() -> None:
    book: SessionBook[int] = SessionBook()
    book.limit([(SESSION_MAX_IN_FLIGHT_KEY, "2"), (SESSION_MAX_UPKEEP_IN_FLIGHT_KEY, b"2")])
    book.add_call(acquire_call(), 1)
    book.add_call(acquire_call(), 2)
    assert not book.has_room(acquire_call())  # acquires waiting in line fill theirs
    assert book.has_room(renew_call())
    book.add_call(renew_call(), 3)
    assert book.has_room(release_call())
    book.add_call(release_call(), 4)
    assert not book.has_room(renew_call())
    book.message()
    (reply,) = book.receive(
        lease_pb2.SessionResponse(
            replies=[lease_pb2.SessionReply(id=3, renewed=lease_pb2.Lease(token=1))]
        )
    ).settled
    assert reply[0] == 3
    assert book.has_room(renew_call())
    assert not book.has_room(acquire_call())


def test_a_goaway_moves_the_unsent_calls_once_then_fails_them() -> None:
    book: SessionBook[str] = SessionBook()
    book.limit([(SESSION_MAX_IN_FLIGHT_KEY, "10")])
    book.add_call(acquire_call("sent"), "sent")
    book.message()
    book.add_call(acquire_call("fresh"), "fresh")
    book.add_call(acquire_call("moved-before"), "moved-before", moves=_lease_stream.MAX_MOVES)
    moved, failed = book.take_unsent()
    assert [(m.waiter, m.moves) for m in moved] == [("fresh", 1)]
    assert failed == [("moved-before", "")]
    assert isinstance(_lease_stream.draining_error(), BackendUnavailableError)
    assert book.queued == 0
    assert book.abandon() == ["sent"]  # in flight: its reply still comes on this stream


def test_replies_mean_what_the_unary_call_would_have_said() -> None:
    ok = lease_pb2.SessionReply(id=1, released=lease_pb2.ReleaseResponse())
    assert _lease_stream.outcome(ok) == lease_pb2.ReleaseResponse()
    deadline = lease_pb2.SessionReply(id=2, error=_status.to_status(DeadlineExceededError("late")))
    assert isinstance(_lease_stream.outcome(deadline), DeadlineExceededError)
    bare = lease_pb2.SessionReply(id=3)
    bare.error.code = grpc.StatusCode.UNAVAILABLE.value[0]
    bare.error.message = "draining"
    assert isinstance(_lease_stream.outcome(bare), BackendUnavailableError)
    odd = lease_pb2.SessionReply(id=4)
    odd.error.code = grpc.StatusCode.UNIMPLEMENTED.value[0]
    unknown = _lease_stream.outcome(odd)
    assert isinstance(unknown, StreamCallError)
    assert unknown.code() == grpc.StatusCode.UNIMPLEMENTED
    assert isinstance(_lease_stream.outcome(lease_pb2.SessionReply(id=5)), BackendUnavailableError)


def test_a_stream_that_ends_fails_its_calls_as_unavailable_or_with_its_own_verdict() -> None:
    ended = _lease_stream.ended_by(StreamCallError(grpc.StatusCode.UNAVAILABLE, "reset"))
    assert ended is not None
    assert isinstance(ended(), BackendUnavailableError)
    assert ended() is not ended()  # one exception per waiter
    cancelled = _lease_stream.ended_by(StreamCallError(grpc.StatusCode.CANCELLED, "gone"))
    assert cancelled is not None
    assert isinstance(cancelled(), BackendUnavailableError)  # outcome unknown: retried
    refused = _lease_stream.ended_by(StreamCallError(grpc.StatusCode.UNAUTHENTICATED, "who?"))
    assert refused is not None
    assert isinstance(refused(), UnauthenticatedError)  # as the unary call says it
    old = StreamCallError(grpc.StatusCode.UNIMPLEMENTED, "old server")
    assert _lease_stream.ended_by(old) is None
    assert isinstance(_lease_stream.refusal(False, Transport.AUTO), Fallback)
    strict = _lease_stream.refusal(False, Transport.STREAM)
    assert isinstance(strict, StreamCallError)
    assert strict.code() == grpc.StatusCode.UNIMPLEMENTED
    assert isinstance(_lease_stream.refusal(True, Transport.AUTO), BackendUnavailableError)


def test_the_transport_option_and_its_environment_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_lease_stream.TRANSPORT_ENV, raising=False)
    assert _lease_stream.transport_of(None) is Transport.AUTO
    monkeypatch.setenv(_lease_stream.TRANSPORT_ENV, "unary")
    assert _lease_stream.transport_of(None) is Transport.UNARY
    assert _lease_stream.transport_of("stream") is Transport.STREAM
    with pytest.raises(InvalidArgumentError) as bad:
        _lease_stream.transport_of("tcp")
    assert bad.value.field == "transport"


class FakeWaiter:
    def __init__(self, done: bool = False) -> None:
        self.gone = done
        self.results: list[object] = []

    def done(self) -> bool:
        return self.gone or bool(self.results)

    def set_result(self, result: object) -> None:
        self.results.append(result)

    def set_exception(self, exception: BaseException) -> None:
        self.results.append(exception)


grant = lease_pb2.Lease(resource="r", holder="h", token=4)
other = lease_pb2.Lease(resource="s", holder="h", token=5)


def delivered(
    waiters: list[FakeWaiter], replies: list[lease_pb2.SessionReply]
) -> list[lease_pb2.SessionCall]:
    """The releases :func:`deliver` asks for after handing ``replies`` to the calls of
    ``waiters`` (ids 1, 2...), sent on one stream."""
    book: SessionBook[FakeWaiter] = SessionBook()
    book.limit([(SESSION_MAX_IN_FLIGHT_KEY, "10")])
    for waiter in waiters:
        book.add_call(acquire_call(), waiter)
    book.message()
    received = book.receive(lease_pb2.SessionResponse(replies=replies))
    return _lease_stream.deliver(received, _lease_stream.Acquires())


def test_a_grant_whose_caller_gave_up_is_released_and_nothing_else_is() -> None:
    waiting, gone_acquire, gone_many, gone_renew = (
        FakeWaiter(),
        FakeWaiter(done=True),
        FakeWaiter(done=True),
        FakeWaiter(done=True),
    )
    orphans = delivered(
        [waiting, gone_acquire, gone_many, gone_renew],
        [
            lease_pb2.SessionReply(id=1, acquired=grant),
            lease_pb2.SessionReply(id=2, acquired=grant),
            lease_pb2.SessionReply(
                id=3, acquired_many=lease_pb2.AcquireManyResponse(leases=[grant, other])
            ),
            lease_pb2.SessionReply(id=4, renewed=grant),
        ],
    )
    assert waiting.results == [grant]
    assert [o.WhichOneof("call") for o in orphans] == ["release", "release_many"]
    assert (orphans[0].release.resource, orphans[0].release.token) == ("r", 4)
    assert orphans[0].release.holder == "h"
    assert [r.token for r in orphans[1].release_many.releases] == [4, 5]


class CancelledMeanwhile(FakeWaiter):
    """A thread's future its caller cancels (its timeout) just as the reader hands it a
    reply: not done when asked, refusing the result a moment later."""

    def set_result(self, result: object) -> None:
        raise concurrent.futures.InvalidStateError("CANCELLED")


def test_a_grant_whose_caller_gives_up_while_it_is_handed_out_is_released() -> None:
    racing, waiting = CancelledMeanwhile(), FakeWaiter()
    orphans = delivered(
        [racing, waiting],
        [
            lease_pb2.SessionReply(id=1, acquired=grant),
            lease_pb2.SessionReply(id=2, acquired=other),
        ],
    )
    assert [(o.release.resource, o.release.token) for o in orphans] == [("r", 4)]
    assert waiting.results == [other]


# -- a grant nobody waits for, by request id -------------------------------------------


def acquire_with_id(request_id: str) -> lease_pb2.SessionCall:
    request = lease_pb2.AcquireRequest(resource="r", holder="h", ttl_ms=1000, request_id=request_id)
    return _lease_stream.session_call("Acquire", request, 1.0)


class Client:
    """One stream's book and the client's acquires, as a twin drives them."""

    def __init__(self) -> None:
        self.book: SessionBook[FakeWaiter] = SessionBook()
        self.book.limit([(SESSION_MAX_IN_FLIGHT_KEY, "10")])
        self.acquires = _lease_stream.Acquires()

    def send(self, request_id: str, waiter: FakeWaiter) -> int:
        call = acquire_with_id(request_id)
        self.acquires.sent(request_id)
        self.book.add_call(call, waiter)
        self.book.message()
        return call.id

    def reply(self, call_id: int, lease: lease_pb2.Lease = grant) -> list[lease_pb2.SessionCall]:
        response = lease_pb2.SessionResponse(
            replies=[lease_pb2.SessionReply(id=call_id, acquired=lease)]
        )
        return _lease_stream.deliver(self.book.receive(response), self.acquires)


def released(calls: list[lease_pb2.SessionCall]) -> list[tuple[str, int]]:
    return [(c.release.resource, c.release.token) for c in calls]


def test_a_replay_to_an_attempt_still_waiting_keeps_the_grant_of_an_abandoned_one() -> None:
    client = Client()
    client.acquires.begin("rid")
    timed_out, waiting = FakeWaiter(done=True), FakeWaiter()
    first, retry = client.send("rid", timed_out), client.send("rid", waiting)
    assert client.reply(first) == []
    assert client.reply(retry) == []
    assert waiting.results == [grant]
    assert client.acquires.end("rid") == []
    assert len(client.acquires) == 0  # nothing left remembered


def test_a_grant_handed_out_first_is_kept_when_an_abandoned_attempt_answers_later() -> None:
    client = Client()
    client.acquires.begin("rid")
    timed_out, waiting = FakeWaiter(done=True), FakeWaiter()
    first, retry = client.send("rid", timed_out), client.send("rid", waiting)
    assert client.reply(retry) == []
    assert client.acquires.end("rid") == []  # the acquire returned the lease
    assert client.reply(first) == []  # the same lease, replayed late: the caller's
    assert len(client.acquires) == 0


def test_a_grant_that_comes_between_attempts_waits_for_the_next_one() -> None:
    client = Client()
    client.acquires.begin("rid")
    first = client.send("rid", FakeWaiter(done=True))
    assert client.reply(first) == []  # the acquire is pausing before its retry
    waiting = FakeWaiter()
    assert client.reply(client.send("rid", waiting)) == []
    assert waiting.results == [grant]
    assert client.acquires.end("rid") == []


def test_a_kept_grant_the_acquire_never_took_is_released_when_it_gives_up() -> None:
    client = Client()
    client.acquires.begin("rid")
    assert client.reply(client.send("rid", FakeWaiter(done=True))) == []
    assert released(client.acquires.end("rid")) == [("r", 4)]
    assert len(client.acquires) == 0


def test_a_grant_of_an_acquire_that_ended_is_released_unless_it_was_handed_out() -> None:
    client = Client()
    client.acquires.begin("gave-up")
    late = client.send("gave-up", FakeWaiter(done=True))
    assert client.acquires.end("gave-up") == []
    assert released(client.reply(late)) == [("r", 4)]
    # An older grant of the same request id (expired, taken over since) is no one's.
    client.acquires.begin("rid")
    old, retry = client.send("rid", FakeWaiter(done=True)), client.send("rid", FakeWaiter())
    assert client.reply(retry, other) == []
    assert client.acquires.end("rid") == []
    assert released(client.reply(old)) == [("r", 4)]
    assert len(client.acquires) == 0


def test_an_attempt_cancelled_while_its_grant_is_handed_out_leaves_it_to_the_acquire() -> None:
    client = Client()
    client.acquires.begin("rid")
    assert client.reply(client.send("rid", CancelledMeanwhile())) == []
    assert released(client.acquires.end("rid")) == [("r", 4)]


def test_an_acquire_without_a_request_id_is_released_when_abandoned() -> None:
    client = Client()
    assert released(client.reply(client.send("", FakeWaiter(done=True)))) == [("r", 4)]


def test_calls_a_stream_ends_without_replies_are_forgotten() -> None:
    client = Client()
    client.acquires.begin("rid")
    client.send("rid", FakeWaiter())
    waiters, request_ids = client.book.end()
    assert (len(waiters), request_ids) == (1, ["rid"])
    for request_id in request_ids:
        client.acquires.gone(request_id)
    assert client.acquires.end("rid") == []
    assert len(client.acquires) == 0
