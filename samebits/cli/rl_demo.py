"""`samebits rl-demo`: GRPO on the CPU with a tiny random model, two trainers side by side.

Both runs start from the same weights, sample with the same samebits engine and seeds, and send their weights back to
their engine after every step. They differ only in the trainer's forward kernels: the samebits policy (the engine's
invariant kernels, so the importance ratio is exactly 1.0 and the KL exactly 0) and the same policy on stock torch
kernels (the negative control: ratio off 1, KL above 0, the monitor's alarm on every step). The toy verifiable
reward is the fraction of completion tokens that spell a lowercase word; it goes up in both runs.
"""
from __future__ import annotations

import json
import logging
import random
import tempfile
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from samebits.engine.sampling_params import SamplingParams

RUNS = (("samebits", "deterministic"), ("stock", "fast"))
PROMPT_LEN = (4, 12)


def word_reward(tokenizer):
    """reward(prompt, completion): the fraction of completion tokens whose text is a lowercase ASCII word."""
    def is_word(token_id: int) -> bool:
        text = tokenizer.decode([token_id], skip_special_tokens=False).strip()
        return bool(text) and text.isascii() and text.isalpha() and text.islower()

    cache: dict[int, bool] = {}

    def reward(prompt: list[int], completion: list[int]) -> float:
        return sum(cache.setdefault(t, is_word(t)) for t in completion) / len(completion)

    return reward


def run_demo(steps: int, prompts: int, group: int, max_tokens: int, lr: float, seed: int, console: Console) -> dict:
    from samebits.engine.llm import LLM
    from samebits.models.synthetic import write_tiny_checkpoint
    from samebits.rl.grpo import GRPO
    from samebits.rl.monitor import ParityMonitor
    from samebits.rl.policy import Policy
    from samebits.runtime import deterministic_runtime

    logging.getLogger("samebits.rl").setLevel(logging.ERROR)  # the ALARM column says it once per step
    params = SamplingParams(temperature=1.0, n=group, max_tokens=max_tokens, seed=seed, logprobs=0, ignore_eos=True)
    with tempfile.TemporaryDirectory() as tmp, deterministic_runtime():
        ckpt = str(write_tiny_checkpoint(Path(tmp) / "tiny", "llama3", seed=seed))
        runs = {}
        for name, mode in RUNS:
            llm = LLM(model=ckpt, device="cpu", kv_cache_tokens=8192, seed=seed)
            runs[name] = GRPO(llm, Policy.from_pretrained(ckpt, device="cpu", mode=mode), word_reward(llm.tokenizer),
                              params, lr, ParityMonitor(name=name))
        rng = random.Random(seed)
        vocab = runs["samebits"].policy.config.vocab_size
        batch = [[rng.randrange(3, vocab) for _ in range(rng.randint(*PROMPT_LEN))] for _ in range(prompts)]
        records = {name: [] for name in runs}
        console.print(HEADER)
        for step in range(steps):
            for name, run in runs.items():
                records[name].append(run.step(step, batch))
            console.print(_line(step, [records[name][-1] for name in runs]), highlight=False)
    console.print(_summary(runs, records), highlight=False)
    return {name: [asdict(r) for r in recs] for name, recs in records.items()}


# 80 columns: the importance ratio as its largest distance from 1 (0: exactly on-policy), as the plot shows it.
HEADER = ("step | trainer   reward  bits equal     KL k3  max |ratio - 1|  alarm\n"
          "-----+----------------------------------------------------------------")


def _line(step: int, recs) -> str:
    parts = []
    for (name, _), r in zip(RUNS, recs):
        p = r.parity
        alarm = "ALARM" if r.alarm else "-"
        off = max(abs(p.ratio_max - 1), abs(p.ratio_min - 1))
        parts.append(f"{step + 1:4d} | {name:9s} {r.reward:6.3f}  {p.bitwise_equal:10.4f}  {p.kl_k3:8.2e}  "
                     f"{off:15.2e}  {alarm}")
    return "\n".join(parts)


def _summary(runs, records) -> str:
    lines = []
    for name, recs in records.items():
        first, last = recs[0].reward, recs[-1].reward
        lines.append(f"{name}: reward {first:.3f} -> {last:.3f}, alarms on {runs[name].monitor.alarms} of "
                     f"{len(recs)} steps, worst KL k3 {max(r.parity.kl_k3 for r in recs):.2e}")
    return "\n".join(lines)


def write_plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for (name, recs), style in zip(result.items(), ({"marker": "o"}, {"marker": "x", "linestyle": "--"})):
        steps = [r["step"] + 1 for r in recs]
        top.plot(steps, [r["reward"] for r in recs], label=f"{name} trainer", **style)
        bottom.plot(steps, [max(abs(r["parity"]["ratio_max"] - 1), abs(r["parity"]["ratio_min"] - 1)) for r in recs],
                    marker="o", label=f"{name}: max |ratio - 1|")
        bottom.plot(steps, [r["parity"]["kl_k3"] for r in recs], linestyle="--", label=f"{name}: KL k3")
    top.set_ylabel("mean reward")
    top.set_title("GRPO on the tiny model: reward per step\n(both runs sample the same tokens, so the curves coincide)",
                  fontsize=10)
    bottom.set_yscale("symlog", linthresh=1e-16)  # KL k3 of the stock trainer is ~1e-14; ours exactly 0
    bottom.set_xlabel("step")
    bottom.set_ylabel("trainer vs rollout (0 = on-policy)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def rl_demo_command(steps: int, prompts: int, group: int, max_tokens: int, lr: float, seed: int,
                    plot_path: Path | None, json_path: Path | None, fail) -> None:
    for name, value in (("steps", steps), ("prompts", prompts), ("group", group), ("max-tokens", max_tokens)):
        if value < 1 or (name == "group" and value < 2):
            fail(f"--{name} must be >= {2 if name == 'group' else 1}, got {value}")
    if not lr > 0:
        fail(f"--lr must be > 0, got {lr}")
    console = Console(soft_wrap=True)
    result = run_demo(steps, prompts, group, max_tokens, lr, seed, console)
    if plot_path is not None:
        write_plot(result, plot_path)
        console.print(f"wrote {plot_path}")
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {json_path}")
