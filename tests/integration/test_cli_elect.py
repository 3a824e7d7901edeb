"""``fencing elect NAME --value V -- CMD`` and ``fencing leader NAME [--watch]``, in real
processes against real servers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import GuardClient
from fencing.testing import RunningServers, running_servers
from fencingctl.lock import EXIT_NOT_ACQUIRED
from serving import exits
from tests.integration.test_cli_lock import env, read_line
from tests.waiting import HANG_GUARD


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(f"sqlite:{tmp_path / 'l.db'}", f"sqlite:{tmp_path / 'g.db'}") as s:
        yield s


def fencing(servers: RunningServers, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fencingctl",
        *args,
        "--lease-addr",
        servers.lease_address,
        "--guard-addr",
        servers.guard_address,
    ]


def leader(servers: RunningServers, *args: str, code: int = 0) -> str:
    """``fencing leader sched ARGS``'s line; it exits ``code`` (1 while nobody leads)."""
    done = subprocess.run(
        fencing(servers, "leader", "sched", *args),
        env=env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == code, done.stderr
    return done.stdout.strip()


def test_elect_runs_the_leader_and_leader_shows_it(servers: RunningServers, tmp_path: Path) -> None:
    assert leader(servers, code=exits.FAILURE) == "name=sched leader=false"
    assert json.loads(leader(servers, "--json", code=exits.FAILURE))["leader"] is False
    watch = subprocess.Popen(
        fencing(servers, "leader", "sched", "--watch"),
        env=env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert watch.stdout is not None
    assert watch.stdout.readline().strip() == "name=sched leader=false"  # at once
    script = (
        'echo "$FENCING_TOKEN $FENCING_LEADER_VALUE $FENCING_RESOURCE" > leading; '
        "while [ ! -e done ]; do sleep 0.02; done"
    )
    elected = subprocess.Popen(
        [
            *fencing(servers, "elect", "sched", "--value", "10.0.0.1:80", "--holder", "n1"),
            "--",
            "sh",
            "-c",
            script,
        ],
        env=env(),
        cwd=tmp_path,
    )
    try:
        term, value, resource = read_line(tmp_path / "leading").split()
        assert (value, resource) == ("10.0.0.1:80", "sched")
        line = f"name=sched leader=true term={term} holder=n1 value=10.0.0.1:80"
        assert leader(servers) == line
        assert json.loads(leader(servers, "--json")) == {
            "name": "sched",
            "leader": True,
            "term": int(term),
            "holder": "n1",
            "value": "10.0.0.1:80",
        }
        busy = subprocess.run(
            [*fencing(servers, "elect", "sched", "--timeout", "0.2"), "--", "true"],
            env=env(),
            capture_output=True,
            text=True,
            timeout=HANG_GUARD,
        )
        assert busy.returncode == EXIT_NOT_ACQUIRED and "not elected" in busy.stderr
        seen = watch.stdout.readline().strip()
        if seen.endswith("value="):  # elected, then proclaimed: one read may see both
            seen = watch.stdout.readline().strip()
        assert seen == line
        (tmp_path / "done").touch()
        assert elected.wait(HANG_GUARD) == 0
        assert watch.stdout.readline().strip() == "name=sched leader=false"  # resigned
    finally:
        elected.kill()
        watch.kill()
        watch.wait()
        watch.stdout.close()
    with GuardClient(servers.guard_address) as guard:
        assert guard.describe_fence("sched") == int(term)  # the term was promised
