"""The one shape of every command's ``--json``: one JSON object a line (a list is one
line per item, never an array, so ``| head`` and line tools work on it), and a time or
duration in integer milliseconds named ``*_ms`` (as the wire and ``lease``, ``watch``
and ``queue job`` give them), never float seconds."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def ms(seconds: float | None) -> int:
    """Seconds (None: never) as integer milliseconds (0: never)."""
    return 0 if seconds is None else round(seconds * 1000)


def in_ms(fields: Mapping[str, Any], seconds: Iterable[str]) -> dict[str, Any]:
    """``fields`` with each of ``seconds`` (float seconds) as ``NAME_ms`` in its place."""
    names = set(seconds)
    return {
        (f"{k}_ms" if k in names else k): (ms(v) if k in names else v) for k, v in fields.items()
    }


def print_json(fields: Mapping[str, Any]) -> None:
    """One object, one line."""
    print(json.dumps(fields), flush=True)
