"""The soak's growth verdict and plots (chaos/health.py), on made-up samples."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from chaos.health import bucket_quantile, growth, health_page, slope, svg_plot

DURATION = 100.0


def samples(
    metric: str, values: Sequence[tuple[float, float]], incarnation: int = 0
) -> list[dict[str, Any]]:
    return [{"t": t, "process": "guard", "incarnation": incarnation, metric: v} for t, v in values]


def test_slope_is_the_least_squares_fit() -> None:
    assert slope([(0, 1), (1, 3), (2, 5)]) == 2
    assert slope([(0, 1)]) == 0
    assert slope([(1, 1), (1, 2)]) == 0


def test_a_steady_climb_to_the_end_is_flagged() -> None:
    # One task per second, kept: 50 more over the last half.
    found = growth(samples("tasks", [(t, 20 + t) for t in range(0, 101, 2)]), DURATION)
    assert [(g.metric, g.flagged) for g in found] == [("tasks", True)]
    assert math.isclose(found[0].growth, 50, rel_tol=1e-6)


def test_a_rise_that_levels_off_before_the_last_half_passes() -> None:
    values = [(t, min(t, 40.0) + 10) for t in range(0, 101, 2)]
    found = growth(samples("fds", values), DURATION)
    assert [(g.metric, g.flagged) for g in found] == [("fds", False)]


def test_small_noise_passes_and_memory_has_a_relative_bound() -> None:
    noisy = [(t, 100 + (3 if t % 4 else -3)) for t in range(0, 101, 2)]
    assert not any(g.flagged for g in growth(samples("tasks", noisy), DURATION))
    # 200 MB growing 20 MB over the half: within 15 % of the median.
    rss = [(t, 200 + 0.4 * t) for t in range(50, 101, 2)]
    assert not any(g.flagged for g in growth(samples("rss_mb", rss), DURATION))
    rss = [(t, 200 + 1.6 * t) for t in range(50, 101, 2)]
    assert all(g.flagged for g in growth(samples("rss_mb", rss), DURATION))


def test_a_restart_starts_a_new_series() -> None:
    # Growing before a restart at t=60, flat after: the last incarnation is judged,
    # from the end of its warm-up (10 s).
    before = samples("fds", [(t, 10 + t) for t in range(50, 60, 2)])
    after = samples("fds", [(t, 12.0) for t in range(60, 101, 2)], incarnation=1)
    found = growth(before + after, DURATION)
    assert [(g.flagged, g.samples) for g in found] == [(False, 16)]


def test_too_few_samples_are_not_judged() -> None:
    assert growth(samples("tasks", [(90, 1), (95, 100), (99, 1000)]), DURATION) == []


def test_bucket_quantile_interpolates_the_calls_between_two_scrapes() -> None:
    before = [(0.01, 10.0), (0.1, 10.0), (math.inf, 10.0)]
    now = [(0.01, 10.0), (0.1, 110.0), (math.inf, 110.0)]
    # 100 new calls, all between 10 and 100 ms: the median at 55 ms.
    assert math.isclose(bucket_quantile(0.5, before, now) or 0, 55.0)
    assert bucket_quantile(0.5, now, now) is None


def test_the_page_draws_one_plot_per_metric_and_escapes_names() -> None:
    page = health_page(
        "soak <test>",
        "<p>summary</p>",
        samples("tasks", [(t, 5.0) for t in range(0, 101, 5)]),
        {"write": [(10.0, 1.0, 2.0), (20.0, 1.5, 3.0)]},
        growth(samples("tasks", [(t, 5.0) for t in range(0, 101, 5)]), DURATION),
        DURATION,
    )
    assert page.count("<svg") == 2
    assert "soak &lt;test&gt;" in page
    assert "flat" in page
    assert "<polyline" in svg_plot("x", {"a": [(0, 1), (1, 2)]}, 1.0)
