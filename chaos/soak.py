"""The soak: every workload at once, a seeded nemesis, the checker and a health watch.

A scenario (:mod:`chaos.scenarios`) is one fault story of a few seconds. A soak runs
for minutes or hours, the way faults meet in production: all the harness'
workloads at once on disjoint resources, against real servers, while a nemesis
strikes on a random schedule drawn from the seed.

- **Clients** (:mod:`chaos.workload`, one process each): ``k*`` run the lock-counter
  on ``r*`` (read, work, write count+1 with an increment id), ``e*`` the guarded
  counter and idempotent effect log on ``x*``, and, on a backend with a queue
  (SQLite, PostgreSQL), ``j*`` are queue workers (claims, rescues of expired claims,
  increments fenced by the claim's token), and ``m*`` hold several of ``m*``
  resources at once with the SDK's ``hold_many`` (renewed by the session; each
  lease's increments fenced by its own token), and ``l*`` campaign in elections
  (:mod:`fencing.election`, one per ``l*`` resource) and, elected, run increments
  fenced by their term. With several lease servers the clients
  are spread over them. Every client has its own fault proxy to its lease server.
- **The nemesis** picks, every few seconds, one of: SIGSTOP a client for about two
  TTLs, SIGKILL a client (restarted, it re-sends its journaled write), partition a
  client from its lease server, skew a client's SDK clock (a quarter speed) while
  it is cut from its lease server, SIGSTOP or SIGKILL a lease server, SIGSTOP or
  SIGKILL the guard, and SIGKILL the backend (a throwaway PostgreSQL or Redis; on
  SQLite the lease server and the guard together). Each fault is undone within
  seconds; the fault log records every window. Crashes of servers and of the
  database happen in the first 40 % of the run only (:data:`CRASH_UNTIL`), so the
  health check has server processes that lived through the rest to judge.
- **The checker** (:func:`chaos.checker.check`, every rule) judges the history so far
  every ``check_every`` seconds while the run goes on (the first violation is
  reported with its time) and the whole history, final reads included, at the end.
- **Health** (:mod:`chaos.health`): every server process sampled every
  ``sample_every`` seconds; a metric that keeps growing over the last half of the
  run fails it as a violation does.

The control is the same soak with the guard's fencing ``off`` (``fencing=False``):
it must show violations. ``leak`` runs the servers through :mod:`chaos.leaky`, the
control of the health check, which must flag it.
"""

from __future__ import annotations

import json
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from chaos import faults, health
from chaos.checker import CheckResult, check, merge
from chaos.cluster import ClientNode, Cluster, Topology
from chaos.faults import FaultLog
from chaos.history import Event, HistoryTail, iter_history, split_history
from chaos.processes import Proc
from chaos.scenarios import (
    GUARD_MODES,
    JOB_BACKENDS,
    SHARED_BACKEND_MODES,
    SHORT_JOBS,
    Observer,
    available_modes,
    keeps_event_log,
    workload_argv,
)
from chaos.workload import (
    JOB_OVERRUN_S,
    JOB_QUEUE,
    PERIODIC_EVERY_S,
    PERIODIC_SCHEDULE,
    Profile,
    drain_and_record_jobs,
    epoch_part,
    record_final_reads,
    record_periodic_jobs,
)
from fencing import QueueClient

NEMESIS_GAP_S: Final = (1.0, 4.0)
"""Seconds between the end of one fault and the start of the next (uniform)."""

FAULT_LEAD_S: Final = 6.0
"""No fault starts later than this before the clients stop: the last one must be
undone, and the system must settle, while the clients still run."""

