"""What a scenario run did, for machines (JSON), terminals (a verdict table) and people (HTML).

:func:`verdict_table` prints both runs side by side: valid or not, violations by
kind, stale writes the guard rejected, ownership overlaps, takeover latency
p50/p99 and acknowledged writes, then PASS or FAIL with the reasons.
:func:`result_json` is the same and more as plain data. :func:`render_html` draws a
self-contained page (inline SVG and CSS, no scripts, no external files): per run,
one lane per resource; every lease as a bar from its grant to its release (or to
the moment its holder learned it was lost), colored by client; every write as a
mark on its holder's bar (a tick if accepted, a red cross if the guard rejected it,
a grey ring if its outcome is unknown); writes the checker flagged as accepted
although stale circled in orange; fault windows shaded across all lanes. A
paused holder's rejected write is the red cross right at the end of its pause.
Hover any mark for its operation, token, value and outcome.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from chaos.checker import CheckResult, check
from chaos.faults import read_faults
from chaos.history import Operation, pair_operations, read_history
from chaos.scenarios import SCENARIOS, RunConfig, RunOutcome, ScenarioResult
from chaos.workload import client_of

# -- numbers ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile (0 < q <= 100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _kinds(result: CheckResult) -> str:
    found = {k: n for k, n in result.counts().items() if n}
    return ", ".join(f"{k}={n}" for k, n in found.items()) or "none"


# -- the verdict table ------------------------------------------------------------------------


def verdict_rows(result: ScenarioResult) -> list[dict[str, str]]:
    """One row per run, the columns of :func:`verdict_table` as strings."""
    rows = []
    for run in result.runs:
        s = run.result.stats
        lat = s.takeover_latency_ms
        rows.append(
            {
                "run": run.label,
                "guard": run.guard_mode,
                "valid": "yes" if run.valid else "NO",
                "violations": _kinds(run.result),
                "findings": ", ".join(
                    f"{k}={n}" for k, n in sorted(run.result.finding_counts().items())
                )
                or "none",
                "stale rejected": str(s.stale_rejected),
                "overlaps (ms)": f"{s.overlap_count} ({s.overlap_ms:.0f})",
                "takeover p50/p99 ms": f"{_ms(percentile(lat, 50))} / {_ms(percentile(lat, 99))}",
                "writes ok": str(s.writes_ok),
            }
        )
    return rows


def headline(result: ScenarioResult) -> str:
    c = result.config
    line = (
        f"scenario {c.scenario} on {c.backend}, fence mode {c.fence_mode}: "
        f"{c.clients} clients, {c.resources} resources, {c.duration:g} s, seed {c.seed}"
    )
    control = result.control
    if control is not None and control.seed is not None and control.seed != c.seed:
        line += f" (control re-run with seed {control.seed})"
    return line


def conclusion(result: ScenarioResult) -> str:
    if result.passed:
        if result.control is None:
            return "PASS (no control run: nothing shows the faults were strong enough)"
        kinds = ", ".join(sorted(result.control.result.kinds()))
        return f"PASS: fenced run valid; control flagged ({kinds})"
    return "FAIL: " + "; ".join(result.problems)


def verdict_table(result: ScenarioResult) -> str:
    """A plain-text table of both runs and the conclusion."""
    rows = verdict_rows(result)
    columns = list(rows[0]) if rows else []
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    lines = [headline(result), "  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in columns).rstrip() for r in rows]
    for run in result.runs:
        for v in run.result.violations[:3]:
            lines.append(f"  {run.label}: [{v.kind}] {v.resource}: {v.detail}")
        if len(run.result.violations) > 3:
            lines.append(f"  {run.label}: ... and {len(run.result.violations) - 3} more")
    lines.append(conclusion(result))
    return "\n".join(lines)


# -- JSON -------------------------------------------------------------------------------------


def _run_json(run: RunOutcome) -> dict[str, Any]:
    s = run.result.stats
    lat = s.takeover_latency_ms
    t0 = run.started_ns
    return {
        "label": run.label,
        "guard_mode": run.guard_mode,
        "checked_mode": run.checked_mode,
        "valid": run.valid,
        "counts": run.result.counts(),
        "violations": [
            {"kind": v.kind, "resource": v.resource, "detail": v.detail, "op_ids": list(v.op_ids)}
            for v in run.result.violations
        ],
        "findings": [
            {"kind": f.kind, "resource": f.resource, "detail": f.detail, "op_ids": list(f.op_ids)}
            for f in run.result.findings
        ],
        "stats": {
            "ops": s.ops,
            "pending": s.pending,
            "writes_ok": s.writes_ok,
            "stale_rejected": s.stale_rejected,
            "overlap_count": s.overlap_count,
            "overlap_ms": round(s.overlap_ms, 3),
            "takeover_ms": {
                "n": len(lat),
                "p50": percentile(lat, 50),
                "p99": percentile(lat, 99),
                "max": max(lat) if lat else None,
            },
        },
        "faults": [
            {
                "kind": f.kind,
                "target": f.target,
                "start_s": round((f.start_ns - t0) / 1e9, 3),
                "end_s": round((f.end_ns - t0) / 1e9, 3),
                "detail": f.detail,
            }
            for f in run.faults
        ],
        "wall_s": round((run.ended_ns - run.started_ns) / 1e9, 3),
        "started_ns": run.started_ns,
        "ended_ns": run.ended_ns,
        "workdir": str(run.workdir),
        "errors": run.errors,
        "seed": run.seed,
    }


def result_json(result: ScenarioResult) -> dict[str, Any]:
    """The whole result as JSON-ready data."""
    c = result.config
    return {
        "scenario": c.scenario,
        "summary": result.scenario.summary,
        "config": {
            "backend": c.backend,
            "fence_mode": c.fence_mode,
            "clients": c.clients,
            "resources": c.resources,
            "duration_s": c.duration,
            "seed": c.seed,
            "control": c.control,
        },
        "profile": result.scenario.profile.to_dict(),
        "expected_in_control": sorted(result.scenario.expected),
        "passed": result.passed,
        "problems": result.problems,
        "control_flagged": result.control_flagged,
        "runs": {run.label: _run_json(run) for run in result.runs},
    }


# -- the timeline -----------------------------------------------------------------------------

PALETTE: Final = (
    "#4e79a7",
    "#59a14f",
    "#9c755f",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#bab0ac",
    "#17becf",
    "#8c6d31",
    "#637939",
)
REJECTED: Final = "#d62728"
FLAGGED: Final = "#ff7f0e"
UNKNOWN: Final = "#7f7f7f"

WIDTH: Final = 1360
LEFT: Final = 120
RIGHT: Final = 20
ROW: Final = 24
LANE_GAP: Final = 14
TOP: Final = 34


@dataclass
class Bar:
    """A lease as its holder believed in it: from the grant's arrival to release or loss."""

    process: str
    resource: str
    token: int
    start: float
    end: float
    how: str  # released, lost, unknown (release of unknown outcome), open
    row: int = 0
    tail: float = 0.0  # its holder's last write with this token, if after ``end``

    @property
    def extent(self) -> float:
        """Where the bar's row is busy until: its end, or its holder's last write."""
        return max(self.end, self.tail)


