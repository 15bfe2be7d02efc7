"""H200 probe: the Gluon decode tile (kernels/triton/attention_gluon.py) against attention.py's Triton decode, bit for bit
and side by side in time, with SDPA.

    python scripts/gluon_decode_probe.py OUT_DIR [--rounds N]

Bits: every case's Gluon output is compared with attention.paged_attention's (torch.equal on the int16 views),
over odd context lengths, mixed lengths, 2-4 new tokens per sequence, split-parallel and folded launches, pages of 64
and 128 tokens, bf16 and fp16; a control with another qk scale must differ. Time: µs per call in CUDA graphs at the
decode shapes of samebits/benchmarks/attention.py, L2 warm and (cold) with the KV read from HBM; `gluon sN` at N stages.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os

import torch
import torch.nn.functional as F

from samebits.benchmarks.attention import HKV, HQ, D, _bench, to_pages
from samebits.kernels.attention import AttentionMetadata
from samebits.kernels.triton import attention as at
from samebits.kernels.triton import attention_gluon as ag

SEED = 1234
DECODE = [(1, 512), (1, 2048), (1, 8192), (1, 32768), (8, 512), (8, 2048), (32, 2048), (64, 2048), (256, 2048)]
COLD_BYTES = 160 << 20
STAGE_VARIANTS = [3, 4]  # the Gluon tile's K/V stages
# (query lens, context lens, page, dtype, parallel_splits)
BIT_CASES = [([1], [1], 64, torch.bfloat16, None), ([1], [1000], 64, torch.bfloat16, None),
             ([1] * 5, [77, 1024, 1025, 2047, 4100], 64, torch.bfloat16, None),
             ([1] * 5, [77, 1024, 1025, 2047, 4100], 64, torch.bfloat16, True),
             ([1] * 5, [77, 1024, 1025, 2047, 4100], 64, torch.bfloat16, False),
             ([2, 4, 3, 1], [130, 2050, 64, 999], 64, torch.bfloat16, None),
             ([2, 4, 3, 1], [130, 2050, 64, 999], 64, torch.bfloat16, True),
             ([1] * 3, [300, 3000, 9000], 128, torch.bfloat16, None),
             ([1] * 3, [300, 3000, 9000], 64, torch.float16, None),
             ([1] * 40, list(range(100, 4100, 100)), 64, torch.bfloat16, None),
             ([1] * 40, list(range(100, 4100, 100)), 64, torch.bfloat16, False)]


def _case(q_lens, ctxs, page, dtype, gen):
    n_blk = [-(-c // page) for c in ctxs]
    order = torch.randperm(sum(n_blk) + 3, generator=gen).tolist()
    tables, at_ = [], 0
    for n in n_blk:
        tables.append(order[at_:at_ + n])
        at_ += n
    k_cache = torch.randn(sum(n_blk) + 3, page, HKV, D, generator=gen).to("cuda", dtype)
    v_cache = torch.randn(sum(n_blk) + 3, page, HKV, D, generator=gen).to("cuda", dtype)
    k_cache[order[-1]] = float("nan")  # an unused page: never read
    for c, tab in zip(ctxs, tables):  # slots past each context hold NaN: a masked key's V must never reach the output
        if c % page:
            v_cache[tab[-1], c % page:] = float("nan")
            k_cache[tab[-1], c % page:] = float("nan")
    meta = AttentionMetadata.build(q_lens, ctxs, tables, page, "cuda")
    q = torch.randn(sum(q_lens), HQ, D, generator=gen).to("cuda", dtype)
    return q, k_cache, v_cache, meta


def _bits(x):
    return x.view(torch.int16)


def check_bits(gen) -> list[dict]:
    rows = []
    for q_lens, ctxs, page, dtype, par in BIT_CASES:
        q, kc, vc, meta = _case(q_lens, ctxs, page, dtype, gen)
        scale = D ** -0.5
        ref = _triton(q, kc, vc, meta, scale, parallel_splits=par)
        ok = {}
        for stages in STAGE_VARIANTS:
            got = _gluon(q, kc, vc, meta, scale, stages=stages, parallel_splits=par)
            ok[f"s{stages}"] = bool(torch.equal(_bits(got), _bits(ref)))
        control = _gluon(q, kc, vc, meta, scale * 1.0001, parallel_splits=par)
        row = {"q_lens": q_lens[:6], "ctxs": ctxs[:6], "n": len(ctxs), "page": page, "dtype": str(dtype),
               "parallel": par, **ok, "control_differs": not torch.equal(_bits(control), _bits(ref)),
               "finite": bool(torch.isfinite(ref).all())}
        print(row)
        rows.append(row)
    return rows


def _copies(tensors, cold):
    n = -(-COLD_BYTES // sum(t.numel() * t.element_size() for t in tensors)) if cold else 1
    return [tuple(t.clone() for t in tensors) for _ in range(n)] if n > 1 else [tuple(tensors)]


def _cycled(fn, copies):
    state = {"i": 0}

    def call():
        c = copies[state["i"] % len(copies)]
        state["i"] += 1
        return fn(*c)
    return call


@contextlib.contextmanager
def _switches(gluon_programs: int, fused: bool, stages: int = ag.STAGES):
    """attention.py's GLUON_PROGRAMS and FUSED_MERGE and the Gluon tile's STAGES, restored on exit."""
    saved = at.GLUON_PROGRAMS, at.FUSED_MERGE, ag.STAGES
    at.GLUON_PROGRAMS, at.FUSED_MERGE, ag.STAGES = gluon_programs, fused, stages
    try:
        yield
    finally:
        at.GLUON_PROGRAMS, at.FUSED_MERGE, ag.STAGES = saved


def _triton(q, kc, vc, meta, scale, fused=True, parallel_splits=None):
    """attention.py's own kernel (never the Gluon tile)."""
    with _switches(0, fused):
        return at.paged_attention(q, kc, vc, meta, scale, parallel_splits=parallel_splits)


