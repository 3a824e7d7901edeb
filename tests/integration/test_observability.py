"""Metrics on /metrics and structured logs, from real calls over gRPC."""

from __future__ import annotations

import io
import json
import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fencing import (
    Claim,
    GuardClient,
    LeaseClient,
    PermissionDeniedError,
    StaleTokenError,
    UnauthenticatedError,
)
from fencing.testing import running_servers
from serving.auth import AuthPolicy
from serving.logs import JsonFormatter
from serving.metrics import Metrics
from serving.server import ServerOptions


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        body: bytes = reply.read()
    return body.decode()


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """Everything logged at INFO and above, as our JSON lines."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def test_metrics_endpoint_shows_the_stale_write_counter_moving(tmp_path: Path) -> None:
    metrics = Metrics()
    endpoint = metrics.serve_http(0)
    try:
        with (
            running_servers(options=ServerOptions(metrics=metrics)) as servers,
            LeaseClient(servers.lease_address, holder="a") as leases,
            GuardClient(servers.guard_address) as guard,
        ):
            before = scrape(endpoint.port)
            assert sample(before, "fencing_guard_stale_rejections_total", prefix="orders") is None
            old = leases.acquire("orders/7", ttl=5)
            guard.put(old, "k", b"old")
            old.release()
            new = leases.acquire("orders/7", ttl=5)
            guard.put(new, "k", b"new")
            with pytest.raises(StaleTokenError):
                guard.put(Claim("orders/7", old.token), "k", b"late")
            after = scrape(endpoint.port)
    finally:
        endpoint.close()
    assert sample(after, "fencing_guard_stale_rejections_total", prefix="orders") == 1
    assert sample(after, "fencing_guard_writes_total", outcome="stale") == 1
    assert sample(after, "fencing_guard_writes_total", outcome="accepted") == 2
    write = {"grpc_service": "fencing.v1.GuardService", "grpc_method": "Write"}
    assert sample(after, "grpc_server_started_total", grpc_type="unary", **write) == 3
    assert sample(after, "grpc_server_handled_total", grpc_code="OK", **write) == 2
    assert sample(after, "grpc_server_handled_total", grpc_code="FAILED_PRECONDITION", **write) == 1
    assert sample(after, "grpc_server_handling_seconds_count", **write) == 3
    assert sample(after, "fencing_lease_acquires_total", outcome="granted") == 2
    assert sample(after, "fencing_leases_held") == 1
    assert sample(after, "fencing_backend_up", server="lease") == 1


def test_json_log_of_a_stale_rejection_has_resource_and_tokens_not_the_value(
    json_log: io.StringIO,
) -> None:
    with (
        running_servers() as servers,
        LeaseClient(servers.lease_address, holder="worker-7") as leases,
        GuardClient(servers.guard_address) as guard,
    ):
        first = leases.acquire("ledger/eu", ttl=5)
        first.release()
        second = leases.acquire("ledger/eu", ttl=5)
        guard.fence(second)
        with pytest.raises(StaleTokenError):
            guard.put(first, "balance", b"TOP-SECRET-PAYLOAD")
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    stale = [line for line in lines if line["msg"].startswith("stale write rejected")]
    assert len(stale) == 1, lines
    entry = stale[0]
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "guard.service"
    assert entry["resource"] == "ledger/eu"
    assert entry["token"] == first.token
    assert entry["current_token"] == second.token
    assert "TOP-SECRET-PAYLOAD" not in json_log.getvalue()
    acquired = [line for line in lines if line["msg"].startswith("acquired")]
    assert acquired[0]["holder"] == "worker-7"
    assert acquired[0]["token"] == first.token


def test_bearer_tokens_never_reach_the_logs(json_log: io.StringIO, tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text('[principals.a]\ntokens = ["good-token"]\nallow = []\n')
    options = ServerOptions(auth=AuthPolicy.load(path))
    with running_servers(options=options) as servers:
        with (
            LeaseClient(servers.lease_address, token="hunter2-wrong-token") as wrong,
            pytest.raises(UnauthenticatedError),
        ):
            wrong.acquire("r", ttl=5)
        with (
            LeaseClient(servers.lease_address, token="good-token") as good,
            pytest.raises(PermissionDeniedError),
        ):
            good.acquire("r", ttl=5)
    text = json_log.getvalue()
    assert "refused /fencing.v1.LeaseService/Acquire" in text
    assert "hunter2" not in text
    assert "good-token" not in text
