"""ModelRunner: the proven routes' self-tests run at load, only in deterministic runs: cuBLASLt's on CUDA (before the KV
pool is sized), the CPU GEMM route's on the CPU (weight shapes and both attention tile shapes)."""
from types import SimpleNamespace

import pytest
import torch

from samebits.kernels import vendor_gemm as vg
from samebits.kernels.cpu import attention as cpu_attention
from samebits.kernels.cpu import gemm as cpu_gemm


def _runner(device, deterministic):
    from samebits.engine.model_runner import ModelRunner

    model = torch.nn.Module()
    model.w2, model.b1 = torch.nn.Parameter(torch.zeros(128, 64)), torch.nn.Parameter(torch.zeros(128))
    model.ops = SimpleNamespace(deterministic=deterministic)
    runner = ModelRunner.__new__(ModelRunner)
    runner.model, runner.device = model, torch.device(device)
    runner.model_config = SimpleNamespace(num_kv_heads=2, head_dim=64)
    return runner


@pytest.mark.parametrize("device,deterministic,route", [("cuda", True, "cublaslt"), ("cuda", False, None),
                                                        ("cpu", True, "cpu"), ("cpu", False, None)])
def test_engine_proves_weight_shapes_only_in_deterministic_runs(monkeypatch, device, deterministic, route):
    seen = {"cublaslt": [], "cpu": [], "attention": []}
    monkeypatch.setattr(vg, "prove_weights", lambda ws: seen["cublaslt"].extend(w.shape for w in ws))
    monkeypatch.setattr(cpu_gemm, "prove_weights", lambda ws: seen["cpu"].extend(w.shape for w in ws))
    monkeypatch.setattr(cpu_attention, "prove", lambda d: seen["attention"].append(d))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    _runner(device, deterministic).prove_routes()
    for name in ("cublaslt", "cpu"):
        assert seen[name] == ([torch.Size([128, 64])] if route == name else []), name
    assert seen["attention"] == ([64] if route == "cpu" else [])
