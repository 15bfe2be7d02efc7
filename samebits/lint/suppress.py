"""Suppression by a reasoned comment only: `samebits: deterministic because <reason>` next to the code.

A marker on a finding's line, or in the comment block directly above it, silences every finding on that line.
A marker without a reason of at least MIN_REASON_WORDS words silences nothing and is itself a finding (SB001).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MARKER = re.compile(r"\bsamebits\s*:", re.IGNORECASE)
STATEMENT = re.compile(r"\bsamebits\s*:\s*(?:deterministic|intentionally\s+nondeterministic)\s+because\s+(?P<reason>.*)",
                       re.IGNORECASE)
MIN_REASON_WORDS = 3


@dataclass(frozen=True)
class Comment:
    line: int  # 1-based line of the comment's start
    end_line: int
    col: int
    text: str
    alone: bool  # nothing but whitespace before it on its line


def is_statement(text: str) -> bool:
    m = STATEMENT.search(text)
    if not m:
        return False
    reason = re.split(r"(?:^|\s)(?:#|//)|\*/", m.group("reason"))[0]  # a second comment on the line is not the reason
    return len(re.findall(r"\w+", reason)) >= MIN_REASON_WORDS


def bare_markers(comments: list[Comment]) -> list[Comment]:
    """Comments that carry a `samebits:` marker but no reasoned statement."""
    return [c for c in comments if MARKER.search(c.text) and not is_statement(c.text)]


def silenced_lines(comments: list[Comment]) -> set[int]:
    """Lines whose findings a reasoned comment silences: its own lines, and the code line after a comment block."""
    by_line = {ln: c for c in comments for ln in range(c.line, c.end_line + 1)}
    lines: set[int] = set()
    for c in comments:
        if not is_statement(c.text):
            continue
        lines.update(range(c.line, c.end_line + 1))
        if c.alone:
            nxt = c.end_line + 1
            while nxt in by_line and by_line[nxt].alone:  # the rest of the comment block
                nxt = by_line[nxt].end_line + 1
            lines.add(nxt)
    return lines
