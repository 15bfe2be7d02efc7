"""Structured outputs under load (GPU): N concurrent requests, every one with a JSON schema, against the same load
unconstrained; and where the grammar's time goes per step (the masks filled on the host, the mask applied).

An 8B-shaped random model (bench/shapes.py) has no tokenizer, so it gets a synthetic byte-level
vocabulary of its own size: pseudo-words, numbers and JSON punctuation (llguidance's mask time on a synthetic
49152-token vocabulary was within 5% of SmolLM2's real one on the CPU, docs/STRUCTURED.md). The constrained run goes
first; the unconstrained run then generates exactly as many tokens per request (max_tokens = the constrained output's
length, eos ignored), so both runs do the same model work and the ratio is the grammar's cost. Writes structured.json
and structured.png to --out.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import random
import statistics
import sys
import time
from pathlib import Path

from samebits.bench.shapes import random_shape_model
from samebits.benchmarks import e2e
from samebits.benchmarks.results import figure, write_json
from samebits.engine.sampling_params import SamplingParams, StructuredOutputsParams
from samebits.runtime import deterministic_runtime
from samebits.structured.masks import GrammarRows

EOS = "<|eot|>"
S = {"type": "string", "maxLength": 16}
SCHEMAS = [
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"city": S, "tags": {"type": "array", "items": S, "maxItems": 4}},
     "required": ["city", "tags"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "score": {"type": "number"}, "kind": {
        "enum": ["alpha", "beta", "gamma"]}}, "required": ["ok", "score", "kind"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer"}, "email": S},
                                               "required": ["id", "email"]}, "items": {"type": "array", "items": {
        "type": "integer"}, "maxItems": 8}}, "required": ["user", "items"]},
    {"type": "object"},  # any object: json_object's grammar
]


def synthetic_tokenizer(vocab_size: int, seed: int = 0):
    """A byte-level BPE vocabulary of `vocab_size` tokens (the last is EOS): the 256 bytes, JSON punctuation, numbers
    and pseudo-words with and without a leading space. No merges: it is read for its token bytes, never to encode."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    from samebits.models.tokenizer import Tokenizer

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    char = {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}
    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}

    def add(text: str) -> None:
        token = "".join(char[b] for b in text.encode())
        if token not in vocab and len(vocab) < vocab_size - 1:
            vocab[token] = len(vocab)

    for p in ['",', '":', '{"', '"}', '},', '],', '["', '"]', '": "', '", "', ', ', ': ', "\n", "  ", "    "]:
        add(p)
    for n in range(1000):
        add(str(n))
    rng, syllables = random.Random(seed), [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    while len(vocab) < vocab_size - 1:
        word = "".join(rng.choice(syllables) for _ in range(rng.choice((1, 2, 2, 3, 3, 4))))
        add((" " if rng.random() < 0.6 else "") + (word.capitalize() if rng.random() < 0.2 else word))
    backend = Backend(models.BPE(vocab=vocab, merges=[]))
    backend.add_special_tokens([EOS])
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend, {"eos_token": EOS})


@contextlib.contextmanager
def timed_masks():
    """Per step with grammar rows: the host time filling the masks and the time `apply` takes (fill, copy, unpack and
    mask enqueued), in ms; GrammarRows restored on exit."""
    fill, apply = GrammarRows.host_words, GrammarRows.apply
    times = {"fill_ms": [], "apply_ms": [], "rows": []}

    def host_words(self, vocab, pin):
        t = time.perf_counter()
        out = fill(self, vocab, pin)
        times["fill_ms"].append(1e3 * (time.perf_counter() - t))
        times["rows"].append(len(self.rows))
        return out

    def timed_apply(self, logits):
        t = time.perf_counter()
        out = apply(self, logits)
        times["apply_ms"].append(1e3 * (time.perf_counter() - t))
        return out

    GrammarRows.host_words, GrammarRows.apply = host_words, timed_apply
    try:
        yield times
    finally:
        GrammarRows.host_words, GrammarRows.apply = fill, apply


def drive(engine, prompts, params) -> tuple[dict, float]:
    """Every request at once, stepped to the end from an empty prefix cache: (request id -> final output, seconds)."""
    engine.scheduler.reset_prefix_cache()
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), p, sp)
    e2e.sync()
    t, done = time.perf_counter(), {}
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    e2e.sync()
    return done, time.perf_counter() - t


def valid_json(outs: dict, schemas: list[dict]) -> tuple[int, int]:
    """(outputs that finished by their grammar, of those the ones whose text parses and validates)."""
    import jsonschema

    stopped = [(o, schemas[int(rid)]) for rid, o in outs.items() if o.outputs[0].finish_reason == "stop"]
    ok = 0
    for o, schema in stopped:
        with contextlib.suppress(ValueError, jsonschema.ValidationError):
            jsonschema.validate(json.loads(o.outputs[0].text), schema)
            ok += 1
    return len(stopped), ok


