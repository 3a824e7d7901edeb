"""TLS, mTLS, bearer tokens and per-prefix permissions, over real gRPC with throw-away certs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import trustme
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from fencing import (
    BackendUnavailableError,
    Claim,
    GuardClient,
    InvalidArgumentError,
    LeaseClient,
    LeaseLost,
    PermissionDeniedError,
    Put,
    TLSConfig,
    UnauthenticatedError,
)
from fencing.testing import RunningServers, running_servers
from fencing.tls import is_local_target
from fencing.v1 import lease_pb2, lease_pb2_grpc
from lease_server.server import start_lease_server
from serving.auth import AuthPolicy
from serving.server import ServerOptions

POLICY = """
[principals.alice]
tokens = ["alice-token"]
allow = [
  { prefix = "orders/", actions = ["acquire", "renew", "release", "describe"] },
  { prefix = "orders/", actions = ["write", "read"] },
]

[principals.bob]
tokens = ["bob-token"]
allow = [{ prefix = "orders/", actions = ["acquire", "renew", "release", "describe", "read"] }]
"""


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_tls(ca: trustme.CA) -> TLSConfig:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    return TLSConfig(cert=cert.cert_chain_pems[0].bytes(), key=cert.private_key_pem.bytes())


def client_tls(ca: trustme.CA, *identities: str) -> TLSConfig:
    if not identities:
        return TLSConfig(ca=ca.cert_pem.bytes())
    cert = ca.issue_cert(*identities, common_name=identities[-1])
    return TLSConfig(
        ca=ca.cert_pem.bytes(),
        cert=cert.cert_chain_pems[0].bytes(),
        key=cert.private_key_pem.bytes(),
    )


@pytest.fixture
def policy(tmp_path: Path) -> AuthPolicy:
    path = tmp_path / "auth.toml"
    path.write_text(POLICY)
    return AuthPolicy.load(path)


@pytest.fixture
def token_servers(policy: AuthPolicy) -> Iterator[RunningServers]:
    with running_servers(options=ServerOptions(auth=policy)) as running:
        yield running


def test_tls_client_verifying_the_ca_works_and_plaintext_does_not(
    ca: trustme.CA, server_tls: TLSConfig
) -> None:
    with running_servers(options=ServerOptions(tls=server_tls)) as servers:
        with (
            LeaseClient(servers.lease_address, tls=client_tls(ca)) as leases,
            GuardClient(servers.guard_address, tls=client_tls(ca)) as guard,
        ):
            lease = leases.acquire("orders/1", ttl=5)
            assert guard.put(lease, "k", b"v") == lease.token
        with (
            LeaseClient(servers.lease_address, rpc_timeout=2) as plaintext,
            pytest.raises(BackendUnavailableError),
        ):
            plaintext.acquire_nowait("orders/1", ttl=5)


def test_mtls_names_the_holder_after_the_certificate(ca: trustme.CA, server_tls: TLSConfig) -> None:
    mtls = TLSConfig(cert=server_tls.cert, key=server_tls.key, ca=ca.cert_pem.bytes())
    with running_servers(options=ServerOptions(tls=mtls)) as servers:
        tls = client_tls(ca, "worker-1.example.com")
        with LeaseClient(servers.lease_address, tls=tls, holder="ignored") as leases:
            lease = leases.acquire("jobs/1", ttl=5)
            assert lease.holder == "worker-1.example.com"
            assert leases.describe("jobs/1").holder == "worker-1.example.com"
            lease.release()
        # Without a client certificate the handshake itself fails.
        with (
            LeaseClient(servers.lease_address, tls=client_tls(ca), rpc_timeout=2) as anon,
            pytest.raises(BackendUnavailableError),
        ):
            anon.acquire_nowait("jobs/1", ttl=5)


def test_mtls_identities_map_to_policy_principals(
    ca: trustme.CA, server_tls: TLSConfig, tmp_path: Path
) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(
        '[principals.billing]\nidentities = ["billing.svc"]\n'
        'allow = [{ prefix = "orders/", actions = ["acquire", "release"] }]\n'
    )
    mtls = TLSConfig(cert=server_tls.cert, key=server_tls.key, ca=ca.cert_pem.bytes())
    options = ServerOptions(tls=mtls, auth=AuthPolicy.load(path))
    with running_servers(options=options) as servers:
        with LeaseClient(servers.lease_address, tls=client_tls(ca, "billing.svc")) as billing:
            assert billing.acquire("orders/1", ttl=5).holder == "billing"
            with pytest.raises(PermissionDeniedError):
                billing.acquire("payments/1", ttl=5)
        with (
            LeaseClient(servers.lease_address, tls=client_tls(ca, "stranger.svc")) as other,
            pytest.raises(UnauthenticatedError, match=r"stranger\.svc"),
        ):
            other.acquire("orders/2", ttl=5)


def test_permitted_client_works_and_holds_as_its_principal(token_servers: RunningServers) -> None:
    with (
        LeaseClient(token_servers.lease_address, token="alice-token", holder="x") as leases,
        GuardClient(token_servers.guard_address, token="alice-token") as guard,
        leases.hold("orders/1", ttl=5) as lease,
    ):
        assert lease.holder == "alice"
        guard.put(lease, "total", b"42")
        record = guard.read("orders/1", "total")
        assert record is not None
        assert record.value == b"42"


def test_unauthenticated_clients_are_refused(token_servers: RunningServers) -> None:
    address = token_servers.lease_address
    with LeaseClient(address) as anon, pytest.raises(UnauthenticatedError, match="no credentials"):
        anon.acquire("orders/1", ttl=5)
    with (
        LeaseClient(address, token="wrong") as wrong,
        pytest.raises(UnauthenticatedError, match="unknown bearer token"),
    ):
        wrong.describe("orders/1")
    with GuardClient(token_servers.guard_address) as guard, pytest.raises(UnauthenticatedError):
        guard.read("orders/1", "k")


def test_status_carries_our_error_info_reason(token_servers: RunningServers) -> None:
    with grpc.insecure_channel(token_servers.lease_address) as channel:
        stub = lease_pb2_grpc.LeaseServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Describe(lease_pb2.DescribeRequest(resource="orders/1"), timeout=5)
        call: grpc.Call = err.value  # type: ignore[assignment]
        assert call.code() == grpc.StatusCode.UNAUTHENTICATED
        status = rpc_status.from_call(call)
        assert status is not None
        info = error_details_pb2.ErrorInfo()
        assert status.details[0].Unpack(info)
        assert (info.domain, info.reason) == ("fencing.v1", "UNAUTHENTICATED")


def test_client_without_the_prefix_permission_is_refused(token_servers: RunningServers) -> None:
    with (
        LeaseClient(token_servers.lease_address, token="alice-token") as alice,
        GuardClient(token_servers.guard_address, token="bob-token") as bob_guard,
    ):
        with pytest.raises(PermissionDeniedError, match="may not acquire 'payments/1'"):
            alice.acquire("payments/1", ttl=5)
        lease = alice.acquire("orders/9", ttl=5)
        # bob may read orders/ but not write them.
        with pytest.raises(PermissionDeniedError, match="may not write"):
            bob_guard.put(lease, "k", b"v")
        assert bob_guard.read("orders/9", "k") is None


def test_a_client_cannot_release_or_renew_another_principals_lease(
    token_servers: RunningServers,
) -> None:
    with (
        LeaseClient(token_servers.lease_address, token="alice-token") as alice,
        LeaseClient(token_servers.lease_address, token="bob-token", holder="alice") as bob,
    ):
        lease = alice.acquire("orders/1", ttl=30)
        # bob knows the token (and even claims to be alice): still not his lease.
        with pytest.raises(LeaseLost):
            bob.release("orders/1", lease.token)
        with pytest.raises(LeaseLost):
            bob.renew("orders/1", lease.token, ttl=30)
        state = bob.describe("orders/1")
        assert (state.held, state.holder, state.token) == (True, "alice", lease.token)
        lease.renew()
        lease.release()
        assert not alice.describe("orders/1").held


def test_health_needs_no_credentials(token_servers: RunningServers) -> None:
    with grpc.insecure_channel(token_servers.lease_address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="fencing.v1.LeaseService"), timeout=5
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_plaintext_on_a_non_loopback_address_needs_insecure() -> None:
    with pytest.raises(ValueError, match=r"refusing to serve plaintext on 0\.0\.0\.0:0"):
        await start_lease_server("memory://", "0.0.0.0:0")
    server = await start_lease_server(
        "memory://", "0.0.0.0:0", options=ServerOptions(insecure=True)
    )
    await server.stop(0)


def test_bearer_tokens_never_travel_in_the_clear_across_a_network() -> None:
    with pytest.raises(InvalidArgumentError, match="only sent over TLS"):
        LeaseClient("10.1.2.3:50051", token="secret")
    with pytest.raises(InvalidArgumentError, match="either credentials or tls"):
        GuardClient("127.0.0.1:1", token="t", credentials=grpc.local_channel_credentials())
    # A Unix socket is this host's alone (its directory's permissions guard it).
    LeaseClient("unix:/tmp/fencing-test-absent.sock", token="secret").close()
    assert is_local_target("unix:/run/x.sock") and is_local_target("[::1]:1")
    assert not is_local_target("10.1.2.3:1") and not is_local_target("unix.example:1")


def test_multi_resource_and_streamed_writes_are_authorized_per_resource(
    token_servers: RunningServers,
) -> None:
    """WriteMany needs a grant on every resource it names; a WriteStream judges each
    write on its own (a write outside the grants gets PERMISSION_DENIED as its verdict)."""
    with GuardClient(token_servers.guard_address, token="alice-token") as alice:
        result = alice.write_many(
            [(Claim("orders/1", 1), Put("k", b"v")), (Claim("orders/2", 1), Put("k", b"v"))]
        )
        assert result.fences == {"orders/1": 1, "orders/2": 1}
        with pytest.raises(PermissionDeniedError):
            alice.write_many(
                [(Claim("orders/3", 1), Put("k", b"v")), (Claim("billing/1", 1), Put("k", b"v"))]
            )
        assert alice.read("orders/3", "k") is None
        with alice.stream() as stream:
            allowed = stream.submit(Claim("orders/4", 1), Put("k", b"v"))
            denied = stream.submit(Claim("billing/2", 1), Put("k", b"v"))
            assert allowed.result(10).fence == 1
            with pytest.raises(PermissionDeniedError):
                denied.result(10)
    with (
        GuardClient(token_servers.guard_address, token="bob-token") as bob,
        bob.stream() as stream,
        pytest.raises(PermissionDeniedError),
    ):
        stream.write(Claim("orders/5", 1), Put("k", b"v"), timeout=10)
