"""Granted tokens as clients saw them, and the two checks every token history must pass."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class Granted:
    """One successful acquire: ``invoked``/``completed`` on this process's monotonic clock."""

    resource: str
    token: int
    invoked: float
    completed: float
    server: int = 0


def check_tokens(grants: list[Granted]) -> None:
    """Unique per resource; a grant completed before another was invoked has a smaller token."""
    by_resource: dict[str, list[Granted]] = defaultdict(list)
    for g in grants:
        by_resource[g.resource].append(g)
    for resource, items in by_resource.items():
        tokens = [g.token for g in items]
        assert len(tokens) == len(set(tokens)), f"{resource}: a token was granted twice"
        done = sorted(items, key=lambda g: g.completed)
        j, highest = 0, 0
        for g in sorted(items, key=lambda g: g.invoked):
            while j < len(done) and done[j].completed < g.invoked:
                highest = max(highest, done[j].token)
                j += 1
            assert g.token > highest, (
                f"{resource}: token {g.token} was granted after token {highest} had completed"
            )
