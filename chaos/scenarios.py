"""Scenarios: a topology, a client profile and a seeded fault schedule, run with their control.

A scenario names one way the world goes wrong for a lease holder. :func:`run_scenario`
runs it twice on fresh servers: the *fenced* run (the guard in the mode under test)
and the *control* (the same workload and schedule, the guard's fencing ``off``).
Both histories are judged by :func:`chaos.checker.check` with the mode under test.
The fenced run must be valid; the control must be flagged, or the faults were too
weak to prove anything and the scenario fails.

Every fault targets a *fresh holder*: the harness polls the lease server's
``Describe`` until some resource changes hands, waits (bounded) until the client
that got it has a write prepared and not yet sent (its journal file shows it), and
strikes then, inside its critical section (see :mod:`chaos.workload`). All waits
are bounded; a cycle is started only if it can finish before the clients stop.

=====================================  ===========================================
scenario                               what happens to the fresh holder
=====================================  ===========================================
pause-holder                           SIGSTOP for about two TTLs mid-step, SIGCONT
kill-holder                            SIGKILL while a write is prepared; restarted
                                       later, it re-sends the write (its outbox)
partition-holder-from-lease-server     its link to the lease server is blackholed;
                                       its long job goes on writing
delay-holder-to-guard                  its link to the guard delays every byte by
                                       about four TTLs; its timed-out writes land late
restart-lease-server                   the lease server is SIGKILLed for more than a
                                       TTL, restarted on its port; long jobs go on
restart-backend                        the backend dies: PostgreSQL or Redis
                                       (SIGKILL), or for SQLite the lease server and
                                       the guard together (their files); restarted
guard-crash                            paused; a newer holder writes; the guard is
                                       SIGKILLed and restarted; then it resumes
clock-skew                             its SDK clock slows to a quarter and it is cut
                                       from the lease server: its lease.check() keeps
                                       passing long after the lease expired
lock-counter                           (the lock-counter workload) paused; woken after
                                       a newer holder wrote, or while that one's first
                                       increment is prepared (the monotonic window)
pause-worker                           (queue jobs) paused mid-step past its claim; the
                                       job is rescued and written; it wakes and writes
=====================================  ===========================================

An observer thread in the harness reads every key of every resource every
``observe_ms`` (recorded as process ``observer``), so a write that lands late is
seen before someone overwrites it (checker rule 3c).
"""

from __future__ import annotations

import contextlib
import importlib
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from chaos import cluster, faults
from chaos.checker import CheckResult, ViolationKind, check
from chaos.cluster import ClientNode, Cluster, Topology
from chaos.faults import FaultLog, FaultWindow
from chaos.history import Event, HistoryFollower, HistoryWriter, Recorder, read_history
from chaos.workload import (
    COUNTER_KEY,
    EFFECT_KEY,
    JOB_OVERRUN_S,
    Intent,
    Profile,
    client_of,
    in_epoch,
    pending_intent,
    pending_write,
    record_final_reads,
)
from fencing import FencingError, GuardClient, LeaseClient

GUARD_MODES: Final = {"promise": "monotonic"}
"""Modes that are a client's doing: the guard they run against (promise = monotonic
guard + ``Fence`` calls from ``hold(..., fence=[guard])``)."""

SHARED_BACKEND_MODES: Final = frozenset({"strict"})
"""Modes that need the guard store and the lease backend in one PostgreSQL or Redis."""


def keeps_event_log(backend: str) -> bool:
    """Whether the ``backend`` lease backend keeps the event log ``Watch`` streams."""
    from lease_server.backends.base import EventLog

    classes = {
        "sqlite": ("lease_server.backends.sqlite", "SQLiteBackend"),
        "postgres": ("lease_server.backends.postgres", "PostgresBackend"),
        "redis": ("lease_server.backends.redis", "RedisBackend"),
    }
    module, name = classes[backend]
    cls = getattr(importlib.import_module(module), name)
    return issubclass(cls, EventLog)


def available_modes() -> list[str]:
    """Fence modes this build can test: the guard's (but ``off``), and ``promise`` if
    the SDK's ``hold`` takes ``fence=[...]``."""
    import inspect

    from guard.fence import FenceMode

    modes = [m.value for m in FenceMode if m.value != "off"]
    if "fence" in inspect.signature(LeaseClient.hold).parameters:
        modes.append("promise")
    return modes


SHORT_JOBS: Final = Profile()
LONG_JOBS: Final = Profile(job_ms=(3500, 5000), step_ms=(100, 250), check="job")
"""Jobs that outlive a lease unless it is renewed: each checks its lease once, first.

A job struck at its start must outlast the fault (partition, skew), a takeover and a
newer holder's first step, so its next writes are stale."""

RESTART_JOBS: Final = replace(LONG_JOBS, job_ms=(5000, 7000))
"""Longer still: the job must also outlast a server's restart and its reconnection to
a restarted database (connection pools back off for a second or two)."""

MAX_CYCLES: Final = 20
"""Bound on fault cycles in one run, whatever its duration."""

TAKEOVER_S: Final = 2.0
"""Time a strike must leave before the clients stop starting jobs, so that one of them
takes the struck holder's resource over (a TTL of at most 1.2 s, then a step) and
writes while the struck holder is still stale."""

