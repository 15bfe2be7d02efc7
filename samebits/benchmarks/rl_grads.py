"""Where samebits' bf16 gradient error comes from: one op's backward at a time swapped for its fp32 torch form.

One random bf16 Llama of the shape (random_model's weights, as benchmarks/rl.py), one micro-batch (prompts 64-384
tokens, completions of 128, random tokens; the completion tokens' logprobs summed): the truth is transformers'
autograd in fp32 from the same weights. Rows, each against the truth (per tensor max |difference| / max |truth|, the
largest and the median over tensors), plus the forward's error (the completion tokens' logprobs, max and mean
|difference|):

- transformers in bf16 (SDPA), the bar;
- samebits `Policy`, fused backward (the device's kernels, kernels/grads.py's table);
- the same with one backward op (attention, RMSNorm, SiLU·mul, the linears) replaced by its torch form
  (kernels/grads.py: fp32 math, one rounding), then all of them; the row whose error falls is where the excess is;
- the reference backward (rl/train_ops.py: autograd through rl/reference.py's torch ops);
- the fused policy built as benchmarks/rl.py builds it (random_model on deterministic ops, not copied from the
  transformers module): equal to the fused row unless that benchmark's two models differ;
- the fused backward in fp32 (the device's kernels on fp32 weights): ~1e-5 unless a kernel's math is off at the shape;
- transformers cast by `Module.to(bf16)`, which rounds RoPE's inv_freq buffer (models/synthetic.py hf_parameters_to).
Then the same rows against the reference benchmarks/rl.py used to build (`Module.to(bf16).float()`: fp32 weights, RoPE
frequencies rounded to bf16), which put samebits at ~3x transformers' bf16 error: against it samebits is off by the
model's difference, transformers' `.to(bf16)` model is not.

    python -m samebits.benchmarks.rl_grads --out OUT                           (1B shape, ~3 min on an H200)
    python -m samebits.benchmarks.rl_grads --out OUT --device cpu --shape tiny --sequences 3   (a smoke run)
    python -m samebits.benchmarks.rl_grads --out OUT --device cpu --shape 1b --layers 4 --vocab 2048 --sequences 2
                                                                            (the 1B width on the CPU, ~10 min)
"""
from __future__ import annotations

import argparse
import copy
import json
import random
from pathlib import Path
from types import SimpleNamespace

import torch

from samebits.bench.shapes import SHAPES
from samebits.benchmarks import rl as bench
from samebits.kernels import get_ops
from samebits.kernels import grads as torch_forms
from samebits.kernels.grads import GRADS, get_grads
from samebits.models.config import ModelConfig
from samebits.models.synthetic import hf_parameters_to, random_model
from samebits.rl.policy import Policy
from samebits.runtime import deterministic_runtime

LINEAR = ("linear_dx", "linear_dw", "bias_grad")
# row name -> the backward ops taken from kernels/grads.py's torch forms instead of the device's kernels.
SWAPS = {"fused": (), "torch_attention_bwd": ("attention_bwd",), "torch_rms_norm_bwd": ("rms_norm_bwd",),
         "torch_silu_and_mul_bwd": ("silu_and_mul_bwd",), "torch_linear": LINEAR, "torch_all": GRADS}


def batch(config: ModelConfig, sequences: int, seed: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(config.vocab_size) for _ in range(rng.randint(64, 384))] for _ in range(sequences)]
    return prompts, [[rng.randrange(config.vocab_size) for _ in range(128)] for _ in range(sequences)]


def hf_logprobs(hf, prompts, completions) -> torch.Tensor:
    """The completion tokens' logprobs through transformers, one sequence at a time (no padding), concatenated."""
    out = []
    for p, c in zip(prompts, completions):
        logits = hf(input_ids=torch.tensor([p + c[:-1]], device=bench.DEVICE)).logits[0, len(p) - 1:].float()
        out.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(c, device=bench.DEVICE)[:, None])[:, 0])
    return torch.cat(out)


def hf_row(config, hf, prompts, completions, dtype):
    hf.zero_grad(set_to_none=True)
    lp = hf_logprobs(hf, prompts, completions)
    (-lp.sum()).backward()
    return lp.detach().cpu(), bench.in_our_names(config, hf, dtype)


