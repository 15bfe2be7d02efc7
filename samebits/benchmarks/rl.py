"""Issue 15 on the GPU: a 1B-shaped random bf16 Llama; the rollout logprobs of 256 sampled requests against the
trainer's (raw and sampling distribution, shuffled micro-batches), and the trainer's forward+backward time per token
against transformers' LlamaForCausalLM doing the same step.

    python -m samebits.benchmarks.rl --out OUT [--requests 256]
    python -m samebits.benchmarks.rl --out OUT --device cpu --shape tiny --requests 8 --skip-hf   (a smoke run)
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.sampling_params import SamplingParams
from samebits.kernels import get_ops
from samebits.models.config import ModelConfig
from samebits.models.loader import LoadedModel
from samebits.models.testing import random_model
from samebits.rl.policy import Policy
from samebits.rl.rollout import engine_logprobs
from samebits.runtime import deterministic_runtime

SHAPE_1B = {"architecture": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
            "num_layers": 16, "num_heads": 32, "num_kv_heads": 8, "head_dim": 64, "max_position_embeddings": 8192,
            "rope_theta": 500000.0}
SHAPES = {"1b": SHAPE_1B, "tiny": {**SHAPE_1B, "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
                                   "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}}
DEVICE = "cuda"
PARAMS = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=128, logprobs=0, ignore_eos=True)


class NullTokenizer:
    eos_token_ids: frozenset[int] = frozenset()

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""


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


def empty_cache() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def time_step(fn, repeats: int = 3) -> float:
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - t) / repeats


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
    return run


def hf_model(shape, policy):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                      intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_layers"],
                      num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
                      max_position_embeddings=shape["max_position_embeddings"], rope_theta=shape["rope_theta"],
                      tie_word_embeddings=False)
    with torch.device(DEVICE):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(policy.model.destination(name))  # the same weights
    return model.train()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--micro", type=int, default=16, help="sequences per timed trainer step")
    ap.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"shape": args.shape, "requests": args.requests}
    shape = SHAPES[args.shape]
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    with deterministic_runtime():
        config = ModelConfig(**shape)
        model = random_model(config, get_ops("deterministic", DEVICE), dtype, seed=0)
        loaded = LoadedModel(model, NullTokenizer(), config, f"random-{args.shape}", Path("."))
        cfg = EngineConfig(model="random", mode="deterministic", device=DEVICE, dtype=str(dtype).split(".")[-1],
                           max_num_batched_tokens=8192, max_num_seqs=256, kv_cache_tokens=262144)
        engine = LLMEngine(cfg, loaded)
        rng = random.Random(0)
        prompts = [[rng.randrange(shape["vocab_size"]) for _ in range(rng.randint(64, 384))]
                   for _ in range(args.requests)]
        t = time.perf_counter()
        completions, reported = rollouts(engine, prompts)
        report["rollout_s"] = time.perf_counter() - t
        report["rollout_tokens"] = sum(len(c) for c in completions)
        policy = Policy.from_model(model)
        for micro in (1, 7, 32):
            report[f"raw_mismatched_tokens_micro{micro}"] = compare(policy, prompts, completions, reported, micro, micro)
        llm = SimpleNamespace(engine=engine, config=cfg)
        sub = slice(0, 32)
        engine_side = engine_logprobs(llm, prompts[sub], completions[sub], PARAMS)
        report["sampling_mismatched_tokens_32seqs"] = compare(policy, prompts[sub], completions[sub], engine_side, 5, 1,
                                                              PARAMS)
        fast = Policy.from_model(model, mode="fast")
        report["stock_kernels_mismatched_tokens"] = compare(fast, prompts, completions, reported, 32, 0)
        report["tokens_compared"] = report["rollout_tokens"]
        print(json.dumps(report), flush=True)
        (args.out / "rl.json").write_text(json.dumps(report, indent=2))
        del engine, llm
        empty_cache()
        mp, mc = prompts[:args.micro], completions[:args.micro]
        tokens = sum(len(p) + len(c) - 1 for p, c in zip(mp, mc))
        report["timed_step_tokens"] = tokens
        report["samebits_step_s"] = time_step(trainer_step(policy, mp, mc))
        report["stock_kernels_step_s"] = time_step(trainer_step(fast, mp, mc))
        del fast
        empty_cache()
    if not args.skip_hf:
        hf = hf_model(shape, policy)
        del policy
        empty_cache()
        report["hf_step_s"] = time_step(hf_step(hf, mp, mc))
    for k in ("samebits", "stock_kernels", "hf"):
        if f"{k}_step_s" in report:
            report[f"{k}_us_per_token"] = 1e6 * report[f"{k}_step_s"] / tokens
    if DEVICE == "cuda":
        report["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    (args.out / "rl.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print_table(report)
    plot(report, args.out / "rl.png")


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"trainer vs rollout, {report['shape']} shape, {report['tokens_compared']} tokens")
    for c in ("trainer", "tokens differing", "µs/token fwd+bwd"):
        t.add_column(c)
    micro = ", ".join(str(report[f"raw_mismatched_tokens_micro{m}"]) for m in (1, 7, 32))
    rows = (("samebits, micro 1/7/32", micro, "samebits"), ("stock kernels", str(report["stock_kernels_mismatched_tokens"]),
                                                             "stock_kernels"), ("transformers", "-", "hf"))
    for name, bad, key in rows:
        us = report.get(f"{key}_us_per_token")
        t.add_row(name, bad, "-" if us is None else f"{us:.1f}")
    Console().print(t)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in ("samebits", "stock_kernels", "hf") if f"{k}_us_per_token" in report]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(names, [report[f"{k}_us_per_token"] for k in names])
    ax.set_xlabel("trainer forward + backward, µs per token")
    ax.set_title(f"{report['shape']}: samebits {report['raw_mismatched_tokens_micro1']} tokens differ, stock "
                 f"{report['stock_kernels_mismatched_tokens']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# samebits: intentionally nondeterministic because a benchmark times stock torch and fast mode beside deterministic
# mode, and each mode enters its own runtime (runtime/template.py) where it runs.
if __name__ == "__main__":
    main()
