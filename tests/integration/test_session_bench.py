"""The stream rows of the benchmarks run and measure something (no timing is asserted)."""

from __future__ import annotations

import pytest

from bench import floor

pytestmark = pytest.mark.slow


async def test_the_floor_section_measures_acquire_release_through_the_stream() -> None:
    results = await floor.run([2], 0.2)
    by_name = {r.name: r for r in results}
    streamed = by_name[floor.streamed_name("sqlite")]
    unary = by_name[floor.unary_name("sqlite")]
    assert streamed.ops > 0 and unary.ops > 0
    assert streamed.baseline == floor.FLOOR
    assert streamed.server_cpu > 0 and unary.server_cpu > 0
    assert "x unary" in streamed.note
