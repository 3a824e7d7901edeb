"""Write constraints.txt: exact pins of every runtime dependency the image installs.

    python scripts/gen_constraints.py          # pin what this environment has installed
    python scripts/gen_constraints.py --check  # exit 1 if the file misses a dependency
                                               # or pins a version pyproject.toml refuses

The Dockerfile installs ``.[postgres,redis]`` with ``-c constraints.txt``, so an image
built today and one built next month get the same versions. The pins come from the
installed environment (``pip install -e '.[dev]'`` first): the closure of the
project's runtime requirements with the ``postgres`` and ``redis`` extras, walked
through each distribution's metadata. ``--check`` does not compare versions with the
environment (a newer compatible release is fine there); it holds the file to the
names of that closure and to pyproject's specifiers.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"
PROJECT = "fencing-guard"
EXTRAS = ("postgres", "redis")
HEADER = (
    "# Exact versions of the image's runtime dependencies (.[postgres,redis]), used by the\n"
    "# Dockerfile as pip -c constraints.txt. Regenerate: python scripts/gen_constraints.py\n"
)


def closure() -> dict[str, tuple[str, list[Requirement]]]:
    """name -> (installed version, the requirements that name it), for the runtime set."""
    found: dict[str, tuple[str, list[Requirement]]] = {}
    pending = [(Requirement(r), EXTRAS) for r in distribution(PROJECT).requires or []]
    while pending:
        req, extras = pending.pop()
        if req.marker is not None and not any(
            req.marker.evaluate({"extra": e}) for e in (*extras, "")
        ):
            continue
        name = canonicalize_name(req.name)
        if name == PROJECT:
            continue
        try:
            dist = distribution(req.name)
        except PackageNotFoundError as exc:
            raise SystemExit(f"{req.name} is not installed: pip install -e '.[dev]' first") from exc
        first = name not in found
        found.setdefault(name, (dist.version, []))[1].append(req)
        if first:
            pending += [(Requirement(r), tuple(req.extras)) for r in dist.requires or []]
    return found


def read_pins(text: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def problems(pins: dict[str, str], needed: dict[str, tuple[str, list[Requirement]]]) -> list[str]:
    out = [f"{name} is a runtime dependency but has no pin" for name in needed if name not in pins]
    out += [
        f"{name} is pinned but no runtime dependency needs it"
        for name in pins
        if name not in needed
    ]
    for name, version in pins.items():
        for req in needed.get(name, ("", []))[1]:
            if not req.specifier.contains(Version(version), prereleases=True):
                out.append(f"{name}=={version} does not satisfy {req}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    needed = closure()
    if args.check:
        found = problems(read_pins(CONSTRAINTS.read_text()), needed)
        for line in found:
            print(f"constraints.txt: {line}", file=sys.stderr)
        return 1 if found else 0
    body = "".join(f"{name}=={version}\n" for name, (version, _) in sorted(needed.items()))
    CONSTRAINTS.write_text(HEADER + body)
    print(f"wrote {CONSTRAINTS.name}: {len(needed)} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
