"""A job that names a ``resource`` shares that resource with its leases, on real
``python -m lease_server`` processes (SQLite and PostgreSQL), with auth on.

- One counter per resource: a claim of a job naming ``orders/1`` holds the lease on
  ``orders/1`` (its token comes from that resource's counter), so it never repeats a
  token a lease of ``orders/1`` got, and it waits while someone else holds the lease.
- The job's ``resource`` is authorized as the resource it is: enqueueing such a job
  (or putting such a schedule) needs what a lease on it needs, beside the queue's
  ``enqueue``; and a Claim's ``worker`` is the principal, as a lease's holder is.

Each safety test keeps its control: auth off, or a job of the queue's own resource.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencing import (
    InvalidArgumentError,
    LeaseClient,
    LeaseHeldError,
    PermissionDeniedError,
    QueueClient,
)
from tests.e2e.test_postgres_servers import SERVER_ARGS, lease_server_processes

pytestmark = pytest.mark.e2e

POLICY = """
[principals.alice]
tokens = ["alice-token"]
allow = [{ prefix = "orders/", actions = ["acquire", "renew", "release", "describe"] }]

# Allowed the queue only: it must not reach orders/ through a job's resource.
[principals.mq]
tokens = ["mq-token"]
allow = [{ prefix = "mq", actions = ["enqueue", "claim", "describe"] }]

