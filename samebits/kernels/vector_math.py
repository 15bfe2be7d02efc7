"""The CPU's vendor elementwise functions, settled before any computation of the process.

ATen computes exp, log, rsqrt, sin and cos of CPU float tensors through MKL's vector math, which settles a
function's kernel at its first call in the process. When that first call is split across ATen's threads (a tensor of
more than one grain), the threads race to settle it: on an Intel Xeon, in 3 of 40 fresh processes, one thread's half
of the first `torch.exp` of a [2, 49152] tensor came out with other bits than every later call, and deterministic
mode's softmax of a row alone then differed from the same row inside a batch (tests/kernels/test_cpu_paths.py). A
first call on one element runs in one thread; after it, 0 of 60 fresh processes differed (docs/BENCHMARKS.md §7).
MKL keeps float32 and float64 as separate functions, so both are settled.

Settling computes, and MKL fixes its reproducible mode (`MKL_CBWR`) at its first computation, so it is called where
samebits computes anyway: after the template pins that mode (runtime/template.py), and at the first use of each CPU
code path that calls these functions (the deterministic backend's norms, softmax, silu and attention, the RoPE table).
"""
from __future__ import annotations

import functools

import torch

FUNCTIONS = (torch.exp, torch.log, torch.rsqrt, torch.sin, torch.cos)


@functools.cache
def settle() -> None:
    """Each function's first call of the process, on one element of each float dtype, in one thread."""
    for dtype in (torch.float32, torch.float64):
        one = torch.ones(1, dtype=dtype)
        for fn in FUNCTIONS:
            fn(one)