def _color(process: str, clients: list[str]) -> str:
    name = client_of(process)
    index = clients.index(name) if name in clients else len(clients)
    return PALETTE[index % len(PALETTE)]


def lease_bars(ops: Sequence[Operation]) -> list[Bar]:
    """The lease bars of a history (see :class:`Bar`)."""
    last_seen: dict[str, float] = defaultdict(float)
    ends: dict[tuple[str, str, int], list[tuple[float, str]]] = defaultdict(list)
    for o in ops:
        seen = o.start_ns if o.pending else o.end_ns
        last_seen[o.process] = max(last_seen[o.process], float(seen))
        if o.op == "release" and o.token is not None:
            lost = o.extra.get("lost") == 1
            how = "lost" if lost else ("released" if o.ok else "unknown" if o.info else "lost")
            ends[(o.process, o.resource, o.token)].append((float(o.start_ns), how))
    last_write: dict[tuple[str, str, int], float] = {}
    for o in ops:
        if o.op == "write" and o.token is not None:
            key = (o.process, o.resource, o.token)
            when = float(o.start_ns if o.pending else o.end_ns)
            last_write[key] = max(last_write.get(key, 0.0), when)
    bars = []
    for o in ops:
        if o.op != "acquire" or not o.ok or o.token is None:
            continue
        key = (o.process, o.resource, o.token)
        start = float(o.end_ns)
        after = sorted(e for e in ends.get(key, []) if e[0] >= o.start_ns)
        if after:
            end, how = after[0]
        else:
            end, how = max(last_seen[o.process], start), "open"
        bar = Bar(o.process, o.resource, o.token, start, max(end, start), how)
        bar.tail = last_write.get(key, 0.0)
        bars.append(bar)
    return bars


