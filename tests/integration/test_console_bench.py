"""The console benchmark runs and measures something (no timing is asserted), and the
console costs the lease server one Watch stream however many tabs are open."""

from __future__ import annotations

import pytest

from bench import console

pytestmark = pytest.mark.slow


def test_the_console_section_measures_pages_and_counts_one_watch_stream() -> None:
    run = console.measure(leases=2_000, repeat=2)
    assert [how for how, _, _ in run.rows] == [
        "CLI's List call, first page (baseline)",
        "console leases page, first page",
        "CLI's List call, half way (baseline)",
        "console leases page, half way",
    ]
    assert all(ms > 0 for _, ms, _ in run.rows)
    assert (run.idle_streams, run.streams_with_tabs) == (1, 1)
    assert "| console leases page, half way |" in console.markdown(run)
