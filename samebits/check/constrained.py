"""`--constrained`: every request also asks for structured output, so a server's grammar masks are checked too.

`json`: OpenAI's `response_format` with a JSON schema (any OpenAI-compatible server). `mixed`: vLLM's
`structured_outputs`, a JSON schema, a regex, a choice or none. A request's constraint is a function of its prompt
alone, so a needle carries the same one alone and in every burst while its fillers carry others: a server whose mask
depends on the batch (one shared between rows) answers the needle differently.
"""
from __future__ import annotations

import hashlib

CONSTRAINED = ("none", "json", "mixed")
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 24},
                                           "score": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["answer", "score"], "additionalProperties": False}
MIXED = ({"json": SCHEMA}, {"regex": "[a-z]{2,8}( [a-z]{2,8}){0,6}"}, {"choice": ["yes", "no", "maybe"]}, None)


def _pick(prompt, n: int) -> int:
    text = prompt if isinstance(prompt, str) else ",".join(map(str, prompt))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") % n


def constraint_fields(mode: str, prompt) -> dict:
    """The body fields that constrain the request of `prompt` under `mode` ({} for none)."""
    if mode == "json":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "check", "schema": SCHEMA,
                                                                           "strict": True}}}
    if mode == "mixed":
        chosen = MIXED[_pick(prompt, len(MIXED))]
        return {} if chosen is None else {"structured_outputs": chosen}
    return {}
