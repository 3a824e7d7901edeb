"""A server that cannot start says so in one line (what failed, the setting, what to
do) and exits with its documented code; the traceback only at ``--log-level debug``.
Real processes: an occupied port, a closed port, a bad certificate path, a refused
store, a role that may not migrate."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from serving import exits

PG = "postgresql://postgres@127.0.0.1:5432/test"

#: command -> (argv prefix, its listen flag, its backend flag or None, a backend URL flag)
SERVERS = {
    "lease-server": (["-m", "lease_server"], "--listen", "--backend"),
    "fencing-guard": (["-m", "guard"], "--listen", "--store"),
    "fencing serve": (["-m", "fencingctl", "serve"], "--lease-listen", "--queue"),
}


@pytest.fixture
def occupied() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(command: str, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    prefix, listen, _ = SERVERS[command]
    extra = ["--data-dir", str(tmp_path / "data")] if command == "fencing serve" else []
    if listen not in argv:
        extra += [listen, "127.0.0.1:0"]
    if command == "fencing serve" and "--guard-listen" not in argv:
        extra += ["--guard-listen", "127.0.0.1:0"]
    return subprocess.run(
        [sys.executable, *prefix, *argv, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def our_lines(done: subprocess.CompletedProcess[str], command: str) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith(f"{command}:")]


def assert_one_line(
    done: subprocess.CompletedProcess[str], command: str, reason: str, *names: str
) -> str:
    assert done.returncode == exits.CODES[reason], done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = our_lines(done, command)
    assert f"cannot start: {reason}: " in line
    for name in names:
        assert name in line, line
    assert "listening" not in done.stdout
    return line


@pytest.mark.parametrize("command", SERVERS)
def test_an_occupied_port(command: str, tmp_path: Path, occupied: str) -> None:
    _, listen, _ = SERVERS[command]
    done = start(command, tmp_path, listen, occupied)
    assert_one_line(done, command, "PORT_IN_USE", listen, occupied)
    # gRPC's C core does not get to print its own line (E... add_port.cc) before ours.
    assert "add_port" not in done.stderr and "Failed to add port" not in done.stderr, done.stderr


@pytest.mark.parametrize("command", SERVERS)
def test_a_backend_on_a_closed_port(command: str, tmp_path: Path) -> None:
    _, _, backend = SERVERS[command]
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/test"
    done = start(command, tmp_path, backend, url)
    assert_one_line(done, command, "BACKEND_UNREACHABLE", backend, "check the URL")


@pytest.mark.parametrize("command", SERVERS)
def test_a_bad_certificate_path_is_a_settings_error(command: str, tmp_path: Path) -> None:
    done = start(command, tmp_path, "--tls-cert", "/no/such.pem", "--tls-key", "/no/such.key")
    assert done.returncode == exits.USAGE, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if "/no/such.pem" in ln]
    assert "--tls-cert" in line and "readable PEM" in line


@pytest.mark.parametrize("command", SERVERS)
def test_require_durable_refuses_memory(command: str, tmp_path: Path) -> None:
    _, _, backend = SERVERS[command]
    done = start(command, tmp_path, backend, "memory://", "--require-durable")
    assert_one_line(done, command, "NOT_DURABLE", "--require-durable", "memory")


@pytest.fixture
def unprivileged() -> Iterator[str]:
    """A role that may connect to the database but create nothing in it."""
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS fencing_startup_noperm")
        conn.execute("CREATE ROLE fencing_startup_noperm LOGIN")
    try:
        yield "postgresql://fencing_startup_noperm@127.0.0.1:5432/test?schema=startup_noperm"
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute("DROP ROLE IF EXISTS fencing_startup_noperm")


@pytest.mark.parametrize("command", ["lease-server", "fencing-guard"])
def test_a_failed_migration(command: str, tmp_path: Path, unprivileged: str) -> None:
    _, _, backend = SERVERS[command]
    done = start(command, tmp_path, backend, unprivileged)
    line = assert_one_line(done, command, "MIGRATION_FAILED", backend, "fencing migrate")
    assert "permission denied" in line


def test_the_traceback_only_at_debug(tmp_path: Path, occupied: str) -> None:
    done = start("lease-server", tmp_path, "--listen", occupied, "--log-level", "debug")
    assert done.returncode == exits.CODES["PORT_IN_USE"]
    assert "Traceback" in done.stderr
    assert len(our_lines(done, "lease-server")) == 1


@pytest.mark.parametrize("command", SERVERS)
def test_an_unknown_url_parameter_is_a_settings_error(command: str, tmp_path: Path) -> None:
    """``?schem=x`` is a typo, not a libpq parameter: exit 2 naming it and the known ones,
    before any connection (the default schema is never used instead)."""
    _, _, backend = SERVERS[command]
    done = start(command, tmp_path, backend, f"{PG}?schem=x")
    assert done.returncode == exits.USAGE, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if "'schem'" in ln]
    assert "schema" in line and "timeout" in line and "sslmode" in line, line


def test_migrate_refuses_an_unknown_url_parameter() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fencingctl", "migrate", f"{PG}?schem=x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == exits.USAGE, done.stderr
    assert "'schem'" in done.stderr and "schema" in done.stderr, done.stderr
