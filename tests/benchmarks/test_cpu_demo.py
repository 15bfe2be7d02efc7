"""The CPU side-by-side benchmark's parts that decide its numbers: transformers runs our weights, ratios pair runs."""
import pytest
import torch

from samebits.bench.shapes import random_shape_model
from samebits.benchmarks.cpu_demo import _ratios, hf_model
from samebits.engine.weights import plan


def test_the_transformers_twin_holds_every_weight_of_ours():
    loaded = random_shape_model("tiny", "cpu")
    twin = hf_model(loaded)
    pairs = plan(loaded.model, dict(twin.state_dict()))  # raises on any name missing or extra
    assert pairs and all(torch.equal(ours, theirs) for ours, theirs in pairs)


def test_ratios_pair_neighbouring_runs():
    row = {"deterministic": [10.0, 30.0, 8.0], "fast": [20.0, 30.0, 10.0], "transformers": [5.0, 60.0, 16.0]}
    got = _ratios(row)
    assert got["deterministic_over_fast"] == pytest.approx(0.8)  # median of 0.5, 1.0, 0.8
    assert got["deterministic_over_transformers"] == pytest.approx(0.5)  # median of 2.0, 0.5, 0.5
    assert "deterministic_over_transformers" not in _ratios({"deterministic": [1.0], "fast": [1.0]})
