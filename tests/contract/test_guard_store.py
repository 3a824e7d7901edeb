"""Our own stores pass the shipped contract suite (fencing.testing.stores), one class each.

Each class writes the one fixture a store's authors write: a URL naming fresh storage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing.testing.stores import GuardStoreContract
from tests import mysql, redis_server


class TestMemoryStore(GuardStoreContract):
    shared_storage = False

    @pytest.fixture
    def store_url(self) -> str:
        return "memory://"


class TestSQLiteStore(GuardStoreContract):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path}/guard.db"


@pytest.mark.postgres
class TestPostgresStore(GuardStoreContract):
    @pytest.fixture
    def store_url(self, postgres_url: str) -> str:
        return postgres_url


def _redis_url(base: str) -> Iterator[str]:
    prefix = redis_server.unique_prefix()
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}prefix={prefix}"
    finally:
        asyncio.run(redis_server.drop_prefix(base, prefix))


@pytest.mark.redis
class TestRedisStore(GuardStoreContract):
    @pytest.fixture
    def store_url(self, redis_url: str) -> Iterator[str]:
        yield from _redis_url(redis_url)


@pytest.mark.redis
class TestRedisClusterStore(GuardStoreContract):
    @pytest.fixture
    def store_url(self, redis_cluster_url: str) -> Iterator[str]:
        yield from _redis_url(redis_cluster_url)


@pytest.mark.mysql
class TestMySQLStore(GuardStoreContract):
    @pytest.fixture
    def store_url(self) -> Iterator[str]:
        with mysql.fresh_prefix() as url:
            yield url
