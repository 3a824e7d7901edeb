"""A Redis without persistence is warned about once at start, not once per layer."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_server import RedisProcess

pytestmark = [pytest.mark.redis, pytest.mark.e2e, pytest.mark.timeout(60)]


def test_the_durability_warning_is_one_line(tmp_path: Path) -> None:
    with RedisProcess() as redis:  # persistence off: the warning is due
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "lease_server", "--backend", redis.url,
                "--listen", "127.0.0.1:0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            assert "listening on" in proc.stdout.readline()
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
    lines = [line for line in stderr.splitlines() if "is not durable" in line]
    assert len(lines) == 1, stderr
    assert "persistence is off" in lines[0]