CRASH_UNTIL: Final = 0.4
"""Servers and the database are crashed only in the first 40 % of a run; pauses, and
every client fault, go on to the end. A crash restarts a server's memory,
descriptors and tasks from zero: the growth check needs incarnations that live
through the last half of the run (and their warm-up before it) to judge anything."""
CLOSE_AFTER_EPOCHS: Final = 1
"""The continuous check lets an epoch go this many epochs after it ended: by then every
operation of its names has long completed (the longest fault is seconds)."""
EPOCH_S: Final = 300.0
"""How long the soak's resource names live: a lock-counter's value (every increment id so
far, recorded whole by every read) then grows for five minutes at most, so the history
grows with the run's length, not with its square."""
PERIODIC_CATCH_UP: Final = 100
"""Missed periods a lease server enqueues after downtime (the schedule's ``catch_up``):
every outage of a soak is far shorter, so every period gets its job (checker rule 8)."""


SERVER_CRASHES: Final = frozenset({"kill-lease-server", "kill-guard", "restart-backend"})
"""The nemesis' faults that restart a server (see :data:`CRASH_UNTIL`)."""

SKEW_RATE: Final = 0.25
"""A skewed client's SDK clock runs at this rate (see ``skew-client``)."""

CLIENT_RESTART_S: Final = (0.5, 2.5)
"""How long a killed client stays down."""

SERVER_DOWN_S: Final = (0.5, 2.0)
"""How long a killed (or paused) server or database stays down."""

JOB_PROFILE: Final = replace(SHORT_JOBS, ttl_ms=(1500, 2000))
"""Queue workers claim with a longer TTL: a claim's TTL is also how long a job of a
killed worker waits to be rescued."""


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """One soak: the backend, the fence mode, how long, the seed, and its shape."""

    backend: str = "sqlite"
    fence_mode: str = "monotonic"
    duration: float = 60.0
    seed: int = 1
    counter_clients: int = 3
    effect_clients: int = 2
    workers: int = 2
    many_clients: int = 2
    """``hold_many`` sessions (the ``many`` workload) on ``resources + 1`` resources."""
    candidates: int = 2
    """Election candidates (the ``elect`` workload), one election per resource."""
    resources: int = 2
    lease_servers: int = 0
    """0: one on SQLite, two on PostgreSQL and Redis."""
    sample_every: float = 2.0
    check_every: float = 0.0
    """0: about twenty checks over the run, at most one every 10 s."""
    faults: bool = True
    fencing: bool = True
    """False: the control, the guard's fencing off (judged in ``fence_mode``)."""
    leak: str = ""
    """A :mod:`chaos.leaky` kind: the control of the health check. Never in a real run."""
    fault_kinds: tuple[str, ...] = ()
    """The nemesis's faults by name (:meth:`Nemesis.actions`); empty: all it can do."""
    drain: bool = True
    """False: the end does not do the jobs the workers left (the control of rule 9, which
    must then flag them). Never in a real run."""
    epoch_s: float = EPOCH_S
    """Seconds each resource name lives (:func:`chaos.workload.in_epoch`): 0 keeps them."""

    @property
    def servers(self) -> int:
        if self.lease_servers:
            return self.lease_servers
        return 1 if self.backend == "sqlite" else 2

    @property
    def has_workers(self) -> bool:
        return self.workers > 0 and self.backend in JOB_BACKENDS

    @property
    def guard_mode(self) -> str:
        if not self.fencing:
            return "off"
        return GUARD_MODES.get(self.fence_mode, self.fence_mode)

    def validate(self) -> None:
        """Raise ``ValueError`` naming what does not apply."""
        if self.fence_mode not in available_modes():
            raise ValueError(
                f"fence mode {self.fence_mode!r} is not available "
                f"(expected one of {available_modes()})"
            )
        if self.fence_mode in SHARED_BACKEND_MODES and self.backend == "sqlite":
            raise ValueError(f"{self.fence_mode} mode needs --backend postgres or redis")
        if self.fence_mode == "watch" and not keeps_event_log(self.backend):
            raise ValueError(f"watch mode needs a lease backend with an event log ({self.backend})")
        if self.servers > 1 and self.backend == "sqlite":
            raise ValueError("several lease servers need --backend postgres or redis")
        if self.duration < 10:
            raise ValueError(f"duration must be >= 10 s, got {self.duration:g}")
        if self.counter_clients + self.effect_clients < 2:
            raise ValueError("a soak needs at least two lease clients (counter + effect)")


