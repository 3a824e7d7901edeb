"""``GuardClient``: guarded writes and reads against a fencing guard (blocking)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import grpc

from fencing.client import _core
from fencing.client._core import WriteResult
from fencing.tls import TLSConfig
from fencing.types import Delete, Fenced, Op, Put, Record
from fencing.v1 import guard_pb2, guard_pb2_grpc


class GuardClient:
    """A blocking client of ``fencing.v1.GuardService``.

    Every write names the lease (or any object with ``resource`` and ``token``)
    whose token fences it::

        guard = GuardClient("127.0.0.1:50052")
        guard.put(lease, "balance", b"100")      # StaleTokenError if a newer token wrote

    Errors are :mod:`fencing.errors` exceptions (``StaleTokenError.current_token``...).
    ``tls``, ``token`` and ``credentials`` secure the channel as for ``LeaseClient``.
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
    ) -> None:
        self.target = target
        self.rpc_timeout = rpc_timeout
        if channel is not None:
            self._channel = channel
        else:
            secure = _core.channel_credentials(
                target, tls=tls, token=token, credentials=credentials
            )
            options = _core.channel_options(tls)
            if secure is not None:
                self._channel = grpc.secure_channel(target, secure, options)
            else:
                self._channel = grpc.insecure_channel(target, options)
        self._stub = guard_pb2_grpc.GuardServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> GuardClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def write(
        self, fenced: Fenced, ops: Sequence[Op] | Op, *, idempotency_key: str = ""
    ) -> WriteResult:
        """Apply ``ops`` atomically under ``fenced.token``; ``StaleTokenError`` if stale.

        With ``idempotency_key``, a repeat of the same write (even after a timeout)
        applies nothing again and returns ``replayed=True``: retries are safe.
        """
        request = _core.write_request(fenced, _core.ops_list(ops), idempotency_key)
        try:
            return _core.write_result(self._stub.Write(request, timeout=self.rpc_timeout))
        except grpc.RpcError as err:
            raise _core.translate(err) from err

    def put(self, fenced: Fenced, key: str, value: bytes, *, idempotency_key: str = "") -> int:
        """Store one value; returns the fence after the write."""
        return self.write(fenced, Put(key, value), idempotency_key=idempotency_key).fence

    def delete(self, fenced: Fenced, key: str, *, idempotency_key: str = "") -> int:
        """Remove one key; returns the fence after the write."""
        return self.write(fenced, Delete(key), idempotency_key=idempotency_key).fence

    def read(self, resource: str, key: str) -> Record | None:
        """The value under ``key`` with the token that wrote it, or None."""
        try:
            msg = self._stub.Read(
                guard_pb2.ReadRequest(resource=resource, key=key), timeout=self.rpc_timeout
            )
        except grpc.RpcError as err:
            raise _core.translate(err) from err
        return _core.read_result(msg)

    def fence(self, fenced: Fenced) -> int:
        """Promise: from now on reject every token older than ``fenced.token``."""
        try:
            msg = self._stub.Fence(
                guard_pb2.FenceRequest(resource=fenced.resource, token=fenced.token),
                timeout=self.rpc_timeout,
            )
        except grpc.RpcError as err:
            raise _core.translate(err) from err
        return msg.fence

    def describe_fence(self, resource: str) -> int:
        """The guard's fence for ``resource`` (0 if never written or fenced)."""
        try:
            msg = self._stub.DescribeFence(
                guard_pb2.DescribeFenceRequest(resource=resource), timeout=self.rpc_timeout
            )
        except grpc.RpcError as err:
            raise _core.translate(err) from err
        return msg.fence
