"""Shared fixtures: every contract suite is parametrized over tests/backends.py."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest

from guard.stores.base import GuardStore
from lease_server.backends.base import LeaseBackend
from lease_server.queue.backends.base import QueueBackend
from tests import pg, thorough
from tests.backends import GUARD_STORES, LEASE_BACKENDS, MARKS, QUEUE_BACKENDS, TimeControl
from tests.redis_server import (  # noqa: F401  (fixtures)
    redis_cluster_url,
    redis_session,
    redis_url,
    throwaway_redis,
)

#: Every test under these folders carries the folder's mark, so the default loop
#: (``-m "not e2e and not chaos and not slow"`` in pyproject.toml) leaves whole suites out.
FOLDER_MARKS = {"e2e": "e2e", "chaos": "chaos"}


def pytest_configure(config: pytest.Config) -> None:
    """The full run (no mark expression: ``-m ""``) searches as hard as each property
    test asks; the default loop runs a fifth (tests/thorough.py)."""
    if config.getoption("markexpr") == "":
        thorough.full = True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by folder (FOLDER_MARKS) and by the server they need (see MARKS)."""
    for item in items:
        folder = item.path.parent.name
        if folder in FOLDER_MARKS:
            item.add_marker(getattr(pytest.mark, FOLDER_MARKS[folder]))
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


@pytest.fixture(params=sorted(QUEUE_BACKENDS))
async def queue_backend(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[QueueBackend, TimeControl]]:
    async with QUEUE_BACKENDS[request.param]() as pair:
        yield pair


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A backend URL on a fresh schema of the test PostgreSQL (for server processes: the
    schema is made by the first that opens it), dropped afterwards."""
    dsn = pg.test_dsn()
    schema = f"{pg.SCHEMA_PREFIX}{secrets.token_hex(6)}"
    try:
        yield pg.with_schema(dsn, schema)
    finally:
        asyncio.run(pg.drop_schema(dsn, schema))
