"""The book both client streams keep (the lease stream's calls, the write stream's
writes): ids, the queue of unsent calls, the waiters by id."""

from __future__ import annotations

import asyncio
import concurrent.futures
from dataclasses import dataclass

import pytest

from fencing import _status
from fencing.client._core import WriteResult
from fencing.client._stream_book import StreamBook, settle
from fencing.client._writes import WriteBook
from fencing.errors import InvalidArgumentError, StaleTokenError
from fencing.limits import MAX_STREAM_WRITES
from fencing.types import Claim, Put
from fencing.v1 import guard_pb2


@dataclass
class Reply:
    id: int
    text: str = ""


def test_calls_get_ids_in_order_and_a_message_takes_the_oldest_up_to_its_limit() -> None:
    book: StreamBook[str, str] = StreamBook()
    ids = [book.add(f"call-{i}", f"waiter-{i}") for i in range(5)]
    assert ids == [1, 2, 3, 4, 5]
    assert (book.queued, book.in_flight) == (5, 5)
    assert book.take(3) == [(1, "call-0"), (2, "call-1"), (3, "call-2")]
    assert book.take(3) == [(4, "call-3"), (5, "call-4")]
    assert book.take(3) == []
    assert (book.queued, book.in_flight) == (0, 5)  # sent, still waiting for replies


def test_each_reply_finds_the_waiter_of_its_id_once() -> None:
    book: StreamBook[str, str] = StreamBook()
    for name in ("a", "b", "c"):
        book.add(name, f"waiter-{name}")
    book.take(10)
    replies = [Reply(3, "to c"), Reply(1, "to a"), Reply(99, "to nobody"), Reply(3, "again")]
    assert [(w, r.text) for w, r in book.settle(replies)] == [
        ("waiter-c", "to c"),
        ("waiter-a", "to a"),
    ]
    assert book.in_flight == 1
    assert book.abandon() == ["waiter-b"]
    assert (book.queued, book.in_flight) == (0, 0)


def test_unsent_calls_are_given_back_with_their_waiters_and_leave_the_book() -> None:
    book: StreamBook[str, str] = StreamBook()
    book.add("sent", "w-sent")
    book.take(1)
    book.add("x", "w-x")
    book.add("y", "w-y")
    assert book.unsent() == [(2, "x", "w-x"), (3, "y", "w-y")]
    assert (book.queued, book.in_flight) == (0, 1)
    assert book.add("z", "w-z") == 4  # ids are never reused
    assert book.abandon() == ["w-sent", "w-z"]


def test_settle_hands_a_result_or_an_exception_unless_the_caller_gave_up() -> None:
    ok: concurrent.futures.Future[int] = concurrent.futures.Future()
    failed: concurrent.futures.Future[int] = concurrent.futures.Future()
    gone: concurrent.futures.Future[int] = concurrent.futures.Future()
    gone.cancel()
    assert settle(ok, 7) and ok.result() == 7
    assert settle(failed, StaleTokenError("r"))
    assert isinstance(failed.exception(), StaleTokenError)
    assert not settle(gone, 7)
    assert not settle(ok, 8) and ok.result() == 7


async def test_settle_an_asyncio_future_its_task_cancelled() -> None:
    loop = asyncio.get_running_loop()
    waiting, cancelled = loop.create_future(), loop.create_future()
    cancelled.cancel()
    assert settle(waiting, "reply") and await waiting == "reply"
    assert not settle(cancelled, "reply")


def test_the_write_book_packs_at_most_max_batch_writes_and_reads_each_verdict() -> None:
    with pytest.raises(InvalidArgumentError):
        WriteBook(0)
    with pytest.raises(InvalidArgumentError):
        WriteBook(MAX_STREAM_WRITES + 1)
    book: WriteBook[str] = WriteBook(max_batch=2)
    for i in range(3):
        book.add_write(Claim("r", 1 + i), Put("k", b"v"), f"key-{i}", f"w{i}")
    first, second = book.message(), book.message()
    assert first is not None and second is not None and book.message() is None
    assert [(w.id, w.write.token, w.write.idempotency_key) for w in first.writes] == [
        (1, 1, "key-0"),
        (2, 2, "key-1"),
    ]
    assert [w.id for w in second.writes] == [3]
    code, reason, message, metadata = _status.to_fields(StaleTokenError("r", current_token=2))
    stale = guard_pb2.WriteError(code=code, reason=reason, message=message, metadata=metadata)
    response = guard_pb2.WriteStreamResponse(
        verdicts=[
            guard_pb2.WriteVerdict(id=2, ok=guard_pb2.WriteResponse(fence=2)),
            guard_pb2.WriteVerdict(id=1, error=stale),
        ]
    )
    verdicts = dict(book.verdicts(response))
    assert verdicts["w1"] == WriteResult(2, False)
    assert isinstance(verdicts["w0"], StaleTokenError) and verdicts["w0"].current_token == 2
    assert book.abandon() == ["w2"]
