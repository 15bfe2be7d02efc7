"""The rule table: one definition per rule, each with a why and a fix; the docs hold the generated table."""
import dataclasses
import re
from pathlib import Path

import pytest

from samebits.lint.rules import RULES, markdown_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "LINT.md"


def test_every_rule_is_complete():
    names = [r.name for r in RULES.values()]
    assert len(set(names)) == len(names)
    for rid, r in RULES.items():
        assert re.fullmatch(r"SB\d{3}", rid) and r.id == rid
        assert r.language in {"any", "cuda", "triton", "torch", "compiled"}
        assert r.why.strip() and r.fix.strip() and "\n" not in r.why + r.fix
        assert r.lexical == (r.language in {"cuda", "compiled", "any"}), rid


def test_rules_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RULES["SB101"].why = "changed"


def test_docs_hold_the_generated_table():
    assert markdown_table() in DOC.read_text(), "docs/LINT.md: regenerate with python -m samebits.lint --rules"
