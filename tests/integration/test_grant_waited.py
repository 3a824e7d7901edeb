"""On the wire, for every lease backend: a grant reports how long it waited on the
server (``waited_ms``), never more than the client saw pass, so the SDK can start the
lease at the grant. Acquire, AcquireMany and Claim."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fencing import LeaseClient, QueueClient
from fencing.testing import RunningServers, running_servers
from fencing.v1 import lease_pb2, lease_pb2_grpc, queue_pb2, queue_pb2_grpc
from tests import pg as testpg
from tests.redis_server import SERVERS, drop_prefix, unique_prefix

# slow: acquires that wait seconds on purpose (the default loop leaves it out).
pytestmark = pytest.mark.slow

HELD = 1.0  # seconds another holder keeps the resource


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis"])
def servers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningServers]:
    """Servers on each lease backend (the parameter's name marks postgres/redis tests)."""
    kind = request.param
    if kind == "memory":
        url, cleanup = "memory://", None
    elif kind == "sqlite":
        url, cleanup = f"sqlite:{tmp_path / 'leases.db'}", None
    elif kind == "postgres":
        dsn, name = testpg.test_dsn(), f"{testpg.SCHEMA_PREFIX}{secrets.token_hex(6)}"
        url = testpg.with_schema(dsn, name)

        def cleanup() -> None:
            asyncio.run(testpg.drop_schema(dsn, name))
    else:
        base, prefix = SERVERS.standalone_url(), unique_prefix()
        url = f"{base}?prefix={prefix}"

        def cleanup() -> None:
            asyncio.run(drop_prefix(base, prefix))

    try:
        with running_servers(url, "memory://") as running:
            yield running
    finally:
        if cleanup is not None:
            cleanup()


def test_acquire_reports_its_wait(servers: RunningServers) -> None:
    with (
        LeaseClient(servers.lease_address, holder="other") as other,
        grpc.insecure_channel(servers.lease_address) as channel,
    ):
        stub = lease_pb2_grpc.LeaseServiceStub(channel)
        free = stub.Acquire(
            lease_pb2.AcquireRequest(resource="free", holder="me", ttl_ms=5000, wait_ms=0)
        )
        assert free.waited_ms < 200  # granted at once
        other.acquire("r", ttl=HELD)
        sent = time.monotonic()
        grant = stub.Acquire(
            lease_pb2.AcquireRequest(resource="r", holder="me", ttl_ms=5000, wait_ms=10_000)
        )
        took = time.monotonic() - sent
        assert HELD * 1000 * 0.5 < grant.waited_ms <= took * 1000
        many = stub.AcquireMany(
            lease_pb2.AcquireManyRequest(
                resources=["r2", "r3"], holder="me", ttl_ms=5000, wait_ms=0
            )
        )
        assert all(lease.waited_ms < 200 for lease in many.leases)
        other.acquire("r4", ttl=HELD)
        sent = time.monotonic()
        many = stub.AcquireMany(
            lease_pb2.AcquireManyRequest(
                resources=["r4", "r5"], holder="me", ttl_ms=5000, wait_ms=10_000
            )
        )
        took = time.monotonic() - sent
        assert all(HELD * 1000 * 0.5 < lease.waited_ms <= took * 1000 for lease in many.leases)


@pytest.mark.parametrize("servers", ["memory", "sqlite", "postgres"], indirect=True)
def test_claim_reports_its_wait(servers: RunningServers) -> None:
    """(Queues live on SQLite and PostgreSQL; a Redis lease server hosts none.)"""

    def enqueue_later() -> None:
        time.sleep(HELD)
        with QueueClient(servers.queue_address) as producer:
            producer.enqueue("q", b"x")

    with grpc.insecure_channel(servers.lease_address) as channel:
        stub = queue_pb2_grpc.QueueServiceStub(channel)
        producer = threading.Thread(target=enqueue_later, daemon=True)
        producer.start()
        sent = time.monotonic()
        claimed = stub.Claim(
            queue_pb2.ClaimRequest(
                queue="q", worker="me", batch_size=1, ttl_ms=5000, wait_ms=10_000
            )
        )
        took = time.monotonic() - sent
        producer.join(10)
    assert len(claimed.jobs) == 1
    assert HELD * 1000 * 0.5 < claimed.waited_ms <= took * 1000
