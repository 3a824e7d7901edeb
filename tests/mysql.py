"""The test MySQL / MariaDB: ``FENCING_TEST_MYSQL_URL``, default
``mysql://root@127.0.0.1:3306/test``. Each test gets its own table prefix, its tables
dropped afterwards (other test runs share the database). Without a server the test is
skipped, or failed under ``CI=true``."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest

from fencing.errors import BackendUnavailableError
from guard.stores.base import GuardStore

DEFAULT_URL = "mysql://root@127.0.0.1:3306/test"
#: What a test may leave under its prefix: the store's tables, and the test's own.
TABLES = ("fences", "data", "idempotency", "orders")


def base_url() -> str:
    return os.environ.get("FENCING_TEST_MYSQL_URL", DEFAULT_URL)


async def _drop(url: str, prefix: str) -> None:
    import asyncmy

    from guard.stores.mysql import MySQLConfig

    c = MySQLConfig(url)
    conn = await asyncmy.connect(
        host=c.host, port=c.port, user=c.user, password=c.password, database=c.database
    )
    try:
        async with conn.cursor() as cur:
            for table in TABLES:
                await cur.execute(f"DROP TABLE IF EXISTS {prefix}{table}")
            await cur.execute(f"DROP PROCEDURE IF EXISTS {prefix}check_and_advance")
    finally:
        conn.close()


async def _reachable(url: str) -> None:
    from guard.stores.mysql import MySQLStore

    store = MySQLStore(url)
    await store.open()
    await store.close()


def _new_url() -> tuple[str, str]:
    pytest.importorskip("asyncmy", reason="the mysql extra is not installed")
    prefix = f"t{secrets.token_hex(6)}_"
    sep = "&" if "?" in base_url() else "?"
    return f"{base_url()}{sep}prefix={prefix}", prefix


def _unavailable(exc: Exception) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"MySQL is required in CI: {exc}", pytrace=False)
    pytest.skip(f"no MySQL: {exc}")


@contextmanager
def fresh_prefix() -> Iterator[str]:
    """A store URL with a table prefix no other test uses; its tables dropped afterwards
    (for synchronous fixtures and tests)."""
    url, prefix = _new_url()
    try:
        asyncio.run(_reachable(url))
    except BackendUnavailableError as exc:
        _unavailable(exc)
    try:
        yield url
    finally:
        asyncio.run(_drop(url, prefix))


@asynccontextmanager
async def fresh_store() -> AsyncIterator[GuardStore]:
    """An opened store on a table prefix of its own (for async fixtures)."""
    from guard.stores.mysql import MySQLStore

    url, prefix = _new_url()
    store = MySQLStore(url)
    try:
        await store.open()
    except BackendUnavailableError as exc:
        _unavailable(exc)
    try:
        yield store
    finally:
        await store.close()
        await _drop(url, prefix)
