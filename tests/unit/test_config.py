"""Configuration: flag > env > TOML file > default, validated up front with named errors."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from lease_server import __main__ as lease_main
from serving import config

ROOT = Path(__file__).resolve().parents[2]


def resolve(
    argv: list[str], env: dict[str, str] | None = None
) -> tuple[argparse.Namespace, dict[str, str]]:
    args = lease_main.parser().parse_args(argv)
    sources = config.resolve(args, lease_main.OPTIONS, env or {})
    return args, sources


@pytest.fixture
def toml(tmp_path: Path) -> Path:
    path = tmp_path / "lease.toml"
    path.write_text('metrics_port = 9300\nlisten = "127.0.0.1:7000"\nlog_format = "json"\n')
    return path


def test_precedence_flag_env_file_default(toml: Path) -> None:
    env = {"FENCING_METRICS_PORT": "9200", "FENCING_LEASE_LISTEN": "127.0.0.1:7100"}
    args, sources = resolve(["--config", str(toml), "--metrics-port", "9100"], env)
    assert args.metrics_port == 9100
    assert sources["metrics_port"] == "flag --metrics-port"
    assert args.listen == "127.0.0.1:7100"
    assert sources["listen"] == "env FENCING_LEASE_LISTEN"
    assert args.log_format == "json"
    assert sources["log_format"] == f"{toml}: log_format"
    assert args.grace == 5.0
    assert sources["grace"] == "default"


def test_config_file_from_the_environment_and_empty_variables_are_unset(toml: Path) -> None:
    args, _ = resolve([], {"FENCING_CONFIG": str(toml), "FENCING_METRICS_PORT": ""})
    assert args.metrics_port == 9300


def test_bool_flags_override_the_environment_both_ways() -> None:
    args, _ = resolve(["--no-reflection"], {"FENCING_REFLECTION": "true"})
    assert args.reflection is False
    args, _ = resolve([], {"FENCING_REFLECTION": "yes"})
    assert args.reflection is True


def test_unknown_keys_in_the_file_are_errors_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("metrics_prot = 1\nlisten = '127.0.0.1:1'\n")
    with pytest.raises(config.ConfigError, match="unknown key 'metrics_prot'"):
        resolve(["--config", str(path)])


def test_every_problem_is_reported_with_its_source(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('grace = "soon"\nlog_format = "xml"\n')
    env = {"FENCING_METRICS_PORT": "70000", "FENCING_BACKEND_TIMEOUT": "0"}
    with pytest.raises(config.ConfigError) as err:
        resolve(["--config", str(path)], env)
    message = str(err.value)
    assert f"{path}: grace: expected a number, got 'soon'" in message
    assert f"{path}: log_format: must be one of console, json" in message
    assert "env FENCING_METRICS_PORT: must be a port number 0..65535, got 70000" in message
    assert "env FENCING_BACKEND_TIMEOUT: must be greater than 0" in message


def test_a_listen_address_is_checked_by_the_rule_the_clients_use() -> None:
    env = {"FENCING_LEASE_LISTEN": "http://0.0.0.0:50051"}
    with pytest.raises(config.ConfigError, match="not a URL: drop 'http://'"):
        resolve([], env)
    with pytest.raises(config.ConfigError, match="no port"):
        resolve([], {"FENCING_LEASE_LISTEN": "localhost"})
    args, _ = resolve([], {"FENCING_LEASE_LISTEN": "[::1]:0"})
    assert args.listen == "[::1]:0"


def test_unreadable_or_invalid_config_files(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="cannot read"):
        resolve(["--config", str(tmp_path / "absent.toml")])
    bad = tmp_path / "bad.toml"
    bad.write_text("listen = ")
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        resolve(["--config", str(bad)])


def test_plaintext_on_a_network_address_needs_insecure() -> None:
    args, _ = resolve(["--listen", "0.0.0.0:50051"])
    with pytest.raises(config.ConfigError, match=r"refusing to serve plaintext on 0\.0\.0\.0"):
        config.server_options(args, [args.listen])
    args, _ = resolve(["--listen", "0.0.0.0:50051", "--insecure"])
    assert config.server_options(args, [args.listen]).insecure


def test_tls_and_auth_files_are_checked_at_startup(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    cert_path, key_path = tmp_path / "s.pem", tmp_path / "s.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    args, _ = resolve(["--tls-cert", str(cert_path)])
    with pytest.raises(config.ConfigError, match="both a certificate and its key"):
        config.server_options(args, [args.listen])
    args, _ = resolve(["--tls-cert", str(key_path), "--tls-key", str(key_path)])
    with pytest.raises(config.ConfigError, match="not a PEM CERTIFICATE"):
        config.server_options(args, [args.listen])
    args, _ = resolve(["--tls-ca", str(tmp_path / "nope.pem")])
    with pytest.raises(config.ConfigError, match="needs its own certificate"):
        config.server_options(args, [args.listen])
    policy = tmp_path / "auth.toml"
    policy.write_text("[principals.a]\nallow = [{prefix = '', actions = ['fly']}]\n")
    argv = ["--listen", "0.0.0.0:1", "--tls-cert", str(cert_path), "--tls-key", str(key_path)]
    args, _ = resolve([*argv, "--auth-file", str(policy)])
    with pytest.raises(config.ConfigError, match="unknown action 'fly'"):
        config.server_options(args, [args.listen])
    policy.write_text("[principals.a]\nallow = [{prefix = '', actions = ['*']}]\n")
    options = config.server_options(args, [args.listen])
    assert options.tls is not None
    assert options.auth is not None
    assert options.auth_policy is options.auth


def test_check_config_prints_sources_and_exits(capsys: pytest.CaptureFixture[str]) -> None:
    assert lease_main.main(["--check-config", "--metrics-port", "9100"]) == 0
    out = capsys.readouterr().out
    assert "metrics_port = 9100  # flag --metrics-port" in out
    assert "configuration OK" in out
    with pytest.raises(SystemExit) as exit_:
        lease_main.main(["--check-config", "--backend", "ftp://nowhere"])
    assert exit_.value.code == 2
    assert "unsupported lease backend 'ftp://" in capsys.readouterr().err


def test_docs_configuration_table_is_fresh() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_config_docs.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_session_in_flight_cap_reaches_the_server_options() -> None:
    args, sources = resolve([], {"FENCING_SESSION_MAX_IN_FLIGHT": "32"})
    assert sources["session_max_in_flight"] == "env FENCING_SESSION_MAX_IN_FLIGHT"
    assert config.server_options(args, [args.listen]).session_max_in_flight == 32
    with pytest.raises(config.ConfigError, match="FENCING_SESSION_MAX_IN_FLIGHT"):
        resolve([], {"FENCING_SESSION_MAX_IN_FLIGHT": "0"})
