"""PostgreSQL stops and crashes under load, behind real gRPC servers.

A throwaway cluster (its own port and data dir) backs a lease server and a guard
running in this process; six client threads acquire, write with an idempotency
key, and release through the SDK while the database is stopped (``pg_ctl stop -m
fast``), started, crashed (SIGKILL to the postmaster and its children), and started
again. During each outage calls fail with ``BackendUnavailableError`` and none
outlives its deadline; afterwards the servers serve again by themselves, and the
chaos checker finds, in the recorded history with final reads of every key, no
token granted twice or out of order and no acknowledged write lost.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from chaos.checker import check
from chaos.history import Event, Recorder
from fencing import (
    AcquireTimeoutError,
    BackendUnavailableError,
    GuardClient,
    LeaseClient,
    LeaseLost,
    StaleTokenError,
)
from fencing.testing import running_servers
from guard.stores.postgres import PostgresStore
from lease_server.backends.postgres import PostgresBackend
from tests import pg
from tests.e2e import recorded

pytestmark = [pytest.mark.postgres, pytest.mark.e2e, pytest.mark.slow]

#: The SDK's deadline per call (seconds).
RPC_TIMEOUT = 5.0
#: The servers' budget per backend call (the URL's ``timeout``).
BACKEND_TIMEOUT = 1.0
WORKERS = 6
RESOURCES = 3


@dataclass
class History:
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The chaos history (list.append is atomic: every thread records into it).
    events: list[Event] = field(default_factory=list)
    #: When a call answered BACKEND_UNAVAILABLE.
    unavailable: list[float] = field(default_factory=list)
    slowest: float = 0.0
    unexpected: list[str] = field(default_factory=list)

    def timed(self, started: float) -> None:
        with self.lock:
            self.slowest = max(self.slowest, time.monotonic() - started)

    def acks_after(self, moment: float) -> int:
        after = moment * 1e9
        return sum(
            1
            for e in list(self.events)
            if e.op == "write" and e.type == "ok" and e.t_mono_ns > after
        )

    def unavailable_between(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for at in self.unavailable if start <= at <= end)


def worker(
    i: int, lease_addr: str, guard_addr: str, history: History, stop: threading.Event
) -> None:
    rec = Recorder(history.events.append, f"worker-{i}")
    with (
        LeaseClient(lease_addr, holder=f"worker-{i}", rpc_timeout=RPC_TIMEOUT) as leases,
        GuardClient(guard_addr, rpc_timeout=RPC_TIMEOUT) as guard,
    ):
        n = 0
        while not stop.is_set():
            n += 1
            resource = f"r{n % RESOURCES}"
            started = time.monotonic()
            try:
                lease = recorded.acquire(rec, leases, resource, ttl=2, timeout=0.5)
                history.timed(started)
                started = time.monotonic()
                fence = recorded.write(rec, guard, lease, f"w{i}-{n}", f"{i}:{n}:{lease.token}")
                history.timed(started)
                assert fence >= lease.token
                started = time.monotonic()
                recorded.release(rec, lease)
                history.timed(started)
            except (AcquireTimeoutError, LeaseLost, StaleTokenError):
                history.timed(started)  # contention, or a lease that expired in an outage
            except BackendUnavailableError:
                history.timed(started)
                with history.lock:
                    history.unavailable.append(time.monotonic())
                time.sleep(0.05)
            except Exception as exc:  # anything else fails the test, after the run
                with history.lock:
                    history.unexpected.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)


def wait_for_acks(history: History, since: float, what: str, timeout: float = 30.0) -> float:
    """Seconds until a write is acknowledged after ``since`` (bounded)."""
    deadline = time.monotonic() + timeout
    while history.acks_after(since) == 0:
        assert time.monotonic() < deadline, f"no acknowledged write within {timeout} s {what}"
        time.sleep(0.05)
    return time.monotonic() - since


def test_servers_ride_out_postgres_stops_and_crashes() -> None:
    history = History()
    stop = threading.Event()
    with pg.cluster() as cluster:
        url = pg.with_schema(cluster.dsn, "fencing") + f"&timeout={BACKEND_TIMEOUT}"
        with running_servers(PostgresBackend(url), PostgresStore(url)) as servers:
            threads = [
                threading.Thread(
                    target=worker,
                    args=(i, servers.lease_address, servers.guard_address, history, stop),
                )
                for i in range(WORKERS)
            ]
            for t in threads:
                t.start()
            try:
                wait_for_acks(history, 0.0, "at the start")
                time.sleep(1.0)
                outages = []
                recovery = []
                for how in ("fast stop", "crash"):
                    down = time.monotonic()
                    if how == "crash":
                        cluster.crash()
                    else:
                        cluster.stop("fast")
                    time.sleep(2.5)
                    up = time.monotonic()
                    outages.append((down, up))
                    cluster.start()
                    recovery.append(wait_for_acks(history, time.monotonic(), f"after the {how}"))
                    time.sleep(1.0)
            finally:
                stop.set()
                for t in threads:
                    t.join(30)
            assert not any(t.is_alive() for t in threads), "a client thread hung"

            writes = {(e.resource, e.key) for e in history.events if e.op == "write"}
            reader = Recorder(history.events.append, "final")
            with GuardClient(servers.guard_address) as guard:
                for resource, key in sorted(writes):
                    assert key is not None
                    recorded.final_read(reader, guard, resource, key)
    result = check(history.events, mode="monotonic")
    ops = result.stats.ops
    print(
        f"\n{ops['acquire'].get('ok', 0)} grants, {result.stats.writes_ok} acknowledged "
        f"writes, {len(history.unavailable)} BACKEND_UNAVAILABLE; slowest call "
        f"{history.slowest:.2f} s; first write after restart in "
        + ", ".join(f"{r:.2f} s" for r in recovery)
    )
    assert history.unexpected == []
    assert history.slowest < RPC_TIMEOUT  # nothing hung up to its deadline
    for down, up in outages:
        assert history.unavailable_between(down, up + BACKEND_TIMEOUT) > 0
    # No token granted twice or out of order, no acknowledged write lost or overwritten
    # by an older token, across the stop and the crash.
    assert result.valid, result.summary()
    assert result.stats.writes_ok > 0
