"""Metric bookkeeping without servers: bounded prefixes, leases held and expiries, groups."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from fencing.errors import BackendUnavailableError
from guard.metrics import GuardMetrics
from lease_server.metrics import LeaseMetrics
from serving.metrics import GrpcMetrics, Metrics, PrefixLabels
from serving.storage import healthy, with_deadline


def test_prefix_is_the_first_segment_and_cardinality_is_bounded() -> None:
    labels = PrefixLabels(limit=3)
    assert labels("orders/42") == "orders"
    assert labels("billing:acct-1") == "billing"
    assert labels("a:b/c") == "a"
    assert labels("plain") == "other"  # a 4th distinct prefix
    assert labels("orders/43") == "orders"  # known ones keep their label
    assert labels("x/y") == "other"


def test_stale_rejections_are_labelled_by_bounded_prefix() -> None:
    registry = CollectorRegistry()
    metrics = GuardMetrics(registry, max_prefixes=1)
    metrics.stale("orders/1")
    metrics.stale("orders/2")
    metrics.stale("users/1")
    value = registry.get_sample_value
    assert value("fencing_guard_stale_rejections_total", {"prefix": "orders"}) == 2
    assert value("fencing_guard_stale_rejections_total", {"prefix": "other"}) == 1


def test_leases_held_and_expiries_are_tracked_on_the_local_clock() -> None:
    now = [100.0]
    registry = CollectorRegistry()
    metrics = LeaseMetrics(registry, clock=lambda: now[0])
    value = registry.get_sample_value
    metrics.granted("a", 1, 1000)
    metrics.granted("b", 7, 5000)
    assert value("fencing_leases_held") == 2
    metrics.released("a", 999)  # not the current token: ignored
    metrics.released("a", 1)
    assert value("fencing_leases_held") == 1
    now[0] += 3
    metrics.granted("b", 7, 5000)  # a renewal restarts the ttl
    now[0] += 4
    metrics.sweep()
    assert value("fencing_lease_expiries_total") == 0
    now[0] += 2
    metrics.sweep()
    assert value("fencing_lease_expiries_total") == 1
    assert value("fencing_leases_held") == 0
    # A takeover of a lapsed lease that the sweep has not seen yet also counts.
    metrics.granted("c", 1, 100)
    now[0] += 1
    metrics.granted("c", 2, 100)
    assert value("fencing_lease_expiries_total") == 2


def test_groups_are_built_once_per_registry() -> None:
    metrics = Metrics()
    assert metrics.group(GrpcMetrics) is metrics.group(GrpcMetrics)
    assert metrics.group(LeaseMetrics) is metrics.group(LeaseMetrics)
    other = Metrics()  # a second server in the same process: no duplicate registration
    assert other.group(GrpcMetrics) is not metrics.group(GrpcMetrics)
    assert "grpc_server_handled_total" in metrics.render()


class _Slow:
    name = "slow"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.up = True

    async def open(self) -> None:
        await self.gate.wait()

    async def acquire(self) -> str:
        await self.gate.wait()
        return "granted"

    async def own_timeout(self) -> None:
        raise TimeoutError("the driver's own")

    async def healthy(self) -> bool:
        if not self.up:
            await self.gate.wait()
        return True

    def sync(self) -> int:
        return 3


async def test_deadline_proxy_bounds_calls_and_maps_to_unavailable() -> None:
    slow = _Slow()
    timeouts: list[int] = []
    bounded = with_deadline(slow, 0.05, "test backend", lambda: timeouts.append(1))
    with pytest.raises(BackendUnavailableError, match=r"test backend\.acquire took longer"):
        await bounded.acquire()
    assert timeouts == [1]
    with pytest.raises(TimeoutError, match="the driver's own"):
        await bounded.own_timeout()
    assert bounded.sync() == 3
    assert bounded.name == "slow"
    opening = asyncio.ensure_future(bounded.open())  # open is never bounded
    await asyncio.sleep(0.1)
    assert not opening.done()
    slow.gate.set()
    await opening
    assert await bounded.acquire() == "granted"


async def test_health_probe_is_bounded_and_optional() -> None:
    slow = _Slow()
    assert await healthy(slow, 0.05)
    slow.up = False
    assert not await healthy(slow, 0.05)
    assert await healthy(object(), 0.05)
