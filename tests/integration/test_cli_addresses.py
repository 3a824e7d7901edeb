"""The client commands check their addresses as the servers check their binds, and
point at the likely mistake when a call fails for a wrong address or transport."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trustme

from fencing.testing import RunningServers, running_servers
from fencing.tls import TLSConfig
from fencingctl import main
from serving import exits
from serving.server import ServerOptions


def fencing(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencingctl", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.fixture
def no_client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LEASE_ADDR", "GUARD_ADDR", "TLS_CA", "TLS_CERT", "TLS_KEY", "AUTH_TOKEN"):
        monkeypatch.delenv(f"FENCING_{name}", raising=False)


@pytest.mark.usefixtures("no_client_env")
@pytest.mark.parametrize(
    ("address", "hint"),
    [
        ("localhost", "no port: give HOST:PORT (localhost:50051?)"),
        ("http://127.0.0.1:50051", "not a URL: drop 'http://'"),
        (":51051", "no host: give HOST:PORT (127.0.0.1:51051?)"),
        ("127.0.0.1:abc", "the port must be a number"),
        ("127.0.0.1:0", "the port must be 1..65535"),
    ],
)
def test_a_malformed_client_address_is_a_usage_error_with_a_hint(
    address: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["lease", "describe", "r", "--lease-addr", address])
    assert exited.value.code == exits.USAGE
    err = capsys.readouterr().err
    assert "argument --lease-addr: " in err and hint in err, err


@pytest.mark.usefixtures("no_client_env")
def test_an_address_from_the_variable_is_checked_and_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FENCING_GUARD_ADDR", "guard")
    with pytest.raises(SystemExit) as exited:
        main(["get", "r", "k"])
    assert exited.value.code == exits.USAGE
    assert "FENCING_GUARD_ADDR=guard: no port: give HOST:PORT (guard:50052?)" in (
        capsys.readouterr().err
    )


def test_the_guards_port_given_to_a_lease_command_says_it_looks_like_a_guard(
    servers: RunningServers,
) -> None:
    for argv in (
        ["lease", "describe", "r", "--lease-addr", servers.guard_address],
        ["lease", "acquire", "r", "--lease-addr", servers.guard_address],
        ["lease", "list", "--lease-addr", servers.guard_address],
    ):
        done = fencing(*argv, "--json")
        assert done.returncode == exits.CODES["NOT_FOUND"], (argv, done.stderr)
        assert "this looks like a guard" in done.stderr, (argv, done.stderr)
        assert "this looks like a guard" in json.loads(done.stdout)["hint"]
    done = fencing("get", "r", "k", "--guard-addr", servers.lease_address)
    assert "this looks like a lease server" in done.stderr, done.stderr
    # The right addresses: no hint.
    done = fencing("lease", "describe", "r", "--lease-addr", servers.lease_address, "--json")
    assert done.returncode == 0 and "hint" not in done.stderr


@pytest.fixture(scope="module")
def tls_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServers, str]]:
    ca = trustme.CA()
    out = tmp_path_factory.mktemp("pki")
    cert = ca.issue_cert("127.0.0.1")
    paths = {name: str(out / name) for name in ("ca.pem", "server.pem", "server.key")}
    ca.cert_pem.write_to_path(paths["ca.pem"])
    cert.cert_chain_pems[0].write_to_path(paths["server.pem"])
    cert.private_key_pem.write_to_path(paths["server.key"])
    tls = TLSConfig(cert=paths["server.pem"], key=paths["server.key"], ca=None)
    with running_servers(options=ServerOptions(tls=tls)) as servers:
        yield servers, paths["ca.pem"]


def test_a_plaintext_client_against_tls_is_told_about_tls(
    tls_servers: tuple[RunningServers, str],
) -> None:
    servers, ca = tls_servers
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("FENCING_")}
    done = fencing("lease", "describe", "r", "--lease-addr", servers.lease_address, env=env)
    assert done.returncode == exits.CODES["UNREACHABLE"], done.stderr
    assert "speaks TLS" in done.stderr and "--tls-ca" in done.stderr, done.stderr
    # The control: with the CA, the same call works and no hint is printed.
    done = fencing(
        "lease", "describe", "r", "--lease-addr", servers.lease_address, "--tls-ca", ca, env=env
    )
    assert done.returncode == 0, done.stderr


def test_a_tls_client_against_plaintext_is_told_to_drop_tls(
    servers: RunningServers, tls_servers: tuple[RunningServers, str]
) -> None:
    _, ca = tls_servers
    done = fencing("get", "r", "k", "--guard-addr", servers.guard_address, "--tls-ca", ca)
    assert done.returncode == exits.CODES["UNREACHABLE"], done.stderr
    assert "speaks plaintext" in done.stderr, done.stderr
    # Our line says it all: no gRPC C-core log line ahead of it.
    assert done.stderr.startswith("error: UNREACHABLE: "), done.stderr
