"""``fencing demo``: the classic story, with real processes, in one command.

1. ``fencing serve`` starts on a fresh temporary data dir.
2. Worker A acquires ``account`` (ttl 1 s), writes, and starts a slow step.
3. The demo freezes A with SIGSTOP (a GC pause, a VM migration...). A's renewals
   stop with it, so its lease expires on the server.
4. Worker B acquires ``account`` (a larger token) and writes.
5. The demo resumes A with SIGCONT. A, unaware, writes with its old token.
6. The guard rejects it (STALE_TOKEN); the final value is B's.

The demo exits 0 only if that is what happened. ``--fence-mode off`` runs the same
story with fencing disabled, to show the stale write landing (and exits 1).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

from fencingctl import flags

RESOURCE = "account"
KEY = "balance"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="watch fencing stop a paused former owner (real processes, SIGSTOP)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--fence-mode",
        choices=["monotonic", "off"],
        default="monotonic",
        help="off: the control, fencing disabled (the stale write lands); default monotonic",
    )
    p.add_argument(
        "--ttl",
        type=flags.ttl,
        metavar="DURATION",
        default=1.0,
        help="worker A's lease ttl (default 1s)",
    )
    p.add_argument("--json", action="store_true", help="also print the outcome as JSON")
    p.set_defaults(run=run)


class _Timeline:
    def __init__(self) -> None:
        self.start = time.monotonic()
        self.lines: list[tuple[float, str, str]] = []

    def say(self, who: str, what: str) -> None:
        at = time.monotonic() - self.start
        self.lines.append((at, who, what))
        print(f"  {at:6.2f}s  {who:<9} {what}", flush=True)


class _Proc:
    """A child process whose stdout lines are read on a thread into a queue."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.popen = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        assert self.popen.stdout is not None
        threading.Thread(target=self._pump, args=(self.popen.stdout,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.name} said nothing for {timeout:g} s") from None
        if line is None:
            err = self.popen.stderr.read() if self.popen.stderr else ""
            raise RuntimeError(f"{self.name} exited ({self.popen.wait()}): {err[-2000:]}")
        return line

    def next_event(self, timeout: float = 15.0) -> dict[str, Any]:
        while True:
            line = self.next_line(timeout)
            if line.startswith("{"):
                event: dict[str, Any] = json.loads(line)
                return event

    def stop(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGCONT)
                self.popen.terminate()
                self.popen.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.popen.kill()
                self.popen.wait()


def _describe_event(event: dict[str, Any]) -> str:
    kind = event["event"]
    if kind == "acquired":
        return f"acquired {RESOURCE!r} with token {event['token']} (ttl {event['ttl']:g} s)"
    if kind == "wrote":
        return f"wrote {KEY}={event['value']!r} with token {event['token']}: accepted"
    if kind == "working":
        return "starts a slow step inside its critical section..."
    if kind == "rejected":
        return (
            f"late write {KEY}={event['value']!r} with token {event['token']}: "
            f"REJECTED {event['reason']} (guard fence is {event['current_token']})"
        )
    if kind == "lost":
        return "notices its lease is lost (after the fact)"
    if kind == "released":
        return f"released {RESOURCE!r}"
    return json.dumps(event)


def run(args: argparse.Namespace) -> int:
    from fencing.client import GuardClient

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    timeline = _Timeline()
    print(f"fencing demo (fence mode {args.fence_mode}): a paused former owner wakes up late\n")
    procs: list[_Proc] = []
    with tempfile.TemporaryDirectory(prefix="fencing-demo-") as data:
        try:
            server = _Proc(
                "server",
                [
                    sys.executable,
                    "-m",
                    "fencingctl",
                    "serve",
                    "--data-dir",
                    data,
                    "--lease-listen",
                    "127.0.0.1:0",
                    "--guard-listen",
                    "127.0.0.1:0",
                    "--fence-mode",
                    args.fence_mode,
                ],
                env,
            )
            procs.append(server)
            lease_addr = server.next_line(30).rsplit(" ", 1)[-1]
            guard_addr = server.next_line(30).split(" ")[3]
            timeline.say(
                "server",
                f"lease server {lease_addr}, guard {guard_addr} (fence mode {args.fence_mode})",
            )

            def worker(name: str, ttl: float, work: float) -> _Proc:
                proc = _Proc(
                    f"worker-{name}",
                    [
                        sys.executable,
                        "-m",
                        "fencingctl.demo",
                        "worker",
                        name,
                        lease_addr,
                        guard_addr,
                        str(ttl),
                        str(work),
                    ],
                    env,
                )
                procs.append(proc)
                return proc

            a = worker("A", args.ttl, 2.0)
            for _ in range(3):  # acquired, wrote, working
                event = a.next_event()
                timeline.say("worker-A", _describe_event(event))
            os.killpg(a.popen.pid, signal.SIGSTOP)
            timeline.say("demo", "SIGSTOP worker-A: frozen mid-step, its renewals stop too")

            b = worker("B", 10.0, 0.0)
            for _ in range(3):  # acquired, wrote, released
                event = b.next_event(timeout=args.ttl * 10 + 15)
                timeline.say("worker-B", _describe_event(event))
            b.popen.wait(15)

            os.killpg(a.popen.pid, signal.SIGCONT)
            timeline.say("demo", "SIGCONT worker-A: it wakes up and carries on")
            late = a.next_event()
            timeline.say("worker-A", _describe_event(late))
            a.popen.wait(15)

            with GuardClient(guard_addr) as guard:
                record = guard.read(RESOURCE, KEY)
        finally:
            for proc in reversed(procs):
                proc.stop()

    final = (record.value.decode(), record.written_by_token) if record else (None, 0)
    print(f"\nfinal {RESOURCE}/{KEY} = {final[0]!r}, written by token {final[1]}")
    ok = late["event"] == "rejected" and final[0] == "B: 200"
    if ok:
        print("OK: the guard rejected the paused former owner's write; B's value stands.")
    elif args.fence_mode == "off":
        print("VIOLATION (expected, fencing is off): the stale write from A overwrote B's value.")
    else:
        print("VIOLATION: the stale write was not rejected.")
    if args.json:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "fence_mode": args.fence_mode,
                    "late": late,
                    "final_value": final[0],
                    "final_token": final[1],
                }
            )
        )
    return 0 if ok else 1


