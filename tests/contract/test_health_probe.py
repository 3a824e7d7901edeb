"""The optional ``healthy()`` probe (serving.storage.HealthProbe), on every implementation."""

from __future__ import annotations

import tempfile
from pathlib import Path

from guard.stores.base import GuardStore
from lease_server.backends.base import LeaseBackend
from lease_server.backends.sqlite import SQLiteBackend
from serving.storage import healthy
from tests.backends import TimeControl


async def test_an_open_backend_has_a_probe_and_is_healthy(
    lease_backend: tuple[LeaseBackend, TimeControl],
) -> None:
    backend, _ = lease_backend
    assert hasattr(backend, "healthy"), f"{backend.name} backend has no healthy() probe"
    assert await healthy(backend, 5.0)


async def test_an_open_store_has_a_probe_and_is_healthy(guard_store: GuardStore) -> None:
    assert hasattr(guard_store, "healthy"), f"{guard_store.name} store has no healthy() probe"
    assert await healthy(guard_store, 5.0)


async def test_a_closed_database_is_not_healthy() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        backend = SQLiteBackend(Path(tmp) / "leases.db")
        await backend.open()
        assert await backend.healthy()
        await backend.close()
        assert not await backend.healthy()