JOB_MODES: Final = frozenset({"monotonic", "promise", "watch", "strict"})
"""The fence modes the job scenario applies to: every one. ``watch`` follows claims
and rescues as events of the lease server's log; ``strict`` accepts a live claim's
token in the write's transaction and refuses an expired or rescued one (PostgreSQL:
the queue lives in the lease backend's schema)."""

JOB_BACKENDS: Final = ("sqlite", "postgres")
"""Lease backends that host a job queue beside the leases (Redis keeps none)."""

CLIENT_START_S: Final = 30.0
"""Bound on the time client processes take to start (import, connect) before the
harness times the run from their start."""

RESTART_S: Final = 1.0
"""Allowance for a server process to start again and its clients to reconnect."""

RESCUE_S: Final = 8.0
"""Bound on the wait, past a claim's TTL, for a paused worker's job to be rescued and the
rescuer's write acknowledged: generous, since on a loaded machine every step of it
(another worker's claim, its promise, its read and write) is slow; never past the
clients' last job."""

QUIET_LEAD_S: Final = 1.5
"""How long before a held write is due to land the harness starts taking the resource's
lease (a client may hold it until its job ends)."""

QUIET_S: Final = 1.0
"""How long after a held write is due the harness keeps the resource quiet, unless a
read showed the late value sooner (it never does in the fenced run: the guard refused
it)."""


class HarnessError(RuntimeError):
    """The harness itself failed (a process would not start, a fault could not be applied)."""


# -- the context a schedule runs in ----------------------------------------------------------


