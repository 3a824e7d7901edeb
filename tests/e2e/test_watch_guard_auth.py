"""A watch guard following a lease server with auth on, as real processes.

The guard gets its credentials to the lease server by flag, ``FENCING_LEASE_*``
variables or its TOML file (a bearer token, or an mTLS client certificate): it then
follows the lease events and fences a takeover by itself. Without them (the control)
it does not follow: its watch health is NOT_SERVING and says why (``fencing
healthcheck`` prints the lease server's refusal), so do its writes with new tokens
(``BACKEND_UNAVAILABLE``), and it asks again with backoff, not in a tight loop.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fencing import (
    BackendUnavailableError,
    GuardClient,
    LeaseClient,
    Put,
    StaleTokenError,
    TLSConfig,
)
from serving.ports import free_port
from tests.e2e.test_postgres_servers import REPO, SERVER_ARGS, lease_server_processes
from tests.waiting import wait_until

pytestmark = pytest.mark.e2e

POLICY = """
[principals.alice]
tokens = ["alice-token"]
allow = [{ prefix = "orders/", actions = ["acquire", "renew", "release", "describe"] }]

[principals.guard]
tokens = ["guard-token"]
identities = ["guard.internal"]
allow = [{ prefix = "", actions = ["watch", "describe"] }]
"""

WATCH_HEALTH = "fencing.v1.GuardService/watch"


@contextlib.contextmanager
def guard_process(
    tmp_path: Path, lease_addr: str, *args: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """A ``python -m guard`` in watch mode following ``lease_addr``; yields its address."""
    log = tmp_path / "guard.log"
    command = [
        sys.executable,
        "-m",
        "guard",
        *SERVER_ARGS,
        "--store",
        f"sqlite:{tmp_path / 'guard.db'}",
        "--fence-mode",
        "watch",
        "--lease-addr",
        lease_addr,
        *args,
    ]
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            raise AssertionError(f"the guard did not start: {line!r}\n{log.read_text()}")
        yield line.split("listening on ")[1].split()[0]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def lease_server(tmp_path: Path, *args: str) -> Iterator[tuple[str, int]]:
    """A lease server with auth on; yields its address and its metrics port."""
    policy = tmp_path / "auth.toml"
    policy.write_text(POLICY)
    metrics = free_port()
    command = (
        "-m",
        "lease_server",
        *SERVER_ARGS,
        "--auth-file",
        str(policy),
        "--metrics-port",
        str(metrics),
        *args,
    )
    url = f"sqlite:///{tmp_path / 'leases.db'}"
    with lease_server_processes(url, 1, command) as ((address, _),):
        yield address, metrics


def watch_health(address: str, tls: TLSConfig | None = None) -> str:
    channel = (
        grpc.insecure_channel(address)
        if tls is None
        else grpc.secure_channel(address, tls.channel_credentials())
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        status = stub.Check(health_pb2.HealthCheckRequest(service=WATCH_HEALTH), timeout=5)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(status.status))


def auth_failures(metrics_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.findall(
        r'^fencing_auth_failures_total\{reason="unauthenticated"\} (\S+)$', text, re.M
    )
    return int(float(found[0])) if found else 0


def follows_a_takeover(lease_addr: str, guard_addr: str) -> None:
    """Alice takes orders/1: the guard fences to her token by itself (watch mode)."""
    with (
        LeaseClient(lease_addr, token="alice-token") as alice,
        GuardClient(guard_addr) as guard,
    ):
        lease = alice.acquire("orders/1", ttl=30)
        wait_until(lambda: guard.describe_fence("orders/1") == lease.token)
        assert guard.write(lease, [Put("k", b"v")]).fence == lease.token


@pytest.mark.parametrize("how", ["flag", "env", "toml"])
def test_a_watch_guard_follows_with_its_bearer_token(tmp_path: Path, how: str) -> None:
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    if how == "flag":
        args = ("--lease-token", "guard-token")
    elif how == "env":
        env = {"FENCING_LEASE_TOKEN": "guard-token"}
    else:
        config = tmp_path / "guard.toml"
        config.write_text('lease_token = "guard-token"\n')
        args = ("--config", str(config))
    with (
        lease_server(tmp_path) as (lease_addr, _),
        guard_process(tmp_path, lease_addr, *args, env=env) as guard_addr,
    ):
        wait_until(lambda: watch_health(guard_addr) == "SERVING")
        follows_a_takeover(lease_addr, guard_addr)


def test_a_watch_guard_follows_with_its_client_certificate(tmp_path: Path) -> None:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("guard.internal", common_name="guard.internal")
    files = {
        "ca.pem": ca.cert_pem.bytes(),
        "server.pem": server.cert_chain_pems[0].bytes(),
        "server.key": server.private_key_pem.bytes(),
        "guard.pem": client.cert_chain_pems[0].bytes(),
        "guard.key": client.private_key_pem.bytes(),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    tls = ("--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key"))
    with (
        lease_server(tmp_path, *tls, "--tls-ca", str(tmp_path / "ca.pem")) as (lease_addr, _),
        guard_process(
            tmp_path,
            lease_addr,
            "--lease-tls-ca",
            str(tmp_path / "ca.pem"),
            "--lease-tls-cert",
            str(tmp_path / "guard.pem"),
            "--lease-tls-key",
            str(tmp_path / "guard.key"),
        ) as guard_addr,
    ):
        wait_until(lambda: watch_health(guard_addr) == "SERVING")
        alice_tls = TLSConfig(
            ca=ca.cert_pem.bytes(),
            cert=client.cert_chain_pems[0].bytes(),
            key=client.private_key_pem.bytes(),
        )
        with GuardClient(guard_addr) as guard, LeaseClient(lease_addr, tls=alice_tls) as peer:
            # The certificate's principal may only watch and describe: it follows.
            assert peer.describe("orders/1").last_token == 0
            assert guard.describe_fence("orders/1") == 0


def test_control_without_credentials_it_does_not_follow_says_why_and_backs_off(
    tmp_path: Path,
) -> None:
    with (
        lease_server(tmp_path) as (lease_addr, metrics_port),
        guard_process(tmp_path, lease_addr) as guard_addr,
        LeaseClient(lease_addr, token="alice-token") as alice,
        GuardClient(guard_addr) as guard,
    ):
        wait_until(lambda: auth_failures(metrics_port) >= 1)
        started = time.monotonic()
        first = auth_failures(metrics_port)
        time.sleep(3.0)
        asked = auth_failures(metrics_port) - first
        elapsed = time.monotonic() - started
        assert watch_health(guard_addr) == "NOT_SERVING"
        # The health check says why (fencing healthcheck prints the reason it carries).
        command = ["-m", "fencingctl", "healthcheck", guard_addr, "--service", WATCH_HEALTH]
        checked = subprocess.run(
            [sys.executable, *command],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert checked.returncode == 1, checked.stderr
        assert "NOT_SERVING (UNAUTHENTICATED: " in checked.stdout
        assert "--lease-token" in checked.stdout
        lease = alice.acquire("orders/1", ttl=30)
        with pytest.raises(BackendUnavailableError, match=r"UNAUTHENTICATED: .*--lease-token"):
            guard.write(lease, [Put("k", b"v")])
    # Backoff from 50 ms doubling to 5 s: at most ~7 attempts in 3 s; a loop at
    # 50 ms would make ~60 (the issue saw ~20 a second).
    assert asked <= 12, f"{asked} reconnects in {elapsed:.1f} s"


#: No principal for a guard: serve's own is none of the user's business.
SERVE_POLICY = """
[principals.alice]
tokens = ["alice-token"]
allow = [
  { prefix = "orders/", actions = ["acquire", "renew", "release", "describe", "write", "read"] },
]
"""


@contextlib.contextmanager
def serve_process(tmp_path: Path, *args: str, auth: bool = True) -> Iterator[tuple[str, str]]:
    """``fencing serve`` with a watch guard, with auth on (the policy above) unless
    ``auth`` is false; yields the lease server's and the guard's addresses."""
    policy = tmp_path / "auth.toml"
    policy.write_text(SERVE_POLICY)
    command = [
        sys.executable, "-m", "fencingctl", "serve", "--data-dir", str(tmp_path / "data"),
        "--lease-listen", "127.0.0.1:0", "--guard-listen", "127.0.0.1:0",
        "--fence-mode", "watch", "--console-port", "0",
        *(["--auth-file", str(policy)] if auth else []), *args,
    ]  # fmt: skip
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        lease_line, guard_line = proc.stdout.readline(), proc.stdout.readline()
        if "guard listening on" not in guard_line:
            raise AssertionError(f"serve did not start: {guard_line!r}\n{log.read_text()}")
        yield (
            lease_line.split("listening on ")[1].split()[0],
            guard_line.split("listening on ")[1].split()[0],
        )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_serve_with_auth_gives_its_own_watch_guard_credentials(tmp_path: Path) -> None:
    """``fencing serve``'s in-process guard follows its lease server with auth on, with
    no credentials given for it: serve lets its own guard in (a principal allowed
    only to watch, with a token minted at start and never written anywhere)."""
    with serve_process(tmp_path) as (lease_addr, guard_addr):
        wait_until(lambda: watch_health(guard_addr) == "SERVING")
        with (
            LeaseClient(lease_addr, token="alice-token") as alice,
            GuardClient(guard_addr, token="alice-token") as guard,
        ):
            lease = alice.acquire("orders/1", ttl=30)
            # Followed: the guard fenced to her token by itself; a write with it lands.
            wait_until(lambda: guard.describe_fence("orders/1") == lease.token)
            assert guard.write(lease, [Put("k", b"v")]).fence == lease.token


def serve_certificates(tmp_path: Path) -> tuple[trustme.CA, list[str]]:
    """A CA, and ``serve``'s TLS flags for a server certificate it signed (127.0.0.1)."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "server.pem", tmp_path / "server.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return ca, ["--tls-cert", str(cert_file), "--tls-key", str(key_file)]


