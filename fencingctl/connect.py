"""How the client commands connect: the server addresses, TLS and bearer-token options.

One name per thing, in every command that connects somewhere:

=================  ======================  ===============================================
flag               variable                meaning
=================  ======================  ===============================================
``--lease-addr``   ``FENCING_LEASE_ADDR``  the lease server to connect to (it also hosts
                                           the queues); default ``127.0.0.1:50051``
``--guard-addr``   ``FENCING_GUARD_ADDR``  the guard to connect to; default
                                           ``127.0.0.1:50052``
=================  ======================  ===============================================

The servers *bind* with ``--listen`` (``lease-server``, ``fencing-guard``) or
``--lease-listen`` / ``--guard-listen`` (``fencing serve``), read from
``FENCING_LEASE_LISTEN`` / ``FENCING_GUARD_LISTEN``: a ``*_ADDR`` variable is always
where a client connects, a ``*_LISTEN`` one where a server binds.

The former names (``--addr`` and ``FENCING_QUEUE_ADDR`` of the queue commands) still
work for one release, with a deprecation warning on stderr.

The TLS variables mean what they mean for a server (``FENCING_TLS_CERT``/``KEY``: this
process's own certificate, ``FENCING_TLS_CA``: the CA of the peer's), so a command run
inside a server's container (``fencing healthcheck``) can reuse the server's settings
when one CA signs both sides.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fencing.tls import TLSConfig
from serving.flags import DeprecatedFlag, address_problem, warn_deprecated

if TYPE_CHECKING:  # imported by the functions that make one: a command pays for its own
    from fencing.client.guard import GuardClient
    from fencing.client.lease import LeaseClient
    from fencing.client.queue import QueueClient

LEASE_ADDR_ENV = "FENCING_LEASE_ADDR"
GUARD_ADDR_ENV = "FENCING_GUARD_ADDR"
DEFAULT_LEASE_ADDR = "127.0.0.1:50051"
DEFAULT_GUARD_ADDR = "127.0.0.1:50052"


def checker(default: str) -> Callable[..., str]:
    """An argparse ``type`` that checks a client address as the servers check their
    binds (``serving.config.address_problem``): a usage error with a hint at the likely
    mistake (``localhost`` without a port, a URL, ``:PORT``), instead of a call to a
    wrong target that fails as "unreachable". ``where`` prefixes the message (the
    variable the value came from)."""
    port = int(default.rpartition(":")[2])

    def checked(value: str, where: str = "") -> str:
        problem = address_problem(value.strip(), bind=False, port=port)
        if problem is None:
            return value.strip()
        raise argparse.ArgumentTypeError(f"{where}{problem}")

    checked.__name__ = "address"
    return checked


def _address(
    env: str, default: str, old_envs: Sequence[str], environ: Mapping[str, str] | None = None
) -> Callable[[str], str]:
    """An argparse ``type`` that turns the flag's unset marker ("") into the variable's
    value (or a former variable's, with a warning), else ``default``.

    argparse converts a string default through ``type`` only when the flag was not
    given, and only for the subcommand being run, so a deprecated variable warns
    exactly when it is what the command uses.
    """

    checked = checker(default)

    def convert(text: str) -> str:
        if text.strip():
            return checked(text.strip())
        source = os.environ if environ is None else environ
        value = source.get(env, "").strip()
        if value:
            return checked(value, f"{env}={value}: ")
        for old in old_envs:
            value = source.get(old, "").strip()
            if value:
                warn_deprecated(old, env)
                return checked(value, f"{old}={value}: ")
        return default

    convert.__name__ = "address"
    return convert


def _add_address(
    p: argparse.ArgumentParser,
    flag: str,
    env: str,
    default: str,
    help: str,
    old_flags: Sequence[str],
    old_envs: Sequence[str],
) -> None:
    dest = flag.removeprefix("--").replace("-", "_")
    formerly = ", ".join((*old_flags, *old_envs))
    p.add_argument(
        flag,
        dest=dest,
        default="",
        type=_address(env, default, old_envs),
        metavar="HOST:PORT",
        help=f"{help} (env {env}; default {default}"
        + (f"; formerly {formerly}, deprecated)" if formerly else ")"),
    )
    for old in old_flags:
        p.add_argument(
            old,
            dest=dest,
            metavar="HOST:PORT",
            type=checker(default),
            action=DeprecatedFlag,
            new=flag,
        )


def add_lease_address(
    p: argparse.ArgumentParser,
    help: str = "the lease server to connect to",
    *,
    old_flags: Sequence[str] = (),
    old_envs: Sequence[str] = (),
) -> None:
    """Add ``--lease-addr HOST:PORT`` (``args.lease_addr``; env ``FENCING_LEASE_ADDR``).

    ``old_flags`` / ``old_envs``: a command's former names for it, accepted with a
    deprecation warning.
    """
    _add_address(p, "--lease-addr", LEASE_ADDR_ENV, DEFAULT_LEASE_ADDR, help, old_flags, old_envs)


def add_guard_address(
    p: argparse.ArgumentParser,
    help: str = "the guard to connect to",
    *,
    old_flags: Sequence[str] = (),
    old_envs: Sequence[str] = (),
) -> None:
    """Add ``--guard-addr HOST:PORT`` (``args.guard_addr``; env ``FENCING_GUARD_ADDR``)."""
    _add_address(p, "--guard-addr", GUARD_ADDR_ENV, DEFAULT_GUARD_ADDR, help, old_flags, old_envs)


def add_options(p: argparse.ArgumentParser) -> None:
    """Add the TLS and bearer-token options (``--tls-ca``, ``--tls-cert``, ``--tls-key``,
    ``--tls-server-name``, ``--auth-token``)."""
    env = os.environ.get
    p.add_argument(
        "--tls-ca",
        default=env("FENCING_TLS_CA") or None,
        metavar="PATH",
        help="verify the server with this CA: use TLS (env FENCING_TLS_CA)",
    )
    p.add_argument(
        "--tls-cert",
        default=env("FENCING_TLS_CERT") or None,
        metavar="PATH",
        help="client certificate for mTLS (env FENCING_TLS_CERT)",
    )
    p.add_argument(
        "--tls-key",
        default=env("FENCING_TLS_KEY") or None,
        metavar="PATH",
        help="key of --tls-cert (env FENCING_TLS_KEY)",
    )
    p.add_argument(
        "--tls-server-name",
        default=env("FENCING_TLS_SERVER_NAME") or None,
        metavar="NAME",
        help="name the server's certificate must carry, if not the address's host "
        "(env FENCING_TLS_SERVER_NAME)",
    )
    p.add_argument(
        "--auth-token",
        default=env("FENCING_AUTH_TOKEN") or None,
        metavar="TOKEN",
        help="bearer token to authenticate with (env FENCING_AUTH_TOKEN; prefer the "
        "variable: flags show in ps)",
    )


def tls_of(args: argparse.Namespace) -> TLSConfig | None:
    """The TLS settings the options name, or None for plaintext."""
    if not (args.tls_ca or args.tls_cert or args.tls_key):
        return None
    return TLSConfig(
        cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca, server_name=args.tls_server_name
    )


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """``tls=`` and ``token=`` for any client constructor (sync or asyncio)."""
    return {"tls": tls_of(args), "token": args.auth_token}


def lease_client(args: argparse.Namespace, holder: str | None = None) -> LeaseClient:
    """A :class:`LeaseClient` to ``--lease-addr`` with the TLS and token options."""
    from fencing.client.lease import LeaseClient

    return LeaseClient(args.lease_addr, holder=holder or None, **client_options(args))


def guard_client(args: argparse.Namespace) -> GuardClient:
    """A :class:`GuardClient` to ``--guard-addr`` with the TLS and token options."""
    from fencing.client.guard import GuardClient

    return GuardClient(args.guard_addr, **client_options(args))


def queue_client(args: argparse.Namespace) -> QueueClient:
    """A :class:`QueueClient` to the lease server at ``--lease-addr``."""
    from fencing.client.queue import QueueClient

    return QueueClient(args.lease_addr, **client_options(args))
