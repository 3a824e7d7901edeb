"""``python -m bench``: every benchmark in one run, each table printed with its ratios.

    python -m bench                      # every section whose server is reachable
    python -m bench --only floor,redis   # some sections
    python -m bench --duration 5         # longer measurements
    python -m bench --clients 1,16       # client counts
    python -m bench --all                # everything, and bench/RESULTS.md written
    python -m bench --queue              # also the queue (service vs hand-written SQL)
    python -m bench --all --queue --pglog  # every section, opt-in ones too, in RESULTS.md

Sections: ``floor`` (the empty gRPC call, and the embedded SQLite servers against it),
``redis`` (redis-py Lock, raw EVALSHA, our servers on Redis), ``postgres`` (the guard's
check-and-write SQL one call, client-side and batched, the store, our servers on
PostgreSQL; ``FENCING_BENCH_POSTGRES_DSN``), ``modes`` (what the promise and a watch
guard add to taking a lease, and the watch delivery delay), ``throughput`` (guarded
writes per second against the backend's own check-and-write), ``cpu`` (server and
client CPU per operation of the lease and guard calls over their floors: a bare grpc.aio
echo, our empty call, our stream's ping; ``--old REF`` measures that ref's servers
beside, in alternating rounds), ``price`` (the price of
fencing per store: guard Write and WriteStream against the same upsert done directly),
``scale`` (latency with
1,000 against 1,000,000 resources), ``sessions`` (one client holding 100,000 leases),
``peers`` (etcd, PostgreSQL advisory locks and redis-py Lock next to ours), ``pglog``
(PostgreSQL's lease path against SQLite's, gRPC and in process, two servers, release to
waiter and watch delays; ``FENCING_BENCH_BEFORE=<commit>`` adds that commit's servers;
only with ``--pglog`` or ``--only pglog``), ``queue``
(jobs/s through the QueueService next to hand-written SKIP LOCKED SQL on PostgreSQL, and our
worker next to procrastinate's when it is installed (``bench/queue_peer.py``); only with
``--queue`` or ``--only queue``), ``console`` (the web console's leases page with
100,000 held leases against the CLI's own ``List`` call, and its Watch streams). A
section whose server is unreachable is skipped with a note, never faked. Progress goes
to stderr, tables to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import Result, baseline_of, markdown, progress, table
from fencing.errors import FencingError

RESULTS_MD = Path(__file__).with_name("RESULTS.md")


@dataclass
class Report:
    """What a section produced: rows (ratio tables), or its own text and Markdown, notes
    (skipped parts), and its lines for the summary of targets."""

    results: list[Result] = field(default_factory=list)
    text: str = ""
    markdown: str = ""
    notes: list[str] = field(default_factory=list)
    #: (target, what was measured, met?) rows for RESULTS.md's summary.
    targets: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Options:
    clients: list[int]
    duration: float
    session_hold: float = 120.0
    scale_size: int = 1_000_000
    #: A git ref whose servers the ``cpu`` section measures beside this tree's.
    old: str = ""


Section = Callable[[Options], Awaitable[list[Result] | Report]]


async def _floor(o: Options) -> Report:
    from bench import floor

    report = Report(results=await floor.run(o.clients, o.duration))
    for r in report.results:
        base = baseline_of(r, report.results)
        if not r.name.endswith("via Session") or base is None or not base.rate:
            continue
        unary = next(
            (u for u in report.results if u.name == floor.unary_name("sqlite") and
             u.concurrency == r.concurrency),
            None,
        )  # fmt: skip
        ratio = r.rate / base.rate
        figure = f"{r.rate:,.0f} ops/s = {ratio:.2f}x ({base.rate:,.0f} calls/s)"
        if unary is not None:
            figure += (
                f"; p50/p99 {r.percentile(0.5) * 1000:.2f}/{r.percentile(0.99) * 1000:.2f} ms "
                f"vs unary {unary.percentile(0.5) * 1000:.2f}/"
                f"{unary.percentile(0.99) * 1000:.2f} ms; {r.note}"
            )
        report.targets.append(
            (
                f"sqlite: Acquire+Release via Session / {r.baseline}, per operation "
                f"({r.concurrency} clients) >= 2",
                figure,
                "yes" if ratio >= 2 else "**no**",
            )
        )
    return report


async def _redis(o: Options) -> list[Result]:
    from bench import redis

    return await redis.run(o.clients, o.duration, servers=True)


async def _modes(o: Options) -> list[Result]:
    from bench import modes

    return await modes.run(o.clients, o.duration)


async def _postgres(o: Options) -> list[Result]:
    from bench import postgres

    return await postgres.run(o.clients, o.duration, servers=True)


#: The queue's targets next to procrastinate: (our row, procrastinate's row, concurrency,
#: what, bound, higher is better). Enqueue is held like for like: procrastinate's
#: ``defer`` is SQL on the application's connection, and so is ``fencing.pg.enqueue``
#: (the QueueService's gRPC Enqueue adds a network hop and a server; its row is reported).
QUEUE_PEER_TARGETS = (
    (
        "enqueue x1 in the caller's transaction (fencing.pg.enqueue)",
        "enqueue x1",
        1,
        "enqueue one job per transaction with fencing.pg.enqueue",
        1.0,
        True,
    ),
    ("drain", "drain", 1, "drain at concurrency 1", 1.0, True),
    ("drain", "drain", 8, "drain at concurrency 8", 2.0, True),
    (
        "enqueue-to-start latency",
        "enqueue-to-start latency",
        1,
        "p50 enqueue-to-start latency",
        1.0,
        False,
    ),
)


async def _pglog(o: Options) -> Report:
    from bench import pglog

    rows, lines = await pglog.run(o.clients, o.duration, os.environ.get("FENCING_BENCH_BEFORE", ""))
    report = Report(results=rows, text="\n".join([*pglog.ratios(rows), *lines]))
    for line in pglog.ratios(rows):
        target, _, figure = line.rpartition(": ")
        report.targets.append((target, figure, "measured"))
    return report


async def _queue(o: Options) -> Report:
    from bench import queue, queue_peer

    report = Report()
    report.results = await queue.run(o.clients, o.duration)
    peer = await queue_peer.run(queue.default_dsn(), o.duration, report.notes)
    report.results += peer
    rows = {(r.name.split(": ", 1)[0], r.name.split(": ", 1)[1], r.concurrency): r for r in peer}
    for our_label, their_label, n, what, bound, higher in QUEUE_PEER_TARGETS:
        ours = rows.get((queue_peer.OURS, our_label, n))
        theirs = next(
            (
                r
                for (side, lbl, c), r in rows.items()
                if side != queue_peer.OURS and lbl == their_label and c == n
            ),
            None,
        )
        if ours is None or theirs is None:
            continue
        if higher:
            ratio = ours.rate / theirs.rate if theirs.rate else 0.0
            figure = f"{ours.rate:,.0f} jobs/s = {ratio:.2f}x ({theirs.rate:,.0f})"
            met = ratio >= bound
        else:
            mine, peer_p50 = ours.percentile(0.5), theirs.percentile(0.5)
            ratio = mine / peer_p50 if peer_p50 else 0.0
            figure = f"p50 {mine * 1000:.2f} ms = {ratio:.2f}x ({peer_p50 * 1000:.2f} ms)"
            met = ratio <= bound
        sign = ">=" if higher else "<="
        report.targets.append((f"queue: {what} {sign} {bound:g}x procrastinate", figure, _met(met)))
    return report


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


async def _throughput(o: Options) -> Report:
    from bench import throughput

    report = Report()
    for backend, direct in (("postgres", throughput.PG_DIRECT), ("redis", throughput.REDIS_DIRECT)):
        try:
            rows = await throughput.run(o.clients, o.duration, only=(backend,))
        except (OSError, RuntimeError, ConnectionError) as exc:
            report.notes.append(f"{backend}: skipped ({type(exc).__name__}: {exc})")
            continue
        report.results += rows
        base = next(r for r in rows if r.name == direct)
        streams = [r for r in rows if "WriteStream" in r.name]
        best = max(streams, key=lambda r: r.rate)
        ratio = best.rate / base.rate if base.rate else 0.0
        report.targets.append(
            (
                f"{backend}: guarded writes >= 0.5x the backend's own check-and-write",
                f"{best.name}: {best.rate:,.0f} ops/s = {ratio:.2f}x {direct} "
                f"({base.rate:,.0f} ops/s)",
                _met(ratio >= 0.5),
            )
        )
    return report


async def _cpu(o: Options) -> Report:
    from bench import cpu

    rows = await cpu.run(o.clients, o.duration, o.old)
    text = cpu.markdown(rows, max(o.clients))
    if table := cpu.loops(rows):
        text += "\n\nThe servers' event loop (same rounds):\n\n" + table
    if table := cpu.storage(rows):
        text += "\n\nWithout storage, the same servers on `memory://` (same rounds):\n\n" + table
    if table := cpu.versus_markdown(rows):
        text += (
            "\n\nNext to etcd's lock+unlock (etcd 3.4 here, its JSON gateway, a stdlib "
            "keep-alive HTTP client per client; same rounds; pinned: measured after, every "
            "server on CPU 0, this process on CPU 1):\n\n" + table
        )
    report = Report(text=text, markdown=text)
    for target, figure, met in cpu.targets(rows):
        report.targets.append((target, figure, _met(met)))
    return report


async def _price(o: Options) -> Report:
    from bench import price

    report = Report()
    report.results = await price.run(o.clients, o.duration, report.notes)
    for row, figure in price.prices(report.results):
        report.targets.append((row, figure, "measured"))
    return report


async def _scale(o: Options) -> Report:
    from bench import scale

    report = Report()
    for backend in ("postgres", "redis", "sqlite"):
        try:
            rows = await scale.run(max(4.0, 2 * o.duration), large=o.scale_size, only=(backend,))
        except (OSError, RuntimeError, ConnectionError) as exc:
            report.notes.append(f"{backend}: skipped ({type(exc).__name__}: {exc})")
            continue
        report.results += rows
        for name, p50, p99 in scale.p50_ratio(rows):
            report.targets.append(
                (
                    f"{name.split(':')[0]}: {name.split(': ')[1].split(',')[0]} latency with "
                    f"{o.scale_size:,} resources within 1.3x of 1,000",
                    f"p50 {p50:.2f}x, p99 {p99:.2f}x",
                    _met(p50 <= 1.3 and p99 <= 1.3),
                )
            )
    return report


async def _sessions(o: Options) -> Report:
    from bench import sessions

    report = Report()
    runs: list[sessions.SessionRun] = []
    for backend in ("sqlite", "postgres"):
        try:
            runs += await sessions.run(hold_s=o.session_hold, backends=(backend,))
        except (OSError, RuntimeError, ConnectionError) as exc:
            report.notes.append(f"{backend}: skipped ({type(exc).__name__}: {exc})")
    if runs:
        report.text = sessions.table(runs)
        report.markdown = sessions.markdown(runs)
    for r in runs:
        report.targets.append(
            (
                f"{r.backend}: one client, {r.leases:,} leases (ttl {r.ttl:g} s) held "
                f"{r.hold_s:.0f} s: 0 expirations, <= 10 calls/s, server < 0.5 core",
                f"{r.expirations} expirations, {r.calls_per_s:.2f} calls/s "
                f"({r.calls_per_s_total:.2f} incl. acquire and release), "
                f"{r.server_cores:.3f} cores",
                _met(r.expirations == 0 and r.calls_per_s <= 10 and r.server_cores < 0.5),
            )
        )
    return report


#: P5's floor per backend (streamed Acquire+Release over etcd lock+unlock).
P5_FLOORS = {"sqlite": 2.0, "redis": 2.0, "postgres": 1.5}


async def _peers(o: Options) -> Report:
    from bench import peers

    report = Report()
    report.results = await peers.run(o.clients, o.duration, notes=report.notes)
    for r in report.results:
        if r.name.startswith("ours") and "Session" in r.name:
            base = baseline_of(r, report.results)
            if r.concurrency != max(o.clients) or base is None or not base.rate:
                continue
            backend = r.name.split("(")[1].split(")")[0]
            floor = P5_FLOORS.get(backend, 2.0)
            ratio = r.rate / base.rate
            how = "one shared Session" if "shared" in r.name else "Session"
            report.targets.append(
                (
                    f"P5 {backend}: Acquire+Release via {how} / {r.baseline} "
                    f"({r.concurrency} clients) >= {floor:.1f} (3.0 the aim)",
                    f"{r.rate:,.0f} ops/s = {ratio:.2f}x ({base.rate:,.0f})",
                    "yes" if ratio >= floor else "**no**",
                )
            )
            continue
        if r.name.startswith("ours") and r.concurrency == max(o.clients):
            base = baseline_of(r, report.results)
            if base is not None and base.rate:
                report.targets.append(
                    (
                        f"side by side with {r.baseline} ({r.concurrency} clients)",
                        f"{r.name}: {r.rate:,.0f} ops/s = {r.rate / base.rate:.2f}x "
                        f"({base.rate:,.0f}); p50 {r.percentile(0.5) * 1000:.2f} ms vs "
                        f"{base.percentile(0.5) * 1000:.2f} ms",
                        "measured",
                    )
                )
    return report


async def _console(o: Options) -> Report:
    from bench import console

    run = await asyncio.to_thread(console.measure, 100_000, 20)
    report = Report(text=console.markdown(run), markdown=console.markdown(run))
    report.targets.append(
        (
            "console: leases page with 100,000 held leases < 300 ms a page; "
            "one Watch stream however many tabs",
            f"slowest page {run.slowest_page_ms:.1f} ms; Watch streams {run.idle_streams} idle, "
            f"{run.streams_with_tabs} with {console.TABS} tabs",
            _met(run.slowest_page_ms < console.TARGET_MS and run.streams_with_tabs == 1),
        )
    )
    return report


async def _transport(o: Options) -> list[Result]:
    from bench import transport

    return await transport.run(o.clients, o.duration)


SECTIONS: dict[str, tuple[str, Section]] = {
    "floor": ("RPC floor and the embedded default (SQLite)", _floor),
    "cpu": ("CPU per operation, server and client, against the transport's floor", _cpu),
    "redis": ("Redis: our scripts and servers next to redis-py Lock and raw EVALSHA", _redis),
    "postgres": ("PostgreSQL: check-and-write SQL against SELECT 1, and our servers", _postgres),
    "modes": ("Closing the monotonic window: promise and watch (SQLite)", _modes),
    "throughput": (
        "Throughput: guarded writes against the backend's own check-and-write",
        _throughput,
    ),
    "price": ("The price of fencing: a guarded write against the same write done directly", _price),
    "scale": ("State at scale: 1,000 against 1,000,000 resources", _scale),
    "sessions": ("Sessions: one client holding 100,000 leases", _sessions),
    "peers": ("Peers: etcd, PostgreSQL advisory locks and redis-py Lock next to ours", _peers),
    "queue": (
        "Queue: the QueueService next to hand-written SQL and procrastinate",
        _queue,
    ),
    "pglog": ("PostgreSQL's lease path against SQLite's (P6, P7, P7b)", _pglog),
    "transport": ("The SDK's lease stream against its unary calls (SQLite)", _transport),
    "console": ("The web console's leases page with 100,000 held leases", _console),
}
#: Sections run only when asked for (``--queue``, or ``--only``).
OPT_IN = {"queue", "pglog"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    p.add_argument("--clients", default="1,16", help="comma-separated client counts")
    p.add_argument(
        "--only",
        default=",".join(n for n in SECTIONS if n not in OPT_IN),
        help="comma-separated sections (default: %(default)s)",
    )
    p.add_argument("--queue", action="store_true", help="add the queue section")
    p.add_argument("--pglog", action="store_true", help="add the pglog section")
    p.add_argument("--all", action="store_true", help="every section, and write bench/RESULTS.md")
    p.add_argument("--results", type=Path, default=RESULTS_MD, help="where --all writes")
    p.add_argument(
        "--session-hold", type=float, default=120.0, help="seconds the sessions section holds"
    )
    p.add_argument(
        "--scale-size",
        type=int,
        default=1_000_000,
        help="resources of the scale section's large run",
    )
    p.add_argument(
        "--old", default="", help="cpu section: a git ref whose servers run beside this tree's"
    )
    return p


async def _run(names: list[str], options: Options) -> dict[str, tuple[Report, float]]:
    done: dict[str, tuple[Report, float]] = {}
    for number, name in enumerate(names, start=1):
        title, section = SECTIONS[name]
        progress(f"[{number}/{len(names)}] {title}")
        started = time.perf_counter()
        try:
            outcome = await section(options)
        except (OSError, RuntimeError, ConnectionError, FencingError) as exc:
            # A server that failed mid-section (a backend too slow under load) loses that
            # section, not the whole run.
            report = Report(notes=[f"skipped ({type(exc).__name__}: {exc})"])
            print(f"\n{title}: skipped ({type(exc).__name__}: {exc})", flush=True)
        else:
            report = outcome if isinstance(outcome, Report) else Report(results=outcome)
            print("\n" + (table(report.results, title) if report.results else title), flush=True)
            if report.text:
                print(report.text, flush=True)
            for note in report.notes:
                print(f"  note: {note}", flush=True)
            for target, figure, met in report.targets:
                print(f"  target: {target}: {figure} (met: {met.strip('*')})", flush=True)
        elapsed = time.perf_counter() - started
        progress(f"[{number}/{len(names)}] {title}: {elapsed:.0f} s")
        done[name] = (report, elapsed)
    return done


def _command(*args: str) -> str:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "?"


def machine() -> list[str]:
    """What the figures were measured on."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"{mem_kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        memory = "?"
    return [
        f"host `{platform.node()}`: {platform.system()} {platform.release()}, {platform.machine()}",
        f"CPU: {os.cpu_count()} cores ({cpu}); memory {memory}",
        f"Python {platform.python_version()} ({platform.python_implementation()})",
        f"PostgreSQL: {_command('psql', '--version')}",
        f"Redis: {_command('redis-server', '--version')}",
        f"etcd: {_command('etcd', '--version')}",
    ]


#: Sections of RESULTS.md that belong to the run that wrote it, never carried over.
RUN_SECTIONS = ("Machine", "Targets")


@dataclass(frozen=True)
class Written:
    """One ``## `` section of a RESULTS.md as it stands: its title, the bench section it
    holds (its ``Section `name``` line says, else its title; None for one written by
    hand), and its text from the heading line up to the next heading, verbatim."""

    title: str
    name: str | None
    text: str


def sections_of(markdown_text: str) -> list[Written]:
    """The ``## `` sections of a RESULTS.md, in order (what precedes the first is the
    run's own header and is left out)."""
    found: list[Written] = []
    title: str | None = None
    body: list[str] = []

    def close() -> None:
        if title is not None:
            name = next(
                (
                    line.split("`")[1]
                    for line in body[1:]
                    if line.startswith("Section `") and line.count("`") >= 2
                ),
                None,
            )
            if name is None:
                name = next((n for n, (t, _) in SECTIONS.items() if t == title), None)
            found.append(Written(title, name, "".join(body)))

    for line in markdown_text.splitlines(keepends=True):
        if line.startswith("## "):
            close()
            title, body = line[3:].strip(), [line]
        elif title is not None:
            body.append(line)
    close()
    return found


def measured(report: Report) -> bool:
    """True if the section produced figures (not only a note that it was skipped)."""
    return bool(report.results or report.text or report.markdown)


def carried_over(previous: str, done: dict[str, tuple[Report, float]]) -> list[Written]:
    """The sections of the previous RESULTS.md that this run did not measure (opt-in
    sections it did not run, sections it skipped, sections written by hand), to keep
    verbatim: each names the run it came from in its own header."""
    ran = {name for name, (report, _) in done.items() if measured(report)}
    return [
        s
        for s in sections_of(previous)
        if s.title not in RUN_SECTIONS and (s.name is None or s.name not in ran)
    ]


def write_results(
    path: Path, done: dict[str, tuple[Report, float]], options: Options, started: str, took: float
) -> None:
    """Write RESULTS.md: this run's header, targets and sections, then every section of
    the RESULTS.md already at ``path`` that this run did not measure, verbatim."""
    previous = path.read_text(encoding="utf-8") if path.exists() else ""
    kept = carried_over(previous, done)
    # Skipped this time (its server unreachable): its earlier figures are carried over.
    skipped = {
        name: report
        for name, (report, _) in done.items()
        if not measured(report) and any(s.name == name for s in kept)
    }
    load = os.getloadavg()
    lines = [
        "# Benchmark results",
        "",
        f"Written by `python -m bench --all` on {started} (took {took / 60:.1f} min; "
        f"{options.duration:g} s per measurement, clients {','.join(map(str, options.clients))}).",
        "Every figure is measured in the same run as what it is compared with; a ratio is "
        "ops/s over the baseline row's ops/s (for latency rows, see the note).",
        "",
        "## Machine",
        "",
        *[f"- {line}" for line in machine()],
        f"- load average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (other "
        "processes shared the machine; absolute figures move with them, ratios less)",
        "",
        "## Targets",
        "",
        "| target | measured | met |",
        "| --- | --- | --- |",
    ]
    for report, _ in done.values():
        for target, figure, met in report.targets:
            lines.append(f"| {target} | {figure} | {met} |")
    for name, (report, elapsed) in done.items():
        if name in skipped:
            continue
        title, _ = SECTIONS[name]
        lines += [
            "",
            f"## {title}",
            "",
            f"Section `{name}`, {elapsed:.0f} s, run of {started}.",
            "",
        ]
        module = sys.modules.get(f"bench.{name}")
        if module is not None and module.__doc__:
            lines += [module.__doc__.strip(), ""]
        if report.results:
            lines += [markdown(report.results), ""]
        if report.markdown:
            lines += [report.markdown, ""]
        for note in report.notes:
            lines.append(f"- note: {note}")
    if kept:
        why = ", ".join(
            f"`{n}` ({'; '.join(r.notes) or 'nothing measured'})" for n, r in skipped.items()
        )
        lines += [
            "",
            "The sections below were not measured by this run (opt-in sections it did not run"
            + (f"; skipped by it: {why}" if why else "")
            + "): each is carried over verbatim from the earlier RESULTS.md and names the "
            "run it came from.",
            "",
        ]
    text = "\n".join(lines).rstrip() + "\n"
    for section in kept:
        text += "\n" + section.text.rstrip() + "\n"
    path.write_text(text, encoding="utf-8")


def sections_to_run(args: argparse.Namespace) -> list[str]:
    """``--all``: every section but the opt-in ones; else ``--only``'s. ``--queue`` and
    ``--pglog`` add theirs to either, so one ``--all`` run can write them all."""
    names = (
        [n for n in SECTIONS if n not in OPT_IN]
        if args.all
        else [n for n in args.only.split(",") if n]
    )
    for name in sorted(OPT_IN):
        if getattr(args, name) and name not in names:
            names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    names = sections_to_run(args)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        print(
            f"unknown section(s): {', '.join(unknown)}; known: {', '.join(SECTIONS)}",
            file=sys.stderr,
        )
        return 2
    options = Options(
        clients=[int(c) for c in args.clients.split(",") if c],
        duration=args.duration,
        session_hold=args.session_hold,
        scale_size=args.scale_size,
        old=args.old,
    )
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    print(
        f"fencing bench on {platform.node()} ({platform.python_implementation()} "
        f"{platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores), {started}",
        flush=True,
    )
    t0 = time.perf_counter()
    done = asyncio.run(_run(names, options))
    took = time.perf_counter() - t0
    if args.all:
        write_results(args.results, done, options, started, took)
        progress(f"wrote {args.results} ({took / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
