"""Queue workers as real processes against real servers: exclusion across processes,
kill -9 mid-job, a paused worker fenced (with its unfenced control), graceful SIGTERM.

The servers run in this process (a thread); every worker is ``python -m
tests.e2e.queue_worker`` in its own session, so SIGKILL/SIGSTOP/SIGTERM hit it alone.
Each test runs on every queue backend in ``SERVER_BACKENDS``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import queue as queue_module
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from fencing import GuardClient, QueueClient
from fencing.client._queue import QueueStats
from fencing.testing import RunningServers, running_servers
from guard.fence import FenceMode
from tests import pg

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
Event = dict[str, Any]
ServersFactory = Callable[[FenceMode], AbstractContextManager[RunningServers]]


class WorkerProc:
    """``python -m tests.e2e.queue_worker ...``; its JSON lines collected by a thread."""

    def __init__(self, log_dir: Path, *args: str) -> None:
        self.stderr_path = log_dir / f"worker-{time.monotonic_ns()}.log"
        self._stderr = self.stderr_path.open("w")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.queue_worker", *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        self.events: list[Event] = []
        self._queue: queue_module.Queue[Event | None] = queue_module.Queue()
        assert self.popen.stdout is not None
        threading.Thread(target=self._pump, args=(self.popen.stdout,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            if line.startswith("{"):
                self._queue.put(json.loads(line))
        self._queue.put(None)

    def next(self, event: str, timeout: float = 30.0) -> Event:
        """The next line whose ``event`` is ``event`` (others are kept in ``events``)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {event!r} within {timeout}s; {self.stderr_tail()}")
            try:
                item = self._queue.get(timeout=left)
            except queue_module.Empty:
                continue
            if item is None:
                raise AssertionError(f"worker exited before {event!r}; {self.stderr_tail()}")
            self.events.append(item)
            if item["event"] == event:
                return item

    def drain(self) -> list[Event]:
        """Every line printed so far (the process has exited or is stopped)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue_module.Empty:
                return self.events
            if item is not None:
                self.events.append(item)

    def signal(self, sig: signal.Signals) -> None:
        os.killpg(self.popen.pid, sig)

    def stderr_tail(self) -> str:
        self._stderr.flush()
        return "stderr: " + self.stderr_path.read_text()[-3000:]

    def close(self) -> None:
        if self.popen.poll() is None:
            try:
                self.signal(signal.SIGCONT)
                self.signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.popen.wait(10)
        self._stderr.close()
        if self.popen.stdout is not None:
            self.popen.stdout.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., WorkerProc]]:
    procs: list[WorkerProc] = []

    def start(*args: str) -> WorkerProc:
        proc = WorkerProc(tmp_path, *args)
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            proc.close()


SERVER_BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=SERVER_BACKENDS)
def make_servers(request: pytest.FixtureRequest, tmp_path: Path) -> ServersFactory:
    kind = request.param

    @contextmanager
    def factory(mode: FenceMode = FenceMode.MONOTONIC) -> Iterator[RunningServers]:
        with ExitStack() as stack:
            if kind == "sqlite":
                lease_url = f"sqlite:{tmp_path / 'leases.db'}"
                queue_url = f"sqlite:{tmp_path / 'queue.db'}"
            else:  # leases and jobs in one fresh schema, dropped afterwards
                dsn = pg.test_dsn()
                name = f"{pg.SCHEMA_PREFIX}{secrets.token_hex(6)}"
                stack.callback(lambda: asyncio.run(pg.drop_schema(dsn, name)))
                lease_url = queue_url = pg.with_schema(dsn, name)
            yield stack.enter_context(
                running_servers(
                    lease_url, f"sqlite:{tmp_path / 'guard.db'}", mode=mode, queue=queue_url
                )
            )

    return factory


def wait_stats(
    client: QueueClient, ok: Callable[[QueueStats], bool], queue: str = "e2e", timeout: float = 60
) -> QueueStats:
    deadline = time.monotonic() + timeout
    stats = None
    while time.monotonic() < deadline:
        stats = {s.queue: s for s in client.stats(queue)}.get(queue)
        if stats is not None and ok(stats):
            return stats
        time.sleep(0.05)
    raise AssertionError(f"timed out; last stats {stats}")


def test_workers_in_separate_processes_never_hold_a_job_at_once(
    make_servers: ServersFactory, spawn: Callable[..., WorkerProc]
) -> None:
    """4 processes x 3 threads on 120 jobs, half of them on 6 ordering keys: every job is
    claimed once and done once, no two claims of a job overlap, and each key runs one
    job at a time in enqueue order."""
    with make_servers(FenceMode.MONOTONIC) as servers, QueueClient(servers.queue_address) as q:
        ids_by_key: dict[str, list[int]] = defaultdict(list)
        for i in range(120):
            key = f"k{i % 6}" if i % 2 else ""
            job = q.enqueue("e2e", f"p{i}", ordering_key=key)
            if key:
                ids_by_key[key].append(job.id)
        procs = [
            spawn("--addr", servers.queue_address, "--concurrency", "3", "--work", "0.005")
            for _ in range(4)
        ]
        for proc in procs:
            proc.next("ready")
        wait_stats(q, lambda s: s.succeeded == 120)
        for proc in procs:
            proc.signal(signal.SIGTERM)
        exits = [proc.next("exit") for proc in procs]
    events = [e for proc in procs for e in proc.drain()]
    starts = [e for e in events if e["event"] == "start"]
    ends = {(e["job"], e["token"]): e for e in events if e["event"] == "end"}
    claims: dict[int, list[Event]] = defaultdict(list)
    for s in starts:
        claims[s["job"]].append(s)
    assert len(claims) == 120
    assert all(len(c) == 1 for c in claims.values()), "a job was claimed twice"
    assert len({s["token"] for s in starts}) == 120
    assert sum(e["counts"].get("completed", 0) for e in exits) == 120
    assert len({s["pid"] for s in starts}) > 1  # the work really was shared
    for key, ids in ids_by_key.items():
        runs = sorted(
            (s["at"], ends[(s["job"], s["token"])]["at"], s["job"])
            for s in starts
            if s["key"] == key
        )
        assert [job for _, _, job in runs] == ids, f"key {key} ran out of order"
        for (_, end, _), (start, _, _) in itertools.pairwise(runs):
            assert end <= start, f"key {key}: two jobs overlapped"


def test_kill_9_mid_job_another_worker_finishes_with_one_effect_per_key(
    make_servers: ServersFactory, spawn: Callable[..., WorkerProc]
) -> None:
    with (
        make_servers(FenceMode.MONOTONIC) as servers,
        QueueClient(servers.queue_address) as q,
        GuardClient(servers.guard_address) as guard,
    ):
        created = [q.enqueue("e2e", f"p{i}").id for i in range(3)]
        a = spawn(
            "--addr", servers.queue_address, "--guard", servers.guard_address,
            "--handler", "effect", "--hang", "--concurrency", "3", "--ttl", "1",
        )  # fmt: skip
        first = [a.next("effect") for _ in range(3)]
        assert all(not e["replayed"] for e in first)
        a.signal(signal.SIGKILL)  # after the effect, before Complete
        a.popen.wait(10)
        b = spawn(
            "--addr", servers.queue_address, "--guard", servers.guard_address,
            "--handler", "effect", "--concurrency", "3",
        )  # fmt: skip
        second = [b.next("effect", timeout=30) for _ in range(3)]
        stats = wait_stats(q, lambda s: s.succeeded == 3)
        assert stats.running == 0 and stats.dead == 0
        by_job = {e["job"]: e for e in first}
        for e in second:
            old = by_job[e["job"]]
            assert e["replayed"], "the effect was applied a second time"
            assert e["token"] > old["token"] and e["attempt"] == 2
            resource = f"job/e2e/{e['job']}"
            assert guard.read(resource, f"effect/{e['job']}/{old['token']}") is not None
            assert guard.read(resource, f"effect/{e['job']}/{e['token']}") is None
        assert sorted(by_job) == sorted(created)
        b.signal(signal.SIGTERM)
        assert b.next("exit")["counts"]["completed"] == 3


@pytest.mark.parametrize("mode", [FenceMode.MONOTONIC, FenceMode.OFF], ids=["fenced", "control"])
def test_a_paused_worker_resumes_and_its_complete_and_effect_are_rejected(
    make_servers: ServersFactory, spawn: Callable[..., WorkerProc], mode: FenceMode
) -> None:
    """SIGSTOP a worker past its lease; another takes the job over and finishes it; on
    SIGCONT the old worker's Complete is refused and, through a fencing guard, so is its
    effect. The control (guard with fencing off) shows the late effect landing."""
    with (
        make_servers(mode) as servers,
        QueueClient(servers.queue_address, worker="rescuer") as q,
        GuardClient(servers.guard_address) as guard,
    ):
        q.enqueue("e2e", "pay invoice 7")
        a = spawn(
            "--addr", servers.queue_address, "--guard", servers.guard_address,
            "--handler", "late", "--work", "2", "--ttl", "1",
        )  # fmt: skip
        started = a.next("start")
        a.signal(signal.SIGSTOP)  # its heartbeats stop too
        (job,) = q.claim("e2e", ttl=30, wait=15)  # rescued once A's lease expired
        assert job.id == started["job"] and job.token > started["token"]
        guard.put(job, "result", b"rescuer")
        q.complete(job)
        a.signal(signal.SIGCONT)
        late = a.next("effect", timeout=30)
        a.signal(signal.SIGTERM)
        counts = a.next("exit")["counts"]
        record = guard.read(job.resource, "result")
    assert record is not None
    assert counts.get("refused", 0) == 1 and counts.get("completed", 0) == 0  # Complete refused
    assert counts["lost"] == 1
    if mode is FenceMode.MONOTONIC:
        assert late["outcome"] == "rejected" and late["fence"] == job.token
        assert (record.value, record.written_by_token) == (b"rescuer", job.token)
    else:  # the control: without the check, the paused worker's stale write lands
        assert late["outcome"] == "landed"
        assert record.value == f"late:{started['token']}".encode()
        assert record.written_by_token == started["token"]


def test_sigterm_gives_back_claimed_jobs_and_starts_nothing_new(
    make_servers: ServersFactory, spawn: Callable[..., WorkerProc]
) -> None:
    with make_servers(FenceMode.MONOTONIC) as servers, QueueClient(servers.queue_address) as q:
        for i in range(6):
            q.enqueue("e2e", f"p{i}")
        w = spawn(
            "--addr", servers.queue_address, "--handler", "hold", "--work", "30",
            "--concurrency", "2", "--grace", "0.5",
        )  # fmt: skip
        w.next("start")
        w.next("start")
        signalled_at = time.monotonic()
        w.signal(signal.SIGTERM)
        counts = w.next("exit", timeout=15)["counts"]
        assert w.popen.wait(10) == 0
        events = w.drain()
        stats = wait_stats(q, lambda s: s.running == 0)
        again = q.claim("e2e", batch=10)
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) == 2 and all(e["at"] < signalled_at for e in starts)
    assert counts["released"] == 2 and counts.get("completed", 0) == 0
    assert (stats.ready, stats.running, stats.retrying) == (6, 0, 0)
    assert len(again) == 6 and {j.attempt for j in again} == {1}


def test_sigterm_lets_running_jobs_finish_within_the_grace(
    make_servers: ServersFactory, spawn: Callable[..., WorkerProc]
) -> None:
    with make_servers(FenceMode.MONOTONIC) as servers, QueueClient(servers.queue_address) as q:
        for i in range(6):
            q.enqueue("e2e", f"p{i}")
        w = spawn(
            "--addr", servers.queue_address, "--handler", "record", "--work", "1",
            "--concurrency", "2", "--grace", "20",
        )  # fmt: skip
        w.next("start")
        w.next("start")
        signalled_at = time.monotonic()
        w.signal(signal.SIGTERM)
        counts = w.next("exit", timeout=20)["counts"]
        events = w.drain()
        (stats,) = q.stats("e2e")
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) == 2 and all(e["at"] < signalled_at for e in starts)
    assert counts["completed"] == 2 and counts.get("released", 0) == 0
    assert (stats.succeeded, stats.ready, stats.running) == (2, 4, 0)


@pytest.mark.parametrize("fenced", [True, False], ids=["fence", "control"])
def test_a_handler_abandoned_at_shutdown_cannot_write_late(
    tmp_path: Path, spawn: Callable[..., WorkerProc], fenced: bool
) -> None:
    """SIGTERM, then ``grace``: the worker releases a job whose handler is still running
    and abandons the handler, in a process that lives on. The next worker claims the job
    with ``fence=[guard]`` (the README's worker): the abandoned handler's late write is
    refused. The control, the next worker without ``fence=``, writing nothing yet: the
    monotonic guard has seen no newer token, and the late write lands."""
    with (
        running_servers(
            f"sqlite:{tmp_path / 'leases.db'}", f"sqlite:{tmp_path / 'guard.db'}"
        ) as servers,
        QueueClient(servers.queue_address) as queue,
    ):
        queue.enqueue("e2e", b"charge card 7")
        common = ("--addr", servers.queue_address, "--guard", servers.guard_address)
        a = spawn(*common, "--handler", "late", "--work", "5", "--grace", "0.2", "--linger", "60")
        first = a.next("start")
        a.signal(signal.SIGTERM)
        assert a.next("exit")["counts"]["released"] == 1, a.events
        a.signal(signal.SIGSTOP)  # the abandoned handler, frozen before its late write
        b = spawn(*common, "--handler", "hold", "--work", "60", *(["--fence"] if fenced else []))
        second = b.next("start")  # after its promise, when it has one
        assert second["job"] == first["job"] and second["token"] > first["token"]
        a.signal(signal.SIGCONT)
        late = a.next("effect")
    assert late["token"] == first["token"]
    if fenced:
        assert (late["outcome"], late["fence"]) == ("rejected", second["token"]), late
    else:
        assert late["outcome"] == "landed", late
