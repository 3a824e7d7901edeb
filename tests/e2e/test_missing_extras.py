"""A backend whose extra is not installed is a settings error naming the pip command.

Real processes, each with the extra's driver made unimportable (``sys.modules[name] =
None``: its import raises ``ModuleNotFoundError`` as a missing package does): the
command prints one line naming ``pip install 'fencing-guard[EXTRA]'`` and exits 2, no
traceback. The control is the same command with the driver present, which gets past
the import (and is then stopped, or fails on something else).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from serving import exits

pytestmark = pytest.mark.e2e

PG = "postgresql://postgres@127.0.0.1:1/test"
REDIS = "redis://127.0.0.1:1/0"

#: (id, python -m argv, the extra, the driver module it hides)
CASES = [
    ("lease-server-postgres", ["lease_server", "--backend", PG], "postgres", "psycopg"),
    ("lease-server-redis", ["lease_server", "--backend", REDIS], "redis", "redis"),
    ("fencing-guard-postgres", ["guard", "--store", PG], "postgres", "psycopg"),
    ("fencing-guard-redis", ["guard", "--store", REDIS], "redis", "redis"),
    ("fencing-guard-pool", ["guard", "--store", PG], "postgres", "psycopg_pool"),
    ("serve-queue-postgres", ["fencingctl", "serve", "--queue", PG], "postgres", "psycopg"),
    ("migrate", ["fencingctl", "migrate", PG], "postgres", "psycopg"),
    UVLOOP := (
        "lease-server-uvloop",
        ["lease_server", "--backend", PG, "--event-loop", "uvloop"],
        "uvloop",
        "uvloop",
    ),
    ("serve-uvloop", ["fencingctl", "serve", "--event-loop", "uvloop"], "uvloop", "uvloop"),
]

RUN = (
    "import runpy, sys\n"
    "hidden, module, *argv = sys.argv[1:]\n"
    "if hidden:\n"
    "    sys.modules[hidden] = None\n"
    "sys.argv = [module, *argv]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)


def run(hidden: str, argv: list[str], tmp: str) -> subprocess.CompletedProcess[str]:
    listen = [] if argv[0] == "fencingctl" else ["--listen", "127.0.0.1:0"]
    if argv[:2] == ["fencingctl", "serve"]:
        listen = [
            "--data-dir",
            tmp,
            "--lease-listen",
            "127.0.0.1:0",
            "--guard-listen",
            "127.0.0.1:0",
        ]
    return subprocess.run(
        [sys.executable, "-c", RUN, hidden, *argv, *listen],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("argv", "extra", "module"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_missing_extra_names_the_pip_command(
    argv: list[str], extra: str, module: str, tmp_path: object
) -> None:
    done = run(module, argv, str(tmp_path))
    assert done.returncode == exits.USAGE, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if f"fencing-guard[{extra}]" in line]
    assert len(lines) == 1, done.stderr
    assert f"pip install 'fencing-guard[{extra}]'" in lines[0] and module in lines[0]


def test_the_control_gets_past_the_import(tmp_path: object) -> None:
    """The driver present: the same command fails on the closed port, not on an import."""
    for argv in (["guard", "--store", PG], UVLOOP[1]):
        done = run("", argv, str(tmp_path))
        assert done.returncode == exits.CODES["BACKEND_UNREACHABLE"], done.stderr
        assert "pip install" not in done.stderr
