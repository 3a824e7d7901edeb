"""How the client commands connect: TLS and bearer-token options shared by every command.

The variables mean what they mean for a server (``FENCING_TLS_CERT``/``KEY``: this
process's own certificate, ``FENCING_TLS_CA``: the CA of the peer's), so a command run
inside a server's container (``fencing healthcheck``) can reuse the server's settings
when one CA signs both sides.
"""

from __future__ import annotations

import argparse
import os

from fencing.tls import TLSConfig


def add_options(p: argparse.ArgumentParser) -> None:
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
