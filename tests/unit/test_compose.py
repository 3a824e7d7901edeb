"""compose.yaml and the Dockerfile, checked against the real CLI (no Docker engine here).

Every server command in compose.yaml is run through its real entry point (found in
pyproject's ``[project.scripts]``) with ``--check-config`` and the service's
environment, so a renamed flag, a bad value or a plaintext listener without
``--insecure`` fails here; every healthcheck is parsed by the real ``fencing`` parser.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fencingctl import healthcheck
from fencingctl import parser as fencing_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
OURS = sorted(name for name, svc in SERVICES.items() if "build" in svc)
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
#: URL scheme -> the module of a backend still being written elsewhere: until it lands,
#: check-config may fail only by calling that scheme unsupported (then: xfail).
PENDING = {"postgres": "lease_server.backends.postgres"}


def entry_point(script: str) -> Callable[[list[str]], int]:
    module, _, function = SCRIPTS[script].partition(":")
    main: Callable[[list[str]], int] = getattr(importlib.import_module(module), function)
    return main


def flag_value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_the_topology() -> None:
    assert "version" not in COMPOSE  # obsolete in the Compose spec
    assert set(SERVICES) == {"postgres", "redis", "lease-server", "guard"}
    assert OURS == ["guard", "lease-server"]
    assert "pg_isready" in " ".join(SERVICES["postgres"]["healthcheck"]["test"])
    redis = SERVICES["redis"]["command"]
    assert flag_value(redis, "--appendonly") == "yes"
    assert flag_value(redis, "--appendfsync") == "always"
    assert flag_value(redis, "--maxmemory-policy") == "noeviction"
    assert SERVICES["lease-server"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert SERVICES["guard"]["depends_on"]["redis"]["condition"] == "service_healthy"
    backend = SERVICES["lease-server"]["environment"]["FENCING_BACKEND"]
    store = SERVICES["guard"]["environment"]["FENCING_STORE"]
    assert backend.startswith("postgres://") and "@postgres:5432/" in backend
    assert store.startswith("redis://redis:6379/")


@pytest.mark.parametrize("name", OURS)
def test_service_command_passes_the_real_cli(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    service = SERVICES[name]
    script, *argv = service["command"]
    assert script in SCRIPTS, f"{name}: {script} is not an installed command"
    for key in [k for k in os.environ if k.startswith("FENCING_")]:
        monkeypatch.delenv(key)
    for key, value in service.get("environment", {}).items():
        monkeypatch.setenv(key, str(value))
    try:
        code = entry_point(script)([*argv, "--check-config"])
    except SystemExit as exit_:
        err = capsys.readouterr().err
        found = re.search(r"unsupported \w+ (?:backend|store) '(\w+)", err)
        scheme = found.group(1) if found else ""
        if scheme in PENDING and importlib.util.find_spec(PENDING[scheme]) is None:
            pytest.xfail(f"{name}: the {scheme} backend is not merged yet: {err}")
        raise AssertionError(f"{name}: {script} {' '.join(argv)} failed: {err}") from exit_
    out = capsys.readouterr().out
    assert code == 0
    assert "configuration OK" in out
    # The drain must fit in Docker's grace before SIGKILL.
    grace = float(flag_value(argv, "--grace"))
    assert grace < float(service["stop_grace_period"].rstrip("s"))


@pytest.mark.parametrize("name", OURS)
def test_healthcheck_is_a_real_fencing_command_on_the_served_port(name: str) -> None:
    service = SERVICES[name]
    test = service["healthcheck"]["test"]
    assert test[:2] == ["CMD", "fencing"]
    args = fencing_parser().parse_args(test[2:])
    assert args.run is healthcheck.run
    served_port = flag_value(service["command"], "--listen").rsplit(":", 1)[1]
    assert args.addresses == [f"127.0.0.1:{served_port}"]
    assert args.service in ("fencing.v1.LeaseService", "fencing.v1.GuardService")
    published = [p.split(":")[-1] for p in service["ports"]]
    assert served_port in published


def test_dockerfile_is_multi_stage_non_root_without_build_tools() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]
    assert len(stages) >= 2, "multi-stage: a build stage and a runtime stage"
    final = stages[-1]
    users = re.findall(r"^USER (\S+)", final, flags=re.MULTILINE)
    assert users, "the runtime stage sets a USER"
    assert users[-1].split(":")[0] not in ("root", "0")
    for tool in ("gcc", "build-essential", "make", "apt-get install", "pip install"):
        assert tool not in final, f"the runtime stage installs {tool}"
    assert "COPY --from=build" in final
    command = re.search(r'^CMD \["(\S+?)"', final, flags=re.MULTILINE)
    assert command is not None
    assert command.group(1) in SCRIPTS
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in ignored
