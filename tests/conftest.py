"""Shared fixtures: every contract suite is parametrized over tests/backends.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from guard.stores.base import GuardStore
from lease_server.backends.base import LeaseBackend
from lease_server.queues.base import QueueBackend
from tests.backends import GUARD_STORES, LEASE_BACKENDS, QUEUE_BACKENDS, TimeControl


@pytest.fixture(params=sorted(LEASE_BACKENDS))
async def lease_backend(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[LeaseBackend, TimeControl]]:
    async with LEASE_BACKENDS[request.param]() as pair:
        yield pair


@pytest.fixture(params=sorted(GUARD_STORES))
async def guard_store(request: pytest.FixtureRequest) -> AsyncIterator[GuardStore]:
    async with GUARD_STORES[request.param]() as store:
        yield store


@pytest.fixture(params=sorted(QUEUE_BACKENDS))
async def queue_backend(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[QueueBackend, TimeControl]]:
    async with QUEUE_BACKENDS[request.param]() as pair:
        yield pair
