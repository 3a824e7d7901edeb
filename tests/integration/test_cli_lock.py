"""``fencing lock RESOURCE -- CMD``: lock and run, against real servers in real processes.

The safety test pauses a whole ``fencing lock`` (the command and its script) with
SIGSTOP past its ttl, lets another ``fencing lock`` take the resource, then resumes
the first: its script's late ``fencing put`` (token from FENCING_TOKEN) is refused
by the guard. The control runs the same history against a guard with fencing off
and shows the damage: the paused holder overwrites the new holder's value.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import GuardClient, LeaseClient
from fencing.testing import RunningServers, running_servers
from fencingctl.lock import EXIT_LOST, EXIT_NOT_ACQUIRED
from guard.fence import FenceMode
from serving import exits
from tests.waiting import HANG_GUARD

# slow: real processes paused past their ttl (the default loop leaves it out).
pytestmark = pytest.mark.slow

FENCING = f"{shlex.quote(sys.executable)} -m fencingctl"


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(f"sqlite:{tmp_path / 'l.db'}", f"sqlite:{tmp_path / 'g.db'}") as s:
        yield s


def lock_argv(servers: RunningServers, resource: str, *opts: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fencingctl",
        "lock",
        resource,
        *opts,
        "--lease-addr",
        servers.lease_address,
        "--guard-addr",
        servers.guard_address,
    ]


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FENCING_")}
    clean["PYTHONPATH"] = os.getcwd()
    return clean


def run_lock(
    servers: RunningServers, resource: str, script: str, *opts: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*lock_argv(servers, resource, *opts), "--", "sh", "-c", script],
        env=env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD * 2,
    )


def wait_for(path: Path) -> None:
    end = time.monotonic() + HANG_GUARD
    while not path.exists():
        assert time.monotonic() < end, f"{path.name} never appeared"
        time.sleep(0.02)


def read_line(path: Path) -> str:
    """The line a command writes to ``path`` (``echo ... > path``), once it is whole:
    the shell creates the file before it writes, so the file can be there and empty."""
    end = time.monotonic() + HANG_GUARD
    while True:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return text
        assert time.monotonic() < end, f"{path.name} never held a whole line: {text!r}"
        time.sleep(0.02)


def test_runs_the_command_with_the_lease_in_its_environment(
    servers: RunningServers, tmp_path: Path
) -> None:
    script = f"env | grep ^FENCING_ | sort > env.txt; {FENCING} put orders k v; exit 3"
    done = run_lock(servers, "orders", script, "--ttl", "5", "--holder", "cron-1", cwd=tmp_path)
    assert done.returncode == 3, done.stderr  # the command's own status
    seen = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text().splitlines())
    token = int(seen["FENCING_TOKEN"])
    assert seen["FENCING_RESOURCE"] == "orders"
    assert seen["FENCING_HOLDER"] == "cron-1"
    assert seen["FENCING_LEASE_ADDR"] == servers.lease_address
    assert seen["FENCING_GUARD_ADDR"] == servers.guard_address
    assert f"fence={token}" in done.stdout  # the put inside used FENCING_TOKEN
    with GuardClient(servers.guard_address) as guard:
        record = guard.read("orders", "k")
        assert record is not None and record.written_by_token == token
        assert guard.describe_fence("orders") == token  # promised before CMD ran
    with LeaseClient(servers.lease_address) as leases:
        state = leases.describe("orders")
    assert not state.held and state.last_token == token  # released when CMD exited


def test_a_second_lock_waits_its_turn(servers: RunningServers, tmp_path: Path) -> None:
    first = subprocess.Popen(
        [
            *lock_argv(servers, "job"),
            "--",
            "sh",
            "-c",
            "touch in1; while [ ! -e out1 ]; do sleep 0.02; done; echo $FENCING_TOKEN > t1",
        ],
        env=env(),
        cwd=tmp_path,
    )
    try:
        wait_for(tmp_path / "in1")
        busy = run_lock(servers, "job", "touch ran", "--timeout", "0.2", cwd=tmp_path)
        assert busy.returncode == EXIT_NOT_ACQUIRED, busy.stderr
        assert "not acquired" in busy.stderr
        assert not (tmp_path / "ran").exists()
        second = subprocess.Popen(
            [
                *lock_argv(servers, "job"),
                "--",
                "sh",
                "-c",
                "test -e t1 && echo $FENCING_TOKEN > t2",
            ],
            env=env(),
            cwd=tmp_path,
        )
        (tmp_path / "out1").touch()
        assert first.wait(HANG_GUARD) == 0
        assert second.wait(HANG_GUARD) == 0  # it ran only after the first was done
    finally:
        first.kill()
    t1, t2 = (int((tmp_path / f).read_text()) for f in ("t1", "t2"))
    assert t2 > t1


def test_put_outside_a_lock_needs_a_token(servers: RunningServers, tmp_path: Path) -> None:
    base = [sys.executable, "-m", "fencingctl", "put", "orders", "k", "v"]
    base += ["--guard-addr", servers.guard_address]
    done = subprocess.run(base, env=env(), capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.returncode == exits.USAGE and "error: USAGE: no token" in done.stderr
    other = env() | {"FENCING_TOKEN": "4", "FENCING_RESOURCE": "billing"}
    done = subprocess.run(base, env=other, capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.returncode == exits.USAGE and "a token of 'billing'" in done.stderr


def test_no_command_is_a_usage_error(servers: RunningServers, tmp_path: Path) -> None:
    done = subprocess.run(
        [*lock_argv(servers, "job"), "--"], env=env(), capture_output=True, text=True
    )
    assert done.returncode == 2 and "command" in done.stderr


def paused_holder_history(servers: RunningServers, tmp: Path) -> tuple[int, str]:
    """A holds ``acct`` (ttl 1 s) and is paused whole past its ttl; B takes ``acct``
    and writes; A resumes and its script writes late. Returns A's exit code and the
    script's late put's stderr; the final value is read by the caller."""
    # A's script ignores SIGTERM, so its late put runs whatever A does on the loss:
    # the guard, not the courtesy signal, is what must stop it.
    script = (
        "trap '' TERM; echo $FENCING_TOKEN > a.token; "
        "while [ ! -e go ]; do sleep 0.02; done; "
        f"{FENCING} put acct balance from-A 2> a.err; echo $? > a.rc"
    )
    a = subprocess.Popen(
        [*lock_argv(servers, "acct", "--ttl", "1", "--grace", "30"), "--", "sh", "-c", script],
        env=env(),
        cwd=tmp,
        start_new_session=True,
    )
    try:
        wait_for(tmp / "a.token")
        os.killpg(a.pid, signal.SIGSTOP)  # a pause of the whole holder: no renewals
        b = run_lock(
            servers, "acct", f"{FENCING} put acct balance from-B", "--timeout", "60", cwd=tmp
        )
        assert b.returncode == 0, b.stderr
        (tmp / "go").touch()
        os.killpg(a.pid, signal.SIGCONT)
        code = a.wait(HANG_GUARD)
        wait_for(tmp / "a.rc")
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
    return code, (tmp / "a.err").read_text()


def test_a_paused_holders_late_put_is_refused(servers: RunningServers, tmp_path: Path) -> None:
    code, err = paused_holder_history(servers, tmp_path)
    assert code == EXIT_LOST
    # the late put's own exit: the guard refused it as stale
    assert (tmp_path / "a.rc").read_text().strip() == str(exits.CODES["STALE_TOKEN"])
    assert "STALE_TOKEN" in err
    with GuardClient(servers.guard_address) as guard:
        record = guard.read("acct", "balance")
    assert record is not None and record.value == b"from-B"


def test_control_fencing_off_lets_the_late_put_through(tmp_path: Path) -> None:
    with running_servers(mode=FenceMode.OFF) as servers:
        code, err = paused_holder_history(servers, tmp_path)
        with GuardClient(servers.guard_address) as guard:
            record = guard.read("acct", "balance")
    assert code == EXIT_LOST
    assert (tmp_path / "a.rc").read_text().strip() == "0", err
    # The damage: the paused former holder overwrote the new holder's value.
    assert record is not None and record.value == b"from-A"
    assert record.written_by_token == int((tmp_path / "a.token").read_text())


@pytest.mark.parametrize("ignores_term", [False, True], ids=["stops-on-term", "needs-kill"])
def test_a_lost_lease_stops_the_command(
    servers: RunningServers, tmp_path: Path, ignores_term: bool
) -> None:
    # exec: the command is the process fencing lock signals (an ignored SIGTERM stays
    # ignored across exec), so SIGKILL is what ends it.
    trap = "trap '' TERM; " if ignores_term else ""
    script = f"{trap}echo $FENCING_TOKEN > token; exec sleep {HANG_GUARD * 2:g}"
    with subprocess.Popen(
        [*lock_argv(servers, "cron", "--ttl", "1", "--grace", "0.2"), "--", "sh", "-c", script],
        env=env(),
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    ) as holder:  # its pipe closed however the test ends
        try:
            token = int(read_line(tmp_path / "token"))
            with LeaseClient(servers.lease_address) as leases:
                leases.release("cron", token)  # taken away: the next renewal is refused
            _, err = holder.communicate(timeout=HANG_GUARD)
        finally:
            holder.kill()
            holder.wait()
    assert holder.returncode == EXIT_LOST
    assert "SIGTERM" in err
    assert ("SIGKILL" in err) is ignores_term


@pytest.mark.parametrize("command", ["lock", "elect"])
def test_ctrl_c_while_waiting_exits_130_and_runs_nothing(
    servers: RunningServers, tmp_path: Path, command: str
) -> None:
    """SIGINT while still waiting for the lease: exit 130 (INTERRUPTED), CMD never started,
    and the resource is left to its holder (no lease of ours stays behind)."""
    argv = [sys.executable, "-m", "fencingctl", command, "busy", "--timeout", "60"]
    if command == "elect":
        argv += ["--value", "me"]
    argv += ["--lease-addr", servers.lease_address, "--guard-addr", servers.guard_address]
    argv += ["--", "touch", "ran"]
    waiters = servers.lease.service.waiters
    with LeaseClient(servers.lease_address, holder="other") as leases:
        held = leases.acquire("busy", ttl=30)
        with subprocess.Popen(argv, env=env(), cwd=tmp_path) as waiting:
            try:
                end = time.monotonic() + HANG_GUARD
                while waiters.waiting("busy") == 0:  # its acquire is in line behind "other"
                    assert waiting.poll() is None and time.monotonic() < end, "never queued"
                    time.sleep(0.05)
                waiting.send_signal(signal.SIGINT)
                assert waiting.wait(HANG_GUARD) == exits.CODES["INTERRUPTED"] == 130
            finally:
                waiting.kill()
        assert not (tmp_path / "ran").exists()
        state = leases.describe("busy")
        assert state.holder == "other" and state.token == held.token
