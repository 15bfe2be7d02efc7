"""End-to-end benchmark (GPU): fast vs deterministic vs bucketed vs HF `generate`, on an 8B-shaped random model (or
another shape of bench/shapes.py: `--shape qwen3-30b-a3b`, a mixture of experts, skips HF `generate`).

Also measures how much invariance each mode really has: requests re-run alone vs inside the full load.
`--quantization none,fp8` runs the same workload on the bf16 model and on its FP8 twin (`--quantization fp8` at load,
models/quantization.py) side by side; FP8 runs are reported as "fp8 MODE/POLICY". Writes e2e.json and e2e.png to --out. The workload, its timing, the re-runs and the roofline are `samebits bench`'s
(samebits/bench/); what is here is the H200 run's extras: the policies and async scheduling off side by
side, batch-1 decode, the weights floor and HF `generate`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch

from samebits.bench.bound import weights_dtype, with_step_bound, workload_bound
from samebits.bench.config import MAX_NUM_BATCHED_TOKENS
from samebits.bench.invariance import picks
from samebits.bench.load import run_load
from samebits.bench.report import roofline_cell, step_bound_lines, steps_table
from samebits.bench.roofline import expert_params, touched_experts
from samebits.bench.run import engine_for, kv_tokens_for, measure, pool_tokens, release
from samebits.bench.shapes import SHAPES, NullTokenizer, random_shape_model
from samebits.bench.workload import workload
from samebits.benchmarks.results import figure, write_json
from samebits.engine.sampling_params import SamplingParams
from samebits.runtime import deterministic_runtime

__all__ = ["SHAPES", "NullTokenizer", "make_engine", "sync"]  # steps.py and tp.py build on these

DEVICE = "cuda"
GRAPHS = True
# "+sync": the same engine with async scheduling off, side by side in this run (what overlapping the host buys).
RUNS = ("fast/dynamic", "deterministic/dynamic", "deterministic/dynamic+sync", "fast/bucketed")


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def make_engine(loaded, mode: str, policy: str, **kw):
    return engine_for(loaded, mode, policy, DEVICE, cuda_graphs=kw.get("graphs", GRAPHS),
                      async_scheduling=kw.get("async_scheduling"), kv_cache_tokens=kw.get("kv_tokens"),
                      max_num_batched_tokens=kw.get("budget", MAX_NUM_BATCHED_TOKENS))


def decode_step_ms(engine, prompt_len: int = 512, steps: int = 64, batch: int = 1) -> float:
    """A decode step's time at `batch` sequences of prompt_len tokens, after every prompt is prefilled."""
    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"b{batch}-{i}", [(i + j) % 1000 for j in range(prompt_len)], params)
    prefill = -(-batch * prompt_len // (MAX_NUM_BATCHED_TOKENS - batch))  # the decodes share the prefill steps' budget
    for _ in range(prefill):
        engine.step()
    sync()
    t, timed = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        timed += 1
    sync()
    return 1e3 * (time.perf_counter() - t) / timed


def hf_generate(shape: dict, batch: int, in_len: int, out_len: int) -> float:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                      intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_layers"],
                      num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
                      max_position_embeddings=shape["max_position_embeddings"], rope_theta=shape["rope_theta"])
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, shape["vocab_size"], (batch, in_len), device="cuda")
    model.generate(ids[:, :16], max_new_tokens=4, min_new_tokens=4, do_sample=False)
    sync()
    t = time.perf_counter()
    model.generate(ids, max_new_tokens=out_len, min_new_tokens=out_len, do_sample=False)
    sync()
    secs = time.perf_counter() - t
    del model
    torch.cuda.empty_cache()
    return batch * out_len / secs


def engine_batch64(loaded, shape: dict, out_len: int) -> float:
    """The HF comparison's workload (64 prompts of 512 tokens, out_len each) through the deterministic engine."""
    with deterministic_runtime():
        engine = make_engine(loaded, "deterministic", "dynamic", kv_tokens=kv_tokens_for(DEVICE))
        _, stats = run_load(engine, workload(64, 1, (512, 512), (out_len, out_len), shape["vocab_size"]))
    return stats["output_tok_per_s"]


QUANTIZATIONS = ("none", "fp8", "fp8_per_tensor")


