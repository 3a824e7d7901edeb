"""compose.yaml's topology as local processes: the same commands, flags and environment.

Addresses become free loopback ports. The guard's Redis is a throwaway
``redis-server`` started with the compose service's own flags (AOF, fsync always),
so ``require_durable=1`` holds. The lease server's PostgreSQL is the tests' own
(:mod:`tests.pg`), in a fresh schema; without one it runs on SQLite (except under
``CI=true``, where a missing PostgreSQL fails). Each server is then probed with its compose
healthcheck command, used through the SDK (with a stale write rejected and counted
on /metrics), and stopped with SIGTERM, which must end it cleanly.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml

from fencing import Claim, GuardClient, LeaseClient, StaleTokenError
from serving.ports import free_port
from tests import pg
from tests.redis_server import REDIS_SERVER, RedisProcess, unavailable, unique_prefix

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
HANG_GUARD = 30.0


def local_argv(service: dict[str, Any], metrics_port: int) -> list[str]:
    """The service's command as a local process: ``python -m <package> ...``."""
    script, *argv = service["command"]
    package = SCRIPTS[script].partition(":")[0].removesuffix(".__main__")
    rewrites = {"--listen": "127.0.0.1:0", "--metrics-host": "127.0.0.1"}
    rewrites["--metrics-port"] = str(metrics_port)
    out = []
    for i, arg in enumerate(argv):
        out.append(rewrites.get(argv[i - 1], arg) if i else arg)
    return [sys.executable, "-m", package, *out]


def local_env(service: dict[str, Any], **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCING_")}
    env.update({k: str(v) for k, v in service.get("environment", {}).items()})
    env.update(overrides)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextmanager
def process(argv: list[str], env: dict[str, str], log: Path) -> Iterator[tuple[str, str]]:
    with log.open("w") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert "listening on" in line, f"{argv}: {line!r}\n{log.read_text()}"
            yield line, line.split("listening on ")[1].split()[0]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(HANG_GUARD) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(HANG_GUARD)
            if proc.stdout is not None:
                proc.stdout.close()


def healthcheck(service: dict[str, Any], address: str) -> subprocess.CompletedProcess[str]:
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "fencing", "healthcheck"]
    argv = [sys.executable, "-m", "fencingctl", "healthcheck", address, *test[4:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=HANG_GUARD, check=False)


@contextmanager
def lease_backend_url(tmp_path: Path) -> Iterator[str]:
    """The tests' PostgreSQL in a fresh schema (dropped after), else SQLite."""
    try:
        dsn = pg.test_dsn()
    except pytest.skip.Exception:
        yield f"sqlite:{tmp_path / 'leases.db'}"
        return
    schema = f"{pg.SCHEMA_PREFIX}{secrets.token_hex(6)}"
    try:
        yield pg.with_schema(dsn, schema)
    finally:
        asyncio.run(pg.drop_schema(dsn, schema))


def guard_store_url(compose_url: str, redis: RedisProcess) -> str:
    parts = urlsplit(compose_url)
    query = f"{parts.query}&prefix={unique_prefix()}" if parts.query else ""
    return urlunsplit((parts.scheme, f"127.0.0.1:{redis.port}", parts.path, query, parts.fragment))


def stale_rejections(metrics_port: int) -> str:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=HANG_GUARD) as reply:
        text: str = reply.read().decode()
    return text


def test_compose_topology_runs_as_local_processes(tmp_path: Path) -> None:
    if not Path(REDIS_SERVER).exists():
        unavailable("redis-server is not installed")
    lease_svc, guard_svc = SERVICES["lease-server"], SERVICES["guard"]
    redis_flags = tuple(SERVICES["redis"]["command"][1:])
    lease_metrics, guard_metrics = free_port(), free_port()
    with ExitStack() as stack:
        redis = stack.enter_context(RedisProcess(extra=redis_flags))  # started
        backend = stack.enter_context(lease_backend_url(tmp_path))
        lease_env = local_env(lease_svc, FENCING_BACKEND=backend)
        banner, lease_addr = stack.enter_context(
            process(local_argv(lease_svc, lease_metrics), lease_env, tmp_path / "lease.log")
        )
        expected = "postgres" if backend.startswith("postgres") else "sqlite"
        assert f"(backend {expected})" in banner
        check = healthcheck(lease_svc, lease_addr)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "SERVING" in check.stdout

        store = guard_store_url(guard_svc["environment"]["FENCING_STORE"], redis)
        assert "require_durable=1" in store
        guard_env = local_env(guard_svc, FENCING_STORE=store)
        _, guard_addr = stack.enter_context(
            process(local_argv(guard_svc, guard_metrics), guard_env, tmp_path / "guard.log")
        )
        check = healthcheck(guard_svc, guard_addr)
        assert check.returncode == 0, check.stdout + check.stderr

        with (
            LeaseClient(lease_addr, holder="a") as leases,
            GuardClient(guard_addr) as guard,
        ):
            first = leases.acquire("orders/1", ttl=10)
            guard.put(first, "total", b"1")
            first.release()
            second = leases.acquire("orders/1", ttl=10)
            guard.put(second, "total", b"2")
            with pytest.raises(StaleTokenError):
                guard.put(Claim("orders/1", first.token), "total", b"late")
            record = guard.read("orders/1", "total")
            assert record is not None
            assert (record.value, record.written_by_token) == (b"2", second.token)
        text = stale_rejections(guard_metrics)
        assert 'fencing_guard_stale_rejections_total{prefix="orders"} 1.0' in text
    # Leaving the stack sent SIGTERM to both servers and checked they exited 0.
    logs = (tmp_path / "guard.log").read_text()
    assert '"msg": "stale write rejected' in logs  # JSON logs, as compose asks
    assert "late" not in logs