def assign_rows(bars: list[Bar]) -> int:
    """Stack overlapping bars of one lane in rows (first fit); returns the row count.

    A bar occupies its row until its :attr:`Bar.extent`, so the writes a holder sends
    after it lost the lease stay on its own row, not on its successor's bar.
    """
    row_ends: list[float] = []
    for bar in sorted(bars, key=lambda b: b.start):
        for i, end in enumerate(row_ends):
            if end <= bar.start:
                bar.row, row_ends[i] = i, bar.extent
                break
        else:
            bar.row = len(row_ends)
            row_ends.append(bar.extent)
    return max(1, len(row_ends))


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


# -- label layout ---------------------------------------------------------------------------

#: Advance of one character, in em, of the sans-serif faces browsers pick (a generous
#: estimate: digits and lower case are about 0.55 em in DejaVu Sans and Arial).
CHAR_EM: Final = {False: 0.62, True: 0.68}
FONT: Final = 11
#: Drawn under every label: a white outline, so grid lines and bars never cut
#: through the letters.
HALO: Final = ' stroke="white" stroke-width="3" stroke-linejoin="round" paint-order="stroke"'


def text_width(text: str, size: float = FONT, bold: bool = False) -> float:
    """The estimated width in px of ``text`` at ``size`` px."""
    return len(text) * CHAR_EM[bold] * size


@dataclass(frozen=True)
class Box:
    """An axis-aligned rectangle: a label's ink, or a mark the labels must not cover."""

    x0: float
    y0: float
    x1: float
    y1: float

    def overlaps(self, other: Box, pad: float = 1.0) -> bool:
        return not (
            self.x1 + pad <= other.x0
            or other.x1 + pad <= self.x0
            or self.y1 + pad <= other.y0
            or other.y1 + pad <= self.y0
        )

    def inside(self, outer: Box) -> bool:
        return (
            self.x0 >= outer.x0 and self.x1 <= outer.x1 and self.y0 >= outer.y0
            and self.y1 <= outer.y1
        )  # fmt: skip


def text_box(x: float, y: float, text: str, size: float, bold: bool, anchor: str) -> Box:
    """The box of a ``<text>`` at baseline ``y``: ascent 0.8 em above, descent 0.25 below."""
    w = text_width(text, size, bold)
    x0 = x - w if anchor == "end" else x - w / 2 if anchor == "middle" else x
    return Box(x0, y - 0.8 * size, x0 + w, y + 0.25 * size)


@dataclass
class Labels:
    """Places labels without overlaps: each takes the first of its candidate positions
    that stays in its area and clears every label and mark placed before it."""

    taken: list[Box]

    def block(self, box: Box) -> None:
        self.taken.append(box)

    def place(
        self,
        text: str,
        candidates: Sequence[tuple[float, float, str]],
        area: Box,
        *,
        fill: str = "#222",
        size: float = FONT,
        bold: bool = False,
        own: Box | None = None,
    ) -> str:
        """The ``<text>`` at the first free candidate ``(x, baseline, anchor)``, or "".

        ``own``: the shape the label names, which it may cover.
        """
        for x, y, anchor in candidates:
            box = text_box(x, y, text, size, bold, anchor)
            if box.inside(area) and not any(box.overlaps(t) for t in self.taken if t is not own):
                self.taken.append(box)
                weight = ' font-weight="bold"' if bold else ""
                size_attr = f' font-size="{size:g}"' if size != FONT else ""
                return (
                    f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{fill}"'
                    f"{weight}{size_attr}{HALO}>{_esc(text)}</text>"
                )
        return ""


