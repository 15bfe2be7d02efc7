"""End-to-end benchmark (GPU): fast vs deterministic vs bucketed vs HF `generate`, on an 8B-shaped random model.

Also measures how much invariance each mode really has: requests re-run alone vs inside the full load.
Writes e2e.json and e2e.png to --out.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from pathlib import Path

import torch
from steplog import StepLog  # benchmarks/steplog.py, beside this script

from samebits.diagnostics.roofline import roofline
from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.sampling_params import SamplingParams
from samebits.kernels import get_ops
from samebits.models.config import ModelConfig
from samebits.models.loader import LoadedModel
from samebits.models.testing import random_model
from samebits.runtime import deterministic_runtime

SHAPES = {
    "8b": dict(architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
               num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=8192, rope_theta=500000.0),
    "tiny": dict(architecture="llama", vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=64, max_position_embeddings=4096, rope_theta=500000.0),
    "1b": dict(architecture="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
               num_heads=32, num_kv_heads=8, head_dim=64, max_position_embeddings=8192, rope_theta=500000.0),
}


class NullTokenizer:
    """Random-weight models have no vocabulary worth decoding; the engine only needs these."""
    eos_token_ids: set[int] = set()

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""


def workload(n: int, seed: int, in_range, out_range, vocab: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(*in_range))] for _ in range(n)]
    return prompts, [rng.randint(*out_range) for _ in range(n)]


DEVICE = "cuda"
GRAPHS = True
# "+sync": the same engine with async scheduling off, side by side in this run (what overlapping the host buys).
RUNS = ("fast/dynamic", "deterministic/dynamic", "deterministic/dynamic+sync", "fast/bucketed")


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def make_engine(loaded, mode: str, policy: str, **kw) -> LLMEngine:
    loaded.model.set_ops(get_ops(mode, DEVICE))
    cfg = EngineConfig(model="random", mode=mode, policy=policy, device=DEVICE, dtype=str(loaded.model.dtype),
                       max_num_batched_tokens=kw.get("budget", 8192), max_num_seqs=256, cuda_graphs=kw.get("graphs", GRAPHS),
                       kv_cache_tokens=kw.get("kv_tokens"), async_scheduling=kw.get("async_scheduling"))
    return LLMEngine(cfg, loaded)


def run_load(engine, prompts, max_tokens, seed=0):
    """All requests at t=0; returns outputs by index and timing (TTFT, inter-token latency, throughput, the time by
    kind of step)."""
    log = StepLog(engine)
    t0 = time.perf_counter()
    first, done = {}, {}
    for i, (p, m) in enumerate(zip(prompts, max_tokens)):
        engine.add_request(str(i), p, SamplingParams(temperature=0.8, seed=seed + i, max_tokens=m, logprobs=0,
                                                     ignore_eos=True))
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = time.perf_counter() - t0
            first.setdefault(out.request_id, now)
            if out.finished:
                done[out.request_id] = (out, now)
    sync()
    total = time.perf_counter() - t0
    engine.step, engine.scheduler.schedule = log.step, log.schedule
    gen = sum(len(done[str(i)][0].outputs[0].token_ids) for i in range(len(prompts)))
    itl = [(done[str(i)][1] - first[str(i)]) / max(1, max_tokens[i] - 1) for i in range(len(prompts))]
    return [done[str(i)][0] for i in range(len(prompts))], {
        "seconds": total, "output_tok_per_s": gen / total, "ttft_mean_s": sum(first.values()) / len(first),
        "itl_mean_ms": 1e3 * sum(itl) / len(itl), "generated_tokens": gen,
        "steps": log.summary(t0, t0 + total)}


def key(out, k: int):
    c = out.outputs[0]
    return c.token_ids[:k], torch.tensor(c.token_logprobs[:k], dtype=torch.float32).view(torch.int32).tolist()


def invariance(engine, prompts, outs, picks, k: int) -> int:
    """Requests re-run alone (first k tokens, same seed) vs inside the full load: how many differ."""
    bad = 0
    for i in picks:
        engine.add_request(f"alone-{i}", prompts[i], SamplingParams(temperature=0.8, seed=i, max_tokens=k,
                                                                    logprobs=0, ignore_eos=True))
        out = None
        while engine.has_unfinished_requests():
            for o in engine.step():
                out = o if o.finished else out
        bad += key(out, k) != key(outs[i], k)
    return bad


def decode_step_ms(engine, prompt_len: int = 512, steps: int = 64) -> float:
    prompt = list(range(prompt_len))
    engine.add_request("b1", prompt, SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True))
    engine.step()  # prefill
    sync()
    t = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    sync()
    return 1e3 * (time.perf_counter() - t) / steps


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
        engine = make_engine(loaded, "deterministic", "dynamic", kv_tokens=None if DEVICE == "cuda" else 65536)
        prompts, _ = workload(64, 1, (512, 512), (1, 1), shape["vocab_size"])
        _, stats = run_load(engine, prompts, [out_len] * 64)
    return stats["output_tok_per_s"]


def workload_bound(config: ModelConfig, prompts, max_tokens, dtype):
    return roofline(config, [len(p) for p in prompts], max_tokens, torch.empty((), dtype=dtype).element_size(),
                    max_num_seqs=256)


def weights_floor_ms(loaded) -> float:
    nbytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
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
    args = ap.parse_args()
    if unknown := set(args.modes.split(",")) - set(RUNS):
        ap.error(f"--modes: unknown {sorted(unknown)}; choose from {', '.join(RUNS)}")
    global DEVICE, GRAPHS
    DEVICE, GRAPHS = args.device, not args.no_graphs
    args.out.mkdir(parents=True, exist_ok=True)
    shape = SHAPES[args.shape]
    config = ModelConfig(**shape)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    model = random_model(config, get_ops("fast", DEVICE), dtype, seed=0)
    loaded = LoadedModel(model, NullTokenizer(), config, f"random-{args.shape}", Path("."))
    out_range = (16, 32) if args.quick else (128, 512)
    prompts, max_tokens = workload(args.requests, 0, (128, 1024), out_range, shape["vocab_size"])
    picks = list(range(0, args.requests, max(1, args.requests // 8)))[:8]
    report = {"shape": args.shape, "requests": args.requests, "cuda_graphs": GRAPHS, "modes": {}}
    bound = workload_bound(config, prompts, max_tokens, dtype)
    report["roofline"] = {"prefill_s": bound.prefill_s, "decode_s": bound.decode_s, "total_s": bound.total_s,
                          "decode_steps": bound.decode_steps}
    for mode, policy in (run.split("/") for run in args.modes.split(",")):
        with deterministic_runtime() if mode == "deterministic" else contextlib.nullcontext():
            engine = make_engine(loaded, mode, policy.removesuffix("+sync"), kv_tokens=None if DEVICE == "cuda" else 65536,
                                 async_scheduling=False if policy.endswith("+sync") else None)
            run_load(engine, prompts[:4], [4] * 4)  # warm-up: compile kernels
            outs, stats = run_load(engine, prompts, max_tokens)
            stats["alone_vs_loaded_mismatches"] = invariance(engine, prompts, outs, picks, 16)
            stats["checked"] = len(picks)
            stats["batch1_decode_ms"] = decode_step_ms(engine)
            stats["of_roofline"] = bound.total_s / stats["seconds"]
        report["modes"][f"{mode}/{policy}"] = stats
        print(mode, policy, json.dumps(stats), flush=True)
        (args.out / "e2e.json").write_text(json.dumps(report, indent=2))  # partial results survive a timeout
        del engine
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    report["engine_b64_tok_per_s"] = engine_batch64(loaded, shape, 32 if args.quick else 128)
    report["weights_floor_ms"] = weights_floor_ms(loaded)
    if {"fast/dynamic", "deterministic/dynamic"} <= set(report["modes"]):
        fast = report["modes"]["fast/dynamic"]["output_tok_per_s"]
        report["deterministic_tax"] = 1 - report["modes"]["deterministic/dynamic"]["output_tok_per_s"] / fast
    if not args.skip_hf:
        del model, loaded
        torch.cuda.empty_cache()
        try:
            report["hf_generate_b64_tok_per_s"] = hf_generate(shape, 64, 512, 32 if args.quick else 128)
        except Exception as e:  # the comparison is optional; say why it is missing
            report["hf_generate_error"] = repr(e)
    (args.out / "e2e.json").write_text(json.dumps(report, indent=2))
    print_table(report)
    plot(report, args.out / "e2e.png")


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"e2e {report['shape']}, {report['requests']} requests")
    for c in ("mode", "tok/s", "of roofline", "TTFT s", "ITL ms", "b1 decode ms", "alone≠loaded"):
        t.add_column(c)
    for name, s in report["modes"].items():
        t.add_row(name, f"{s['output_tok_per_s']:.0f}", f"{s['of_roofline']:.2f}", f"{s['ttft_mean_s']:.2f}",
                  f"{s['itl_mean_ms']:.1f}",
                  f"{s['batch1_decode_ms']:.2f}", f"{s['alone_vs_loaded_mismatches']}/{s['checked']}")
    Console().print(t)
    steps = Table(title="time inside engine.step, by the kind of step launched")
    for c in ("mode", "kind", "steps", "seconds", "mean ms", "mean tokens", "mean rows"):
        steps.add_column(c)
    for name, s in report["modes"].items():
        for kind, k in s["steps"]["by_kind"].items():
            steps.add_row(name, kind, str(k["steps"]), f"{k['seconds']:.2f}", f"{k['mean_ms']:.1f}",
                          f"{k['mean_tokens']:.0f}", f"{k['mean_rows']:.0f}")
    Console().print(steps)
    print(f"roofline {report['roofline']['total_s']:.2f} s (prefill {report['roofline']['prefill_s']:.2f}, decode "
          f"{report['roofline']['decode_s']:.2f}); weights floor {report['weights_floor_ms']:.2f} ms; "
          f"deterministic tax {report.get('deterministic_tax', float('nan')):.1%}; "
          f"engine b64 {report['engine_b64_tok_per_s']:.0f} tok/s; "
          f"HF generate b64 {report.get('hf_generate_b64_tok_per_s', float('nan')):.0f} tok/s")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["modes"]) + (["HF generate b64"] if "hf_generate_b64_tok_per_s" in report else [])
    vals = [s["output_tok_per_s"] for s in report["modes"].values()] + (
        [report["hf_generate_b64_tok_per_s"]] if "hf_generate_b64_tok_per_s" in report else [])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh(names, vals)
    ax.set_xlabel("output tokens / s")
    ax.set_title(f"e2e, {report['shape']}-shaped random model, H200")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
