"""The store seam from outside: the shipped suite fails the broken stores (its control),
and a store package built and installed in a temporary directory is found by its URL
scheme (by the suite, and by a real ``fencing-guard`` process) and passes the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from fencing.client.guard import GuardClient
from fencing.errors import StaleTokenError
from fencing.types import Record
from serving import exits
from tests.waiting import HANG_GUARD

ROOT = Path(__file__).resolve().parents[2]


def _env(*paths: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in paths), str(ROOT)])
    return env


def run_suite(tmp_path: Path, source: str, *paths: Path) -> dict[str, dict[str, bool]]:
    """Run a test file subclassing the shipped suite in its own pytest process (as a
    store's authors would); class -> case -> passed (skipped cases count as passed)."""
    test_file = tmp_path / "test_my_store.py"
    test_file.write_text(textwrap.dedent(source))
    report = tmp_path / "report.xml"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)),
            *(f"--junitxml={report}", "-o", "junit_family=xunit2"),
        ],
        cwd=tmp_path,
        env=_env(*paths),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.exists(), done.stdout + done.stderr
    outcomes: dict[str, dict[str, bool]] = {}
    for case in ET.parse(report).iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes.setdefault(cls, {})[case.get("name", "")] = not failed
    assert outcomes, done.stdout + done.stderr
    return outcomes


def test_the_suite_fails_the_broken_stores_and_passes_the_honest_one(tmp_path: Path) -> None:
    results = run_suite(
        tmp_path,
        """
        import pytest
        from fencing.testing.stores import GuardStoreContract
        from guard.stores import register_store
        from guard.stores.memory import MemoryStore
        from tests.broken_stores import UnfencedStore, UnlockedStore

        register_store("broken-unlocked", lambda url: UnlockedStore())
        register_store("broken-unfenced", lambda url: UnfencedStore())
        register_store("honest", lambda url: MemoryStore())

        class TestUnlocked(GuardStoreContract):
            shared_storage = False
            @pytest.fixture
            def store_url(self):
                return "broken-unlocked://"

        class TestUnfenced(GuardStoreContract):
            shared_storage = False
            @pytest.fixture
            def store_url(self):
                return "broken-unfenced://"

        class TestHonest(GuardStoreContract):
            shared_storage = False
            @pytest.fixture
            def store_url(self):
                return "honest://"
        """,
    )
    # The control: the same harness passes an honest store, every case.
    assert all(results["TestHonest"].values()), results["TestHonest"]
    # The fence checked outside the write: its single-writer cases pass, and only the
    # concurrent writers catch it.
    unlocked = results["TestUnlocked"]
    assert not unlocked["test_concurrent_writers_on_one_connection"]
    assert unlocked["test_stale_write_is_rejected_and_applies_nothing"]
    # No fence at all: every stale-token case catches it.
    unfenced = results["TestUnfenced"]
    for case in (
        "test_stale_write_is_rejected_and_applies_nothing",
        "test_a_stale_token_is_refused_even_when_its_key_is_known",
        "test_fence_advances_never_lowers_and_is_idempotent",
        "test_concurrent_writers_on_one_connection",
    ):
        assert not unfenced[case], case


#: A store package as its authors would publish it: its own distribution, registering its
#: scheme in the entry-point group, built on the public seam (here: SQLite under a new name).
PACKAGE = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "fencing-store-demo"
        version = "0.1.0"

        [project.entry-points."fencing.guard_stores"]
        demo = "fencing_store_demo:open_demo"
        """,
    "fencing_store_demo/__init__.py": '''
        """demo:///path/to/file.db: a fenced store from outside the fencing-guard tree."""
        from pathlib import Path
        from urllib.parse import urlsplit

        from guard.stores.sqlite import SQLiteStore


        class DemoStore(SQLiteStore):
            name = "demo"
            api_version = 1


        def open_demo(url: str) -> DemoStore:
            return DemoStore(Path(urlsplit(url).path))
        ''',
}


@pytest.fixture(scope="module")
def demo_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo package, pip-installed into a directory of its own (never into the
    environment other tests share)."""
    root = tmp_path_factory.mktemp("demo")
    for name, text in PACKAGE.items():
        (root / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / name).write_text(textwrap.dedent(text))
    site = root / "site"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"),
            *("--no-index", "--target", str(site), str(root / "src")),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert list(site.glob("fencing_store_demo-0.1.0.dist-info/entry_points.txt"))
    return site


def test_an_installed_store_package_passes_the_shipped_suite(
    demo_site: Path, tmp_path: Path
) -> None:
    results = run_suite(
        tmp_path,
        """
        import pytest
        from fencing.testing.stores import GuardStoreContract

        class TestDemoStore(GuardStoreContract):
            @pytest.fixture
            def store_url(self, tmp_path):
                return f"demo://{tmp_path}/fences.db"
        """,
        demo_site,
    )
    demo = results["TestDemoStore"]
    assert all(demo.values()), demo
    # The processes found the package by its scheme too.
    assert "test_concurrent_writers_across_processes" in demo


@dataclass(frozen=True)
class Held:
    resource: str
    token: int


def test_the_guard_finds_an_installed_store_by_scheme(demo_site: Path, tmp_path: Path) -> None:
    env = _env(demo_site)
    unknown = subprocess.run(
        [sys.executable, "-m", "guard", "--store", "nope://x", "--listen", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert unknown.returncode == exits.USAGE == 2, unknown.stderr
    assert "nope://" in unknown.stderr and "demo://" in unknown.stderr, unknown.stderr

    db = tmp_path / "guard.db"
    guard = subprocess.Popen(
        [sys.executable, "-m", "guard", "--store", f"demo://{db}", "--listen", "127.0.0.1:0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert guard.stdout is not None
        deadline = time.monotonic() + HANG_GUARD
        line = ""
        while "listening on" not in line and time.monotonic() < deadline:
            line = guard.stdout.readline()
            assert line, "the guard exited before listening"
        assert "(store demo," in line, line
        address = line.split("listening on ")[1].split()[0]
        client = GuardClient(address)
        try:
            assert client.put(Held("r", 5), "k", b"new") == 5
            with pytest.raises(StaleTokenError):
                client.put(Held("r", 4), "k", b"late")
            assert client.read("r", "k") == Record(b"new", 5)
        finally:
            client.close()
    finally:
        guard.terminate()
        guard.wait(timeout=HANG_GUARD)
        if guard.stdout is not None:
            guard.stdout.close()
    assert db.exists()  # the guard wrote through the package's store
