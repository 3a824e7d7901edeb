"""Who may do what: principals, their credentials, and permissions per resource prefix.

Pure rules, no I/O beyond reading the policy file; the server applies them at its
edge (:mod:`serving.admission`) to every call of every service.

**Authentication** names the caller's *principal*, from a bearer token
(``authorization: Bearer <token>`` metadata) or, with mTLS, from the client
certificate (a DNS/email/URI subject alternative name, or the subject CN).

**Authorization** allows an *action* on a *resource* if one of the principal's
grants covers both: its ``prefix`` is a prefix of the resource, and its ``actions``
contain the action (``"*"`` is every action)::

    # auth.toml: --auth-file auth.toml (FENCING_AUTH_FILE)
    [principals.billing]
    tokens = ["sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"]
    allow = [
      { prefix = "orders/", actions = ["acquire", "renew", "release", "describe", "watch"] },
      { prefix = "orders/", actions = ["write", "read"] },
    ]

    [principals.ops]
    tokens = ["a-plain-token-also-works"]
    identities = ["ops.internal.example.com"]   # mTLS clients with this SAN or CN
    allow = [{ prefix = "", actions = ["*"] }]

A certificate identity maps to the principal of the same name, or to the one that
lists it under ``identities``. Tokens may be stored as ``sha256:<hex>`` of the token
so the file holds no usable secret. Prefixes match by plain string comparison: end
them with your separator (``orders/``) so ``orders`` does not also grant ``orders-old``.

Actions, by method (``QueueService`` requests are scoped by their ``queue``):

============================  =========================================
action                        methods
============================  =========================================
``acquire`` ``renew``         LeaseService Acquire, Renew; AcquireMany, RenewMany (every
                              resource they name)
``release`` ``describe``      LeaseService Release, ReleaseMany; Describe, and List (a
                              ``prefix``: it needs a grant whose prefix is a prefix of
                              the requested one)
``watch``                     LeaseService Watch (a ``prefix`` request needs a grant
                              whose prefix is a prefix of the requested one)
(each call's own)             LeaseService Session: each call on the stream is judged
                              as its unary method (acquire, renew, release, their
                              batch forms); a refused one gets PERMISSION_DENIED as
                              its reply, the stream goes on
``write`` ``read`` ``fence``  GuardService Write, WriteMany (every resource of it),
                              WriteStream (each streamed write, judged on its own:
                              a write outside the grants gets PERMISSION_DENIED as
                              its verdict); Read, ListRecords, DescribeFence,
                              ListRefusals, DescribeGuard (on every resource); Fence
``enqueue`` ``claim``         QueueService Enqueue, PutSchedule, DeleteSchedule (by the
                              schedule's queue); Claim, Heartbeat, Complete, Fail, Release.
                              A job (or schedule) naming a ``resource`` also needs what a
                              lease on it needs, ``acquire`` ``renew`` ``release`` on that
                              resource: its claims hold that lease. A Claim's ``worker``
                              is the principal, as a lease's ``holder`` is
``describe``                  QueueService Stats, ListSchedules, ListJobs, GetJob
``manage``                    QueueService RetryJob, CancelJob, RequeueDead,
                              PauseQueue, ResumeQueue (an operator's
                              calls on jobs of the queue; a cancel also needs ``fence``
                              on the job's resource at a monotonic guard to fence it there)
``reset_fence``               GuardService ResetFence (an operator's recovery: it may
                              lower a fence); never part of ``"*"``, it must be named
============================  =========================================

``reset_fence`` is apart because it is the one call that can lower a fence: a
principal allowed ``write`` on a prefix must not be able to undo the fencing of its
own former holders. Grant it to operators only, per prefix like the rest::

    [principals.oncall]
    tokens = ["sha256:..."]
    allow = [{ prefix = "", actions = ["describe", "read", "reset_fence"] }]
"""

from __future__ import annotations

import dataclasses
import hashlib
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from fencing import limits
from fencing.errors import InvalidArgumentError


class Action(StrEnum):
    ACQUIRE = "acquire"
    RENEW = "renew"
    RELEASE = "release"
    DESCRIBE = "describe"
    WATCH = "watch"
    WRITE = "write"
    READ = "read"
    FENCE = "fence"
    ENQUEUE = "enqueue"
    CLAIM = "claim"
    MANAGE = "manage"
    RESET_FENCE = "reset_fence"


_LEASE = "/fencing.v1.LeaseService/"
_GUARD = "/fencing.v1.GuardService/"
_QUEUE = "/fencing.v1.QueueService/"