@dataclass
class SoakResult:
    """A soak's verdict: the checker's, the health check's, and what went wrong."""

    config: SoakConfig
    result: CheckResult
    growths: list[health.Growth]
    checks: list[dict[str, Any]]
    faults: list[faults.FaultWindow]
    errors: list[str]
    out: Path
    elapsed_s: float
    samples: int = 0
    fault_counts: dict[str, int] = field(default_factory=dict)
    t0_ns: int = 0
    """When the clients' duration began (``time.monotonic_ns``): time 0 of the samples."""

    @property
    def grows(self) -> list[health.Growth]:
        return [g for g in self.growths if g.flagged]

    @property
    def problems(self) -> list[str]:
        out = [f"harness: {e}" for e in self.errors]
        if not self.result.valid:
            out.append(
                "violations: " + ", ".join(f"{k}={n}" for k, n in self.result.counts().items() if n)
            )
        for g in self.grows:
            out.append(
                f"growth: {g.process} {g.metric} rose {g.growth:.3g} over the last half "
                f"(limit {g.limit:.3g})"
            )
        return out

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        first = next((c for c in self.checks if c["violations"]), None)
        return {
            "config": asdict(self.config),
            "passed": self.passed,
            "problems": self.problems,
            "valid": self.result.valid,
            "violations": self.result.counts(),
            "findings": self.result.finding_counts(),
            "first_violation_s": first["t"] if first else None,
            "checks": self.checks,
            "stats": {
                "ops": self.result.stats.ops,
                "writes_ok": self.result.stats.writes_ok,
                "stale_rejected": self.result.stats.stale_rejected,
                "overlap_count": self.result.stats.overlap_count,
            },
            "growth": [g.to_dict() for g in self.growths],
            "faults": self.fault_counts,
            "health_samples": self.samples,
            "errors": self.errors,
            "elapsed_s": round(self.elapsed_s, 1),
            "t0_ns": self.t0_ns,
        }


def client_argv(
    config: SoakConfig, name: str, workload: str, resources: list[str], profile: Profile, out: Path
) -> list[str]:
    """One workload client's command line (``{lease}``/``{guard}`` filled in by the cluster)."""
    return workload_argv(
        name,
        out,
        resources=resources,
        seed=config.seed,
        duration=config.duration,
        fence_mode=config.fence_mode,
        workload=workload,
        guard_mode=config.guard_mode,
        options=[
            *("--max-jobs", str(10**9), "--skew-rate", f"{SKEW_RATE:g}"),
            *("--epoch-s", f"{config.epoch_s:g}"),
            *profile.argv(),
        ],
    )


