"""What the checkers share: a raw hit (rule at a span of lines), turned into findings once suppressions are applied."""
from __future__ import annotations

from dataclasses import dataclass

from samebits.lint.findings import Finding
from samebits.lint.suppress import Comment, bare_markers, silenced_lines


@dataclass(frozen=True)
class Hit:
    rule: str
    line: int
    col: int
    message: str
    end_line: int = 0  # last line of the construct; a statement on any of its lines silences it


def findings(path: str, hits: list[Hit], comments: list[Comment]) -> list[Finding]:
    """Hits not silenced by a reasoned comment, plus one SB001 per bare marker; one finding per rule and line."""
    quiet = silenced_lines(comments)
    kept = {}
    for h in hits:
        if any(ln in quiet for ln in range(h.line, max(h.line, h.end_line) + 1)):
            continue
        kept.setdefault((h.rule, h.line), Finding(path, h.line, h.col, h.rule, h.message))
    for c in bare_markers(comments):
        kept[("SB001", c.line)] = Finding(path, c.line, c.col, "SB001",
                                          "`samebits:` marker without `deterministic because <reason>`; it silences "
                                          "nothing")
    return sorted(kept.values())