def weights_floor_ms(loaded, rows: int = 1) -> float:
    """A decode step of `rows` sequences reading every weight it needs once: all of a dense model's, and of a mixture
    only the experts `rows` tokens route to (bench/roofline.py touched_experts)."""
    nbytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    cfg = loaded.config
    if cfg.moe is not None:
        sparse = sum(cfg.moe.is_sparse(i) for i in range(cfg.num_layers))
        untouched = cfg.moe.num_experts - touched_experts(cfg, rows)
        nbytes -= sparse * untouched * expert_params(cfg) * loaded.model.dtype.itemsize
    return 1e3 * nbytes / 4.0e12  # measured copy bandwidth on this H200 is ~4 TB/s (KINDS.md / METHOD.md)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="short outputs, for a smoke run")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke run with --shape tiny")
    ap.add_argument("--no-graphs", action="store_true", help="decode eagerly (no CUDA graphs)")
    ap.add_argument("--modes", default=",".join(RUNS), help=f"comma-separated, of {','.join(RUNS)}")
    ap.add_argument("--warm", action="store_true", help="one untimed pass of the workload first (BenchConfig.warm)")
    ap.add_argument("--quantization", default="none",
                    help=f"comma-separated, of {','.join(QUANTIZATIONS)}: the model(s) to run, side by side")
    args = ap.parse_args()
    if unknown := set(args.modes.split(",")) - set(RUNS):
        ap.error(f"--modes: unknown {sorted(unknown)}; choose from {', '.join(RUNS)}")
    if unknown := set(args.quantization.split(",")) - set(QUANTIZATIONS):
        ap.error(f"--quantization: unknown {sorted(unknown)}; choose from {', '.join(QUANTIZATIONS)}")
    global DEVICE, GRAPHS
    DEVICE, GRAPHS = args.device, not args.no_graphs
    args.out.mkdir(parents=True, exist_ok=True)
    shape = SHAPES[args.shape]
    out_range = (16, 32) if args.quick else (128, 512)
    work = workload(args.requests, 0, (128, 1024), out_range, shape["vocab_size"])
    chosen = picks(args.requests, 8)
    report = {"shape": args.shape, "requests": args.requests, "cuda_graphs": GRAPHS, "modes": {}}
    kv_tokens = kv_tokens_for(DEVICE)  # then the first engine's pool for every later one (bench/run.py pool_tokens)
    for quant in args.quantization.split(","):
        loaded = random_shape_model(args.shape, DEVICE, None if quant == "none" else quant)
        prefix = "" if quant == "none" else f"{quant} "
        bound = workload_bound(loaded.config, work, weights_dtype(loaded.model), DEVICE, max_num_seqs=256)
        report.setdefault("roofline", bound)
        report["weights_floor_ms" if quant == "none" else f"{quant}_weights_floor_ms"] = weights_floor_ms(loaded)
        if quant == "none":
            report["weights_floor_b64_ms"] = weights_floor_ms(loaded, 64)
        for mode, policy in (run.split("/") for run in args.modes.split(",")):
            if mode == "deterministic" and quant == "fp8_per_tensor":
                continue  # refused in deterministic mode (models/quantization.py)
            with deterministic_runtime() if mode == "deterministic" else contextlib.nullcontext():
                engine = make_engine(loaded, mode, policy.removesuffix("+sync"), kv_tokens=kv_tokens,
                                     async_scheduling=False if policy.endswith("+sync") else None)
                stats = measure(engine, work, chosen, warm=args.warm)
                stats["kv_cache_tokens"] = kv_tokens = pool_tokens(engine)
                stats["batch1_decode_ms"] = decode_step_ms(engine)
                stats["batch64_decode_ms"] = decode_step_ms(engine, steps=16 if args.quick else 64, batch=64)
                stats = with_step_bound(stats, bound, loaded.config)
            report["modes"][f"{prefix}{mode}/{policy}"] = stats
            print(prefix + mode, policy, json.dumps(stats), flush=True)
            write_json(report, args.out / "e2e.json")  # partial results survive a timeout
            del engine
            release(DEVICE)
        if quant == "none":
            report["engine_b64_tok_per_s"] = engine_batch64(loaded, shape, 32 if args.quick else 128)
        del loaded
        release(DEVICE)
    det, fp8 = report["modes"].get("deterministic/dynamic"), report["modes"].get("fp8 deterministic/dynamic")
    if det and fp8:
        report["fp8_over_bf16_deterministic"] = fp8["output_tok_per_s"] / det["output_tok_per_s"]
        report["fp8_batch1_over_floor"] = fp8["batch1_decode_ms"] / report["fp8_weights_floor_ms"]
    if {"fast/dynamic", "deterministic/dynamic"} <= set(report["modes"]):
        fast = report["modes"]["fast/dynamic"]["output_tok_per_s"]
        report["deterministic_tax"] = 1 - report["modes"]["deterministic/dynamic"]["output_tok_per_s"] / fast
    if "moe" in shape:
        report["hf_generate_error"] = "skipped: the HF comparison builds a dense LlamaForCausalLM"
    elif not args.skip_hf:
        try:
            report["hf_generate_b64_tok_per_s"] = hf_generate(shape, 64, 512, 32 if args.quick else 128)
        except Exception as e:  # noqa: BLE001 - the comparison is optional; say why it is missing
            report["hf_generate_error"] = repr(e)
    write_json(report, args.out / "e2e.json")
    print_table(report)
    plot(report, args.out / "e2e.png")


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"e2e {report['shape']}, {report['requests']} requests")
    for c in ("mode", "tok/s", "of roofline", "of step-max", "TTFT s", "ITL ms", "b1 decode ms", "b64 decode ms",
              "alone≠loaded"):
        t.add_column(c)
    for name, s in report["modes"].items():
        t.add_row(name, f"{s['output_tok_per_s']:.0f}", roofline_cell(s["of_roofline"]),
                  roofline_cell(s["of_step_roofline"]), f"{s['ttft_mean_s']:.2f}",
                  f"{s['itl_mean_ms']:.1f}",
                  f"{s['batch1_decode_ms']:.2f}", f"{s['batch64_decode_ms']:.2f}",
                  f"{s['alone_vs_loaded_mismatches']}/{s['checked']}")
    Console().print(t)
    Console().print(steps_table(report["modes"]))
    for line in step_bound_lines(report["modes"]):
        print(line)
    r = report["roofline"]
    bound = (f"roofline {r['total_s']:.2f} s (prefill {r['prefill_s']:.2f}, decode {r['decode_s']:.2f})"
             if r["total_s"] is not None else f"roofline n/a ({r['reason']})")
    nan = float("nan")
    print(f"{bound}; weights floor {report.get('weights_floor_ms', nan):.2f} ms "
          f"(b64 {report.get('weights_floor_b64_ms', nan):.2f}); "
          f"deterministic tax {report.get('deterministic_tax', nan):.1%}; "
          f"engine b64 {report.get('engine_b64_tok_per_s', nan):.0f} tok/s; "
          f"HF generate b64 {report.get('hf_generate_b64_tok_per_s', nan):.0f} tok/s")
    if "fp8_weights_floor_ms" in report:
        print(f"fp8: weights floor {report['fp8_weights_floor_ms']:.2f} ms; deterministic tok/s over bf16 "
              f"{report.get('fp8_over_bf16_deterministic', nan):.2f}x (target >= 1.3); batch-1 decode over its floor "
              f"{report.get('fp8_batch1_over_floor', nan):.2f}x (target <= 1.25)")


def plot(report: dict, path: Path) -> None:
    names = list(report["modes"]) + (["HF generate b64"] if "hf_generate_b64_tok_per_s" in report else [])
    vals = [s["output_tok_per_s"] for s in report["modes"].values()] + (
        [report["hf_generate_b64_tok_per_s"]] if "hf_generate_b64_tok_per_s" in report else [])
    with figure(path, figsize=(7, 3.5)) as (_, ax):
        ax.barh(names, vals)
        ax.set_xlabel("output tokens / s")
        ax.set_title(f"e2e, {report['shape']}-shaped random model, H200")


# samebits: intentionally nondeterministic because a benchmark times stock torch and fast mode beside deterministic
# mode, and each mode enters its own runtime (runtime/template.py) where it runs.
if __name__ == "__main__":
    main()