class Nemesis:
    """Faults on a random schedule from the seed, one at a time, until :meth:`stop`."""

    def __init__(
        self,
        cluster: Cluster,
        log: FaultLog,
        rng: random.Random,
        deadline: float,
        crash_until: float,
        kinds: Sequence[str] = (),
    ) -> None:
        self.crash_until = crash_until
        self.kinds = tuple(kinds)
        self.cluster = cluster
        self.log = log
        self.rng = rng
        self.deadline = deadline
        self.stop_event = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread.ident is None:
            return  # never started (a soak without faults)
        self._thread.join(60.0)
        if self._thread.is_alive():
            self.errors.append("the nemesis did not finish in time")

    def _sleep(self, seconds: float) -> None:
        self.stop_event.wait(max(0.0, seconds))

    def actions(self) -> dict[str, Callable[[], None]]:
        """The faults this cluster allows, by name."""
        acts: dict[str, Callable[[], None]] = {
            "pause-client": self.pause_client,
            "kill-client": self.kill_client,
            "partition-client": self.partition_client,
            "skew-client": self.skew_client,
            "pause-lease-server": lambda: self.pause(self.rng.choice(self.cluster.leases)),
            "kill-lease-server": lambda: self.crash(self.rng.choice(self.cluster.leases)),
            "pause-guard": lambda: self.pause(self._guard()),
            "kill-guard": lambda: self.crash(self._guard()),
            "restart-backend": self.restart_backend,
        }
        return acts

    def _guard(self) -> Proc:
        assert self.cluster.guard is not None
        return self.cluster.guard

    def _client(self) -> ClientNode | None:
        alive = [n for n in self.cluster.clients.values() if n.proc.alive]
        return self.rng.choice(alive) if alive else None

    def _ttl(self) -> float:
        return self.rng.uniform(1.9, 2.3) * SHORT_JOBS.ttl_ms[1] / 1000

    def pause_client(self) -> None:
        node = self._client()
        if node is not None:
            with faults.paused(node.proc, self.log, label=node.name):
                time.sleep(self._ttl())

    def kill_client(self) -> None:
        node = self._client()
        if node is None:
            return

        def restart(name: str = node.name) -> None:
            left = self.deadline - time.monotonic()
            if left > 1.0:  # a new incarnation stops with the others
                self.cluster.restart_client(name, ["--duration", f"{left:.3f}"])

        with faults.crashed(node.proc, self.log, label=node.name, restart=restart):
            time.sleep(self.rng.uniform(*CLIENT_RESTART_S))

    def partition_client(self) -> None:
        node = self._client()
        if node is not None and node.lease_proxy is not None:
            target = f"{node.name} <-> lease-server"
            with faults.partitioned(node.lease_proxy, self.log, target):
                time.sleep(self._ttl())

    def skew_client(self) -> None:
        """Slow a client's SDK clock to :data:`SKEW_RATE` and cut it from its lease
        server for about two and a half TTLs: it believes its lease still valid long
        after it expired and was taken over, so its writes must be refused."""
        # Only a first incarnation: a restarted one may not have its signal handlers
        # yet, and SIGUSR1's default action would end it.
        first = [n for n in self.cluster.clients.values() if n.proc.alive and n.proc.starts == 1]
        node = self.rng.choice(first) if first else None
        if node is None or node.lease_proxy is None:
            return
        with (
            faults.clock_skewed(node.proc, self.log, detail=f"SDK clock at {SKEW_RATE:g}x"),
            faults.partitioned(node.lease_proxy, self.log, f"{node.name} <-> lease-server"),
        ):
            time.sleep(self._ttl() * 1.2)

    def pause(self, proc: Proc) -> None:
        with faults.paused(proc, self.log):
            time.sleep(self.rng.uniform(*SERVER_DOWN_S))

    def crash(self, proc: Proc) -> None:
        with faults.crashed(proc, self.log):
            time.sleep(self.rng.uniform(*SERVER_DOWN_S))

    def restart_backend(self) -> None:
        c = self.cluster
        if c.database is not None:
            self.crash(c.database)
            return
        # SQLite lives inside the lease server and the guard: crash both at once.
        assert c.guard is not None
        label = "lease-server + guard (their sqlite)"
        with faults.crashed_together([*c.leases, c.guard], self.log, label=label):
            time.sleep(self.rng.uniform(*SERVER_DOWN_S))

    def _run(self) -> None:
        acts = self.actions()
        unknown = set(self.kinds) - set(acts)
        if unknown:
            self.errors.append(f"unknown fault kinds {sorted(unknown)}; known: {sorted(acts)}")
            return
        names = sorted(self.kinds or acts)
        while not self.stop_event.is_set():
            self._sleep(self.rng.uniform(*NEMESIS_GAP_S))
            if self.stop_event.is_set() or self.deadline - time.monotonic() < FAULT_LEAD_S:
                return
            allowed = names
            if time.monotonic() >= self.crash_until:
                allowed = [n for n in names if n not in SERVER_CRASHES]
            if not allowed:
                continue
            name = self.rng.choice(allowed)
            try:
                acts[name]()
            except Exception as exc:  # a server that would not come back: the run failed
                self.errors.append(f"fault {name} failed: {type(exc).__name__}: {exc}")
                return


