"""The CPU side by side, in one process: `make demo`'s workload in deterministic vs fast mode, and the default model's
greedy decode against transformers' `generate` (eager PyTorch, its default attention; "HF" in the table) at batch 1
and 16.

    python -m samebits.benchmarks.cpu_demo --out DIR [--reps 3] [--batches 1,16] [--skip-hf] [--label NAME]

The modes alternate rep by rep (deterministic first, so the deployment template is entered before MKL's first
call, as in `samebits bench`: fast mode then runs under the template's MKL mode too), and each rep's ratio is taken
from two neighbouring runs, so a shared machine's load moves both sides of a ratio alike. `make demo` runs each mode
in a fresh process instead; its ratio is the one printed by `make demo`. Prints a table, writes DIR/cpu_demo.NAME.json
and DIR/cpu_demo.NAME.png (NAME defaults to the CPU vendor).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from samebits.benchmarks.cpu_route import cpu_name
from samebits.benchmarks.results import figure, write_json
from samebits.engine.sampling_params import SamplingParams
from samebits.modes import MODES  # deterministic first, as the report reads
from samebits.runtime import runtime_for

PROMPT_TOKENS = 64


class _NoBar:
    """The part of rich's Progress that cli/demo.py's run_mode uses, silent."""

    def add_task(self, description: str, total: int) -> int:
        return 0

    def advance(self, task: int) -> None:
        pass

    def update(self, task: int, description: str) -> None:
        pass


def demo_seconds(loaded, mode: str, prompts, fillers) -> float:
    """`make demo`'s timed part in `mode`: the 16 prompts alone, then inside the busy batch, on a fresh engine."""
    from samebits.cli.demo import run_mode

    with runtime_for(mode):
        return run_mode(loaded, mode, "cpu", prompts, fillers, _NoBar()).seconds


def engine_tok_s(loaded, mode: str, ids: torch.Tensor, new_tokens: int) -> float:
    """Greedy decode of every row of `ids` at once, `new_tokens` each, through the engine (one warm-up first)."""
    from samebits.cli.demo import _engine, _generate

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    with runtime_for(mode):
        engine = _engine(loaded, mode, "cpu")
        _generate(engine, [ids[0, :8].tolist()], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
        start = time.perf_counter()
        outs = _generate(engine, ids.tolist(), params)
        seconds = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outs) / seconds


def hf_model(loaded):
    """transformers' LlamaForCausalLM with the loaded model's weights (engine/weights.py's name map, run backwards)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from samebits.engine.weights import plan

    c = loaded.config
    cfg = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                      num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
                      max_position_embeddings=c.max_position_embeddings, rope_theta=c.rope_theta,
                      rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=c.tie_word_embeddings)
    model = LlamaForCausalLM(cfg).to(loaded.model.dtype).eval()
    with torch.no_grad():
        for ours, theirs in plan(loaded.model, dict(model.state_dict())):
            theirs.copy_(ours)
    return model


def hf_tok_s(model, ids: torch.Tensor, new_tokens: int) -> float:
    """transformers' eager `generate`, greedy, exactly `new_tokens` per row (one warm-up first)."""
    mask = torch.ones_like(ids)
    with torch.no_grad():
        model.generate(ids[:, :8], attention_mask=mask[:, :8], max_new_tokens=2, min_new_tokens=2, do_sample=False)
        start = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, pad_token_id=0)
        seconds = time.perf_counter() - start
    return ids.shape[0] * new_tokens / seconds


