"""Reporters: human text, JSON (round-trips to findings), SARIF 2.1.0 (GitHub code scanning), GitHub annotations."""
from __future__ import annotations

import json

from samebits.lint.findings import Finding
from samebits.lint.rules import RULES

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL = "samebits-lint"


def text(findings: list[Finding]) -> str:
    lines = [f"{f.path}:{f.line}:{f.col}: {f.rule} {f.message}\n    why: {RULES[f.rule].why}\n"
             f"    fix: {RULES[f.rule].fix}" for f in findings]
    lines.append(f"{len(findings)} finding{'s' * (len(findings) != 1)}")
    return "\n".join(lines)


def to_json(findings: list[Finding]) -> str:
    return json.dumps({"tool": TOOL, "findings": [f.to_dict() for f in findings]}, indent=2)


def from_json(data: str) -> list[Finding]:
    return [Finding.from_dict(d) for d in json.loads(data)["findings"]]


def sarif(findings: list[Finding]) -> str:
    used = sorted({f.rule for f in findings})
    index = {r: i for i, r in enumerate(used)}
    rules = [{"id": r, "name": RULES[r].name, "shortDescription": {"text": RULES[r].why},
              "help": {"text": RULES[r].fix}, "properties": {"lexical": RULES[r].lexical}} for r in used]
    results = [{
        "ruleId": f.rule, "ruleIndex": index[f.rule], "level": "error",
        "message": {"text": f"{f.message}. {RULES[f.rule].fix}"},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": f.path},
                                            "region": {"startLine": f.line, "startColumn": f.col}}}],
    } for f in findings]
    run = {"tool": {"driver": {"name": TOOL, "rules": rules}}, "results": results}
    return json.dumps({"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2)


def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def github(findings: list[Finding]) -> str:
    """GitHub Actions workflow commands: one `::error` annotation per finding."""
    return "\n".join(
        f"::error file={_escape_property(f.path)},line={f.line},col={f.col},"
        f"title={_escape_property(f'{f.rule} {RULES[f.rule].name}')}::"
        f"{_escape_data(f'{f.message}. {RULES[f.rule].fix}')}" for f in findings)


FORMATS = {"text": text, "json": to_json, "sarif": sarif, "github": github}
