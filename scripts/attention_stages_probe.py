"""H200 probe: the paged attention kernel's pipeline depth and warps, per shape. Stages and warps change how loads
overlap, never a row's arithmetic; the probe checks that (every output bit equal to the committed launch) and times
each in a CUDA graph, to pick the depth per shape (small decode grids are latency-bound on their tile chain).

    python scripts/attention_stages_probe.py OUT_DIR
"""
from __future__ import annotations

import json
import os
import sys

import torch

from samebits.benchmarks.attention import D, _bench, _paged
from samebits.kernels.triton import attention as at

CASES = [("decode", 1, 512), ("decode", 1, 2048), ("decode", 1, 8192), ("decode", 8, 512), ("decode", 8, 2048),
         ("decode", 32, 2048), ("decode", 64, 512), ("decode", 256, 512), ("decode", 256, 2048),
         ("prefill", 1, 1024), ("prefill", 1, 4096)]
LAUNCHES = [(2, 4), (3, 4), (4, 4), (5, 4), (2, 2), (4, 2), (2, 8), (3, 8)]  # (num_stages, num_warps)


def main() -> None:
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    committed = (at.NUM_STAGES, at.NUM_WARPS)
    rows = []
    for kind, batch, ctx in CASES:
        q, _, _, k_cache, v_cache, meta = _paged(batch, ctx, 1 if kind == "decode" else ctx, gen)
        call = lambda: at.paged_attention(q, k_cache, v_cache, meta, D ** -0.5)  # noqa: E731
        at.NUM_STAGES, at.NUM_WARPS = committed
        ref = call()
        for stages, warps in LAUNCHES:
            at.NUM_STAGES, at.NUM_WARPS = stages, warps
            try:
                same = bool(torch.equal(call().view(torch.int16), ref.view(torch.int16)))
                ms = _bench(call, graph=kind == "decode")
            except Exception as e:  # noqa: BLE001 - out of shared memory: record and go on
                rows.append({"kind": kind, "batch": batch, "context": ctx, "stages": stages, "warps": warps,
                             "error": str(e)[:200]})
                continue
            rows.append({"kind": kind, "batch": batch, "context": ctx, "stages": stages, "warps": warps, "ms": ms,
                         "same_bits": same})
            print(f"{kind} b{batch} c{ctx} stages {stages} warps {warps}: {ms * 1e3:.1f} us same={same}", flush=True)
        at.NUM_STAGES, at.NUM_WARPS = committed
        with open(os.path.join(out_dir, "attention_stages.json"), "w") as f:
            json.dump({"committed": committed, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
