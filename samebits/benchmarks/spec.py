"""Speculative decoding (docs/SPECULATIVE.md): decode latency with and without it, deterministic mode, CUDA graphs.

An 8B-shaped random target (or `--shape tiny --device cpu` for a smoke run), greedy, at batch 1, 8 and 64, 128-token
prompts and 256 output tokens (a fresh back-off each run: its first tries are in every row's cost). Plain
decoding runs first; its outputs are what every speculative run must reproduce bit for bit (checked, reported as
`same_bits`), and what the replay drafter proposes:
- `replay@r`: the target's own greedy continuation, each draft token replaced by another with the probability that
  makes vLLM's acceptance rate (accepted / drafted tokens) r: forced acceptance, no drafting cost (the upper bound);
- `random`: k random tokens, nothing accepted: the cost of speculating, with the back-off (speculator.py);
  `random-always` tries every step (what one verify step costs);
- `ngram`: prompt lookup on a repetitive workload (a 16-token phrase repeated), whatever the target does with it.
Latency is the decode phase's wall time per output token of a sequence (after every prefill); speedup is plain's over
speculation's. Writes spec.json and spec.png to --out; exits 1 if any run's bits differ from plain decoding's.
`--quick`: batches 1 and 64, 128 output tokens, acceptance 0.8 only.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from pathlib import Path

import torch

from samebits.bench.run import release
from samebits.bench.shapes import SHAPES, random_shape_model
from samebits.benchmarks import e2e
from samebits.benchmarks.results import figure, write_json
from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.sampling_params import RequestOutputKind, SamplingParams
from samebits.runtime import deterministic_runtime

PHRASE = 16  # tokens of the repeated phrase of the ngram workload
WARMUP_TOKENS = 8


def make_engine(loaded, device: str, k: int, kv_tokens: int, max_num_seqs: int, speculative: bool) -> LLMEngine:
    from samebits.kernels import get_ops

    loaded.model.set_ops(get_ops("deterministic", device))
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    config = EngineConfig(model=loaded.name, device=device, dtype=str(loaded.model.dtype), kv_cache_tokens=kv_tokens,
                          max_num_seqs=max_num_seqs, speculative_config=spec if speculative else None)
    return LLMEngine(config, loaded)


def prompts(batch: int, length: int, vocab: int, repetitive: bool) -> list[list[int]]:
    rng = random.Random(batch * 7 + repetitive)
    if not repetitive:
        return [[rng.randrange(vocab) for _ in range(length)] for _ in range(batch)]
    out = []
    for _ in range(batch):
        phrase = [rng.randrange(vocab) for _ in range(PHRASE)]
        out.append((phrase * (length // PHRASE + 1))[:length])
    return out


def _generated(engine) -> list[int]:
    return [s.num_generated for seqs in engine.scheduler.requests.values() for s in seqs]


def decode(engine, ps: list[list[int]], tokens: int) -> tuple[float, dict]:
    """ms per output token of a sequence in the decode phase, and each request's (token ids, logprob bits)."""
    params = SamplingParams(temperature=0.0, max_tokens=tokens, logprobs=0, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, params)
    done = {}
    while min(_generated(engine), default=1) == 0:  # every prefill done: the timed steps decode (and verify)
        done.update((o.request_id, o) for o in engine.step())
    engine.drain()
    e2e.sync()
    generated = sum(_generated(engine)) + tokens * len(done)
    t = time.perf_counter()
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step())
    e2e.sync()
    seconds = time.perf_counter() - t
    per_seq = (len(ps) * tokens - generated) / len(ps)
    bits = {r: (list(o.outputs[0].token_ids), torch.tensor(o.outputs[0].token_logprobs).view(torch.int32).tolist())
            for r, o in done.items()}
    return 1e3 * seconds / max(per_seq, 1), bits


