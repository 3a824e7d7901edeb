"""Redis for the tests: the shared server, throwaway servers, and a throwaway cluster.

Where the tests find Redis, in order:

1. ``FENCING_TEST_REDIS_URL`` if set (it must answer);
2. the server at ``redis://127.0.0.1:6379/0`` if it answers;
3. a throwaway ``redis-server`` started for the session, if the binary exists.

With none of them, Redis tests skip, or fail when ``CI=true`` (a CI run must not
pass by skipping). Tests isolate themselves by key prefix, never by FLUSHDB.

Throwaway servers (:class:`RedisProcess`) and the 3-master cluster
(:class:`RedisCluster3`) run with persistence off on free loopback ports in temp
dirs; every start has its stop in a ``finally`` (fixtures below and the session
fixture :func:`redis_session`, which stops whatever the factories in
``tests/backends.py`` started lazily).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.ports import REDIS_CLUSTER_BUS_OFFSET, free_port

DEFAULT_URL = "redis://127.0.0.1:6379/0"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(why: str) -> None:
    """Skip the current test, or fail it under ``CI=true``."""
    if in_ci():
        pytest.fail(f"Redis is required under CI=true: {why}")
    pytest.skip(why)


def _ping(host: str, port: int, timeout: float = 0.5) -> bool:
    """A raw RESP PING: True if something at host:port answers +PONG (or -NOAUTH)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH"))


def unique_prefix() -> str:
    """A key prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


class RedisProcess:
    """One throwaway ``redis-server`` on a loopback port, persistence off unless asked.

    ``kill()`` is ``kill -9``; ``start()`` again brings it back on the same port,
    empty (nothing was persisted). Use as a context manager so it always stops.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        cluster: bool = False,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.port = port or free_port(also_offset=REDIS_CLUSTER_BUS_OFFSET if cluster else 0)
        self.cluster = cluster
        self.extra = extra
        self.dir = Path(tempfile.mkdtemp(prefix=f"redis-{self.port}-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        args = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.dir / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
            ]
        args += list(self.extra)
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server on {self.port} exited: {log}")
            if _ping("127.0.0.1", self.port, 0.2):
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server on {self.port} did not answer in {timeout} s")

    def kill(self) -> None:
        """``kill -9`` the server and reap it; nothing it held survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        self.kill()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class RedisCluster3:
    """A throwaway Redis Cluster of 3 masters and no replicas, on free loopback ports."""

    def __init__(self) -> None:
        self.nodes: list[RedisProcess] = []

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self, timeout: float = 30.0) -> None:
        try:
            for _ in range(3):
                node = RedisProcess(cluster=True)
                self.nodes.append(node)
                node.start()
            addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run(
                [
                    REDIS_CLI,
                    "--cluster",
                    "create",
                    *addresses,
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=timeout,
            )
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                if all(self._state_ok(n.port) for n in self.nodes):
                    return
                time.sleep(0.05)
            raise RuntimeError("cluster did not reach cluster_state:ok")
        except BaseException:
            self.cleanup()
            raise

    @staticmethod
    def _state_ok(port: int) -> bool:
        out = subprocess.run(
            [REDIS_CLI, "-p", str(port), "cluster", "info"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout
        return "cluster_state:ok" in out

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()
        self.nodes.clear()

    def __enter__(self) -> RedisCluster3:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class _Servers:
    """What the session uses, found or started lazily, stopped by :func:`redis_session`."""

    def __init__(self) -> None:
        self._url: str | None = None
        self._url_error: str | None = None
        self._own: RedisProcess | None = None
        self._cluster: RedisCluster3 | None = None
        self._cluster_error: str | None = None

    def standalone_url(self) -> str:
        """The Redis the tests share; skips (or fails under CI) if there is none."""
        if self._url is None and self._url_error is None:
            self._url, self._url_error = self._find()
        if self._url is None:
            unavailable(self._url_error or "no Redis")
        assert self._url is not None
        return self._url

    def _find(self) -> tuple[str | None, str | None]:
        from urllib.parse import urlsplit

        env = os.environ.get("FENCING_TEST_REDIS_URL")
        if env:
            parts = urlsplit(env)
            if _ping(parts.hostname or "127.0.0.1", parts.port or 6379, 2.0):
                return env, None
            return None, f"FENCING_TEST_REDIS_URL={env} does not answer"
        if _ping("127.0.0.1", 6379):
            return DEFAULT_URL, None
        if not Path(REDIS_SERVER).exists():
            return None, "no Redis at 127.0.0.1:6379 and no redis-server binary"
        self._own = RedisProcess()
        try:
            self._own.start()
        except RuntimeError as exc:
            self._own.cleanup()
            self._own = None
            return None, f"could not start a throwaway redis-server: {exc}"
        return self._own.url, None

    def cluster_url(self) -> str:
        """A 3-master cluster for the session, started on first use."""
        if self._cluster is None and self._cluster_error is None:
            if not Path(REDIS_SERVER).exists() or not Path(REDIS_CLI).exists():
                self._cluster_error = "redis-server / redis-cli not installed"
            else:
                cluster = RedisCluster3()
                try:
                    cluster.start()
                except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                    self._cluster_error = f"could not start a Redis cluster: {exc}"
                else:
                    self._cluster = cluster
        if self._cluster is None:
            unavailable(self._cluster_error or "no cluster")
        assert self._cluster is not None
        return self._cluster.url

    def stop_all(self) -> None:
        if self._cluster is not None:
            self._cluster.cleanup()
            self._cluster = None
        if self._own is not None:
            self._own.cleanup()
            self._own = None


SERVERS = _Servers()


@pytest.fixture(scope="session", autouse=True)
def redis_session() -> Iterator[None]:
    """Stops, at the end of the session, every server the tests started lazily."""
    try:
        yield
    finally:
        SERVERS.stop_all()


@pytest.fixture
def redis_url() -> str:
    return SERVERS.standalone_url()


@pytest.fixture
def redis_cluster_url() -> str:
    return SERVERS.cluster_url()


@pytest.fixture
def throwaway_redis() -> Iterator[RedisProcess]:
    """A private ``redis-server`` (persistence off) that the test may kill and restart."""
    if not Path(REDIS_SERVER).exists():
        unavailable("redis-server is not installed")
    with RedisProcess() as server:
        yield server


async def drop_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (a test's private key space)."""
    from serving import redis_db

    client = await redis_db.connect(redis_db.parse_url(url))
    try:
        for key in await redis_db.scan_keys(client, f"{redis_db.glob_escape(prefix)}:*"):
            await client.delete(key)  # one by one: a cluster refuses cross-slot DEL
    finally:
        await client.aclose()