class ContinuousCheck:
    """Runs the checker over the history so far every ``every`` s, on a thread.

    Each check reads only the events recorded since the last one (:class:`HistoryTail`)
    and keeps them by epoch (:func:`chaos.workload.epoch_part`): a check judges the
    epochs still open, and an epoch that ended :data:`CLOSE_AFTER_EPOCHS` epochs ago is
    judged a last time and let go (its verdict kept), so the harness holds one or two
    epochs of history, not the run's. A straggler's event for an epoch let go is left
    to the final check, which judges the whole history."""

    def __init__(
        self, history_dir: Path, mode: str, every: float, t0: float, epoch_s: float = 0.0
    ) -> None:
        self.history_dir = history_dir
        self.mode = mode
        self.every = every
        self.t0 = t0
        self.epoch_s = epoch_s
        self.checks: list[dict[str, Any]] = []
        self._tail = HistoryTail(history_dir)
        self._open: dict[str, list[Event]] = {}
        self._closed: set[str] = set()
        self._closed_events = 0
        self._closed_violations = 0
        self._closed_kinds: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120.0)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.check_now()

    def held(self) -> int:
        """Events held for the epochs still open."""
        return sum(len(events) for events in self._open.values())

    def check_now(self, now: float | None = None) -> dict[str, Any]:
        """Read what was recorded since the last check, judge the open epochs, let go of
        the ended ones; returns the check's record (also appended to ``checks``)."""
        wall = time.time() if now is None else now
        for event in self._tail.poll():
            name = epoch_part(event.resource) if self.epoch_s > 0 else "rest"
            if name not in self._closed:
                self._open.setdefault(name, []).append(event)
        events, violations, kinds = self._closed_events, self._closed_violations, set()
        for name in sorted(self._open):
            part = self._open[name]
            result = check(part, mode=self.mode)
            events += len(part)
            violations += len(result.violations)
            kinds |= result.kinds()
            if self._ended(name, wall):
                self._closed.add(name)
                self._closed_events += len(part)
                self._closed_violations += len(result.violations)
                self._closed_kinds |= result.kinds()
                del self._open[name]
        record = {
            "t": round(time.monotonic() - self.t0, 1),
            "events": events,
            "violations": violations,
            "kinds": sorted(kinds | self._closed_kinds),
        }
        self.checks.append(record)
        return record

    def _ended(self, name: str, wall: float) -> bool:
        if name == "rest" or self.epoch_s <= 0:
            return False
        return wall >= (int(name[1:]) + 1 + CLOSE_AFTER_EPOCHS) * self.epoch_s


