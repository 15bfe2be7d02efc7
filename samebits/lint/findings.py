"""A finding: one rule broken at one place. Frozen, and round-trips through a plain dict (the JSON reporter)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from samebits.lint.rules import RULES


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int
    rule: str
    message: str

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"unknown rule {self.rule!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Finding:
        return cls(path=d["path"], line=d["line"], col=d["col"], rule=d["rule"], message=d["message"])
