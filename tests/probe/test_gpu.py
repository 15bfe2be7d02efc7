"""On a CUDA machine: every probe runs, and every samebits cell it measures is invariant."""
import dataclasses

import pytest
import torch

from samebits.probe.probes import run_probes
from samebits.probe.tiny_llama import LlamaShape
from tests.probe.test_probes import TINY

pytestmark = pytest.mark.gpu

# head_dim 64: the GPU attention kernel has fixed tiles for 64 and 128 only.
GPU_SMALL = dataclasses.replace(TINY, matmul_k=256, matmul_n=128, attn_dim=64, attn_ctx=300,
                                model=LlamaShape(vocab=256, hidden=128, intermediate=256, layers=2, heads=2, kv_heads=1))


@pytest.fixture(scope="module")
def results():
    return [r.as_dict() for r in run_probes(torch.device("cuda"), GPU_SMALL)]


def test_no_cell_crashes_on_cuda(results):
    assert [(r["name"], r["implementation"], r["note"]) for r in results if r["verdict"] == "error"] == []


def test_samebits_cells_are_invariant_on_cuda(results):
    measured = [r for r in results if r["implementation"] == "samebits" and r["sizes"]]
    assert measured, "no samebits cell was measured"
    assert [(r["name"], r["dtype"], r["mismatch_fraction"]) for r in measured if r["verdict"] != "invariant"] == []


def test_splitk_demo_is_measured_on_cuda(results):
    (demo,) = [r for r in results if r["name"] == "run_to_run_splitk_atomic" and r["implementation"] == "vendor"]
    assert demo["sizes"] == [GPU_SMALL.runs] and "atomic_add" in demo["note"]
