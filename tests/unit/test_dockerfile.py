"""The Dockerfile keeps its state on a volume and checks its own health (no Docker engine
here: the file is parsed, instruction by instruction, as Docker reads it).

The parser follows the Dockerfile reference for what these checks need: ``#`` comment
lines (and parser directives) are dropped, a trailing ``\\`` continues the instruction
on the next line (comment lines inside a continuation are skipped), the keyword is
case-insensitive, and arguments are the JSON exec form when they parse as a JSON array
of strings, else the shell form (split like a shell would, for the checks).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fencingctl import healthcheck, serve
from fencingctl import parser as fencing_parser

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case
    raw: str  # the arguments as written, continuations joined
    line: int

    @property
    def words(self) -> list[str]:
        """Exec form as given, shell form split into words."""
        try:
            value = json.loads(self.raw)
        except ValueError:
            return shlex.split(self.raw)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        return shlex.split(self.raw)


def parse_dockerfile(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # a comment, or a blank line between instructions
        if not pending:
            start = n
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        joined = " ".join(p for p in pending if p)
        pending = []
        keyword, _, rest = joined.partition(" ")
        out.append(Instruction(keyword.upper(), rest.strip(), start))
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return out


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    froms = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    return instructions[froms[-1] :]


def test_the_parser_reads_continuations_comments_and_both_forms() -> None:
    parsed = parse_dockerfile(
        "# syntax=docker/dockerfile:1\nFROM a AS b\nrun x \\\n  # inside\n  && y\n"
        'VOLUME ["/d"]\nHEALTHCHECK --interval=1s \\\n    CMD ["p", "q r"]\nVOLUME /e /f\n'
    )
    assert [(i.keyword, i.line) for i in parsed] == [
        ("FROM", 2),
        ("RUN", 3),
        ("VOLUME", 6),
        ("HEALTHCHECK", 7),
        ("VOLUME", 9),
    ]
    assert parsed[1].raw == "x && y"
    assert parsed[2].words == ["/d"] and parsed[4].words == ["/e", "/f"]
    assert parsed[3].raw == '--interval=1s CMD ["p", "q r"]'


DOCKERFILE = parse_dockerfile((ROOT / "Dockerfile").read_text())
FINAL = final_stage(DOCKERFILE)


def env_of(stage: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in stage:
        if ins.keyword == "ENV":
            for word in shlex.split(ins.raw):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def test_the_data_directory_is_a_volume_declared_after_it_is_owned() -> None:
    data_dir = env_of(FINAL)["FENCING_DATA_DIR"]
    assert data_dir == serve_data_dir_in_the_image()
    volumes = [(n, ins) for n, ins in enumerate(FINAL) if ins.keyword == "VOLUME"]
    assert volumes, "the runtime stage declares a VOLUME"
    declared = {path for _, ins in volumes for path in ins.words}
    assert data_dir in declared
    # Docker copies the image's directory (owner included) into a new named volume:
    # the chown must come before the VOLUME, or later RUN changes to it are discarded.
    owned = [n for n, ins in enumerate(FINAL) if ins.keyword == "RUN" and "chown" in ins.raw]
    assert owned and max(owned) < min(n for n, _ in volumes)
    assert not any(ins.keyword == "RUN" for ins in FINAL[min(n for n, _ in volumes) :])


def serve_data_dir_in_the_image() -> str:
    """Where ``fencing serve`` keeps its files in the image: FENCING_DATA_DIR, which its
    data_dir option reads (the CMD passes no --data-dir of its own)."""
    option = next(o for o in serve.OPTIONS if o.key == "data_dir")
    assert option.env == "FENCING_DATA_DIR"
    cmd = next(ins for ins in reversed(FINAL) if ins.keyword == "CMD").words
    assert cmd[:2] == ["fencing", "serve"] and "--data-dir" not in cmd
    return env_of(FINAL)["FENCING_DATA_DIR"]


def test_the_healthcheck_asks_both_servers_the_cmd_starts() -> None:
    (check,) = [ins for ins in FINAL if ins.keyword == "HEALTHCHECK"]
    options, _, command = check.raw.partition("CMD")
    assert re.search(r"--interval=\d+s", options) and re.search(r"--timeout=\d+s", options)
    words = Instruction("CMD", command.strip(), check.line).words
    assert words[0] == "fencing"
    args = fencing_parser().parse_args(words[1:])
    assert args.run is healthcheck.run
    cmd = next(ins for ins in reversed(FINAL) if ins.keyword == "CMD").words
    ports = [
        cmd[cmd.index(flag) + 1].rsplit(":", 1)[1] for flag in ("--lease-listen", "--guard-listen")
    ]
    assert args.addresses == [f"127.0.0.1:{port}" for port in ports]
    exposed = {w for ins in FINAL if ins.keyword == "EXPOSE" for w in ins.words}
    assert set(ports) <= exposed


def test_the_readme_docker_example_keeps_the_data_on_a_named_volume() -> None:
    readme = (ROOT / "README.md").read_text()
    runs = [line for line in readme.splitlines() if "docker run" in line]
    assert runs, "the README shows docker run"
    data_dir = env_of(FINAL)["FENCING_DATA_DIR"]
    for line in runs:
        mount = re.search(r"(?:-v|--volume)[ =](\S+):(\S+)", line)
        assert mount is not None, f"no volume in: {line}"
        name, target = mount.groups()
        assert target == data_dir
        assert "/" not in name and not name.startswith("."), "a named volume, not a path"
        assert "--rm" not in line


def test_compose_keeps_every_stateful_service_on_a_named_volume() -> None:
    compose: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    named = set(compose.get("volumes") or {})
    data_paths = {"postgres": "/var/lib/postgresql/data", "redis": "/data"}
    for service, path in data_paths.items():
        mounts = compose["services"][service].get("volumes", [])
        sources = {m.split(":")[0] for m in mounts if m.split(":")[1] == path}
        assert sources and sources <= named, f"{service} keeps {path} on a named volume"
    for name, svc in compose["services"].items():
        if "build" in svc and "fencing serve" in " ".join(svc.get("command", [])):
            raise AssertionError(f"{name}: an embedded SQLite service needs a volume")


def build_stage(instructions: list[Instruction]) -> list[Instruction]:
    """The instructions of the first stage (up to the second FROM)."""
    froms = [n for n, ins in enumerate(instructions) if ins.keyword == "FROM"]
    return instructions[froms[0] : froms[1]]


def test_the_image_installs_from_the_committed_constraints() -> None:
    """A build today and one next month install the same versions: every pip install of
    the project is constrained by constraints.txt, which is copied in first and is
    itself complete (each runtime dependency pinned, within pyproject's ranges)."""
    build = build_stage(parse_dockerfile((ROOT / "Dockerfile").read_text()))
    copied = [w for ins in build if ins.keyword == "COPY" for w in ins.words[:-1]]
    assert "constraints.txt" in copied
    installs = [ins for ins in build if ins.keyword == "RUN" and " install " in ins.raw]
    assert installs, "the build stage installs the project"
    for ins in installs:
        words = ins.words
        assert "-c" in words and words[words.index("-c") + 1] == "constraints.txt", ins.raw
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_constraints.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr


def test_expose_is_exactly_what_the_default_command_serves() -> None:
    """EXPOSE names the lease, guard and metrics ports the CMD binds, and no other."""
    cmd = next(ins for ins in reversed(FINAL) if ins.keyword == "CMD").words
    assert cmd[:2] == ["fencing", "serve"]
    args = fencing_parser().parse_args(cmd[1:])
    served = {args.lease_listen.rsplit(":", 1)[1], args.guard_listen.rsplit(":", 1)[1]}
    if args.metrics_port:
        served.add(str(args.metrics_port))
        assert args.metrics_host == "0.0.0.0", "metrics must be reachable from outside"
    exposed = {w for ins in FINAL if ins.keyword == "EXPOSE" for w in ins.words}
    assert exposed == served


def test_the_image_copies_every_package_the_wheel_installs() -> None:
    """The build stage copies each top-level package pyproject installs, so every console
    script (and each ``fencing`` subcommand) imports in the image as it does in a checkout."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    wanted = {p.split(".")[0].rstrip("*") for p in patterns}
    build = build_stage(parse_dockerfile((ROOT / "Dockerfile").read_text()))
    copied = {w for ins in build if ins.keyword == "COPY" for w in ins.words[:-1]}
    assert wanted <= copied, f"not copied into the image: {sorted(wanted - copied)}"
    assert "bench" not in wanted, "bench/ runs from a checkout; the wheel does not install it"
    assert all((ROOT / name / "__init__.py").is_file() for name in wanted)


def dockerignore_patterns(text: str) -> list[tuple[bool, str]]:
    """``.dockerignore`` as Docker reads it: one pattern a line, ``#`` lines dropped,
    a leading ``!`` an exception, each pattern cleaned (leading and trailing ``/``,
    ``./`` removed) and matched against context paths with ``/`` separators."""
    patterns: list[tuple[bool, str]] = []
    for line in text.splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        exception = pattern.startswith("!")
        pattern = pattern[1:].strip() if exception else pattern
        pattern = re.sub(r"/+", "/", pattern).strip("/")
        while pattern.startswith("./"):
            pattern = pattern[2:]
        if pattern:
            patterns.append((exception, pattern))
    return patterns


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Go's filepath.Match plus ``**`` (any number of directories), as Docker's
    patternmatcher translates them: ``*`` and ``?`` never cross a ``/``."""
    out = ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                out += "(?:.*/)?"  # "**/" also matches no directory at all
                i += 1
            else:
                out += ".*"
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            out += "[" + ("^" + body[1:] if body.startswith("^") else body) + "]"
            i = end
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out)


