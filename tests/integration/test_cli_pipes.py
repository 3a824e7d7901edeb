"""A command piped into ``head`` (its reader gone) exits quietly, as the Python docs
recommend for SIGPIPE: no BrokenPipeError traceback, and no "Exception ignored" when
the interpreter flushes stdout on its way out."""

from __future__ import annotations

import os
import subprocess
import sys

from fencing import LeaseClient
from fencing.client.queue import QueueClient
from fencing.testing import RunningServers
from serving import exits


def with_reader_gone(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``fencing ARGV`` with stdout a pipe whose reading end is already closed, as
    ``| head`` leaves it once head has what it wanted."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "fencingctl", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)


def test_listing_commands_exit_quietly_when_the_reader_is_gone(servers: RunningServers) -> None:
    with LeaseClient(servers.lease_address) as leases:
        leases.acquire("pipes/a", ttl=30)
        leases.acquire("pipes/b", ttl=30)  # revision 2: what "watch --from 1" replays
    with QueueClient(servers.queue_address) as queue:
        queue.enqueue("pipes", b"x")
    for argv in (
        ["lease", "list", "--lease-addr", servers.lease_address],
        ["lease", "list", "--json", "--lease-addr", servers.lease_address],
        ["queue", "jobs", "pipes", "--json", "--lease-addr", servers.lease_address],
        ["queue", "jobs", "pipes", "--lease-addr", servers.lease_address],
        ["lease", "describe", "pipes/a", "--lease-addr", servers.lease_address],
        ["watch", "--from", "1", "--lease-addr", servers.lease_address],
    ):
        done = with_reader_gone(*argv)
        assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr, (
            argv,
            done.stderr,
        )
        assert done.stderr == "", (argv, done.stderr)
        assert done.returncode == exits.FAILURE, (argv, done.returncode)
