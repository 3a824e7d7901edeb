"""tests/pg.py: a missing PostgreSQL skips locally and fails in CI."""

from __future__ import annotations

import pytest

from serving.ports import free_port
from tests import pg


def test_missing_postgres_skips_locally_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pg.ENV_DSN, raising=False)
    monkeypatch.setattr(pg, "LOCAL_DSN", f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    monkeypatch.setattr(pg.Cluster, "missing", staticmethod(lambda: "no binaries here"))

    monkeypatch.setattr(pg, "_resolved", None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no binaries here"):
        pg.test_dsn()

    monkeypatch.setattr(pg, "_resolved", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="required in CI"):
        pg.test_dsn()


def test_an_explicit_dsn_that_does_not_answer_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg, "_resolved", None)
    monkeypatch.setenv(pg.ENV_DSN, f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    with pytest.raises(pytest.fail.Exception, match=pg.ENV_DSN):
        pg.test_dsn()


def test_with_schema_sets_the_query_parameter() -> None:
    assert pg.with_schema("postgresql://u@h/db", "s1") == "postgresql://u@h/db?schema=s1"
    assert (
        pg.with_schema("postgresql://u@h/db?sslmode=disable&schema=old", "s2")
        == "postgresql://u@h/db?sslmode=disable&schema=s2"
    )