def worker_main(name: str, lease_addr: str, guard_addr: str, ttl: float, work: float) -> int:
    """One demo worker: hold the lease, write, do slow work, write again."""
    from fencing.client import GuardClient, LeaseClient
    from fencing.errors import LeaseLost, StaleTokenError

    def emit(**fields: Any) -> None:
        print(json.dumps(fields), flush=True)

    leases = LeaseClient(lease_addr, holder=f"worker-{name}")
    guard = GuardClient(guard_addr)
    value = f"{name}: 100" if name == "A" else f"{name}: 200"
    try:
        with leases.hold(RESOURCE, ttl=ttl, timeout=60) as lease:
            emit(event="acquired", token=lease.token, ttl=ttl)
            guard.put(lease, KEY, value.encode())
            emit(event="wrote", token=lease.token, value=value)
            if work > 0:
                emit(event="working")
                time.sleep(work)  # frozen here by SIGSTOP; a naive worker does not re-check
                late_value = f"{name}: 150"
                try:
                    guard.put(lease, KEY, late_value.encode())
                    emit(event="wrote", token=lease.token, value=late_value)
                except StaleTokenError as exc:
                    emit(
                        event="rejected",
                        token=lease.token,
                        value=late_value,
                        reason=exc.reason,
                        current_token=exc.current_token,
                    )
        emit(event="released")
    except LeaseLost:
        emit(event="lost")
    finally:
        leases.close()
        guard.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "worker":
        sys.exit(
            worker_main(
                sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), float(sys.argv[6])
            )
        )
    sys.exit("usage: python -m fencingctl.demo worker NAME LEASE_ADDR GUARD_ADDR TTL WORK")