def policy_row(hf, prompts, completions, swap=(), policy=None, **policy_args):
    policy = policy or Policy.from_hf(hf, **policy_args)
    if policy.ops.fused:
        device = get_grads(bench.DEVICE)
        policy.ops.grads = SimpleNamespace(**{g: getattr(torch_forms if g in swap else device, g) for g in GRADS})
    with deterministic_runtime():
        lp = torch.cat(policy.logprobs(prompts, completions))
        (-lp.sum()).backward()
    return lp.detach().cpu(), {n: p.grad.detach().cpu() for n, p in policy.model.named_parameters()}


def errors(lp, grads, truth_lp, truth) -> dict:
    per = {n: float((grads[n].float() - t).abs().max() / t.abs().max().clamp_min(1e-30)) for n, t in truth.items()}
    ranked = sorted(per.values())
    diff = (lp.float() - truth_lp).abs()
    return {"grad_max": ranked[-1], "grad_median": ranked[len(ranked) // 2], "worst": max(per, key=per.get),
            "logprob_max": float(diff.max()), "logprob_mean": float(diff.mean()), "per_tensor": per}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, help="the shape with this many layers (a CPU run at a real width)")
    ap.add_argument("--vocab", type=int, help="the shape with this vocabulary size")
    args = ap.parse_args()
    bench.DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    overrides = {"num_layers": args.layers, "vocab_size": args.vocab}
    config = ModelConfig(**{**SHAPES[args.shape], **{k: v for k, v in overrides.items() if v is not None}})
    prompts, completions = batch(config, args.sequences, args.seed)
    hf = bench.hf_model(config, random_model(config, get_ops("fast", args.device), torch.bfloat16, seed=args.seed))
    bench.release()
    rows = {"hf_bf16": hf_row(config, hf, prompts, completions, torch.bfloat16)}
    for name, swap in SWAPS.items():
        rows[name] = policy_row(hf, prompts, completions, swap)
        bench.release()
    rows["reference_backward"] = policy_row(hf, prompts, completions, backward="reference")
    built = Policy(random_model(config, get_ops("deterministic", args.device), torch.bfloat16, seed=args.seed))
    rows["fused_as_rl_benchmark_builds_it"] = policy_row(hf, prompts, completions, policy=built)
    del built
    rounded = copy.deepcopy(hf).to(torch.bfloat16)  # Module.to: RoPE's inv_freq rounded to bf16 (hf_parameters_to)
    rows["hf_bf16_module_to"] = hf_row(config, rounded, prompts, completions, torch.bfloat16)
    hf.zero_grad(set_to_none=True)
    hf_parameters_to(hf, torch.float32)  # the same weights, exactly
    rows["fused_fp32"] = policy_row(hf, prompts, completions)
    report = {"shape": args.shape, **overrides, "sequences": args.sequences, "seed": args.seed,
              "tokens": sum(len(p) + len(c) - 1 for p, c in zip(prompts, completions))}
    report["vs_fp32"] = table(rows, *hf_row(config, hf, prompts, completions, torch.float32))
    del hf
    bench.release()
    # The reference benchmarks/rl.py compared against before: fp32 with bf16-rounded RoPE frequencies.
    print("against transformers fp32 with RoPE frequencies rounded to bf16 (Module.to(bf16).float()):")
    report["vs_fp32_rounded_rope"] = table({n: rows[n] for n in ("hf_bf16_module_to", "fused", "fused_fp32")},
                                           *hf_row(config, rounded.float(), prompts, completions, torch.float32))
    (args.out / "rl_grads.json").write_text(json.dumps(report, indent=1))


def table(rows: dict, truth_lp, truth) -> dict:
    truth = {n: t.float() for n, t in truth.items()}
    out = {}
    for name, (lp, grads) in rows.items():
        r = out[name] = errors(lp, grads, truth_lp, truth)
        print(f"{name:32s} grad max {r['grad_max']:.4f} median {r['grad_median']:.4f} worst {r['worst']:28s} "
              f"logprob max {r['logprob_max']:.2e} mean {r['logprob_mean']:.2e}", flush=True)
    return out


# samebits: intentionally nondeterministic because the comparison runs transformers' stock autograd beside samebits,
# whose trainer rows each run inside deterministic_runtime() (policy_row).
if __name__ == "__main__":
    main()