def run_soak(
    config: SoakConfig, out: Path, *, progress: Callable[[str], None] | None = None
) -> SoakResult:
    """Run one soak in ``out`` (histories, fault log, logs, ``health.jsonl``), judge it,
    and write ``result.json``, ``health.html`` and ``plots/*.svg`` there."""
    config.validate()
    say = progress or (lambda _text: None)
    out.mkdir(parents=True, exist_ok=True)
    history_dir = out / "history"
    history_dir.mkdir(exist_ok=True)
    log = FaultLog(out / "faults.jsonl")
    errors: list[str] = []
    checks: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    t0 = started
    topology = Topology(
        backend=config.backend,
        fence_mode=config.guard_mode,
        proxy_lease=True,
        watch=config.guard_mode == "watch",
        lease_servers=config.servers,
        metrics=True,
        leak=config.leak,
    )
    counter_res = [f"r{i}" for i in range(config.resources)]
    effect_res = [f"x{i}" for i in range(config.resources)]
    many_res = [f"m{i}" for i in range(config.resources + 1)]
    election_res = [f"l{i}" for i in range(config.resources)]
    try:
        with Cluster(topology, out, seed=config.seed) as cluster:
            targets = [
                health.Target(
                    proc.name,
                    _pid_of(proc),
                    f"http://127.0.0.1:{cluster.metrics_ports[proc.name]}/metrics",
                )
                for proc in [*cluster.leases, cluster.guard]
                if proc is not None
            ]
            database = None
            if cluster.database is not None:
                database = (config.backend, cluster.database.url)
            groups: list[tuple[str, str, int, list[str], Profile]] = [
                ("k", "counter", config.counter_clients, counter_res, SHORT_JOBS),
                ("e", "effects", config.effect_clients, effect_res, SHORT_JOBS),
                ("m", "many", config.many_clients, many_res, SHORT_JOBS),
                ("l", "elect", config.candidates, election_res, SHORT_JOBS),
            ]
            if config.has_workers:
                groups.append(("j", "jobs", config.workers, [], JOB_PROFILE))
                # Every lease server enqueues one job per period; the workers run them.
                with QueueClient(cluster.lease_target) as queue:
                    queue.put_schedule(
                        PERIODIC_SCHEDULE,
                        JOB_QUEUE,
                        every=PERIODIC_EVERY_S,
                        catch_up=PERIODIC_CATCH_UP,
                    )
            say(f"starting {sum(g[2] for g in groups)} clients")
            n = 0
            for prefix, workload, count, resources, profile in groups:
                for i in range(count):
                    name = f"{prefix}{i}"
                    argv = client_argv(config, name, workload, resources or ["-"], profile, out)
                    cluster.add_client(name, argv, lease_server=n % config.servers)
                    n += 1
            # Clients count their duration from their own start (after their imports).
            opened = time.monotonic() + 30.0
            while time.monotonic() < opened and not all(
                (history_dir / f"{name}.jsonl").exists() for name in cluster.clients
            ):
                time.sleep(0.05)
            t0 = time.monotonic()
            deadline = t0 + config.duration
            sampler = health.HealthSampler(
                targets,
                out / "health.jsonl",
                interval=config.sample_every,
                t0=t0,
                database=database,
            )
            observed = [*counter_res, *effect_res]
            observed += many_res if config.many_clients else []
            observed += election_res if config.candidates else []
            observer = Observer(cluster.guard_target, observed, history_dir, 0.1, config.epoch_s)
            every = config.check_every or max(10.0, config.duration / 20)
            checker = ContinuousCheck(history_dir, config.fence_mode, every, t0, config.epoch_s)
            nemesis = Nemesis(
                cluster,
                log,
                random.Random(f"{config.seed}:soak:nemesis"),
                deadline,
                t0 + CRASH_UNTIL * config.duration,
                config.fault_kinds,
            )
            sampler.start()
            observer.start()
            checker.start()
            if config.faults:
                nemesis.start()
            try:
                hard_end = deadline + JOB_OVERRUN_S + 30.0
                last = 0.0
                while time.monotonic() < hard_end:
                    if not any(node.proc.alive for node in cluster.clients.values()):
                        break
                    now = time.monotonic()
                    if now - last >= 10.0:
                        last = now
                        say(
                            f"{min(now - t0, config.duration):6.0f}/{config.duration:g} s  "
                            f"faults {len(log.windows)}  active: {', '.join(log.active) or '-'}"
                        )
                    time.sleep(0.25)
            finally:
                nemesis.stop()
                checker.stop()
                observer.stop()
                sampler.stop()
            errors += nemesis.errors
            checks = checker.checks
            samples = sampler.samples
            stragglers = cluster.wait_clients(1.0)
            if stragglers:
                errors.append(f"clients still running at the end, killed: {stragglers}")
            for node in cluster.clients.values():
                if node.proc.returncode not in (0, None, -signal.SIGKILL):
                    errors.append(
                        f"client {node.name} exited with {node.proc.returncode}: "
                        f"{node.proc.log_tail(600)}"
                    )
            cluster.stop_proxies()
            resources = sorted(
                set(observed) | {e.resource for e in iter_history(history_dir) if e.op == "acquire"}
            )
            say(f"final reads of {len(resources)} resources")
            try:
                read = record_final_reads(cluster.guard_target, resources, history_dir)
            except Exception as exc:
                errors.append(f"final reads failed: {type(exc).__name__}: {exc}")
            else:
                if read < 2 * len(resources):
                    errors.append(f"only {read} of {2 * len(resources)} final reads succeeded")
            if config.has_workers:
                try:
                    # No period starts during the drain: what it leaves undone stays so.
                    with QueueClient(cluster.lease_target) as queue:
                        queue.delete_schedule(PERIODIC_SCHEDULE, queue=JOB_QUEUE)
                    drained, listed = drain_and_record_jobs(
                        cluster.lease_target, history_dir, drain=config.drain
                    )
                    periodic = record_periodic_jobs(cluster.lease_target, history_dir)
                except Exception as exc:
                    errors.append(f"listing the jobs failed: {type(exc).__name__}: {exc}")
                else:
                    say(f"{drained} jobs done by the drain, {listed} listed, {periodic} periodic")
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    say("checking the whole history")
    return judge(config, out, checks, list(log.windows), errors, samples, int(t0 * 1e9), started)