@dataclass
class RunContext:
    """What a fault schedule may use: the cluster, the fault log, a seeded RNG, time."""

    cluster: Cluster
    log: FaultLog
    rng: random.Random
    resources: list[str]
    profile: Profile
    journal_dir: Path
    deadline: float
    fence_mode: str = "monotonic"
    history_dir: Path | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    _follower: HistoryFollower | None = field(default=None, init=False, repr=False)

    @property
    def ttl_max_s(self) -> float:
        return self.profile.ttl_ms[1] / 1000

    def time_left(self) -> float:
        """Seconds until the clients stop starting jobs."""
        return self.deadline - time.monotonic()

    def sleep(self, seconds: float) -> bool:
        """Sleep (woken early by :attr:`stop`); False if the run is stopping."""
        return not self.stop.wait(max(0.0, seconds))

    def fresh_holder(self, timeout: float = 5.0) -> tuple[ClientNode, str, int] | None:
        """Wait for some resource to change hands and its new holder to be mid-step.

        Polls ``Describe`` on the lease server directly (no proxy) every 10 ms; when a
        token changes, waits (up to 1 s) until that client has a write prepared and
        not yet sent (so it did receive the grant: the server's commit is visible
        before the reply arrives) and returns (client, resource, token). Gives up
        after ``timeout`` seconds, never past the deadline: None.
        """
        end = min(time.monotonic() + timeout, self.deadline)
        seen: dict[str, int] = {}
        with LeaseClient(self.cluster.lease_target, rpc_timeout=0.5) as leases:
            while time.monotonic() < end and not self.stop.is_set():
                for resource in self.resources:
                    try:
                        state = leases.describe(resource)
                    except Exception:
                        continue
                    before = seen.get(resource)
                    seen[resource] = state.token
                    if before is None or not state.held or state.token <= before:
                        continue
                    node = self.cluster.clients.get(client_of(state.holder))
                    if (
                        node is not None
                        and node.proc.alive
                        and self.wait_for_pending_write(node.name, 1.0)
                    ):
                        return node, resource, state.token
                self.stop.wait(0.01)
        return None

    def holder_of(self, resource: str) -> tuple[str, int] | None:
        """(holder, token) of ``resource`` now, or None if free or unknown."""
        try:
            with LeaseClient(self.cluster.lease_target, rpc_timeout=0.5) as leases:
                state = leases.describe(resource)
        except Exception:
            return None
        return (state.holder, state.token) if state.held else None

    def wait_for_token_above(self, resource: str, token: int, timeout: float) -> bool:
        """Wait (bounded) until ``resource`` is held with a token above ``token``."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and not self.stop.is_set():
            held = self.holder_of(resource)
            if held is not None and held[1] > token:
                return True
            self.stop.wait(0.02)
        return False

    def wait_for_pending_write(self, client: str, timeout: float) -> bool:
        """Wait (bounded, polling every 2 ms) until ``client`` has a write prepared and
        unanswered (its journal note, see :class:`chaos.workload.Journal`)."""
        end = time.monotonic() + timeout
        while not pending_write(self.journal_dir, client):
            if time.monotonic() >= end or self.stop.is_set():
                return False
            time.sleep(0.002)
        return True

    def busy_workers(self, needs_s: float) -> Iterator[ClientNode]:
        """Clients caught with a write prepared and not yet sent, one per fault cycle.

        For the jobs workload, whose claims the lease server's ``Describe`` does not
        show: a journal note means the client holds a claim and is inside a step.
        Each note is offered once: a strike that came too late (see
        :meth:`unsent_write`) moves on to the next one. Bounded like :meth:`strikes`.
        """
        offered: set[tuple[str, Intent]] = set()
        for _ in range(MAX_CYCLES):
            found: ClientNode | None = None
            while found is None and not self.stop.is_set():
                if self.time_left() < needs_s:
                    return
                # A snapshot: the clients are still being started while this runs.
                for node in list(self.cluster.clients.values()):
                    intent = pending_intent(self.journal_dir, node.name)
                    if node.proc.alive and intent is not None:
                        if (node.name, intent) in offered:
                            continue
                        offered.add((node.name, intent))
                        found = node
                        break
                else:
                    self.stop.wait(0.005)
            if found is None:
                return
            yield found

    def unsent_write(self, client: str) -> Intent | None:
        """The write ``client`` has prepared and certainly not sent yet, or None.

        Call it while the client is paused. Its journal holds a prepared write until
        the outcome is known, and its history records a write's invocation before the
        request goes out: a noted write that the history does not show invoked has not
        reached the guard, so the client will send it, under the token it was prepared
        with, once it runs again. None means the strike came too late.
        """
        intent = pending_intent(self.journal_dir, client)
        if intent is None:
            return None
        for event in read_history(self.history_files(client)):
            if (
                event.op == "write"
                and event.type == "invoke"
                and event.resource == intent.resource
                and event.value == intent.value
            ):
                return None
        return intent

    def history_files(self, client: str) -> list[Path]:
        """The history files of ``client``'s incarnations so far."""
        if self.history_dir is None:
            raise HarnessError("this schedule needs the run's history directory")
        first = self.history_dir / f"{client}.jsonl"
        later = sorted(self.history_dir.glob(f"{client}~*.jsonl"))
        return [first, *later] if first.exists() else later

    def history(self) -> HistoryFollower:
        """What the clients have recorded so far (polled; see :class:`HistoryFollower`)."""
        if self._follower is None:
            if self.history_dir is None:
                raise HarnessError("this schedule needs the run's history directory")
            self._follower = HistoryFollower(self.history_dir)
        self._follower.poll()
        return self._follower

    def wait_until(self, condition: Callable[[], bool], until: float) -> bool:
        """Poll ``condition`` every 10 ms until it holds (True) or ``until`` (monotonic
        seconds) passes or the run stops (False)."""
        while not condition():
            if time.monotonic() >= until or self.stop.is_set():
                return False
            self.stop.wait(0.01)
        return True

    def wait_for_acked_write_above(self, resource: str, token: int, until: float) -> bool:
        """Wait (until ``until``) for a client's write to ``resource`` with a token above
        ``token`` to be acknowledged, as its history shows: a newer holder has written."""
        return self.wait_until(lambda: self.history().acked_token(resource) > token, until)

    def wait_for_read(
        self, resource: str, values: frozenset[str], since: float, until: float
    ) -> bool:
        """Wait (until ``until``) for a read of ``resource`` invoked after ``since``
        (monotonic seconds) to return one of ``values``, as its history shows."""
        since_ns = int(since * 1e9)
        return self.wait_until(lambda: self.history().read_since(resource, since_ns, values), until)

    @contextlib.contextmanager
    def quiet(self, resource: str, by: float) -> Iterator[bool]:
        """Hold ``resource``'s lease as the harness (no client can take it) for the block.

        Tries to acquire it until ``by`` (monotonic seconds) and yields whether it did;
        releases it on exit. The harness never writes: while it holds the lease a late
        write that lands stays in place until a read has seen it.
        """
        with LeaseClient(self.cluster.lease_target, holder="harness", rpc_timeout=1.0) as leases:
            lease = None
            wait = by - time.monotonic()
            if wait > 0:
                # Taken, or not in time (a timeout is a LeaseHeldError, a FencingError).
                with contextlib.suppress(FencingError, TimeoutError):
                    # Long enough for the block; released explicitly, never renewed.
                    lease = leases.acquire(resource, wait + QUIET_S + 3.0, timeout=wait)
            try:
                if lease is None:
                    yield False
                else:
                    # Shown on the timeline like a fault: nobody else may write meanwhile.
                    with self.log.window("quiet", resource, "the harness holds the lease"):
                        yield True
            finally:
                if lease is not None:
                    with contextlib.suppress(Exception):
                        lease.release()

    def strikes(self, needs_s: float) -> Iterator[tuple[ClientNode, str, int]]:
        """Fresh holders to strike (see :meth:`fresh_holder`), one per fault cycle.

        Yields only while a strike still leaves ``needs_s`` seconds before the
        clients stop starting jobs (a takeover needs someone waiting), at most
        :data:`MAX_CYCLES` times.
        """
        for _ in range(MAX_CYCLES):
            left = self.time_left() - needs_s
            if self.stop.is_set() or left <= 0:
                return
            found = self.fresh_holder(timeout=left)
            if found is None:
                continue
            if self.time_left() < needs_s:
                return  # found too late to be worth striking
            yield found


