"""``GuardClient``: guarded writes and reads against a fencing guard (blocking).

The asyncio twin is :mod:`fencing.client.async_guard`; both only send what
:mod:`fencing.client._core` builds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import TypeVar

import grpc

from fencing.client import _core, _writes
from fencing.client._calls import BlockingCalls
from fencing.client._core import WriteResult
from fencing.client._writes import FenceReset, GuardInfo, ManyResult, Refusal
from fencing.client.write_stream import WriteStream
from fencing.limits import MAX_STREAM_WRITES
from fencing.tls import TLSConfig
from fencing.types import Delete, Fenced, Op, Put, Record
from fencing.v1 import guard_pb2, guard_pb2_grpc

Resp = TypeVar("Resp")


class GuardClient(BlockingCalls):
    """A blocking client of ``fencing.v1.GuardService``.

    Every write names the lease (or any object with ``resource`` and ``token``)
    whose token fences it::

        guard = GuardClient("127.0.0.1:50052")
        guard.put(lease, "balance", b"100")      # StaleTokenError if a newer token wrote

    Errors are :mod:`fencing.errors` exceptions (``StaleTokenError.current_token``...).
    ``tls``, ``token`` and ``credentials`` secure the channel as for ``LeaseClient``.
    ``coalesce=True`` sends every ``write`` through one shared :class:`WriteStream`:
    concurrent writes from many threads travel and commit together (same verdicts).
    """

    def __init__(
        self,
        target: str,
        *,
        tls: TLSConfig | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        rpc_timeout: float = _core.DEFAULT_RPC_TIMEOUT,
        channel: grpc.Channel | None = None,
        coalesce: bool = False,
    ) -> None:
        self.target = target
        self.rpc_timeout = rpc_timeout
        self.coalesce = coalesce
        self._shared_stream: WriteStream | None = None
        self._stream_lock = threading.Lock()
        self._channel = (
            channel
            if channel is not None
            else _core.open_channel(target, tls=tls, token=token, credentials=credentials)
        )
        self._stub = guard_pb2_grpc.GuardServiceStub(self._channel)

    def close(self) -> None:
        if self._shared_stream is not None:
            self._shared_stream.close()
        self._channel.close()

    def write(
        self, fenced: Fenced, ops: Sequence[Op] | Op, *, idempotency_key: str = ""
    ) -> WriteResult:
        """Apply ``ops`` atomically under ``fenced.token``; ``StaleTokenError`` if stale.

        With ``idempotency_key``, a repeat of the same write (even after a timeout)
        applies nothing again and returns ``replayed=True`` with ``replayed_by_token``:
        retries are safe. The token is judged first: a stale token gets
        ``StaleTokenError`` even for a known key (``key_applied``, ``applied_by_token``).
        """
        if self.coalesce:
            return self._stream().write(
                fenced, ops, idempotency_key=idempotency_key, timeout=self.rpc_timeout
            )
        request = _core.write_request(fenced, _core.ops_list(ops), idempotency_key)
        return _core.write_result(self._call(self._stub.Write, request))

    def put(self, fenced: Fenced, key: str, value: bytes, *, idempotency_key: str = "") -> int:
        """Store one value; returns the fence after the write."""
        return self.write(fenced, Put(key, value), idempotency_key=idempotency_key).fence

    def delete(self, fenced: Fenced, key: str, *, idempotency_key: str = "") -> int:
        """Remove one key; returns the fence after the write."""
        return self.write(fenced, Delete(key), idempotency_key=idempotency_key).fence

    def read(self, resource: str, key: str) -> Record | None:
        """The value under ``key`` with the token that wrote it, or None."""
        return _core.read_result(self._call(self._stub.Read, _core.read_request(resource, key)))

    def list_records(
        self, resource: str, prefix: str = "", *, page_size: int = 0
    ) -> Iterator[tuple[str, Record]]:
        """Yield ``(key, record)`` for the keys of ``resource`` starting with ``prefix``,
        in key order (by code point).

        Asks for one page at a time (``page_size`` records, at most 1,000; 0: the
        guard's default, 100; a page also stops at at most 3 MiB of values) as the
        iteration goes on. Each page is read on its own: a key written or deleted
        meanwhile may or may not appear, none twice.
        """
        page_token = ""
        while True:
            request = _core.list_records_request(resource, prefix, page_size, page_token)
            page = self._call(self._stub.ListRecords, request)
            yield from _core.key_records(page)
            page_token = page.next_page_token
            if not page_token:
                return

    def fence(self, fenced: Fenced) -> int:
        """Promise: from now on reject every token older than ``fenced.token``."""
        return self._call(self._stub.Fence, _core.fence_request(fenced)).fence

    def describe_fence(self, resource: str) -> int:
        """The guard's fence for ``resource`` (0 if never written or fenced)."""
        return self._call(self._stub.DescribeFence, _core.describe_fence_request(resource)).fence

    def describe_guard(self) -> GuardInfo:
        """What the guard says of itself: fence mode, store, follower, refusal counts."""
        request = guard_pb2.DescribeGuardRequest()
        return _writes.guard_info(self._call(self._stub.DescribeGuard, request))

    def list_refusals(self, resource: str) -> list[Refusal]:
        """The guard's recent refusals of ``resource``, newest first: a bounded ring per
        resource in the guard's memory (see :mod:`guard.refusals`), empty after a restart."""
        request = _writes.list_refusals_request(resource)
        return _writes.refusals(self._call(self._stub.ListRefusals, request))

    def reset_fence(self, resource: str, to_token: int) -> FenceReset:
        """An operator's recovery: set ``resource``'s fence to ``to_token``, lower or higher.

        Pass the lease server's ``last_token`` for the resource
        (``LeaseClient.describe(resource).last_token``, as ``fencing fence reset`` does):
        the highest token ever granted, so every former holder stays fenced while a
        fence a token nobody was granted wedged comes down. Needs the ``reset_fence``
        permission; the guard logs it at WARNING and counts it.
        """
        request = _writes.reset_fence_request(resource, to_token)
        return _writes.fence_reset(self._call(self._stub.ResetFence, request))

    # -- several resources, many writes ----------------------------------------------------

    def write_many(
        self,
        writes: Sequence[tuple[Fenced, Sequence[Op] | Op]],
        *,
        idempotency_key: str = "",
    ) -> ManyResult:
        """Write several resources atomically, each under its own token: all or nothing.

        ``writes`` pairs each lease (or ``Claim``) with its ops (none: the resource is
        only checked and fenced). One stale token raises ``StaleTokenError`` naming the
        first stale resource in sorted order, and nothing is applied anywhere.
        """
        request = _writes.write_many_request(writes, idempotency_key)
        return _writes.many_result(self._call(self._stub.WriteMany, request))

    def stream(self, *, max_batch: int = MAX_STREAM_WRITES) -> WriteStream:
        """Open a :class:`WriteStream`: many writes, from many threads, over one call."""
        return WriteStream(self._stub, max_batch=max_batch)

    def _stream(self) -> WriteStream:
        with self._stream_lock:
            if self._shared_stream is None or self._shared_stream.broken:
                self._shared_stream = WriteStream(self._stub)
            return self._shared_stream
