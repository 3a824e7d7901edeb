"""SIGTERM a real lease server with a waiter in flight, then restart it.

No lease is lost and no token is issued twice."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import grpc.aio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fencing import BackendUnavailableError, LeaseClient, _status
from fencing.v1 import lease_pb2, lease_pb2_grpc
from serving.ports import free_port
from tests.sessions import Stream, acquire, error, ping
from tests.waiting import eventually

pytestmark = pytest.mark.e2e

HANG_GUARD = 30.0


@contextmanager
def lease_server(db: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lease_server",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            f"sqlite:{db}",
            "--grace",
            "20",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "lease server listening on" in line, proc.stderr.read() if proc.stderr else ""
        yield proc, line.split()[4]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(HANG_GUARD)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def waiters(metrics_port: int) -> float:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=HANG_GUARD) as reply:
        text = reply.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fencing_lease_waiters":
                return float(sample.value)
    return 0.0


def test_sigterm_answers_waiters_cleanly_and_a_restart_keeps_leases_and_tokens(
    tmp_path: Path,
) -> None:
    db = tmp_path / "leases.db"
    metrics_port = free_port()
    outcome: list[object] = []
    with lease_server(db, "--metrics-port", str(metrics_port)) as (proc, address):
        holder = LeaseClient(address, holder="A")
        lease = holder.acquire("orders", ttl=60)

        def wait_for_it() -> None:
            with grpc.insecure_channel(address) as channel:
                stub = lease_pb2_grpc.LeaseServiceStub(channel)
                request = lease_pb2.AcquireRequest(
                    resource="orders", holder="B", ttl_ms=5000, wait_ms=120_000, request_id="b-1"
                )
                try:
                    outcome.append(stub.Acquire(request, timeout=HANG_GUARD * 4))
                except grpc.RpcError as err:
                    outcome.append(err)

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        deadline = time.monotonic() + HANG_GUARD
        while waiters(metrics_port) < 1:
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.02)

        proc.send_signal(signal.SIGTERM)
        waiter.join(HANG_GUARD)
        assert not waiter.is_alive()
        assert proc.wait(HANG_GUARD) == 0
        holder.close()

    # The waiter got a clean, retryable answer, not a cut-off stream.
    (answer,) = outcome
    assert isinstance(answer, grpc.RpcError)
    error = _status.from_rpc_error(answer)
    assert isinstance(error, BackendUnavailableError), answer
    assert "shutting down" in str(error)

    with lease_server(db) as (proc, address), LeaseClient(address, holder="A") as again:
        state = again.describe("orders")
        assert (state.held, state.holder, state.token) == (True, "A", lease.token)
        assert state.last_token == lease.token
        # A's token is still the live lease in the new process: it renews and releases.
        assert again.renew("orders", lease.token, ttl=60) == 60_000
        again.release("orders", lease.token)
        with LeaseClient(address, holder="B") as b:
            assert b.acquire("orders", ttl=5, timeout=HANG_GUARD).token > lease.token
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HANG_GUARD) == 0


async def test_sigterm_drains_session_streams_goaway_then_their_calls_then_the_end(
    tmp_path: Path,
) -> None:
    """A Session stream of a server told to stop gets a goaway; its waiting acquire is
    answered (retryable), and the stream ends with OK before the process exits 0 (new
    calls refused meanwhile: tests/integration/test_session_stream.py)."""
    with lease_server(tmp_path / "leases.db") as (proc, address):
        async with grpc.aio.insecure_channel(address) as channel:
            stream = Stream.open(channel)
            held = await stream.ask(acquire("orders", holder="A"))
            assert held.WhichOneof("outcome") == "acquired"
            (waiting,) = await stream.send(
                acquire("orders", holder="B", wait_ms=120_000, request_id="b-1")
            )
            assert (await stream.ask(ping())).WhichOneof("outcome") == "pong"
            proc.send_signal(signal.SIGTERM)
            await eventually(lambda: any(r.HasField("goaway") for r in stream.responses), "goaway")
            answer = await asyncio.wait_for(waiting, HANG_GUARD)
            assert isinstance(error(answer), BackendUnavailableError)
            assert stream.reader is not None
            await asyncio.wait_for(stream.reader, HANG_GUARD)
            assert await stream.call.code() == grpc.StatusCode.OK
        assert await asyncio.to_thread(proc.wait, HANG_GUARD) == 0
