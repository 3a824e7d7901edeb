"""``fencing watch`` and ``fencing lease list`` against real servers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import LeaseClient
from fencing.testing import RunningServers, running_servers
from fencingctl import main
from serving import exits
from tests.integration.test_cli_lock import env

FENCING = [sys.executable, "-m", "fencingctl"]


def at(servers: RunningServers) -> list[str]:
    return ["--lease-addr", servers.lease_address]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(f"sqlite:{tmp_path / 'l.db'}", f"sqlite:{tmp_path / 'g.db'}") as s:
        yield s


def test_watch_prints_history_from_a_revision_then_live_events(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address, holder="w1") as leases:
        leases.acquire("jobs/before", ttl=30)  # revision 1 of a fresh log: skipped
        first = leases.acquire("jobs/a", ttl=30)
        leases.release("jobs/a", first.token)
        leases.acquire("other", ttl=30)  # outside the prefix
        watch = subprocess.Popen(
            [*FENCING, "watch", "--prefix", "jobs/", "--from", "1", *at(servers)],
            env=env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert watch.stdout is not None
            acquired = watch.stdout.readline().split()
            assert acquired[1:] == [
                "kind=ACQUIRED",
                "resource=jobs/a",
                f"token={first.token}",
                "holder=w1",
                "ttl_ms=30000",
            ]
            released = watch.stdout.readline().split()
            assert released[1:3] == ["kind=RELEASED", "resource=jobs/a"]
            live = leases.acquire("jobs/b", ttl=30)  # after the history: streamed live
            line = watch.stdout.readline().split()
            assert line[1:4] == ["kind=ACQUIRED", "resource=jobs/b", f"token={live.token}"]
            assert int(line[0].removeprefix("revision=")) > int(
                released[0].removeprefix("revision=")
            )
        finally:
            watch.kill()
            watch.wait()
            assert watch.stdout is not None
            watch.stdout.close()
        revision = int(line[0].removeprefix("revision="))
        one = subprocess.Popen(
            [*FENCING, "watch", "jobs/b", "--json", "--from", str(revision - 1), *at(servers)],
            env=env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert one.stdout is not None
            assert json.loads(one.stdout.readline()) == {
                "revision": revision,  # the one after --from
                "kind": "ACQUIRED",
                "resource": "jobs/b",
                "token": live.token,
                "holder": "w1",
                "ttl_ms": 30000,
            }
        finally:
            one.kill()
            one.wait()
            assert one.stdout is not None
            one.stdout.close()


def test_watch_help_tells_what_the_readme_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["watch", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "ACQUIRED, RELEASED, EXPIRED (renewals are not events), or RESYNC" in text
    assert "RENEWED" not in text and "(exit 1" not in text


def test_watch_refuses_a_resource_and_a_prefix(
    servers: RunningServers, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["watch", "a", "--prefix", "b", "--lease-addr", servers.lease_address])
    assert code == exits.USAGE and "not both" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["watch", "a", "--from", "-1", "--lease-addr", servers.lease_address])
    assert exited.value.code == exits.USAGE and "--from" in capsys.readouterr().err


def test_lease_list_prints_each_held_lease(
    servers: RunningServers, capsys: pytest.CaptureFixture[str]
) -> None:
    with LeaseClient(servers.lease_address, holder="h") as leases:
        tokens = [leases.acquire(f"q/{i}", ttl=30).token for i in range(3)]
        leases.acquire("z", ttl=30)
    base = ["lease", "list", "--lease-addr", servers.lease_address]
    assert main([*base, "--prefix", "q/", "--page-size", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines] == [
        [f"resource=q/{i}", "holder=h", f"token={t}"] for i, t in enumerate(tokens)
    ]
    assert main([*base, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["resource"] for r in rows] == ["q/0", "q/1", "q/2", "z"]
    assert set(rows[0]) == {"resource", "holder", "token", "remaining_ms", "last_token"}
    with pytest.raises(SystemExit) as exited:  # refused before anything is sent
        main([*base, "--page-size", "5000"])
    assert exited.value.code == exits.USAGE and "--page-size" in capsys.readouterr().err