# Allowed the queue and the leases of orders/: its jobs may fence orders/.
[principals.billing]
tokens = ["billing-token"]
allow = [
  { prefix = "mq", actions = ["enqueue", "claim", "describe"] },
  { prefix = "orders/", actions = ["acquire", "renew", "release", "describe"] },
]
"""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'leases.db'}"
    return str(request.getfixturevalue("postgres_url"))


@contextlib.contextmanager
def server(url: str, tmp_path: Path, *, auth: bool = True) -> Iterator[str]:
    """One lease-server process (hosting the queue) on ``url``; yields its address."""
    args: tuple[str, ...] = ()
    if auth:
        policy = tmp_path / "auth.toml"
        policy.write_text(POLICY)
        args = ("--auth-file", str(policy))
    command = ("-m", "lease_server", *SERVER_ARGS, *args)
    with lease_server_processes(url, 1, command) as ((address, _),):
        yield address


# -- the job's resource is authorized as the resource it is ---------------------------------


def test_enqueue_and_put_schedule_need_the_lease_actions_on_the_jobs_resource(
    backend_url: str, tmp_path: Path
) -> None:
    with server(backend_url, tmp_path) as address:
        with QueueClient(address, token="mq-token") as mq:
            with pytest.raises(PermissionDeniedError, match="orders/1"):
                mq.enqueue("mq", b"x", resource="orders/1")
            with pytest.raises(PermissionDeniedError, match="orders/1"):
                mq.put_schedule("s", "mq", every=60, resource="orders/1")
            # Control: the same principal's job of the queue's own resource is enqueued.
            assert mq.enqueue("mq", b"x").created
            assert mq.stats("mq")[0].ready == 1
        with QueueClient(address, token="billing-token") as billing:
            # Allowed the leases of orders/: its job may fence orders/1.
            assert billing.enqueue("mq", b"y", resource="orders/1").created
            assert billing.put_schedule("s", "mq", every=60, resource="orders/1").name == "s"


def test_a_claims_worker_is_the_principal(backend_url: str, tmp_path: Path) -> None:
    with (
        server(backend_url, tmp_path) as address,
        QueueClient(address, token="mq-token", worker="alice") as mq,
    ):
        job_id = mq.enqueue("mq", b"x").id
        (job,) = mq.claim("mq", ttl=30)
        assert job.id == job_id
        assert mq.get_job(job_id, queue="mq").lease_owner == "mq"


def test_control_without_auth_a_claims_worker_is_the_name_sent(
    backend_url: str, tmp_path: Path
) -> None:
    with (
        server(backend_url, tmp_path, auth=False) as address,
        QueueClient(address, worker="alice") as mq,
    ):
        job_id = mq.enqueue("mq", b"x").id
        mq.claim("mq", ttl=30)
        assert mq.get_job(job_id, queue="mq").lease_owner == "alice"


# -- one counter per resource: a job's claim holds the lease on its resource --------------


def test_a_job_naming_a_held_resource_is_not_claimed_and_its_claim_holds_the_lease(
    backend_url: str, tmp_path: Path
) -> None:
    with (
        server(backend_url, tmp_path) as address,
        LeaseClient(address, token="alice-token") as alice,
        QueueClient(address, token="billing-token") as billing,
    ):
        lease = alice.acquire("orders/1", ttl=30)
        job_id = billing.enqueue("mq", b"charge", resource="orders/1").id
        # Alice holds orders/1: the job is not claimed beside her (no token of hers again).
        assert billing.claim("mq", ttl=30) == []
        state = alice.describe("orders/1")
        assert (state.held, state.holder, state.token) == (True, "alice", lease.token)
        lease.release()
        (job,) = billing.claim("mq", ttl=30, wait=5)
        assert job.id == job_id
        assert job.token > lease.token
        # The claim holds the lease on orders/1, with the job's token, from its counter.
        state = alice.describe("orders/1")
        assert (state.held, state.holder, state.token) == (True, "billing", job.token)
        with pytest.raises(LeaseHeldError):
            alice.acquire_nowait("orders/1", ttl=30)
        billing.heartbeat(job)
        billing.complete(job)
        assert not alice.describe("orders/1").held
        after = alice.acquire_nowait("orders/1", ttl=30)
        assert after.token > job.token
        assert alice.describe("orders/1").last_token == after.token


def test_control_a_job_of_its_own_resource_is_claimed_while_orders_1_is_held(
    backend_url: str, tmp_path: Path
) -> None:
    """The same steps with a job of the queue's own resource (job/mq/<id>): claimed at once,
    its token the queue's; only a job naming orders/1 shares orders/1's lease and counter."""
    with (
        server(backend_url, tmp_path) as address,
        LeaseClient(address, token="alice-token") as alice,
        QueueClient(address, token="billing-token") as billing,
    ):
        lease = alice.acquire("orders/1", ttl=30)
        job_id = billing.enqueue("mq", b"charge").id
        (job,) = billing.claim("mq", ttl=30)
        assert (job.id, job.resource) == (job_id, f"job/mq/{job_id}")
        assert alice.describe("orders/1").token == lease.token
        billing.complete(job)


def test_a_rescue_takes_the_lease_over_and_a_cancel_fences_with_its_counter(
    backend_url: str, tmp_path: Path
) -> None:
    with (
        server(backend_url, tmp_path, auth=False) as address,
        LeaseClient(address, holder="alice") as alice,
        QueueClient(address, worker="crashed") as crashed,
        QueueClient(address, worker="rescuer") as rescuer,
    ):
        job_id = crashed.enqueue("mq", b"charge", resource="orders/1").id
        (first,) = crashed.claim("mq", ttl=0.3)
        # The crashed worker never heartbeats: its claim, and the lease it holds, expire.
        (second,) = rescuer.claim("mq", ttl=30, wait=5)
        assert second.id == job_id and second.token > first.token
        state = alice.describe("orders/1")
        assert (state.holder, state.token) == ("rescuer", second.token)
        assert crashed.heartbeat(first) == [first]  # refused: its lease is lost
        # A cancel releases the claim's lease and fences with a token of orders/1's counter.
        action = rescuer.cancel_job(job_id, queue="mq")
        assert action.changed and action.resource == "orders/1"
        assert action.fence_token > second.token
        state = alice.describe("orders/1")
        assert not state.held and state.last_token == action.fence_token
        assert rescuer.heartbeat(second) == [second]
        assert alice.acquire_nowait("orders/1", ttl=30).token > action.fence_token


def test_a_jobs_default_resource_is_not_leased_beside_its_claims(
    backend_url: str, tmp_path: Path
) -> None:
    """job/<queue>/<id> has its tokens from the queue's claims alone: a lease on it would
    repeat them, so no server leases it, by name or in a batch: neither the one hosting
    the queue nor one started without it on the same lease backend."""
    plain = ("-m", "lease_server", *SERVER_ARGS, "--queue", "off")
    with (
        server(backend_url, tmp_path, auth=False) as address,
        lease_server_processes(backend_url, 1, plain) as ((other, _),),
        LeaseClient(address, holder="alice") as alice,
        LeaseClient(other, holder="bob") as bob,
        QueueClient(address) as queue,
    ):
        job_id = queue.enqueue("mq", b"x").id
        (job,) = queue.claim("mq", ttl=30)
        for client in (alice, bob):
            with pytest.raises(InvalidArgumentError, match="resource"):
                client.acquire_nowait(f"job/mq/{job_id}", ttl=30)
            with pytest.raises(InvalidArgumentError, match=r"resources\[1\]"):
                client.acquire_many(["orders/2", f"job/mq/{job_id}"], ttl=30)
        assert alice.describe(f"job/mq/{job_id}").last_token == job.token


def test_control_a_server_without_the_queue_leasing_job_names_repeats_a_claims_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule off (job names not recognised): a server without the queue, sharing the
    lease backend, hands out the token a job's claim holds: two owners of token 1."""
    from fencing.testing import running_servers
    from lease_server import service

    url = f"sqlite:///{tmp_path / 'leases.db'}"
    monkeypatch.setattr(service, "parse_default_resource", lambda resource: None)
    with (
        running_servers(url) as hosting,
        running_servers(url, queue="off") as plain,
        LeaseClient(plain.lease_address, holder="bob") as bob,
        QueueClient(hosting.queue_address) as queue,
    ):
        job_id = queue.enqueue("mq", b"x").id
        (job,) = queue.claim("mq", ttl=30)
        lease = bob.acquire_nowait(f"job/mq/{job_id}", ttl=30)
        assert lease.token == job.token
