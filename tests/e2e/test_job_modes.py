"""The mode table for jobs (README "Fence modes", docs/modes.md), one scenario per row.

Worker A, a real process (``python -m tests.e2e.queue_worker``), claims a job and
writes its result through the guard while the claim is live; then it is frozen with
SIGSTOP past its ttl (its heartbeats stop with it). Worker B, another process, rescues
the job and has **not** written; A resumes (SIGCONT) and writes again with its old
claim. Per mode:

- ``monotonic`` ACCEPTS the late write: the control, asserted (the guard has seen no
  newer token of the job's resource);
- promise (B runs ``Worker(..., fence=[guard])``), ``watch`` (the guard follows the
  lease server's events, where the rescue is logged) and ``strict`` (the write's own
  transaction checks the live claim) REJECT it, and nothing of it lands.

Backends: the guard's store on SQLite, PostgreSQL and Redis. Jobs and their events live
beside the leases (a sibling SQLite file, or the same PostgreSQL schema); Redis keeps no
jobs, so its row runs the guard's Redis store against a SQLite lease server, and
strict, which needs the claim in the store's own database, runs on PostgreSQL only.
In every mode the queue refuses A's Complete (its claim was taken over).
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

import pytest

from fencing import GuardClient, QueueClient
from fencing.testing import RunningServers, running_servers
from guard.fence import FenceMode
from tests import pg, redis_server
from tests.e2e.test_queue_workers import WorkerProc, spawn  # noqa: F401  (fixture)

pytestmark = pytest.mark.e2e

HANG_GUARD = 30.0  # seconds: only a bug waits this long
QUEUE = "charges"

ROWS = [
    pytest.param("sqlite", "monotonic", id="sqlite-monotonic"),
    pytest.param("sqlite", "promise", id="sqlite-promise"),
    pytest.param("sqlite", "watch", id="sqlite-watch"),
    pytest.param("postgres", "monotonic", id="postgres-monotonic", marks=pytest.mark.postgres),
    pytest.param("postgres", "promise", id="postgres-promise", marks=pytest.mark.postgres),
    pytest.param("postgres", "watch", id="postgres-watch", marks=pytest.mark.postgres),
    pytest.param(
        "postgres",
        "strict",
        id="postgres-strict",
        marks=pytest.mark.postgres,
    ),
    pytest.param("redis", "monotonic", id="redis-monotonic", marks=pytest.mark.redis),
    pytest.param("redis", "promise", id="redis-promise", marks=pytest.mark.redis),
    pytest.param("redis", "watch", id="redis-watch", marks=pytest.mark.redis),
]

ServersFactory = Callable[[str, str], AbstractContextManager[RunningServers]]


@pytest.fixture
def make_servers(tmp_path: Path) -> ServersFactory:
    @contextmanager
    def factory(kind: str, mode: str) -> Iterator[RunningServers]:
        # Promise is the client's step (B's Worker fences): the guard itself is monotonic.
        guard_mode = FenceMode.MONOTONIC if mode == "promise" else FenceMode(mode)
        with ExitStack() as stack:
            lease_url = f"sqlite:{tmp_path / 'leases.db'}"  # jobs: leases-queue.db beside it
            store_url = f"sqlite:{tmp_path / 'guard.db'}"
            if kind == "postgres":  # leases, jobs, events and the guard in one fresh schema
                dsn = pg.test_dsn()
                name = f"{pg.SCHEMA_PREFIX}{secrets.token_hex(6)}"
                stack.callback(lambda: asyncio.run(pg.drop_schema(dsn, name)))
                lease_url = store_url = pg.with_schema(dsn, name)
            elif kind == "redis":
                url = redis_server.SERVERS.standalone_url()
                prefix = redis_server.unique_prefix()
                stack.callback(lambda: asyncio.run(redis_server.drop_prefix(url, prefix)))
                store_url = f"{url}?prefix={prefix}"
            yield stack.enter_context(running_servers(lease_url, store_url, mode=guard_mode))

    return factory


def wait_for_fence(guard: GuardClient, resource: str, fence: int) -> None:
    """The watch window is the event's delivery: wait for it, never for a fixed time."""
    deadline = time.monotonic() + HANG_GUARD
    while guard.describe_fence(resource) < fence:
        assert time.monotonic() < deadline, f"fence of {resource} never reached {fence}"
        time.sleep(0.02)


@pytest.mark.parametrize(("kind", "mode"), ROWS)
def test_a_paused_worker_writes_after_its_job_was_rescued(
    make_servers: ServersFactory,
    spawn: Callable[..., WorkerProc],  # noqa: F811
    kind: str,
    mode: str,
) -> None:
    with (
        make_servers(kind, mode) as servers,
        QueueClient(servers.queue_address) as queue,
        GuardClient(servers.guard_address) as guard,
    ):
        queue.enqueue(QUEUE, "charge card 7")
        common = ("--addr", servers.queue_address, "--guard", servers.guard_address)
        a = spawn(
            *common, "--queue", QUEUE, "--handler", "late", "--early", "--work", "2",
            "--ttl", "1",
        )  # fmt: skip
        early = a.next("early")
        resource = f"job/{QUEUE}/{early['job']}"
        assert early["outcome"] == "landed", early  # the live claim writes, in every mode
        a.signal(signal.SIGSTOP)  # past its ttl: its heartbeats stop with it
        promise = ("--fence",) if mode == "promise" else ()
        b = spawn(
            *common, "--queue", QUEUE, "--handler", "hold", "--work", "120", "--ttl", "30",
            "--grace", "0.2",
            *promise,
        )  # fmt: skip
        rescued = b.next("start", timeout=HANG_GUARD)  # after B's promise, when it has one
        assert rescued["job"] == early["job"] and rescued["token"] > early["token"]
        if mode == "watch":
            wait_for_fence(guard, resource, rescued["token"])
        before = guard.read(resource, "result")
        assert before is not None and before.written_by_token == early["token"]  # B never wrote
        a.signal(signal.SIGCONT)
        late = a.next("effect", timeout=HANG_GUARD)
        a.signal(signal.SIGTERM)
        counts = a.next("exit")["counts"]
        record = guard.read(resource, "result")
        b.signal(signal.SIGTERM)
        b.next("exit")
    assert counts.get("refused", 0) == 1 and counts.get("completed", 0) == 0  # Complete refused
    assert record is not None
    if mode == "monotonic":  # the control: the window, asserted
        assert late["outcome"] == "landed", late
        assert (record.value, record.written_by_token) == (
            f"late:{early['token']}".encode(),
            early["token"],
        )
        return
    assert late["outcome"] == "rejected", late
    if mode == "strict":
        assert late["error"] == "LeaseLost", late  # not the live claim (not below the fence)
    else:
        assert (late["error"], late["fence"]) == ("StaleTokenError", rescued["token"]), late
    # Nothing of the late write landed: the result is still the live claim's.
    assert (record.value, record.written_by_token) == (
        f"early:{early['token']}".encode(),
        early["token"],
    )
