"""The auth policy: parsing with named errors, token and certificate lookup, prefix grants."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fencing.v1 import guard_pb2, lease_pb2
from serving.auth import (
    ALL_ACTIONS,
    METHOD_ACTIONS,
    Action,
    AuthPolicy,
    Scope,
    bearer_token,
    certificate_identities,
    scope_of,
)

POLICY = f"""
[principals.billing]
tokens = ["billing-token", "sha256:{hashlib.sha256(b"hashed-token").hexdigest()}"]
allow = [
  {{ prefix = "orders/", actions = ["acquire", "renew", "release", "describe", "watch"] }},
  {{ prefix = "orders/", actions = ["read"] }},
]

[principals.ops]
identities = ["ops.internal.example.com"]
allow = [{{ prefix = "", actions = ["*"] }}]
"""


@pytest.fixture
def policy(tmp_path: Path) -> AuthPolicy:
    path = tmp_path / "auth.toml"
    path.write_text(POLICY)
    return AuthPolicy.load(path)


def test_tokens_name_principals_plain_or_hashed(policy: AuthPolicy) -> None:
    assert policy.by_token("billing-token") == "billing"
    assert policy.by_token("hashed-token") == "billing"
    assert policy.by_token("sha256:" + hashlib.sha256(b"hashed-token").hexdigest()) is None
    assert policy.by_token("nope") is None


def test_certificate_identities_map_by_name_or_listed_identity(policy: AuthPolicy) -> None:
    assert policy.by_identities(["ops.internal.example.com", "ignored-cn"]) == "ops"
    assert policy.by_identities(["someone", "billing"]) == "billing"
    assert policy.by_identities(["stranger"]) is None
    assert policy.by_identities([]) is None


def test_grants_cover_prefix_and_action(policy: AuthPolicy) -> None:
    assert policy.allows("billing", Action.ACQUIRE, Scope("orders/42"))
    assert policy.allows("billing", Action.READ, Scope("orders/42"))
    assert not policy.allows("billing", Action.WRITE, Scope("orders/42"))
    assert not policy.allows("billing", Action.ACQUIRE, Scope("orders-old/1"))
    assert not policy.allows("billing", Action.ACQUIRE, Scope("payments/1"))
    # A prefix watch needs a grant whose prefix covers the requested prefix.
    assert policy.allows("billing", Action.WATCH, Scope("orders/eu/", is_prefix=True))
    assert not policy.allows("billing", Action.WATCH, Scope("", is_prefix=True))
    assert all(policy.allows("ops", a, Scope("anything")) for a in ALL_ACTIONS)
    assert not policy.allows("nobody", Action.READ, Scope("orders/1"))


def test_reset_fence_is_never_granted_by_a_wildcard(policy: AuthPolicy, tmp_path: Path) -> None:
    """The one call that can lower a fence is authorised apart: "*" (and mTLS alone)
    never grants it; a grant must name it, per prefix."""
    assert METHOD_ACTIONS["/fencing.v1.GuardService/ResetFence"] is Action.RESET_FENCE
    assert Action.RESET_FENCE not in ALL_ACTIONS
    assert not policy.allows("ops", Action.RESET_FENCE, Scope("anything"))
    assert not AuthPolicy.mtls_only().allows("x.example.com", Action.RESET_FENCE, Scope("r"))
    path = tmp_path / "ops.toml"
    path.write_text(
        '[principals.oncall]\ntokens = ["t"]\n'
        'allow = [{ prefix = "orders/", actions = ["reset_fence"] }]\n'
    )
    named = AuthPolicy.load(path)
    assert named.allows("oncall", Action.RESET_FENCE, Scope("orders/1"))
    assert not named.allows("oncall", Action.RESET_FENCE, Scope("billing/1"))
    assert not named.allows("oncall", Action.WRITE, Scope("orders/1"))


def test_mtls_only_allows_any_verified_identity() -> None:
    policy = AuthPolicy.mtls_only()
    assert policy.by_identities(["worker-1.example.com", "worker-1"]) == "worker-1.example.com"
    assert policy.allows("worker-1.example.com", Action.WRITE, Scope("x"))
    assert policy.by_token("anything") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[principal.x]\n", "unknown key 'principal'"),
        ("[principals.x]\ntoken = ['a']\n", "principals.x: unknown key 'token'"),
        (
            "[principals.x]\nallow = [{prefix = 'a', actions = ['acquire'], extra = 1}]\n",
            "principals.x.allow[0]: unknown key 'extra'",
        ),
        (
            "[principals.x]\nallow = [{prefix = 'a', actions = ['steal']}]\n",
            "unknown action 'steal'",
        ),
        ("[principals.x]\nallow = [{actions = ['read']}]\n", "principals.x.allow[0].prefix"),
        ("[principals.x]\ntokens = ['sha256:abc']\n", "64 hex digits"),
        ("[principals.x]\ntokens = ['t']\n[principals.y]\ntokens = ['t']\n", "listed twice"),
        ('[principals."bad\\u0001name"]\n', "control characters"),
        ("not toml = = 1", "not valid TOML"),
    ],
)
def test_bad_policies_fail_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"auth\.toml") as err:
        AuthPolicy.load(path)
    assert message in str(err.value)


def test_missing_policy_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        AuthPolicy.load(tmp_path / "absent.toml")


def test_scope_of_requests() -> None:
    assert scope_of(lease_pb2.AcquireRequest(resource="orders/1")) == Scope("orders/1")
    assert scope_of(guard_pb2.WriteRequest(resource="r")) == Scope("r")
    assert scope_of(lease_pb2.WatchRequest(resource="r")) == Scope("r")
    assert scope_of(lease_pb2.WatchRequest(prefix="orders/")) == Scope("orders/", is_prefix=True)
    assert scope_of(lease_pb2.WatchRequest()) == Scope("", is_prefix=True)


def test_every_method_of_our_services_has_an_action() -> None:
    for service in (lease_pb2.DESCRIPTOR.services_by_name, guard_pb2.DESCRIPTOR.services_by_name):
        for svc in service.values():
            for method in svc.methods:
                assert f"/{svc.full_name}/{method.name}" in METHOD_ACTIONS, method.full_name


def test_bearer_token_parsing() -> None:
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("x", "y"), ("authorization", "bearer  abc ")]) == "abc"
    assert bearer_token([("authorization", "Basic abc")]) == ""
    assert bearer_token([]) is None


def test_certificate_identities_only_from_tls_peers() -> None:
    ctx = {
        "transport_security_type": [b"ssl"],
        "x509_common_name": [b"alice"],
        "x509_subject_alternative_name": [b"alice.example.com", b"alice"],
    }
    assert certificate_identities(ctx) == ["alice.example.com", "alice"]
    assert certificate_identities({"transport_security_type": [b"insecure"]}) == []
