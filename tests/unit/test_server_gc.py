"""A server process's collector: startup's objects frozen, young collections spaced."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from serving import loop


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_run_freezes_what_is_loaded_and_spaces_young_collections(restored_gc: None) -> None:
    seen: dict[str, object] = {}

    async def main() -> None:
        seen["threshold"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()

    loop.run(main())
    assert seen["threshold"] == loop.GC_THRESHOLD
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 1000  # the modules' objects


def test_cycles_made_while_serving_are_still_collected(restored_gc: None) -> None:
    """No explicit collect: the allocations past the threshold trigger one by themselves."""
    loop.tune_gc()
    freed: list[bool] = []

    class Node:
        other: object

    a, b = Node(), Node()
    a.other, b.other = b, a
    weakref.finalize(a, freed.append, True)
    del a, b
    assert not freed  # a cycle: reference counting alone never frees it
    kept: list[list[int]] = [[] for _ in range(2 * loop.GC_THRESHOLD[0])]
    assert freed and len(kept) == 2 * loop.GC_THRESHOLD[0]
