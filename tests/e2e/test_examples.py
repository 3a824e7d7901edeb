"""Every example of ``examples/`` run as a reader would: a real process against a real
``fencing serve``, its exit status and its verdict lines asserted, and each control
(the flag that turns a safety mechanism off) asserted to show the violation."""

from __future__ import annotations

import asyncio
import secrets
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


ONE_ATTEMPT = "one attempt per (step, attempt number)"
SLOTS = "no worker runs more attempts than its slots"


def test_scheduling_one_attempt_per_step_and_slots_rechecked(serve: Serve) -> None:
    code, out = run_example("scheduling", serve)
    assert code == 0, out
    assert verdict(out, ONE_ATTEMPT) == "OK"
    assert verdict(out, SLOTS) == "OK"
    assert "reused it" in out, out  # the race happened: a loser reused the winner's attempt
    assert "no eligible worker" in out, out  # and the slots, not the snapshot, decided


def test_scheduling_control_without_the_attempt_key_creates_two(serve: Serve) -> None:
    code, out = run_example("scheduling", serve, "--no-attempt-key")
    assert code == 1, out
    assert verdict(out, ONE_ATTEMPT) == "VIOLATED"


def test_scheduling_control_trusting_the_snapshot_overbooks(serve: Serve) -> None:
    code, out = run_example("scheduling", serve, "--no-slot-check")
    assert code == 1, out
    assert verdict(out, SLOTS) == "VIOLATED"


@pytest.fixture(scope="module")
def serve_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """The control server: the guard accepts every token (``--fence-mode off``)."""
    yield from _serve(tmp_path_factory.mktemp("serve-off"), "--fence-mode", "off")


ISSUED = "each coupon issued once per (user, campaign)"
SMS = "the SMS provider sends each user one message"
LATE_SENT = "the paused replica's late 'sent' is refused"


@pytest.mark.slow
def test_coupons_issued_once_sent_once_late_sent_refused(serve: Serve) -> None:
    code, out = run_example("coupons", serve)
    assert code == 0, out
    assert [verdict(out, c) for c in (ISSUED, SMS, LATE_SENT)] == ["OK"] * 3
    assert "then SIGSTOP" in out and "refused (fence" in out, out
    assert "18 times: 6 jobs" in out, out  # three replicas scheduled, one job per user


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "claim"),
    [("--no-unique-key", ISSUED), ("--unstable-sms-key", SMS)],
    ids=["issued-three-times", "sms-sent-twice"],
)
def test_coupons_controls_show_the_duplicate(serve: Serve, flag: str, claim: str) -> None:
    code, out = run_example("coupons", serve, flag)
    assert code == 1, out
    assert verdict(out, claim) == "VIOLATED"


@pytest.mark.slow
def test_coupons_control_without_fencing_lets_the_late_sent_land(serve_off: Serve) -> None:
    code, out = run_example("coupons", serve_off)
    assert code == 1, out
    assert verdict(out, LATE_SENT) == "VIOLATED"
    assert "ACCEPTED" in out


LEADER = "one sender at a time, by leadership"
DEDUP = "the consumer drops duplicates by event id"
ORDER = "order per aggregate kept"


@pytest.mark.slow
def test_outbox_leader_single_sender_order_kept_duplicates_dropped(serve: Serve) -> None:
    code, out = run_example("outbox_leader", serve)
    assert code == 0, out
    assert [verdict(out, c) for c in (LEADER, DEDUP, ORDER)] == ["OK"] * 3
    assert "cursor write: refused (fence" in out, out
    assert "dropped 3" in out, out  # the deposed leader's late batch reached the broker


@pytest.mark.slow
def test_outbox_leader_control_without_dedup_processes_duplicates_out_of_order(
    serve: Serve,
) -> None:
    code, out = run_example("outbox_leader", serve, "--no-dedup")
    assert code == 1, out
    assert verdict(out, DEDUP) == "VIOLATED"
    assert verdict(out, ORDER) == "VIOLATED"


@pytest.mark.slow
def test_outbox_leader_control_without_fencing_lets_the_deposed_leader_write(
    serve_off: Serve,
) -> None:
    code, out = run_example("outbox_leader", serve_off)
    assert code == 1, out
    assert verdict(out, LEADER) == "VIOLATED"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL schema for the application, the queue and its outbox."""
    dsn = testpg.test_dsn()
    schema = f"{testpg.SCHEMA_PREFIX}{secrets.token_hex(6)}"
    yield testpg.with_schema(dsn, schema)
    asyncio.run(testpg.drop_schema(dsn, schema))


BUSINESS_TX = "events written in the business transaction"
ALL_PUBLISHED = "several publishers publish every event"
LATE_PUBLISH = "the paused publisher's late publish is refused"
LATE_ACK = "its late acknowledgement is refused (owner-checked)"


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("mode", ["monotonic", "off"], ids=["fenced", "control-fencing-off"])
def test_outbox_on_postgres_refuses_the_paused_publisher(
    tmp_path: Path, pg_url: str, mode: str
) -> None:
    for server in _serve(tmp_path, "--queue", pg_url, "--fence-mode", mode):
        code, out = run_example("outbox", server, "--dsn", pg_url)
    assert [verdict(out, c) for c in (BUSINESS_TX, ALL_PUBLISHED, LATE_ACK)] == ["OK"] * 3, out
    assert "then SIGSTOP" in out, out
    if mode == "monotonic":
        assert code == 0, out
        assert verdict(out, LATE_PUBLISH) == "OK"
        assert "STALE_TOKEN" in out and "LEASE_LOST" in out
    else:  # the control: without the token checked downstream, the late publish lands
        assert code == 1, out
        assert verdict(out, LATE_PUBLISH) == "VIOLATED"


CHECKLIST = [
    "concurrent workers never share a live claim",
    "a graceful shutdown starts no new work",
    "a crashed worker's job is claimed again after its lease",
    "the heartbeat stops work when the claim is lost",
    "failed jobs retry with backoff and end dead",
    "repeated delivery makes one effect per idempotency key",
    "timeouts stay under the lease",
]


@pytest.mark.slow
def test_worker_pool_checklist_holds_line_by_line(serve: Serve) -> None:
    code, out = run_example("worker_pool", serve)
    assert code == 0, out
    assert [verdict(out, line) for line in CHECKLIST] == ["OK"] * len(CHECKLIST)
    for shown in ("SIGKILL in the middle of crash-me", "SIGSTOP in the middle of pause-me",
                  "the handler stopped", "SIGTERM during shutdown-me"):  # fmt: skip
        assert shown in out, out


@pytest.mark.slow
def test_worker_pool_control_without_idempotency_keys_applies_an_effect_twice(
    serve: Serve,
) -> None:
    code, out = run_example("worker_pool", serve, "--no-idempotency-key")
    assert code == 1, out
    assert verdict(out, "repeated delivery makes one effect per idempotency key") == "VIOLATED"
