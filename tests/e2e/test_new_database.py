"""A server started on a SQLite file that does not exist says so, and can refuse.

Real processes. A mistyped path (``sqlite:/typo/dir/leases.db``) creates a new, empty
database whose counters start at 1 again: ``lease-server`` and ``fencing-guard`` log
the same WARNING ``fencing serve`` logs for a new data directory, and ``--no-create``
(or ``--require-durable``) refuses to start, creating nothing. The control is the file
that exists: no warning, and ``--no-create`` starts.

``fencing serve`` and ``lease-server`` on one directory keep jobs in one queue file,
so moving from one to the other loses none.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fencing import QueueClient
from serving import exits
from tests.e2e.test_restart import serve

pytestmark = pytest.mark.e2e

NEW = "is new: no earlier leases, counters or fences"

#: command -> (python -m argv, its storage flag)
SERVERS = {
    "lease-server": (["-m", "lease_server"], "--backend"),
    "fencing-guard": (["-m", "guard"], "--store"),
}


@contextmanager
def running(command: str, url: str, *argv: str) -> Iterator[tuple[str, list[str]]]:
    """The server on ``url`` until the block ends; yields its address and, after it, its
    stderr lines (the list is filled once it stopped)."""
    prefix, flag = SERVERS[command]
    proc = subprocess.Popen(
        [sys.executable, *prefix, flag, url, "--listen", "127.0.0.1:0", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert "listening on" in line, proc.stderr.read() if proc.poll() is not None else line
        yield line.split("listening on ")[1].split()[0], lines
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        assert proc.stderr is not None
        lines += proc.stderr.read().splitlines()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def refused(command: str, url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    prefix, flag = SERVERS[command]
    return subprocess.run(
        [sys.executable, *prefix, flag, url, "--listen", "127.0.0.1:0", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("command", SERVERS)
def test_a_new_database_is_logged_and_an_existing_one_is_not(command: str, tmp_path: Path) -> None:
    path = tmp_path / "typo" / "dir" / "state.db"
    with running(command, f"sqlite:{path}") as (_, log):
        pass
    (warning,) = [line for line in log if NEW in line]
    assert "WARNING" in warning and str(path) in warning
    # The control: the same file again is an existing database, started silently.
    with running(command, f"sqlite:{path}") as (_, log):
        pass
    assert not [line for line in log if NEW in line]


@pytest.mark.parametrize("command", SERVERS)
@pytest.mark.parametrize("flag", ["--no-create", "--require-durable"])
def test_no_create_refuses_a_new_database_and_creates_nothing(
    command: str, flag: str, tmp_path: Path
) -> None:
    path = tmp_path / "typo" / "state.db"
    done = refused(command, f"sqlite:{path}", flag)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith(f"{command}:")]
    assert "cannot start" in line and str(path) in line and flag in line, line
    assert done.returncode == exits.CODES[line.split(": ")[2]]
    assert not path.parent.exists(), "nothing is created"
    # The control: once the database exists, the same flag starts on it.
    with running(command, f"sqlite:{path}"):
        pass
    with running(command, f"sqlite:{path}", flag) as (_, log):
        pass
    assert not [line for line in log if NEW in line]


def test_workers_check_once_and_refuse_before_starting(tmp_path: Path) -> None:
    """Under ``--workers 2`` the supervisor checks once, before any worker opens the
    file: one warning, never a worker's "database is locked"."""
    path = tmp_path / "g.db"
    with running("fencing-guard", f"sqlite:{path}", "--workers", "2") as (_, log):
        pass
    assert len([line for line in log if NEW in line]) == 1, log
    assert not [line for line in log if "locked" in line], log
    other = tmp_path / "other.db"
    done = refused("fencing-guard", f"sqlite:{other}", "--workers", "2", "--no-create")
    assert done.returncode != 0 and "listening" not in done.stdout, done.stdout
    assert not other.exists()


def test_serve_and_lease_server_share_the_queue_on_one_directory(tmp_path: Path) -> None:
    """Jobs enqueued under ``fencing serve`` are there for ``lease-server`` on the same
    directory's leases.db, and the other way round."""
    data = tmp_path / "data"
    with serve(data) as (proc, lease_addr, _):
        with QueueClient(lease_addr) as queue:
            first = queue.enqueue("q", b"from serve").id
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    leases = f"sqlite:{data / 'leases.db'}"
    with running("lease-server", leases) as (address, _), QueueClient(address) as queue:
        assert queue.get_job(first, queue="q").id == first
        second = queue.enqueue("q", b"from lease-server").id
    with serve(data) as (_, lease_addr, _), QueueClient(lease_addr) as queue:
        assert {j.id for j in queue.list_jobs("q")} >= {first, second}


def test_a_queue_kept_under_the_former_name_is_still_read(tmp_path: Path) -> None:
    """A data directory whose jobs are in ``queue.db`` (the name ``fencing serve``
    used before) keeps them: both servers read that file while it is the only one."""
    data = tmp_path / "data"
    former = data / "queue.db"
    leases = f"sqlite:{data / 'leases.db'}"
    old = ("--queue", f"sqlite:{former}")
    with running("lease-server", leases, *old) as (address, _), QueueClient(address) as queue:
        job = queue.enqueue("q", b"kept").id
    with running("lease-server", leases) as (address, _), QueueClient(address) as queue:
        assert queue.get_job(job, queue="q").id == job
    with serve(data) as (_, lease_addr, _), QueueClient(lease_addr) as queue:
        assert queue.get_job(job, queue="q").id == job
    assert not (data / "leases-queue.db").exists(), "no second, empty queue beside it"
