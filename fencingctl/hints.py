"""What a client command's failure likely means, when the address or transport is wrong.

A call to the wrong server fails with gRPC's own words ("Method not found!",
"Socket closed"), which name the symptom, not the mistake. When a command fails so,
:func:`fail` asks the servers it used one more question and adds a ``hint:`` line:

- a method the server does not have (UNIMPLEMENTED): which service the server at
  each address serves (the standard health service): the guard's port given as
  ``--lease-addr`` "looks like a guard", and the other way round;
- no connection (UNREACHABLE): whether the server at each address speaks TLS (a TLS
  handshake without verification): a plaintext client is told to give ``--tls-ca``,
  a TLS client against a plaintext server to drop it.

The questions are asked only on these failures, each bounded by :data:`PROBE_TIMEOUT`.
"""

from __future__ import annotations

import argparse
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import grpc

from fencing.tls import split_address
from fencingctl import connect
from serving import exits

#: Seconds each probe of a failed command's server may take.
PROBE_TIMEOUT = 1.0

LEASE_SERVICE = "fencing.v1.LeaseService"
GUARD_SERVICE = "fencing.v1.GuardService"

#: The address options of the client commands: attribute, flag, the other server's
#: service, what that server is called, and what the flag should name.
_ADDRESSES = (
    ("lease_addr", "--lease-addr", GUARD_SERVICE, "a guard", "the lease server"),
    ("guard_addr", "--guard-addr", LEASE_SERVICE, "a lease server", "a guard"),
)


def fail(args: argparse.Namespace, exc: BaseException, *, as_json: bool = False) -> int:
    """:func:`serving.exits.fail` with the hint :func:`hint_for` finds, if any."""
    return exits.fail(exc, as_json=as_json, hint=hint_for(exc, args))


def hint_for(exc: BaseException, args: argparse.Namespace) -> str:
    """The likely mistake behind ``exc`` ("" when there is no telling)."""
    reason = exits.reason_of(exc)
    if reason == "NOT_FOUND" and _code_of(exc) == grpc.StatusCode.UNIMPLEMENTED:
        return _wrong_server(args)
    if reason == "UNREACHABLE":
        return _wrong_transport(args)
    return ""


def _code_of(exc: BaseException) -> grpc.StatusCode | None:
    for error in (exc, exc.__cause__):
        call: Any = error
        if isinstance(error, grpc.RpcError) and hasattr(call, "code"):
            code: grpc.StatusCode = call.code()
            return code
    return None


def _addresses(args: argparse.Namespace) -> Iterator[tuple[str, str, str, str, str]]:
    """(flag, address, the other server's service, its name, the right one's) per
    address the command used."""
    for attr, flag, other, name, right in _ADDRESSES:
        value = getattr(args, attr, None)
        for address in value if isinstance(value, list) else [value]:
            if isinstance(address, str) and address:
                yield flag, address, other, name, right


def _wrong_server(args: argparse.Namespace) -> str:
    from fencingctl import healthcheck  # only on this failure: it loads the health stubs

    for flag, address, other, name, right in _addresses(args):
        try:
            healthcheck.check(address, other, PROBE_TIMEOUT, args)
        except (grpc.RpcError, ValueError):
            continue  # NOT_FOUND: it does not serve the other one either
        return (
            f"{flag} {address}: this looks like {name} (it serves {other}); "
            f"{flag} wants {right}'s address"
        )
    return ""


def _wrong_transport(args: argparse.Namespace) -> str:
    plaintext = connect.tls_of(args) is None
    for flag, address, *_ in _addresses(args):
        tls = speaks_tls(address)
        if tls and plaintext:
            return (
                f"{flag} {address} speaks TLS: give --tls-ca PATH (env FENCING_TLS_CA) "
                "to verify it, and --tls-cert/--tls-key if it asks for a client certificate"
            )
        if tls is False and not plaintext:
            return (
                f"{flag} {address} speaks plaintext, not TLS: drop --tls-ca, --tls-cert "
                "and --tls-key (and the FENCING_TLS_* variables)"
            )
    return ""


def speaks_tls(address: str, timeout: float = PROBE_TIMEOUT) -> bool | None:
    """Whether the server at ``address`` answers a TLS handshake (its certificate is not
    checked: the question is only which protocol it speaks); None if nothing answers."""
    host, port = split_address(address)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host, int(port)), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except ssl.SSLError as err:
        # A TLS server that refuses us (a client certificate it wants) still answers
        # with a TLS alert; a plaintext one answers bytes that are no TLS record.
        if "ALERT" in str(err.reason or "").upper():
            return True
        if isinstance(err, ssl.SSLEOFError) or err.reason == "WRONG_VERSION_NUMBER":
            return False
        return None
    except ConnectionResetError:
        return False
    except OSError:  # refused, no route, timed out: nobody to ask
        return None
