"""The I/O-free half of multi-resource and streamed writes, shared by the sync and asyncio
twins (:mod:`fencing.client.write_stream`, :mod:`fencing.client.async_write_stream`).

A write stream keeps a :class:`WriteBook` (a
:class:`~fencing.client._stream_book.StreamBook` of writes): writes wait in it until
the sender packs everything waiting, up to ``max_batch``, into one
``WriteStreamRequest`` (coalescing: the more writers, the fuller each message), each
under an id; the reader hands every verdict back to the waiter of its id. The twins
only move messages and wake waiters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from fencing import _status
from fencing.client._core import WriteResult, op_to_proto, ops_list, write_request
from fencing.client._stream_book import StreamBook
from fencing.errors import FencingError, InvalidArgumentError
from fencing.limits import MAX_STREAM_WRITES
from fencing.types import Fenced, Op
from fencing.v1 import guard_pb2

W = TypeVar("W")  # whatever a twin wakes a writer with (a Future)


# -- WriteMany --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ManyResult:
    """The fences after a multi-resource write, by resource; ``replayed`` if its
    idempotency key matched an earlier one (nothing was applied again), and then
    ``replayed_by_tokens``: by resource, the token that applied the recorded write
    (0 where the guard had already forgotten the key)."""

    fences: dict[str, int]
    replayed: bool
    replayed_by_tokens: dict[str, int] = field(default_factory=dict)


def write_many_request(
    writes: Iterable[tuple[Fenced, Sequence[Op] | Op]], idempotency_key: str = ""
) -> guard_pb2.WriteManyRequest:
    return guard_pb2.WriteManyRequest(
        writes=[
            guard_pb2.ResourceWrite(
                resource=fenced.resource,
                token=fenced.token,
                ops=[op_to_proto(op) for op in ops_list(ops)],
            )
            for fenced, ops in writes
        ],
        idempotency_key=idempotency_key,
    )


def many_result(msg: guard_pb2.WriteManyResponse) -> ManyResult:
    return ManyResult(
        {f.resource: f.fence for f in msg.fences},
        msg.replayed,
        {f.resource: token for f, token in zip(msg.fences, msg.replayed_by_tokens, strict=False)},
    )


@dataclass(frozen=True, slots=True)
class FenceReset:
    """An operator's ``ResetFence``: the fence before and after (the lease server's
    ``last_token`` it was reset to)."""

    resource: str
    previous_fence: int
    fence: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """A write or fence the guard refused (``GuardClient.list_refusals``): its ErrorInfo
    ``reason`` (STALE_TOKEN, LEASE_LOST), the ``token`` it carried, the ``fence`` it met
    (STALE_TOKEN), the ``call`` (write, multi-resource write, fence), the ``principal``
    that sent it and when (``at_unix_ms``, the guard's clock)."""

    resource: str
    reason: str
    token: int
    fence: int
    call: str
    principal: str
    at_unix_ms: int


@dataclass(frozen=True, slots=True)
class GuardInfo:
    """What a guard says of itself (``GuardClient.describe_guard``): its ``version``,
    ``fence_mode``, ``store`` kind and ``durability_warning`` ('' when durable); in
    watch mode its follower's ``watch_state``, last applied ``watch_revision`` and
    ``watch_error``; and its refusals since it started, by reason (``refusals``)."""

    version: str
    fence_mode: str
    store: str
    durability_warning: str
    watch_state: str
    watch_revision: int
    watch_error: str
    refusals: dict[str, int]


def guard_info(msg: guard_pb2.GuardInfo) -> GuardInfo:
    return GuardInfo(
        msg.version,
        msg.fence_mode,
        msg.store,
        msg.durability_warning,
        msg.watch_state,
        msg.watch_revision,
        msg.watch_error,
        dict(msg.refusals),
    )


def list_refusals_request(resource: str) -> guard_pb2.ListRefusalsRequest:
    return guard_pb2.ListRefusalsRequest(resource=resource)


def refusals(msg: guard_pb2.ListRefusalsResponse) -> list[Refusal]:
    return [
        Refusal(msg.resource, r.reason, r.token, r.fence, r.call, r.principal, r.at_unix_ms)
        for r in msg.refusals
    ]


def reset_fence_request(resource: str, to_token: int) -> guard_pb2.ResetFenceRequest:
    return guard_pb2.ResetFenceRequest(resource=resource, to_token=to_token)


def fence_reset(msg: guard_pb2.ResetFenceResponse) -> FenceReset:
    return FenceReset(msg.resource, msg.previous_fence, msg.fence)


# -- WriteStream ------------------------------------------------------------------------------


def outcome(verdict: guard_pb2.WriteVerdict) -> WriteResult | FencingError:
    """A verdict as what ``write`` would have returned, or the exception it would raise."""
    if verdict.WhichOneof("outcome") == "ok":
        return WriteResult(verdict.ok.fence, verdict.ok.replayed, verdict.ok.replayed_by_token)
    error = verdict.error
    return _status.from_fields(error.reason, error.message, dict(error.metadata))


class WriteBook(StreamBook[guard_pb2.WriteRequest, W]):
    """Writes waiting to be sent, and writes sent and waiting for their verdict; a
    message carries at most ``max_batch`` writes."""

    __slots__ = ("max_batch",)

    def __init__(self, max_batch: int = MAX_STREAM_WRITES) -> None:
        if not 1 <= max_batch <= MAX_STREAM_WRITES:
            raise InvalidArgumentError(
                f"max_batch must be 1..{MAX_STREAM_WRITES}", field="max_batch"
            )
        super().__init__()
        self.max_batch = max_batch

    def add_write(
        self, fenced: Fenced, ops: Sequence[Op] | Op, idempotency_key: str, waiter: W
    ) -> None:
        """Queue one write; ``waiter`` is handed back with its verdict."""
        self.add(write_request(fenced, ops_list(ops), idempotency_key), waiter)

    def message(self) -> guard_pb2.WriteStreamRequest | None:
        """The next message: everything queued, up to ``max_batch`` writes; None if empty."""
        if not self.queued:
            return None
        return guard_pb2.WriteStreamRequest(
            writes=[
                guard_pb2.StreamedWrite(id=write_id, write=w)
                for write_id, w in self.take(self.max_batch)
            ]
        )

    def verdicts(
        self, response: guard_pb2.WriteStreamResponse
    ) -> list[tuple[W, WriteResult | FencingError]]:
        """Each verdict of ``response`` with the waiter of its write."""
        return [(waiter, outcome(verdict)) for waiter, verdict in self.settle(response.verdicts)]