def _gluon(q, kc, vc, meta, scale, stages=ag.STAGES, fused=True, parallel_splits=None):
    """The Gluon tile at any program count."""
    with _switches(1 << 30, fused, stages):
        return at.paged_attention(q, kc, vc, meta, scale, parallel_splits=parallel_splits)


def _variants(q, meta, scale):
    variants = {"triton": functools.partial(_triton, q, meta=meta, scale=scale),
                "triton merge kernel": functools.partial(_triton, q, meta=meta, scale=scale, fused=False)}
    for stages in STAGE_VARIANTS:
        variants[f"gluon s{stages}"] = functools.partial(_gluon, q, meta=meta, scale=scale, stages=stages)
    variants["gluon merge kernel"] = functools.partial(_gluon, q, meta=meta, scale=scale, fused=False)
    return variants


def time_case(batch: int, ctx: int, gen, cold: bool, round_: int) -> dict:
    k = torch.randn(batch, ctx, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, ctx, HKV, D, device="cuda", dtype=torch.bfloat16)
    k_cache, v_cache, tables = to_pages(k, v, 64, gen)
    meta = AttentionMetadata.build([1] * batch, [ctx] * batch, tables, 64, "cuda")
    q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    scale = D ** -0.5
    caches = _copies((k_cache, v_cache), cold)
    ref = _triton(q, k_cache, v_cache, meta, scale)
    times, same = {}, {}
    for name, fn in _variants(q, meta, scale).items():
        same[name] = bool(torch.equal(_bits(fn(k_cache, v_cache)), _bits(ref)))
        times[name] = _bench(_cycled(fn, caches), graph=True) * 1e3
    qs = q.view(batch, 1, HQ, D).transpose(1, 2)
    sdpa = functools.partial(F.scaled_dot_product_attention, qs, scale=scale, enable_gqa=True)
    times["sdpa"] = _bench(_cycled(sdpa, _copies((k.transpose(1, 2), v.transpose(1, 2)), cold)), graph=True) * 1e3
    print(f"b{batch:<4d} c{ctx:<6d} {'cold' if cold else 'warm'} " +
          "  ".join(f"{n} {t:7.1f}" for n, t in times.items()) + f"  same {all(same.values())}")
    return {"batch": batch, "context": ctx, "cold": cold, "round": round_, "us": times, "same_bits": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip-bits", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(SEED)
    report = {"seed": SEED, "device": torch.cuda.get_device_name(), "bits": [] if args.skip_bits else check_bits(gen),
              "decode": []}
    for r in range(args.rounds):
        for cold in (False, True):
            for batch, ctx in DECODE:
                report["decode"].append(time_case(batch, ctx, gen, cold, r))
                torch.cuda.empty_cache()
    path = os.path.join(args.out, "gluon_decode.h200.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
