"""The queue service over real gRPC (lease server + guard on SQLite, in a thread):
errors on the wire, jobs as fencing tokens at the guard, backoff, the reaper, long polls."""

from __future__ import annotations

import asyncio
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_status import rpc_status

from fencing import GuardClient, Job, LeaseLost, QueueClient, StaleTokenError
from fencing._backoff import Backoff
from fencing.errors import InvalidArgumentError, PermissionDeniedError
from fencing.testing import RunningServers, running_servers
from fencing.types import Put
from fencing.v1 import queue_pb2, queue_pb2_grpc
from lease_server.queue.backends.sqlite import SQLiteQueue
from lease_server.queue.jobs import JobRef, NewJob
from lease_server.queue.service import QueueOptions, QueueService
from serving.auth import AuthPolicy
from serving.server import ServerOptions

RETRY = Backoff(base=100, cap=400, factor=2.0, jitter=0.2)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    options = QueueOptions(retry=RETRY, reap_interval_s=0.05, poll_interval_s=0.05)
    with running_servers(
        f"sqlite:{tmp_path / 'leases.db'}",
        f"sqlite:{tmp_path / 'guard.db'}",
        queue_options=options,
    ) as running:
        yield running


@pytest.fixture
def queue(servers: RunningServers) -> Iterator[QueueClient]:
    with QueueClient(servers.queue_address, worker="tester") as client:
        yield client


@pytest.fixture
def guard(servers: RunningServers) -> Iterator[GuardClient]:
    with GuardClient(servers.guard_address) as client:
        yield client


def test_the_queue_lives_beside_the_leases(servers: RunningServers, tmp_path: Path) -> None:
    assert (tmp_path / "leases-queue.db").exists()
    assert servers.lease.queue is not None and servers.lease.queue.name == "sqlite"


def test_enqueue_claim_complete_and_stats(queue: QueueClient) -> None:
    first = queue.enqueue("mail", b'{"to": 1}', idempotency_key="welcome-1")
    again = queue.enqueue("mail", b"other", idempotency_key="welcome-1")
    assert first.created and not again.created and again.id == first.id
    (job,) = queue.claim("mail", batch=5, ttl=10)
    assert (job.id, job.payload, job.attempt, job.resource) == (
        first.id,
        b'{"to": 1}',
        1,
        f"job/mail/{first.id}",
    )
    assert job.idempotency_key == "welcome-1" and job.ttl_ms == 10_000
    (stats,) = queue.stats("mail")
    assert (stats.ready, stats.running, stats.succeeded) == (0, 1, 0)
    queue.complete(job)
    queue.complete(job)  # repeat: no-op
    (stats,) = queue.stats("mail")
    assert (stats.running, stats.succeeded, stats.finished_in_window) == (0, 1, 1)


def test_a_stale_token_is_lease_lost_on_the_wire(
    servers: RunningServers, queue: QueueClient
) -> None:
    queue.enqueue("q", b"x")
    (old,) = queue.claim("q", ttl=0.2)
    time.sleep(0.3)
    (new,) = queue.claim("q", ttl=10)
    assert new.id == old.id and new.token > old.token and new.attempt == 2
    with grpc.insecure_channel(servers.queue_address) as channel:
        stub = queue_pb2_grpc.QueueServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Complete(
                queue_pb2.CompleteRequest(jobs=[queue_pb2.JobRef(id=old.id, token=old.token)])
            )
    err = info.value
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    status = rpc_status.from_call(err)
    assert status is not None and "LEASE_LOST" in str(status.details[0].value)
    with pytest.raises(LeaseLost) as lost:
        queue.complete(old)
    assert lost.value.token == old.token and lost.value.resource == old.resource
    assert old.lost.is_set()
    assert queue.heartbeat(old) == []  # already known lost: nothing sent
    queue.complete(new)


def test_a_stale_complete_in_a_claim_is_refused_alone_and_the_claim_goes_on(
    servers: RunningServers, queue: QueueClient
) -> None:
    queue.enqueue("q", b"a")
    (paused,) = queue.claim("q", ttl=0.2)
    time.sleep(0.3)
    with QueueClient(servers.queue_address, worker="rescuer") as other:
        (rescued,) = other.claim("q", ttl=10)
    assert rescued.id == paused.id and rescued.token > paused.token
    queue.enqueue("q", b"b")
    # The paused worker wakes up, hands its job back as finished and asks for the next.
    jobs, (verdict,) = queue.complete_and_claim([paused], "q", ttl=10)
    assert isinstance(verdict, LeaseLost)
    assert verdict.token == paused.token and verdict.resource == paused.resource
    assert paused.lost.is_set()
    assert [j.payload for j in jobs] == [b"b"]  # the claim went on
    (stats,) = queue.stats("q")
    assert (stats.running, stats.succeeded) == (2, 0)  # the rescuer's claim is untouched
    # A good complete in the same call completes; the rescuer's own still does too.
    (next_job,) = jobs
    more, (ok,) = queue.complete_and_claim([next_job], "q", ttl=10)
    assert ok is None and more == []
    queue.complete(rescued)
    (stats,) = queue.stats("q")
    assert (stats.running, stats.succeeded) == (0, 2)


