"""The RL trainer on the GPU, one shape a run: rollout = trainer parity and the trainer's speed and memory.

1. Parity: a random bf16 Llama of the shape samples 256 rollouts (prompts 64-384 tokens, 128 tokens each: 32,768
   tokens); the samebits trainer's logprobs are compared with the rollout's bit for bit (raw distribution in shuffled
   micro-batches, the sampling distribution on 32 sequences); the same weights on stock kernels are the negative
   control.
2. One trainer step (16 sequences, the completion tokens' logprobs summed, forward + backward), each trainer built
   alone on the GPU: samebits `Policy` (fused backward), the same with activation checkpointing, the reference
   backward it replaces, the stock-kernel control, and transformers' LlamaForCausalLM (right-padded batch, SDPA, bf16):
   µs per real token and peak memory (weights, gradients and activations).
3. Gradients at scale: samebits' run to run and with the micro-batch's sequences listed in reverse (bit for bit), and
   against transformers' (max |difference| / max |reference|, per tensor); at 1B both against transformers' in fp32
   from the same weights, the error each bf16 trainer makes.

    python -m samebits.benchmarks.rl --out OUT --shape 1b          (~4 min on an H200)
    python -m samebits.benchmarks.rl --out OUT --shape 8b --quick  (~6 min)
    python -m samebits.benchmarks.rl --out OUT --device cpu --shape tiny --requests 8 --skip-hf   (a smoke run)
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from samebits.bench.shapes import SHAPES, NullTokenizer
from samebits.benchmarks.results import figure, write_json
from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.sampling_params import SamplingParams
from samebits.kernels import get_ops
from samebits.models.config import ModelConfig
from samebits.models.llama import LlamaModel
from samebits.models.loader import LoadedModel
from samebits.models.synthetic import hf_parameters_to, random_model
from samebits.rl.policy import Policy
from samebits.rl.rollout import engine_logprobs
from samebits.runtime import deterministic_runtime

DEVICE = "cuda"
PARAMS = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=128, logprobs=0, ignore_eos=True)
# name -> (Policy keyword arguments); transformers is the last row, built apart.
TRAINERS = {"samebits": {}, "samebits_checkpointed": {"checkpoint": True},
            "samebits_reference_backward": {"backward": "reference"}, "stock_kernels": {"mode": "fast"}}
LABELS = {"samebits": "samebits Policy", "samebits_checkpointed": "samebits, checkpointed layers",
          "samebits_reference_backward": "samebits, reference backward (before)",
          "stock_kernels": "stock kernels (control)", "hf": "transformers (SDPA, bf16)"}


def bits(t) -> torch.Tensor:
    return torch.as_tensor(t, dtype=torch.float32).detach().cpu().view(torch.int32)


def rollouts(engine, prompts):
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, PARAMS)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0]
    return [done[str(i)].token_ids for i in range(len(prompts))], [done[str(i)].token_logprobs for i in range(len(prompts))]


def compare(policy, prompts, completions, reference, micro: int, seed: int, params=None) -> int:
    """Tokens whose trainer bits differ from the reference, the trainer batches shuffled into micro-batches."""
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    bad = 0
    for at in range(0, len(order), micro):
        take = order[at:at + micro]
        with torch.no_grad():
            got = policy.logprobs([prompts[i] for i in take], [completions[i] for i in take], params)
        bad += sum(int((bits(g) != bits(reference[i])).sum()) for g, i in zip(got, take))
    return bad


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def release() -> None:
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def measure(step, tokens: int, repeats: int) -> dict:
    """Seconds per step after one warm-up, µs per token, and the peak memory from the trainer's weights on."""
    release()
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    resident = torch.cuda.memory_allocated() if DEVICE == "cuda" else 0
    step()
    sync()
    t = time.perf_counter()
    for _ in range(repeats):
        step()
    sync()
    seconds = (time.perf_counter() - t) / repeats
    out = {"step_s": seconds, "us_per_token": 1e6 * seconds / tokens, "weights_gib": resident / 2**30}
    if DEVICE == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def trainer_step(policy, prompts, completions):
    def run():
        policy.zero_grad(set_to_none=True)
        loss = -sum(lp.sum() for lp in policy.logprobs(prompts, completions))
        loss.backward()
    return run


def hf_step(hf, prompts, completions):
    """Right-padded batch, attention mask, the completion tokens' logprobs, backward: the HF/TRL way."""
    seqs = [p + c[:-1] for p, c in zip(prompts, completions)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long, device=DEVICE)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1

    def run():
        hf.zero_grad(set_to_none=True)
        logits = hf(input_ids=ids, attention_mask=mask).logits.float()
        lp = torch.log_softmax(logits, -1)
        loss = 0
        for i, (p, c) in enumerate(zip(prompts, completions)):
            rows = lp[i, len(p) - 1:len(p) - 1 + len(c)]
            loss = loss - rows.gather(1, torch.tensor(c, device=DEVICE)[:, None]).sum()
        loss.backward()
    return run, len(seqs) * width


