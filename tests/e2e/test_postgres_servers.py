"""Many lease-server processes on one PostgreSQL schema, driven through the SDK.

Two real ``python -m lease_server --backend postgres://...`` processes share a
fresh schema; clients talk to both. Checked from the clients' side alone, by the
chaos checker on the recorded history (one monotonic clock in this process): per
resource, every granted token is unique, and a grant that completed before
another was requested has the smaller token.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from chaos.checker import check
from chaos.history import Event, Recorder
from fencing import AcquireTimeoutError, LeaseClient, LeaseLost
from tests.e2e import recorded

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
SERVER_ARGS = ("--listen", "127.0.0.1:0", "--log-level", "WARNING")


@contextlib.contextmanager
def lease_servers(
    url: str, count: int, command: Sequence[str] = ("-m", "lease_server", *SERVER_ARGS)
) -> Iterator[list[str]]:
    """Start ``count`` lease-server processes on ``url`` at once (``python COMMAND
    --backend URL``, printing ``listening on HOST:PORT``); yield their addresses."""
    with lease_server_processes(url, count, command) as started:
        yield [address for address, _ in started]


@contextlib.contextmanager
def lease_server_processes(
    url: str, count: int, command: Sequence[str] = ("-m", "lease_server", *SERVER_ARGS)
) -> Iterator[list[tuple[str, subprocess.Popen[str]]]]:
    """Start ``count`` lease-server processes on ``url`` at once; yield (address, process)
    of each (a test may kill one; the rest are stopped on exit)."""
    procs: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="fencing-e2e-") as tmp, contextlib.ExitStack() as stack:
        logs = [Path(tmp) / f"server-{i}.log" for i in range(count)]
        try:
            for log in logs:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, *command, "--backend", url],
                        stdout=subprocess.PIPE,
                        # A file, not a pipe: a chatty server must never block on stderr.
                        stderr=stack.enter_context(log.open("w")),
                        text=True,
                        cwd=REPO,
                    )
                )
            addresses = []
            for proc, log in zip(procs, logs, strict=True):
                assert proc.stdout is not None
                line = proc.stdout.readline()
                if "listening on" not in line:
                    raise AssertionError(
                        f"a lease server did not start: {line!r}\n{log.read_text()}"
                    )
                addresses.append(line.split("listening on ")[1].split()[0])
            yield list(zip(addresses, procs, strict=True))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                if proc.stdout:
                    proc.stdout.close()


def test_two_servers_grant_unique_increasing_tokens(postgres_url: str) -> None:
    events: list[Event] = []  # list.append is atomic: every thread records into it
    abandoned = [0]
    with lease_servers(postgres_url, 2) as addresses:
        stop_at = time.monotonic() + 4.0

        def worker(i: int) -> None:
            rng = random.Random(i)
            rec = Recorder(events.append, f"worker-{i}")
            with LeaseClient(addresses[i % 2], holder=f"worker-{i}") as client:
                while time.monotonic() < stop_at:
                    try:
                        lease = recorded.acquire(
                            rec, client, f"r{rng.randrange(20)}", ttl=0.5, timeout=0.5
                        )
                    except AcquireTimeoutError:
                        continue
                    if rng.random() < 0.1:
                        abandoned[0] += 1  # left to expire: the next grant is a takeover
                        rec.lost(lease.resource, lease.token, reason="abandoned")
                        continue
                    with contextlib.suppress(LeaseLost):  # it may expire on a slow machine
                        recorded.release(rec, lease)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a client thread hung"
        result = check(events, mode="monotonic")
        grants = [e for e in events if e.op == "acquire" and e.type == "ok"]
        with LeaseClient(addresses[0]) as client:
            for resource in {e.resource for e in grants}:
                issued = max(e.token or 0 for e in grants if e.resource == resource)
                assert client.describe(resource).last_token >= issued
    assert result.valid, result.summary()  # unique tokens, ordered in real time
    assert len(grants) > 100, len(grants)
    assert {e.process for e in grants} >= {"worker-0", "worker-1"}  # both servers granted
    assert abandoned[0] > 0


def test_a_waiter_on_one_server_wakes_on_a_release_through_the_other(
    postgres_url: str,
) -> None:
    """The release's NOTIFY reaches the other process; its 100 ms re-check is only the fallback."""
    latencies = []
    with (
        lease_servers(postgres_url, 2) as (a, b),
        LeaseClient(a, holder="holder") as holder,
        LeaseClient(b, holder="waiter") as waiter,
    ):
        for _ in range(5):
            lease = holder.acquire("hot", ttl=30)
            got: dict[str, float | int] = {}

            def wait(got: dict[str, float | int]) -> None:
                taken = waiter.acquire("hot", ttl=5, timeout=20)
                got["at"] = time.monotonic()
                got["token"] = taken.token
                taken.release()

            thread = threading.Thread(target=wait, args=(got,))
            thread.start()
            time.sleep(0.5)  # the waiter is now parked inside server b
            assert thread.is_alive() and not got
            released_at = time.monotonic()
            lease.release()
            thread.join(20)
            assert not thread.is_alive()
            assert got["token"] == lease.token + 1
            latencies.append(float(got["at"]) - released_at)
    print(
        f"\nwake-up across servers: median {statistics.median(latencies) * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms over {len(latencies)} releases"
    )
    assert max(latencies) < 2.0  # a hang guard; expected: a few ms
