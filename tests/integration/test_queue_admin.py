"""Queue admin over real gRPC, on SQLite and PostgreSQL: the SDK twins, the CLI, auth.

ListJobs pages, GetJob, RetryJob, CancelJob (a running job's claim fenced: its
worker's heartbeat, complete and fail refused), RequeueDead; each refusal of a bad
field names it; each change is authorised by ``manage`` and logged with who did it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from fencing import AsyncGuardClient, AsyncQueueClient, GuardClient, LeaseLost, QueueClient
from fencing.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError
from fencing.testing import RunningServers, running_servers
from fencing.v1 import queue_pb2
from lease_server.queue.service import QueueOptions
from serving import exits
from serving.auth import AuthPolicy
from serving.server import ServerOptions
from tests import pg
from tests.integration.test_cli_lock import env

FENCING = [sys.executable, "-m", "fencingctl"]

KINDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=KINDS)
def servers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningServers]:
    with ExitStack() as stack:
        lease_url = f"sqlite:{tmp_path / 'leases.db'}"
        store_url = f"sqlite:{tmp_path / 'guard.db'}"
        if request.param == "postgres":
            dsn = pg.test_dsn()
            name = f"{pg.SCHEMA_PREFIX}{secrets.token_hex(6)}"
            stack.callback(lambda: asyncio.run(pg.drop_schema(dsn, name)))
            lease_url = store_url = pg.with_schema(dsn, name)
        yield stack.enter_context(running_servers(lease_url, store_url))


@pytest.fixture
def queue(servers: RunningServers) -> Iterator[QueueClient]:
    with QueueClient(servers.queue_address, worker="tester") as client:
        yield client


def dead_job(queue: QueueClient, name: str = "mail") -> int:
    job_id = queue.enqueue(name, b"doomed", max_attempts=1).id
    (job,) = queue.claim(name)
    assert job.id == job_id
    assert queue.fail(job, "boom").state == "dead"
    return job_id


def cli(servers: RunningServers, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FENCING, "queue", *args, "--lease-addr", servers.lease_address],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_list_pages_through_a_queue_in_id_order(queue: QueueClient) -> None:
    ids = [queue.enqueue("mail", f"m{i}").id for i in range(5)]
    queue.enqueue("other", "x")
    (running,) = queue.claim("mail")
    assert [j.id for j in queue.list_jobs("mail", page_size=2)] == ids
    assert [j.id for j in queue.list_jobs("mail", state="ready", page_size=1)] == ids[1:]
    first, token = queue.list_jobs_page("mail", page_size=3)
    rest, token = queue.list_jobs_page("mail", page_size=3, page_token=token)
    assert ([j.id for j in first + rest], token) == (ids, "")
    (info,) = queue.list_jobs("mail", state="running", include_payload=True)
    assert (info.id, info.state, info.lease_owner, info.token) == (
        running.id,
        "running",
        "tester",
        running.token,
    )
    assert info.payload == b"m0" and info.payload_size == 2
    assert info.claimed_at_ms >= info.enqueued_at_ms > 0
    assert info.lease_expires_at_ms > info.claimed_at_ms
    assert next(iter(queue.list_jobs("mail"))).payload == b""  # only when asked for


def test_get_job_shows_attempts_errors_and_times(queue: QueueClient) -> None:
    job_id = dead_job(queue)
    info = queue.get_job(job_id, queue="mail")
    assert (info.state, info.attempts, info.max_attempts, info.last_error) == ("dead", 1, 1, "boom")
    assert info.finished_at_ms >= info.claimed_at_ms > 0 and info.lease_owner == "tester"
    assert info.resource == f"job/mail/{job_id}" and info.lease_expires_at_ms == 0
    with pytest.raises(NotFoundError):
        queue.get_job(job_id, queue="other")
    with pytest.raises(NotFoundError):
        queue.get_job(job_id + 100)


def test_get_job_returns_the_attempts_history_to_both_twins(servers: RunningServers) -> None:
    with (
        QueueClient(servers.queue_address, worker="w1") as first,
        QueueClient(servers.queue_address, worker="w2") as second,
    ):
        job_id = first.enqueue("mail", b"x", max_attempts=3).id
        (one,) = first.claim("mail")
        first.fail(one, "smtp down", retry_in=0.001)
        (two,) = second.claim("mail", wait=10)  # due in 1 ms
        second.complete(two)
        info = first.get_job(job_id)
        assert [(a.attempt, a.worker, a.token, a.outcome, a.error) for a in info.history] == [
            (1, "w1", one.token, "failed", "smtp down"),
            (2, "w2", two.token, "succeeded", ""),
        ]
        assert all(0 < a.started_at_ms <= a.ended_at_ms for a in info.history)
        # A listing leaves the history out.
        (listed,) = list(first.list_jobs("mail"))
        assert listed.history == () and listed.attempts == 2

    async def main() -> None:
        async with AsyncQueueClient(servers.queue_address) as queue:
            assert (await queue.get_job(job_id)).history == info.history

    asyncio.run(main())


def test_a_cancelled_running_job_refuses_its_workers_heartbeat_complete_and_fail(
    servers: RunningServers, queue: QueueClient
) -> None:
    queue.enqueue("mail", b"a")
    (job,) = queue.claim("mail", ttl=30)
    with GuardClient(servers.guard_address) as guard:
        guard.put(job, "result", b"live")  # the live claim writes
        action = queue.cancel_job(job.id, queue="mail", reason="bad input", fence=[guard])
        assert action.changed and action.fence_token > job.token
        assert action.job.state == "cancelled" and action.job.last_error == "bad input"
        assert guard.describe_fence(job.resource) == action.fence_token
    assert queue.heartbeat(job) == [job] and job.lost.is_set()  # refused: marked lost
    with pytest.raises(LeaseLost):
        queue.complete(job)
    with pytest.raises(LeaseLost):
        queue.fail(job, "late")
    assert queue.get_job(job.id).state == "cancelled"
    again = queue.cancel_job(job.id)
    assert not again.changed and again.fence is not None  # a repeat still names the fence
    retried = queue.retry_job(job.id, queue="mail")
    assert retried.changed and retried.job.state == "ready"
    (rerun,) = queue.claim("mail")
    assert rerun.id == job.id and rerun.token > action.fence_token


def test_retry_and_requeue_dead_jobs(queue: QueueClient) -> None:
    first = dead_job(queue)
    others = [dead_job(queue) for _ in range(2)]
    action = queue.retry_job(first)
    assert action.changed and (action.job.attempts, action.job.max_attempts) == (1, 2)
    assert queue.requeue_dead("mail", limit=1) == 1
    assert queue.requeue_dead("mail") == 1
    assert queue.requeue_dead("mail") == 0
    assert [queue.get_job(i).state for i in [first, *others]] == ["ready"] * 3
    (running,) = queue.claim("mail")
    assert not queue.retry_job(running.id).changed  # running: nothing to retry


def test_bad_fields_are_named(queue: QueueClient) -> None:
    stub = queue._stub
    cases: list[tuple[Any, Any, str]] = [
        (stub.ListJobs, queue_pb2.ListJobsRequest(queue="mail", page_size=1001), "page_size"),
        (stub.ListJobs, queue_pb2.ListJobsRequest(queue="mail", page_token="x"), "page_token"),
        (stub.ListJobs, queue_pb2.ListJobsRequest(queue="mail", state="gone"), "state"),
        (stub.ListJobs, queue_pb2.ListJobsRequest(queue=""), "queue"),
        (stub.GetJob, queue_pb2.GetJobRequest(id=0), "id"),
        (stub.RequeueDead, queue_pb2.RequeueDeadRequest(queue="mail", limit=1001), "limit"),
    ]
    for method, request, field in cases:
        with pytest.raises(InvalidArgumentError) as info:
            queue._call(method, request)
        assert info.value.field == field


def test_the_async_twin_lists_cancels_and_fences(servers: RunningServers) -> None:
    async def main() -> None:
        async with (
            AsyncQueueClient(servers.queue_address, worker="aio") as queue,
            AsyncGuardClient(servers.guard_address) as guard,
        ):
            await queue.enqueue("mail", b"a")
            await queue.enqueue("mail", b"b")
            (job,) = await queue.claim("mail")
            assert [j.id async for j in queue.list_jobs("mail", page_size=1)] == [
                job.id,
                job.id + 1,
            ]
            action = await queue.cancel_job(job.id, fence=[guard])
            assert action.fence_token > job.token
            assert await guard.describe_fence(job.resource) == action.fence_token
            assert (await queue.get_job(job.id)).state == "cancelled"
            assert (await queue.retry_job(job.id)).changed
            assert await queue.requeue_dead("mail") == 0

    asyncio.run(main())


ADMIN_POLICY = """
[principals.viewer]
tokens = ["viewer-token"]
allow = [{ prefix = "mail", actions = ["describe"] }]