def _write_mark(
    o: Operation, x: float, y: float, color: str, flagged: bool, t0: float
) -> list[str]:
    """One write's mark (its label is laid out by :func:`timeline_svg`)."""
    when = (o.end_ns if not o.pending else o.start_ns) - t0
    tip = (
        f"{o.process} write {o.key}={o.value!r} token {o.token} -> {o.type}"
        f"{' ' + o.error if o.error else ''} at {when / 1e9:.3f} s ({o.op_id})"
    )
    if o.extra.get("replay") == 1:
        tip += " [re-sent from the journal after a restart]"
    parts = [f"<g><title>{_esc(tip)}</title>"]
    if o.fail:
        s = 6
        parts.append(
            f'<path d="M{x - s:.1f},{y - s:.1f}L{x + s:.1f},{y + s:.1f}'
            f'M{x - s:.1f},{y + s:.1f}L{x + s:.1f},{y - s:.1f}" stroke="{REJECTED}" '
            f'stroke-width="3.2" stroke-linecap="round"/>'
        )
    elif o.ok:
        parts.append(
            f'<line x1="{x:.1f}" y1="{y - 7:.1f}" x2="{x:.1f}" y2="{y + 7:.1f}" '
            f'stroke="{color}" stroke-width="2"/>'
        )
    else:
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="white" stroke="{UNKNOWN}" '
            f'stroke-width="2"/>'
        )
    if flagged:
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="10" fill="none" stroke="{FLAGGED}" '
            f'stroke-width="3"/>'
        )
    parts.append("</g>")
    return parts


