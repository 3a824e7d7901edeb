"""The ``fencing_queue_paused`` gauge follows the paused queues the stats tick reads."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from lease_server.queue.jobs import QueueCounts
from lease_server.queue.metrics import QueueMetrics


def test_the_paused_gauge_is_one_for_paused_queues_and_dropped_with_the_queue() -> None:
    registry = CollectorRegistry()
    metrics = QueueMetrics(registry)
    metrics.observe([QueueCounts("mail"), QueueCounts("sms")], {"mail"})

    def paused(queue: str) -> float | None:
        return registry.get_sample_value("fencing_queue_paused", {"queue": queue})

    assert (paused("mail"), paused("sms")) == (1, 0)
    metrics.observe([QueueCounts("mail")], set())  # resumed; sms gone
    assert (paused("mail"), paused("sms")) == (0, None)
