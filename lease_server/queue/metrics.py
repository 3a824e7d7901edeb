"""The queue service's metrics: job outcomes as they happen, and backlog gauges.

=============================================  ==========================================
metric                                         meaning
=============================================  ==========================================
``fencing_queue_jobs_total{outcome}``          jobs ``enqueued``, ``claimed``, ``rescued``
                                               (claimed after their lease expired),
                                               ``completed``, ``retried``, ``dead``,
                                               ``released`` through this server; by an
                                               operator: ``cancelled``, ``requeued``
                                               (RetryJob, RequeueDead)
``fencing_queue_lost_total``                   calls refused ``LEASE_LOST``: a worker
                                               acting on a claim that was taken over
``fencing_queue_depth{queue}``                 ready, due jobs (gauge)
``fencing_queue_oldest_job_age_seconds{queue}``  age of the oldest due job (gauge)
``fencing_queue_running{queue}``               running jobs (gauge)
``fencing_queue_expired{queue}``               running jobs whose lease expired (gauge)
``fencing_queue_dead{queue}``                  dead jobs kept (gauge)
``fencing_queue_periodic_total{outcome}``      periods of periodic jobs this server
                                               ``enqueued``, found ``already_enqueued``
                                               (another server was first), and
                                               ``skipped`` (a step that left missed
                                               periods out: the catch-up policy)
=============================================  ==========================================

The gauges come from the queue backend's Stats, refreshed every
``stats_interval_s`` by a task of the server (so they agree across servers sharing a
database); at most ``MAX_QUEUES`` queues are labelled, the first by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from prometheus_client import CollectorRegistry, Counter, Gauge

from lease_server.queue.jobs import QueueCounts

#: Job outcomes (label values of ``fencing_queue_jobs_total``).
OUTCOMES = (
    "enqueued",
    "claimed",
    "rescued",
    "completed",
    "retried",
    "dead",
    "released",
    "cancelled",
    "requeued",
)
#: Outcomes of the scheduler's periods (label values of ``fencing_queue_periodic_total``).
PERIODIC_OUTCOMES = ("enqueued", "already_enqueued", "skipped")
#: Queues labelled in the gauges at most (bounded cardinality).
MAX_QUEUES = 100


class QueueMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.jobs = Counter(
            "fencing_queue_jobs_total", "Jobs by outcome.", ("outcome",), registry=registry
        )
        for outcome in OUTCOMES:
            self.jobs.labels(outcome)
        self.periodic = Counter(
            "fencing_queue_periodic_total",
            "Periods of periodic jobs by outcome.",
            ("outcome",),
            registry=registry,
        )
        for outcome in PERIODIC_OUTCOMES:
            self.periodic.labels(outcome)
        self.lost = Counter(
            "fencing_queue_lost_total",
            "Queue calls refused because the claim was taken over (LEASE_LOST).",
            registry=registry,
        )
        self.depth = Gauge(
            "fencing_queue_depth", "Ready jobs that are due.", ("queue",), registry=registry
        )
        self.oldest = Gauge(
            "fencing_queue_oldest_job_age_seconds",
            "Age of the oldest due job not yet claimed.",
            ("queue",),
            registry=registry,
        )
        self.running = Gauge(
            "fencing_queue_running", "Running jobs.", ("queue",), registry=registry
        )
        self.expired = Gauge(
            "fencing_queue_expired",
            "Running jobs whose lease expired (their worker died or paused).",
            ("queue",),
            registry=registry,
        )
        self.dead = Gauge("fencing_queue_dead", "Dead jobs kept.", ("queue",), registry=registry)
        self.paused = Gauge(
            "fencing_queue_paused",
            "1 while the queue is paused (PauseQueue): no claims handed out.",
            ("queue",),
            registry=registry,
        )
        self._labelled: set[str] = set()

    def observe(
        self, counts: Sequence[QueueCounts], paused: AbstractSet[str] = frozenset()
    ) -> None:
        """Set the gauges from a Stats answer and the paused queues; queues that
        disappeared drop their labels."""
        current = {c.queue: c for c in sorted(counts, key=lambda c: c.queue)[:MAX_QUEUES]}
        for gone in self._labelled - set(current):
            for gauge in (
                self.depth,
                self.oldest,
                self.running,
                self.expired,
                self.dead,
                self.paused,
            ):
                gauge.remove(gone)
        for name, c in current.items():
            self.depth.labels(name).set(c.ready)
            self.oldest.labels(name).set(c.oldest_ready_age_ms / 1000)
            self.running.labels(name).set(c.running)
            self.expired.labels(name).set(c.expired)
            self.dead.labels(name).set(c.dead)
            self.paused.labels(name).set(1 if name in paused else 0)
        self._labelled = set(current)


__all__ = ["MAX_QUEUES", "OUTCOMES", "PERIODIC_OUTCOMES", "QueueMetrics"]
