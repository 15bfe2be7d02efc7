"""Precision and recall of every rule over the corpus: true-positive and true-negative snippets written for it."""
import re
from pathlib import Path

import pytest

from samebits.lint.cli import check_source
from samebits.lint.compiled import check_file
from samebits.lint.rules import RULES

CORPUS = Path(__file__).parent / "lint_corpus"
SOURCES = (".py", ".cu")
COMPILED = (".ptx", ".sass", ".txt")
EXPECT = re.compile(r"expect:\s*((?:SB\d{3}\s*)+)")
FILES = sorted(p for p in CORPUS.iterdir() if p.suffix in SOURCES + COMPILED)


def expected(path: Path) -> set[tuple[str, int, str]]:
    out = set()
    for no, line in enumerate(path.read_text().splitlines(), 1):
        m = EXPECT.search(line)
        if m:
            out |= {(path.name, no, rule) for rule in m.group(1).split()}
    return out


def found(path: Path) -> set[tuple[str, int, str]]:
    findings = check_source(path) if path.suffix in SOURCES else check_file(path)[0]
    return {(path.name, f.line, f.rule) for f in findings}


def test_every_rule_has_true_positives_and_true_negatives():
    for rule in RULES:
        assert any(p.name.startswith(f"{rule}_pos") for p in FILES), f"{rule}: no true-positive snippet"
        assert any(p.name.startswith(f"{rule}_neg") for p in FILES), f"{rule}: no true-negative snippet"
        assert any(r == rule for p in FILES for _, _, r in expected(p)), f"{rule}: no expected finding"


@pytest.mark.parametrize("path", [p for p in FILES if "_neg" in p.name], ids=lambda p: p.name)
def test_true_negative_files_expect_nothing(path):
    assert not expected(path)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_file_findings_are_the_expected_ones(path):
    assert found(path) == expected(path)


def test_precision_and_recall_over_the_corpus():
    want = set().union(*(expected(p) for p in FILES))
    got = set().union(*(found(p) for p in FILES))
    true_pos = want & got
    recall, precision = len(true_pos) / len(want), len(true_pos) / len(got)
    assert recall == 1.0, f"recall {recall:.3f}: missed {sorted(want - got)}"
    assert precision >= 0.95, f"precision {precision:.3f}: false positives {sorted(got - want)}"
