"""A token nobody was granted cannot wedge a resource for good: the operator's reset.

A write with token 2**63 - 1 (never granted) raises a monotonic guard's fence beyond
every real token. ``fencing fence reset RESOURCE`` asks the lease server for the
resource's last_token and resets the fence to it over ``ResetFence``: the next holder
writes again, and a former holder, a real process paused with SIGSTOP through the
takeover, the wedge and the reset, is still refused when it wakes. The reset needs
its own permission (``reset_fence``, never part of ``"*"``), is logged at WARNING
with who, what, from and to, and is counted.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import (
    Claim,
    GuardClient,
    LeaseClient,
    PermissionDeniedError,
    Put,
    StaleTokenError,
)
from fencing.testing import RunningServers, running_servers
from serving.auth import AuthPolicy
from serving.server import ServerOptions

pytestmark = pytest.mark.e2e

WEDGE = 2**63 - 1

FORMER_HOLDER = textwrap.dedent(
    """
    import sys
    from fencing import Claim, GuardClient, LeaseClient, Put, StaleTokenError

    lease_addr, guard_addr = sys.argv[1], sys.argv[2]
    with LeaseClient(lease_addr, holder="former") as leases, GuardClient(guard_addr) as guard:
        lease = leases.acquire("ledger", ttl=0.5)
        guard.put(lease, "balance", b"former: 100")
        print(lease.token, flush=True)
        sys.stdin.readline()  # paused (SIGSTOP) before this returns; woken after
        try:
            guard.put(Claim("ledger", lease.token), "balance", b"former: late")
            print("ACCEPTED", flush=True)
        except StaleTokenError as exc:
            print("STALE_TOKEN", exc.current_token, flush=True)
    """
)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(
        f"sqlite:{tmp_path / 'leases.db'}", f"sqlite:{tmp_path / 'guard.db'}"
    ) as running:
        yield running


def _cli(servers: RunningServers, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "fencingctl",
            *args,
            "--lease-addr",
            servers.lease_address,
            "--guard-addr",
            servers.guard_address,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_a_wedged_resource_is_usable_after_the_reset_and_the_paused_holder_stays_fenced(
    servers: RunningServers, caplog: pytest.LogCaptureFixture
) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    former = subprocess.Popen(
        [sys.executable, "-c", FORMER_HOLDER, servers.lease_address, servers.guard_address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert former.stdout is not None and former.stdin is not None
        former_token = int(former.stdout.readline())
        os.kill(former.pid, signal.SIGSTOP)  # its lease cannot be renewed any more
        with (
            LeaseClient(servers.lease_address, holder="next") as leases,
            GuardClient(servers.guard_address) as guard,
            GuardClient(servers.guard_address) as hostile,
        ):
            lease = leases.acquire("ledger", ttl=30, timeout=10)
            assert lease.token > former_token
            # A buggy or hostile client allowed to write the prefix wedges the resource.
            hostile.put(Claim("ledger", WEDGE), "balance", b"wedge")
            with pytest.raises(StaleTokenError) as wedged:  # the real holder is locked out
                guard.put(lease, "balance", b"next: 200")
            assert wedged.value.current_token == WEDGE
            with caplog.at_level(logging.WARNING, logger="guard.service"):
                done = _cli(servers, "fence", "reset", "ledger")
            assert done.returncode == 0, done.stderr
            assert f"previous_fence={WEDGE}" in done.stdout
            assert f"fence={lease.token}" in done.stdout
            assert f"last_token={lease.token}" in done.stdout
            audit = [r for r in caplog.records if "fence reset" in r.getMessage()]
            assert len(audit) == 1
            assert f"from={WEDGE} to={lease.token}" in audit[0].getMessage()
            assert guard.put(lease, "balance", b"next: 200") == lease.token
            os.kill(former.pid, signal.SIGCONT)
            former.stdin.write("\n")
            former.stdin.flush()
            verdict = former.stdout.readline().split()
            assert verdict == ["STALE_TOKEN", str(lease.token)]
            record = guard.read("ledger", "balance")
            assert record is not None and record.value == b"next: 200"
            exposed = servers.guard.metrics.render()
            assert 'fencing_guard_fence_resets_total{prefix="ledger"} 1.0' in exposed
    finally:
        os.kill(former.pid, signal.SIGCONT)
        former.kill()
        former.wait(10)
        for pipe in (former.stdin, former.stdout):
            if pipe is not None:
                pipe.close()


def test_control_a_reset_below_the_granted_token_lets_the_former_holder_in(
    servers: RunningServers,
) -> None:
    """Why the reset takes the lease server's last_token: reset lower (to 0 here, which
    a monotonic guard alone cannot refuse) and the former holder's late write lands."""
    with (
        LeaseClient(servers.lease_address, holder="a") as leases,
        GuardClient(servers.guard_address) as guard,
    ):
        first = leases.acquire("acct", ttl=0.3)
        guard.put(first, "k", b"first")
        time.sleep(0.4)
        second = leases.acquire("acct", ttl=30)
        guard.put(second, "k", b"second")
        guard.put(Claim("acct", WEDGE), "k", b"wedge")
        guard.reset_fence("acct", 0)
        assert guard.put(Claim("acct", first.token), "k", b"late") == first.token  # landed


def test_the_reset_needs_its_own_permission(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(
        textwrap.dedent(
            """
            [principals.app]
            tokens = ["app-token"]
            allow = [{ prefix = "", actions = ["*"] }]

            [principals.oncall]
            tokens = ["oncall-token"]
            allow = [{ prefix = "orders/", actions = ["describe", "read", "reset_fence"] }]
            """
        )
    )
    options = ServerOptions(auth=AuthPolicy.load(path))
    with running_servers(options=options) as servers:
        with GuardClient(servers.guard_address, token="app-token") as app:
            app.put(Claim("orders/1", WEDGE), "k", b"wedge")
            with pytest.raises(PermissionDeniedError):  # "*" does not grant it
                app.reset_fence("orders/1", 0)
        with GuardClient(servers.guard_address, token="oncall-token") as oncall:
            with pytest.raises(PermissionDeniedError):  # per prefix, like the rest
                oncall.reset_fence("billing/1", 0)
            reset = oncall.reset_fence("orders/1", 3)
            assert (reset.previous_fence, reset.fence) == (WEDGE, 3)
            assert oncall.describe_fence("orders/1") == 3
        with GuardClient(servers.guard_address, token="app-token") as app:
            assert app.put(Claim("orders/1", 3), "k", b"v") == 3
            with pytest.raises(StaleTokenError):
                app.write(Claim("orders/1", 2), Put("k", b"old"))


def test_reset_fence_checks_to_token_at_the_edge(servers: RunningServers) -> None:
    import grpc

    from fencing.v1 import guard_pb2, guard_pb2_grpc

    with grpc.insecure_channel(servers.guard_address) as channel:
        stub = guard_pb2_grpc.GuardServiceStub(channel)
        with pytest.raises(grpc.RpcError) as bad:
            stub.ResetFence(guard_pb2.ResetFenceRequest(resource="r", to_token=2**63))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "to_token" in (bad.value.details() or "")
        with pytest.raises(grpc.RpcError) as nameless:
            stub.ResetFence(guard_pb2.ResetFenceRequest(resource="", to_token=1))
        assert nameless.value.code() == grpc.StatusCode.INVALID_ARGUMENT
