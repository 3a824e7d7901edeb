"""The lease server's domain metrics, and the bookkeeping behind ``leases held``.

====================================  =====================================================
metric                                meaning
====================================  =====================================================
``fencing_leases_held``               leases granted or renewed through this server whose
                                      ttl has not run out (gauge, swept every second)
``fencing_lease_acquires_total``      Acquire calls by ``outcome``: granted, replayed
                                      (a retried request id), held (nowait), timeout
                                      (waited, still held), error
``fencing_lease_waiters``             Acquire calls queued for a held resource (gauge)
``fencing_lease_expiries_total``      leases whose ttl ran out with no renew or release:
                                      holders that died, paused or lost the network
``fencing_lease_renew_seconds``       time the backend took to renew (histogram)
``fencing_lease_watch_streams``       Watch streams open (gauge; counted at the edge)
``fencing_lease_steps_total``         backend steps (transactions, round trips) that
                                      carried Acquire attempts, Renews and Releases
``fencing_lease_step_calls_total``    the calls those steps carried: calls / steps is
                                      how many share one step (group commit; 1 when idle)
``fencing_lease_session_streams``     Session streams open (gauge)
``fencing_lease_session_calls_total`` calls answered on Session streams, by ``kind``
                                      (acquire, renew, ..., ping) and ``code`` (OK, or
                                      the error's gRPC code: ABORTED is a held lease)
====================================  =====================================================

The ``held`` gauge and the expiries are tracked per server process from the grants,
renewals and releases it handles, on its monotonic clock: after a restart the gauge
fills up again as holders renew (within a third of their ttl). With several replicas
on one backend, sum the gauge over replicas; a lease renewed through another replica
may then be counted as expired on the first.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from serving.metrics import LATENCY_BUCKETS

#: Acquire outcomes (label values of ``fencing_lease_acquires_total``).
OUTCOMES = ("granted", "replayed", "held", "timeout", "error")


class LeaseMetrics:
    def __init__(
        self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.held = Gauge(
            "fencing_leases_held",
            "Leases granted or renewed through this server and not yet expired.",
            registry=registry,
        )
        self.acquires = Counter(
            "fencing_lease_acquires_total",
            "Acquire calls by outcome.",
            ("outcome",),
            registry=registry,
        )
        for outcome in OUTCOMES:
            self.acquires.labels(outcome)
        self.waiters = Gauge(
            "fencing_lease_waiters",
            "Acquire calls waiting in line for a held resource.",
            registry=registry,
        )
        self.expiries = Counter(
            "fencing_lease_expiries_total",
            "Leases whose ttl ran out without a renew or release.",
            registry=registry,
        )
        self.renew_seconds = Histogram(
            "fencing_lease_renew_seconds",
            "Time the backend took to renew a lease.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.steps = Counter(
            "fencing_lease_steps",
            "Backend steps that carried lease calls (acquire attempts, renews, releases).",
            registry=registry,
        )
        self.step_calls = Counter(
            "fencing_lease_step_calls",
            "Lease calls carried by those backend steps (grouped when they arrive together).",
            registry=registry,
        )
        self.session_streams = Gauge(
            "fencing_lease_session_streams",
            "Session streams open on this server.",
            registry=registry,
        )
        self.session_calls = Counter(
            "fencing_lease_session_calls_total",
            "Calls answered on Session streams, by kind and gRPC code.",
            ("kind", "code"),
            registry=registry,
        )
        self._clock = clock
        #: resource -> (token, local deadline) of leases this server granted or renewed.
        self._live: dict[str, tuple[int, float]] = {}

    def stepped(self, calls: int) -> None:
        """One backend step carried ``calls`` lease calls."""
        self.steps.inc()
        self.step_calls.inc(calls)

    def granted(self, resource: str, token: int, ttl_ms: int) -> None:
        """A grant or renewal of ``token`` for ``ttl_ms`` from now."""
        now = self._clock()
        previous = self._live.get(resource)
        if previous is not None and previous[0] != token and previous[1] <= now:
            self.expiries.inc()
        self._live[resource] = (token, now + ttl_ms / 1000)
        self.held.set(len(self._live))

    def released(self, resource: str, token: int) -> None:
        entry = self._live.get(resource)
        if entry is not None and entry[0] == token:
            del self._live[resource]
            self.held.set(len(self._live))

    def sweep(self) -> None:
        """Count the tracked leases whose ttl ran out as expiries; update the gauge."""
        now = self._clock()
        expired = [r for r, (_, deadline) in self._live.items() if deadline <= now]
        for resource in expired:
            del self._live[resource]
        if expired:
            self.expiries.inc(len(expired))
        self.held.set(len(self._live))


__all__ = ["OUTCOMES", "LeaseMetrics"]
