"""``fencing watch`` and ``fencing lease list`` against real servers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import AsyncLeaseClient, LeaseClient
from fencing.testing import RunningServers, running_servers
from fencingctl import main
from serving import exits
from tests.integration.test_cli_lock import env
from tests.waiting import wait_until

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


def first_json_line(servers: RunningServers, *argv: str, then: str) -> dict[str, object]:
    """The first event ``fencing watch ... --json`` prints, after ``then`` was acquired once
    the command runs (so a watch from now sees that one, not a hang)."""
    wait_until(lambda: _watching(servers) == 0, "earlier streams closed")
    watch = subprocess.Popen(
        [*FENCING, "watch", *argv, "--json", *at(servers)],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None and watch.stderr is not None
        with LeaseClient(servers.lease_address, holder="later") as leases:
            # The command's stream is open once the server counts it.
            wait_until(lambda: _watching(servers) >= 1, "the command's stream open")
            leases.acquire(then, ttl=30)
        line = watch.stdout.readline()
        assert line, watch.stderr.read()
        return dict(json.loads(line))
    finally:
        watch.kill()
        watch.wait()
        for pipe in (watch.stdout, watch.stderr):
            if pipe is not None:
                pipe.close()


def _watching(servers: RunningServers) -> float:
    registry = servers.lease.metrics.registry
    return registry.get_sample_value("fencing_lease_watch_streams") or 0.0


def test_watch_from_0_replays_revision_1(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address, holder="w1") as leases:
        first = leases.acquire("first", ttl=30)  # revision 1 of a fresh log
        with leases.watch_stream("first", after_revision=0) as stream:
            assert stream.start_revision == 0
            event = next(iter(stream))
        assert (event.revision, event.kind.name, event.token) == (1, "ACQUIRED", first.token)
    replayed = first_json_line(servers, "--prefix", "", "--from", "0", then="marker-1")
    assert (replayed["revision"], replayed["resource"]) == (1, "first")
    # The control: without --from the stream starts now, and revision 1 is not shown.
    live = first_json_line(servers, "--prefix", "", then="marker-2")
    assert live["resource"] == "marker-2" and live["revision"] != 1


async def test_the_async_client_replays_from_revision_0(servers: RunningServers) -> None:
    async with AsyncLeaseClient(servers.lease_address, holder="w1") as leases:
        first = await leases.acquire("first", ttl=30)
        async with await leases.watch_stream("first", after_revision=0) as stream:
            assert stream.start_revision == 0
            event = await anext(aiter(stream))
        assert (event.revision, event.token) == (1, first.token)


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
    fields = {"resource", "holder", "token", "remaining_ms", "last_token", "ttl_ms"}
    assert set(rows[0]) == fields and rows[0]["ttl_ms"] == 30_000  # the lease's own
    with pytest.raises(SystemExit) as exited:  # refused before anything is sent
        main([*base, "--page-size", "5000"])
    assert exited.value.code == exits.USAGE and "--page-size" in capsys.readouterr().err
