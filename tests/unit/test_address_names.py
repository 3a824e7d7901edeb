"""One name per address: clients connect to ``--lease-addr`` / ``--guard-addr``
(``FENCING_LEASE_ADDR`` / ``FENCING_GUARD_ADDR``), servers bind ``--listen`` /
``--lease-listen`` / ``--guard-listen`` (``FENCING_*_LISTEN``). The former names keep
working for one release, each with a deprecation warning on stderr."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fencingctl import parser as fencing_parser
from fencingctl import serve
from guard import __main__ as guard_main
from lease_server import __main__ as lease_main
from serving import config

SERVER_COMMANDS = {
    "lease-server": lease_main.OPTIONS,
    "fencing-guard": guard_main.OPTIONS,
    "fencing serve": serve.OPTIONS,
}


def subparsers(
    p: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> dict[str, argparse.ArgumentParser]:
    """Every leaf command of ``p``, by its words."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.update(subparsers(child, (*path, name)))
    if not found and path:
        found[" ".join(path)] = p
    return found


def flags_of(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions if a.help is not argparse.SUPPRESS for s in a.option_strings}


def test_every_client_command_names_its_addresses_the_same_way() -> None:
    commands = subparsers(fencing_parser())
    connecting = {name: flags_of(p) for name, p in commands.items() if "--tls-ca" in flags_of(p)}
    assert {"lease acquire", "put", "queue stats", "outbox run", "fence"} <= set(connecting)
    for name, flags in connecting.items():
        addresses = {f for f in flags if f.endswith(("-addr", "-server")) or f == "--addr"}
        assert addresses <= {"--lease-addr", "--guard-addr"}, (name, addresses)


def test_servers_bind_with_listen_variables_distinct_from_the_client_ones() -> None:
    for command, options in SERVER_COMMANDS.items():
        binds = [o for o in options if o.key.endswith("listen")]
        assert binds, command
        for option in binds:
            assert option.env.endswith("_LISTEN"), (command, option.env)
            assert option.flag.endswith("listen")
        for option in options:
            if option.env.endswith("_ADDR"):
                assert not option.key.endswith("listen"), (command, option.key)
    lease_binds = {
        o.env
        for opts in SERVER_COMMANDS.values()
        for o in opts
        if o.key in ("listen", "lease_listen")
    }
    # The lease server binds from the same variable whichever command runs it.
    assert "FENCING_LEASE_LISTEN" in lease_binds and "FENCING_LISTEN" not in lease_binds


def serve_args(
    argv: list[str], env: dict[str, str], toml: Path | None = None
) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    config.add_options(p, serve.OPTIONS)
    args = p.parse_args([*argv, *(["--config", str(toml)] if toml else [])])
    config.resolve(args, serve.OPTIONS, env)
    return args


def test_serve_takes_its_former_flags_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    args = serve_args(["--lease-addr", "127.0.0.1:7001", "--guard-addr", "127.0.0.1:7002"], {})
    assert (args.lease_listen, args.guard_listen) == ("127.0.0.1:7001", "127.0.0.1:7002")
    err = capsys.readouterr().err
    assert "--lease-addr is deprecated" in err and "use --lease-listen" in err
    assert "--guard-addr is deprecated" in err and "use --guard-listen" in err
    args = serve_args(["--lease-listen", "127.0.0.1:7003"], {})
    assert args.lease_listen == "127.0.0.1:7003"
    assert capsys.readouterr().err == ""


def test_serve_ignores_the_clients_variables(capsys: pytest.CaptureFixture[str]) -> None:
    """FENCING_LEASE_ADDR / FENCING_GUARD_ADDR are where the CLI connects: exported for
    it, they neither move what ``fencing serve`` binds nor draw a warning."""
    clients = {"FENCING_LEASE_ADDR": "127.0.0.1:7011", "FENCING_GUARD_ADDR": "127.0.0.1:7012"}
    args = serve_args([], clients)
    assert (args.lease_listen, args.guard_listen) == ("127.0.0.1:50051", "127.0.0.1:50052")
    assert capsys.readouterr().err == ""
    both = {**clients, "FENCING_LEASE_LISTEN": "127.0.0.1:7013"}
    assert serve_args([], both).lease_listen == "127.0.0.1:7013"
    assert capsys.readouterr().err == ""


def test_serve_reads_a_former_toml_key_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "serve.toml"
    toml.write_text('guard_addr = "127.0.0.1:7021"\n')
    assert serve_args([], {}, toml).guard_listen == "127.0.0.1:7021"
    assert "guard_addr is deprecated" in capsys.readouterr().err


def test_lease_server_reads_fencing_listen_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = lease_main.parser().parse_args([])
    config.resolve(args, lease_main.OPTIONS, {"FENCING_LISTEN": "127.0.0.1:7031"})
    assert args.listen == "127.0.0.1:7031"
    assert (
        "FENCING_LISTEN is deprecated; use FENCING_LEASE_LISTEN"
        in capsys.readouterr().err.replace(" and goes in the next release", "")
    )


def test_guard_follows_lease_addr_and_takes_lease_server_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = guard_main.parser().parse_args(["--lease-server", "127.0.0.1:7041"])
    config.resolve(args, guard_main.OPTIONS, {})
    assert args.lease_addr == "127.0.0.1:7041"
    assert "--lease-server is deprecated" in capsys.readouterr().err
    args = guard_main.parser().parse_args([])
    config.resolve(args, guard_main.OPTIONS, {"FENCING_LEASE_SERVER": "127.0.0.1:7042"})
    assert args.lease_addr == "127.0.0.1:7042"
    assert "FENCING_LEASE_SERVER is deprecated" in capsys.readouterr().err


def test_queue_commands_take_addr_and_fencing_queue_addr_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FENCING_LEASE_ADDR", raising=False)
    monkeypatch.delenv("FENCING_QUEUE_ADDR", raising=False)
    p = fencing_parser()
    assert p.parse_args(["queue", "stats"]).lease_addr == "127.0.0.1:50051"
    assert capsys.readouterr().err == ""
    args = p.parse_args(["queue", "stats", "--addr", "127.0.0.1:7051"])
    assert args.lease_addr == "127.0.0.1:7051"
    assert "--addr is deprecated" in capsys.readouterr().err
    args = p.parse_args(["outbox", "run", "--addr", "127.0.0.1:7052"])
    assert args.lease_addr == "127.0.0.1:7052"
    assert "use --lease-addr" in capsys.readouterr().err
    monkeypatch.setenv("FENCING_QUEUE_ADDR", "127.0.0.1:7053")
    assert p.parse_args(["queue", "stats"]).lease_addr == "127.0.0.1:7053"
    assert "FENCING_QUEUE_ADDR is deprecated" in capsys.readouterr().err
    monkeypatch.setenv("FENCING_LEASE_ADDR", "127.0.0.1:7054")
    assert p.parse_args(["queue", "enqueue", "q", "x"]).lease_addr == "127.0.0.1:7054"
    assert p.parse_args(["lease", "describe", "r"]).lease_addr == "127.0.0.1:7054"
    assert p.parse_args(["lease", "describe", "r", "--lease-addr", "h:1"]).lease_addr == "h:1"
    assert capsys.readouterr().err == ""