Schedule = Callable[[RunContext], None]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named fault story: topology needs, client profile, schedule, expected control kinds.

    ``expected`` lists the violation kinds the control may show; at least one must
    appear. ``backends`` are those the scenario makes sense on, ``modes`` the fence
    modes (``None``: all), ``workload`` the clients' ``--workload``.
    """

    name: str
    summary: str
    schedule: Schedule
    profile: Profile = SHORT_JOBS
    proxy_lease: bool = False
    proxy_guard: bool = False
    observe_ms: float = 20.0
    skew_rate: float = 1.0
    skew_offset: float = 0.0
    expected: frozenset[str] = frozenset({ViolationKind.STALE_WRITE_ACCEPTED.value})
    backends: tuple[str, ...] = cluster.BACKENDS
    workload: str = "effects"
    modes: frozenset[str] | None = None
    """Fence modes the scenario applies to (``None``: every mode the build has)."""

    def topology(self, backend: str, guard_mode: str) -> Topology:
        return Topology(
            backend=backend,
            fence_mode=guard_mode,
            proxy_lease=self.proxy_lease,
            proxy_guard=self.proxy_guard,
            watch=guard_mode == "watch",
        )


# -- schedules ------------------------------------------------------------------------------


def _pause_holder(ctx: RunContext) -> None:
    pause_s = ctx.ttl_max_s * ctx.rng.uniform(1.9, 2.3)
    for node, _, _ in ctx.strikes(TAKEOVER_S):
        with faults.paused(node.proc, ctx.log, label=node.name):
            time.sleep(pause_s)
        ctx.sleep(ctx.rng.uniform(0.3, 0.8))


def _kill_holder(ctx: RunContext) -> None:
    down_s = ctx.ttl_max_s * ctx.rng.uniform(1.9, 2.3)
    for node, _, _ in ctx.strikes(TAKEOVER_S):

        def restart(name: str = node.name) -> None:
            # The new incarnation stops with the others, not a full duration later.
            ctx.cluster.restart_client(name, ["--duration", f"{max(0.0, ctx.time_left()):.3f}"])

        with faults.crashed(node.proc, ctx.log, label=node.name, restart=restart):
            time.sleep(down_s)
        ctx.sleep(ctx.rng.uniform(0.5, 1.0))


def _partition_holder_from_lease_server(ctx: RunContext) -> None:
    part_s = ctx.ttl_max_s * ctx.rng.uniform(2.2, 2.6)
    for node, _, _ in ctx.strikes(TAKEOVER_S):
        assert node.lease_proxy is not None
        with faults.partitioned(node.lease_proxy, ctx.log, f"{node.name} <-> lease-server"):
            time.sleep(part_s)
        ctx.sleep(ctx.rng.uniform(0.5, 1.0))


def _delay_holder_to_guard(ctx: RunContext) -> None:
    delay_ms = ctx.ttl_max_s * 1000 * ctx.rng.uniform(3.4, 3.8)
    # The cycle needs the clients only until a newer holder has written (the struck
    # holder's job ends after a few timeouts, then a waiter takes over); the late
    # bytes may land after the clients stopped: the observer and final reads see them.
    for node, resource, token in ctx.strikes(3.0):
        assert node.guard_proxy is not None
        target = f"{node.name} <-> guard"
        began_ns = time.monotonic_ns()
        with faults.delayed(node.guard_proxy, ctx.log, target, delay_ms):
            # Everything it sends in this window arrives delay_ms later.
            time.sleep(delay_ms / 1000 / 2)
        # When the held writes land follows from when they were sent (their history).
        held = [
            e
            for e in read_history(ctx.history_files(node.name))
            if e.op == "write"
            and e.type == "invoke"
            and e.resource == resource
            and e.t_mono_ns >= began_ns
        ]
        if not held:
            ctx.sleep(0.2)  # it had sent its write already: nothing was held
            continue
        landing = held[0].t_mono_ns / 1e9 + delay_ms / 1000
        late_values = frozenset(e.value for e in held if e.value is not None)
        # Once a newer holder has written, keep the resource quiet while the first held
        # write lands: a client of the resource is between its read and its write most
        # of the time, and on a loaded machine it may overwrite the late value before
        # the observer (slowed too) reads it. The harness holds the lease and writes
        # nothing, so the late value, if accepted, stays until a read has seen it.
        ctx.sleep(landing - QUIET_LEAD_S - time.monotonic())
        if ctx.wait_for_acked_write_above(resource, token, landing - 0.2):
            with ctx.quiet(resource, by=landing - 0.05) as quiet:
                if quiet:
                    ctx.wait_for_read(resource, late_values, began_ns / 1e9, landing + QUIET_S)
        # Let every held byte land before the next cycle.
        time.sleep(max(0.0, held[-1].t_mono_ns / 1e9 + delay_ms / 1000 + 0.5 - time.monotonic()))


def _restart_lease_server(ctx: RunContext) -> None:
    down_s = ctx.ttl_max_s * ctx.rng.uniform(1.2, 1.35)
    for _ in ctx.strikes(down_s + RESTART_S + TAKEOVER_S):
        assert ctx.cluster.lease is not None
        with faults.crashed(ctx.cluster.lease, ctx.log):
            time.sleep(down_s)
        ctx.sleep(ctx.rng.uniform(2.0, 3.0))


def _restart_backend(ctx: RunContext) -> None:
    down_s = ctx.ttl_max_s * ctx.rng.uniform(1.2, 1.35)
    for _ in ctx.strikes(down_s + RESTART_S + TAKEOVER_S):
        cluster = ctx.cluster
        if cluster.database is not None:
            with faults.crashed(cluster.database, ctx.log):
                time.sleep(down_s)
        else:
            # SQLite lives inside the lease server and the guard: crash both at once.
            assert cluster.lease is not None
            assert cluster.guard is not None
            label = "lease-server + guard (their sqlite)"
            with faults.crashed_together([cluster.lease, cluster.guard], ctx.log, label=label):
                time.sleep(down_s)
        ctx.sleep(ctx.rng.uniform(2.0, 3.0))


def _guard_crash(ctx: RunContext) -> None:
    down_s = ctx.rng.uniform(0.5, 1.0)
    for node, resource, token in ctx.strikes(TAKEOVER_S):
        assert ctx.cluster.guard is not None
        with faults.paused(node.proc, ctx.log, label=node.name):
            # A newer holder takes over and writes, advancing the fence ...
            ctx.wait_for_token_above(resource, token, ctx.ttl_max_s + 1.5)
            time.sleep(0.4)
            # ... then the guard dies and comes back: the fence must have survived.
            with faults.crashed(ctx.cluster.guard, ctx.log):
                time.sleep(down_s)
            time.sleep(0.2)
        ctx.sleep(ctx.rng.uniform(0.5, 1.0))


def _lock_counter(ctx: RunContext) -> None:
    # Two ways to wake a paused holder, alternating: late (the newer holder has
    # written: the old increment must be refused in every mode; the control accepts
    # it and loses the newer increments) and in the window (the newer holder has
    # read the counter and prepared its first increment, not yet sent it: only a
    # fence that knows of the grant refuses the old increment; in monotonic mode it
    # lands and the newer holder's write loses it, the documented window, a finding
    # in the fenced run and the control alike). In monotonic mode the late wake
    # comes first, since only it can catch that mode's control; in the other modes
    # the window wake, the stronger test of their fence, and a control caught either way.
    pause_s = ctx.ttl_max_s * ctx.rng.uniform(1.9, 2.3)
    late_first = ctx.fence_mode == "monotonic"
    for cycle, (node, resource, token) in enumerate(ctx.strikes(TAKEOVER_S)):
        late = (cycle % 2 == 0) == late_first
        with faults.paused(node.proc, ctx.log, label=node.name):
            if late or not ctx.wait_for_token_above(resource, token, ctx.ttl_max_s + 1.5):
                time.sleep(pause_s)
            else:
                held = ctx.holder_of(resource)
                if held is not None:
                    ctx.wait_for_pending_write(client_of(held[0]), 1.0)
        ctx.sleep(ctx.rng.uniform(0.3, 0.8))


def _pause_worker(ctx: RunContext) -> None:
    # Paused past its claim's TTL until the next claim has rescued the job with a
    # newer token and the rescuer's write is acknowledged; then the worker wakes and
    # sends the increment it prepared under the old claim. Waiting for the rescue
    # rather than for a fixed time: on a loaded machine each step of it (the TTL,
    # another worker's claim, its promise, read and write) takes longer. A strike
    # that came after the prepared write was sent proves nothing: resume at once.
    for node in ctx.busy_workers(TAKEOVER_S):
        with faults.paused(node.proc, ctx.log, label=node.name):
            intent = ctx.unsent_write(node.name)
            if intent is not None:
                until = min(
                    time.monotonic() + ctx.ttl_max_s + RESCUE_S, ctx.deadline + JOB_OVERRUN_S
                )
                if ctx.wait_for_acked_write_above(intent.resource, intent.token, until):
                    time.sleep(ctx.rng.uniform(0.0, 0.3))  # somewhere in the rescuer's job
        if intent is not None:
            ctx.sleep(ctx.rng.uniform(0.3, 0.8))


def _clock_skew(ctx: RunContext) -> None:
    part_s = ctx.ttl_max_s * ctx.rng.uniform(2.2, 2.6)
    for node, _, _ in ctx.strikes(TAKEOVER_S):
        assert node.lease_proxy is not None
        with (
            faults.clock_skewed(node.proc, ctx.log, detail="SDK clock at 1/4 speed"),
            faults.partitioned(node.lease_proxy, ctx.log, f"{node.name} <-> lease-server"),
        ):
            time.sleep(part_s)
        ctx.sleep(ctx.rng.uniform(0.5, 1.0))


SCENARIOS: Final[dict[str, Scenario]] = {
    s.name: s
    for s in [
        Scenario(
            "pause-holder",
            "SIGSTOP a fresh holder mid-step for about two TTLs; it wakes and writes",
            _pause_holder,
        ),
        Scenario(
            "kill-holder",
            "SIGKILL a fresh holder with a write prepared; restarted after its lease "
            "expired, it re-sends the write from its journal",
            _kill_holder,
        ),
        Scenario(
            "partition-holder-from-lease-server",
            "blackhole a fresh holder's link to the lease server; its job goes on",
            _partition_holder_from_lease_server,
            profile=LONG_JOBS,
            proxy_lease=True,
        ),
        Scenario(
            "delay-holder-to-guard",
            "delay a fresh holder's link to the guard by ~4 TTLs; its timed-out writes "
            "land after a newer holder's",
            _delay_holder_to_guard,
            profile=replace(SHORT_JOBS, guard_timeout_s=0.5),
            proxy_guard=True,
            observe_ms=10.0,
        ),
        Scenario(
            "restart-lease-server",
            "SIGKILL the lease server for over a TTL while a long job runs; restart it",
            _restart_lease_server,
            profile=RESTART_JOBS,
        ),
        Scenario(
            "restart-backend",
            "SIGKILL the backend (PostgreSQL, Redis, or both SQLite servers) for over "
            "a TTL while a long job runs; restart it",
            _restart_backend,
            profile=RESTART_JOBS,
        ),
        Scenario(
            "guard-crash",
            "pause a holder; a newer holder writes; crash and restart the guard; resume",
            _guard_crash,
        ),
        Scenario(
            "clock-skew",
            "slow a fresh holder's SDK clock to 1/4 and cut it from the lease server: "
            "its lease.check() passes long after the lease expired",
            _clock_skew,
            profile=replace(LONG_JOBS, check="step"),
            proxy_lease=True,
            skew_rate=0.25,
        ),
        Scenario(
            "lock-counter",
            "the lock-counter (read, work, write count+1 with an increment id): pause a "
            "fresh holder; wake it after a newer holder wrote, or while that one's "
            "first increment is prepared",
            _lock_counter,
            workload="counter",
            expected=frozenset(
                {ViolationKind.STALE_WRITE_ACCEPTED.value, ViolationKind.LOST_UPDATE.value}
            ),
        ),
        Scenario(
            "pause-worker",
            "queue jobs running the lock-counter: SIGSTOP a worker mid-step past its "
            "claim; another worker rescues the job and writes; the first wakes and writes",
            _pause_worker,
            workload="jobs",
            expected=frozenset(
                {ViolationKind.STALE_WRITE_ACCEPTED.value, ViolationKind.LOST_UPDATE.value}
            ),
            backends=JOB_BACKENDS,
            modes=JOB_MODES,
        ),
    ]
}


# -- running -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunConfig:
    """The parameters of one scenario run (both the fenced run and its control)."""

    scenario: str
    backend: str = "sqlite"
    fence_mode: str = "monotonic"
    clients: int = 4
    resources: int = 2
    duration: float = 8.0
    seed: int = 1
    control: bool = True

    def resource_names(self) -> list[str]:
        return [f"r{i}" for i in range(self.resources)]


@dataclass
class RunOutcome:
    """One run (fenced or control): its verdict, history, faults and what went wrong."""

    label: str
    guard_mode: str
    checked_mode: str
    result: CheckResult
    events: list[Event]
    faults: list[FaultWindow]
    workdir: Path
    started_ns: int
    ended_ns: int
    errors: list[str] = field(default_factory=list)
    seed: int | None = None
    """The seed this run used: its config's, but for a control the matrix ran again with
    a fresh one (None when not recorded)."""

    @property
    def valid(self) -> bool:
        return self.result.valid


@dataclass
class ScenarioResult:
    """A scenario's fenced run and control, and the verdict on the pair."""

    config: RunConfig
    scenario: Scenario
    fenced: RunOutcome
    control: RunOutcome | None

    @property
    def control_flagged(self) -> bool:
        """The control shows at least one violation of an expected kind."""
        return self.control is not None and bool(
            self.control.result.kinds() & set(self.scenario.expected)
        )

    @property
    def problems(self) -> list[str]:
        """Why the scenario failed (empty when it passed)."""
        out = [f"harness ({run.label}): {e}" for run in self.runs for e in run.errors]
        if not self.fenced.valid:
            out.append(
                f"the fenced run is INVALID in {self.config.fence_mode} mode: "
                + ", ".join(f"{k}={n}" for k, n in self.fenced.result.counts().items() if n)
            )
        if self.control is not None and not self.control_flagged:
            out.append(
                "the control (fencing off) shows no "
                + " or ".join(sorted(self.scenario.expected))
                + " violation: the faults were too weak to prove anything"
            )
        return out

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def runs(self) -> list[RunOutcome]:
        return [self.fenced] + ([self.control] if self.control is not None else [])


