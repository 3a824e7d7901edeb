"""``fencing serve`` starts the web console too and prints its URL; ``--console-port 0``
turns it off; a taken port leaves the servers running without it."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from serving.ports import free_port

pytestmark = pytest.mark.e2e


@contextmanager
def serve(data: Path, console_port: int) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "fencingctl", "serve", "--data-dir", str(data)),
            *("--lease-listen", "127.0.0.1:0", "--guard-listen", "127.0.0.1:0"),
            *("--console-port", str(console_port)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def _banners(proc: subprocess.Popen[str], count: int) -> list[str]:
    assert proc.stdout is not None
    return [proc.stdout.readline() for _ in range(count)]


def test_serve_prints_the_console_url_and_it_answers(tmp_path: Path) -> None:
    port = free_port()
    with serve(tmp_path / "a", port) as proc:
        lines = _banners(proc, 5)
        assert "lease server listening on" in lines[0]  # the servers' banners come first
        assert lines[4].strip() == f"console on http://127.0.0.1:{port}/"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/leases", timeout=10) as page:
            assert page.status == 200
            assert "Held leases" in page.read().decode()
        # A second serve on the same console port keeps its servers, warns, no console.
        with serve(tmp_path / "b", port) as second:
            assert "lease server listening on" in _banners(second, 4)[0]
            second.terminate()
            assert second.wait(10) == 0
            assert second.stderr is not None
            assert f"console not started on port {port}" in second.stderr.read()


def test_console_port_0_turns_it_off(tmp_path: Path) -> None:
    with serve(tmp_path, 0) as proc:
        _banners(proc, 4)
        proc.terminate()
        assert proc.wait(10) == 0
        assert proc.stdout is not None
        assert "console" not in proc.stdout.read().split("stopped")[0]
