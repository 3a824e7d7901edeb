"""``fencing migrate`` against a real PostgreSQL: applies once, then reports up to date."""

from __future__ import annotations

import subprocess
import sys

import pytest

from serving.postgres_db import migrations
from tests.pg import fresh_schema, with_schema

pytestmark = pytest.mark.postgres


def fencing(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencingctl", *args], capture_output=True, text=True, timeout=60
    )


async def test_migrate_applies_then_is_idempotent() -> None:
    async with fresh_schema() as (dsn, schema):
        first = fencing("migrate", with_schema(dsn, schema))
        assert first.returncode == 0, first.stderr
        everything = [m.version for m in migrations()]
        assert f"applied migrations {everything}" in first.stdout
        again = fencing("migrate", dsn, "--schema", schema)
        assert again.returncode == 0, again.stderr
        assert "up to date" in again.stdout


def test_migrate_refuses_a_non_postgres_url() -> None:
    result = fencing("migrate", "sqlite:x.db")
    assert result.returncode == 2
    assert "INVALID_ARGUMENT" in result.stderr