[principals.operator]
tokens = ["operator-token"]
allow = [{ prefix = "mail", actions = ["describe", "manage"] }]

[principals.worker]
tokens = ["worker-token"]
allow = [{ prefix = "", actions = ["enqueue", "claim"] }]
"""


def test_admin_calls_are_authorised_per_queue_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = AuthPolicy.from_dict(tomllib.loads(ADMIN_POLICY))
    with (
        running_servers(options=ServerOptions(auth=policy)) as servers,
        QueueClient(servers.queue_address, token="viewer-token") as viewer,
        QueueClient(servers.queue_address, token="operator-token") as operator,
        QueueClient(servers.queue_address, token="worker-token") as worker,
    ):
        job_id = worker.enqueue("mail", b"x").id
        other = worker.enqueue("billing", b"y").id
        with caplog.at_level(logging.INFO, logger="lease_server.queue.service"):
            assert [j.id for j in viewer.list_jobs("mail")] == [job_id]
            assert viewer.get_job(job_id, queue="mail").state == "ready"
            with pytest.raises(PermissionDeniedError):
                viewer.cancel_job(job_id, queue="mail")
            with pytest.raises(PermissionDeniedError):
                worker.cancel_job(job_id, queue="mail")  # claim is not manage
            with pytest.raises(PermissionDeniedError):
                operator.cancel_job(job_id)  # any queue: only a grant on every resource
            with pytest.raises(PermissionDeniedError):
                operator.retry_job(other, queue="billing")
            assert operator.cancel_job(job_id, queue="mail").changed
            assert operator.requeue_dead("mail") == 0
        audit = [
            (r.action, r.principal, r.queue, r.job_id)  # type: ignore[attr-defined]
            for r in caplog.records
            if hasattr(r, "principal")
        ]
        assert audit == [  # one line per call that was allowed, none for the refused
            ("list_jobs", "viewer", "mail", 0),
            ("get_job", "viewer", "mail", job_id),
            ("cancel", "operator", "mail", job_id),
            ("requeue_dead", "operator", "mail", 0),
        ]
        (line,) = [r for r in caplog.records if getattr(r, "action", "") == "cancel"]
        assert "by=operator" in line.getMessage()
        registry = servers.lease.metrics.registry
        assert registry.get_sample_value("fencing_queue_jobs_total", {"outcome": "cancelled"}) == 1


def test_the_cli_lists_a_delayed_job_as_scheduled_and_a_finished_jobs_worker(
    servers: RunningServers,
) -> None:
    with QueueClient(servers.queue_address, worker="tester") as queue:
        done = queue.enqueue("mail", b"now").id
        (job,) = queue.claim("mail")
        queue.complete(job)
        later = queue.enqueue("mail", b"later", delay=3600).id
        listed = cli(servers, "jobs", "mail", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert [(r["id"], r["state"], r["lease_owner"]) for r in rows] == [
            (done, "succeeded", "tester"),
            (later, "scheduled", ""),
        ]
        only = cli(servers, "jobs", "mail", "--state", "scheduled", "--json")
        assert only.returncode == 0, only.stderr
        assert [json.loads(line)["id"] for line in only.stdout.splitlines()] == [later]
        none_due = cli(servers, "jobs", "mail", "--state", "ready", "--json")
        assert none_due.returncode == 0 and none_due.stdout == "", none_due.stderr
        shown = cli(servers, "job", str(later), "--json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["state"] == "scheduled"
        finished = cli(servers, "job", str(done), "--json")
        assert json.loads(finished.stdout)["lease_owner"] == "tester"
        assert [s.scheduled for s in queue.stats("mail")] == [1]


def test_the_cli_lists_shows_cancels_retries_and_requeues(servers: RunningServers) -> None:
    with QueueClient(servers.queue_address) as queue, GuardClient(servers.guard_address) as guard:
        dead = dead_job(queue)
        queue.enqueue("mail", b"run me")
        (job,) = queue.claim("mail")
        listed = cli(servers, "jobs", "mail", "--json", "--page-size", "1")
        assert listed.returncode == 0, listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert [(r["id"], r["state"]) for r in rows] == [(dead, "dead"), (job.id, "running")]
        table = cli(servers, "jobs", "mail", "--state", "dead")
        assert table.returncode == 0 and str(dead) in table.stdout and "boom" in table.stdout
        shown = cli(servers, "job", str(job.id))
        assert shown.returncode == 0 and "lease_owner:" in shown.stdout
        assert cli(servers, "job", "99999").returncode == exits.CODES["NOT_FOUND"]
        not_now = cli(servers, "retry", str(job.id))
        assert not_now.returncode == exits.FAILURE and "nothing to retry" in not_now.stderr
        cancelled = cli(
            servers, "cancel", str(job.id), "--guard-addr", servers.guard_address, "--json"
        )
        assert cancelled.returncode == 0, cancelled.stderr
        out = json.loads(cancelled.stdout)
        assert out["changed"] and out["fence_token"] > job.token
        assert out["fenced_guards"] == [servers.guard_address]
        assert guard.describe_fence(job.resource) == out["fence_token"]
        with pytest.raises(LeaseLost):
            queue.complete(job)
        retried = cli(servers, "retry", str(job.id), "--queue", "mail")
        assert retried.returncode == 0 and "now ready" in retried.stdout
        requeued = cli(servers, "requeue", "mail", "--json")
        assert requeued.returncode == 0 and json.loads(requeued.stdout)["requeued"] == 1
        assert queue.get_job(dead).state == "ready"
        (stats,) = queue.stats("mail")
        assert stats.cancelled == 0 and stats.ready == 2


def test_the_cli_prints_a_jobs_attempts_as_a_table(servers: RunningServers) -> None:
    with QueueClient(servers.queue_address, worker="mailer-7") as queue:
        job_id = dead_job(queue)
        queue.enqueue("mail", b"never run")
    shown = cli(servers, "job", str(job_id))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    at = lines.index("history:")
    heading, row = lines[at + 1].split(), lines[at + 2].split()
    assert heading == ["attempt", "outcome", "worker", "token", "started", "ended", "error"]
    assert row[:3] == ["1", "failed", "mailer-7"] and row[-1] == "boom"
    assert len(lines) == at + 3  # one attempt, nothing after the table
    as_json = cli(servers, "job", str(job_id), "--json")
    assert as_json.returncode == 0, as_json.stderr
    (attempt,) = json.loads(as_json.stdout)["history"]
    assert (attempt["attempt"], attempt["outcome"], attempt["error"]) == (1, "failed", "boom")
    never = cli(servers, "job", str(job_id + 1))
    assert never.returncode == 0 and "(no attempts kept)" in never.stdout


def test_the_cli_pauses_and_resumes_a_queue(servers: RunningServers) -> None:
    with QueueClient(servers.queue_address, worker="tester") as queue:
        queue.enqueue("mail", b"before")
        paused = cli(servers, "pause", "mail", "--json")
        assert paused.returncode == 0, paused.stderr
        assert json.loads(paused.stdout) == {"queue": "mail", "paused": True, "changed": True}
        again = cli(servers, "pause", "mail")
        assert again.returncode == 0 and "already paused" in again.stdout, again.stderr
        queue.enqueue("mail", b"while paused")  # enqueues go on
        assert queue.claim("mail", batch=10) == []
        (stats,) = queue.stats("mail")
        assert stats.paused and stats.ready == 2
        table = cli(servers, "stats", "mail")
        assert table.returncode == 0 and "paused" in table.stdout and "yes" in table.stdout
        resumed = cli(servers, "resume", "mail", "--json")
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["changed"] is True
        assert len(queue.claim("mail", batch=10)) == 2
        assert not queue.stats("mail")[0].paused


def test_a_paused_queue_with_no_jobs_is_in_stats_so_it_can_be_resumed(
    servers: RunningServers,
) -> None:
    """A pause outlives the queue's jobs (or comes before the first): Stats lists the
    queue, paused, with zero counts, so an operator sees it (console, CLI) and resumes it."""
    with QueueClient(servers.queue_address, worker="tester") as queue:
        assert queue.pause("empty-mail")
        (stats,) = queue.stats("empty-mail")
        assert stats.queue == "empty-mail" and stats.paused and stats.ready == 0
        assert "empty-mail" in [s.queue for s in queue.stats()]
        assert "empty-mail" not in [s.queue for s in queue.stats("other")]
        assert queue.resume("empty-mail")
        assert queue.stats("empty-mail") == []  # no jobs, not paused: nothing to show


def test_pause_needs_manage_and_the_async_twin_pauses(servers: RunningServers) -> None:
    async def main() -> None:
        async with AsyncQueueClient(servers.queue_address, worker="aio") as queue:
            await queue.enqueue("mail", b"x")
            assert await queue.pause("mail")
            assert not await queue.pause("mail")
            assert await queue.claim("mail") == []
            assert (await queue.stats("mail"))[0].paused
            assert await queue.resume("mail")
            assert not await queue.resume("mail")
            assert len(await queue.claim("mail")) == 1

    asyncio.run(main())
    with QueueClient(servers.queue_address) as queue, pytest.raises(InvalidArgumentError) as info:
        queue.pause("")
    assert info.value.field == "queue"


def test_pause_is_authorised_as_manage() -> None:
    policy = AuthPolicy.from_dict(tomllib.loads(ADMIN_POLICY))
    with (
        running_servers(options=ServerOptions(auth=policy)) as servers,
        QueueClient(servers.queue_address, token="viewer-token") as viewer,
        QueueClient(servers.queue_address, token="operator-token") as operator,
    ):
        with pytest.raises(PermissionDeniedError):
            viewer.pause("mail")
        with pytest.raises(PermissionDeniedError):
            operator.pause("billing")
        assert operator.pause("mail")
        with pytest.raises(PermissionDeniedError):
            viewer.resume("mail")
        assert operator.resume("mail")


@pytest.mark.postgres
def test_two_servers_on_one_postgres_honour_a_pause_and_a_resume_wakes_the_other(
    tmp_path: Path,
) -> None:
    dsn = pg.test_dsn()
    name = f"{pg.SCHEMA_PREFIX}{secrets.token_hex(6)}"
    url = pg.with_schema(dsn, name)
    # No polling of a waiting claim within the test: only the resume's NOTIFY wakes it.
    slow = QueueOptions(poll_interval_s=3600)
    try:
        with (
            running_servers(url, url, queue_options=slow) as one,
            running_servers(url, url, queue_options=slow) as two,
            QueueClient(one.queue_address, worker="a") as a,
            QueueClient(two.queue_address, worker="b") as b,
        ):
            assert a.pause("mail")
            b.enqueue("mail", b"x")
            assert b.claim("mail") == []  # paused through the other server
            assert b.stats("mail")[0].paused

            async def wait_then_resume() -> list[Any]:
                async with AsyncQueueClient(one.queue_address, worker="a") as waiter:
                    waiting = asyncio.ensure_future(waiter.claim("mail", wait=300))
                    await asyncio.sleep(0.5)  # the claim is parked on server one
                    assert not waiting.done()
                    assert b.resume("mail")  # through server two: its NOTIFY wakes one
                    # a liveness bound, far below the claim's wait: never woken fails
                    return list(await asyncio.wait_for(waiting, 30))

            (job,) = asyncio.run(wait_then_resume())
            assert job.payload == b"x"
    finally:
        asyncio.run(pg.drop_schema(dsn, name))
