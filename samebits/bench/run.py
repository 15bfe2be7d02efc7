"""The benchmark's run: the model, the workload, each mode's engine measured (load, re-runs alone) and the report.

All modes run in one process on one set of weights, deterministic first: the deployment template is entered before
the device's first call, and cuBLAS's workspace and MKL's reproducible mode keep its settings for the process's life,
so fast mode runs as under `eval "$(samebits env --shell)"` (as benchmarks/e2e.py does on the GPU).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from samebits.bench.bound import weights_dtype, with_step_bound, workload_bound
from samebits.bench.config import MAX_NUM_BATCHED_TOKENS, BenchConfig
from samebits.bench.invariance import alone_vs_loaded, picks
from samebits.bench.load import run_load
from samebits.bench.workload import Workload, workload
from samebits.engine.config import EngineConfig

SCHEMA_VERSION = 1
MAX_NUM_SEQS = 256
CPU_KV_TOKENS = 65536  # the CPU's default pool (model_runner.py) preempts a few hundred long requests over and over
WARMUP_REQUESTS, WARMUP_TOKENS = 4, 4  # compiles every kernel before the timed load


def kv_tokens_for(device: str) -> int | None:
    """None on CUDA: the runner sizes the pool from free memory."""
    return None if device.startswith("cuda") else CPU_KV_TOKENS


def pool_tokens(engine) -> int:
    """The engine's KV pool in tokens: the later modes get the first one's, so every mode schedules the same steps
    (a pool sized from what an earlier engine left free admitted fewer requests at once and split the prefill)."""
    return engine.runner.num_blocks * engine.runner.block_size


def release(device: str) -> None:
    """After the last reference to an engine is dropped: its cycles collected, then the cached blocks returned."""
    import gc

    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def engine_for(loaded, mode: str, policy: str, device: str, cuda_graphs: bool = True,
               async_scheduling: bool | None = None, kv_cache_tokens: int | None = None,
               max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS, **fields):
    """`fields`: any other EngineConfig field (benchmarks/fairness.py sets the prefill limits)."""
    from samebits.engine.llm_engine import LLMEngine
    from samebits.kernels import get_ops

    loaded.model.set_ops(get_ops(mode, device))
    config = EngineConfig(model=loaded.name, mode=mode, policy=policy, device=device, dtype=str(loaded.model.dtype),
                          max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=MAX_NUM_SEQS,
                          cuda_graphs=cuda_graphs, kv_cache_tokens=kv_cache_tokens,
                          async_scheduling=async_scheduling, **fields)
    return LLMEngine(config, loaded)


def measure(engine, work: Workload, chosen: list[int], seed: int = 0,
            advance: Callable[[int], None] | None = None, warm: bool = False) -> dict:
    """A warm-up (with `warm`, the whole workload untimed), the timed load, then the chosen requests re-run alone;
    `advance(n)` as n of them are done."""
    run_load(engine, work.warmup(WARMUP_REQUESTS, WARMUP_TOKENS))
    cold = None
    if warm:
        cold = run_load(engine, work, seed)[1]
        engine.scheduler.reset_prefix_cache()  # the timed load must compute every prompt token again
    outs, stats = run_load(engine, work, seed, advance)
    if cold is not None:
        stats["cold"] = {key: cold[key] for key in ("seconds", "output_tok_per_s", "ttft_mean_s", "itl_mean_ms")}
    stats["alone_vs_loaded_mismatches"] = alone_vs_loaded(engine, work, outs, chosen, seed,
                                                          checked=None if advance is None else lambda: advance(1))
    stats["checked"] = len(chosen)
    return stats


def load(config: BenchConfig, device: str):
    """The model to measure: a random shape, --model, or the built-in default (with the loader's own bar)."""
    from samebits.bench.shapes import random_shape_model
    from samebits.models import load_model
    from samebits.models.hub import DEFAULT_MODEL

    if config.random_shape is not None:
        return random_shape_model(config.random_shape, device, config.quantization)
    return load_model(config.model or DEFAULT_MODEL, config.modes[0], device, quantization=config.quantization)


def bench_workload(config: BenchConfig, model_config) -> Workload:
    """ValueError naming the flags when the longest request cannot fit the model's context."""
    longest = config.prompt_tokens[1] + config.output_tokens[1]
    if longest > model_config.max_position_embeddings:
        raise ValueError(f"--prompt-tokens MAX {config.prompt_tokens[1]} + --output-tokens MAX "
                         f"{config.output_tokens[1]} = {longest} exceeds the model's context of "
                         f"{model_config.max_position_embeddings} tokens")
    return workload(config.requests, config.seed, config.prompt_tokens, config.output_tokens,
                    model_config.vocab_size)


def run_bench(config: BenchConfig, loaded, work: Workload, device: str, bar) -> dict:
    """Every mode of `config` on `loaded`, one `bar` task each (a rich Progress); -> the report."""
    from samebits.runtime import fingerprint, runtime_for

    chosen = picks(len(work), config.rerun_alone)
    report = _header(config, loaded, work, device)
    kv_tokens = kv_tokens_for(device)
    for mode in config.modes:
        task = bar.add_task(f"{mode}: {len(work)} requests, {len(chosen)} re-run alone",
                            total=len(work) + len(chosen))
        with runtime_for(mode):
            stats = _measure_mode(loaded, mode, device, work, chosen, config, functools.partial(bar.advance, task),
                                  kv_tokens)
            report["fingerprints"][mode] = fingerprint(mode, None, loaded.numerics())  # what produced these bits
        report["modes"][mode] = stats = with_step_bound(stats, report["roofline"], loaded.config)
        kv_tokens = stats["kv_cache_tokens"]
    if len(report["modes"]) == 2:
        tok_s = {mode: stats["output_tok_per_s"] for mode, stats in report["modes"].items()}
        report["deterministic_tax"] = 1 - tok_s["deterministic"] / tok_s["fast"]
    return report


def _header(config: BenchConfig, loaded, work: Workload, device: str) -> dict:
    return {"schema": SCHEMA_VERSION, "config": dataclasses.asdict(config), "model": loaded.name, "device": device,
            "workload": {"requests": len(work), "prompt_tokens": sum(map(len, work.prompts)),
                         "output_tokens": sum(work.max_tokens)},
            "roofline": workload_bound(loaded.config, work, weights_dtype(loaded.model), device, MAX_NUM_SEQS),
            "modes": {}, "fingerprints": {}}


def _measure_mode(loaded, mode: str, device: str, work: Workload, chosen: list[int], config: BenchConfig, advance,
                  kv_tokens: int | None) -> dict:
    """One engine with a KV pool of kv_tokens (None: sized from free memory), dropped and released on return."""
    engine = engine_for(loaded, mode, "dynamic", device, kv_cache_tokens=kv_tokens,
                        max_num_batched_tokens=config.max_num_batched_tokens)
    try:
        return {**measure(engine, work, chosen, config.seed, advance, config.warm),
                "kv_cache_tokens": pool_tokens(engine)}
    finally:
        del engine
        release(device)
