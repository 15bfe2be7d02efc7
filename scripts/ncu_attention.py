"""The paged attention kernel at one benchmark shape, launched three times, for Nsight Compute to profile.

    ncu --clock-control none -k regex:_paged_attention_kernel -s 2 -c 1 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats \
        python scripts/ncu_attention.py prefill 1 8192      # or: decode 256 512

The shapes and data are samebits/benchmarks/attention.py's (docs/results/ncu_attention_*.h200.tma.txt).
"""
from __future__ import annotations

import sys

import torch

from samebits.benchmarks.attention import D, _paged
from samebits.kernels.triton import attention as at


def main() -> None:
    kind, batch, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    assert kind in ("decode", "prefill"), f"kind: decode or prefill, not {kind!r}"
    gen = torch.Generator().manual_seed(1)
    q, _, _, k_cache, v_cache, meta = _paged(batch, ctx, ctx if kind == "prefill" else 1, gen)
    for _ in range(3):
        at.paged_attention(q, k_cache, v_cache, meta, D ** -0.5)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
