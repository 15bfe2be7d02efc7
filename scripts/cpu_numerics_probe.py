"""Which CPU numerics agree between machines: hashes of the CPU route's canonical GEMM block and of torch's elementwise
transcendental functions on fixed data, under the MKL settings in this process's environment. Compare the printed
JSON line between machines (and settings: run it under MKL_CBWR / MKL_ENABLE_INSTRUCTIONS variants).

Usage: python scripts/cpu_numerics_probe.py
"""
import hashlib
import json
import os

import torch
import torch.nn.functional as F

from samebits.kernels.cpu.gemm import known_answer
from samebits.runtime import mkl


def h(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:12]


x = torch.arange(16 * 4096, dtype=torch.float32).view(16, 4096).sin() * 8  # same inputs everywhere (sin: float32)
xd = torch.arange(1 << 16, dtype=torch.float64) / 7.0
report = {
    "env": {k: os.environ[k] for k in ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS") if k in os.environ},
    "mkl_cnr": mkl.cnr_mode(), "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    "inputs": h(x), "gemm": known_answer(),
    "exp": h(torch.exp(x)), "log": h(torch.log(x.abs() + 1)), "sqrt": h(torch.sqrt(x.abs())),
    "rsqrt": h(torch.rsqrt(x.abs() + 1)), "silu": h(F.silu(x)), "div": h(x / (x.abs() + 3)),
    "exp64": h(torch.exp(-xd)), "log64": h(torch.log(xd + 1)), "cos64": h(torch.cos(xd)),
}
print(json.dumps(report))