def judge(
    config: SoakConfig,
    out: Path,
    checks: list[dict[str, Any]],
    windows: list[faults.FaultWindow],
    errors: list[str],
    samples: list[dict[str, Any]],
    t0_ns: int,
    started: float,
    elapsed_s: float | None = None,
) -> SoakResult:
    """Check the whole history in ``out``, judge the health samples, write the report.

    The history is judged one epoch at a time (:func:`chaos.checker.merge`), split on
    disk first, so a run of hours is checked in the memory of one epoch."""
    window_s = max(config.sample_every, config.duration / 60)
    latencies = health.Latencies(t0_ns, window_s)
    with tempfile.TemporaryDirectory(prefix="parts-", dir=out) as tmp:
        parts = split_history(out / "history", tmp, epoch_part)
        results = []
        for name in parts.names:
            events = parts.read(name)
            results.append(
                check(
                    events,
                    mode=config.fence_mode,
                    origin_ns=parts.origin_ns,
                    last_seen=parts.last_seen,
                )
            )
            latencies.add(events)
            del events
    result = merge(config.fence_mode, results)
    growths = health.growth(samples, config.duration)
    counts: dict[str, int] = {}
    for w in windows:
        kind = f"{w.kind} {_role(w.target)}"
        counts[kind] = counts.get(kind, 0) + 1
    soak = SoakResult(
        config,
        result,
        growths,
        checks,
        windows,
        errors,
        out,
        time.monotonic() - started if elapsed_s is None else elapsed_s,
        len(samples),
        dict(sorted(counts.items())),
        t0_ns,
    )
    write_report(soak, samples, latencies.series())
    return soak


def rejudge(out: Path) -> SoakResult:
    """Check a finished soak in ``out`` again (its histories, health samples and fault
    log, as the run left them) and rewrite its report: after a checker change, or to
    redraw. The continuous checks and harness errors are kept from ``result.json``."""
    raw = json.loads((out / "result.json").read_text())
    config = SoakConfig(**raw["config"])
    samples = health.read_samples(out / "health.jsonl")
    windows = faults.read_faults(out / "faults.jsonl")
    t0_ns = int(raw.get("t0_ns") or 0)
    if not t0_ns:  # written before it was recorded: the clients' first event
        t0_ns = min((e.t_mono_ns for e in iter_history(out / "history")), default=0)
    return judge(
        config,
        out,
        list(raw.get("checks", [])),
        windows,
        list(raw.get("errors", [])),
        samples,
        t0_ns,
        0.0,
        elapsed_s=float(raw.get("elapsed_s", 0.0)),
    )