def test_control_a_late_complete_without_its_token_check_ends_the_rescuers_job(
    servers: RunningServers, queue: QueueClient
) -> None:
    """The control: the same late complete, but with the check of its token taken out
    (it presents whatever token the job has now): it ends the rescuer's claim."""
    queue.enqueue("q", b"a")
    queue.claim("q", ttl=0.2)  # the paused worker's claim
    time.sleep(0.3)
    with QueueClient(servers.queue_address, worker="rescuer") as other:
        (rescued,) = other.claim("q", ttl=10)
    unchecked = same_claim(rescued)  # the paused worker's complete, its token not judged
    _, (verdict,) = queue.complete_and_claim([unchecked], "q", ttl=10)
    assert verdict is None
    (stats,) = queue.stats("q")
    assert (stats.running, stats.succeeded) == (0, 1)  # the violation: the rescuer's job ended
    with QueueClient(servers.queue_address, worker="rescuer") as other:
        assert other.heartbeat(rescued) == [rescued]  # the rescuer lost a job it still runs


def test_completes_in_a_claim_must_belong_to_its_queue(queue: QueueClient) -> None:
    queue.enqueue("q", b"a")
    (job,) = queue.claim("q", ttl=10)
    with pytest.raises(InvalidArgumentError) as info:
        queue.complete_and_claim([job], "other")
    assert info.value.field == "done"
    queue.complete(job)


def test_heartbeat_returns_the_lost_jobs_and_renews_the_rest(
    queue: QueueClient, servers: RunningServers
) -> None:
    for i in range(3):
        queue.enqueue("q", str(i).encode())
    jobs = queue.claim("q", batch=3, ttl=10)
    stolen = jobs[1]
    with QueueClient(servers.queue_address) as other:
        # Someone with the token gives it back and another worker takes it over.
        other.release(same_claim(stolen))
        (rescued,) = other.claim("q", ttl=10)
    assert rescued.id == stolen.id
    lost = queue.heartbeat(jobs, ttl=10)
    assert lost == [stolen] and stolen.lost.is_set()
    mine = [jobs[0], jobs[2]]
    assert not any(j.lost.is_set() for j in mine)
    queue.complete(mine)


def same_claim(job: Job) -> Job:
    """A second handle on the same claim (as another process holding the token would have)."""
    msg = queue_pb2.Job(
        id=job.id, queue=job.queue, token=job.token, resource=job.resource, ttl_ms=job.ttl_ms
    )
    return Job(msg, time.monotonic())


def test_a_job_fences_its_effects_at_the_guard(queue: QueueClient, guard: GuardClient) -> None:
    """A rescued job's old worker can neither complete it nor write its effect."""
    queue.enqueue("pay", b"invoice-7")
    (paused,) = queue.claim("pay", ttl=0.2)
    guard.write(paused, Put("status", b"started by A"))
    time.sleep(0.3)  # A "pauses" past its lease
    (rescuer,) = queue.claim("pay", ttl=10)
    assert rescuer.resource == paused.resource and rescuer.token > paused.token
    guard.write(rescuer, Put("status", b"paid by B"), idempotency_key=f"pay-{rescuer.id}")
    with pytest.raises(StaleTokenError) as stale:
        guard.write(paused, Put("status", b"paid by A"))
    assert stale.value.current_token == rescuer.token
    with pytest.raises(LeaseLost):
        queue.complete(paused)
    queue.complete(rescuer)
    record = guard.read(paused.resource, "status")
    assert record is not None and record.value == b"paid by B"
    assert record.written_by_token == rescuer.token


def test_a_named_resource_is_fenced_across_jobs(queue: QueueClient, guard: GuardClient) -> None:
    queue.enqueue("ledger", b"1", resource="account/9", ordering_key="account/9")
    queue.enqueue("ledger", b"2", resource="account/9", ordering_key="account/9")
    (a,) = queue.claim("ledger", batch=2)
    guard.put(a, "balance", b"1")
    queue.complete(a)
    (b,) = queue.claim("ledger", batch=2)
    assert b.resource == "account/9" and b.token > a.token
    guard.put(b, "balance", b"2")
    with pytest.raises(StaleTokenError):
        guard.put(a, "balance", b"late")


