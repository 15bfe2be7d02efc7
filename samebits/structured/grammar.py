"""Grammars through llguidance (docs/STRUCTURED.md says why it, not xgrammar): a request's StructuredOutputsParams
compiled against the model's vocabulary, and one matcher per sample that follows the sample's own tokens.

A matcher's state is a function of the grammar and of the tokens its sample has drawn, nothing else: it consumes
each token once, in order, when the token is read back (the output processor calls `advance`), and fills the mask of
the next one on the host (structured/masks.py). llguidance computes the mask of one state exactly (a set of token
ids, no floating point), so the mask is as much a function of the request as the tokens are.
"""
from __future__ import annotations

import json
import os
from functools import cached_property

from samebits.errors import FieldError
from samebits.structured.params import StructuredOutputsParams

# What `advance` says when a sample must end: its grammar is complete, or its token broke the grammar (only possible
# when every allowed token had -inf logits, which the parameter checks exclude; the sample ends rather than the engine).
COMPLETE, REJECTED = "stop", "abort"
# llguidance's JSON whitespace when a request asks for none flexible (vLLM's disable_any_whitespace): json.dumps'.
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Otherwise, between JSON tokens: at most one line break, then at most 20 spaces or tabs. Compact and pretty-printed
# JSON both fit; any whitespace at all (vLLM's default) lets a small model write blank lines until max_tokens.
JSON_WHITESPACE = r"(\r?\n)?[ \t]{0,20}"
# From this many grammar rows a step's masks are filled by llguidance's thread pool, each row by its own matcher
# into its own row (the threads change when a row is filled, never what): below it the pool's hand-off costs more.
PARALLEL_ROWS = 16


class GrammarError(FieldError):
    """The constraint does not compile; `kind` is the StructuredOutputsParams field, `reason` llguidance's words."""

    def __init__(self, kind: str, reason: str):
        super().__init__("structured_outputs", f"structured_outputs.{kind} is not valid: {reason}")
        self.kind, self.reason = kind, reason

    def __reduce__(self):  # crosses the engine process's pipe
        return type(self), (self.kind, self.reason)


def closed_objects(schema):
    """The schema with `additionalProperties: false` on every object that says nothing about it (vLLM's
    disable_additional_properties; OpenAI's strict mode asks for it on every object)."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_objects(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def grammar_text(p: StructuredOutputsParams) -> str:
    """llguidance's grammar for the constraint; raises GrammarError when llguidance cannot even read it."""
    import llguidance

    try:
        if p.kind in ("json", "json_object"):
            schema = {"type": "object"} if p.kind == "json_object" else (
                json.loads(p.json) if isinstance(p.json, str) else p.json)
            if p.disable_additional_properties:
                schema = closed_objects(schema)
            options = dict(COMPACT_JSON) if p.disable_any_whitespace else {
                "whitespace_flexible": True, "whitespace_pattern": p.whitespace_pattern or JSON_WHITESPACE}
            return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=options)
        if p.kind == "choice":
            return llguidance.grammar_from("choice", json.dumps(list(p.choice)))
        return llguidance.grammar_from("grammar" if p.kind == "grammar" else "regex", getattr(p, p.kind))
    except ValueError as e:
        raise GrammarError(p.kind, str(e)) from None


class Grammars:
    """The one compiler of an engine (or server): the vocabulary as llguidance reads it, built on first use from
    the tokenizer's own `tokenizers` JSON, and sized to the model's logits (`vocab_size` >= the tokenizer's)."""

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)

    @cached_property
    def lltokenizer(self):
        import llguidance

        eos = sorted(self.tokenizer.eos_token_ids)
        return llguidance.LLTokenizer(self.tokenizer.backend.to_str(), n_vocab=self.vocab_size, eos_token=eos)

    def compile(self, p: StructuredOutputsParams) -> str:
        """The checked grammar: GrammarError naming the field and llguidance's reason, before any work is queued."""
        import llguidance

        grammar = grammar_text(p)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.lltokenizer)
        if is_error:
            raise GrammarError(p.kind, messages[0].strip())
        return grammar

    @cached_property
    def executor(self):
        import llguidance

        return llguidance.LLExecutor(num_threads=max(1, min(16, (os.cpu_count() or 2) // 2)))

    def matchers(self, p: StructuredOutputsParams, n: int) -> list[GrammarMatcher]:
        """One matcher per sample of a request (n of them), each at the grammar's start."""
        grammar = self.compile(p)
        return [GrammarMatcher(self._matcher(p, grammar), self) for _ in range(n)]

    def _matcher(self, p: StructuredOutputsParams, grammar: str):
        import llguidance

        m = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0)
        if m.is_error():
            raise GrammarError(p.kind, m.get_error().strip())
        return m


class GrammarMatcher:
    """One sample's grammar state. `consumed` counts the sample's tokens it has taken, so a mask is only ever filled
    for the position right after them (a stale or skipped token fails loudly, never masks the wrong row)."""

    def __init__(self, matcher, grammars: Grammars):
        self.matcher = matcher
        self.grammars = grammars
        self.consumed = 0

    def advance(self, seq) -> str | None:
        """Take the sample's newly read-back tokens: COMPLETE once nothing but the end can follow, REJECTED if a
        token breaks the grammar, else None."""
        first = seq.num_prompt_tokens + self.consumed
        tokens = seq.token_ids[first:seq.num_resolved]
        self.consumed += len(tokens)
        if tokens and not self.matcher.consume_tokens(tokens):
            return REJECTED
        return COMPLETE if self.matcher.is_stopped() else None

    def check(self, seq, position: int) -> None:
        """The mask about to be filled is for the token at `position`, the one right after those taken."""
        expected = position - seq.num_prompt_tokens
        if self.consumed != expected:
            raise RuntimeError(f"{seq!r}: its grammar has taken {self.consumed} tokens, the mask is for generated "
                               f"token {expected}")

    def fill(self, row, seq, position: int) -> None:
        """Write the mask of the token at `position` into `row` (a contiguous int32 host tensor of cdiv(V, 32) words,
        bit t of word t // 32 set when token t is allowed)."""
        self.check(seq, position)
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())


def fill_rows(words, rows: list[tuple[int, object, int]]) -> None:
    """Fill words[i] (an [R, W] contiguous int32 host tensor) with the mask of each (i, seq, position) in `rows`, by
    each sequence's own matcher; many rows at once through the thread pool (PARALLEL_ROWS)."""
    if len(rows) < PARALLEL_ROWS:
        for i, seq, position in rows:
            seq.grammar.fill(words[i], seq, position)
        return
    for _, seq, position in rows:
        seq.grammar.check(seq, position)
    width = words.shape[1] * words.element_size()
    rows[0][1].grammar.grammars.executor.unsafe_compute_mask_ptr(
        [(seq.grammar.matcher, i) for i, seq, _ in rows], words.data_ptr(), width, words.shape[0])
