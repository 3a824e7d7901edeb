"""PostgreSQL configuration without a server: URLs, dispatch, the shipped migrations."""

from __future__ import annotations

import pytest

from fencing.errors import InvalidArgumentError
from guard.stores import open_store
from guard.stores.postgres import PostgresStore
from lease_server.backends import open_backend
from lease_server.backends.postgres import PostgresBackend
from serving import postgres_db


def test_url_parameters_are_ours_and_the_rest_is_libpq() -> None:
    config = postgres_db.PgConfig.from_url(
        "postgresql://u:p@db:5433/app?schema=leases_a&timeout=0.5&pool_max=3&sslmode=disable"
    )
    assert config.schema == "leases_a" and config.timeout == 0.5 and config.pool_max == 3
    assert config.conninfo == "postgresql://u:p@db:5433/app?sslmode=disable"
    assert postgres_db.PgConfig.from_url("postgres://db/app", schema="x").schema == "x"
    assert postgres_db.PgConfig.from_url("host=db dbname=app").schema == postgres_db.DEFAULT_SCHEMA
    for bad in ("postgres://db/app?schema=Bad-Name", "postgres://db/app?timeout=0"):
        with pytest.raises(InvalidArgumentError):
            postgres_db.PgConfig.from_url(bad)


def test_open_backend_and_open_store_know_postgres_urls() -> None:
    assert isinstance(open_backend("postgres://db/app?schema=s1"), PostgresBackend)
    assert isinstance(open_backend("postgresql://db/app"), PostgresBackend)
    store = open_store("postgresql://db/app?schema=s1")
    assert isinstance(store, PostgresStore) and store.supports_strict
    assert store.schema == "s1"


def test_every_migration_starts_with_a_header_comment() -> None:
    for migration in postgres_db.migrations():
        assert migration.sql.startswith(f"-- {migration.version:04d}_{migration.name}:")


def test_a_libpq_parameter_with_spaces_survives_the_url() -> None:
    """libpq reads %20 in a URL's query, not '+': a space must stay a space."""
    config = postgres_db.PgConfig.from_url(
        "postgresql://db/app?schema=s1&options=-c%20statement_timeout%3D1234"
    )
    assert config.conninfo == "postgresql://db/app?options=-c%20statement_timeout%3D1234"


@pytest.mark.postgres
def test_libpq_options_from_the_url_reach_the_server() -> None:
    """The same URL through a real connection: the server runs with the option set."""
    import psycopg

    from tests import pg as testpg

    dsn = testpg.test_dsn()
    sep = "&" if "?" in dsn else "?"
    config = postgres_db.PgConfig.from_url(f"{dsn}{sep}options=-c%20statement_timeout%3D1234")
    with psycopg.connect(config.conninfo) as conn:
        row = conn.execute("SHOW statement_timeout").fetchone()
    assert row is not None and row[0] == "1234ms"
