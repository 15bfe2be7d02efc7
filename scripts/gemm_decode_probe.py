"""H200 probe: small-M GEMMs at the 8B model's weight shapes, the table's Triton tile, candidate tiles and cuBLASLt.

    python scripts/gemm_decode_probe.py OUT_DIR [--m 1,8]

At batch 1 the proven cuBLASLt route runs qkv, o and down with 64-row tiles of the weight: 96, 64 and 64 programs on
132 SMs, 3.56 TB/s against gate_up's 4.2 (docs/BENCHMARKS.md section 8). Every tile of the sequential-K Triton kernel
gives the same bits (kernels/configs.py "matmul"), so a tile with more programs is a free choice if it is faster.
Each case is timed in a CUDA graph over enough weight copies to stream 4x the L2 (samebits/benchmarks/kernels.py),
and its bits are compared with the table's tile. First, a chain of dependent M = 1 GEMMs times programmatic dependent launch
and an L2 weight prefetch (`_pdl_matmul_kernel`, an experiment not used by samebits). Prints a table and writes
OUT_DIR/gemm_chain.json and OUT_DIR/gemm_decode.json (docs/BENCHMARKS.md section 2).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import triton
import triton.language as tl

import samebits.kernels.triton.matmul as tm
from samebits.benchmarks.kernels import bench_graph, copies_for
from samebits.kernels import vendor_gemm

SEED = 20261202
# (name, N, K) of Llama-3-8B's linears.
SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
          ("lm_head", 128256, 4096)]
# [max_M, BM, BN, BK, warps, stages, GROUP_M] as the table's rows; BM 16 is the smallest tl.dot tile.
CANDIDATES = [[0, 16, bn, bk, w, s, 1] for bn, bk, w, s in itertools.product((16, 32, 64), (128, 256), (2, 4, 8), (4, 6))]
CANDIDATES += [[0, 16, bn, 512, 4, s, 1] for bn in (16, 32) for s in (3, 4)]


def _case(name, n, k, m, gen):
    ws = [(torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(torch.bfloat16)
          for _ in range(copies_for(n * k * 2))]
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    ref = tm.linear(x, ws[0])
    rows = [{"shape": name, "n": n, "k": k, "m": m, "impl": "table", "cfg": tm.tile_for(m)[1:],
                 "ms": bench_graph([lambda w=w: tm.linear(x, w) for w in ws]), "same_bits": True}]
    lt_same = bool(torch.equal(vendor_gemm.lt_linear(x, ws[0]), ref))
    rows.append({"shape": name, "n": n, "k": k, "m": m, "impl": "cublaslt", "cfg": None, "same_bits": lt_same,
                     "ms": bench_graph([lambda w=w: vendor_gemm.lt_linear(x, w) for w in ws])})
    rows.append({"shape": name, "n": n, "k": k, "m": m, "impl": "torch", "cfg": None, "same_bits": None,
                     "ms": bench_graph([lambda w=w: torch.nn.functional.linear(x, w) for w in ws])})
    for cfg in CANDIDATES:
        try:
            same = bool(torch.equal(tm.linear(x, ws[0], config=cfg), ref))
            t = bench_graph([lambda w=w, cfg=cfg: tm.linear(x, w, config=cfg) for w in ws])
        except Exception as exc:  # noqa: BLE001 - out of shared memory etc.: recorded, the sweep goes on
            rows.append({"shape": name, "n": n, "k": k, "m": m, "impl": "triton", "cfg": cfg[1:], "error": str(exc)[:160]})
            continue
        rows.append({"shape": name, "n": n, "k": k, "m": m, "impl": "triton", "cfg": cfg[1:], "ms": t, "same_bits": same})
    for r in rows:
        if "ms" in r:
            r["tbs"] = n * k * 2 / r["ms"] / 1e9
    return rows


@triton.jit
def _prefetch_l2(ptrs):
    # One L2 prefetch per pointer; the dummy result keeps the instruction (not pure: never removed or hoisted).
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _pdl_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_cm,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr,
                       PREFETCH: tl.constexpr, TRIGGER: tl.constexpr):
    # The table kernel's K loop (kernels/triton/matmul.py) on a [M, K] x [N, K]^T product, EVEN_K, one program per
    # BN weight rows. PDL: launched before its predecessor ends; the weights (never written by a step) are prefetched
    # into L2 before griddepcontrol.wait, everything else after it.
    pid_n = tl.program_id(0)
    rn = pid_n * BN + tl.arange(0, BN)
    rbn = rn % N
    rk = tl.arange(0, BK)
    b_ptrs = b_ptr + rk[:, None] + rbn[None, :] * stride_bn  # [BK, BN]
    if PREFETCH:
        lines = tl.arange(0, BK // 64) * 64  # one pointer per 128-byte line of a bf16 row
        for kb in range(0, K, BK):
            _prefetch_l2(b_ptr + rbn[:, None] * stride_bn + kb + lines[None, :])
    if PDL:
        tl.extra.cuda.gdc_wait()
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    rm = tl.arange(0, BM)
    a_ptrs = a_ptr + (rm % M)[:, None] * stride_am + rk[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(tl.cdiv(K, BK)):
        acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc, input_precision="tf32")
        a_ptrs += BK
        b_ptrs += BK
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def pdl_linear(x, w, cfg, pdl, prefetch, trigger):
    _, bm, bn, bk, warps, stages, _ = cfg
    m, k = x.shape
    n = w.shape[0]
    assert k % bk == 0 and x.is_contiguous() and w.is_contiguous()
    c = torch.empty(m, n, device=x.device, dtype=x.dtype)
    _pdl_matmul_kernel[(triton.cdiv(n, bn),)](x, w, c, m, n, k, x.stride(0), w.stride(0), c.stride(0), BM=bm, BN=bn,
                                             BK=bk, PDL=pdl, PREFETCH=prefetch, TRIGGER=trigger, num_warps=warps,
                                             num_stages=stages, launch_pdl=pdl, enable_fp_fusion=False)
    return c


# Chain: each GEMM's input is the previous one's output, as in a decode step (o-shaped weights, N = K = 4096), so a
# launch's start and its predecessor's tail are on the clock. (name, fn(x, w)).
CHAIN_TILES = [[0, 16, 32, 128, 4, 6, 1], [0, 16, 16, 256, 4, 4, 1], [0, 16, 32, 256, 4, 4, 1]]


def _chain_variants():
    out = [("cublaslt", vendor_gemm.lt_linear), ("table", tm.linear)]
    for cfg in CHAIN_TILES:
        for pdl, prefetch, trigger in ((False, False, False), (True, False, False), (True, False, True),
                                       (True, True, True)):
            name = f"{cfg[1:6]} pdl={int(pdl)} prefetch={int(prefetch)} trigger={int(trigger)}"
            out.append((name, lambda x, w, cfg=cfg, p=pdl, f=prefetch, t=trigger: pdl_linear(x, w, cfg, p, f, t)))
    return out


def _chain(gen, passes=4):
    n = k = 4096
    ws = [(torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(torch.bfloat16)
          for _ in range(copies_for(n * k * 2))]
    x0 = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)
    seq = ws * passes

    def run(fn):
        x = x0
        for w in seq:
            x = fn(x, w)
        return x

    ref = run(tm.linear)
    rows = []
    for name, fn in _chain_variants():
        try:
            same = bool(torch.equal(run(fn), ref))
            ms = bench_graph([lambda fn=fn: run(fn)]) / len(seq)
        except Exception as exc:  # noqa: BLE001 - a variant this Triton cannot build: recorded
            rows.append({"chain": name, "error": str(exc)[:200]})
            print(f"chain {name}: {exc!r}"[:240], flush=True)
            continue
        rows.append({"chain": name, "ms_per_gemm": ms, "tbs": n * k * 2 / ms / 1e9, "same_bits": same})
        print(f"chain {name}: {ms * 1e3:.2f} us per GEMM, {n * k * 2 / ms / 1e9:.2f} TB/s, same bits {same}",
              flush=True)
    return rows


def _print(rows):
    by = {}
    for r in rows:
        by.setdefault((r["shape"], r["m"]), []).append(r)
    for (shape, m), rs in by.items():
        lt = next(r for r in rs if r["impl"] == "cublaslt")
        ok = sorted((r for r in rs if r["impl"] == "triton" and "ms" in r), key=lambda r: r["ms"])
        print(f"\n{shape} M={m}: cuBLASLt {lt['ms'] * 1e3:.1f} us ({lt['tbs']:.2f} TB/s, same bits {lt['same_bits']}), "
              + ", ".join(f"{r['impl']} {r['ms'] * 1e3:.1f} us" for r in rs if r["impl"] in ("table", "torch")))
        for r in ok[:8]:
            print(f"  {r['cfg']}: {r['ms'] * 1e3:6.1f} us {r['tbs']:.2f} TB/s x{lt['ms'] / r['ms']:.2f} vs cuBLASLt,"
                  f" same bits {r['same_bits']}")
        bad = [r for r in rs if r.get("same_bits") is False]
        print(f"  {len(ok)} candidates ran, {len(bad)} with other bits: {[r['cfg'] for r in bad][:6]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--m", default="1,8")
    ap.add_argument("--chain-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(SEED)
    chain = _chain(gen)
    with open(os.path.join(args.out, "gemm_chain.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "seed": SEED, "rows": chain}, f, indent=1)
    if args.chain_only:
        return
    rows = []
    for m in (int(v) for v in args.m.split(",")):
        for name, n, k in SHAPES:
            case = _case(name, n, k, m, gen)
            _print(case)
            rows += case
            with open(os.path.join(args.out, "gemm_decode.json"), "w") as f:  # after each case: a time limit keeps it
                json.dump({"device": torch.cuda.get_device_name(), "seed": SEED, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
