"""H200 probe: does the tensor core give an attention element the same bits whichever MMA side its query row is on?

Decode tiles put the query rows on the MMA's N side (S^T = K Q^T, O^T = V^T P^T; kernels/triton/attention.py), so a
row's bits do not depend on how many rows share its tile. Prefill tiles put them on M, FlashAttention's layout (S = Q
K^T, O = P V with P from registers), which keeps decode's bits only if, for the same operands,
  - each score S[r, t] equals S^T[t, r] bit for bit (the same products, summed over the head dim by the MMA),
  - each output O[r, d] of acc + P V equals that of acc^T + V^T P^T,
  - and the row sum l is formed in one order in both: tl.sum's order follows the layout, so here l is also taken
    through the MMA, as P times a ones column (rows on M) and a ones row times P^T (rows on N).
The H200's answer was yes at every case (docs/results/mma_roles.h200.json), and the kernel rests on it.
This probe answers those per dtype, tile width (rows) and warp count, against the decode tile (16 rows on N, 4 warps).
The max is exact in any order and exp2 is elementwise, so P follows from S. Nothing here is launched by the engine.

    python scripts/mma_roles_probe.py OUT_DIR            # on the H200
    python scripts/mma_roles_probe.py OUT_DIR --device cpu  # plumbing only, under TRITON_INTERPRET=1
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

BN = 64  # the KV tile (kernels/configs.py attention.kv_tile)
ONES = 64  # the ones operand's other side: 64 is wgmma's M, and N = 64 keeps both kernels at one instruction shape
SEED = 20261202


@triton.jit
def _rows_on_m_kernel(Q, K, V, ACC, S_OUT, P_OUT, L_OUT, LSUM_OUT, O_OUT, scale,
                      BQ: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, ONES: tl.constexpr):
    # FlashAttention's layout: S = Q K^T [BQ, BN], P from registers as the A operand of O = acc + P V [BQ, D].
    r, n, d, c = tl.arange(0, BQ), tl.arange(0, BN), tl.arange(0, D), tl.arange(0, ONES)
    q = tl.load(Q + r[:, None] * D + d[None, :])
    k = tl.load(K + n[:, None] * D + d[None, :])
    v = tl.load(V + n[:, None] * D + d[None, :])
    acc = tl.load(ACC + r[:, None] * D + d[None, :])
    s = tl.dot(q, tl.trans(k)) * scale
    p = tl.exp2(s - tl.max(s, 1)[:, None]).to(v.dtype)
    ones = tl.full([BN, ONES], 1.0, v.dtype)
    lm = tl.dot(p, ones)  # [BQ, ONES]: every column is the row's sum of P, in the MMA's order
    o = tl.dot(p, v, acc)
    tl.store(S_OUT + r[:, None] * BN + n[None, :], s)
    tl.store(P_OUT + r[:, None] * BN + n[None, :], p)
    tl.store(L_OUT + r[:, None] * ONES + c[None, :], lm)
    tl.store(LSUM_OUT + r, tl.sum(p.to(tl.float32), 1))
    tl.store(O_OUT + r[:, None] * D + d[None, :], o)


@triton.jit
def _rows_on_n_kernel(Q, K, V, ACC, S_OUT, P_OUT, L_OUT, LSUM_OUT, O_OUT, scale,
                      BQ: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, ONES: tl.constexpr):
    # Today's layout: S^T = K Q^T [BN, BQ], O^T = acc^T + V^T P^T [D, BQ]; stored back as [BQ, ...] rows.
    r, n, d, c = tl.arange(0, BQ), tl.arange(0, BN), tl.arange(0, D), tl.arange(0, ONES)
    qt = tl.load(Q + r[None, :] * D + d[:, None])
    k = tl.load(K + n[:, None] * D + d[None, :])
    vt = tl.load(V + n[None, :] * D + d[:, None])
    acct = tl.load(ACC + r[None, :] * D + d[:, None])
    st = tl.dot(k, qt) * scale
    pt = tl.exp2(st - tl.max(st, 0)[None, :]).to(vt.dtype)
    ones = tl.full([ONES, BN], 1.0, vt.dtype)
    lt = tl.dot(ones, pt)  # [ONES, BQ]: every row is the column's sum of P^T
    ot = tl.dot(vt, pt, acct)
    tl.store(S_OUT + r[None, :] * BN + n[:, None], st)
    tl.store(P_OUT + r[None, :] * BN + n[:, None], pt)
    tl.store(L_OUT + r[None, :] * ONES + c[:, None], lt)
    tl.store(LSUM_OUT + r, tl.sum(pt.to(tl.float32), 0))
    tl.store(O_OUT + r[None, :] * D + d[:, None], ot)


KERNELS = {"rows_on_m": _rows_on_m_kernel, "rows_on_n": _rows_on_n_kernel}


def _inputs(dtype, d: int, rows: int, device, gen):
    q = torch.randn(rows, d, generator=gen).to(device, dtype)
    k = torch.randn(BN, d, generator=gen).to(device, dtype)
    v = torch.randn(BN, d, generator=gen).to(device, dtype)
    acc = torch.randn(rows, d, generator=gen).to(device)
    return q, k, v, acc


def run(layout: str, q, k, v, acc, rows: int, warps: int) -> dict[str, torch.Tensor]:
    d, dev = q.shape[1], q.device
    out = {"s": torch.empty(rows, BN, device=dev), "p": torch.empty(rows, BN, device=dev, dtype=v.dtype),
           "l_mma": torch.empty(rows, ONES, device=dev), "l_sum": torch.empty(rows, device=dev),
           "o": torch.empty(rows, d, device=dev)}
    KERNELS[layout][(1,)](q[:rows], k, v, acc[:rows], out["s"], out["p"], out["l_mma"], out["l_sum"], out["o"],
                          d ** -0.5 * 1.4426950408889634, BQ=rows, BN=BN, D=d, ONES=ONES, num_warps=warps)
    return out


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32) if x.dtype == torch.float32 else x.view(torch.int16)


def differing_rows(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.shape[0], b.shape[0])
    diff = _bits(a[:n]) != _bits(b[:n])
    return int(diff.reshape(n, -1).any(-1).sum())


def compare(ref: dict, other: dict) -> dict:
    report = {name: differing_rows(ref[name], other[name]) for name in ("s", "p", "l_sum", "o")}
    report["l_mma"] = differing_rows(ref["l_mma"][:, :1], other["l_mma"][:, :1])
    report["l_mma_columns_disagree"] = int((_bits(other["l_mma"]) != _bits(other["l_mma"][:, :1])).any(-1).sum())
    return report


def cases(device: str):
    if device == "cpu":
        return [("rows_on_n", 16, 4), ("rows_on_m", 16, 4)]
    return ([("rows_on_n", rows, warps) for rows in (16, 64, 128) for warps in (4, 8)]
            + [("rows_on_m", rows, warps) for rows in (64, 128) for warps in (4, 8)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    dtypes = (torch.bfloat16, torch.float16) if args.device == "cuda" else (torch.float32,)
    rows_out = []
    for dtype in dtypes:
        for d in (64, 128):
            gen = torch.Generator().manual_seed(SEED)
            q, k, v, acc = _inputs(dtype, d, 128, args.device, gen)
            ref = run("rows_on_n", q, k, v, acc, 16, 4)  # the decode tile
            for layout, rows, warps in cases(args.device):
                row = {"dtype": str(dtype).removeprefix("torch."), "head_dim": d, "layout": layout, "rows": rows,
                       "warps": warps, "seed": SEED, **compare(ref, run(layout, q, k, v, acc, rows, warps))}
                rows_out.append(row)
                print(json.dumps(row))
    with open(os.path.join(args.out_dir, "mma_roles.json"), "w") as f:
        json.dump({"rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
