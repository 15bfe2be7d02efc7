"""ModelRunner: the cuBLASLt self-tests run at load (before the KV pool is sized), only in deterministic CUDA runs."""
import pytest
import torch

from samebits.kernels import vendor_gemm as vg


def _runner(device, deterministic):
    from types import SimpleNamespace

    from samebits.engine.model_runner import ModelRunner

    model = torch.nn.Module()
    model.w2, model.b1 = torch.nn.Parameter(torch.zeros(128, 64)), torch.nn.Parameter(torch.zeros(128))
    model.ops = SimpleNamespace(deterministic=deterministic)
    runner = ModelRunner.__new__(ModelRunner)
    runner.model, runner.device = model, torch.device(device)
    return runner


@pytest.mark.parametrize("device,deterministic,proved", [("cuda", True, True), ("cuda", False, False),
                                                         ("cpu", True, False)])
def test_engine_proves_weight_shapes_only_in_deterministic_cuda_runs(monkeypatch, device, deterministic, proved):
    seen = []
    monkeypatch.setattr(vg, "prove_weights", lambda ws: seen.extend(w.shape for w in ws))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    _runner(device, deterministic).prove_vendor_gemm()
    assert seen == ([torch.Size([128, 64])] if proved else [])
