"""A refused connection fails fast: one quick retry at most, in both twins.

Nobody listens at the address, so every attempt is refused by the kernel (no request
reached any server). The retry plan may try once more (a server restarting on the
port), not walk its whole backoff; attempts are counted, not timed. The CLI's
``lock``/``elect`` exit 12 on the same error (tests/integration/test_cli_exits.py).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from fencing import AsyncLeaseClient, BackendUnavailableError, LeaseClient
from fencing.client import _core

pytestmark = pytest.mark.timeout(60)


def closed_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def counting(client: Any) -> list[str]:
    sent: list[str] = []
    send = client._send

    def counted(method: Any, request: object, timeout: float | None) -> Any:
        sent.append(type(request).__name__)
        return send(method, request, timeout)

    client._send = counted
    return sent


@pytest.mark.parametrize("transport", ["unary", "stream"])
def test_sync_acquire_against_a_refused_port_tries_twice_at_most(transport: str) -> None:
    with LeaseClient(closed_address(), transport=transport) as client:
        sent = counting(client)
        with pytest.raises(BackendUnavailableError) as caught:
            client.acquire("r", ttl=5)
        assert _core.refused(caught.value)
    assert 1 <= len(sent) <= 2, sent


@pytest.mark.parametrize("transport", ["unary", "stream"])
def test_async_acquire_against_a_refused_port_tries_twice_at_most(transport: str) -> None:
    async def main() -> list[str]:
        async with AsyncLeaseClient(closed_address(), transport=transport) as client:
            sent = counting(client)
            with pytest.raises(BackendUnavailableError):
                await client.acquire("r", ttl=5, timeout=30)
            return sent

    sent = asyncio.run(main())
    assert 1 <= len(sent) <= 2, sent


def test_a_retried_unary_call_against_a_refused_port_tries_twice_at_most() -> None:
    with LeaseClient(closed_address(), transport="unary") as client:
        sent = counting(client)
        steps = _core.unary(
            client._stub.Describe, _core.describe_request("r"), retry=True, budget=30.0
        )
        with pytest.raises(BackendUnavailableError):
            client._run(steps)
    assert 1 <= len(sent) <= 2, sent


def test_sync_claim_against_a_refused_port_tries_twice_at_most() -> None:
    """Claim's own retries (one request id for every try) follow the same rule."""
    from fencing import QueueClient

    with QueueClient(closed_address(), rpc_timeout=0.2) as client:
        sent = counting(client)
        with pytest.raises(BackendUnavailableError):
            client.claim("q", ttl=5)
    assert 1 <= len(sent) <= 2, sent


def test_async_claim_against_a_refused_port_tries_twice_at_most() -> None:
    from fencing import AsyncQueueClient

    async def main() -> list[str]:
        async with AsyncQueueClient(closed_address(), rpc_timeout=0.2) as client:
            sent = counting(client)
            with pytest.raises(BackendUnavailableError):
                await client.claim("q", ttl=5)
            return sent

    sent = asyncio.run(main())
    assert 1 <= len(sent) <= 2, sent
