"""A cancel fences the running job's claim, in every fence mode where the guard can know.

Worker A, a real process (``python -m tests.e2e.queue_worker``), claims a job and writes
its result through the guard while the claim is live; it is frozen with SIGSTOP, an
operator cancels the job with ``fencing queue cancel`` (a separate process), and A
resumes (SIGCONT) and writes again with its old claim, then sends Complete. Per mode:

- ``monotonic``, the cancel without the fence step: the late write LANDS (the control:
  the guard has seen no token newer than A's);
- ``monotonic`` with ``--guard-addr``: the CLI fences the guard to the cancel's token,
  and the late write is refused at that fence;
- ``watch``: the cancel is the claim's EXPIRED event of the lease log the guard follows;
  the guard fences past A's token by itself;
- ``strict``: the write's own transaction finds no live claim (LEASE_LOST).

In every mode the queue refuses A's Complete: the cancel took the job's token. Backends:
SQLite (jobs in the file beside the leases) and PostgreSQL (one schema); strict needs
PostgreSQL.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest

from fencing import GuardClient, QueueClient
from tests.e2e.test_job_modes import (  # noqa: F401  (fixture)
    HANG_GUARD,
    ServersFactory,
    make_servers,
    wait_for_fence,
)
from tests.e2e.test_queue_workers import WorkerProc, spawn  # noqa: F401  (fixture)
from tests.integration.test_cli_lock import env

pytestmark = pytest.mark.e2e

QUEUE = "refunds"

ROWS = [
    pytest.param("sqlite", "monotonic", False, id="sqlite-monotonic-control"),
    pytest.param("sqlite", "monotonic", True, id="sqlite-monotonic-fenced"),
    pytest.param("sqlite", "watch", False, id="sqlite-watch"),
    pytest.param(
        "postgres", "monotonic", False, id="postgres-monotonic-control", marks=pytest.mark.postgres
    ),
    pytest.param(
        "postgres", "monotonic", True, id="postgres-monotonic-fenced", marks=pytest.mark.postgres
    ),
    pytest.param("postgres", "watch", False, id="postgres-watch", marks=pytest.mark.postgres),
    pytest.param("postgres", "strict", False, id="postgres-strict", marks=pytest.mark.postgres),
]


@pytest.mark.parametrize(("kind", "mode", "fence_step"), ROWS)
def test_a_cancelled_jobs_paused_worker_is_refused_after_it_resumes(
    make_servers: ServersFactory,  # noqa: F811
    spawn: Callable[..., WorkerProc],  # noqa: F811
    kind: str,
    mode: str,
    fence_step: bool,
) -> None:
    with (
        make_servers(kind, mode) as servers,
        QueueClient(servers.queue_address) as queue,
        GuardClient(servers.guard_address) as guard,
    ):
        job_id = queue.enqueue(QUEUE, "refund order 9").id
        a = spawn(
            "--addr", servers.queue_address, "--guard", servers.guard_address,
            "--queue", QUEUE, "--handler", "late", "--early", "--work", "2", "--ttl", "30",
        )  # fmt: skip
        early = a.next("early", timeout=HANG_GUARD)
        assert early["job"] == job_id and early["outcome"] == "landed", early
        resource = f"job/{QUEUE}/{job_id}"
        a.signal(signal.SIGSTOP)  # no heartbeat, no write, until the cancel is done
        fence = ("--guard-addr", servers.guard_address) if fence_step else ()
        done = subprocess.run(
            [
                *(sys.executable, "-m", "fencingctl", "queue", "cancel", str(job_id)),
                *("--queue", QUEUE, "--lease-addr", servers.lease_address, "--json"),
                *fence,
            ],
            env=env(),
            capture_output=True,
            text=True,
            timeout=HANG_GUARD,
        )
        assert done.returncode == 0, done.stderr
        cancel = json.loads(done.stdout)
        assert cancel["changed"] and cancel["fence_token"] > early["token"], cancel
        if mode == "watch":  # the window is the event's delivery: wait for it
            wait_for_fence(guard, resource, early["token"] + 1)
        a.signal(signal.SIGCONT)
        late = a.next("effect", timeout=HANG_GUARD)
        a.next("end", timeout=HANG_GUARD)
        a.signal(signal.SIGTERM)
        counts = a.next("exit", timeout=HANG_GUARD)["counts"]
        record = guard.read(resource, "result")
        assert queue.get_job(job_id).state == "cancelled"
    assert counts.get("completed", 0) == 0 and counts.get("refused", 0) == 1, counts
    assert record is not None
    if mode == "monotonic" and not fence_step:  # the control: the late write lands
        assert late["outcome"] == "landed", late
        assert (record.value, record.written_by_token) == (
            f"late:{early['token']}".encode(),
            early["token"],
        )
        return
    assert late["outcome"] == "rejected", late
    if mode == "strict":
        assert late["error"] == "LeaseLost", late  # no live claim in the write's transaction
    elif mode == "watch":
        assert late["error"] == "StaleTokenError" and late["fence"] > early["token"], late
    else:
        assert (late["error"], late["fence"]) == ("StaleTokenError", cancel["fence_token"]), late
    assert (record.value, record.written_by_token) == (  # nothing of the late write landed
        f"early:{early['token']}".encode(),
        early["token"],
    )
