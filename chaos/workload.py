"""The chaos workload: client processes contending for resources through leases and a guard.

Run one client per process (``python -m chaos.workload --name c0 ...``); the harness
starts N of them for M resources. Each client loops, bounded by ``--duration`` (no
job starts after it, none runs on for more than 1.5 s past it) and ``--max-jobs``,
and every random choice comes from ``--seed`` (and its name). A job
picks a random resource; when it is held by someone else the client tries the next
one instead, so a resource left by a dead or cut-off holder soon finds a taker::

    hold(resource, ttl)                       acquire: ok (token, ttl_ms) / fail / info
      repeat for the job's duration:
        [lease.check()]                       before every step (--check step) or
                                              only before the first (--check job)
        read counter            -> n
        prepare "n+1" (unique value id), note it in the journal
        sleep (the work)                      the window a pause, delay or partition hits
        write counter = "n+1"   with the lease's token
        append an effect id to effect/log    read-modify-write with an idempotency key,
                                              retried on an unknown outcome
    release

``--workload counter`` is the classic lock-counter instead: each step reads
``counter`` (``"N#id1,...,idN"``: a count and the ids of the increments it holds),
sleeps, and writes ``"N+1#id1,...,idN,ID"`` with the lease's token, a fresh
increment id ``ID`` (recorded as ``extra["increment"]``, also the write's
idempotency key) in the same write; no effect log. The checker's rule 6 then
proves from the final value and the history that no acknowledged increment was
lost and no rejected one landed. A counter write of unknown outcome ends the job:
the next increment would build on a value that write may still overwrite when it
lands, a lost update under one token that no fence can tell apart; and in watch
mode a job whose grant the guard was not seen to know of (``fenced=0`` while
``--await-fence`` > 0) does no steps, since its reads could precede the fence.

``--workload jobs`` runs the lock-counter inside queue jobs: the client keeps the
queue ``chaos`` stocked (one job enqueued before each claim; each job fences its
own resource ``job/chaos/<id>``), claims one job at a time with the drawn TTL (no
heartbeats), and runs increments on the job's resource with the claim's token,
calling ``job.check()`` before each step, then completes it (recorded as a
``release``). A claim is recorded as an ``acquire`` of the job's resource once it
returned (the resource is not known before; in promise mode after the client's
own ``Fence`` of the claim returned, in watch mode once the guard's fence reached
its token). A worker paused past its claim is rescued by the next claim (rescues
come first): the rescuer's claim carries a higher token, and the paused worker's
prepared increment must then be refused.

``--workload many`` is the lock-counter on several leases at once: each job takes
:data:`MANY_AT_ONCE` of its resources (drawn, in sorted order) with the SDK's
``hold_many`` (one call, all or none; the session renews them), records each grant
as its own ``acquire`` (in promise mode after the client's own ``Fence`` of it, in
watch mode once the guard's fence reached its token), then runs increments on the
leases in turn, each write fenced by its own lease's token, until the job's time is
up, and releases them all on leaving the block. A lease lost meanwhile drops out of
the rotation; the others go on.

``--workload elect`` campaigns in the election named by each resource
(:mod:`fencing.election`, the client's name proclaimed); once elected (the term
promised to the guard, so the grant is recorded as an ``acquire`` whose token is the
term, in every mode) the leader runs lock-counter increments fenced by its term
until the job's time is up, then resigns (a ``release``). At most one leader per
term is the checker's ``duplicate-token`` rule, terms growing its ``token-order``,
a deposed leader's writes refused its ``stale-write-accepted``.

What a client does *not* do is the point: it never re-checks its lease between
preparing a write and sending it, and with ``--check job`` never between steps,
so a job that outlives its lease (a pause, a partition, a lease-server outage,
a skewed clock) keeps writing with its old token. The harness tests the guard,
the safety net, not the client's courtesy. A ``STALE_TOKEN`` (or, in strict mode,
``LEASE_LOST``) from the guard ends the job: the guard told it to stop.

Crash recovery: before a write is sent it is noted in the client's journal
(``--journal-dir``) and the note is removed once the outcome is known. A client
started again after a SIGKILL (``--incarnation`` > 0) first re-sends whatever the
journal holds with the token and idempotency key it was prepared under, as an
outbox would; the guard must reject it if a newer holder has written since, and
deduplicate it if it had landed.

Recording (see :mod:`chaos.history`): every call is an ``invoke`` then ``ok``,
``fail`` (the server refused it as a whole) or ``info`` (timeout, unavailable:
unknown outcome). An acquire's ``ok`` carries the token and ``ttl_ms``. It is
recorded when the grant starts to fence older tokens at the guard, as the checker's
rule 3b assumes: in ``promise`` mode after the promise (``Fence``) returned (the
SDK's ``hold(..., fence=[guard])``); in ``watch`` mode after the client saw the
guard's fence reach its token (``DescribeFence``, polled for at most
``--await-fence`` seconds; if it never does, the acquire is recorded with
``fenced=0`` and the checker does not count it as a barrier). A lease the SDK
reports lost is recorded with :meth:`~chaos.history.Recorder.lost`. Reads record
the value and ``written_by_token``. The harness records the final reads
(:func:`record_final_reads`) after every client has stopped.

Clock skew: the SDK's monotonic clock is a :class:`SkewedClock`. SIGUSR1 switches
to ``--skew-rate`` and jumps by ``--skew-offset`` seconds; SIGUSR2 switches back to
rate 1 (without jumping back). SIGTERM ends the loop after the current step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import Any, Final

import grpc

from chaos.checker import parse_increments
from chaos.history import ExtraValue, HistoryWriter, Recorder
from fencing import (
    Claim,
    Election,
    FencingError,
    GuardClient,
    InvalidArgumentError,
    Job,
    Lease,
    LeaseClient,
    LeaseHeldError,
    LeaseLost,
    PermissionDeniedError,
    Put,
    QueueClient,
    ResourceExhaustedError,
    StaleTokenError,
    UnauthenticatedError,
)
from fencing.client import JobInfo
from fencing.limits import MAX_MESSAGE_BYTES
from fencing.types import Fenced

COUNTER_KEY: Final = "counter"
"""The key every step reads, increments and writes back."""

WORKLOADS: Final = ("effects", "counter", "jobs", "many", "elect")
"""``--workload`` choices: the counter and effect log (default), the lock-counter, the
lock-counter inside queue jobs, on several leases held at once, or by elected leaders."""

MANY_AT_ONCE: Final = 2
"""How many resources one ``many`` job holds with one ``hold_many``."""

JOB_QUEUE: Final = "chaos"
"""The queue the ``jobs`` workload enqueues to and claims from."""
PERIODIC_SCHEDULE: Final = "soak"
"""The periodic schedule a soak keeps on :data:`JOB_QUEUE` (its jobs are claimed and run
by the queue workers like any other)."""
PERIODIC_EVERY_S: Final = 5
"""Its period, seconds (periods aligned to the Unix epoch on every lease server)."""


EFFECT_KEY: Final = "effect/log"
"""Comma-separated idempotency keys, one appended per step (see the checker's rule 5)."""

MAX_STEPS_PER_JOB: Final = 1000
"""Hard bound on steps in one job, whatever the job's duration."""

JOB_OVERRUN_S: Final = 1.5
"""A job ends at most this long after ``--duration`` is over, however long it was drawn."""

CHANNEL_OPTIONS: Final = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Reconnect quickly after a restart: the default backoff (1 s, growing to 120 s)
    # would make a restarted server look down for seconds after it is back.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


# -- the clock -----------------------------------------------------------------------


class SkewedClock:
    """A monotonic clock whose rate and offset can change at run time.

    ``clock()`` is ``local0 + (base() - base0) * rate``; :meth:`set` re-anchors at
    the current local time, then adds ``offset`` (a jump, which may go backwards:
    a broken clock is exactly what the harness wants to show is harmless). State
    is one tuple swapped atomically, so a signal handler can call :meth:`set` while
    another thread reads the clock, without locks.
    """

    def __init__(self, base: Callable[[], float] = time.monotonic) -> None:
        self._base = base
        now = base()
        self._state: tuple[float, float, float] = (now, now, 1.0)  # base0, local0, rate

    def __call__(self) -> float:
        base0, local0, rate = self._state
        return local0 + (self._base() - base0) * rate

    @property
    def rate(self) -> float:
        return self._state[2]

    def set(self, rate: float, offset: float = 0.0) -> None:
        """From now on run at ``rate`` (1 = real time), after jumping by ``offset`` s."""
        if rate < 0:
            raise ValueError("a clock rate must be >= 0")
        local = self()
        self._state = (self._base(), local + offset, rate)


# -- configuration --------------------------------------------------------------------------


def _range(text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition(":")
    low = float(lo)
    high = float(hi) if sep else low
    if low < 0 or high < low:
        raise argparse.ArgumentTypeError(f"expected LOW:HIGH with 0 <= LOW <= HIGH, got {text!r}")
    return low, high


@dataclass(frozen=True, slots=True)
class Profile:
    """How clients behave: times in milliseconds as (low, high) uniform ranges.

    ``check``: ``step`` calls ``lease.check()`` before every step, ``job`` only
    before the first. ``guard_timeout_s``/``lease_timeout_s``: per-call deadlines.
    """

    ttl_ms: tuple[float, float] = (800, 1200)
    job_ms: tuple[float, float] = (100, 600)
    step_ms: tuple[float, float] = (40, 200)
    idle_ms: tuple[float, float] = (0, 80)
    check: str = "step"
    acquire_timeout_s: float = 0.4
    lease_timeout_s: float = 1.0
    guard_timeout_s: float = 1.0
    effect_retries: int = 3

    def argv(self) -> list[str]:
        """This profile as :func:`parser` flags."""

        def rng(r: tuple[float, float]) -> str:
            return f"{r[0]:g}:{r[1]:g}"

        return [
            "--ttl-ms",
            rng(self.ttl_ms),
            "--job-ms",
            rng(self.job_ms),
            "--step-ms",
            rng(self.step_ms),
            "--idle-ms",
            rng(self.idle_ms),
            "--check",
            self.check,
            "--acquire-timeout",
            f"{self.acquire_timeout_s:g}",
            "--lease-timeout",
            f"{self.lease_timeout_s:g}",
            "--guard-timeout",
            f"{self.guard_timeout_s:g}",
            "--effect-retries",
            str(self.effect_retries),
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaos.workload",
        description="One chaos workload client (started by the harness).",
    )
    p.add_argument("--name", required=True, help="client name, unique in the run")
    p.add_argument("--lease", required=True, help="lease server host:port")
    p.add_argument("--guard", required=True, help="guard host:port")
    p.add_argument("--history-dir", type=Path, required=True)
    p.add_argument("--journal-dir", type=Path, required=True)
    p.add_argument("--resources", required=True, help="comma-separated resource names")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--duration", type=float, required=True, help="seconds to start jobs for")
    p.add_argument("--max-jobs", type=int, default=10_000)
    p.add_argument("--incarnation", type=int, default=0, help="restarts so far (harness)")
    p.add_argument(
        "--fence-mode",
        choices=["monotonic", "promise", "watch", "strict"],
        default="monotonic",
        help="the mode under test: promise holds with fence=[guard]; watch waits for the "
        "guard's fence to reach a new token before recording the acquire",
    )
    p.add_argument("--await-fence", type=float, default=1.0, help="watch mode: seconds")
    p.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="effects",
        help="effects: counter + effect log (default); counter: the lock-counter, each "
        "write carrying the increment ids it read plus its own; jobs: the lock-counter "
        "inside queue jobs, fenced by their claims",
    )
    p.add_argument(
        "--epoch-s",
        type=float,
        default=0.0,
        help="rename the resources every this many seconds (see in_epoch); 0: never",
    )
    p.add_argument("--skew-rate", type=float, default=1.0, help="clock rate on SIGUSR1")
    p.add_argument("--skew-offset", type=float, default=0.0, help="clock jump (s) on SIGUSR1")
    defaults = Profile()
    p.add_argument("--ttl-ms", type=_range, default=defaults.ttl_ms)
    p.add_argument("--job-ms", type=_range, default=defaults.job_ms)
    p.add_argument("--step-ms", type=_range, default=defaults.step_ms)
    p.add_argument("--idle-ms", type=_range, default=defaults.idle_ms)
    p.add_argument("--check", choices=["step", "job"], default=defaults.check)
    p.add_argument("--acquire-timeout", type=float, default=defaults.acquire_timeout_s)
    p.add_argument("--lease-timeout", type=float, default=defaults.lease_timeout_s)
    p.add_argument("--guard-timeout", type=float, default=defaults.guard_timeout_s)
    p.add_argument("--effect-retries", type=int, default=defaults.effect_retries)
    return p


def process_name(name: str, incarnation: int) -> str:
    """The history's process name (and lease holder) of a client's incarnation."""
    return name if incarnation == 0 else f"{name}~{incarnation}"


def client_of(holder: str) -> str:
    """The client name behind a holder or process name (inverse of :func:`process_name`)."""
    return holder.split("~", 1)[0]


# -- the journal (crash recovery) ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Intent:
    """A write prepared under a token, noted before it is sent."""

    resource: str
    token: int
    key: str
    value: str
    idempotency_key: str | None = None
    increment: str | None = None


class Journal:
    """One client's pending write, in ``DIR/NAME.json`` while it is outstanding.

    The file exists exactly while a write is prepared but its outcome is not yet
    known, which is what the harness looks for to kill a client mid-write.
    """

    def __init__(self, directory: Path, name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{name}.json"

    def note(self, intent: Intent) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(intent)), encoding="utf-8")
        os.replace(tmp, self.path)

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def pending(self) -> Intent | None:
        return pending_intent(self.path.parent, self.path.stem)


