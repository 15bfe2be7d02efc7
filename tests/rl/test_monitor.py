"""ParityMonitor: exact numbers on known inputs; quiet on the samebits trainer, alarming on the stock-kernel one, with
the callback, the log line and the gauges."""
import logging
import math

import pytest
import torch

from samebits.rl.metrics import ParityGauges
from samebits.rl.monitor import ParityMonitor, parity_stats
from samebits.runtime import deterministic_runtime


def test_known_values():
    q = [math.log(0.5), math.log(0.5)]
    p = torch.tensor([math.log(0.25), math.log(0.5)])
    s = parity_stats([q], p)
    log_r = math.log(0.25) - math.log(0.5)  # float64 of the float32 inputs is within 1e-7 of these
    assert s.tokens == 2 and s.bitwise_equal == 0.5
    assert s.kl_k1 == pytest.approx(-log_r / 2, rel=1e-6)
    assert s.kl_k2 == pytest.approx(log_r ** 2 / 4, rel=1e-6)
    assert s.kl_k3 == pytest.approx((0.5 - 1 - log_r) / 2, rel=1e-6)
    assert (s.ratio_min, s.ratio_max) == (pytest.approx(0.5, rel=1e-6), 1.0)


def test_identical_bits_give_exact_zeros_even_at_minus_infinity():
    values = [[-1.5, float("-inf")], [-0.25]]
    s = parity_stats(values, [torch.tensor([-1.5, float("-inf")]), torch.tensor([-0.25])])
    assert (s.bitwise_equal, s.max_abs_diff, s.kl_k1, s.kl_k2, s.kl_k3) == (1.0, 0.0, 0.0, 0.0, 0.0)
    assert s.ratio_min == s.ratio_mean == s.ratio_max == 1.0


def _batch(policy, rollouts):
    prompts, completions, reported, _ = rollouts["sampled"]
    with deterministic_runtime():
        return reported, [lp.detach() for lp in policy.logprobs(prompts, completions)]


def test_quiet_on_samebits_trainer_alarm_on_stock_kernels(policy, fast_policy, rollouts, caplog):
    gauges, alarms = ParityGauges(), []
    ours = ParityMonitor(on_alarm=alarms.append, gauges=gauges, name="samebits")
    stock = ParityMonitor(on_alarm=alarms.append, gauges=gauges, name="stock")
    with caplog.at_level(logging.WARNING, logger="samebits.rl"):
        quiet = ours.observe(*_batch(policy, rollouts))
        assert not alarms and not caplog.records
        loud = stock.observe(*_batch(fast_policy, rollouts))
    assert quiet.kl_k3 == 0.0 and quiet.bitwise_equal == 1.0 and quiet.ratio_min == quiet.ratio_max == 1.0
    assert alarms == [loud] and stock.alarms == 1 and ours.alarms == 0
    assert loud.kl_k3 > 0 and loud.bitwise_equal < 1.0 and loud.ratio_min != loud.ratio_max
    assert "parity alarm (stock): kl_k3" in caplog.text

    def gauge(name, policy_name):
        return gauges.registry.get_sample_value(f"samebits:rl_{name}", {"policy": policy_name})

    assert gauge("kl_k3", "samebits") == 0.0 and gauge("parity_alarm", "samebits") == 0.0
    assert gauge("kl_k3", "stock") == loud.kl_k3 and gauge("parity_alarm", "stock") == 1.0
    assert gauge("parity_alarms_total", "stock") == 1.0
    assert gauge("logprob_bitwise_equal_fraction", "stock") == loud.bitwise_equal


def test_threshold_on_another_statistic():
    monitor = ParityMonitor(threshold=0.1, statistic="max_abs_diff")
    assert monitor.observe([-1.0], [-1.05]).max_abs_diff == pytest.approx(0.05, rel=1e-5)
    assert monitor.alarms == 0
    monitor.observe([-1.0], [-1.5])
    assert monitor.alarms == 1 and len(monitor.history) == 2


@pytest.mark.parametrize("kwargs, match", [
    ({"statistic": "tokens"}, "statistic must be one of"),
    ({"threshold": float("nan")}, "threshold must be a finite number"),
])
def test_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ParityMonitor(**kwargs)


def test_mismatched_batches_are_refused():
    with pytest.raises(ValueError, match="rollout has 2 logprobs, trainer 1"):
        parity_stats([-1.0, -2.0], [-1.0])
