"""The package's version, as installed (``importlib.metadata``), for ``--version``, the
``fencing_build_info`` gauge and the servers' start log line."""

from __future__ import annotations

from importlib import metadata

#: The distribution this code ships in (``pyproject.toml``'s ``name``).
DISTRIBUTION = "fencing-guard"


def _installed() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        # Run from a source tree that was never installed: say so rather than guess.
        return "0+unknown"


VERSION = _installed()

__all__ = ["DISTRIBUTION", "VERSION"]
