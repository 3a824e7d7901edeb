"""An acquire against a server whose PostgreSQL is down fails within the call's budget.

A real ``lease-server`` on a throwaway cluster with ``?timeout=2``: once the cluster
is stopped every server attempt takes the URL's 2 s and answers BACKEND_UNAVAILABLE.
The SDK may retry that, but only while another attempt as long as the last one still
fits the call's budget (the acquire's ``timeout``, else the client's ``rpc_timeout``):
so the number of attempts is at most budget / 2 s. Counting attempts (every call the
client sends), not wall-clock, keeps the test free of timing thresholds.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from fencing import AsyncLeaseClient, BackendUnavailableError, LeaseClient
from tests import pg

pytestmark = [pytest.mark.postgres, pytest.mark.e2e, pytest.mark.timeout(120)]

URL_TIMEOUT = 2.0  # the server's budget per backend call
RPC_TIMEOUT = 5.0


@pytest.fixture(scope="module")
def down_server() -> Iterator[str]:
    """A lease server whose PostgreSQL has been stopped after start-up."""
    with pg.cluster() as cluster:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "lease_server", "--backend",
                f"{cluster.dsn}?timeout={URL_TIMEOUT:g}", "--listen", "127.0.0.1:0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert "listening on" in line
            address = line.split("listening on ")[1].split()[0]
            with LeaseClient(address) as client:
                client.acquire("r", ttl=5).release()  # the control: up, it serves
            cluster.stop()
            yield address
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            if proc.stdout:
                proc.stdout.close()


def counting(client: Any) -> list[str]:
    """Record the method of every call ``client`` sends (each one a server attempt)."""
    sent: list[str] = []
    send = client._send

    def counted(method: Any, request: object, timeout: float | None) -> Any:
        sent.append(type(request).__name__)
        return send(method, request, timeout)

    client._send = counted
    return sent


@pytest.mark.parametrize("timeout", [None, 3.0])
def test_sync_acquire_fails_within_its_budget(down_server: str, timeout: float | None) -> None:
    budget = RPC_TIMEOUT if timeout is None else timeout
    with LeaseClient(down_server, rpc_timeout=RPC_TIMEOUT) as client:
        sent = counting(client)
        with pytest.raises(BackendUnavailableError):
            client.acquire("r", ttl=5, timeout=timeout)
    assert 1 <= len(sent) <= budget // URL_TIMEOUT, sent


@pytest.mark.parametrize("timeout", [None, 3.0])
def test_async_acquire_fails_within_its_budget(down_server: str, timeout: float | None) -> None:
    budget = RPC_TIMEOUT if timeout is None else timeout

    async def main() -> list[str]:
        async with AsyncLeaseClient(down_server, rpc_timeout=RPC_TIMEOUT) as client:
            sent = counting(client)
            with pytest.raises(BackendUnavailableError):
                await client.acquire("r", ttl=5, timeout=timeout)
            return sent

    sent = asyncio.run(main())
    assert 1 <= len(sent) <= budget // URL_TIMEOUT, sent
