"""A PostgreSQL outage is two log lines, not a traceback per tick.

A throwaway cluster backs a real ``lease-server`` process (leases and queue, with its
reaper and scheduler) on a URL with ``?timeout=2``. The cluster is stopped: an acquire
fails with ``BackendUnavailableError`` within the URL's timeout, the log says
"backend down" once, and the background loops (expiry sweep, reaper, scheduler,
listener, the connection pools) add no traceback and no line per tick; started
again, the log says "backend back" once and the server serves.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fencing import BackendUnavailableError, LeaseClient
from tests import pg
from tests.waiting import HANG_GUARD

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]

TIMEOUT = 2.0  # the URL's budget per backend call
#: Outage long enough for every background loop to tick several times (the reaper and
#: the expiry sweep tick every second or so, the pools retry their connections).
OUTAGE = 6.0


def wait_for_line(log: Path, text: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{log.read_text()}"
        time.sleep(0.05)


def test_an_outage_is_logged_once_down_and_once_back(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with pg.cluster() as cluster, log.open("w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "lease_server", "--backend",
                f"{cluster.dsn}?timeout={TIMEOUT:g}", "--listen", "127.0.0.1:0",
                "--health-interval", "0.5",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert "listening on" in line, log.read_text()
            address = line.split("listening on ")[1].split()[0]
            with LeaseClient(address) as client:
                client.acquire("r", ttl=5).release()
                cluster.stop()
                started = time.monotonic()
                with pytest.raises(BackendUnavailableError):
                    # The SDK retries a transient failure within the acquire's own
                    # timeout: give it the URL's, so one server attempt is measured.
                    client.acquire("r", ttl=5, timeout=TIMEOUT)
                took = time.monotonic() - started
                wait_for_line(log, "backend down")
                time.sleep(OUTAGE)
                during = log.read_text()
                cluster.start()
                wait_for_line(log, "backend back")
                client.acquire("r", ttl=5, timeout=30).release()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            if proc.stdout:
                proc.stdout.close()
    text = log.read_text()
    assert text.count("backend down") == 1 and text.count("backend back") == 1, text
    assert "Traceback" not in text, text
    noisy = [
        ln for ln in during.splitlines() if (" WARNING " in ln or " ERROR " in ln)
        and "backend down" not in ln
    ]  # fmt: skip
    assert not noisy, "\n".join(noisy)
    assert took < 2 * TIMEOUT, f"the acquire failed after {took:.1f} s, not within the timeout"