def timeline_svg(run: RunOutcome, clients: list[str]) -> str:
    """The SVG timeline of one run (see the module docstring)."""
    ops = [o for o in pair_operations(run.events) if o.process not in ("observer", "final")]
    flagged = {v.op_ids[0] for v in run.result.violations}
    starts = [float(o.start_ns) for o in ops] + [float(f.start_ns) for f in run.faults]
    # From just before the first thing that happened (server start-up is not shown).
    t0 = min(starts, default=float(run.started_ns)) - 100e6
    times = [float(o.start_ns) for o in ops] + [float(f.end_ns) for f in run.faults]
    times += [float(o.end_ns) for o in ops if not o.pending]
    t1 = max([*times, t0 + 1e9])
    plot_w = WIDTH - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + (t - t0) / (t1 - t0) * plot_w

    bars = lease_bars(ops)
    resources = sorted({o.resource for o in ops})
    by_resource: dict[str, list[Bar]] = defaultdict(list)
    for bar in bars:
        by_resource[bar.resource].append(bar)
    lanes: dict[str, tuple[float, int]] = {}
    y = float(TOP)
    for r in resources:
        rows = assign_rows(by_resource[r]) + 1  # a last row for writes without a bar
        lanes[r] = (y, rows)
        y += rows * ROW + LANE_GAP
    height = y + 24
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'viewBox="0 0 {WIDTH} {height:.0f}" font-family="sans-serif" font-size="{FONT}">'
    ]
    # Labels are laid out after every shape is known and drawn last, over them: the
    # fixed ones first (axis, lanes), then the marks they must not cover, then by
    # importance: faults, the writes that went wrong, the bars.
    labels = Labels([])
    texts: list[str] = []
    page = Box(0, 0, WIDTH, height)
    # Faults first, under everything.
    for f in run.faults:
        fx, fw = x(f.start_ns), max(2.0, x(f.end_ns) - x(f.start_ns))
        tip = f"{f.kind} {f.target}: {f.detail} ({(f.end_ns - f.start_ns) / 1e9:.2f} s)"
        out.append(
            f'<g><title>{_esc(tip)}</title><rect x="{fx:.1f}" y="{TOP - 6}" width="{fw:.1f}" '
            f'height="{height - TOP - 18:.0f}" fill="#e15759" fill-opacity="0.13" '
            f'stroke="#e15759" stroke-opacity="0.5" stroke-dasharray="4 3"/></g>'
        )
    # Time axis.
    span_s = (t1 - t0) / 1e9
    step = 1.0 if span_s <= 30 else 5.0
    tick = 0.0
    while tick <= span_s + 1e-9:
        tx = x(t0 + tick * 1e9)
        out.append(
            f'<line x1="{tx:.1f}" y1="{TOP - 6}" x2="{tx:.1f}" y2="{height - 20:.0f}" '
            f'stroke="#ddd" stroke-width="1"/>'
        )
        texts.append(labels.place(f"{tick:g}s", [(tx, height - 6, "middle")], page, fill="#555"))
        tick += step
    rows_of: dict[tuple[str, str, int], int] = {}
    placed_bars: list[tuple[Bar, float, float, float, Box]] = []
    for r in resources:
        top, rows = lanes[r]
        lane = Box(LEFT - 4, top - 4, WIDTH - RIGHT + 4, top + rows * ROW)
        out.append(
            f'<rect x="{LEFT - 4}" y="{top - 4:.1f}" width="{plot_w + 8}" '
            f'height="{rows * ROW + 4}" fill="none" stroke="#999" stroke-width="0.8"/>'
        )
        texts.append(
            labels.place(
                r,
                [(LEFT - 10, top + ROW * rows / 2 + 4, "end")],
                Box(0, top - 4, LEFT - 4, top + rows * ROW),
                size=13,
                bold=True,
            )
        )
        for bar in by_resource[r]:
            rows_of[(bar.process, r, bar.token)] = bar.row
            color = _color(bar.process, clients)
            bx, bw = x(bar.start), max(2.0, x(bar.end) - x(bar.start))
            by = top + bar.row * ROW
            placed_bars.append((bar, bx, bw, by, lane))
            tip = (
                f"{bar.process} holds {r} with token {bar.token}: "
                f"{(bar.start - t0) / 1e9:.3f}-{(bar.end - t0) / 1e9:.3f} s, ends {bar.how}"
            )
            dash = ' stroke-dasharray="3 2"' if bar.how in ("lost", "open", "unknown") else ""
            out.append(
                f'<g><title>{_esc(tip)}</title><rect x="{bx:.1f}" y="{by:.1f}" '
                f'width="{bw:.1f}" height="{ROW - 6}" rx="3" fill="{color}" '
                f'fill-opacity="0.35" stroke="{color}"{dash}/>'
            )
            if bar.tail > bar.end:
                # Still writing with this token after its lease ended: a thin tail.
                ty = by + (ROW - 6) / 2
                out.append(
                    f'<line x1="{bx + bw:.1f}" y1="{ty:.1f}" x2="{x(bar.tail):.1f}" '
                    f'y2="{ty:.1f}" stroke="{color}" stroke-width="2" '
                    f'stroke-dasharray="2 3"/>'
                )
            out.append("</g>")
    # The writes; the ones that went wrong are obstacles no label may cover.
    said: list[tuple[str, float, float, float, Box]] = []  # (text, x, y, offset, lane)
    labelled: set[tuple[str, int, bool]] = set()  # (resource, row, flagged): said once
    for o in sorted(ops, key=lambda o: o.start_ns if o.pending else o.end_ns):
        if o.op != "write" or o.token is None or o.resource not in lanes:
            continue
        top, rows = lanes[o.resource]
        row = rows_of.get((o.process, o.resource, o.token), rows - 1)
        when = float(o.start_ns if o.pending else o.end_ns)
        mx, my = x(when), top + row * ROW + (ROW - 6) / 2
        is_flagged = o.op_id in flagged
        out += _write_mark(o, mx, my, _color(o.process, clients), is_flagged, t0)
        if is_flagged or o.fail or not o.ok:
            radius = 10.0 if is_flagged else 6.0
            labels.block(Box(mx - radius, my - radius, mx + radius, my + radius))
        key = (o.resource, row, is_flagged)
        if (o.fail or is_flagged) and key not in labelled:
            labelled.add(key)
            lane = Box(LEFT - 4, top - 4, WIDTH - RIGHT + 4, top + rows * ROW)
            text = "stale, accepted" if is_flagged else (o.error or "rejected")
            said.append((text, mx, my, 13.0 if is_flagged else 9.0, lane))
    # No label lies on a bar but its own: over another it would hide that one's name,
    # or seem to be it.
    shapes = {id(bar): Box(bx, by, bx + bw, by + ROW - 6) for bar, bx, bw, by, _ in placed_bars}
    for shape in shapes.values():
        labels.block(shape)
    for i, f in enumerate(run.faults):
        fx, fw = x(f.start_ns), max(2.0, x(f.end_ns) - x(f.start_ns))
        first, second = (12, 24) if i % 2 == 0 else (24, 12)
        texts.append(
            labels.place(
                f.kind + " " + f.target,
                [(fx + 3, first, "start"), (fx + 3, second, "start"),
                 (fx + fw - 3, first, "end"), (fx + fw - 3, second, "end")],
                Box(0, 0, WIDTH, TOP - 6),
                fill="#b03030",
                bold=True,
            )
        )  # fmt: skip
    for text, mx, my, off, lane in said:
        fill = FLAGGED if text == "stale, accepted" else REJECTED
        spots = [
            (mx + off, my + 4 + dy, anchor)
            if anchor == "start"
            else (mx - off, my + 4 + dy, anchor)
            for dy in (0.0, -ROW, ROW, -2 * ROW, 2 * ROW)
            for anchor in ("start", "end")
        ]
        texts.append(labels.place(text, spots, lane, fill=fill, bold=True))
    # Every bar is named: inside it if the name fits, else just after or before it, or
    # in the free space of the row below or above; else by its token alone.
    for bar, bx, bw, by, lane in placed_bars:
        rows = lanes[bar.resource][1]
        shape = shapes[id(bar)]
        inside = Box(bx + 1, by, bx + bw - 1, by + ROW - 6)
        baseline = by + ROW - 11
        drawn = ""
        near: list[tuple[float, float, str]] = [
            (bx + bw + 3, baseline, "start"),
            (bx - 3, baseline, "end"),
        ]
        # The free space of a row below or above, nearest first.
        other_rows: list[tuple[float, float, str]] = [
            spot
            for dy in sorted(range(-bar.row, rows - bar.row), key=abs)[1:]
            for spot in (
                (bx, baseline + dy * ROW, "start"),
                (bx + bw, baseline + dy * ROW, "end"),
            )
        ]
        names = (f"{bar.process} t{bar.token}", f"t{bar.token}")
        within = [(bx + 4, baseline, "start"), (bx + bw / 2, baseline, "middle")]
        drawn = ""
        # Closeness first: the name, or the token alone, on or beside the bar; only
        # then in another row.
        for tier in (near, other_rows):
            for text in names:
                drawn = labels.place(text, within, inside, own=shape) if tier is near else ""
                drawn = drawn or labels.place(text, tier, lane)
                if drawn:
                    break
            if drawn:
                break
        texts.append(drawn)
    out += [t for t in texts if t]
    out.append("</svg>")
    return "".join(out)


