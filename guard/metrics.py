"""The guard's domain metrics. The one to watch is the stale-write counter.

======================================  ===================================================
metric                                  meaning
======================================  ===================================================
``fencing_guard_stale_rejections_total``  writes and fences refused with ``STALE_TOKEN``, by
                                        ``prefix`` (the resource up to its first ``/`` or
                                        ``:``; at most :data:`MAX_PREFIXES` distinct values,
                                        the rest counted as ``other``). Each one is a former
                                        owner that woke up after a takeover: a pause, a
                                        partition, a clock jump. Fencing just saved you.
``fencing_guard_writes_total``          Write calls by ``outcome``: accepted, replayed
                                        (idempotency key seen before), stale, lease_lost
                                        (strict: not the live lease or job claim), error
``fencing_guard_fence_advances_total``  fences accepted, by ``source``: ``fence`` (a
                                        holder's explicit promise), ``watch`` (the guard
                                        following the lease server's events)
``fencing_guard_fence_resets_total``    operator resets (``ResetFence``), by ``prefix``:
                                        each one is audited in the log; alert on any
======================================  ===================================================
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from serving.metrics import PrefixLabels

#: Distinct ``prefix`` label values before the rest are reported as ``other``.
MAX_PREFIXES = 100
WRITE_OUTCOMES = ("accepted", "replayed", "stale", "lease_lost", "error")


class GuardMetrics:
    def __init__(self, registry: CollectorRegistry, max_prefixes: int = MAX_PREFIXES) -> None:
        self.prefix = PrefixLabels(max_prefixes)
        self.stale_rejections = Counter(
            "fencing_guard_stale_rejections_total",
            "Writes and fences refused because a newer token was seen (STALE_TOKEN).",
            ("prefix",),
            registry=registry,
        )
        self.writes = Counter(
            "fencing_guard_writes_total",
            "Write calls by outcome.",
            ("outcome",),
            registry=registry,
        )
        for outcome in WRITE_OUTCOMES:
            self.writes.labels(outcome)
        self.fence_advances = Counter(
            "fencing_guard_fence_advances_total",
            "Fences accepted (the fence is now at least the token), by source.",
            ("source",),
            registry=registry,
        )

        self.fence_resets = Counter(
            "fencing_guard_fence_resets_total",
            "Fences set by an operator's ResetFence (audited), by resource prefix.",
            ("prefix",),
            registry=registry,
        )

    def fence_reset(self, resource: str) -> None:
        self.fence_resets.labels(self.prefix(resource)).inc()

    def stale(self, resource: str) -> None:
        self.stale_rejections.labels(self.prefix(resource)).inc()

    def fence_advanced(self, source: str = "fence") -> None:
        """Count an accepted fence; the watch-mode follower calls it with ``"watch"``."""
        self.fence_advances.labels(source).inc()


__all__ = ["MAX_PREFIXES", "WRITE_OUTCOMES", "GuardMetrics"]