def hf_model(config: ModelConfig, source: LlamaModel):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                      intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
                      num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
                      head_dim=config.head_dim, max_position_embeddings=config.max_position_embeddings,
                      rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    with torch.device(DEVICE):
        model = hf_parameters_to(LlamaForCausalLM(cfg), source.dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(source.destination(name))  # the same weights
    return model.train()


def grads_of(policy) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in policy.model.named_parameters()}


def same_grads(a: dict, b: dict) -> bool:
    return all(torch.equal(a[n].view(torch.int16 if a[n].element_size() == 2 else torch.int32),
                           b[n].view(torch.int16 if b[n].element_size() == 2 else torch.int32)) for n in a)


def parity(args, config, dtype, report: dict):
    """Stage 1; returns the prompts and completions the trainer steps take."""
    model = random_model(config, get_ops("deterministic", DEVICE), dtype, seed=0)
    loaded = LoadedModel(model, NullTokenizer(), config, f"random-{args.shape}", Path("."))
    cfg = EngineConfig(model="random", mode="deterministic", device=DEVICE, dtype=str(dtype).split(".")[-1],
                       max_num_batched_tokens=8192, max_num_seqs=256, kv_cache_tokens=args.requests * 512 + 8192)
    engine = LLMEngine(cfg, loaded)
    rng = random.Random(0)
    prompts = [[rng.randrange(config.vocab_size) for _ in range(rng.randint(64, 384))] for _ in range(args.requests)]
    t = time.perf_counter()
    completions, reported = rollouts(engine, prompts)
    report["rollout_s"] = time.perf_counter() - t
    report["tokens_compared"] = sum(len(c) for c in completions)
    policy = Policy.from_model(model)
    for micro in args.micro_batches:
        report[f"raw_mismatched_tokens_micro{micro}"] = compare(policy, prompts, completions, reported, micro, micro)
    llm = SimpleNamespace(engine=engine, config=cfg)
    sub = slice(0, 32)
    engine_side = engine_logprobs(llm, prompts[sub], completions[sub], PARAMS)
    report["sampling_mismatched_tokens_32seqs"] = compare(policy, prompts[sub], completions[sub], engine_side, 5, 1,
                                                          PARAMS)
    del policy
    fast = Policy.from_model(model, mode="fast")
    report["stock_kernels_mismatched_tokens"] = compare(fast, prompts, completions, reported, 32, 0)
    print(json.dumps(report), flush=True)
    return prompts, completions


def build(config, dtype, mode: str = "deterministic", **policy_args) -> Policy:
    """A trainer alone on the device, with the engine's weights (random_model is seeded: the same tensors)."""
    return Policy(random_model(config, get_ops(mode, DEVICE), dtype, seed=0), mode, **policy_args)


def trainers(args, config, dtype, prompts, completions, report: dict) -> dict | None:
    """Stage 2 and samebits' part of stage 3; returns samebits' gradients on the host for the comparison."""
    mp, mc = prompts[:args.micro], completions[:args.micro]
    tokens = report["timed_step_tokens"] = sum(len(p) + len(c) - 1 for p, c in zip(mp, mc))
    names = [n for n in TRAINERS if not (args.quick and n == "samebits_reference_backward")]
    host_grads = None
    for name in names:
        kwargs = dict(TRAINERS[name])
        policy = build(config, dtype, kwargs.pop("mode", "deterministic"), **kwargs)
        report[name] = measure(trainer_step(policy, mp, mc), tokens, args.repeats)
        print(name, json.dumps(report[name]), flush=True)
        if name == "samebits":
            first = grads_of(policy)
            trainer_step(policy, mp, mc)()
            report["grads_bitwise_run_to_run"] = same_grads(first, grads_of(policy))
            trainer_step(policy, mp[::-1], mc[::-1])()
            report["grads_bitwise_packing_order"] = same_grads(first, grads_of(policy))
            host_grads = {n: g.cpu() for n, g in first.items()}
            del first
        del policy
        release()
    return host_grads


def in_our_names(config, hf, dtype) -> dict[str, torch.Tensor]:
    """An HF module's gradients on the host under our (fused) parameter names."""
    ours = LlamaModel(config, get_ops("fast", "cpu"), dtype)
    ours.load_weights((n, p.grad) for n, p in hf.named_parameters())
    return {n: p.detach() for n, p in ours.named_parameters()}


