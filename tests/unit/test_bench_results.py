"""``python -m bench --all`` rewrites bench/RESULTS.md: the sections it measured are
replaced, every other section of the file already there is kept verbatim."""

from __future__ import annotations

from pathlib import Path

from bench.__main__ import (
    OPT_IN,
    SECTIONS,
    Options,
    Report,
    carried_over,
    parser,
    sections_of,
    sections_to_run,
    write_results,
)
from bench.harness import Result

STARTED = "2027-01-02 03:04:05 UTC"

QUEUE = """## Queue: the QueueService next to hand-written SQL and procrastinate

Section `queue`, 935 s: `python -m bench --only queue` on 2026-12-01 14:36:39 UTC (load
11.92 at the start).

| target | measured | met |
| --- | --- | --- |
| enqueue one job per call >= 1.0x procrastinate | 116 jobs/s = 1.19x (97) | yes |

### A subsection of its own
- note: kept as it is
"""

PGLOG = """## PostgreSQL's lease path against SQLite's (P6, P7, P7b)

Section `pglog`, `FENCING_BENCH_BEFORE=038a9e0 python -m bench --only pglog` (opt-in).

| figure (same run) | A 17:06 |
| --- | --- |
| P7 | 0.83x |
"""

HAND = """## An analysis written by hand

Six runs, summarised.
"""

SAMPLE = f"""# Benchmark results

Written by `python -m bench --all` on 2026-12-01 18:28:02 UTC (took 9.4 min).

## Machine

- host `old`: the earlier machine

## Targets

| target | measured | met |
| --- | --- | --- |
| an old target | 1 | yes |

## RPC floor and the embedded default (SQLite)

Section `floor`, 34 s.

| benchmark | clients | ops/s | p50 ms | p99 ms | ratio | note |
| --- | ---: | ---: | ---: | ---: | --- | --- |
| OLD FLOOR ROW | 1 | 1,956 | 0.49 | 0.83 | (baseline) |  |

## The SDK's lease stream against its unary calls (SQLite)

Section `transport`, 80 s.

| OLD TRANSPORT ROW |

The two sections below are opt-in and were not part of the `--all` run above.

{QUEUE}
{PGLOG}
{HAND}"""


def _write(path: Path, done: dict[str, tuple[Report, float]]) -> str:
    write_results(path, done, Options(clients=[1], duration=3.0), STARTED, 60.0)
    return path.read_text(encoding="utf-8")


def _without_load(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if "load average" not in line)


def _floor_report() -> Report:
    return Report(
        results=[Result("empty gRPC call (floor)", 1, 6000, 3.0, [0.0005] * 10)],
        targets=[("a new target", "2", "yes")],
    )


def test_sections_are_read_with_the_bench_section_each_holds() -> None:
    found = sections_of(SAMPLE)
    assert [(s.title.split(":")[0], s.name) for s in found] == [
        ("Machine", None),
        ("Targets", None),
        ("RPC floor and the embedded default (SQLite)", "floor"),
        ("The SDK's lease stream against its unary calls (SQLite)", "transport"),
        ("Queue", "queue"),
        ("PostgreSQL's lease path against SQLite's (P6, P7, P7b)", "pglog"),
        ("An analysis written by hand", None),
    ]
    assert found[4].text.strip() == QUEUE.strip()


def test_the_run_replaces_its_sections_and_keeps_the_others_verbatim(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(SAMPLE, encoding="utf-8")
    transport = Report(results=[Result("SDK Acquire+Release, unary", 1, 1500, 3.0, [0.002])])
    text = _write(path, {"floor": (_floor_report(), 30.0), "transport": (transport, 40.0)})

    # What this run measured is new, and nothing of the old version of it is left.
    assert "OLD FLOOR ROW" not in text
    assert "OLD TRANSPORT ROW" not in text
    assert "host `old`" not in text
    assert "an old target" not in text
    assert "| a new target | 2 | yes |" in text
    assert f"Section `floor`, 30 s, run of {STARTED}." in text
    assert "| empty gRPC call (floor) | 1 | 2,000 |" in text
    assert text.count("## RPC floor") == 1
    assert text.count("## The SDK's lease stream") == 1
    # What it did not measure is there verbatim, after the run's own, in its old order.
    for kept in (QUEUE, PGLOG, HAND):
        assert kept.strip() in text
    assert text.index("## The SDK's") < text.index("## Queue") < text.index("## PostgreSQL's")
    assert text.index("## PostgreSQL's") < text.index("## An analysis")
    assert "were not measured by this run" in text
    assert text.endswith(HAND.strip() + "\n")


def test_a_second_run_keeps_what_the_first_carried_over(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(SAMPLE, encoding="utf-8")
    first = _write(path, {"floor": (_floor_report(), 30.0)})
    second = _write(path, {"floor": (_floor_report(), 30.0)})
    assert _without_load(second) == _without_load(first)
    # transport was not run either time: its old section is kept, with its header.
    assert "OLD TRANSPORT ROW" in second
    assert second.count("were not measured by this run") == 1


def test_a_skipped_section_keeps_its_earlier_figures(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text(SAMPLE, encoding="utf-8")
    skipped = Report(notes=["skipped (OSError: no server)"])
    text = _write(path, {"floor": (_floor_report(), 30.0), "transport": (skipped, 1.0)})
    assert "OLD TRANSPORT ROW" in text
    assert text.count("## The SDK's lease stream") == 1
    assert "skipped by it: `transport` (skipped (OSError: no server))" in text


def test_nothing_to_carry_over_without_an_earlier_file(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    text = _write(path, {"floor": (_floor_report(), 30.0)})
    assert "were not measured by this run" not in text
    assert carried_over("", {}) == []


def test_all_runs_the_opt_in_sections_asked_for() -> None:
    """``--all`` alone leaves the opt-in sections out; ``--queue`` and ``--pglog`` add
    them, so one command measures every section and writes RESULTS.md."""
    plain = sections_to_run(parser().parse_args(["--all"]))
    assert plain == [n for n in SECTIONS if n not in OPT_IN]
    every = sections_to_run(parser().parse_args(["--all", "--queue", "--pglog"]))
    assert set(every) == set(SECTIONS)
    assert sections_to_run(parser().parse_args(["--only", "floor", "--pglog"])) == [
        "floor",
        "pglog",
    ]
