"""The chaos report from hand-written runs: verdict table, JSON, and what the timeline draws."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.checker import check
from chaos.faults import FaultLog, FaultWindow
from chaos.history import Event, HistoryWriter, Recorder, pair_operations
from chaos.report import (
    FLAGGED,
    REJECTED,
    Box,
    assign_rows,
    lease_bars,
    load_result,
    percentile,
    render_html,
    result_json,
    text_box,
    timeline_svg,
    verdict_table,
    write_report,
)
from chaos.scenarios import SCENARIOS, RunConfig, RunOutcome, ScenarioResult

MS = 1_000_000


class Script:
    """Operations on a fake clock (milliseconds), recorded per process."""

    def __init__(self) -> None:
        self.now = 1_000 * MS
        self.events: list[Event] = []
        self.recs: dict[str, Recorder] = {}

    def at(self, ms: float) -> Script:
        self.now = 1_000 * MS + round(ms * MS)
        return self

    def rec(self, process: str) -> Recorder:
        if process not in self.recs:
            self.recs[process] = Recorder(self.events.append, process, clock=lambda: self.now)
        return self.recs[process]

    def op(
        self,
        process: str,
        op: str,
        start: float,
        end: float,
        outcome: str = "ok",
        *,
        token: int | None = None,
        key: str | None = None,
        value: str | None = None,
        error: str | None = None,
    ) -> str:
        self.at(start)
        rec = self.rec(process)
        if op == "acquire":
            op_id = rec.invoke(op, "r0", ttl_ms=1000)
            self.at(end)
            rec.complete(op_id, outcome, token=token, ttl_ms=1000)
            return op_id
        op_id = rec.invoke(op, "r0", token=token, key=key, value=value)
        self.at(end)
        rec.complete(op_id, outcome, error=error)
        return op_id


def paused_holder_story(*, fenced: bool) -> list[Event]:
    """c0 holds, is paused, c1 takes over and writes, c0 wakes and writes late."""
    s = Script()
    s.op("c0", "acquire", 0, 1, token=1)
    s.op("c0", "write", 2, 3, token=1, key="counter", value="1#c0/1")
    s.rec("c0").lost("r0", 1)
    s.at(1300)
    s.op("c1", "acquire", 1000, 1100, token=2)
    s.op("c1", "write", 1200, 1210, token=2, key="counter", value="2#c1/1")
    s.op("c1", "release", 1300, 1301, token=2)
    outcome, error = ("fail", "STALE_TOKEN") if fenced else ("ok", None)
    s.op("c0", "write", 2500, 2501, outcome, token=1, key="counter", value="2#c0/2", error=error)
    return s.events


def outcome(label: str, events: list[Event], faults: list[FaultWindow]) -> RunOutcome:
    return RunOutcome(
        label=label,
        guard_mode="monotonic" if label == "fenced" else "off",
        checked_mode="monotonic",
        result=check(events, mode="monotonic"),
        events=events,
        faults=faults,
        workdir=Path("/nonexistent") / label,
        started_ns=1_000 * MS,
        ended_ns=4_000 * MS,
    )


PAUSE = FaultWindow("pause", "c0", 1_004 * MS, 3_400 * MS, "SIGSTOP ... SIGCONT")


def scenario_result(*, control_flagged: bool = True) -> ScenarioResult:
    config = RunConfig("pause-holder", duration=3.0, clients=2, resources=1)
    control_events = paused_holder_story(fenced=not control_flagged)
    return ScenarioResult(
        config,
        SCENARIOS["pause-holder"],
        outcome("fenced", paused_holder_story(fenced=True), [PAUSE]),
        outcome("control", control_events, [PAUSE]),
    )


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0


def test_verdict_table_passes_a_valid_run_with_a_flagged_control() -> None:
    result = scenario_result()
    assert result.passed
    table = verdict_table(result)
    assert "fenced   monotonic  yes" in table
    assert "control  off        NO     stale-write-accepted=1" in table
    assert table.splitlines()[-1].startswith("PASS")


def test_a_clean_control_fails_the_scenario_as_too_weak() -> None:
    result = scenario_result(control_flagged=False)
    assert not result.passed
    assert "too weak to prove anything" in verdict_table(result)


def test_json_has_both_runs_and_relative_fault_times() -> None:
    data = result_json(scenario_result())
    json.dumps(data)  # JSON-ready
    assert data["passed"] is True
    assert set(data["runs"]) == {"fenced", "control"}
    control = data["runs"]["control"]
    assert control["counts"]["stale-write-accepted"] == 1
    assert control["violations"][0]["kind"] == "stale-write-accepted"
    assert control["faults"][0] == {
        "kind": "pause",
        "target": "c0",
        "start_s": 0.004,
        "end_s": 2.4,
        "detail": "SIGSTOP ... SIGCONT",
    }
    assert data["runs"]["fenced"]["stats"]["stale_rejected"] == 1
    assert data["runs"]["fenced"]["stats"]["takeover_ms"]["n"] == 1


def test_lease_bars_end_at_release_or_loss() -> None:
    bars = {b.process: b for b in lease_bars(pair_operations(paused_holder_story(fenced=True)))}
    assert bars["c0"].how == "lost"
    assert bars["c1"].how == "released"
    assert bars["c1"].end - bars["c1"].start == pytest.approx(200 * MS)
    # c0 wrote after it knew its lease lost: its row stays busy until that write.
    assert bars["c0"].tail > bars["c0"].end
    assert bars["c0"].extent == bars["c0"].tail
    assert assign_rows(list(bars.values())) == 2
    assert bars["c0"].row != bars["c1"].row


def test_timeline_marks_the_rejected_write_and_the_accepted_stale_one() -> None:
    page = render_html(scenario_result())
    fenced, control = page.split("control run:")
    assert "<svg" in fenced
    assert "<svg" in control
    assert f'stroke="{REJECTED}"' in fenced  # the paused holder's write, rejected
    assert "STALE_TOKEN" in fenced
    assert FLAGGED not in fenced.split("</svg>")[0]
    assert f'stroke="{FLAGGED}"' in control  # the same write, accepted, flagged
    assert "pause c0" in fenced
    assert "pause c0" in control
    assert "<script" not in page  # self-contained, static


def test_report_files_round_trip_through_load_result(tmp_path: Path) -> None:
    result = scenario_result()
    for run in result.runs:
        run.workdir = tmp_path / run.label
        (run.workdir / "history").mkdir(parents=True)
        with HistoryWriter(run.workdir / "history" / "all.jsonl") as writer:
            for event in run.events:
                writer.write(event)
        log = FaultLog(run.workdir / "faults.jsonl")
        for window in run.faults:
            log.add(window)
    json_path, html_path = write_report(result, tmp_path)
    assert json_path.exists()
    assert html_path.read_text().startswith("<!DOCTYPE html>")
    again = load_result(tmp_path)
    assert verdict_table(again) == verdict_table(result)
    assert again.fenced.faults == result.fenced.faults


def crowded_story() -> list[Event]:
    """The spot the timeline must keep readable: a paused holder's rejected write in the
    middle of short leases the others take one after another."""
    s = Script()
    s.op("c0", "acquire", 0, 1, token=1)
    s.op("c0", "write", 2, 3, token=1, key="counter", value="1#c0/1")
    s.rec("c0").lost("r0", 1)
    t, token = 1000.0, 2
    for i in range(14):
        c = "c1" if i % 2 == 0 else "c2"
        s.op(c, "acquire", t, t + 2, token=token)
        s.op(c, "write", t + 8, t + 9, token=token, key="counter", value=f"{token}#{c}/1")
        s.op(c, "release", t + 30, t + 31, token=token)
        if i == 5:
            s.op("c0", "write", t + 45, t + 46, "fail", token=1, key="counter",
                 value="2#c0/2", error="STALE_TOKEN")  # fmt: skip
        t, token = t + 60, token + 1
    return s.events


def svg_texts(svg: str) -> list[tuple[Box, str, dict[str, str]]]:
    """Every ``<text>`` of an SVG with its box (by the report's width estimate)."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg)
    out = []
    for el in root.iter("{http://www.w3.org/2000/svg}text"):
        size = float(el.get("font-size", root.get("font-size", "11")))
        bold = el.get("font-weight") == "bold"
        text = el.text or ""
        box = text_box(
            float(el.get("x", 0)), float(el.get("y", 0)), text, size, bold,
            el.get("text-anchor", "start"),
        )  # fmt: skip
        out.append((box, text, dict(el.attrib)))
    return out


def test_timeline_labels_never_overlap_and_every_bar_is_named() -> None:
    events = crowded_story()
    run = outcome("fenced", events, [FaultWindow("pause", "c0", 1_004 * MS, 2_300 * MS, "")])
    svg = timeline_svg(run, ["c0", "c1", "c2"])
    texts = svg_texts(svg)
    for i, (a, text_a, _) in enumerate(texts):
        for b, text_b, _ in texts[i + 1 :]:
            assert not a.overlaps(b, pad=0), f"{text_a!r} overlaps {text_b!r}"
    # The grid never cuts through a letter: every label has its white halo.
    assert all(attrs.get("paint-order") == "stroke" for _, _, attrs in texts)
    said = [text for _, text, _ in texts]
    assert said.count("STALE_TOKEN") == 1 and "pause c0" in said
    bars = lease_bars(pair_operations(events))
    assert len(bars) == 15
    for bar in bars:
        assert f"{bar.process} t{bar.token}" in said or f"t{bar.token}" in said, bar
    # No bar label lies on another bar: it would name the wrong lease.
    import re

    shapes = [
        Box(float(m[1]), float(m[2]), float(m[1]) + float(m[3]), float(m[2]) + 18)
        for m in re.finditer(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="18"', svg)
    ]
    assert len(shapes) == 15
    for box, text, _ in texts:
        if re.fullmatch(r"(c\d )?t\d+", text):
            assert sum(box.overlaps(shape, pad=0) for shape in shapes) <= 1, text