def test_retries_follow_the_backoff_and_end_dead(queue: QueueClient) -> None:
    queue.enqueue("q", b"x", max_attempts=4)
    delays = []
    for attempt in range(1, 5):
        (job,) = queue.claim("q", ttl=10, wait=2)
        assert job.attempt == attempt
        if attempt > 1:
            assert job.last_error == f"RuntimeError: attempt {attempt - 1}"
        outcome = queue.fail(job, RuntimeError(f"attempt {attempt}"))
        delays.append(outcome.retry_in)
    assert outcome.state == "dead"
    for attempt, delay in zip(range(1, 4), delays, strict=False):
        raw = RETRY.raw(attempt) / 1000
        assert raw * (1 - RETRY.jitter) - 0.002 <= delay <= raw + 0.002
    assert delays[3] == 0
    (stats,) = queue.stats("q")
    assert stats.dead == 1 and stats.retry_rate == pytest.approx(3 / 4)


def test_a_worker_may_choose_the_retry_delay_or_give_up(queue: QueueClient) -> None:
    queue.enqueue("q", b"x")
    (job,) = queue.claim("q")
    assert queue.fail(job, "later", retry_in=0.05).retry_in == pytest.approx(0.05)
    (job,) = queue.claim("q", wait=2)
    assert queue.fail(job, "bad payload", final=True).state == "dead"


def test_the_reaper_ends_an_exhausted_expired_job(queue: QueueClient) -> None:
    created = queue.enqueue("q", b"x", max_attempts=1)
    queue.claim("q", ttl=0.1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        (stats,) = queue.stats("q")
        if stats.dead == 1:
            break
        time.sleep(0.05)
    assert stats.dead == 1 and stats.running == 0
    assert created.id > 0


def test_an_empty_claim_waits_and_wakes_on_enqueue(
    queue: QueueClient, servers: RunningServers
) -> None:
    got: list[int] = []

    def waiter() -> None:
        with QueueClient(servers.queue_address) as other:
            got.extend(j.id for j in other.claim("q", wait=10))

    t = threading.Thread(target=waiter)
    started = time.monotonic()
    t.start()
    time.sleep(0.2)
    created = queue.enqueue("q", b"x")
    t.join(15)
    assert got == [created.id]
    assert time.monotonic() - started < 5  # woken, not timed out
    assert queue.claim("q", wait=0.1) == []


def test_requests_are_validated_at_the_edge(queue: QueueClient) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        queue.enqueue("", b"x")
    assert info.value.field == "queue"
    with pytest.raises(InvalidArgumentError) as info:
        queue.enqueue("q", b"x" * (1024 * 1024 + 1))
    assert info.value.field == "jobs[0].payload"
    with pytest.raises(InvalidArgumentError) as info:
        queue.claim("q", batch=1001)
    assert info.value.field == "batch_size"
    with pytest.raises(InvalidArgumentError) as info:
        queue.enqueue("q", b"x", priority=5000)
    assert info.value.field == "jobs[0].priority"
    with pytest.raises(InvalidArgumentError):
        queue.enqueue("q", b"x", max_attempts=-1)
    with pytest.raises(InvalidArgumentError) as info:
        bad = queue_pb2.ClaimRequest(
            queue="q",
            worker="w",
            batch_size=1,
            ttl_ms=1000,
            complete=[queue_pb2.JobRef(id=0, token=1)],
        )
        queue._call(queue._stub.Claim, bad)
    assert info.value.field == "complete[0].id"
    assert queue.stats("q") == []


QUEUE_POLICY = """
[principals.mailer]
tokens = ["mailer-token"]
allow = [{ prefix = "emails", actions = ["enqueue", "claim"] }]

[principals.ops]
tokens = ["ops-token"]
allow = [{ prefix = "", actions = ["*"] }]
"""


def test_an_auth_policy_scopes_every_queue_call_by_its_queue() -> None:
    """A grant on queue ``emails`` covers the whole cycle there (Claim to Release, all
    naming their queue) and nothing in another queue."""
    policy = AuthPolicy.from_dict(tomllib.loads(QUEUE_POLICY))
    with (
        running_servers(options=ServerOptions(auth=policy)) as servers,
        QueueClient(servers.queue_address, token="mailer-token") as mailer,
        QueueClient(servers.queue_address, token="ops-token") as ops,
    ):
        mailer.enqueue("emails", b"a")
        mailer.enqueue("emails", b"b")
        first, second = mailer.claim("emails", batch=2)
        assert mailer.heartbeat([first, second]) == []
        mailer.complete(first)
        assert mailer.fail(second, "later", retry_in=0.01).state == "ready"
        (again,) = mailer.claim("emails", wait=2)
        mailer.release(again)
        with pytest.raises(PermissionDeniedError):
            mailer.enqueue("billing", b"x")
        ops.enqueue("billing", b"x")
        (billing,) = ops.claim("billing")
        with pytest.raises(PermissionDeniedError):
            mailer.claim("billing")
        with pytest.raises(PermissionDeniedError):
            mailer.stats()  # every queue: only a grant on every resource allows it
        (stats,) = ops.stats("emails")
        assert (stats.succeeded, stats.ready) == (1, 1)
        ops.complete(billing)


def test_metrics_count_outcomes_and_show_the_backlog(tmp_path: Path) -> None:
    options = QueueOptions(stats_interval_s=0.05, reap_interval_s=0.05, poll_interval_s=0.05)
    with (
        running_servers(f"sqlite:{tmp_path / 'l.db'}", "memory://", queue_options=options) as s,
        QueueClient(s.queue_address) as q,
    ):
        registry = s.lease.metrics.registry

        def sample(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, labels)

        for i in range(3):
            q.enqueue("mail", str(i).encode())
        (old,) = q.claim("mail", ttl=0.2)
        time.sleep(0.3)
        (new,) = q.claim("mail", ttl=10)  # a rescue
        with pytest.raises(LeaseLost):
            q.complete(old)
        q.complete(new)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
            sample("fencing_queue_running", queue="mail") != 0
            or sample("fencing_queue_depth", queue="mail") != 2
        ):
            time.sleep(0.05)  # the gauges refresh every 50 ms
        assert sample("fencing_queue_jobs_total", outcome="enqueued") == 3
        assert sample("fencing_queue_jobs_total", outcome="claimed") == 2
        assert sample("fencing_queue_jobs_total", outcome="rescued") == 1
        assert sample("fencing_queue_jobs_total", outcome="completed") == 1
        assert sample("fencing_queue_lost_total") == 1
        assert sample("fencing_queue_depth", queue="mail") == 2
        assert sample("fencing_queue_running", queue="mail") == 0
        age = sample("fencing_queue_oldest_job_age_seconds", queue="mail")
        assert age is not None and age >= 0.3