def per_token_keep(rate: float, k: int) -> float:
    """The probability a draft token is right that makes accepted / drafted = rate for k-token drafts."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        p = (lo + hi) / 2
        accepted = sum(p ** i for i in range(1, k + 1))
        lo, hi = (p, hi) if accepted / k < rate else (lo, p)
    return (lo + hi) / 2


class ReplayDrafter:
    """Proposes what the target will draw (its plain greedy outputs), each token kept with probability `keep`."""

    def __init__(self, truth: dict[str, list[int]], k: int, keep: float, vocab: int):
        self.truth, self.k, self.keep, self.vocab = truth, k, keep, vocab

    def propose(self, seqs) -> dict[int, list[int]]:
        drafts = {}
        for s in seqs:
            n, truth = s.num_tokens, self.truth[s.request_id]
            rng = random.Random(f"{s.request_id}:{n}")
            drafts[s.seq_id] = [t if rng.random() < self.keep else (t + 1 + rng.randrange(self.vocab - 1)) % self.vocab
                                for t in truth[n:n + self.k]]
        return drafts


class RandomDrafter:
    def __init__(self, k: int, vocab: int):
        self.k, self.vocab, self.rng = k, vocab, random.Random(0)

    def propose(self, seqs) -> dict[int, list[int]]:
        return {s.seq_id: [self.rng.randrange(self.vocab) for _ in range(self.k)] for s in seqs}


def run_batch(plain, spec, loaded, batch: int, args) -> list[dict]:
    vocab, k = loaded.config.vocab_size, args.k
    rows, warm = [], prompts(batch, args.prompt_len, vocab, False)
    decode(plain, warm, WARMUP_TOKENS)  # captures this batch's decode graphs outside the timed runs
    with drafting(spec.speculator, RandomDrafter(k, vocab), False):  # a try, then plain steps: both graphs
        decode(spec, warm, WARMUP_TOKENS)
    for repetitive in (False, True):
        ps = prompts(batch, args.prompt_len, vocab, repetitive)
        base_ms, expected = decode(plain, ps, args.tokens)
        truth = {f"r{i}": p + expected[f"r{i}"][0] for i, p in enumerate(ps)}
        drafters = [("ngram", spec.speculator.drafter, False)] if repetitive else [
            *((f"replay@{r:g}", ReplayDrafter(truth, k, per_token_keep(r, k), vocab), False) for r in args.rates),
            ("random", RandomDrafter(k, vocab), False), ("random-always", RandomDrafter(k, vocab), True)]
        for name, drafter, always in drafters:
            before = engine_counts(spec)
            with drafting(spec.speculator, drafter, always):
                ms, got = decode(spec, ps, args.tokens)
            after = engine_counts(spec)
            drafted, accepted, drafts = (a - b for a, b in zip(after, before))
            rows.append({"batch": batch, "drafter": name, "k": k, "plain_ms_per_token": base_ms,
                         "spec_ms_per_token": ms, "speedup": base_ms / ms, "same_bits": got == expected,
                         "acceptance_rate": accepted / drafted if drafted else 0.0,
                         "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0, "drafts": drafts})
            print(json.dumps(rows[-1]), flush=True)
    return rows


@contextlib.contextmanager
def drafting(speculator, drafter, always: bool):
    """The engine's speculator with another drafter, its back-off reset (or off: a try every step), then restored."""
    own, speculator.drafter, speculator.backoff, speculator.wait = speculator.drafter, drafter, 0, 0
    if always:
        speculator.due = lambda running: True
    try:
        yield
    finally:
        speculator.drafter = own
        speculator.__dict__.pop("due", None)


def engine_counts(engine) -> tuple[int, int, int]:
    st = engine.stats()
    return st.spec_num_draft_tokens, st.spec_num_accepted_tokens, st.spec_num_drafts


# --quick: the two ends of the targets (batch 1 at 80 % acceptance, batch 64 with nothing accepted), shorter outputs.
QUICK = {"batches": "1,64", "tokens": 128, "rates": "0.8"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke run with --shape tiny")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--rates", default="0.8,1", help="forced acceptance rates of the replay drafter")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=256, help="output tokens a request")
    ap.add_argument("--quick", action="store_true", help=f"sets {QUICK}")
    args = ap.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    args.rates = [float(r) for r in args.rates.split(",")]
    e2e.DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    with deterministic_runtime():
        loaded = random_shape_model(args.shape, args.device)
        kv_tokens = max(batches) * (args.prompt_len + args.tokens + 2 * args.k + 64)
        plain = make_engine(loaded, args.device, args.k, kv_tokens, max(batches), speculative=False)
        spec = make_engine(loaded, args.device, args.k, kv_tokens, max(batches), speculative=True)
        for batch in batches:
            rows += run_batch(plain, spec, loaded, batch, args)
        del plain, spec
        release(args.device)
    write_json({"shape": args.shape, "device": args.device, "rows": rows}, args.out / "spec.json")
    print_table(rows)
    plot(rows, args.out / "spec.png")
    return 0 if all(r["same_bits"] for r in rows) else 1


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="speculative decoding: decode ms per output token of a sequence (deterministic, graphs)")
    for c in ("batch", "drafter", "k", "plain", "spec", "speedup", "acceptance", "mean length", "same bits"):
        t.add_column(c)
    for r in rows:
        t.add_row(str(r["batch"]), r["drafter"], str(r["k"]), f"{r['plain_ms_per_token']:.2f}",
                  f"{r['spec_ms_per_token']:.2f}", f"{r['speedup']:.2f}x", f"{r['acceptance_rate']:.0%}",
                  f"{r['mean_acceptance_length']:.2f}", "yes" if r["same_bits"] else "NO")
    Console().print(t)


def plot(rows: list[dict], path: Path) -> None:
    with figure(path, figsize=(9, 3.5)) as (_, ax):
        ax.bar([f"{r['drafter']} b{r['batch']}" for r in rows], [r["speedup"] for r in rows])
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_ylabel("speedup over plain decoding")
        ax.tick_params(axis="x", rotation=60, labelsize=7)


# samebits: deterministic because main runs the load and every engine inside deterministic_runtime()
# (runtime/template.py), which sets these flags and restores them after.
if __name__ == "__main__":
    raise SystemExit(main())
