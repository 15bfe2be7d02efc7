"""H200 probe: does prefetching the o projection's weights into L2, on a side stream while a batch-1 decode's
attention runs (HBM idle: 8 programs, latency-bound), make the o GEMM that follows faster?

    python scripts/l2_prefetch_probe.py OUT_DIR [--batch 1] [--context 512]

Each "layer" is the 8B shape's attention (our paged kernel), the o GEMM (cuBLASLt) and the gate_up GEMM (235 MB, which
streams the L2 clean before the next layer), over LAYERS distinct weights and caches, replayed in a CUDA graph. The
prefetch reads nothing into registers and writes nothing: the GEMM's bits cannot change (checked). Variants: none;
`bulk` (cp.async.bulk.prefetch.L2, one instruction per lane per CHUNK bytes); `lines` (prefetch.global.L2 per
128-byte line). Writes OUT_DIR/l2_prefetch.json.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from samebits.benchmarks.attention import BS, HKV, HQ, D, to_pages
from samebits.benchmarks.kernels import bench_graph
from samebits.kernels import vendor_gemm
from samebits.kernels.attention import AttentionMetadata
from samebits.kernels.triton import attention as at

LAYERS = 16
HIDDEN, INTER = 4096, 14336
CHUNK = 4096  # bytes per lane and instruction
LANES = 128
SEED = 20261203


@triton.jit
def _prefetch_bulk_kernel(ptr, n_bytes, CHUNK: tl.constexpr, LANES: tl.constexpr):
    offs = (tl.program_id(0) * LANES + tl.arange(0, LANES)).to(tl.int64) * CHUNK
    offs = tl.minimum(offs, n_bytes - CHUNK)
    size = tl.full([LANES], CHUNK, tl.int32)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                              [ptr + offs, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_lines_kernel(ptr, n_bytes, CHUNK: tl.constexpr, LANES: tl.constexpr):
    base = (tl.program_id(0) * LANES + tl.arange(0, LANES)).to(tl.int64) * CHUNK
    base = tl.minimum(base, n_bytes - CHUNK)
    for line in range(0, CHUNK, 128):
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptr + base + line],
                                  dtype=tl.int32, is_pure=False, pack=1)


KERNELS = {"bulk": _prefetch_bulk_kernel, "lines": _prefetch_lines_kernel}


def prefetch(kind: str, w: torch.Tensor) -> None:
    n = w.numel() * w.element_size()
    assert n % CHUNK == 0, f"prefetch: {n} bytes is not a multiple of {CHUNK}"
    KERNELS[kind][(triton.cdiv(n // CHUNK, LANES),)](w.view(torch.uint8).view(-1), n, CHUNK=CHUNK, LANES=LANES)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    b, ctx = args.batch, args.context
    dt = torch.bfloat16
    layers = []
    for _ in range(LAYERS):
        k = torch.randn(b, ctx, HKV, D, device="cuda", dtype=dt)
        v = torch.randn(b, ctx, HKV, D, device="cuda", dtype=dt)
        k_cache, v_cache, tables = to_pages(k, v, BS, gen)
        layers.append({"q": torch.randn(b, HQ, D, device="cuda", dtype=dt), "kc": k_cache, "vc": v_cache,
                       "wo": torch.randn(HIDDEN, HIDDEN, device="cuda", dtype=dt) * HIDDEN ** -0.5,
                       "wgu": torch.randn(2 * INTER, HIDDEN, device="cuda", dtype=dt) * HIDDEN ** -0.5})
        meta = AttentionMetadata.build([1] * b, [ctx] * b, tables, BS, "cuda")
        layers[-1]["meta"] = meta
    for w in ("wo", "wgu"):
        assert vendor_gemm.verdict(*layers[0][w].shape, dt, layers[0][w].device), f"{w}: cuBLASLt self-test failed"
    side = torch.cuda.Stream()
    outs = {}

    def layer(i, kind, keep):
        lay = layers[i]
        main_stream = torch.cuda.current_stream()
        if kind != "none":
            side.wait_stream(main_stream)
            with torch.cuda.stream(side):
                prefetch(kind, lay["wo"])
        a = at.paged_attention(lay["q"], lay["kc"], lay["vc"], lay["meta"], D ** -0.5)
        o = vendor_gemm.lt_linear(a.view(b, HQ * D), lay["wo"])
        vendor_gemm.lt_linear(o, lay["wgu"])
        if kind != "none":
            main_stream.wait_stream(side)
        if keep is not None:
            keep.append(o)

    rows = []
    for rnd in range(3):
        for kind in ("none", "bulk", "lines"):
            keep = []
            for i in range(LAYERS):
                layer(i, kind, keep)
            torch.cuda.synchronize()
            outs.setdefault(kind, keep)
            same = all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(keep, outs["none"]))
            ms = bench_graph([lambda i=i, kind=kind: layer(i, kind, None) for i in range(LAYERS)])
            rows.append({"round": rnd, "variant": kind, "batch": b, "context": ctx, "us_per_layer": ms * 1e3,
                         "same_bits": same})
            print(f"round {rnd} {kind:6s} b{b} c{ctx}: {ms * 1e3:7.1f} us per layer  same={same}", flush=True)
    # The parts alone: attention, o GEMM cold and from L2, gate_up.
    lay = layers[0]
    a = at.paged_attention(lay["q"], lay["kc"], lay["vc"], lay["meta"], D ** -0.5).view(b, HQ * D)
    parts = {
        "attention": [lambda i=i: at.paged_attention(layers[i]["q"], layers[i]["kc"], layers[i]["vc"],
                                                     layers[i]["meta"], D ** -0.5) for i in range(LAYERS)],
        "o cold": [lambda i=i: vendor_gemm.lt_linear(a, layers[i]["wo"]) for i in range(LAYERS)],
        "o from L2": [lambda: vendor_gemm.lt_linear(a, lay["wo"])] * LAYERS,
        "gate_up cold": [lambda i=i: vendor_gemm.lt_linear(a, layers[i]["wgu"]) for i in range(LAYERS)],
    }
    for name, fns in parts.items():
        ms = bench_graph(fns)
        rows.append({"part": name, "batch": b, "context": ctx, "us": ms * 1e3})
        print(f"{name:12s}: {ms * 1e3:7.1f} us", flush=True)
    (args.out / "l2_prefetch.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