def measure(loaded, mode: str, requests: int, prompt_len: int, max_tokens: int) -> dict:
    rng = random.Random(0)
    prompts = [[rng.randrange(loaded.config.vocab_size - 1) for _ in range(prompt_len)] for _ in range(requests)]
    schemas = [SCHEMAS[i % len(SCHEMAS)] for i in range(requests)]
    constrained = [SamplingParams(temperature=0.8, seed=i, max_tokens=max_tokens,
                                  structured_outputs=StructuredOutputsParams(json=schemas[i]))
                   for i in range(requests)]
    with deterministic_runtime() if mode == "deterministic" else contextlib.nullcontext():
        engine = e2e.make_engine(loaded, mode, "dynamic")
        drive(engine, prompts, constrained)  # warm-up: graphs, route proofs of every shape the load meets, masks
        with timed_masks() as masks:
            outs, secs = drive(engine, prompts, constrained)
        lengths = [len(outs[str(i)].outputs[0].token_ids) for i in range(requests)]
        free = [SamplingParams(temperature=0.8, seed=i, max_tokens=n, ignore_eos=True) for i, n in enumerate(lengths)]
        free_outs, free_secs = drive(engine, prompts, free)
        assert [len(free_outs[str(i)].outputs[0].token_ids) for i in range(requests)] == lengths
    tokens = sum(lengths)
    stopped, valid = valid_json(outs, schemas)
    row = {"mode": mode, "requests": requests, "tokens": tokens, "constrained_tok_s": tokens / secs,
           "unconstrained_tok_s": tokens / free_secs, "ratio": free_secs / secs, "grammar_steps": len(masks["rows"]),
           "mean_rows": statistics.fmean(masks["rows"]), "fill_ms_p50": statistics.median(masks["fill_ms"]),
           "fill_ms_p90": _p90(masks["fill_ms"]), "apply_ms_p50": statistics.median(masks["apply_ms"]),
           "apply_ms_p90": _p90(masks["apply_ms"]), "finished_by_grammar": stopped, "valid_json": valid}
    print(json.dumps(row), flush=True)
    return row


def _p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="8b", choices=sorted(e2e.SHAPES))
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--modes", default="deterministic,fast")
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke run with --shape tiny")
    args = ap.parse_args(argv)
    e2e.DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    loaded = random_shape_model(args.shape, args.device)
    t = time.perf_counter()
    tokenizer = synthetic_tokenizer(loaded.config.vocab_size)
    vocab_s = time.perf_counter() - t
    loaded = copy.copy(loaded)
    object.__setattr__(loaded, "tokenizer", tokenizer)  # LoadedModel is frozen; the weights digest stays
    rows = [measure(loaded, mode, args.requests, args.prompt_len, args.max_tokens) for mode in args.modes.split(",")]
    write_json({"shape": args.shape, "vocab_build_s": vocab_s, "rows": rows}, args.out / "structured.json")
    print_table(rows)
    plot(rows, args.out / "structured.png")
    return 0


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="every request with a JSON schema vs the same tokens unconstrained")
    for c in ("mode", "requests", "tokens", "tok/s schema", "tok/s free", "ratio", "fill ms p50/p90",
              "apply ms p50/p90", "rows/step", "valid/finished"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["mode"], str(r["requests"]), str(r["tokens"]), f"{r['constrained_tok_s']:.0f}",
                  f"{r['unconstrained_tok_s']:.0f}", f"{r['ratio']:.3f}",
                  f"{r['fill_ms_p50']:.2f}/{r['fill_ms_p90']:.2f}", f"{r['apply_ms_p50']:.2f}/{r['apply_ms_p90']:.2f}",
                  f"{r['mean_rows']:.1f}", f"{r['valid_json']}/{r['finished_by_grammar']}")
    Console().print(t)


def plot(rows: list[dict], path: Path) -> None:
    with figure(path, figsize=(7, 3.5)) as (_, ax):
        labels = [r["mode"] for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["unconstrained_tok_s"] for r in rows], 0.4, label="unconstrained")
        ax.bar([i + 0.2 for i in x], [r["constrained_tok_s"] for r in rows], 0.4, label="JSON schema")
        ax.set_xticks(list(x), labels)
        ax.set_ylabel("output tok/s")
        ax.legend()


# samebits: intentionally nondeterministic because a benchmark times fast mode beside deterministic mode, each in its
# own runtime (runtime/template.py).
if __name__ == "__main__":
    sys.exit(main())
