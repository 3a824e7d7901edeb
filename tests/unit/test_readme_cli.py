"""The README's shell lines are commands the CLI accepts: each ``fencing ...`` line of
its ``sh`` blocks parses with the real parsers (flags, choices, durations), and what
the README says a command's --help names (its defaults, its exit codes) is there."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

import fencingctl

README = Path(__file__).resolve().parents[2] / "README.md"
#: Lines that show a shape, not a command (placeholders in brackets or capitals).
SHAPES = re.compile(r"\[[A-Z]+\]|\b(?:LEASE_SERVER|GUARD|CMD|NAME|TOKEN)\b")


def readme_commands() -> list[str]:
    commands: list[str] = []
    in_sh = False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            in_sh = line.strip() in ("```sh", "```bash", "```console")
            continue
        if in_sh and line.startswith("fencing "):
            command = line.split(" #", 1)[0].strip().rstrip("&").strip()
            if not SHAPES.search(command):
                commands.append(command)
    return commands


COMMANDS = readme_commands()


def test_the_readme_has_commands_to_check() -> None:
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize("command", COMMANDS)
def test_a_readme_command_parses(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = shlex.split(command)[1:]
    if "--" in argv:  # lock/elect: the command after -- is CMD, not ours
        argv = argv[: argv.index("--") + 2]
    try:
        fencingctl.parser(argv).parse_args(argv)
    except SystemExit as exit_:
        if exit_.code != 0:
            pytest.fail(f"{command!r}: {capsys.readouterr().err}")


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["lock"], "12 (UNREACHABLE)"),
        (["lock"], "(default 10s)"),
        (["watch"], "renewals are not events"),
        (["leader"], "exit 1 if nobody does"),
    ],
)
def test_help_says_what_the_readme_says(
    command: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        fencingctl.parser([*command, "--help"]).parse_args([*command, "--help"])
    out = capsys.readouterr().out
    assert says in " ".join(out.split()) or says in " ".join(
        fencingctl.parser(command).format_help().split()
    ), out


def _options(parser: argparse.ArgumentParser, path: list[str]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _options(sub, [*path, name])
        elif action.option_strings and action.help not in (None, argparse.SUPPRESS):
            found.append((" ".join([*path, action.option_strings[-1]]), action))
    return found


def test_every_flag_with_a_default_says_it_in_help() -> None:
    """``--help`` shows what a flag is when not given (flags, on/off switches and empty
    defaults excepted): the README's defaults can be checked against it."""
    missing = [
        f"{name} (default {action.default!r})"
        for name, action in _options(fencingctl.parser([]), [])
        if action.default not in (None, False, True, "", [], argparse.SUPPRESS)
        and "default" not in (action.help or "")
    ]
    assert not missing, missing
