"""The harness's faults on real processes: each does what it says and is undone on exit."""

from __future__ import annotations

import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from chaos.cluster import Cluster, Topology
from chaos.faults import (
    FaultLog,
    crashed,
    crashed_together,
    half_open,
    partitioned,
    paused,
    read_faults,
    reset_link,
)
from chaos.processes import Proc, ProcessError
from chaos.proxy import ThreadedFaultProxy
from chaos.servers import Postgres, Redis, lease_server
from fencing import BackendUnavailableError, DeadlineExceededError, LeaseClient

pytestmark = pytest.mark.timeout(120)

SLEEPER = [sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(60)"]


def state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (T: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def running(proc: Proc) -> bool:
    """Whether ``proc`` runs now (a function: ``proc.alive`` may change between reads)."""
    return proc.alive


def wait_state(pid: int, wanted: str, timeout: float = 5.0) -> str:
    end = time.monotonic() + timeout
    current = state(pid)
    while current != wanted and time.monotonic() < end:
        time.sleep(0.01)
        current = state(pid)
    return current


def sleeper(tmp_path: Path, name: str = "sleeper") -> Proc:
    return Proc(name, SLEEPER, log_path=tmp_path / f"{name}.log", ready=re.compile("ready"))


def test_paused_stops_the_process_and_resumes_it_even_when_the_block_fails(
    tmp_path: Path,
) -> None:
    proc = sleeper(tmp_path)
    log = FaultLog(tmp_path / "faults.jsonl")
    proc.start()
    try:
        assert proc.pid is not None
        with pytest.raises(RuntimeError), paused(proc, log):
            assert wait_state(proc.pid, "T") == "T"
            raise RuntimeError("the schedule broke")
        assert wait_state(proc.pid, "S") == "S"
    finally:
        proc.close()
    assert [(w.kind, w.target) for w in read_faults(tmp_path / "faults.jsonl")] == [
        ("pause", "sleeper")
    ]
    assert log.active == []


def test_crashed_kills_the_group_and_restarts(tmp_path: Path) -> None:
    proc = sleeper(tmp_path)
    log = FaultLog()
    proc.start()
    try:
        first = proc.pid
        with crashed(proc, log):
            assert proc.returncode == -signal.SIGKILL
            assert not running(proc)
        assert running(proc)
        assert proc.pid != first
        assert proc.starts == 2
        with crashed(proc, log, restart=False):
            pass
        assert not running(proc)
    finally:
        proc.close()
    assert [w.kind for w in log.windows] == ["crash", "crash"]
    assert all(w.end_ns >= w.start_ns for w in log.windows)


def test_a_process_that_never_gets_ready_is_an_error_with_its_output(tmp_path: Path) -> None:
    proc = Proc(
        "broken",
        [sys.executable, "-c", "print('no luck here'); raise SystemExit(3)"],
        log_path=tmp_path / "broken.log",
        ready=re.compile("ready"),
    )
    with pytest.raises(ProcessError, match="no luck here"):
        proc.start(timeout=10)
    assert proc.returncode == 3
    proc.close()


def test_lease_server_restarts_on_its_port_with_its_tokens(tmp_path: Path) -> None:
    server = lease_server(f"sqlite:///{tmp_path / 'leases.db'}", tmp_path)
    server.start()
    try:
        target = server.target
        with LeaseClient(target, holder="a") as leases:
            first = leases.acquire("r", ttl=5)
            with (
                crashed(server, FaultLog()),
                LeaseClient(target, rpc_timeout=0.5) as other,
                pytest.raises((BackendUnavailableError, DeadlineExceededError)),
            ):
                other.describe("r")
            assert server.target == target
            state_after = leases.describe("r")
            assert state_after.held  # the grant survived the SIGKILL
            assert state_after.token == first.token
    finally:
        server.close()


def test_cluster_puts_a_proxy_per_client_and_stops_everything(tmp_path: Path) -> None:
    code = "import sys, time; print(sys.argv[1:], flush=True); time.sleep(60)"
    show = [sys.executable, "-c", code]
    cluster = Cluster(Topology(proxy_lease=True, proxy_guard=True), tmp_path)
    with cluster:
        node = cluster.add_client("c0", [*show, "{lease}", "{guard}"])
        assert node.lease_proxy is not None
        assert node.guard_proxy is not None
        assert node.lease_target == node.lease_proxy.target != cluster.lease_target
        assert node.guard_target == node.guard_proxy.target != cluster.guard_target
        assert node.proc.argv[-2:] == [node.lease_target, node.guard_target]
        # A partition of the client's own link leaves the lease server reachable directly.
        with (
            partitioned(node.lease_proxy, FaultLog(), "c0 <-> lease-server"),
            LeaseClient(node.lease_target, rpc_timeout=0.3) as cut,
            LeaseClient(cluster.lease_target, rpc_timeout=2) as direct,
        ):
            with pytest.raises(DeadlineExceededError):
                cut.describe("r")
            assert not direct.describe("r").held
        with LeaseClient(node.lease_target, rpc_timeout=2) as healed:
            assert not healed.describe("r").held
        restarted = cluster.restart_client("c0", ["--extra"])
        assert restarted.proc.argv[-3:] == ["--incarnation", "1", "--extra"]
        procs = [node.proc, cluster.lease, cluster.guard]
    assert all(p is not None and not running(p) for p in procs)


def test_crashed_together_restarts_every_process(tmp_path: Path) -> None:
    procs = [sleeper(tmp_path, "a"), sleeper(tmp_path, "b")]
    for p in procs:
        p.start()
    try:
        pids = [p.pid for p in procs]
        with crashed_together(procs, FaultLog(), label="a+b"):
            assert not any(running(p) for p in procs)
        assert all(running(p) for p in procs)
        assert [p.pid for p in procs] != pids
    finally:
        for p in procs:
            p.close()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
@pytest.mark.parametrize(("persistence", "survives"), [("aof-always", True), ("none", False)])
def test_throwaway_redis_keeps_or_loses_its_counter_across_sigkill(
    tmp_path: Path, persistence: str, survives: bool
) -> None:
    import redis

    server = Redis(tmp_path, persistence)
    server.start()
    try:
        client = redis.Redis(port=server.port, socket_timeout=5)
        assert client.incr("tokens", 42) == 42
        client.close()
        with crashed(server, FaultLog()):
            pass
        client = redis.Redis(port=server.port, socket_timeout=5)
        assert client.get("tokens") == (b"42" if survives else None)
        client.close()
    finally:
        server.close()


def _have_postgres() -> bool:
    return shutil.which("initdb") is not None or Path("/usr/lib/postgresql/15/bin").is_dir()


@pytest.mark.skipif(not _have_postgres(), reason="needs PostgreSQL binaries")
def test_throwaway_postgres_recovers_committed_rows_after_sigkill(tmp_path: Path) -> None:
    import psycopg

    server = Postgres(tmp_path)
    server.start(timeout=60)
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v int)")
            conn.execute("INSERT INTO t VALUES (7)")
        with crashed(server, FaultLog()):
            pass
        with psycopg.connect(server.url, autocommit=True) as conn:
            row = conn.execute("SELECT v FROM t").fetchone()
        assert row == (7,)
    finally:
        server.close()


def test_half_open_and_reset_links_through_a_proxy(tmp_path: Path) -> None:
    server = lease_server(f"sqlite:///{tmp_path / 'leases.db'}", tmp_path)
    server.start()
    proxy = ThreadedFaultProxy("127.0.0.1", server.port)
    proxy.start()
    log = FaultLog()
    try:
        with LeaseClient(proxy.target, rpc_timeout=0.5) as client:
            assert not client.describe("r").held
            # Requests get through, replies do not: the caller times out.
            with (
                half_open(proxy, log, "client <-> lease", "upstream"),
                pytest.raises(DeadlineExceededError),
            ):
                client.describe("r")
            assert not client.describe("r").held
            reset_link(proxy, log, "client <-> lease")
            assert proxy.connections == 0
            for _ in range(20):  # the channel reconnects on its own (bounded)
                try:
                    assert not client.describe("r").held
                    break
                except BackendUnavailableError:
                    time.sleep(0.1)
            else:
                pytest.fail("the client did not reconnect after the reset")
    finally:
        proxy.stop()
        server.close()
    assert [(w.kind, w.end_ns == w.start_ns) for w in log.windows] == [
        ("half-open", False),
        ("reset", True),
    ]
