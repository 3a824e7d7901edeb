"""``fencing queue worker MODULE:HANDLER``: a worker process from the shell, on a real
lease server and guard, running tasks deferred by name.

It runs every deferred task (each job's token promised to the guard first), fails for
good a job naming no task, and on SIGTERM stops as ``Worker`` does: the running
handler gets ``--grace`` seconds, then its job is released (ready again, the attempt
not counted) and the process exits 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import GuardClient, QueueClient
from fencing.client._queue import Job
from fencing.testing import RunningServers, running_servers
from fencing.worker.tasks import Tasks
from serving import exits
from tests.integration.test_cli_lock import env, wait_for
from tests.waiting import HANG_GUARD

pytestmark = pytest.mark.e2e

# The user's module, as the worker imports it from the current directory.
MODULE = """
import time
from pathlib import Path

from fencing.worker.tasks import Tasks

tasks = Tasks(queue="mail")


@tasks.task
def record(job, *, n):
    Path(f"done.{n}").write_text(f"{job.id} {job.token}")


@tasks.task
def hang(job, *, n):
    Path("hang.in").touch()
    while not job.lost.is_set():  # runs on past the stop, until its job is taken back
        time.sleep(0.02)
    Path("hang.lost").touch()
"""


def defer(client: QueueClient, name: str, *, n: int) -> int:
    """Defer by name, as the user's code does with its own registry."""
    tasks = Tasks(queue="mail")

    def stub(job: Job, **_: object) -> None:  # only its name matters to defer
        raise AssertionError("not run here")

    task = tasks.task(name=name)(stub)
    return task.defer(client, n=n).id


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    (tmp_path / "user_tasks.py").write_text(textwrap.dedent(MODULE))
    with running_servers(f"sqlite:{tmp_path / 'l.db'}", f"sqlite:{tmp_path / 'g.db'}") as s:
        yield s


def worker(servers: RunningServers, cwd: Path, *opts: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "fencingctl", "queue", "worker", "user_tasks:tasks"]
    argv += ["--queue", "mail", "--poll", "0.2", *opts]
    argv += ["--lease-addr", servers.lease_address, "--guard-addr", servers.guard_address]
    return subprocess.Popen(argv, env=env(), cwd=cwd, stderr=subprocess.PIPE, text=True)


def state_of(client: QueueClient, job_id: int, want: str) -> str:
    end = time.monotonic() + HANG_GUARD
    while (state := client.get_job(job_id, queue="mail").state) != want:
        assert time.monotonic() < end, f"job {job_id} stayed {state}"
        time.sleep(0.05)
    return state


def test_runs_deferred_tasks_fenced_and_discards_unknown_ones(
    servers: RunningServers, tmp_path: Path
) -> None:
    with QueueClient(servers.lease_address) as client, GuardClient(servers.guard_address) as g:
        ids = [defer(client, "record", n=i) for i in range(4)]
        unknown = defer(client, "no_such_task", n=9)
        with worker(servers, tmp_path, "--concurrency", "2") as proc:
            try:
                for i, job_id in enumerate(ids):
                    wait_for(tmp_path / f"done.{i}")
                    state_of(client, job_id, "succeeded")
                state_of(client, unknown, "dead")  # no attempt could ever run it
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=HANG_GUARD)
            finally:
                proc.kill()
        assert proc.returncode == exits.OK, err
        for i, job_id in enumerate(ids):
            ran_id, token = map(int, (tmp_path / f"done.{i}").read_text().split())
            assert ran_id == job_id
            # promised to the guard before the task ran
            assert g.describe_fence(f"job/mail/{job_id}") == token
        assert "no task named 'no_such_task'" in client.get_job(unknown, queue="mail").last_error


def test_sigterm_gives_the_grace_then_releases_the_running_job(
    servers: RunningServers, tmp_path: Path
) -> None:
    with QueueClient(servers.lease_address) as client:
        job_id = defer(client, "hang", n=1)
        with worker(servers, tmp_path, "--grace", "0.5") as proc:
            try:
                wait_for(tmp_path / "hang.in")
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=HANG_GUARD)
            finally:
                proc.kill()
        assert proc.returncode == exits.OK, err
        assert (tmp_path / "hang.lost").exists()  # its handler was told the job is gone
        info = client.get_job(job_id, queue="mail")
        assert info.state == "ready" and info.attempts == 0  # released, attempt not counted


def test_a_handler_that_cannot_be_imported_is_a_usage_error(
    servers: RunningServers, tmp_path: Path
) -> None:
    argv = [sys.executable, "-m", "fencingctl", "queue", "worker", "user_tasks:nope"]
    argv += ["--queue", "mail", "--lease-addr", servers.lease_address]
    done = subprocess.run(
        argv, env=env(), cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD
    )
    assert done.returncode == exits.USAGE and "has no 'nope'" in done.stderr
    argv[5] = "user_tasks:tasks"
    for bad in (["--concurrency", "0"], ["--grace", "-3"]):
        done = subprocess.run(
            [*argv, *bad], env=env(), cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == exits.USAGE and bad[0] in done.stderr
