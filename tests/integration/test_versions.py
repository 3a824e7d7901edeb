"""The version an operator can ask for: ``--version`` on every command, the
``fencing_build_info`` gauge on every server's registry, and the start log line."""

from __future__ import annotations

import logging
import select
import signal
import subprocess
import sys
import time
from importlib import metadata

import pytest

import fencing
from fencing.testing import running_servers

#: What pip installed: the one place the version is written down is pyproject.toml.
INSTALLED = metadata.version("fencing-guard")


@pytest.mark.parametrize(
    ("module", "prog"),
    [("fencingctl", "fencing"), ("lease_server", "lease-server"), ("guard", "fencing-guard")],
)
def test_every_command_prints_the_installed_version(module: str, prog: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == f"{prog} {INSTALLED}\n"


def test_the_package_version_is_the_installed_one() -> None:
    assert fencing.__version__ == INSTALLED


def test_each_server_registry_has_build_info_and_logs_its_version_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    with running_servers("memory://", "memory://") as s:
        for server in (s.lease, s.guard):
            registry = server.metrics.registry
            assert registry.get_sample_value("fencing_build_info", {"version": INSTALLED}) == 1
            rendered = server.metrics.render()
            assert f'fencing_build_info{{version="{INSTALLED}"}} 1.0' in rendered
        logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"lease server version {INSTALLED} serving on {s.lease_address}" in logged
    assert f"guard version {INSTALLED} serving on {s.guard_address}" in logged


def _first_line_with(proc: subprocess.Popen[str], needle: str, timeout: float = 30) -> str:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if needle in line:
                return line
    raise AssertionError(f"no line with {needle!r} in {seen!r}")


@pytest.mark.parametrize(
    ("module", "args", "needle"),
    [
        ("lease_server", ["--backend", "memory://", "--queue", "off"], "lease server version"),
        ("guard", ["--store", "memory://"], "guard version"),
    ],
)
def test_a_server_process_logs_its_version_at_start(
    module: str, args: list[str], needle: str
) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", module, "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            line = _first_line_with(proc, needle)
            assert f"{needle} {INSTALLED} serving on 127.0.0.1:" in line
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
