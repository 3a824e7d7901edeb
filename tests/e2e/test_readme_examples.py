"""Every Python example in README.md that is meant to run, run against real servers.

The convention, in README.md: an HTML comment on the line before a ```python fence
says what the block is::

    <!-- example: skip (why) -->   not run (a fragment, or it needs infrastructure of
                                    the reader's own); the reason is mandatory
    <!-- example: NAME -->          run, and this file may set it up or check its effect
                                    by NAME
    (no comment)                    run as it is

Each block that runs is written to a file and executed by a fresh ``python`` process
(the SDK as a user has it) against a lease server and a guard started here on free
loopback ports; the only change made to the text is that the README's addresses
(127.0.0.1:50051 and :50052) become those ports. A block must exit 0 (a ``worker``
block runs until SIGTERM, as its comment says). So an example that breaks fails the
build.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from fencing import GuardClient, LeaseClient, QueueClient
from fencing.testing import RunningServers, running_servers

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LEASE_ADDR = "127.0.0.1:50051"
GUARD_ADDR = "127.0.0.1:50052"
MARKER = re.compile(r"<!--\s*example:\s*(?P<what>[\w-]+)\s*(?P<why>\(.*\))?\s*-->")


@dataclass(frozen=True)
class Example:
    name: str  # the marker's NAME, or "line-N" for an unmarked block
    line: int  # of the opening fence, 1-based
    code: str
    skip: str  # the reason, for a skipped block


def examples(text: str) -> list[Example]:
    """The ```python blocks of ``text`` with their markers."""
    lines = text.splitlines()
    found: list[Example] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        marker = MARKER.fullmatch(lines[start - 1].strip()) if start > 0 else None
        name, skip = f"line-{start + 1}", ""
        if marker is not None:
            if marker["what"] == "skip":
                skip = (marker["why"] or "").strip("()")
                assert skip, f"README.md:{start}: a skipped example must say why"
            else:
                name = marker["what"]
        found.append(Example(name, start + 1, "\n".join(body) + "\n", skip))
        i += 1
    return found


ALL = examples(README.read_text(encoding="utf-8"))
RUNNABLE = [e for e in ALL if not e.skip]


def sh_line(text: str, command: str) -> list[str]:
    """The README's shell line starting with ``command``, as argv."""
    for line in text.splitlines():
        if line.startswith(command):
            return shlex.split(line.split("#", 1)[0])
    raise AssertionError(f"README.md has no line starting with {command!r}")


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[RunningServers]:
    with running_servers(
        f"sqlite:{tmp_path / 'leases.db'}", f"sqlite:{tmp_path / 'guard.db'}"
    ) as running:
        yield running


def script(example: Example, servers: RunningServers, tmp_path: Path, epilogue: str = "") -> Path:
    code = example.code.replace(LEASE_ADDR, servers.lease_address).replace(
        GUARD_ADDR, servers.guard_address
    )
    path = tmp_path / f"readme_{example.name.replace('-', '_')}.py"
    path.write_text(code + epilogue, encoding="utf-8")
    return path


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def run(path: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=timeout, env=env()
    )
    assert proc.returncode == 0, f"{path.name} exited {proc.returncode}:\n{proc.stderr}"
    return proc


def test_the_convention_is_kept() -> None:
    """Every marker sits right before a python fence, and every name is known here."""
    text = README.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(text):
        if MARKER.fullmatch(line.strip()):
            assert n + 1 < len(text) and text[n + 1].strip() == "```python", (
                f"README.md:{n + 1}: an example marker must precede a ```python fence"
            )
    names = {e.name for e in RUNNABLE if not e.name.startswith("line-")}
    assert names <= set(NAMED), f"no runner for {sorted(names - set(NAMED))}"
    assert {"quickstart", "async-publish", "worker"} <= names