def pending_write(journal_dir: Path, name: str) -> bool:
    """True while client ``name`` has a write prepared and not yet answered."""
    return (journal_dir / f"{name}.json").exists()


def pending_intent(journal_dir: Path, name: str) -> Intent | None:
    """The write client ``name`` has prepared and not yet seen answered, or None."""
    try:
        raw = json.loads((journal_dir / f"{name}.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return Intent(**raw)


# -- the client -------------------------------------------------------------------------------


class Outcome(Enum):
    OK = "ok"
    UNKNOWN = "info"
    REFUSED = "fail"
    STOP = "stop"  # the guard said this token may no longer write


def _reason(exc: BaseException) -> str:
    if isinstance(exc, FencingError):
        return exc.reason
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        return code.name if code is not None else "RPC_ERROR"
    return type(exc).__name__


REFUSALS: Final = (
    StaleTokenError,
    LeaseLost,
    LeaseHeldError,
    InvalidArgumentError,
    UnauthenticatedError,
    PermissionDeniedError,
    ResourceExhaustedError,
)
"""Errors by which the server refused a request as a whole: it certainly had no effect."""


def _unknown(exc: BaseException) -> bool:
    """Whether a request may or may not have taken effect after ``exc``.

    Only a server's explicit refusal (:data:`REFUSALS`) is a ``fail``; everything
    else (unavailable, a deadline, a reset connection, a closed channel, an error
    this list does not know) is recorded ``info``, since the checker trusts a
    ``fail`` to have had no effect.
    """
    return not isinstance(exc, REFUSALS)


def parse_counter(value: str | None) -> int:
    """The number in a counter value ``"N#who"`` (0 when absent or unreadable)."""
    if not value:
        return 0
    head = value.split("#", 1)[0]
    return int(head) if head.isdigit() else 0


class Client:
    """One workload client process: the loop described in the module docstring."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name: str = args.name
        self.process = process_name(args.name, args.incarnation)
        self.resources = [r for r in args.resources.split(",") if r]
        self.rng = random.Random(f"{args.seed}:{args.name}:{args.incarnation}")
        self.clock = SkewedClock()
        args.history_dir.mkdir(parents=True, exist_ok=True)
        self.writer = HistoryWriter(args.history_dir / f"{self.process}.jsonl")
        self.rec = Recorder(self.writer.write, self.process)
        self.journal = Journal(args.journal_dir, args.name)
        self.stopping = False
        self.seq = 0
        self.jobs_end = float("inf")
        self._lease_channel = grpc.insecure_channel(args.lease, CHANNEL_OPTIONS)
        self._guard_channel = grpc.insecure_channel(args.guard, CHANNEL_OPTIONS)
        self.leases = LeaseClient(
            args.lease,
            holder=self.process,
            rpc_timeout=args.lease_timeout,
            clock=self.clock,
            channel=self._lease_channel,
        )
        self.guard = GuardClient(
            args.guard, rpc_timeout=args.guard_timeout, channel=self._guard_channel
        )

    def close(self) -> None:
        self.leases.close()
        self.guard.close()
        self.writer.close()

    # -- signals --

    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGUSR1, self._on_skew)
        signal.signal(signal.SIGUSR2, self._on_unskew)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _on_skew(self, signum: int, frame: FrameType | None) -> None:
        self.clock.set(self.args.skew_rate, self.args.skew_offset)

    def _on_unskew(self, signum: int, frame: FrameType | None) -> None:
        self.clock.set(1.0)

    # -- the loop --

    def run(self) -> None:
        if self.args.workload == "jobs":
            self.run_jobs()
            return
        if self.args.workload == "many":
            self.run_many()
            return
        if self.args.workload == "elect":
            self.run_many(self.lead, 1)
            return
        self.replay()
        deadline = time.monotonic() + self.args.duration
        # No job runs on for long after the last one may start (bounded in time).
        self.jobs_end = deadline + JOB_OVERRUN_S
        jobs = 0
        resource = self.rng.choice(self.resources)
        while not self.stopping and jobs < self.args.max_jobs and time.monotonic() < deadline:
            if self.job(in_epoch(resource, self.args.epoch_s)):
                resource = self.rng.choice(self.resources)
            else:
                # Held by someone else: look for work elsewhere, so a resource whose
                # holder is gone never waits long for a taker, whatever the seed.
                i = self.resources.index(resource)
                resource = self.resources[(i + 1) % len(self.resources)]
            jobs += 1
            self._sleep_ms(self.args.idle_ms)

    def run_jobs(self) -> None:
        """The ``jobs`` workload: enqueue one, claim one (a rescue first), run it."""
        self.replay()
        deadline = time.monotonic() + self.args.duration
        self.jobs_end = deadline + JOB_OVERRUN_S
        runs = 0
        with QueueClient(
            self.args.lease,
            worker=self.process,
            rpc_timeout=self.args.lease_timeout,
            channel=self._lease_channel,
        ) as queue:
            while not self.stopping and runs < self.args.max_jobs and time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    queue.enqueue(JOB_QUEUE, b"", idempotency_key=f"{self.process}/j{runs}")
                self.claim_and_run(queue)
                runs += 1
                self._sleep_ms(self.args.idle_ms)

    def run_many(
        self, job: Callable[[list[str]], bool] | None = None, at_once: int = MANY_AT_ONCE
    ) -> None:
        """The ``many`` (and ``elect``) workload: each job on ``at_once`` drawn resources."""
        self.replay()
        deadline = time.monotonic() + self.args.duration
        self.jobs_end = deadline + JOB_OVERRUN_S
        jobs = 0
        k = min(at_once, len(self.resources))
        while not self.stopping and jobs < self.args.max_jobs and time.monotonic() < deadline:
            drawn = self.rng.sample(self.resources, k)
            (job or self.many_job)(sorted(in_epoch(r, self.args.epoch_s) for r in drawn))
            jobs += 1
            self._sleep_ms(self.args.idle_ms)

    def lead(self, names: list[str]) -> bool:
        """Campaign in the election ``names[0]``; once elected, increments fenced by the
        term, then resign. False if not elected."""
        name = names[0]
        ttl_s = self.rng.uniform(*self.args.ttl_ms) / 1000
        job_s = self.rng.uniform(*self.args.job_ms) / 1000
        election = Election(self.leases, self.guard, name, ttl=ttl_s)
        op = self.rec.invoke("acquire", name, ttl_ms=round(ttl_s * 1000), election=1)
        try:
            leader = election.campaign(self.process, timeout=self.args.acquire_timeout)
        except LeaseHeldError as exc:
            self.rec.complete(op, "fail", error=exc.reason)
            return False
        except Exception as exc:  # a term may have been granted: unknown
            self.rec.complete(op, "info", error=_reason(exc))
            time.sleep(0.05)
            return False
        self.rec.complete(op, "ok", token=leader.term, ttl_ms=leader.lease.ttl_ms)
        leader.lease.on_lost(self._on_lost)
        with contextlib.suppress(LeaseLost), leader:
            try:
                end = min(time.monotonic() + job_s, self.jobs_end)
                for _ in range(MAX_STEPS_PER_JOB):
                    if self.stopping:
                        break
                    try:
                        leader.check()
                    except LeaseLost:
                        break  # deposed: recorded by the on_lost callback
                    if self.increment(leader) is Outcome.STOP or time.monotonic() >= end:
                        break
            finally:
                self.release(leader.lease)  # resign
        return True

    def many_job(self, resources: list[str]) -> bool:
        """One job on every resource in ``resources`` at once; False if not acquired."""
        ttl_s = self.rng.uniform(*self.args.ttl_ms) / 1000
        job_s = self.rng.uniform(*self.args.job_ms) / 1000
        ops = {r: self.rec.invoke("acquire", r, ttl_ms=round(ttl_s * 1000)) for r in resources}
        acquired = False
        try:
            with self.leases.hold_many(
                resources, ttl_s, timeout=self.args.acquire_timeout
            ) as leases:
                acquired = True
                ready: list[Lease] = []
                for lease in leases:
                    if self.fence_grant(lease, ops[lease.resource]):
                        ready.append(lease)
                try:
                    self.work_many(ready, job_s)
                finally:
                    for lease in leases:
                        self.release(lease)
        except LeaseLost:
            pass  # recorded by the on_lost callbacks, or our own release
        except LeaseHeldError as exc:
            if acquired:
                raise
            for op in ops.values():
                self.rec.complete(op, "fail", error=exc.reason)
        except Exception as exc:
            if acquired:
                raise
            for op in ops.values():  # a grant may have happened: unknown
                self.rec.complete(op, "info", error=_reason(exc))
            time.sleep(0.05)
        return acquired

    def fence_grant(self, lease: Lease, op: str) -> bool:
        """Record ``lease``'s grant once it fences older tokens at the guard (promise:
        after our own ``Fence``; watch: once the guard's fence reached it); True if the
        job may write with it."""
        if self.args.fence_mode == "promise":
            try:
                self.guard.fence(lease)
            except Exception as exc:
                self.rec.complete(op, "info", error=_reason(exc))
                return False
        fenced = True
        if self.args.fence_mode == "watch":
            fenced = self.await_fence(lease)
            self.rec.complete(op, "ok", token=lease.token, ttl_ms=lease.ttl_ms, fenced=int(fenced))
        else:
            self.rec.complete(op, "ok", token=lease.token, ttl_ms=lease.ttl_ms)
        lease.on_lost(self._on_lost)
        return fenced or not self.args.await_fence

    def work_many(self, leases: list[Lease], job_s: float) -> None:
        """Increments on each lease in turn; a lease lost or refused leaves the rotation."""
        end = min(time.monotonic() + job_s, self.jobs_end)
        live = list(leases)
        checked: set[str] = set()
        for _ in range(MAX_STEPS_PER_JOB):
            if self.stopping or not live:
                return
            for lease in list(live):
                if self.args.check == "step" or lease.resource not in checked:
                    checked.add(lease.resource)
                    try:
                        lease.check()
                    except LeaseLost:
                        live.remove(lease)  # recorded by the on_lost callback
                        continue
                if self.increment(lease) is Outcome.STOP:
                    live.remove(lease)
            if time.monotonic() >= end:
                return

    def claim_and_run(self, queue: QueueClient) -> None:
        ttl_s = self.rng.uniform(*self.args.ttl_ms) / 1000
        job_s = self.rng.uniform(*self.args.job_ms) / 1000
        try:
            claimed = queue.claim(JOB_QUEUE, ttl=ttl_s, wait=self.args.acquire_timeout)
        except Exception:
            time.sleep(0.05)
            return
        if not claimed:
            return
        job = claimed[0]
        # Recorded once the claim returned: its resource is only known then.
        op = self.rec.invoke("acquire", job.resource, ttl_ms=job.ttl_ms, job=job.id)
        fenced = True
        if self.args.fence_mode == "promise":
            try:
                self.guard.fence(job)
            except Exception as exc:
                self.rec.complete(op, "info", error=_reason(exc))
                with contextlib.suppress(Exception):
                    queue.release(job)
                return
        if self.args.fence_mode == "watch":
            fenced = self.await_fence(job)
            self.rec.complete(op, "ok", token=job.token, ttl_ms=job.ttl_ms, fenced=int(fenced))
        else:
            self.rec.complete(op, "ok", token=job.token, ttl_ms=job.ttl_ms)
        if fenced or not self.args.await_fence:
            self.work_job(job, job_s)
        if job.lost.is_set():
            return  # recorded as lost; a rescuer owns it now
        done = self.rec.invoke("release", job.resource, token=job.token, job=job.id)
        try:
            queue.complete(job)
        except Exception as exc:
            self.rec.complete(done, "info" if _unknown(exc) else "fail", error=_reason(exc))
        else:
            self.rec.complete(done, "ok")

    def work_job(self, job: Job, job_s: float) -> None:
        end = min(time.monotonic() + job_s, self.jobs_end)
        for _ in range(MAX_STEPS_PER_JOB):
            if self.stopping:
                return
            try:
                job.check()
            except LeaseLost:
                self.rec.lost(job.resource, job.token)
                return
            if self.increment(job) is Outcome.STOP or time.monotonic() >= end:
                return

    def _sleep_ms(self, bounds: tuple[float, float]) -> None:
        time.sleep(self.rng.uniform(*bounds) / 1000)

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def replay(self) -> None:
        """Re-send the write a previous incarnation prepared and never saw answered."""
        intent = self.journal.pending()
        if intent is None:
            return
        self.write(Claim(intent.resource, intent.token), intent, replay=1)
        self.journal.clear()

    def job(self, resource: str) -> bool:
        """One job on ``resource``; False if the lease was not acquired."""
        ttl_s = self.rng.uniform(*self.args.ttl_ms) / 1000
        job_s = self.rng.uniform(*self.args.job_ms) / 1000
        op = self.rec.invoke("acquire", resource, ttl_ms=round(ttl_s * 1000))
        acquired = False
        promise = self.args.fence_mode == "promise"
        hold_kw: dict[str, Any] = {"fence": [self.guard]} if promise else {}
        try:
            with self.leases.hold(
                resource, ttl_s, timeout=self.args.acquire_timeout, **hold_kw
            ) as lease:
                acquired = True
                fenced = True
                if self.args.fence_mode == "watch":
                    fenced = self.await_fence(lease)
                    self.rec.complete(
                        op, "ok", token=lease.token, ttl_ms=lease.ttl_ms, fenced=int(fenced)
                    )
                else:
                    self.rec.complete(op, "ok", token=lease.token, ttl_ms=lease.ttl_ms)
                lease.on_lost(self._on_lost)
                skip = self.args.workload == "counter" and not fenced and self.args.await_fence
                try:
                    if not skip:
                        self.work(lease, job_s)
                finally:
                    self.release(lease)
        except LeaseLost:
            if not acquired:  # pragma: no cover - acquire never raises LeaseLost
                self.rec.complete(op, "info", error="LEASE_LOST")
            # Otherwise hold() reports the loss we already recorded, or our own release.
        except LeaseHeldError as exc:
            if acquired:
                raise
            self.rec.complete(op, "fail", error=exc.reason)
        except Exception as exc:
            if acquired:
                raise
            # Unavailable, deadline, or a promise that failed after the grant (the SDK
            # then released the lease): a token may have been granted, so unknown.
            self.rec.complete(op, "info", error=_reason(exc))
            time.sleep(0.05)
        return acquired

    def await_fence(self, lease: Fenced) -> bool:
        """Watch mode: wait (bounded) until the guard's fence for the resource reached
        the lease's token, i.e. the guard learnt of the grant from the lease server."""
        end = time.monotonic() + self.args.await_fence
        while True:
            with contextlib.suppress(Exception):
                if self.guard.describe_fence(lease.resource) >= lease.token:
                    return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.002)

    def _on_lost(self, lease: Lease) -> None:
        self.rec.lost(lease.resource, lease.token)

    def release(self, lease: Lease) -> None:
        if lease.lost.is_set():
            return  # already recorded as lost; nothing is sent
        op = self.rec.invoke("release", lease.resource, token=lease.token)
        try:
            lease.release()
        except LeaseLost as exc:
            self.rec.complete(op, "fail", error=exc.reason)
        except Exception as exc:
            self.rec.complete(op, "info" if _unknown(exc) else "fail", error=_reason(exc))
        else:
            self.rec.complete(op, "ok")

    def work(self, lease: Lease, job_s: float) -> None:
        end = min(time.monotonic() + job_s, self.jobs_end)
        for step in range(MAX_STEPS_PER_JOB):
            if self.stopping:
                return
            if self.args.check == "step" or step == 0:
                try:
                    lease.check()
                except LeaseLost:
                    return  # recorded by the on_lost callback
            if self.step(lease) is Outcome.STOP:
                return
            if time.monotonic() >= end:
                return

    def step(self, lease: Lease) -> Outcome:
        if self.args.workload == "counter":
            return self.increment(lease)
        resource = lease.resource
        found, current = self.read(resource, COUNTER_KEY)
        if not found:
            self._sleep_ms(self.args.step_ms)  # keep the pace; the guard may be back soon
            return Outcome.UNKNOWN
        n = self._next()
        intent = Intent(
            resource, lease.token, COUNTER_KEY, f"{parse_counter(current) + 1}#{self.process}/{n}"
        )
        self.journal.note(intent)
        self._sleep_ms(self.args.step_ms)  # the work: a pause here makes the write stale
        outcome = self.write(lease, intent)
        self.journal.clear()
        if outcome is Outcome.STOP:
            return outcome
        return self.append_effect(lease, f"{self.process}/e{n}")

    def increment(self, lease: Fenced) -> Outcome:
        """One lock-counter step: read, work, write count+1 with the ids read plus a new one."""
        found, current = self.read(lease.resource, COUNTER_KEY)
        if not found:
            self._sleep_ms(self.args.step_ms)
            return Outcome.UNKNOWN
        parsed = parse_increments(current)
        if parsed is None:
            return Outcome.STOP  # not a lock-counter value: nothing to build on
        count, ids = parsed
        inc = f"{self.process}/i{self._next()}"
        value = f"{count + 1}#{','.join([*ids, inc])}"
        intent = Intent(lease.resource, lease.token, COUNTER_KEY, value, inc, increment=inc)
        self.journal.note(intent)
        self._sleep_ms(self.args.step_ms)  # the work: a pause here makes the write stale
        outcome = self.write(lease, intent)
        self.journal.clear()
        return Outcome.STOP if outcome is Outcome.UNKNOWN else outcome

    def append_effect(self, lease: Lease, effect_id: str) -> Outcome:
        """Append ``effect_id`` to the effect log at most once, retrying unknown outcomes."""
        outcome = Outcome.UNKNOWN
        for attempt in range(max(1, self.args.effect_retries)):
            if attempt:
                time.sleep(0.05 * attempt)
            found, current = self.read(lease.resource, EFFECT_KEY)
            if not found:
                continue
            items = [x for x in (current or "").split(",") if x]
            # A retry appends again even if the first attempt landed: the guard must
            # recognise the idempotency key and apply nothing (G6).
            value = ",".join([*items, effect_id])
            intent = Intent(lease.resource, lease.token, EFFECT_KEY, value, effect_id)
            self.journal.note(intent)
            outcome = self.write(lease, intent)
            self.journal.clear()
            if outcome is not Outcome.UNKNOWN:
                return outcome
        return outcome

    def read(self, resource: str, key: str) -> tuple[bool, str | None]:
        """(outcome known, value or None if absent); recorded."""
        op = self.rec.invoke("read", resource, key=key)
        try:
            record = self.guard.read(resource, key)
        except Exception as exc:
            self.rec.complete(op, "info" if _unknown(exc) else "fail", error=_reason(exc))
            return False, None
        if record is None:
            self.rec.complete(op, "ok", value=None)
            return True, None
        value = record.value.decode()
        self.rec.complete(op, "ok", value=value, written_by_token=record.written_by_token)
        return True, value

    def write(self, fenced: Fenced, intent: Intent, **extra: ExtraValue) -> Outcome:
        if intent.increment is not None:
            extra["increment"] = intent.increment
        op = self.rec.invoke(
            "write",
            intent.resource,
            token=intent.token,
            key=intent.key,
            value=intent.value,
            idempotency_key=intent.idempotency_key,
            **extra,
        )
        try:
            result = self.guard.write(
                fenced,
                Put(intent.key, intent.value.encode()),
                idempotency_key=intent.idempotency_key or "",
            )
        except (StaleTokenError, LeaseLost) as exc:
            self.rec.complete(op, "fail", error=exc.reason)
            return Outcome.STOP
        except Exception as exc:
            if _unknown(exc):
                self.rec.complete(op, "info", error=_reason(exc))
                return Outcome.UNKNOWN
            self.rec.complete(op, "fail", error=_reason(exc))
            return Outcome.REFUSED
        self.rec.complete(op, "ok", fence=result.fence, replayed=int(result.replayed))
        return Outcome.OK


# -- final reads (the harness) ---------------------------------------------------------------


def record_final_reads(
    guard_target: str,
    resources: Sequence[str],
    history_dir: Path,
    *,
    keys: Sequence[str] = (COUNTER_KEY, EFFECT_KEY),
    attempts: int = 20,
    timeout: float = 2.0,
) -> int:
    """Read every key of every resource once, after all clients stopped (``final=1``).

    Each read is retried (bounded) until its outcome is known; returns how many
    reads succeeded. Recorded as process ``final`` in ``history_dir/final.jsonl``.
    """
    done = 0
    with (
        HistoryWriter(history_dir / "final.jsonl") as writer,
        GuardClient(guard_target, rpc_timeout=timeout) as guard,
    ):
        rec = Recorder(writer.write, "final")
        for resource in resources:
            for key in keys:
                for attempt in range(attempts):
                    op = rec.invoke("read", resource, key=key, final=1)
                    try:
                        record = guard.read(resource, key)
                    except Exception as exc:
                        rec.complete(op, "info", error=_reason(exc))
                        time.sleep(min(0.1 * (attempt + 1), 0.5))
                        continue
                    if record is None:
                        rec.complete(op, "ok", value=None)
                    else:
                        rec.complete(
                            op,
                            "ok",
                            value=record.value.decode(),
                            written_by_token=record.written_by_token,
                        )
                    done += 1
                    break
    return done


def in_epoch(resource: str, epoch_s: float, now: float | None = None) -> str:
    """``resource`` as it is named in the current epoch of ``epoch_s`` seconds (by the
    host's wall clock, which every process of a run shares): ``r0`` -> ``r0.e5938123``.

    A soak rotates its resources so that no value grows for the whole run: the
    lock-counter's value lists every increment so far, and every read records it, so a
    resource kept for an hour makes the history grow with the square of the run's length.
    Each epoch starts fresh counters on new names (the checker judges each name alone).
    ``epoch_s`` 0 keeps the names as they are."""
    if epoch_s <= 0:
        return resource
    return f"{resource}.e{int((time.time() if now is None else now) // epoch_s)}"


EPOCH_SUFFIX: Final = re.compile(r"\.e(\d+)$")
"""How :func:`in_epoch` marks a name's epoch."""


def epoch_of(resource: str) -> int | None:
    """The epoch :func:`in_epoch` named ``resource`` in (None: a name that does not rotate)."""
    found = EPOCH_SUFFIX.search(resource)
    return int(found.group(1)) if found else None


def epoch_part(resource: str) -> str:
    """The part of a soak's history ``resource`` belongs to when it is judged in parts
    (:func:`chaos.history.split_history`): ``e<N>`` for a name of epoch N, ``rest`` for
    the names that never rotate (jobs, schedules)."""
    epoch = epoch_of(resource)
    return "rest" if epoch is None else f"e{epoch}"


DRAIN_S: Final = 60.0
"""How long the end of a soak waits for the queue to have nothing left to do: claims of
killed workers expire (their TTL) and are rescued, the reaper buries what has no
attempts left."""

UNFINISHED: Final = ("ready", "running", "waiting")
"""Job states with work still to do."""


def list_all_jobs(client: QueueClient, queue: str, attempts: int = 20) -> list[JobInfo]:
    """Every job of ``queue``, read whole: the listing is retried from its first page
    (bounded, ``attempts`` times) while the servers recover from the run's faults; the
    last failure is raised."""
    for attempt in range(attempts):
        try:
            return list(client.list_jobs(queue, page_size=1000))
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(min(0.1 * (attempt + 1), 0.5))
    raise ValueError(f"attempts must be at least 1, not {attempts}")


def drain_and_record_jobs(
    lease_target: str,
    history_dir: Path,
    *,
    queue: str = JOB_QUEUE,
    drain_s: float = DRAIN_S,
    drain: bool = True,
    timeout: float = 2.0,
) -> tuple[int, int]:
    """After all clients stopped: do every job still to do, then list every job.

    A worker of its own (process ``final``, no faults) claims what is ready and rescues
    what killed workers left running, completing each (recorded as any worker's claim
    and completion, so rule 7 judges them too), until no job is ready, running or
    waiting (at most ``drain_s``). Then every job of ``queue`` is recorded as a ``job``
    operation on its resource, its value the state, with its attempts (checker rule
    9: a job is done at least once). ``drain=False`` skips the drain: the control
    that shows rule 9 failing a run whose workers stopped mid-queue. Returns (jobs
    completed by the drain, jobs listed); a listing that keeps failing raises."""
    completed = 0
    with (
        HistoryWriter(history_dir / "jobs.jsonl") as writer,
        QueueClient(lease_target, worker="final", rpc_timeout=timeout) as client,
    ):
        rec = Recorder(writer.write, "final")
        deadline = time.monotonic() + drain_s
        while drain and time.monotonic() < deadline:
            try:
                claimed = client.claim(queue, batch=100, ttl=30.0, wait=0.5)
                left = claimed or any(
                    next(iter(client.list_jobs(queue, state=state, page_size=1)), None)
                    for state in UNFINISHED
                )
            except Exception:
                time.sleep(0.2)
                continue
            for job in claimed:
                op = rec.invoke("acquire", job.resource, ttl_ms=job.ttl_ms, job=job.id)
                rec.complete(op, "ok", token=job.token, ttl_ms=job.ttl_ms)
                done = rec.invoke("release", job.resource, token=job.token, job=job.id)
                try:
                    client.complete(job)
                except Exception as exc:
                    rec.complete(done, "info" if _unknown(exc) else "fail", error=_reason(exc))
                else:
                    rec.complete(done, "ok")
                    completed += 1
            if not left:
                break
        jobs = list_all_jobs(client, queue)
        for info in jobs:
            # As listed: the state is known when the operation is recorded (rule 8's way).
            op = rec.invoke(
                "job",
                info.resource or f"job/{info.queue}/{info.id}",
                value=info.state,
                job=info.id,
                attempts=info.attempts,
                max_attempts=info.max_attempts,
                final=1,
            )
            rec.complete(op, "ok")
    return completed, len(jobs)


def record_periodic_jobs(
    lease_target: str,
    history_dir: Path,
    *,
    queue: str = JOB_QUEUE,
    schedule: str = PERIODIC_SCHEDULE,
    every_s: int = PERIODIC_EVERY_S,
    attempts: int = 20,
    timeout: float = 2.0,
) -> int:
    """List the jobs ``schedule`` enqueued into ``queue``, after all clients stopped: one
    ``periodic`` operation per job on ``periodic/<schedule>``, its value the start of the
    job's period in ms (from its idempotency key, ``periodic:<schedule>:<ms>``), in
    ``history_dir/periodic.jsonl`` (process ``final``). The listing is retried (bounded)
    until it is read whole; returns how many jobs it recorded."""
    prefix = f"periodic:{schedule}:"
    with QueueClient(lease_target, rpc_timeout=timeout) as client:
        jobs = [
            j
            for j in list_all_jobs(client, queue, attempts)
            if j.idempotency_key.startswith(prefix)
        ]
    with HistoryWriter(history_dir / "periodic.jsonl") as writer:
        rec = Recorder(writer.write, "final")
        for job in jobs:
            op = rec.invoke(
                "periodic",
                f"periodic/{schedule}",
                value=job.idempotency_key[len(prefix) :],
                job=job.id,
                every_ms=every_s * 1000,
                final=1,
            )
            rec.complete(op, "ok", state=job.state)
    return len(jobs)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    client = Client(args)
    client.install_signals()
    try:
        client.run()
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
