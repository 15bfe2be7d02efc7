"""`ParityMonitor`: how far the trainer's logprobs are from the rollout's, per batch, with an alarm.

For a rollout batch sampled by the engine (the behaviour policy q) and rescored by the trainer (p), per token
log r = logp_trainer - logp_rollout, r the importance ratio. The KL(q || p) estimates are Schulman's
("Approximating KL Divergence", 2020) over samples from q: k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r.
On-policy means r == 1 exactly: every token bitwise equal, every estimate 0, every ratio 1.0.

Inputs are any engine's: tensors or (nested) lists of floats, flattened in order. Everything is computed in float64
on the host from the float32 values, a few vector ops per batch, cheap enough for every step.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

log = logging.getLogger("samebits.rl")


@dataclass(frozen=True)
class ParityStats:
    tokens: int
    bitwise_equal: float  # fraction of tokens whose float32 logprob bits are equal
    max_abs_diff: float
    kl_k1: float
    kl_k2: float
    kl_k3: float
    ratio_min: float
    ratio_mean: float
    ratio_max: float

    def as_dict(self) -> dict:
        return asdict(self)


def _flat(values) -> torch.Tensor:
    """float32 [N] from a tensor, a list of tensors, or (nested) lists of floats."""
    if isinstance(values, torch.Tensor):
        return values.detach().float().reshape(-1).cpu()
    if isinstance(values, (list, tuple)) and values and not isinstance(values[0], (int, float)):
        parts = [_flat(v) for v in values]
        return torch.cat(parts) if parts else torch.empty(0)
    return torch.tensor(list(values), dtype=torch.float32)


def parity_stats(rollout, trainer) -> ParityStats:
    """The comparison of one batch; both inputs hold the same tokens in the same order."""
    q, p = _flat(rollout), _flat(trainer)
    if q.shape != p.shape:
        raise ValueError(f"rollout has {q.numel()} logprobs, trainer {p.numel()}: they must be the same tokens")
    if q.numel() == 0:
        raise ValueError("no logprobs to compare")
    equal = q.view(torch.int32) == p.view(torch.int32)
    same = torch.where(equal, torch.zeros_like(q, dtype=torch.float64), p.double() - q.double())  # -inf == -inf
    ratio = same.exp()
    return ParityStats(
        tokens=q.numel(), bitwise_equal=float(equal.double().mean()), max_abs_diff=float(same.abs().max()),
        kl_k1=float((-same).mean()), kl_k2=float((same * same / 2).mean()), kl_k3=float((ratio - 1 - same).mean()),
        ratio_min=float(ratio.min()), ratio_mean=float(ratio.mean()), ratio_max=float(ratio.max()))


class ParityMonitor:
    """`observe(rollout, trainer)` per batch: the stats, logged, set on the gauges, and an alarm when the chosen
    statistic passes `threshold` (default: any k3 KL at all, i.e. not exactly on-policy) or is NaN."""

    def __init__(self, threshold: float = 0.0, statistic: str = "kl_k3",
                 on_alarm: Callable[[ParityStats], None] | None = None, gauges=None, name: str = "policy"):
        if statistic not in ParityStats.__dataclass_fields__ or statistic == "tokens":
            raise ValueError(f"statistic must be one of {sorted(set(ParityStats.__dataclass_fields__) - {'tokens'})}, "
                             f"got {statistic!r}")
        if not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
            raise ValueError(f"threshold must be a finite number, got {threshold!r}")
        self.threshold, self.statistic, self.on_alarm = float(threshold), statistic, on_alarm
        self.gauges, self.name = gauges, name
        self.history: list[ParityStats] = []
        self.alarms = 0

    def observe(self, rollout, trainer) -> ParityStats:
        stats = parity_stats(rollout, trainer)
        self.history.append(stats)
        value = getattr(stats, self.statistic)
        alarm = math.isnan(value) or value > self.threshold
        if self.gauges is not None:
            self.gauges.set(self.name, stats, alarm)
        log.debug("parity %s: %s", self.name, stats)
        if alarm:
            self.alarms += 1
            log.warning("parity alarm (%s): %s = %.3g > %.3g; bitwise equal %.4f, max |delta| %.3g, ratio [%.6f, %.6f]",
                        self.name, self.statistic, value, self.threshold, stats.bitwise_equal, stats.max_abs_diff,
                        stats.ratio_min, stats.ratio_max)
            if self.on_alarm is not None:
                self.on_alarm(stats)
        return stats