#: Full gRPC method name -> the action it performs. A method of ours missing here is
#: refused (fail closed): add new methods to this table.
METHOD_ACTIONS: dict[str, Action] = {
    _LEASE + "Acquire": Action.ACQUIRE,
    _LEASE + "Renew": Action.RENEW,
    _LEASE + "Release": Action.RELEASE,
    _LEASE + "Describe": Action.DESCRIBE,
    _LEASE + "Watch": Action.WATCH,
    _LEASE + "List": Action.DESCRIBE,
    _LEASE + "AcquireMany": Action.ACQUIRE,
    _LEASE + "RenewMany": Action.RENEW,
    _LEASE + "ReleaseMany": Action.RELEASE,
    # Only authenticated at the edge (PER_ITEM_METHODS): each call it carries is
    # authorized as its unary method is, by that method's action.
    _LEASE + "Session": Action.ACQUIRE,
    _GUARD + "Write": Action.WRITE,
    _GUARD + "WriteMany": Action.WRITE,
    _GUARD + "WriteStream": Action.WRITE,
    _GUARD + "Read": Action.READ,
    _GUARD + "ListRecords": Action.READ,
    _GUARD + "DescribeFence": Action.READ,
    _GUARD + "ListRefusals": Action.READ,
    _GUARD + "DescribeGuard": Action.READ,
    _GUARD + "Fence": Action.FENCE,
    _GUARD + "ResetFence": Action.RESET_FENCE,
    _QUEUE + "Enqueue": Action.ENQUEUE,
    _QUEUE + "Claim": Action.CLAIM,
    _QUEUE + "Heartbeat": Action.CLAIM,
    _QUEUE + "Complete": Action.CLAIM,
    _QUEUE + "Fail": Action.CLAIM,
    _QUEUE + "Release": Action.CLAIM,
    _QUEUE + "Stats": Action.DESCRIBE,
    _QUEUE + "PutSchedule": Action.ENQUEUE,
    _QUEUE + "DeleteSchedule": Action.ENQUEUE,
    _QUEUE + "ListSchedules": Action.DESCRIBE,
    _QUEUE + "ListJobs": Action.DESCRIBE,
    _QUEUE + "GetJob": Action.DESCRIBE,
    _QUEUE + "RetryJob": Action.MANAGE,
    _QUEUE + "CancelJob": Action.MANAGE,
    _QUEUE + "RequeueDead": Action.MANAGE,
    _QUEUE + "PauseQueue": Action.MANAGE,
    _QUEUE + "ResumeQueue": Action.MANAGE,
}

#: Methods anyone may call without credentials: probes and schema discovery.
EXEMPT_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


@dataclass(frozen=True)
class Scope:
    """What a request touches: one resource, or (``is_prefix``) every resource under a prefix."""

    name: str
    is_prefix: bool = False

    def __str__(self) -> str:
        return f"prefix {self.name!r}" if self.is_prefix else repr(self.name)


def scope_of(request: Any) -> Scope:
    """The scope of a request message: its ``resource``, else ``queue``, else ``prefix``.

    A message with none of these fields (a future method) gets the empty prefix, so
    only a grant on every resource allows it.
    """
    fields = request.DESCRIPTOR.fields_by_name
    for name in ("resource", "queue"):
        if name in fields and getattr(request, name):
            return Scope(getattr(request, name))
    if "prefix" in fields:
        return Scope(request.prefix, is_prefix=True)
    for name in ("resource", "queue"):
        if name in fields:
            return Scope(getattr(request, name))
    return Scope("", is_prefix=True)


#: Batch requests -> how to list the resources they name.
_BATCH_SCOPES: dict[str, Callable[[Any], list[str]]] = {
    "fencing.v1.WriteManyRequest": lambda r: [w.resource for w in r.writes],
    "fencing.v1.AcquireManyRequest": lambda r: list(r.resources),
    "fencing.v1.RenewManyRequest": lambda r: [i.resource for i in r.renewals],
    "fencing.v1.ReleaseManyRequest": lambda r: [i.resource for i in r.releases],
    "fencing.v1.PutScheduleRequest": lambda r: [r.schedule.queue],
}


def scopes_of(request: Any) -> list[Scope]:
    """Every scope a request touches: one per resource a batch request names (WriteMany,
    AcquireMany, RenewMany, ReleaseMany), else :func:`scope_of`'s one."""
    names = _BATCH_SCOPES.get(request.DESCRIPTOR.full_name)
    if names is not None:
        return [Scope(name) for name in names(request)] or [Scope("", is_prefix=True)]
    return [scope_of(request)]


