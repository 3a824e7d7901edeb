"""Command-line pieces the servers and the ``fencing`` client commands share, light
enough for a client command to import (no server code): the ``HOST:PORT`` rule of
every address, bound or connected to, and the deprecation of former flag names."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def address_problem(value: str, *, bind: bool = True, port: int = 50051) -> str | None:
    """What is wrong with ``value`` as a ``HOST:PORT`` (with a hint at the likely
    mistake), or None if nothing is: the one rule for the servers' binds and the
    clients' addresses (``bind=False``: port 0, "pick one", is for binds only).
    ``port``: the port a hint suggests when none was given."""
    ports = "0..65535; 0 picks one" if bind else "1..65535"
    if "://" in value:
        scheme, _, rest = value.partition("://")
        return f"not a URL: drop {scheme + '://'!r} and give HOST:PORT ({rest.rstrip('/')!r}?)" + (
            "; TLS is the --tls-* options" if scheme.lower() in ("https", "grpcs") else ""
        )
    if any(c.isspace() for c in value):
        return f"no spaces in HOST:PORT, got {value!r}"
    host, sep, given = value.rpartition(":")
    if not sep or (host.startswith("[") != host.endswith("]")):
        return f"no port: give HOST:PORT ({value}:{port}?)"
    if not host.strip("[]"):
        return f"no host: give HOST:PORT (127.0.0.1{value}?)"
    if ":" in host and not host.startswith("["):
        return f"an IPv6 host goes in brackets: [HOST]:PORT, got {value!r}"
    if not given.isdigit():
        return f"the port must be a number ({ports}), got {given!r}"
    if not (0 if bind else 1) <= int(given) <= 65535:
        return f"the port must be {ports}, got {given}"
    return None


def warn_deprecated(old: str, new: str) -> None:
    """Say on stderr that ``old`` (a flag, variable or key) is deprecated for ``new``."""
    print(
        f"warning: {old} is deprecated and goes in the next release; use {new}",
        file=sys.stderr,
        flush=True,
    )


class DeprecatedFlag(argparse.Action):
    """A former flag: stores into the new one's ``dest`` and warns on stderr.

    ``new`` (passed to ``add_argument``) names the flag that replaces it. The default
    is ``argparse.SUPPRESS``, so the new flag's default is the one that stands.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, new: str, **kwargs: Any):
        kwargs.setdefault("default", argparse.SUPPRESS)
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        warn_deprecated(option_string or self.option_strings[0], self.new)
        setattr(namespace, self.dest, values)


__all__ = ["DeprecatedFlag", "address_problem", "warn_deprecated"]
