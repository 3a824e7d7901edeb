"""``fencing healthcheck`` and the operator commands over TLS, mTLS and bearer tokens."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trustme

from fencing.testing import running_servers
from fencing.tls import TLSConfig
from fencingctl import main
from lease_server.backends.memory import MemoryBackend
from serving.auth import AuthPolicy
from serving.server import ServerOptions
from tests.waiting import HANG_GUARD


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a server cert for 127.0.0.1 and a client cert, as files."""
    ca = trustme.CA()
    out = tmp_path_factory.mktemp("pki")
    files = {"ca": out / "ca.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    for name, cert in (
        ("server", ca.issue_cert("127.0.0.1", "localhost")),
        ("client", ca.issue_cert("ops.example.com")),
    ):
        files[name] = out / f"{name}.pem"
        files[f"{name}-key"] = out / f"{name}.key"
        cert.cert_chain_pems[0].write_to_path(str(files[name]))
        cert.private_key_pem.write_to_path(str(files[f"{name}-key"]))
    return {name: str(path) for name, path in files.items()}


@pytest.fixture
def no_client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CA", "CERT", "KEY", "SERVER_NAME"):
        monkeypatch.delenv(f"FENCING_TLS_{name}", raising=False)
    monkeypatch.delenv("FENCING_AUTH_TOKEN", raising=False)


class _Down(MemoryBackend):
    async def healthy(self) -> bool:
        return False


@pytest.mark.usefixtures("no_client_env")
def test_healthcheck_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with running_servers() as servers:
        assert main(["healthcheck", servers.lease_address]) == 0
        assert "SERVING" in capsys.readouterr().out
        assert main(["healthcheck", servers.guard_address, "--service", "nope"]) == 1
    with running_servers(_Down(), options=ServerOptions(health_interval=0.02)) as servers:
        argv = ["healthcheck", servers.lease_address, "--service", "fencing.v1.LeaseService"]
        # The probe flips health within a few intervals; the hang guard bounds the wait.
        deadline = time.monotonic() + HANG_GUARD
        while main(argv) != 1:
            assert time.monotonic() < deadline, "health never turned NOT_SERVING"
            time.sleep(0.05)
        assert "NOT_SERVING" in capsys.readouterr().out
    assert main(["healthcheck", "127.0.0.1:1", "--timeout", "1"]) == 1


@pytest.mark.usefixtures("no_client_env")
def test_healthcheck_and_operator_commands_over_mtls_with_a_token(
    pki: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "auth.toml"
    policy.write_text(
        '[principals.ops]\ntokens = ["ops-token"]\nidentities = ["ops.example.com"]\n'
        'allow = [{ prefix = "orders/", actions = ["*"] }]\n'
    )
    tls = TLSConfig(cert=pki["server"], key=pki["server-key"], ca=pki["ca"])
    options = ServerOptions(tls=tls, auth=AuthPolicy.load(policy))
    client = ["--tls-ca", pki["ca"], "--tls-cert", pki["client"], "--tls-key", pki["client-key"]]
    with running_servers(options=options) as servers:
        assert main(["healthcheck", servers.lease_address, *client]) == 0
        # Without a client certificate the mTLS handshake fails: unhealthy from here.
        assert main(["healthcheck", servers.lease_address, "--tls-ca", pki["ca"]]) == 1
        capsys.readouterr()

        lease = ["--lease-addr", servers.lease_address, *client, "--auth-token", "ops-token"]
        assert main(["lease", "acquire", "orders/1", "--json", *lease]) == 0
        out = capsys.readouterr().out
        assert '"holder": "ops"' in out
        assert main(["lease", "acquire", "payments/1", *lease]) == 8
        assert "PERMISSION_DENIED" in capsys.readouterr().err
        guard = ["--guard-addr", servers.guard_address, *client]
        assert main(["put", "orders/1", "k", "v", "--token", "1", *guard]) == 0
        assert main(["get", "orders/1", "k", *guard]) == 0
        assert "value=v" in capsys.readouterr().out
        assert main(["get", "orders/1", "k", "--guard-addr", servers.guard_address]) == 12
        assert "UNREACHABLE" in capsys.readouterr().err
