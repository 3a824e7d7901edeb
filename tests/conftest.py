"""Shared fixtures: every contract suite is parametrized over tests/backends.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from guard.stores.base import GuardStore
from lease_server.backends.base import LeaseBackend
from tests.backends import GUARD_STORES, LEASE_BACKENDS, TimeControl

#: Registry entries that need a server, and the marker their tests get.
SERVER_MARKS = {"postgres": pytest.mark.postgres}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that runs on a server-backed implementation with its marker."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        for value in callspec.params.values():
            if isinstance(value, str) and value in SERVER_MARKS:
                item.add_marker(SERVER_MARKS[value])


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
