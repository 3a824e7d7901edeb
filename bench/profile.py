"""Where a row's CPU goes: py-spy on the server (or the client) while the row runs.

``python -m bench.profile stream`` starts a lease server and a guard on SQLite, as
:mod:`bench.cpu` does, runs one of its operations with ``--clients`` clients for
``--seconds``, and records the server process with ``py-spy record --native`` (idle
frames left out); ``--side client`` records the load instead (run in a child process,
so py-spy can follow it). What it prints is the profile summed two ways: the functions
where the samples were taken (self) and every function on a sampled stack (inclusive),
each as a share of all samples. ``--raw FILE`` keeps py-spy's collapsed stacks (a
flame graph's input).

py-spy is not a dependency of the project: ``pip install py-spy``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench import cpu
from bench.harness import Server, measure, progress

ROWS = {
    "stream": cpu.STREAMED,
    "unary": cpu.UNARY,
    "write": cpu.WRITE,
    "ping": cpu.LEASE_PING,
    "empty": cpu.LEASE_EMPTY,
}


#: Frames of a thread that waits (for work, for the network, for the GIL): with
#: ``--native`` py-spy samples them too, and they cost no CPU.
WAITS = (
    "epoll_wait", "pthread_cond_wait", "pthread_cond_timedwait", "PyThread_acquire_lock_timed",
    "sem_wait", "sem_timedwait", "sem_clockwait", "poll (", "futex",
)  # fmt: skip


def summary(stacks: Sequence[str], top: int = 25) -> str:
    """The collapsed stacks' samples on CPU by function, self and inclusive, as shares
    of the samples on CPU (waits left out and counted apart)."""
    own: collections.Counter[str] = collections.Counter()
    within: collections.Counter[str] = collections.Counter()
    total = waiting = 0
    for line in stacks:
        frames, _, count_text = line.rstrip("\n").rpartition(" ")
        if not frames or not count_text.isdigit():
            continue
        count = int(count_text)
        names = [_short(frame) for frame in frames.split(";")]
        if any(wait in name for name in names[-3:] for wait in WAITS):
            waiting += count
            continue
        total += count
        own[names[-1]] += count
        for name in set(names):
            within[name] += count
    if not total:
        return "no samples"
    lines = [
        f"{total:,} samples on CPU ({waiting:,} waiting left out)",
        "",
        "| self | function |",
        "| ---: | --- |",
    ]
    lines += [f"| {n / total:.1%} | `{name}` |" for name, n in own.most_common(top)]
    lines += ["", "| inclusive | function |", "| ---: | --- |"]
    lines += [f"| {n / total:.1%} | `{name}` |" for name, n in within.most_common(top)]
    return "\n".join(lines)


def _short(frame: str) -> str:
    """``fn (path/to/file.py:12)`` as ``fn (file.py)``: lines apart are one function."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rpartition(":")[0] or where.rstrip(")")
    return f"{name} ({Path(where).name})" if where else name


async def _load(row: str, lease: str, guard: str, clients: int, seconds: float) -> None:
    side = cpu.Side("profile", Server(lease, []), Server(guard, []))
    async with contextlib.AsyncExitStack() as stack:
        ops = {name: op for name, op, _ in await cpu._ops(side, clients, stack)}
        await measure(row, ops[row], clients, seconds, warmup=0)


def _record(pid: int, seconds: float, out: Path, gil: bool) -> subprocess.Popen[bytes]:
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    # --native stops the process at every sample (ptrace), which lands samples on system
    # calls more often than their share; --gil samples the Python code holding the GIL
    # without stopping anything.
    how = ["--gil", "--nonblocking"] if gil else ["--native"]
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), *how, "--format", "raw", "--rate", "250",
         "--duration", str(int(seconds)), "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    p.add_argument("row", choices=sorted(ROWS))
    p.add_argument("--side", choices=("server", "client"), default="server")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--top", type=int, default=25)
    p.add_argument(
        "--gil", action="store_true", help="only the thread holding the GIL, Python frames"
    )
    p.add_argument("--memory", action="store_true", help="the servers on memory://")
    p.add_argument("--raw", type=Path, help="keep py-spy's collapsed stacks here")
    p.add_argument("--load", nargs=2, metavar=("LEASE", "GUARD"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    row = ROWS[args.row]
    if args.load:  # the client side's child: only the load
        lease, guard = args.load
        asyncio.run(_load(row, lease, guard, args.clients, args.seconds + 2))
        return 0
    with tempfile.TemporaryDirectory(prefix="fencing-profile-") as tmp:
        data = Path(tmp)
        out = args.raw or data / "stacks.txt"
        with cpu._servers(None, data, "profile", memory=args.memory) as (lease, guard):
            target = lease if row != cpu.WRITE else guard
            if args.side == "server":
                spy = _record(target.pids[0], args.seconds, out, args.gil)
                time.sleep(0.5)
                progress(f"profile: {row}, server, {args.clients} clients, {args.seconds:.0f} s")
                asyncio.run(_load(row, lease.address, guard.address, args.clients, args.seconds))
            else:
                child = subprocess.Popen(
                    [sys.executable, "-m", "bench.profile", args.row, "--clients",
                     str(args.clients), "--seconds", str(args.seconds), "--load",
                     lease.address, guard.address],
                    env={**os.environ},
                )  # fmt: skip
                time.sleep(1.5)  # its channels and clients connected, past the warm-up
                progress(f"profile: {row}, client, {args.clients} clients, {args.seconds:.0f} s")
                spy = _record(child.pid, args.seconds, out, args.gil)
                child.wait()
            spy.wait()
        print(summary(out.read_text().splitlines(), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
