"""Shared fixtures: every contract suite is parametrized over tests/backends.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from guard.stores.base import GuardStore
from lease_server.backends.base import LeaseBackend
from tests.backends import GUARD_STORES, LEASE_BACKENDS, MARKS, TimeControl
from tests.redis_server import (  # noqa: F401  (fixtures)
    redis_cluster_url,
    redis_session,
    redis_url,
    throwaway_redis,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests parametrized with a registry name that needs a server (see MARKS)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        for value in callspec.params.values() if callspec else ():
            if isinstance(value, str) and value in MARKS:
                item.add_marker(getattr(pytest.mark, MARKS[value]))


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