_CSS: Final = """
body { font-family: sans-serif; margin: 18px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 22px 0 6px; }
.pass { color: #1a7f37; font-weight: bold; }
.fail { color: #c62828; font-weight: bold; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; font-size: 13px; }
th { background: #f2f2f2; }
td.no { color: #c62828; font-weight: bold; }
td.yes { color: #1a7f37; font-weight: bold; }
.legend span { display: inline-block; margin-right: 16px; font-size: 12px; }
.legend svg { vertical-align: middle; }
ul.v { font-size: 12px; margin: 4px 0; }
.muted { color: #666; font-size: 12px; }
"""


def _legend(clients: list[str]) -> str:
    items = []
    for i, c in enumerate(clients):
        color = PALETTE[i % len(PALETTE)]
        items.append(
            f'<span><svg width="26" height="12"><rect x="1" y="1" width="24" height="10" '
            f'rx="2" fill="{color}" fill-opacity="0.35" stroke="{color}"/></svg> {_esc(c)}</span>'
        )
    items.append(
        '<span><svg width="12" height="16"><line x1="6" y1="1" x2="6" y2="15" stroke="#333" '
        'stroke-width="2"/></svg> write accepted</span>'
    )
    items.append(
        f'<span><svg width="16" height="16"><path d="M2,2L14,14M2,14L14,2" stroke="{REJECTED}" '
        f'stroke-width="3"/></svg> write rejected (stale token)</span>'
    )
    items.append(
        f'<span><svg width="14" height="14"><circle cx="7" cy="7" r="4.5" fill="white" '
        f'stroke="{UNKNOWN}" stroke-width="2"/></svg> write of unknown outcome</span>'
    )
    items.append(
        f'<span><svg width="24" height="24"><circle cx="12" cy="12" r="10" fill="none" '
        f'stroke="{FLAGGED}" stroke-width="3"/></svg> stale write accepted (violation)</span>'
    )
    items.append(
        '<span><svg width="26" height="14"><rect x="1" y="1" width="24" height="12" '
        'fill="#e15759" fill-opacity="0.13" stroke="#e15759" stroke-dasharray="4 3"/></svg> '
        "fault window</span>"
    )
    items.append(
        '<span><svg width="26" height="12"><rect x="1" y="1" width="24" height="10" rx="2" '
        'fill="#bbb" fill-opacity="0.35" stroke="#888" stroke-dasharray="3 2"/></svg> '
        "lease that ended lost (dashed), dotted: writes after it ended</span>"
    )
    return '<div class="legend">' + "".join(items) + "</div>"