class Observer:
    """Reads every key of every resource every ``interval`` s, recorded as ``observer``."""

    def __init__(
        self,
        guard_target: str,
        resources: Sequence[str],
        history_dir: Path,
        interval: float,
        epoch_s: float = 0.0,
    ) -> None:
        self._epoch_s = epoch_s  # the clients' names rotate: read the current ones
        self._guard = GuardClient(guard_target, rpc_timeout=0.5)
        self._writer = HistoryWriter(history_dir / "observer.jsonl")
        self._rec = Recorder(self._writer.write, "observer")
        self._resources = list(resources)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="observer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._guard.close()
        self._writer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for resource in (in_epoch(r, self._epoch_s) for r in self._resources):
                for key in (COUNTER_KEY, EFFECT_KEY):
                    op = self._rec.invoke("read", resource, key=key)
                    try:
                        record = self._guard.read(resource, key)
                    except Exception as exc:
                        reason = getattr(exc, "reason", type(exc).__name__)
                        self._rec.complete(op, "info", error=str(reason))
                        continue
                    if record is None:
                        self._rec.complete(op, "ok", value=None)
                    else:
                        self._rec.complete(
                            op,
                            "ok",
                            value=record.value.decode(),
                            written_by_token=record.written_by_token,
                        )
            self._stop.wait(self._interval)


