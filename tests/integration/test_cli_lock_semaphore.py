"""``fencing lock -n N RESOURCE -- CMD``: a semaphore from the shell, in real processes.

N+1 commands started together: at most N ever run at once (each counts the commands
in, and waits a while for one more); the control gives N+1 slots and sees all of
them in together. A holder paused whole (SIGSTOP) past its ttl loses its slot to a
waiter; its late ``fencing put "$FENCING_RESOURCE"`` is refused by the guard, and the
control (fencing off) shows it overwrite the new holder's value.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import GuardClient
from fencing.testing import RunningServers, running_servers
from fencingctl.lock import EXIT_LOST
from guard.fence import FenceMode
from serving import exits
from tests.integration.test_cli_lock import (
    FENCING,
    env,
    lock_argv,
    read_line,
    run_lock,
    wait_for,
)
from tests.waiting import HANG_GUARD

pytestmark = pytest.mark.slow


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(f"sqlite:{tmp_path / 'l.db'}", f"sqlite:{tmp_path / 'g.db'}") as s:
        yield s


def most_seen_together(servers: RunningServers, tmp: Path, limit: int, holders: int) -> int:
    """Start ``holders`` commands under ``fencing lock -n limit`` at once. Each enters
    (``in.PID``), waits until all ``holders`` have entered (or ``linger`` s), counts who
    is inside (entered minus left: left counted first, so never fewer than were inside)
    and leaves (``out.PID``). The largest count any of them saw."""
    linger = 1.5 if holders > limit else HANG_GUARD  # the control waits for all to meet
    script = (
        "touch in.$$; i=0; "
        f"while [ $i -lt {int(linger * 20)} ]; do "
        f"[ $(ls in.* | wc -l) -ge {holders} ] && break; sleep 0.05; i=$((i+1)); done; "
        "left=$(ls out.* 2>/dev/null | wc -l); entered=$(ls in.* | wc -l); "
        "echo $((entered - left)) > seen.$$; touch out.$$"
    )
    procs = [
        subprocess.Popen(
            [*lock_argv(servers, "pool", "-n", str(limit)), "--", "sh", "-c", script],
            env=env(),
            cwd=tmp,
        )
        for _ in range(holders)
    ]
    try:
        assert all(p.wait(HANG_GUARD * 2) == 0 for p in procs)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    seen = [int(f.read_text()) for f in tmp.glob("seen.*")]
    assert len(seen) == holders
    return max(seen)


def test_n_plus_one_holders_never_run_together(servers: RunningServers, tmp_path: Path) -> None:
    assert most_seen_together(servers, tmp_path, limit=2, holders=3) == 2


def test_control_n_plus_one_slots_let_them_all_in(servers: RunningServers, tmp_path: Path) -> None:
    assert most_seen_together(servers, tmp_path, limit=3, holders=3) == 3


def paused_slot_history(servers: RunningServers, tmp: Path) -> tuple[int, str, str]:
    """-n 2: K holds one slot throughout; A holds the other (ttl 1 s) and is paused whole
    past its ttl; B waits for a slot, gets A's and writes; A resumes and its script
    writes late to its slot. Returns A's exit code, A's slot and the late put's stderr."""
    keep = "touch k.in; while [ ! -e done ]; do sleep 0.02; done"
    # A's script ignores SIGTERM, so its late put runs whatever A does on the loss:
    # the guard, not the courtesy signal, is what must stop it.
    script = (
        "trap '' TERM; echo $FENCING_RESOURCE > a.res; echo $FENCING_TOKEN > a.token; "
        "while [ ! -e go ]; do sleep 0.02; done; "
        f'{FENCING} put "$FENCING_RESOURCE" balance from-A 2> a.err; echo $? > a.rc'
    )
    keeper = subprocess.Popen(
        [*lock_argv(servers, "acct", "-n", "2"), "--", "sh", "-c", keep], env=env(), cwd=tmp
    )
    a = subprocess.Popen(
        [
            *lock_argv(servers, "acct", "-n", "2", "--ttl", "1", "--grace", "30"),
            *("--", "sh", "-c", script),
        ],
        env=env(),
        cwd=tmp,
        start_new_session=True,
    )
    try:
        wait_for(tmp / "k.in")
        read_line(tmp / "a.token")
        os.killpg(a.pid, signal.SIGSTOP)  # a pause of the whole holder: no renewals
        b = run_lock(
            servers,
            "acct",
            f'{FENCING} put "$FENCING_RESOURCE" balance from-B && echo $FENCING_RESOURCE > b.res',
            "-n",
            "2",
            "--timeout",
            "60",
            cwd=tmp,
        )
        assert b.returncode == 0, b.stderr
        (tmp / "go").touch()
        os.killpg(a.pid, signal.SIGCONT)
        code = a.wait(HANG_GUARD)
        wait_for(tmp / "a.rc")
        (tmp / "done").touch()
        assert keeper.wait(HANG_GUARD) == 0
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
        keeper.kill()
        keeper.wait()
    slot = read_line(tmp / "a.res").strip()
    assert read_line(tmp / "b.res").strip() == slot  # B took over A's slot
    return code, slot, (tmp / "a.err").read_text()


def test_a_paused_slot_holders_late_put_is_refused(servers: RunningServers, tmp_path: Path) -> None:
    code, slot, err = paused_slot_history(servers, tmp_path)
    assert code == EXIT_LOST and slot.startswith("acct/slot-")
    assert (tmp_path / "a.rc").read_text().strip() == str(exits.CODES["STALE_TOKEN"])
    assert "STALE_TOKEN" in err
    with GuardClient(servers.guard_address) as guard:
        record = guard.read(slot, "balance")
    assert record is not None and record.value == b"from-B"


def test_control_fencing_off_lets_the_late_slot_put_through(tmp_path: Path) -> None:
    with running_servers(mode=FenceMode.OFF) as servers:
        code, slot, err = paused_slot_history(servers, tmp_path)
        with GuardClient(servers.guard_address) as guard:
            record = guard.read(slot, "balance")
    assert code == EXIT_LOST
    assert (tmp_path / "a.rc").read_text().strip() == "0", err
    # The damage: the paused former holder overwrote the slot's new holder's value.
    assert record is not None and record.value == b"from-A"
