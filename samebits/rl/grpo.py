"""A minimal GRPO loop (Shao et al. 2024, DeepSeekMath): a group of samples per prompt, rewards normalised within
the group, the clipped importance-ratio objective against the rollout's own logprobs, one optimiser step per batch.

The ratio is trainer / rollout probability of each sampled token: with the samebits trainer it is exactly 1.0 on
the first (only) step over a batch, so the objective is the on-policy policy gradient it claims to be.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from samebits.engine.sampling_params import SamplingParams
from samebits.rl.monitor import ParityMonitor, ParityStats
from samebits.rl.rollout import completions_of, engine_logprobs

CLIP = 0.2  # PPO's epsilon: ratios outside [0.8, 1.2] stop pulling
STD_FLOOR = 1e-6  # a group whose rewards are all equal has no signal, not an infinite one


def group_advantages(rewards: list[float], group: int) -> list[float]:
    """(r - mean) / std within each consecutive group of `group` rewards."""
    r = torch.tensor(rewards, dtype=torch.float64).view(-1, group)
    adv = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, unbiased=False, keepdim=True) + STD_FLOOR)
    return adv.view(-1).tolist()


def clipped_loss(logprobs: list[torch.Tensor], rollout_logprobs: list[list[float]],
                 advantages: list[float]) -> torch.Tensor:
    """-mean over every sampled token of min(ratio * A, clip(ratio) * A), ratio = exp(logp - logp_rollout)."""
    terms = []
    for lp, old, adv in zip(logprobs, rollout_logprobs, advantages):
        ratio = torch.exp(lp - torch.tensor(old, dtype=lp.dtype, device=lp.device))
        terms.append(torch.minimum(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv))
    return -torch.cat(terms).mean()


@dataclass(frozen=True)
class StepRecord:
    step: int
    reward: float
    loss: float
    parity: ParityStats
    alarm: bool  # the monitor's verdict on this step's batch


class GRPO:
    """One run: the engine samples, the policy trains, the monitor compares, the new weights go back to the engine."""

    def __init__(self, llm, policy, reward: Callable[[list[int], list[int]], float], params: SamplingParams,
                 lr: float, monitor: ParityMonitor):
        self.llm, self.policy, self.reward, self.params, self.monitor = llm, policy, reward, params, monitor
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
        llm.update_weights(policy)  # the engine starts from the policy's weights

    def step(self, step: int, prompts: list[list[int]]) -> StepRecord:
        """`prompts` once each; the engine draws params.n samples of each (seeded per step, so runs repeat)."""
        params = replace(self.params, seed=self.params.seed + step)
        completions, rollout = completions_of(self.llm.generate(prompts, params, use_tqdm=False))
        group = params.n
        expanded = [p for p in prompts for _ in range(group)]
        if not _is_raw(params):  # generate reports the raw distribution's logprobs; the ratio needs the sampler's
            rollout = [lp.tolist() for lp in engine_logprobs(self.llm, expanded, completions, params)]
        rewards = [self.reward(p, c) for p, c in zip(expanded, completions)]
        logprobs = self.policy.logprobs(expanded, completions, params)
        alarms = self.monitor.alarms
        parity = self.monitor.observe(rollout, logprobs)
        loss = clipped_loss(logprobs, rollout, group_advantages(rewards, group))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.llm.update_weights(self.policy, version=f"{self.monitor.name}-step-{step + 1}")
        return StepRecord(step, sum(rewards) / len(rewards), float(loss.detach()), parity,
                          self.monitor.alarms > alarms)


def _is_raw(params: SamplingParams) -> bool:
    """Temperature 1 and no filter: the sampling distribution is the raw one, bit for bit (x / 1.0 is x)."""
    return params.temperature == 1.0 and params.top_k == -1 and params.top_p == 1.0 and params.min_p == 0.0