Progress = Callable[[str, float, float, int, list[str]], None]
"""progress(label, elapsed_s, duration_s, history_lines, active_faults)"""


def _count_lines(directory: Path) -> int:
    total = 0
    for path in directory.glob("*.jsonl"):
        with contextlib.suppress(OSError):
            total += path.read_bytes().count(b"\n")
    return total


def workload_argv(
    name: str,
    workdir: Path,
    *,
    resources: Sequence[str],
    seed: int,
    duration: float,
    fence_mode: str,
    workload: str,
    guard_mode: str,
    options: Sequence[str] = (),
) -> list[str]:
    """The command line of one ``chaos.workload`` client (``{lease}``/``{guard}`` filled
    in by the cluster), its history and journal under ``workdir``; ``options`` adds the
    caller's own flags (fault profile, skew, job cap)."""
    argv = [
        sys.executable,
        "-m",
        "chaos.workload",
        "--name",
        name,
        "--lease",
        "{lease}",
        "--guard",
        "{guard}",
        "--history-dir",
        str(workdir / "history"),
        "--journal-dir",
        str(workdir / "journal"),
        "--resources",
        ",".join(resources),
        "--seed",
        str(seed),
        "--duration",
        f"{duration:g}",
        "--fence-mode",
        fence_mode,
        "--workload",
        workload,
        *options,
    ]
    if fence_mode == "watch" and guard_mode != "watch":
        # The control's guard follows no events: its fence never learns of a grant,
        # so do not wait for it (the acquire is recorded at once, with fenced=0).
        argv += ["--await-fence", "0"]
    return argv


