"""Every example of ``examples/`` run as a reader would: a real process against a real
``fencing serve``, its exit status and its verdict lines asserted, and each control
(the flag that turns a safety mechanism off; ``--no-fencing`` starts the example's own
``fencing serve --fence-mode off``) asserted to show the violation."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import pg as testpg

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Serve:
    lease_addr: str
    guard_addr: str


def _serve(data: Path, *flags: str) -> Iterator[Serve]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencingctl", "serve", "--data-dir", str(data),
         "--lease-listen", "127.0.0.1:0", "--guard-listen", "127.0.0.1:0", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lease_line, guard_line = proc.stdout.readline(), proc.stdout.readline()
        assert "lease server listening on" in lease_line, lease_line
        yield Serve(lease_line.split()[-1], guard_line.split()[3])
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    yield from _serve(tmp_path_factory.mktemp("serve"))


def run_example(name: str, server: Serve, *flags: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", f"examples.{name}", "--lease-addr", server.lease_addr,
         "--guard-addr", server.guard_addr, *flags],
        capture_output=True, text=True, timeout=90, cwd=ROOT,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def verdict(out: str, claim: str) -> str:
    """``OK`` or ``VIOLATED``: what the example printed for ``claim``."""
    for line in out.splitlines():
        word, _, rest = line.strip().partition("  ")
        if rest.startswith(claim + ":"):
            return word
    raise AssertionError(f"no verdict for {claim!r} in:\n{out}")


def judged(out: str, claims: list[str], violated: set[str]) -> None:
    """Each of ``claims`` printed OK, but those of ``violated``, printed VIOLATED."""
    expected = ["VIOLATED" if c in violated else "OK" for c in claims]
    assert [verdict(out, c) for c in claims] == expected, out


SCHEDULING = [
    "one attempt per (step, attempt number)",
    "no worker runs more attempts than its slots",
]
COUPONS = [
    "each coupon issued once per (user, campaign)",
    "the SMS provider sends each user one message",
    "the paused replica's late 'sent' is refused",
]
LEADER = [
    "one sender at a time, by leadership",
    "the consumer drops duplicates by event id",
    "order per aggregate kept",
]
CHECKLIST = [
    "concurrent workers never share a live claim",
    "a graceful shutdown starts no new work",
    "a crashed worker's job is claimed again after its lease",
    "the heartbeat stops work when the claim is lost",
    "failed jobs retry with backoff and end dead",
    "repeated delivery makes one effect per idempotency key",
    "timeouts stay under the lease",
]
OUTBOX = [
    "events written in the business transaction",
    "several publishers publish every event",
    "the paused publisher's late publish is refused",
    "its late acknowledgement is refused (owner-checked)",
]


@dataclass(frozen=True)
class Case:
    example: str
    claims: list[str]
    flags: tuple[str, ...] = ()
    violated: frozenset[int] = frozenset()  # indexes into claims
    shown: tuple[str, ...] = ()  # lines proving the story happened as told


SLOW = pytest.mark.slow
CASES = [
    pytest.param(Case("scheduling", SCHEDULING, shown=("reused it", "no eligible worker")),
                 id="scheduling"),
    pytest.param(Case("scheduling", SCHEDULING, ("--no-attempt-key",), frozenset({0})),
                 id="scheduling-control-no-attempt-key"),
    pytest.param(Case("scheduling", SCHEDULING, ("--no-slot-check",), frozenset({1})),
                 id="scheduling-control-no-slot-check"),
    pytest.param(Case("coupons", COUPONS, shown=("then SIGSTOP", "refused (fence",
                                                 "18 times: 6 jobs")), id="coupons", marks=SLOW),
    pytest.param(Case("coupons", COUPONS, ("--no-unique-key",), frozenset({0})),
                 id="coupons-control-issued-three-times", marks=SLOW),
    pytest.param(Case("coupons", COUPONS, ("--unstable-sms-key",), frozenset({1})),
                 id="coupons-control-sms-sent-twice", marks=SLOW),
    pytest.param(Case("coupons", COUPONS, ("--no-fencing",), frozenset({2}), ("ACCEPTED",)),
                 id="coupons-control-no-fencing", marks=SLOW),
    pytest.param(Case("outbox_leader", LEADER, shown=("cursor write: refused (fence", "dropped 3")),
                 id="outbox-leader", marks=SLOW),
    pytest.param(Case("outbox_leader", LEADER, ("--no-dedup",), frozenset({1, 2})),
                 id="outbox-leader-control-no-dedup", marks=SLOW),
    pytest.param(Case("outbox_leader", LEADER, ("--no-fencing",), frozenset({0})),
                 id="outbox-leader-control-no-fencing", marks=SLOW),
    pytest.param(Case("worker_pool", CHECKLIST, shown=(
        "SIGKILL in the middle of crash-me", "SIGSTOP in the middle of pause-me",
        "the handler stopped", "SIGTERM during shutdown-me")), id="worker-pool", marks=SLOW),
    pytest.param(Case("worker_pool", CHECKLIST, ("--no-idempotency-key",), frozenset({5})),
                 id="worker-pool-control-no-idempotency-key", marks=SLOW),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_example(case: Case, serve: Serve) -> None:
    code, out = run_example(case.example, serve, *case.flags)
    assert code == (1 if case.violated else 0), out
    judged(out, case.claims, {case.claims[i] for i in case.violated})
    for line in case.shown:
        assert line in out, out


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("control", [False, True], ids=["fenced", "control-no-fencing"])
def test_outbox_on_postgres_refuses_the_paused_publisher(tmp_path: Path, control: bool) -> None:
    with testpg.fresh_schema_url() as url:
        for server in _serve(tmp_path, "--queue", url):
            code, out = run_example("outbox", server, "--dsn", url, *["--no-fencing"] * control)
    # The acknowledgement is owner-checked by the queue whatever the guard does.
    judged(out, OUTBOX, {OUTBOX[2]} if control else set())
    assert code == (1 if control else 0), out
    assert "then SIGSTOP" in out, out


@pytest.mark.parametrize(
    "example", ["outbox", "scheduling", "coupons", "worker_pool", "outbox_leader"]
)
def test_example_help_tells_how_to_run_it(example: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", f"examples.{example}", "--help"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"python -m examples.{example}" in proc.stdout  # the docstring: how to run it
    assert "--lease-addr" in proc.stdout
