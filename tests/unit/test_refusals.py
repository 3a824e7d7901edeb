"""The guard's bounded memory of recent refusals (guard.refusals)."""

from __future__ import annotations

import pytest

from guard.refusals import RefusalLog


def test_newest_first_and_bounded_per_resource() -> None:
    log = RefusalLog(per_resource=3, resources=10, clock=lambda: 1.5)
    for token in range(1, 6):
        log.record("orders", "STALE_TOKEN", token, fence=9, call="write", principal="w")
    recent = log.recent("orders")
    assert [r.token for r in recent] == [5, 4, 3]
    assert recent[0].fence == 9
    assert recent[0].at_unix_ms == 1500
    assert log.recent("unknown") == []


def test_forgets_the_least_recently_refused_resource_first() -> None:
    log = RefusalLog(per_resource=2, resources=2)
    log.record("a", "STALE_TOKEN", 1)
    log.record("b", "STALE_TOKEN", 1)
    log.record("a", "LEASE_LOST", 2)  # a is now the most recent
    log.record("c", "STALE_TOKEN", 1)  # b goes
    assert log.recent("b") == []
    assert [r.reason for r in log.recent("a")] == ["LEASE_LOST", "STALE_TOKEN"]
    assert len(log) == 3


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="per_resource"):
        RefusalLog(per_resource=0)
