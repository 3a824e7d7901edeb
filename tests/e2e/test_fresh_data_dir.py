"""A replaced ``fencing serve`` keeps its tokens only with its data directory, and says
when it starts fresh.

Real processes: a server on a data directory grants tokens and is stopped; a new one
on the same directory (a container replaced with its volume) continues above them,
silently. The control is the container replaced without its volume: a new, empty
directory hands out token 1 again, and the WARNING that the data directory is new is
what makes that visible.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from fencing import LeaseClient
from tests.e2e.test_restart import serve

pytestmark = pytest.mark.e2e

NEW_DIR = "is new: no earlier leases, counters or fences"


def grant_three(lease_addr: str) -> list[int]:
    tokens = []
    with LeaseClient(lease_addr, holder="h") as leases:
        for _ in range(3):
            lease = leases.acquire("orders", ttl=10.0)
            tokens.append(lease.token)
            lease.release()
    return tokens


def run_once(data: Path) -> tuple[list[int], str]:
    with serve(data) as (proc, lease_addr, _guard_addr):
        tokens = grant_three(lease_addr)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        assert proc.stderr is not None
        return tokens, proc.stderr.read()


def test_a_new_data_dir_is_logged_and_a_kept_one_continues(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    first, log = run_once(volume)
    assert first == [1, 2, 3]
    assert NEW_DIR in log and "WARNING" in log and str(volume) in log

    # Replaced with its volume: tokens continue, and nothing is said about a fresh start.
    kept, log = run_once(volume)
    assert kept == [4, 5, 6]
    assert NEW_DIR not in log

    # The control, replaced without it: token 1 again, loudly.
    fresh = tmp_path / "container-layer"
    again, log = run_once(fresh)
    assert again == [1, 2, 3] and set(again) <= set(first)
    assert NEW_DIR in log and str(fresh) in log


def test_the_help_names_exactly_the_files_serve_keeps(tmp_path: Path) -> None:
    """``fencing serve --help`` names the data directory's files: every ``*.db`` it
    names is created by a real server on a new directory, and every file created is
    named, so the help cannot drift from what the command does."""
    import re
    import subprocess
    import sys

    help_text = subprocess.run(
        [sys.executable, "-m", "fencingctl", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    named = set(re.findall(r"[\w-]+\.db\b", help_text))
    data = tmp_path / "data"
    with serve(data) as (proc, lease_addr, _guard_addr):
        grant_three(lease_addr)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    created = {p.name for p in data.iterdir() if p.suffix == ".db"}
    assert named == created