def serve_guard_follows(
    lease_addr: str, guard_addr: str, tls: TLSConfig, token: str | None
) -> None:
    """The guard reaches SERVING and fences each grant by itself: a write with the new
    token lands, one with the former token is refused."""
    wait_until(lambda: watch_health(guard_addr, tls) == "SERVING")
    with (
        LeaseClient(lease_addr, tls=tls, token=token) as leases,
        GuardClient(guard_addr, tls=tls, token=token) as guard,
    ):
        first = leases.acquire("orders/1", ttl=30)
        wait_until(lambda: guard.describe_fence("orders/1") == first.token)
        first.release()
        second = leases.acquire("orders/1", ttl=30)
        wait_until(lambda: guard.describe_fence("orders/1") == second.token)
        assert guard.write(second, [Put("k", b"v")]).fence == second.token
        with pytest.raises(StaleTokenError):
            guard.write(first, [Put("k", b"late")])


@pytest.mark.parametrize("auth", [False, True], ids=["tls", "tls+auth"])
def test_serve_over_tls_lets_its_own_watch_guard_follow(tmp_path: Path, auth: bool) -> None:
    """Over TLS, ``serve``'s own guard cannot verify the lease server's certificate (it
    does not know the CA): it follows over a Unix socket only serve's user may reach,
    with the minted token when auth is on. Before, it dialled the TLS port in plaintext
    and never followed."""
    ca, flags = serve_certificates(tmp_path)
    tls = TLSConfig(ca=ca.cert_pem.bytes())
    with serve_process(tmp_path, *flags, auth=auth) as (lease_addr, guard_addr):
        serve_guard_follows(lease_addr, guard_addr, tls, "alice-token" if auth else None)


def test_serve_over_mtls_lets_its_own_watch_guard_follow(tmp_path: Path) -> None:
    """With client certificates required (mTLS) and the policy's tokens, the own guard
    has no certificate: the Unix socket and its minted token let it in, nobody else."""
    ca, flags = serve_certificates(tmp_path)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    client = ca.issue_cert("alice.example")
    tls = TLSConfig(
        ca=ca.cert_pem.bytes(),
        cert=client.cert_chain_pems[0].bytes(),
        key=client.private_key_pem.bytes(),
    )
    with serve_process(tmp_path, *flags, "--tls-ca", str(ca_file)) as (lease_addr, guard_addr):
        serve_guard_follows(lease_addr, guard_addr, tls, "alice-token")