def _pid_of(proc: Proc) -> Callable[[], int | None]:
    """The pid of ``proc``'s current incarnation while it runs (None while it is down)."""
    return lambda: proc.pid if proc.alive else None


def _role(target: str) -> str:
    """What a fault struck, for the counts: ``client`` for ``k3`` or ``e1 <-> lease-server``."""
    head = target.split(" ")[0]
    if head.startswith("lease-server"):
        return "lease-server + guard" if "guard" in target else "lease-server"
    if head.rstrip("0123456789") in ("k", "e", "j", "m", "l"):
        return "client"
    return head


def write_report(
    soak: SoakResult,
    samples: list[dict[str, Any]],
    latencies: dict[str, list[tuple[float, float, float]]],
) -> None:
    """``result.json``, ``health.html`` and one SVG per plot in ``plots/``."""
    c = soak.config
    out = soak.out
    (out / "result.json").write_text(json.dumps(soak.to_dict(), indent=2) + "\n")
    plots = health.plots(samples, latencies, c.duration)
    plot_dir = out / "plots"
    plot_dir.mkdir(exist_ok=True)
    for name, svg in plots.items():
        slug = "".join(ch if ch.isalnum() else "-" for ch in name).strip("-")
        (plot_dir / f"{slug}.svg").write_text(svg)
    summary = "<pre>" + "\n".join(verdict_lines(soak)) + "</pre>"
    title = f"soak on {c.backend}, {c.fence_mode}" + (
        "" if c.fencing else " (control: fencing off)"
    )
    page = health.health_page(title, summary, samples, latencies, soak.growths, c.duration)
    (out / "health.html").write_text(page)


def verdict_lines(soak: SoakResult) -> list[str]:
    """The verdict for people: what ran, what broke, what the checker and the health check say."""
    c = soak.config
    r = soak.result
    clients = c.counter_clients + c.effect_clients + c.many_clients + c.candidates
    clients += c.workers if c.has_workers else 0
    lines = [
        f"soak on {c.backend} ({c.servers} lease server{'s' if c.servers > 1 else ''}), "
        f"fence mode {c.fence_mode}{'' if c.fencing else ' (CONTROL: guard fencing off)'}"
        f"{f', LEAK {c.leak}' if c.leak else ''}: {c.duration:g} s, seed {c.seed}, "
        f"{clients} clients",
        "faults: " + (", ".join(f"{k} x{n}" for k, n in soak.fault_counts.items()) or "none"),
        "ops: "
        + " | ".join(
            f"{op} " + " ".join(f"{t}={n}" for t, n in sorted(by.items()))
            for op, by in sorted(r.stats.ops.items())
        ),
        f"checker: {'valid' if r.valid else 'INVALID'}"
        f" ({len(soak.checks)} checks during the run"
        + (
            f", first violation at {next(x['t'] for x in soak.checks if x['violations'])} s"
            if any(x["violations"] for x in soak.checks)
            else ", none found a violation"
        )
        + "); violations: "
        + (", ".join(f"{k}={n}" for k, n in r.counts().items() if n) or "none")
        + "; findings: "
        + (", ".join(f"{k}={n}" for k, n in r.finding_counts().items()) or "none"),
        f"measured: writes ok {r.stats.writes_ok}, stale rejected {r.stats.stale_rejected}",
        f"health: {soak.samples} samples, {len(soak.growths)} series judged, "
        + (
            "growth in " + ", ".join(f"{g.process}/{g.metric}" for g in soak.grows)
            if soak.grows
            else "all flat"
        ),
    ]
    lines += [f"problem: {p}" for p in soak.problems]
    lines.append("PASS" if soak.passed else "FAIL")
    return lines


__all__ = [
    "ContinuousCheck",
    "Nemesis",
    "SoakConfig",
    "SoakResult",
    "judge",
    "rejudge",
    "run_soak",
    "verdict_lines",
    "write_report",
]
