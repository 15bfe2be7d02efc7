"""H200 probe for the transposed attention tiles (kernels/triton/attention.py): is a row's bits the same at every
query-tile width, warp count and stage count, for prefill, chunked prefill and decode (folded or split-parallel)?
Speed lives in samebits/benchmarks/attention.py.

    python scripts/attention_rows_probe.py OUT_DIR
"""
from __future__ import annotations

import json
import os
import random
import sys

import torch

from samebits.kernels.attention import AttentionMetadata
from samebits.kernels.triton import attention as at
from samebits.kernels.triton.attention import paged_attention

HQ, HKV, D, BS = 32, 8, 128, 16
SCALE = D ** -0.5


def bits(x):
    return x.view(torch.int16)


def cache(length: int, gen):
    n_blk = -(-length // BS)
    order = torch.randperm(n_blk + 8, generator=gen).tolist()[:n_blk]
    kc = torch.randn(n_blk + 8, BS, HKV, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    return kc, vc, order


def run(q, kc, vc, q_lens, ctx, tables, num_warps=None, num_stages=None, **kw):
    """The launcher at rows/parallel_splits `kw`; warps and stages patched in for one call (probe only)."""
    meta = AttentionMetadata.build(q_lens, ctx, tables, BS, "cuda")
    saved = at.NUM_WARPS, at.NUM_STAGES
    at.NUM_WARPS, at.NUM_STAGES = num_warps or saved[0], num_stages or saved[1]
    try:
        return paged_attention(q, kc, vc, meta, SCALE, **kw)
    finally:
        at.NUM_WARPS, at.NUM_STAGES = saved


def invariance(gen) -> dict:
    length = 2200  # crosses two 1024-token splits
    kc, vc, table = cache(length, gen)
    q = torch.randn(length, HQ, D, device="cuda", dtype=torch.bfloat16)
    report = {}
    ref = run(q, kc, vc, [length], [length], [table], rows=64)
    for rows in (16, 32, 128):
        other = run(q, kc, vc, [length], [length], [table], rows=rows)
        report[f"prefill_rows{rows}_vs_64_rows_differing"] = int((bits(other) != bits(ref)).any(-1).any(-1).sum())
    for warps in (8,):
        other = run(q, kc, vc, [length], [length], [table], rows=64, num_warps=warps)
        report[f"prefill_warps{warps}_differing"] = int((bits(other) != bits(ref)).any(-1).any(-1).sum())
    chunks, start, outs = [100, 300, 1000, 800], 0, []
    for c in chunks:
        outs.append(run(q[start:start + c], kc, vc, [c], [start + c], [table], rows=64))
        start += c
    report["chunked_rows_differing"] = int((bits(torch.cat(outs)) != bits(ref)).any(-1).any(-1).sum())
    positions = sorted(set([0, 1, 63, 64, 65, 1023, 1024, 1025, 2047, 2048, 2199] +
                           random.Random(1).sample(range(length), 40)))
    for rows in (16, 32, 64):
        for parallel in (False, True):
            bad = 0
            for p in positions:
                o = run(q[p:p + 1], kc, vc, [1], [p + 1], [table], rows=rows, parallel_splits=parallel)
                bad += int(not torch.equal(bits(o[0]), bits(ref[p])))
            report[f"decode_rows{rows}_parallel{parallel}_positions_differing"] = f"{bad}/{len(positions)}"
    for warps, stages in ((8, 2), (4, 3)):
        o = run(q[2199:2200], kc, vc, [1], [2200], [table], num_warps=warps, num_stages=stages)
        report[f"decode_w{warps}_s{stages}_equal"] = torch.equal(bits(o[0]), bits(ref[2199]))
    # decode rows of 32 positions in one batch
    qs = q[positions[:32]]
    batch = run(qs, kc, vc, [1] * 32, [p + 1 for p in positions[:32]], [table] * 32)
    report["decode_batch32_vs_prefill_rows_differing"] = int(
        sum(not torch.equal(bits(batch[i]), bits(ref[p])) for i, p in enumerate(positions[:32])))
    return report


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    report = invariance(gen)
    print(json.dumps(report), flush=True)
    with open(os.path.join(out, "attention_rows_probe.json"), "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
