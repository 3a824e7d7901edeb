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
import trustme

from fencing import LeaseClient, TLSConfig
from serving.ports import free_port

pytestmark = pytest.mark.e2e


@contextmanager
def serve(data: Path, console_port: int, *args: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "fencingctl", "serve", "--data-dir", str(data)),
            *("--lease-listen", "127.0.0.1:0", "--guard-listen", "127.0.0.1:0"),
            *("--console-port", str(console_port)),
            *args,
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


def test_serve_over_tls_gives_its_console_the_servers(tmp_path: Path) -> None:
    """Over TLS the console serve starts reaches both servers (over their private Unix
    sockets: it does not know the serving certificate's CA), and its leases page lists
    what a TLS client holds. Before, every page was 503, the TLS handshake failing."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    port = free_port()
    tls_flags = ("--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem"))
    with serve(tmp_path / "data", port, *tls_flags) as proc:
        lines = _banners(proc, 5)
        lease_addr = lines[0].split("listening on ")[1].split()[0]
        with LeaseClient(lease_addr, tls=TLSConfig(ca=ca.cert_pem.bytes())) as leases:
            lease = leases.acquire("tls-orders", ttl=30)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/leases", timeout=10) as page:
                assert page.status == 200
                assert "tls-orders" in page.read().decode()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/guards", timeout=10) as page:
                assert page.status == 200
            lease.release()