#: What holding a lease on a resource takes: a job or schedule naming a ``resource``
#: needs these on it, since the job's claims hold that lease.
LEASE_ACTIONS = (Action.ACQUIRE, Action.RENEW, Action.RELEASE)

#: Requests that name resources for jobs -> those resources (each needs LEASE_ACTIONS).
_JOB_RESOURCES: dict[str, Callable[[Any], list[str]]] = {
    "fencing.v1.EnqueueRequest": lambda r: [j.resource for j in r.jobs if j.resource],
    "fencing.v1.PutScheduleRequest": lambda r: [r.schedule.resource] if r.schedule.resource else [],
}


def job_resources_of(request: Any) -> list[Scope]:
    """The resources a request's jobs will fence (Enqueue's jobs, PutSchedule's template):
    each is authorized for :data:`LEASE_ACTIONS`, beside the request's own action on its
    queue, so a principal allowed only a queue cannot reach another resource through it."""
    names = _JOB_RESOURCES.get(request.DESCRIPTOR.full_name)
    return [Scope(name) for name in dict.fromkeys(names(request))] if names else []


def bind_holder(request: Any, principal: str) -> None:
    """Set every ``holder`` the request carries (its own, and its items'), and a Claim's
    ``worker`` (the holder of the leases its jobs' claims take), to ``principal``."""
    fields = request.DESCRIPTOR.fields_by_name
    if "holder" in fields:
        request.holder = principal
    if "worker" in fields:
        request.worker = principal
    for name in ("renewals", "releases"):
        if name in fields:
            for item in getattr(request, name):
                item.holder = principal


#: Streaming methods whose messages carry many resources: the edge authenticates the
#: call, and the service authorizes each item (:func:`serving.admission.authorize_item`).
PER_ITEM_METHODS = frozenset({_GUARD + "WriteStream", _LEASE + "Session"})


@dataclass(frozen=True)
class Grant:
    """Allow ``actions`` on every resource whose name starts with ``prefix``."""

    prefix: str
    actions: frozenset[Action]

    def allows(self, action: Action, scope: Scope) -> bool:
        return action in self.actions and scope.name.startswith(self.prefix)


@dataclass(frozen=True)
class Principal:
    name: str
    grants: tuple[Grant, ...] = ()


#: What ``"*"`` grants: every action but ``reset_fence``, which must be named.
ALL_ACTIONS = frozenset(Action) - {Action.RESET_FENCE}
ALLOW_ALL = (Grant("", ALL_ACTIONS),)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass
class AuthPolicy:
    """Principals with their grants, and the credentials that name them.

    ``open_identities``: with mTLS and no policy file, every client whose
    certificate the CA signed is a principal (named by its first SAN, else its CN)
    allowed everything; see :meth:`mtls_only`.
    """

    principals: dict[str, Principal] = field(default_factory=dict)
    token_digests: dict[bytes, str] = field(default_factory=dict)
    identities: dict[str, str] = field(default_factory=dict)
    open_identities: bool = False

    @classmethod
    def mtls_only(cls) -> AuthPolicy:
        return cls(open_identities=True)

    @classmethod
    def load(cls, path: str | Path) -> AuthPolicy:
        """Read a policy file; ``ValueError`` naming the file and the bad key otherwise."""
        try:
            with Path(path).open("rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ValueError(f"auth file {path}: cannot read: {exc.strerror or exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"auth file {path}: not valid TOML: {exc}") from exc
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "auth policy") -> AuthPolicy:
        policy = cls()
        unknown = set(data) - {"principals"}
        if unknown:
            raise ValueError(
                f"{source}: unknown key {sorted(unknown)[0]!r} (expected [principals.NAME])"
            )
        principals = data.get("principals", {})
        if not isinstance(principals, dict):
            raise ValueError(f"{source}: 'principals' must be a table of [principals.NAME]")
        for name, spec in principals.items():
            policy._add(name, spec, f"{source}: principals.{name}")
        return policy

    def _add(self, name: str, spec: Any, where: str) -> None:
        try:
            limits.check_holder(name, "principal")
        except InvalidArgumentError as exc:
            # The principal becomes the lease holder, so it obeys the holder limits.
            raise ValueError(f"{where}: {exc}") from None
        if not isinstance(spec, dict):
            raise ValueError(f"{where}: must be a table")
        unknown = set(spec) - {"tokens", "identities", "allow"}
        if unknown:
            raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        for token in _strings(spec.get("tokens", []), f"{where}.tokens"):
            digest = _parse_token(token, f"{where}.tokens")
            if digest in self.token_digests:
                raise ValueError(f"{where}.tokens: a token is listed twice")
            self.token_digests[digest] = name
        for identity in _strings(spec.get("identities", []), f"{where}.identities"):
            self.identities[identity] = name
        grants = []
        allow = spec.get("allow", [])
        if not isinstance(allow, list):
            raise ValueError(f"{where}.allow: must be a list of {{prefix, actions}} tables")
        for i, item in enumerate(allow):
            grants.append(_parse_grant(item, f"{where}.allow[{i}]"))
        self.principals[name] = Principal(name, tuple(grants))

    def with_token_principal(self, name: str, token: str, grants: Sequence[Grant]) -> AuthPolicy:
        """A copy with one more principal, named by ``token`` and allowed ``grants``
        (a server's own in-process client: ``fencing serve``'s watch guard)."""
        copy = dataclasses.replace(
            self,
            principals=dict(self.principals),
            token_digests=dict(self.token_digests),
            identities=dict(self.identities),
        )
        copy.principals[name] = Principal(name, tuple(grants))
        copy.token_digests[_digest(token)] = name
        return copy

    # -- authentication ------------------------------------------------------------------

    def by_token(self, token: str) -> str | None:
        """The principal a bearer token names, or None.

        Tokens are kept and looked up as SHA-256 digests: the file and the process
        memory need not hold the token itself, and lookup timing says nothing about it.
        """
        return self.token_digests.get(_digest(token))

    def by_identities(self, identities: Sequence[str]) -> str | None:
        """The principal of a verified client certificate, from its SANs then its CN."""
        for identity in identities:
            if identity in self.identities:
                return self.identities[identity]
            if identity in self.principals:
                return identity
        if self.open_identities and identities:
            return identities[0]
        return None

    # -- authorization -------------------------------------------------------------------

    def allows(self, principal: str, action: Action, scope: Scope) -> bool:
        if self.open_identities and principal not in self.principals:
            # Any verified identity may do anything but reset a fence: that needs a
            # principal whose grants name it.
            return action is not Action.RESET_FENCE
        known = self.principals.get(principal)
        return known is not None and any(g.allows(action, scope) for g in known.grants)


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}: must be a list of non-empty strings")
    return list(value)


