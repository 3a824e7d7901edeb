"""A ``fencing`` command imports what it uses: ``--version`` no gRPC, a client command
neither the servers nor the asyncio twins (each costs start-up time on every call).
Checked by the modules loaded, not by a clock."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
from fencingctl import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def loaded(*argv: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60
    )
    modules: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return set(modules)


def test_version_loads_no_grpc_and_no_command() -> None:
    modules = loaded("--version")
    assert not {"grpc", "fencing.client", "serving.exits", "fencingctl.serve"} & modules


def test_a_client_command_loads_neither_servers_nor_asyncio_twins() -> None:
    modules = loaded("lease", "describe", "r", "--lease-addr", "127.0.0.1:1")
    assert "fencing.client.lease" in modules  # the probe ran the command
    never = {
        "lease_server",
        "guard",
        "serving.config",
        "serving.server",
        "prometheus_client",
        "fencing.client.async_lease",
        "fencing.client.async_guard",
        "fencing.client.queue",
        "fencing.async_election",
        "fencingctl.serve",
        "fencingctl.queue",
    }
    assert not never & modules, sorted(never & modules)
