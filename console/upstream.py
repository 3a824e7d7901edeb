"""The console's clients of the servers, and which of them is unreachable now.

Every page reads through :class:`Upstream`. A call that fails because its server is
down (UNAVAILABLE, a deadline) raises :class:`Unreachable` naming the server and its
address, and marks the server down until a call to it succeeds again; pages render
that as a banner (and a 503 page that retries) instead of a traceback, and the
console keeps serving.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from fencing.client import AsyncGuardClient, AsyncLeaseClient, AsyncQueueClient
from fencing.errors import BackendUnavailableError, DeadlineExceededError

T = TypeVar("T")

#: Each call's deadline: a page waits at most this long for a server that hangs.
RPC_TIMEOUT = 2.0


class Unreachable(Exception):
    """A server did not answer: ``server`` ("lease server", "guard") at ``address``."""

    def __init__(self, server: str, address: str, cause: str) -> None:
        super().__init__(f"{server} {address} is unreachable: {cause}")
        self.server = server
        self.address = address
        self.cause = cause


@dataclass(frozen=True)
class Outage:
    """A server the console could not reach, and the last error it got."""

    server: str
    address: str
    error: str


class Upstream:
    """The lease server's lease and queue clients and one guard client per address."""

    def __init__(
        self,
        lease_addr: str,
        guard_addrs: Sequence[str],
        client_options: dict[str, Any],
    ) -> None:
        self.lease_addr = lease_addr
        self.leases = AsyncLeaseClient(
            lease_addr, rpc_timeout=RPC_TIMEOUT, transport="unary", **client_options
        )
        self.queue = AsyncQueueClient(lease_addr, rpc_timeout=RPC_TIMEOUT, **client_options)
        self.guards = {
            addr: AsyncGuardClient(addr, rpc_timeout=RPC_TIMEOUT, **client_options)
            for addr in guard_addrs
        }
        self._down: dict[tuple[str, str], str] = {}

    def outages(self) -> list[Outage]:
        """The servers whose last call failed, in a stable order."""
        return [Outage(s, a, e) for (s, a), e in sorted(self._down.items())]

    def mark(self, server: str, address: str, error: str | None) -> None:
        """Record that ``server`` answered (``error`` None) or not."""
        if error is None:
            self._down.pop((server, address), None)
        else:
            self._down[(server, address)] = error

    async def call(self, server: str, address: str, call: Awaitable[T]) -> T:
        """Await ``call`` to ``server``; :class:`Unreachable` if the server is down."""
        try:
            result = await call
        except (BackendUnavailableError, DeadlineExceededError, grpc.RpcError) as exc:
            cause = str(exc) or type(exc).__name__
            self.mark(server, address, cause)
            raise Unreachable(server, address, cause) from exc
        self.mark(server, address, None)
        return result

    async def lease(self, call: Awaitable[T]) -> T:
        """A call to the lease server (its leases or its queues)."""
        return await self.call("lease server", self.lease_addr, call)

    async def guard(self, address: str, call: Awaitable[T]) -> T:
        """A call to the guard at ``address``."""
        return await self.call("guard", address, call)

    async def aclose(self) -> None:
        await self.leases.aclose()
        await self.queue.aclose()
        for guard in self.guards.values():
            await guard.aclose()
