"""Reporters: JSON round-trips, SARIF has the structure GitHub code scanning requires, annotations are escaped."""
import json

import pytest

from samebits.lint.findings import Finding
from samebits.lint.report import from_json, github, sarif, text, to_json
from samebits.lint.rules import RULES

FINDINGS = [Finding("kernels/a.cu", 3, 5, "SB101", "atomicAdd on a floating-point value"),
            Finding("model.py", 10, 1, "SB301", "index_add_ accumulates, 100% sure: yes"),
            Finding("model.py", 12, 9, "SB301", "scatter_add_ accumulates\nwith atomics")]


def test_json_round_trips():
    assert from_json(to_json(FINDINGS)) == FINDINGS
    assert from_json(to_json([])) == []


def test_finding_refuses_an_unknown_rule():
    with pytest.raises(ValueError, match="unknown rule"):
        Finding("a.py", 1, 1, "SB999", "x")


def test_sarif_has_the_required_structure():
    doc = json.loads(sarif(FINDINGS))
    assert doc["version"] == "2.1.0" and doc["$schema"].endswith("sarif-2.1.0.json")
    (run,) = doc["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "samebits-lint"
    ids = [r["id"] for r in driver["rules"]]
    assert ids == sorted(set(ids)) == ["SB101", "SB301"]
    assert all(r["shortDescription"]["text"] == RULES[r["id"]].why for r in driver["rules"])
    assert len(run["results"]) == len(FINDINGS)
    for res, f in zip(run["results"], FINDINGS, strict=True):
        assert res["ruleId"] == f.rule and driver["rules"][res["ruleIndex"]]["id"] == f.rule
        assert res["level"] in ("none", "note", "warning", "error") and res["message"]["text"]
        (loc,) = res["locations"]
        assert loc["physicalLocation"]["artifactLocation"]["uri"] == f.path
        assert loc["physicalLocation"]["region"] == {"startLine": f.line, "startColumn": f.col}


def test_sarif_of_nothing_is_still_a_valid_run():
    (run,) = json.loads(sarif([]))["runs"]
    assert run["results"] == [] and run["tool"]["driver"]["rules"] == []


def test_github_annotations_one_per_finding_escaped():
    lines = github(FINDINGS).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("::error file=kernels/a.cu,line=3,col=5,title=SB101 cuda-float-atomic-add::")
    assert "100%25 sure" in lines[1] and "%0Awith atomics" in lines[2]


def test_text_names_place_rule_why_and_fix():
    out = text(FINDINGS[:1])
    assert out.startswith("kernels/a.cu:3:5: SB101 ")
    assert RULES["SB101"].why in out and RULES["SB101"].fix in out and out.endswith("1 finding")
