"""README.md reads in order: its contents list every section, in order, and every
in-page link lands on a heading (GitHub's anchors: lower case, punctuation dropped
but for ``-`` and ``_``, spaces as ``-``)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = re.compile(r"^(##|###) (.+)$")
ENTRY = re.compile(r"^( *)- \[(.+)\]\(#([\w-]+)\)$")


def anchor(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    """(level, title) of the ## and ### headings outside code blocks, but Contents."""
    found: list[tuple[int, str]] = []
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := HEADING.match(line)) and m[2] != "Contents":
            found.append((len(m[1]), m[2]))
    return found


def contents(text: str) -> list[tuple[int, str, str]]:
    """(level, title, anchor) of the entries of the ``## Contents`` list."""
    block = text.split("## Contents\n", 1)[1].split("\n## ", 1)[0]
    entries = [ENTRY.match(line) for line in block.strip().splitlines()]
    assert all(entries), "every line of Contents is a link to a section"
    return [(2 if not m[1] else 3, m[2], m[3]) for m in entries if m]


def test_the_contents_list_every_section_in_order() -> None:
    text = README.read_text(encoding="utf-8")
    listed = contents(text)
    assert [(level, title) for level, title, _ in listed] == headings(text)
    assert all(link == anchor(title) for _, title, link in listed)


def test_every_in_page_link_lands_on_a_heading() -> None:
    text = README.read_text(encoding="utf-8")
    targets = {anchor(title) for _, title in headings(text)}
    links = set(re.findall(r"\]\(#([\w-]+)\)", text))
    assert links and links <= targets, sorted(links - targets)
