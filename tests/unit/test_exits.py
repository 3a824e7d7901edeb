"""The exit-code table: one place, every error reason a row, the README and --help its copies."""

from __future__ import annotations

import re
from pathlib import Path

from fencing import _status
from fencing.errors import DeadlineExceededError
from fencingctl import parser as fencing_parser
from guard import __main__ as guard_main
from lease_server import __main__ as lease_main
from serving import exits

ROOT = Path(__file__).resolve().parents[2]


def test_codes_and_reasons_are_unique_and_the_conventional_ones_keep_their_meaning() -> None:
    codes = [row.code for row in exits.TABLE]
    reasons = [row.reason for row in exits.TABLE]
    assert len(set(codes)) == len(codes) and len(set(reasons)) == len(reasons)
    assert (exits.OK, exits.FAILURE, exits.USAGE) == (0, 1, 2)
    # 126 and above mean exec failures and signals: only in that meaning (the shell's
    # "command not found", 128 + SIGINT), for the commands that run one.
    conventional = {127: "NO_COMMAND", 130: "INTERRUPTED"}
    for row in exits.TABLE:
        assert 0 <= row.code < 126 or conventional.get(row.code) == row.reason, row


def test_every_error_reason_the_servers_send_has_its_own_code() -> None:
    for reason in [*_status.REGISTRY, DeadlineExceededError.reason, "UNREACHABLE"]:
        assert exits.CODES[reason] > exits.USAGE, reason


def test_the_readme_shows_the_table_as_it_is() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- exit-codes:[^\n]*-->\n(.*?)\n<!-- /exit-codes -->", readme, re.S)
    assert block is not None, "the README has the exit-code block"
    assert block.group(1) == exits.table_markdown()


def test_every_commands_help_prints_the_table() -> None:
    for p in (fencing_parser(), lease_main.parser(), guard_main.parser()):
        text = p.format_help()
        for row in exits.TABLE:
            assert re.search(rf"\b{row.code}\s+{row.reason}\b", text), (p.prog, row)