def render_html(result: ScenarioResult) -> str:
    """The self-contained HTML report of a scenario result."""
    clients = [f"c{i}" for i in range(result.config.clients)]
    rows = verdict_rows(result)
    columns = list(rows[0]) if rows else []
    table = ["<table><tr>", *(f"<th>{_esc(c)}</th>" for c in columns), "</tr>"]
    for r in rows:
        table.append("<tr>")
        for c in columns:
            css = f' class="{"yes" if r[c] == "yes" else "no"}"' if c == "valid" else ""
            table.append(f"<td{css}>{_esc(r[c])}</td>")
        table.append("</tr>")
    table.append("</table>")
    verdict_css = "pass" if result.passed else "fail"
    body = [
        f"<h1>chaos: {_esc(result.config.scenario)}</h1>",
        f'<div class="muted">{_esc(headline(result))}</div>',
        f"<p>{_esc(result.scenario.summary)}.</p>",
        f'<p class="{verdict_css}">{_esc(conclusion(result))}</p>',
        "".join(table),
        _legend(clients),
    ]
    for run in result.runs:
        what = (
            f"guard fence mode {run.guard_mode}"
            if run.label != "control"
            else "guard fencing OFF (the control), judged as " + run.checked_mode
        )
        body.append(f"<h2>{_esc(run.label)} run: {_esc(what)}</h2>")
        body.append(f'<div class="muted">{_esc(_run_line(run))}</div>')
        body.append(timeline_svg(run, clients))
        if run.result.violations:
            body.append('<ul class="v">')
            for v in run.result.violations[:12]:
                body.append(f"<li><b>{_esc(v.kind)}</b> {_esc(v.resource)}: {_esc(v.detail)}</li>")
            if len(run.result.violations) > 12:
                body.append(f"<li>... and {len(run.result.violations) - 12} more</li>")
            body.append("</ul>")
        for err in run.errors:
            body.append(f'<p class="fail">harness: {_esc(err)}</p>')
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>chaos {_esc(result.config.scenario)}</title><style>{_CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>"
    )


def _run_line(run: RunOutcome) -> str:
    s = run.result.stats
    ops = sum(sum(t.values()) for t in s.ops.values())
    writes = s.ops.get("write", {})
    return (
        f"{ops} operations; writes ok {writes.get('ok', 0)}, rejected {writes.get('fail', 0)}, "
        f"unknown {writes.get('info', 0)}; violations: {_kinds(run.result)}; "
        f"faults: {', '.join(f'{f.kind} {f.target}' for f in run.faults) or 'none'}"
    )


# -- files --------------------------------------------------------------------------------------


def load_result(out_dir: Path) -> ScenarioResult:
    """Rebuild a result from what :func:`write_report` and the runs left in ``out_dir``.

    The histories are checked again (the checker is pure), so a report can be
    redrawn, or re-judged by a newer checker, without running anything.
    """
    raw = json.loads((out_dir / "result.json").read_text(encoding="utf-8"))
    c = raw["config"]
    config = RunConfig(
        scenario=raw["scenario"],
        backend=c["backend"],
        fence_mode=c["fence_mode"],
        clients=c["clients"],
        resources=c["resources"],
        duration=c["duration_s"],
        seed=c["seed"],
        control=c["control"],
    )
    runs: dict[str, RunOutcome] = {}
    for label, r in raw["runs"].items():
        workdir = out_dir / label
        events = read_history(workdir / "history")
        runs[label] = RunOutcome(
            label=label,
            guard_mode=r["guard_mode"],
            checked_mode=r["checked_mode"],
            result=check(events, mode=r["checked_mode"]),
            events=events,
            faults=read_faults(workdir / "faults.jsonl"),
            workdir=workdir,
            started_ns=int(r.get("started_ns", 0)),
            ended_ns=int(r.get("ended_ns", 0)),
            errors=list(r.get("errors", [])),
            seed=r.get("seed"),
        )
    return ScenarioResult(config, SCENARIOS[config.scenario], runs["fenced"], runs.get("control"))


def write_report(result: ScenarioResult, out_dir: Path) -> tuple[Path, Path]:
    """Write ``result.json`` and ``timeline.html`` into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "result.json"
    json_path.write_text(json.dumps(result_json(result), indent=2) + "\n", encoding="utf-8")
    html_path = out_dir / "timeline.html"
    html_path.write_text(render_html(result), encoding="utf-8")
    return json_path, html_path


__all__ = [
    "assign_rows",
    "lease_bars",
    "load_result",
    "percentile",
    "render_html",
    "result_json",
    "timeline_svg",
    "verdict_rows",
    "verdict_table",
    "write_report",
]