def summarize(ours: dict, reference: dict, report: dict, key: str) -> None:
    """Per tensor max |ours - reference| / max |reference|: the largest, the median and the worst tensor's name."""
    errors = {}
    for name, ref in reference.items():
        a, b = ours[name].to(DEVICE).float(), ref.to(DEVICE).float()
        errors[name] = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
    report[f"{key}_max"] = max(errors.values())
    report[f"{key}_median"] = sorted(errors.values())[len(errors) // 2]
    report[f"{key}_worst_tensor"] = max(errors, key=errors.get)


def transformers_step(args, config, dtype, prompts, completions, report: dict, host_grads) -> None:
    """Stage 2's transformers row and stage 3's comparisons: samebits' gradients against transformers' in the same
    dtype, and both against transformers' in fp32 from the same weights (where it fits: not at 8B)."""
    mp, mc = prompts[:args.micro], completions[:args.micro]
    source = random_model(config, get_ops("fast", DEVICE), dtype, seed=0)
    fp32_fits = DEVICE == "cuda" and 16 * sum(p.numel() for p in source.parameters()) < \
        torch.cuda.get_device_properties(DEVICE).total_memory // 2
    hf = hf_model(config, source)
    del source
    release()
    step, padded = hf_step(hf, mp, mc)
    report["hf"] = measure(step, report["timed_step_tokens"], args.repeats)
    report["hf"]["padded_tokens"] = padded
    print("hf", json.dumps(report["hf"]), flush=True)
    if host_grads is None:
        return
    hf_grads = in_our_names(config, hf, dtype)
    summarize(host_grads, hf_grads, report, "grad_rel_err_samebits_vs_hf")
    if args.quick or not fp32_fits:
        return
    hf.zero_grad(set_to_none=True)
    hf_parameters_to(hf, torch.float32)  # the same weights, exactly
    release()
    hf_step(hf, mp, mc)[0]()
    truth = in_our_names(config, hf, torch.float32)
    summarize(host_grads, truth, report, "grad_rel_err_samebits_vs_fp32")
    summarize(hf_grads, truth, report, "grad_rel_err_hf_vs_fp32")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--micro", type=int, default=16, help="sequences per timed trainer step")
    ap.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="parity in micro-batches of 32 only, 2 timed steps, no "
                                                          "reference-backward row")
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()
    args.micro_batches = (32,) if args.quick else (1, 7, 32)
    args.repeats = 2 if args.quick else 3
    global DEVICE
    DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"shape": args.shape, "requests": args.requests, "quick": args.quick}
    config = ModelConfig(**SHAPES[args.shape])
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    with deterministic_runtime():
        prompts, completions = parity(args, config, dtype, report)
        release()
        host_grads = trainers(args, config, dtype, prompts, completions, report)
    if not args.skip_hf:
        transformers_step(args, config, dtype, prompts, completions, report, host_grads)
    write_json(report, args.out / "rl.json")
    print(json.dumps(report, indent=2))
    print_table(report)
    plot(report, args.out / "rl.png")


def _ratio(report: dict, key: str, field: str) -> str:
    if "hf" not in report or field not in report[key] or field not in report["hf"]:
        return "-"
    return f"{report[key][field] / report['hf'][field]:.2f}x"


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"RL trainer, {report['shape']} shape: parity over {report['tokens_compared']} rollout tokens, one "
                    f"step of {report['timed_step_tokens']} tokens")
    for c in ("trainer", "tokens differing", "µs/token fwd+bwd", "vs transformers", "peak GiB", "vs transformers"):
        t.add_column(c)
    micro = "/".join(str(v) for k, v in report.items() if k.startswith("raw_mismatched_tokens_micro"))
    bad = {"samebits": micro, "stock_kernels": str(report["stock_kernels_mismatched_tokens"])}
    for key in (*TRAINERS, "hf"):
        if key not in report:
            continue
        row = report[key]
        peak = f"{row['peak_gib']:.1f}" if "peak_gib" in row else "-"
        t.add_row(LABELS[key], bad.get(key, "-"), f"{row['us_per_token']:.1f}", _ratio(report, key, "us_per_token"),
                  peak, _ratio(report, key, "peak_gib"))
    Console().print(t)
    grads = {k: v for k, v in report.items() if k.startswith("grad")}
    Console().print(f"gradients: {grads}")


def plot(report: dict, path: Path) -> None:
    names = [k for k in (*TRAINERS, "hf") if k in report]
    with figure(path, 1, 2, figsize=(11, 3.2), sharey=True) as (fig, (left, right)):
        left.barh([LABELS[k] for k in names], [report[k]["us_per_token"] for k in names])
        left.set_xlabel("forward + backward, µs per token")
        if all("peak_gib" in report[k] for k in names):
            right.barh([LABELS[k] for k in names], [report[k]["peak_gib"] for k in names])
        right.set_xlabel("peak memory, GiB")
        fig.suptitle(f"{report['shape']}: samebits tokens differing from the rollout "
                     f"{report.get('raw_mismatched_tokens_micro32')}, "
                     f"stock {report['stock_kernels_mismatched_tokens']}")


# samebits: intentionally nondeterministic because a benchmark times stock torch and fast mode beside deterministic
# mode, and each mode enters its own runtime (runtime/template.py) where it runs.
if __name__ == "__main__":
    main()