def test_the_queue_cli_enqueues_and_reports(servers: RunningServers) -> None:
    import json
    import subprocess
    import sys

    def fencing(*args: str) -> str:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "fencingctl",
                "queue",
                *args,
                "--lease-addr",
                servers.queue_address,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout

    first = json.loads(fencing("enqueue", "mail", "hi", "--idempotency-key", "k", "--json"))
    again = json.loads(fencing("enqueue", "mail", "hi", "--idempotency-key", "k", "--json"))
    assert first["created"] and not again["created"] and again["id"] == first["id"]
    fencing("enqueue", "mail", "later", "--delay", "60")
    # --json: one object a line, here one line for the one queue
    (stats,) = [json.loads(line) for line in fencing("stats", "mail", "--json").splitlines()]
    assert (stats["ready"], stats["scheduled"], stats["running"]) == (1, 1, 0)
    table = fencing("stats")
    assert table.splitlines()[0].split()[:3] == ["queue", "ready", "sched"]
    assert table.splitlines()[1].split()[:3] == ["mail", "1", "1"]


async def test_completes_arriving_together_share_one_transaction(tmp_path: Path) -> None:
    backend = SQLiteQueue(tmp_path / "queue.db")
    await backend.open()
    try:
        service = QueueService(backend)
        await backend.enqueue("q", [NewJob(b"x") for _ in range(10)])
        claimed = await backend.claim("q", "w", 10, 60_000)
        stale = JobRef(claimed[3].id, claimed[3].token + 1_000)
        groups = [([JobRef(r.id, r.token)], "q") for r in claimed]
        groups[3] = ([stale], "q")
        verdicts = await asyncio.gather(*(service.completes.submit([g]) for g in groups))
        # The first went alone at once; the nine that came while it committed, together.
        assert (service.completes.batches, service.completes.batched) == (2, 10)
        refused = [i for i, (v,) in enumerate(verdicts) if v is not None]
        assert refused == [3]  # each its own verdict: only the stale one is refused
        (counts,) = await backend.stats("q", 60_000)
        assert (counts.succeeded, counts.running) == (9, 1)
    finally:
        await backend.close()