def _parse_token(token: str, where: str) -> bytes:
    if token.startswith("sha256:"):
        try:
            digest = bytes.fromhex(token.removeprefix("sha256:"))
        except ValueError:
            digest = b""
        if len(digest) != 32:
            raise ValueError(f"{where}: 'sha256:' must be followed by 64 hex digits")
        return digest
    return _digest(token)


def _parse_grant(item: Any, where: str) -> Grant:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: must be a table {{prefix = ..., actions = [...]}}")
    unknown = set(item) - {"prefix", "actions"}
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    prefix = item.get("prefix")
    if not isinstance(prefix, str):
        raise ValueError(f"{where}.prefix: required, a string ('' means every resource)")
    names = item.get("actions")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{where}.actions: required, a non-empty list of action names")
    return Grant(prefix, parse_actions(names, f"{where}.actions"))


def parse_actions(names: Iterable[str], where: str = "actions") -> frozenset[Action]:
    actions: set[Action] = set()
    for name in names:
        if name == "*":
            actions |= ALL_ACTIONS
            continue
        try:
            actions.add(Action(name))
        except ValueError:
            valid = ", ".join(a.value for a in Action)
            raise ValueError(f"{where}: unknown action {name!r} (one of {valid}, or *)") from None
    return frozenset(actions)


def bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    """The token of an ``authorization: Bearer <token>`` header, '' if malformed, None if absent."""
    for key, value in metadata:
        if key == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


def certificate_identities(auth_context: Mapping[str, Iterable[bytes]]) -> list[str]:
    """A verified TLS peer's names, most specific first: its SANs, then its subject CN."""
    if b"ssl" not in auth_context.get("transport_security_type", ()):
        return []
    names = [
        *auth_context.get("x509_subject_alternative_name", ()),
        *auth_context.get("x509_common_name", ()),
    ]
    seen: dict[str, None] = {}
    for raw in names:
        seen.setdefault(raw.decode(errors="replace"), None)
    return list(seen)


__all__ = [
    "ALL_ACTIONS",
    "EXEMPT_PREFIXES",
    "LEASE_ACTIONS",
    "METHOD_ACTIONS",
    "Action",
    "AuthPolicy",
    "Grant",
    "Principal",
    "Scope",
    "bearer_token",
    "certificate_identities",
    "parse_actions",
    "scope_of",
]