@pytest.mark.slow
def test_quickstart_works_verbatim_right_after_the_cli_step(
    servers: RunningServers, tmp_path: Path
) -> None:
    """The README's story as a newcomer runs it: the walk-through's CLI lines in order
    (acquire ``orders``, write, read, release), then the first Python example. It finds
    ``orders`` free (the walk-through left it released, so it does not wait), writes,
    says what it wrote, and releases on exit."""
    [quickstart] = [e for e in RUNNABLE if e.name == "quickstart"]
    walk = [r for r in SHOWN if r.argv[1] in ("lease", "put", "get")]
    assert [r.argv[1:3] for r in walk][-1] == ["lease", "release"]  # it ends released
    for shown in walk:
        done = fencing_cli(shown.argv, servers)
        assert done.returncode == 0, done.stderr
    with LeaseClient(servers.lease_address) as leases:
        cli = leases.describe("orders")
        assert not cli.held  # nothing for the example to wait for
        proc = run(script(quickstart, servers, tmp_path))
        state = leases.describe("orders")
    token = cli.last_token + 1
    assert proc.stdout.splitlines() == [f"wrote next-id=1 with token {token}"]
    assert not state.held and state.last_token == token  # released on exit
    with GuardClient(servers.guard_address) as guard:
        record = guard.read("orders", "next-id")
    assert record is not None and record.value == b"1" and record.written_by_token == token


def test_async_publish(servers: RunningServers, tmp_path: Path) -> None:
    [example] = [e for e in RUNNABLE if e.name == "async-publish"]
    epilogue = f"""

async def _main() -> None:
    async with AsyncLeaseClient({servers.lease_address!r}) as leases, AsyncGuardClient(
        {servers.guard_address!r}
    ) as guard:
        await publish(leases, guard)


import asyncio

asyncio.run(_main())
"""
    run(script(example, servers, tmp_path, epilogue))
    with GuardClient(servers.guard_address) as guard:
        record = guard.read("outbox", "cursor")
    assert record is not None and record.value == b"1042"


