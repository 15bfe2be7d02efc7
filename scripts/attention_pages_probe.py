"""H200 probe: the Triton attention on the same data at page sizes 16, 64 and 128, bit for bit, timed beside SDPA.

    python scripts/attention_pages_probe.py OUT_DIR

Pages of a multiple of the 64-token KV tile take one block id per tile (kernels/triton/attention.py _tile_blocks),
smaller ones gather key by key; every output must equal the 16-token pages'. Writes attention_pages.json; the run of
2026-12-02 is docs/results/attention_pages.h200.json (docs/BENCHMARKS.md section 3).
"""
from __future__ import annotations

import functools
import json
import os
import sys

import torch
import torch.nn.functional as F

from samebits.benchmarks.attention import HKV, HQ, D, _bench, to_pages
from samebits.kernels.attention import AttentionMetadata
from samebits.kernels.triton import attention as at

PAGES = (16, 64, 128)
DECODE = [(1, 512), (1, 2048), (1, 8192), (8, 2048), (32, 512), (64, 512), (64, 2048), (256, 512), (256, 2048)]
PREFILL = [1024, 4096, 8192]


def case(rows: list, kind: str, batch: int, ctx: int) -> None:
    torch.manual_seed(batch * 7 + ctx)
    k = torch.randn(batch, ctx, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q_len = 1 if kind == "decode" else ctx
    q = torch.randn(batch * q_len, HQ, D, device="cuda", dtype=torch.bfloat16)
    scale, graph = D ** -0.5, kind == "decode"
    qs, ks, vs = q.view(batch, q_len, HQ, D).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    sdpa = _bench(lambda: F.scaled_dot_product_attention(qs, ks, vs, scale=scale, is_causal=not graph,
                                                         enable_gqa=True), graph=graph)
    ref = None
    for page in PAGES:
        k_cache, v_cache, tables = to_pages(k, v, page, torch.Generator().manual_seed(page))
        meta = AttentionMetadata.build([q_len] * batch, [ctx] * batch, tables, page, "cuda")
        call = functools.partial(at.paged_attention, q, k_cache, v_cache, meta, scale)
        out = call()
        ref = out if ref is None else ref
        row = {"kind": kind, "batch": batch, "context": ctx, "page": page, "ms": _bench(call, graph=graph),
               "sdpa_ms": sdpa, "same_as_page_16": bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))}
        row["ratio"] = sdpa / row["ms"]
        rows.append(row)
        print(f"{kind:7s} b{batch:<4d} c{ctx:<5d} page {page:<4d} {row['ms'] * 1e3:8.1f} us  sdpa "
              f"{sdpa * 1e3:7.1f} us  x{row['ratio']:.2f}  same={row['same_as_page_16']}", flush=True)


def main() -> None:
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rows: list[dict] = []
    for kind, batch, ctx in [("decode", b, c) for b, c in DECODE] + [("prefill", 1, n) for n in PREFILL]:
        case(rows, kind, batch, ctx)
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "attention_pages.json"), "w") as f:
        json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