def client_argv(
    config: RunConfig, scenario: Scenario, name: str, workdir: Path, guard_mode: str
) -> list[str]:
    """The command line of one scenario's workload client."""
    return workload_argv(
        name,
        workdir,
        resources=config.resource_names(),
        seed=config.seed,
        duration=config.duration,
        fence_mode=config.fence_mode,
        workload=scenario.workload,
        guard_mode=guard_mode,
        options=[
            "--skew-rate",
            f"{scenario.skew_rate:g}",
            "--skew-offset",
            f"{scenario.skew_offset:g}",
            *scenario.profile.argv(),
        ],
    )


def run_once(
    config: RunConfig,
    scenario: Scenario,
    *,
    label: str,
    guard_mode: str,
    workdir: Path,
    progress: Progress | None = None,
) -> RunOutcome:
    """One run on fresh servers in ``workdir``: start, drive, fault, stop, read, judge.

    Harness failures (a server that would not start or restart, a schedule that
    raised, clients that would not stop) are collected in :attr:`RunOutcome.errors`:
    such a run proves nothing and fails its scenario.
    """
    history_dir = workdir / "history"
    history_dir.mkdir(parents=True, exist_ok=True)
    log = FaultLog(workdir / "faults.jsonl")
    errors: list[str] = []
    started_ns = time.monotonic_ns()
    try:
        with Cluster(scenario.topology(config.backend, guard_mode), workdir, seed=config.seed) as c:

            def start_clients() -> None:
                for i in range(config.clients):
                    name = f"c{i}"
                    c.add_client(name, client_argv(config, scenario, name, workdir, guard_mode))

            _drive(c, config, scenario, log, label, workdir, errors, progress, start_clients)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    ended_ns = time.monotonic_ns()
    events = read_history(history_dir)
    return RunOutcome(
        label=label,
        guard_mode=guard_mode,
        checked_mode=config.fence_mode,
        result=check(events, mode=config.fence_mode),
        events=events,
        faults=list(log.windows),
        workdir=workdir,
        started_ns=started_ns,
        ended_ns=ended_ns,
        errors=errors,
        seed=config.seed,
    )