def run(args) -> dict:
    from samebits.cli.demo import FILLERS, QUESTIONS, _filler_prompts
    from samebits.models import load_model

    report = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "reps": args.reps, "demo": {m: [] for m in MODES},
              "generate": {}}
    with runtime_for("deterministic"):  # before the loader's first MKL call (module docstring)
        loaded = load_model(args.model, "deterministic", "cpu", progress=False)
    prompts = [loaded.tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    fillers = _filler_prompts(loaded.tokenizer, FILLERS)
    for rep in range(args.reps):
        for mode in MODES:
            report["demo"][mode].append(demo_seconds(loaded, mode, prompts, fillers))
            print(f"demo rep {rep} {mode}: {report['demo'][mode][-1]:.1f} s", flush=True)
    det, fast = report["demo"]["deterministic"], report["demo"]["fast"]
    report["demo_ratio"] = statistics.median(d / f for d, f in zip(det, fast))
    hf = None if args.skip_hf else hf_model(loaded)
    g = torch.Generator().manual_seed(0)
    for batch in map(int, args.batches.split(",")):
        ids = torch.randint(0, loaded.config.vocab_size, (batch, PROMPT_TOKENS), generator=g)
        row = {m: [] for m in (*MODES, *(("transformers",) if hf is not None else ()))}
        for rep in range(args.reps):
            for mode in MODES:
                row[mode].append(engine_tok_s(loaded, mode, ids, args.new_tokens))
            if hf is not None:
                row["transformers"].append(hf_tok_s(hf, ids, args.new_tokens))
            print(f"batch {batch} rep {rep}: " + ", ".join(f"{m} {v[-1]:.1f} tok/s" for m, v in row.items()),
                  flush=True)
        report["generate"][str(batch)] = {"tok_per_s": row, **_ratios(row)}
    return report


def _ratios(row: dict) -> dict:
    """Per-rep ratios of neighbouring runs, their median."""
    out = {"deterministic_over_fast": statistics.median(d / f for d, f in zip(row["deterministic"], row["fast"]))}
    if "transformers" in row:
        out["deterministic_over_transformers"] = statistics.median(
            d / h for d, h in zip(row["deterministic"], row["transformers"]))
    return out


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"CPU, {report['cpu']}, {report['threads']} threads, median of {report['reps']}")
    for c in ("workload", "deterministic", "fast", "HF", "det/fast", "det/HF"):
        t.add_column(c, no_wrap=True)
    d = report["demo"]
    t.add_row("demo s", f"{statistics.median(d['deterministic']):.1f}", f"{statistics.median(d['fast']):.1f}",
              "-", f"{report['demo_ratio']:.2f}x", "-")
    for batch, g in report["generate"].items():
        tps = {m: f"{statistics.median(v):.1f}" for m, v in g["tok_per_s"].items()}
        vs_hf = g.get("deterministic_over_transformers")
        t.add_row(f"b{batch} tok/s", tps["deterministic"], tps["fast"], tps.get("transformers", "-"),
                  f"{g['deterministic_over_fast']:.2f}x", "-" if vs_hf is None else f"{vs_hf:.2f}x")
    Console().print(t)
    print("demo: seconds over seconds (lower is better); bN: batch N's tok/s over tok/s (higher is better)")


def plot(report: dict, path: Path) -> None:
    with figure(path, 1, 2, figsize=(9, 3.5)) as (fig, (a, b)):
        d = report["demo"]
        a.bar(list(d), [statistics.median(v) for v in d.values()])
        a.set_ylabel("seconds")
        a.set_title(f"make demo workload ({report['demo_ratio']:.2f}x)")
        width = 0.25
        for i, (batch, g) in enumerate(report["generate"].items()):
            for j, (mode, v) in enumerate(g["tok_per_s"].items()):
                b.bar(i + j * width, statistics.median(v), width, label=mode if i == 0 else None, color=f"C{j}")
        b.set_xticks([i + width for i in range(len(report["generate"]))], [f"batch {k}" for k in report["generate"]])
        b.set_ylabel("output tok/s")
        b.set_title("greedy decode, 64-token prompts")
        b.legend()
        fig.suptitle(f"{report['cpu']}, {report['threads']} threads")


def main(argv: list[str] | None = None) -> int:
    from samebits.models.hub import DEFAULT_MODEL

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--label", default=None, help="file name part; default: the CPU vendor")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error(f"--reps must be >= 1, got {args.reps}")
    args.out.mkdir(parents=True, exist_ok=True)
    label = args.label or ("amd" if "AMD" in cpu_name() else "intel" if "Intel" in cpu_name() else "cpu")
    report = run(args)
    report["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    write_json(report, args.out / f"cpu_demo.{label}.json")
    print_table(report)
    plot(report, args.out / f"cpu_demo.{label}.png")
    return 0


# samebits: intentionally nondeterministic because a benchmark times fast mode and transformers beside deterministic
# mode; each mode enters its own runtime (runtime/template.py) where it runs.
if __name__ == "__main__":
    raise SystemExit(main())
