"""fencing.mysql: your own MySQL transactions fence themselves on the guard's fence rows.

A guard's MySQL store and an application's own transactions (asyncmy here; any driver)
share ``<prefix>fences``: a transaction that calls ``check_and_advance`` first is
refused for a token below the fence (its own insert never lands), advances the fence
for a newer token (so the guard then refuses the older holder), and the control shows
the same stale transaction landing when it skips the call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from fencing.errors import StaleTokenError
from fencing.mysql import check_and_advance_sql, fencing_error
from fencing.types import Put
from guard.stores.mysql import MySQLStore
from tests import mysql

pytestmark = pytest.mark.mysql

asyncmy = pytest.importorskip("asyncmy", reason="the mysql extra is not installed")


@pytest.fixture
async def store() -> AsyncIterator[MySQLStore]:
    async with mysql.fresh_store() as opened:
        assert isinstance(opened, MySQLStore)
        yield opened


async def _app_connection(store: MySQLStore) -> Any:
    c = store.config
    conn = await asyncmy.connect(
        host=c.host, port=c.port, user=c.user, password=c.password, database=c.database
    )
    async with conn.cursor() as cur:
        await cur.execute(
            f"CREATE TABLE IF NOT EXISTS {c.prefix}orders (id INT PRIMARY KEY, who TEXT)"
            " ENGINE=InnoDB"
        )
    await conn.commit()
    return conn


async def _place_order(store: MySQLStore, conn: Any, token: int, fenced: bool) -> None:
    """The application's transaction: (fence,) insert, commit; rolled back on an error."""
    p = store.config.prefix
    await conn.begin()
    try:
        async with conn.cursor() as cur:
            if fenced:
                await cur.execute(check_and_advance_sql(p), ("orders", token))
            await cur.execute(
                f"INSERT INTO {p}orders (id, who) VALUES (%s, %s)", (token, f"token {token}")
            )
        await conn.commit()
    except Exception as exc:
        await conn.rollback()
        error = fencing_error(exc, resource="orders")
        if error is None:
            raise
        raise error from exc


async def _orders(store: MySQLStore, conn: Any) -> list[int]:
    async with conn.cursor() as cur:
        await cur.execute(f"SELECT id FROM {store.config.prefix}orders ORDER BY id")
        rows = await cur.fetchall()
    await conn.commit()
    return [int(r[0]) for r in rows]


async def test_a_stale_transaction_is_refused_and_a_newer_one_advances_the_fence(
    store: MySQLStore,
) -> None:
    conn = await _app_connection(store)
    try:
        await store.write("orders", 5, [Put("k", b"guard write")])
        with pytest.raises(StaleTokenError) as stale:
            await _place_order(store, conn, 4, fenced=True)
        assert (stale.value.resource, stale.value.token, stale.value.current_token) == (
            "orders",
            4,
            5,
        )
        assert await _orders(store, conn) == []  # its insert rolled back with it
        await _place_order(store, conn, 6, fenced=True)
        assert await _orders(store, conn) == [6]
        assert await store.describe_fence("orders") == 6
        with pytest.raises(StaleTokenError):  # the guard sees the transaction's fence
            await store.write("orders", 5, [Put("k", b"older holder")])
    finally:
        conn.close()


async def test_control_without_the_fence_a_stale_transaction_lands(store: MySQLStore) -> None:
    conn = await _app_connection(store)
    try:
        await store.write("orders", 5, [Put("k", b"guard write")])
        await _place_order(store, conn, 4, fenced=False)
        assert await _orders(store, conn) == [4]
    finally:
        conn.close()


async def test_a_long_resource_name_still_maps_to_a_stale_token_error(
    store: MySQLStore,
) -> None:
    """MySQL error messages hold 128 characters: the detail drops the resource, and the
    caller's name fills it in."""
    name = "r" * 200
    conn = await _app_connection(store)
    try:
        await store.write(name, 9, [])
        await conn.begin()
        with pytest.raises(StaleTokenError) as stale:
            try:
                async with conn.cursor() as cur:
                    await cur.execute(check_and_advance_sql(store.config.prefix), (name, 3))
            except Exception as exc:
                error = fencing_error(exc, resource=name)
                if error is None:
                    raise
                raise error from exc
        await conn.rollback()
        assert (stale.value.resource, stale.value.current_token) == (name, 9)
    finally:
        conn.close()