def _drive(
    cluster: Cluster,
    config: RunConfig,
    scenario: Scenario,
    log: FaultLog,
    label: str,
    workdir: Path,
    errors: list[str],
    progress: Progress | None,
    start_clients: Callable[[], None],
) -> None:
    """Observe, run the schedule while the clients run, stop them, read the final state.

    The schedule starts watching the lease server before the clients start, so the
    very first grants already count as fresh holders.
    """
    history_dir = workdir / "history"
    begin = time.monotonic()
    observer = Observer(
        cluster.guard_target, config.resource_names(), history_dir, scenario.observe_ms / 1000
    )
    observer.start()
    ctx = RunContext(
        cluster=cluster,
        log=log,
        # One seed for the schedule, the same in the fenced run and its control.
        rng=random.Random(f"{config.seed}:{scenario.name}:schedule"),
        resources=config.resource_names(),
        profile=scenario.profile,
        journal_dir=workdir / "journal",
        history_dir=history_dir,
        # Provisional, until the clients have started (below): a schedule must not
        # give up on strikes while the clients are still importing.
        deadline=begin + config.duration + CLIENT_START_S,
        fence_mode=config.fence_mode,
    )

    def drive() -> None:
        try:
            scenario.schedule(ctx)
        except Exception as exc:
            errors.append(f"fault schedule failed: {type(exc).__name__}: {exc}")

    driver = threading.Thread(target=drive, name="schedule", daemon=True)
    driver.start()
    try:
        start_clients()
        # The clients count their duration from their own start, after their imports
        # (seconds on a loaded machine): wait (bounded) until each has opened its
        # history, so strikes are timed against the clients' deadline, not a guess.
        opened = time.monotonic() + CLIENT_START_S
        while time.monotonic() < opened and not all(
            (history_dir / f"{name}.jsonl").exists() for name in cluster.clients
        ):
            time.sleep(0.02)
        begin = time.monotonic()
        ctx.deadline = begin + config.duration
        # Clients stop starting jobs at the deadline; allow for the longest job and for
        # a fault cycle that is still winding down, then stop whatever is left.
        hard_end = begin + config.duration + scenario.profile.job_ms[1] / 1000 + 20.0
        while time.monotonic() < hard_end:
            if progress is not None:
                elapsed = time.monotonic() - begin
                progress(label, elapsed, config.duration, _count_lines(history_dir), log.active)
            clients_alive = any(n.proc.alive for n in cluster.clients.values())
            if not driver.is_alive() and not clients_alive:
                break
            time.sleep(0.25)
    finally:
        ctx.stop.set()
        driver.join(10.0)
        observer.stop()
    if driver.is_alive():
        errors.append("the fault schedule did not finish in time")
    stragglers = cluster.wait_clients(1.0)
    if stragglers:
        errors.append(f"clients still running at the end, killed: {stragglers}")
    for node in cluster.clients.values():
        if node.proc.returncode not in (0, None, -signal.SIGKILL):
            errors.append(
                f"client {node.name} exited with {node.proc.returncode}: {node.proc.log_tail(600)}"
            )
    cluster.stop_proxies()
    # Job resources are named by the queue: the history says which were claimed.
    resources = sorted(
        set(config.resource_names())
        | {e.resource for e in read_history(history_dir) if e.op == "acquire"}
    )
    try:
        read = record_final_reads(cluster.guard_target, resources, history_dir)
    except Exception as exc:
        errors.append(f"final reads failed: {type(exc).__name__}: {exc}")
    else:
        if read < 2 * len(resources):
            errors.append(f"only {read} of {2 * len(resources)} final reads succeeded")


def validated(config: RunConfig) -> Scenario:
    """``config``'s scenario, or ``ValueError`` naming what does not apply (the scenario,
    its backends and modes, the fence modes this build has)."""
    try:
        scenario = SCENARIOS[config.scenario]
    except KeyError:
        raise ValueError(
            f"unknown scenario {config.scenario!r} (expected one of {sorted(SCENARIOS)})"
        ) from None
    if config.backend not in scenario.backends:
        raise ValueError(f"scenario {scenario.name} does not run on {config.backend}")
    if scenario.modes is not None and config.fence_mode not in scenario.modes:
        raise ValueError(
            f"scenario {scenario.name} does not apply to fence mode {config.fence_mode!r} "
            f"(it applies to {', '.join(sorted(scenario.modes))})"
        )
    if config.fence_mode not in available_modes():
        raise ValueError(
            f"fence mode {config.fence_mode!r} is not available here "
            f"(expected one of {available_modes()})"
        )
    if config.fence_mode in SHARED_BACKEND_MODES and config.backend == "sqlite":
        raise ValueError(f"{config.fence_mode} mode needs --backend postgres or redis")
    if config.fence_mode == "watch" and not keeps_event_log(config.backend):
        raise ValueError(
            f"watch mode needs a lease backend with an event log; {config.backend} keeps none"
        )
    return scenario


def run_scenario(
    config: RunConfig, out_dir: Path, *, progress: Progress | None = None
) -> ScenarioResult:
    """Run ``config.scenario``: the fenced run, then (unless disabled) the control.

    Each run gets a fresh directory under ``out_dir`` (``fenced/``, ``control/``)
    with its histories, fault log, process logs and databases.
    """
    scenario = validated(config)
    guard_mode = GUARD_MODES.get(config.fence_mode, config.fence_mode)
    fenced = run_once(
        config,
        scenario,
        label="fenced",
        guard_mode=guard_mode,
        workdir=out_dir / "fenced",
        progress=progress,
    )
    control = None
    if config.control:
        control = run_control(config, out_dir / "control", progress=progress)
    return ScenarioResult(config, scenario, fenced, control)


def run_control(
    config: RunConfig, workdir: Path, *, progress: Progress | None = None
) -> RunOutcome:
    """The control alone: ``config`` with the guard's fencing off, in ``workdir``.

    :func:`run_scenario` runs it after the fenced run; the matrix runs it again,
    with a fresh seed, when a control caught nothing (:mod:`chaos.matrix`).
    """
    scenario = validated(config)
    return run_once(
        config, scenario, label="control", guard_mode="off", workdir=workdir, progress=progress
    )


__all__ = [
    "GUARD_MODES",
    "JOB_BACKENDS",
    "JOB_MODES",
    "LONG_JOBS",
    "RESTART_JOBS",
    "SCENARIOS",
    "SHARED_BACKEND_MODES",
    "SHORT_JOBS",
    "HarnessError",
    "Observer",
    "RunConfig",
    "RunContext",
    "RunOutcome",
    "Scenario",
    "ScenarioResult",
    "available_modes",
    "client_argv",
    "keeps_event_log",
    "run_control",
    "run_once",
    "run_scenario",
    "validated",
    "workload_argv",
]
