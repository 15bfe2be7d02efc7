"""`StructuredOutputsParams`: what one request constrains its output to, in vLLM's shape. Torch-free and
library-free: the grammar library compiles it (structured/grammar.py); here only the shape is checked.

Exactly one constraint: `json` (a JSON schema, dict or str), `regex`, `choice` (a list of strings), `grammar` (Lark,
or GBNF/EBNF as llama.cpp and xgrammar write it: llguidance reads both) or `json_object` (any JSON object). The
options are vLLM's: `disable_any_whitespace` (compact JSON, `, ` and `: ` only), `disable_additional_properties`
(objects of a schema hold their listed properties only, OpenAI's strict mode), `whitespace_pattern` (a regex for the
whitespace between JSON tokens). `disable_fallback` is accepted: samebits has one backend, nothing to fall back to.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from samebits.errors import FieldError, require

KINDS = ("json", "regex", "choice", "grammar", "json_object")
# vLLM's names samebits does not take: a structural tag needs a tag-aware tool parser it does not have.
NOT_IMPLEMENTED = ("structural_tag",)
# Beyond these the compiled grammar, not the request, is what costs: a schema is compiled per request.
MAX_CONSTRAINT_CHARS = 1 << 20
MAX_CHOICES = 4096


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    def __new__(cls, *args, **kwargs):
        names = [f.name for f in fields(cls)]
        for key in kwargs:
            if key not in names:
                what = "is a vLLM field samebits does not implement" if key in NOT_IMPLEMENTED else "is unknown"
                raise TypeError(f"StructuredOutputsParams: {key!r} {what}; the valid names are {', '.join(names)}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) is not None and getattr(self, k) is not False]
        require(len(given) == 1, "structured_outputs",
                f"structured_outputs must set exactly one of {', '.join(KINDS)}; got "
                f"{', '.join(given) or 'none'}")
        self._check_values()
        for name in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            require(isinstance(getattr(self, name), bool), "structured_outputs",
                    f"structured_outputs.{name} must be a bool")
        wp = self.whitespace_pattern
        require(wp is None or isinstance(wp, str), "structured_outputs",
                "structured_outputs.whitespace_pattern must be a string")

    def _check_values(self) -> None:
        j, r, c, g = self.json, self.regex, self.choice, self.grammar
        require(j is None or isinstance(j, (str, dict)), "structured_outputs",
                "structured_outputs.json must be a JSON schema "
                "(an object, or a string holding one)")
        if isinstance(j, str):
            try:
                require(isinstance(json.loads(j), dict), "structured_outputs",
                        "structured_outputs.json must hold a JSON object")
            except json.JSONDecodeError as e:
                raise FieldError("structured_outputs", f"structured_outputs.json is not valid JSON: {e}") from None
        require(r is None or isinstance(r, str), "structured_outputs", "structured_outputs.regex must be a string")
        require(g is None or (isinstance(g, str) and g.strip() != ""), "structured_outputs",
                "structured_outputs.grammar must be a "
                "non-empty string")
        require(c is None or (isinstance(c, (list, tuple)) and 0 < len(c) <= MAX_CHOICES and all(
            isinstance(x, str) and x for x in c)), "structured_outputs",
                f"structured_outputs.choice must be a list of 1 to {MAX_CHOICES} non-empty strings")
        require(self.json_object in (None, True), "structured_outputs",
                "structured_outputs.json_object must be true when set")
        require(len(self.source) <= MAX_CONSTRAINT_CHARS, "structured_outputs",
                f"structured_outputs.{self.kind} holds {len(self.source)} characters; at most "
                f"{MAX_CONSTRAINT_CHARS} are compiled")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) is not None and getattr(self, k) is not False)

    @property
    def source(self) -> str:
        """The constraint as text (a schema as compact JSON): what is compiled, and what a cache would key on."""
        value: Any = getattr(self, self.kind)
        if self.kind == "json" and isinstance(value, dict):
            return json.dumps(value, separators=(",", ":"), sort_keys=True)
        if self.kind == "choice":
            return json.dumps(list(value))
        return "" if self.kind == "json_object" else value