def test_worker_runs_until_sigterm(servers: RunningServers, tmp_path: Path) -> None:
    [example] = [e for e in RUNNABLE if e.name == "worker"]
    proc = subprocess.Popen(
        [sys.executable, str(script(example, servers, tmp_path))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    try:
        with QueueClient(servers.queue_address) as queue:
            deadline = time.monotonic() + 60
            while not any(s.succeeded for s in queue.stats("emails")):
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the example's job never succeeded"
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    with GuardClient(servers.guard_address) as guard:
        record = guard.read("job/emails/1", "sent/ada@example.com")
    assert record is not None and record.value == b"1"


#: The database the transactional enqueue example names: the reader's own.
APP_DSN = "postgresql://app@db/shop"


@pytest.mark.postgres
def test_pg_enqueue_in_the_applications_transaction(tmp_path: Path) -> None:
    """The example on a database of its own (the README's DSN made a throwaway one on the
    test PostgreSQL), its fencing schema made by a lease server hosting the queue there,
    as ``fencing migrate`` would; the jobs it enqueued are the queue's."""
    import psycopg
    from psycopg import sql

    from tests import pg

    [example] = [e for e in RUNNABLE if e.name == "pg-enqueue"]
    assert APP_DSN in example.code
    admin = pg.test_dsn()
    name = f"readme_{secrets.token_hex(4)}"
    dsn = urlunsplit(urlsplit(admin)._replace(path=f"/{name}"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        with running_servers(dsn) as servers, QueueClient(servers.queue_address) as queue:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, total bigint)")
            path = tmp_path / "readme_pg_enqueue.py"
            path.write_text(example.code.replace(APP_DSN, dsn), encoding="utf-8")
            run(path)
            (emails,) = queue.stats("emails")
            (invoices,) = queue.stats("invoices")
            assert (emails.ready, invoices.ready, invoices.scheduled) == (1, 1, 1)
            [job] = queue.claim("emails")
            assert job.payload == b'{"order": 42}'
            with psycopg.connect(dsn) as conn:
                assert conn.execute("SELECT total FROM orders WHERE id = 42").fetchone() == (1999,)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


#: The named examples, each with its own test above.
NAMED = {
    "quickstart": test_quickstart_works_verbatim_right_after_the_cli_step,
    "async-publish": test_async_publish,
    "worker": test_worker_runs_until_sigterm,
    "pg-enqueue": test_pg_enqueue_in_the_applications_transaction,
}


def test_unnamed_examples_run(servers: RunningServers, tmp_path: Path) -> None:
    """Blocks without a marker run as they are (none today: each has its own test)."""
    for example in RUNNABLE:
        if example.name.startswith("line-"):
            run(script(example, servers, tmp_path))


def test_skipped_examples_say_why() -> None:
    skipped = [e for e in ALL if e.skip]
    assert skipped, "the README has fragments; they must be marked, not silently run"
    for e in skipped:
        assert len(e.skip) > 10, f"README.md:{e.line}: say why the example does not run"


@dataclass(frozen=True)
class ShownRun:
    """A ``fencing`` command of a README shell block and the output shown under it."""

    line: int
    argv: list[str]
    output: list[str]


def shown_runs(text: str) -> list[ShownRun]:
    """Every ``fencing ...`` line of a ```sh block followed by ``# `` lines: the command's
    output as the README shows it (an inline ``# comment`` is a remark, not output)."""
    lines = text.splitlines()
    found: list[ShownRun] = []
    in_sh = False
    for n, line in enumerate(lines):
        if line.strip().startswith("```"):
            in_sh = line.strip() == "```sh" and not in_sh
            continue
        if not in_sh or not line.startswith("fencing "):
            continue
        output = []
        for after in lines[n + 1 :]:
            if not after.startswith("# "):
                break
            output.append(after[2:])
        if output:
            found.append(ShownRun(n + 1, shlex.split(line.split("#", 1)[0]), output))
    return found


#: What differs between two honest runs: the holder's host, pid and random part.
VARIABLE = [(re.compile(r"holder=\S+"), "holder=<host-pid-random>")]


def normalized(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        for pattern, stand_in in VARIABLE:
            line = pattern.sub(stand_in, line)
        out.append(line)
    return out


def fencing_cli(argv: list[str], servers: RunningServers) -> subprocess.CompletedProcess[str]:
    words = [
        {"LEASE_SERVER": servers.lease_address, "GUARD": servers.guard_address}.get(w, w)
        for w in argv[1:]
    ]
    if "--lease-addr" not in words and words[0] in ("lease", "fence"):
        words += ["--lease-addr", servers.lease_address]
    if "--guard-addr" not in words and words[0] in ("put", "get", "fence"):
        words += ["--guard-addr", servers.guard_address]
    return subprocess.run(
        [sys.executable, "-m", "fencingctl", *words],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(),
    )


SHOWN = shown_runs(README.read_text(encoding="utf-8"))


def test_the_readme_shows_outputs_of_the_quickstart_and_the_fence_reset() -> None:
    commands = {" ".join(r.argv[:3]) for r in SHOWN}
    assert {"fencing lease acquire", "fencing put orders", "fencing fence reset"} <= commands


@pytest.mark.slow
def test_the_quickstart_outputs_are_a_real_runs(servers: RunningServers) -> None:
    """The quickstart's CLI lines, run in order on fresh servers, print what the README
    shows (but for the holder's name, which names the host and process)."""
    quick = [r for r in SHOWN if r.argv[1] in ("lease", "put", "get")]
    assert len(quick) == 4
    for shown in quick:
        done = fencing_cli(shown.argv, servers)
        assert done.returncode == 0, done.stderr
        assert normalized(done.stdout.splitlines()) == normalized(shown.output), shown.line


@pytest.mark.slow
def test_the_fence_reset_output_is_a_real_runs(servers: RunningServers) -> None:
    """The README's wedged fence: last_token 42, a fence at the largest token; the reset
    prints exactly the line shown."""
    from fencing import Claim, Put

    [shown] = [r for r in SHOWN if r.argv[1:3] == ["fence", "reset"]]
    resource = shown.argv[3]
    with LeaseClient(servers.lease_address, holder="h") as leases:
        for _ in range(42):
            lease = leases.acquire_nowait(resource, 30)
            leases.release(resource, lease.token)
    with GuardClient(servers.guard_address) as guard:
        guard.write(Claim(resource, 2**63 - 1), Put("k", b"wedge"))
    done = fencing_cli(shown.argv, servers)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == shown.output
