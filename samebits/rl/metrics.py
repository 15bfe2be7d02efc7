"""Prometheus gauges of the ParityMonitor, made as the server makes its series (server/metrics.py): vLLM-style
`samebits:` names, a registry of one's own unless a shared one is given, one label naming the monitored policy.

Serve them from any registry: `prometheus_client.generate_latest(gauges.registry)`.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from samebits.rl.monitor import ParityStats

NAME_PREFIX = "samebits:rl_"
POLICY_LABEL = "policy"
# (ParityStats field, metric suffix, help)
GAUGES = (
    ("bitwise_equal", "logprob_bitwise_equal_fraction",
     "Fraction of rollout tokens whose trainer logprob bits equal the rollout's."),
    ("max_abs_diff", "logprob_max_abs_diff", "Largest |trainer - rollout| logprob of the last batch."),
    ("kl_k1", "kl_k1", "Mean k1 estimate of KL(rollout || trainer) over the last batch."),
    ("kl_k2", "kl_k2", "Mean k2 estimate of KL(rollout || trainer) over the last batch."),
    ("kl_k3", "kl_k3", "Mean k3 estimate of KL(rollout || trainer) over the last batch."),
    ("ratio_min", "importance_ratio_min", "Smallest trainer/rollout probability ratio of the last batch."),
    ("ratio_mean", "importance_ratio_mean", "Mean trainer/rollout probability ratio of the last batch."),
    ("ratio_max", "importance_ratio_max", "Largest trainer/rollout probability ratio of the last batch."),
)


class ParityGauges:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self._gauges = {field: Gauge(NAME_PREFIX + suffix, doc, [POLICY_LABEL], registry=self.registry)
                        for field, suffix, doc in GAUGES}
        self._alarm = Gauge(NAME_PREFIX + "parity_alarm", "1 while the last batch passed the alarm threshold.",
                            [POLICY_LABEL], registry=self.registry)
        self._alarms = Counter(NAME_PREFIX + "parity_alarms", "Batches that passed the alarm threshold.",
                               [POLICY_LABEL], registry=self.registry)

    def set(self, policy: str, stats: ParityStats, alarm: bool) -> None:
        for field, gauge in self._gauges.items():
            gauge.labels(policy).set(getattr(stats, field))
        self._alarm.labels(policy).set(float(alarm))
        if alarm:
            self._alarms.labels(policy).inc()
