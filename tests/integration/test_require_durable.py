"""``--require-durable``: a server refuses a store that may forget what it acknowledged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fencing.errors import InvalidArgumentError


@pytest.mark.parametrize("module", ["lease_server", "guard"])
def test_memory_is_refused_with_require_durable(module: str) -> None:
    flag = "--backend" if module == "lease_server" else "--store"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            flag,
            "memory://",
            "--listen",
            "127.0.0.1:0",
            "--require-durable",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "require_durable" in proc.stderr or "require-durable" in proc.stderr
    assert "listening" not in proc.stdout


def test_sqlite_is_durable(tmp_path: Path) -> None:
    from lease_server.backends.sqlite import SQLiteBackend

    assert getattr(SQLiteBackend(tmp_path / "x.db"), "durability_warning", None) is None


async def test_in_process_start_refuses_memory_and_closes_it() -> None:
    from lease_server.backends.memory import MemoryBackend
    from lease_server.server import start_lease_server

    with pytest.raises(InvalidArgumentError) as err:
        await start_lease_server(MemoryBackend(), "127.0.0.1:0", require_durable=True)
    assert err.value.field == "require_durable"
    server = await start_lease_server(MemoryBackend(), "127.0.0.1:0")  # warns, starts
    await server.stop(0)
