"""The price of fencing on MySQL/MariaDB, and of the in-transaction fence, in one run.

    python -m bench.mysql [--clients 16] [--duration 3]   (FENCING_BENCH_MYSQL_URL)

Rows, each writer on its own resource, one 64-byte put per write:

* **direct** (the baseline): the guard store's own check-and-write transaction
  (:class:`guard.stores.mysql.MySQLStore` ``write``: lock the fence row, judge, upsert,
  advance, commit) run from this process on N pooled connections;
* **plain upsert**: the same upsert in its own transaction with no fence at all (what
  fencing adds, per write, is the gap between this row and the direct one);
* **Write** / **WriteStream**: the guard (another process, ``--store mysql://``)
  answering unary calls from N clients, and S x W writers on streams (group commit);
* **in your transaction**: ``START TRANSACTION; INSERT ...; COMMIT`` against the same
  with ``CALL <prefix>check_and_advance(...)`` first (:mod:`fencing.mysql`).

Next to them, measured in the same run: SQLite (the guard store's own write from this
process against the guard on the same file) and PostgreSQL (``bench.throughput``'s rows:
``guard_write`` from psycopg against the guard), so the price of fencing reads the same
way on each: guarded writes over the store's own check-and-write.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

import asyncmy

from bench import postgres as pg_bench
from bench import throughput
from bench.harness import Result, fresh_value, markdown, measure, progress, server, table
from bench.throughput import through_guard
from fencing.mysql import check_and_advance_sql
from fencing.types import Put
from guard.stores.mysql import MySQLStore
from guard.stores.sqlite import SQLiteStore

URL = os.environ.get("FENCING_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
DIRECT = "mysql direct: the store's check-and-write txn (asyncmy)"
TXN = "mysql: your txn (insert), no fence"


async def _drop(store: MySQLStore) -> None:
    p = store.config.prefix
    async with store._connection() as conn, conn.cursor() as cur:
        for table_name in ("fences", "data", "idempotency", "mine"):
            await cur.execute(f"DROP TABLE IF EXISTS {p}{table_name}")
        await cur.execute(f"DROP PROCEDURE IF EXISTS {p}check_and_advance")


async def run(clients: int, duration: float) -> list[Result]:
    prefix = f"b{secrets.token_hex(5)}_"
    url = f"{URL}{'&' if '?' in URL else '?'}prefix={prefix}&pool_max={max(clients, 2)}"
    store = MySQLStore(url)
    await store.open()
    results: list[Result] = []
    try:
        p = store.config.prefix

        async def direct(i: int) -> None:
            # A value that changes on every write: a rewritten constant commits nothing.
            await store.write(f"md-{i}", 1, [Put("k", fresh_value())])

        progress(f"{DIRECT}, {clients} connections")
        results.append(await measure(DIRECT, direct, clients, duration))

        async def plain(i: int) -> None:
            async with store._connection() as conn:
                await conn.begin()
                async with conn.cursor() as cur:
                    await cur.execute(
                        f"INSERT INTO {p}data (resource, k, value, token) VALUES (%s, 'k', %s, 1)"
                        " ON DUPLICATE KEY UPDATE value = VALUES(value), token = 1",
                        (f"mp-{i}".encode(), fresh_value()),
                    )
                await conn.commit()

        progress(f"mysql: plain upsert txn, {clients} connections")
        results.append(
            await measure(
                "mysql: plain upsert txn, no fence", plain, clients, duration, baseline=DIRECT
            )
        )
        with server("guard", "--store", url) as guard:
            results += await through_guard(guard, "mysql guard", DIRECT, clients, duration)

        c = store.config
        async with store._connection() as conn, conn.cursor() as cur:
            await cur.execute(
                f"CREATE TABLE {p}mine (id BIGINT AUTO_INCREMENT PRIMARY KEY, who INT)"
                " ENGINE=InnoDB"
            )
        conns: list[Any] = [
            await asyncmy.connect(
                host=c.host, port=c.port, user=c.user, password=c.password, database=c.database
            )
            for _ in range(clients)
        ]
        try:
            call = check_and_advance_sql(p)

            def txn(fenced: bool) -> Any:
                async def one(i: int) -> None:
                    conn = conns[i]
                    await conn.begin()
                    async with conn.cursor() as cur:
                        if fenced:
                            await cur.execute(call, (f"mt-{i}", 1))
                        await cur.execute(f"INSERT INTO {p}mine (who) VALUES (%s)", (i,))
                    await conn.commit()

                return one

            progress(f"{TXN}, {clients} connections")
            results.append(await measure(TXN, txn(False), clients, duration))
            progress(f"mysql: your txn with check_and_advance, {clients} connections")
            results.append(
                await measure(
                    "mysql: your txn (check_and_advance + insert)",
                    txn(True),
                    clients,
                    duration,
                    baseline=TXN,
                )
            )
        finally:
            for conn in conns:
                conn.close()
    finally:
        await _drop(store)
        await store.close()
    return results


SQLITE_DIRECT = "sqlite direct: the store's check-and-write txn (in process)"


async def sqlite(clients: int, duration: float) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-") as tmp:
        path = Path(tmp) / "guard.db"
        store = SQLiteStore(path)
        await store.open()
        try:

            async def direct(i: int) -> None:
                await store.write(f"sd-{i}", 1, [Put("k", fresh_value())])

            progress(f"{SQLITE_DIRECT}, {clients} tasks")
            results = [await measure(SQLITE_DIRECT, direct, clients, duration)]
        finally:
            await store.close()
        with server("guard", "--store", f"sqlite:///{path}") as guard:
            results += await through_guard(guard, "sqlite guard", SQLITE_DIRECT, clients, duration)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = parser.parse_args()
    show = markdown if args.markdown else table
    print(show(asyncio.run(run(args.clients, args.duration))))
    print(show(asyncio.run(sqlite(args.clients, args.duration))))
    pg = asyncio.run(
        throughput.postgres(args.clients, args.duration, pg_bench.default_dsn(), workers=(1,))
    )
    print(show(pg))


if __name__ == "__main__":
    main()
