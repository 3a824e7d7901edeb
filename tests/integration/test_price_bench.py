"""The price-of-fencing benchmark runs on SQLite and writes values that change (no timing
is asserted)."""

from __future__ import annotations

from bench import price
from bench.harness import fresh_value


def test_fresh_values_never_repeat() -> None:
    values = [fresh_value() for _ in range(1000)]
    assert len(set(values)) == len(values)
    assert {len(v) for v in values} == {64}


async def test_price_rows_on_sqlite() -> None:
    results = await price.sqlite(2, 0.05)
    assert [r.name for r in results] == [
        price.direct_name("sqlite"),
        price.unary_name("sqlite"),
        price.stream_name("sqlite"),
    ]
    assert all(r.ops > 0 and r.rate > 0 for r in results)
    assert [r.baseline for r in results[1:]] == [price.direct_name("sqlite")] * 2
    assert all("guard CPU" in r.note and "client CPU" in r.note for r in results[1:])
    figures = price.prices(results)
    assert len(figures) == 2 and all("x;" in f for _, f in figures)