def ignored(path: str, patterns: list[tuple[bool, str]]) -> bool:
    """Whether Docker leaves ``path`` out of the build context: the last pattern that
    matches the path or one of its parent directories decides (an excluded directory
    takes everything under it)."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for exception, pattern in patterns:
        regex = _pattern_regex(pattern)
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            verdict = not exception
    return verdict


def test_the_dockerignore_reader_follows_dockers_rules() -> None:
    patterns = dockerignore_patterns("# comment\n/build/\n**/__pycache__\n*.md\n!README.md\ndocs\n")
    assert ignored("build", patterns) and ignored("build/x.py", patterns)
    assert ignored("fencing/__pycache__/a.pyc", patterns) and ignored("__pycache__", patterns)
    assert ignored("CHANGES.md", patterns) and not ignored("README.md", patterns)
    assert not ignored("fencing/notes.md", patterns), "* does not cross a /"
    assert ignored("docs/design.md", patterns) and not ignored("documents", patterns)
    assert not ignored("fencing", patterns) and not ignored("buildkit", patterns)


def test_no_path_the_dockerfile_copies_is_left_out_of_the_context() -> None:
    """Every source a COPY takes from the build context reaches the builder: one the
    ``.dockerignore`` excludes fails the build (BuildKit: ``"/chaos": not found``)."""
    patterns = dockerignore_patterns((ROOT / ".dockerignore").read_text())
    sources = [
        (ins.line, source)
        for ins in DOCKERFILE
        if ins.keyword in ("COPY", "ADD")
        for source in [w for w in ins.words if not w.startswith("--")][:-1]
        if not any(w.startswith("--from") for w in ins.words)
    ]
    assert sources, "the Dockerfile copies from the build context"
    left_out = [f"line {line}: {source}" for line, source in sources if ignored(source, patterns)]
    assert not left_out, f".dockerignore excludes what the Dockerfile copies: {left_out}"
    for _, source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
