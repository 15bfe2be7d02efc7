"""FP8 linears at the 8B shapes: samebits' deterministic FP8 linear against torch._scaled_mm (the vendor's row-wise
FP8 GEMM) and against bf16, side by side, M = 1..8192, with the row bits checked across M.

    python -m samebits.benchmarks.fp8 --out DIR [--quick] [--sweep]
    TRITON_INTERPRET=1 python -m samebits.benchmarks.fp8 --out DIR --device cpu   # a smoke run, tiny shapes

Prints a table, writes DIR/fp8.json and DIR/fp8.png. GPU times as benchmarks/kernels.py takes them (a CUDA graph over
enough copies of the weights to stream 4x the L2, the median replay per call). Per (shape, M):
- `ours`: `Ops.linear_fp8` in deterministic mode as the engine runs it (activation quantisation included; the vendor
  route where its self-test passed and M >= min_m, else the Triton kernels) and the route it took;
- `tri_gemm` / `lt_gemm` / `lt_fast_gemm`: the GEMM alone on quantised inputs: the Triton kernel, torch._scaled_mm
  without and with fast accumulation;
- `lt_linear`: the vendor's whole linear (the Triton quantisation, then torch._scaled_mm): what `ours` is held to
  (>= 0.9x);
- `bf16`: the deterministic bf16 linear (`Ops.linear`), and the weight floor (FP8 weight bytes at 4 TB/s).
Bits: every M's rows equal the same rows computed at M = max (row bits across M), the fused decode form equals the
unfused one, and the vendor route's self-test verdict per shape. --sweep times candidate tiles at a few M and checks
each gives the table's bits (the whole Triton linear: a tile that is not FUSED pays the quantisation kernel too).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from samebits.benchmarks.results import figure, write_json

SHAPES_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
SHAPES_TINY = {"qkv": (384, 256), "down": (256, 512)}
M_ALL = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
M_QUICK = [1, 4, 16, 64, 256, 1024, 8192]
M_CPU = [1, 3, 17, 64]
HBM_BYTES_PER_S = 4.0e12  # the H200's measured copy bandwidth (benchmarks/e2e.py weights_floor_ms)
SWEEP_M = [1, 8, 16, 64, 1024, 8192]
SWEEP = {
    "decode": [[0, 64, 16, 128, 4, 4, 1, 0], [0, 64, 16, 128, 4, 6, 1, 0], [0, 64, 16, 128, 4, 8, 1, 0],
               [0, 64, 32, 128, 4, 4, 1, 0], [0, 64, 32, 128, 4, 6, 1, 0], [0, 64, 64, 128, 4, 4, 1, 0],
               [0, 64, 16, 128, 4, 4, 1, 1], [0, 64, 16, 128, 4, 6, 1, 1], [0, 64, 32, 128, 4, 4, 1, 1],
               [0, 64, 32, 128, 4, 6, 1, 1]],
    "prefill": [[0, 128, 128, 128, 8, 3, 8, 0], [0, 128, 128, 128, 8, 4, 8, 0], [0, 128, 128, 128, 4, 4, 8, 0],
                [0, 64, 128, 128, 4, 4, 8, 0], [0, 128, 64, 128, 4, 4, 8, 0], [0, 64, 256, 128, 8, 3, 8, 0],
                [0, 128, 256, 128, 8, 3, 8, 0]],
}


def _timer(device: str):
    """fns (one per input copy) -> median ms per call: a CUDA graph's replays on the GPU, wall time on the CPU."""
    if device == "cuda":
        from samebits.benchmarks.kernels import bench_graph

        return bench_graph

    def wall(fns, reps: int = 3) -> float:
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            for f in fns:
                f()
            times.append(1e3 * (time.perf_counter() - t) / len(fns))
        return sorted(times)[len(times) // 2]

    return wall


def _copies(device: str, nbytes: int) -> int:
    if device != "cuda":
        return 1
    from samebits.benchmarks.kernels import copies_for

    return copies_for(nbytes)


def _same(a, b) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def _weights(n, k, copies, device, g):
    from samebits.kernels.fp8 import quantize_weight

    dense = [(torch.randn(n, k, generator=g, device=device) * k ** -0.5) for _ in range(copies)]
    fp8 = [quantize_weight(w) for w in dense]
    return fp8, [w.to(torch.bfloat16) for w in dense]


def shape_rows(name: str, n: int, k: int, ms: list[int], device: str, g) -> tuple[list[dict], dict]:
    from samebits.kernels import get_ops, vendor_fp8
    from samebits.kernels.fp8 import Fp8Recipe
    from samebits.kernels.triton import fp8 as tri

    recipe = Fp8Recipe("channel", "token")
    det = get_ops("deterministic", device)
    bench = _timer(device)
    copies = _copies(device, n * k)
    fp8, bf16 = _weights(n, k, copies, device, g)
    if device == "cuda":
        det.backend.vendor_gemm.prove_weights(bf16[:1])
        vendor_fp8.prove_weights([fp8[0][0]])
    x_all = torch.randn(max(ms), k, generator=g, device=device).to(torch.bfloat16 if device == "cuda" else
                                                                     torch.float32)
    full = det.linear_fp8(x_all, *fp8[0], recipe)
    checks = {"shape": name, "rows_equal_across_m": True, "fused_equals_unfused": None,
              "vendor_self_test": vendor_fp8.verdicts().get(f"{n}x{k} fp8 cuda:0")}
    rows = []
    for m in ms:
        x = x_all[:m]
        checks["rows_equal_across_m"] &= _same(det.linear_fp8(x, *fp8[0], recipe), full[:m])
        if m <= 4:
            fused = tri.linear_fp8(x, *fp8[0], recipe, config=tri.tile_for(m)[:7] + [1])
            unfused = tri.linear_fp8(x, *fp8[0], recipe, config=tri.tile_for(m)[:7] + [0])
            checks["fused_equals_unfused"] = _same(fused, unfused) and checks["fused_equals_unfused"] is not False
        rows.append({"shape": name, "n": n, "k": k, **_times(x, fp8, bf16, recipe, det, bench, device)})
        print(json.dumps(rows[-1]), flush=True)
    return rows, checks


def _times(x, fp8, bf16, recipe, det, bench, device) -> dict:
    """One M's times: ours, the Triton GEMM alone, bf16, the weight floor, and on CUDA the vendor's."""
    from samebits.kernels.triton import fp8 as tri

    copies, (n, k) = len(fp8), fp8[0][0].shape
    q, a_scale = tri.quantize(x, recipe)
    dense = [w if device == "cuda" else w.float() for w in bf16]
    x_dense = x.to(dense[0].dtype)
    row = {"m": x.shape[0], "route": _route(x, fp8[0][0], recipe, device),
           "ours_ms": bench([lambda i=i: det.linear_fp8(x, *fp8[i], recipe) for i in range(copies)]),
           "tri_gemm_ms": bench([lambda i=i: tri.gemm(q, a_scale, *fp8[i], recipe, None, x.dtype)
                                 for i in range(copies)]),
           "bf16_ms": bench([lambda i=i: det.linear(x_dense, dense[i]) for i in range(copies)]),
           "floor_ms": 1e3 * n * k / HBM_BYTES_PER_S}
    if device == "cuda":
        row.update(_vendor_times(bench, q, a_scale, x, fp8, recipe, copies))
    return row


def _route(x, weight, recipe, device) -> str:
    from samebits.kernels import vendor_fp8
    from samebits.kernels.triton import fp8 as tri

    if device != "cuda":
        return "cpu"
    if vendor_fp8.eligible(x, weight, recipe, None):
        return "vendor"
    return "triton fused" if tri.tile_for(x.shape[0])[7] else "triton"


def _vendor_times(bench, q, a_scale, x, fp8, recipe, copies) -> dict:
    from samebits.kernels import vendor_fp8
    from samebits.kernels.triton import fp8 as tri

    def linear(i):
        q_i, s_i = tri.quantize(x, recipe)
        return vendor_fp8.scaled_mm(q_i, s_i, *fp8[i], fast_accum=False)

    out = {"lt_gemm_ms": bench([lambda i=i: vendor_fp8.scaled_mm(q, a_scale, *fp8[i], fast_accum=False)
                                for i in range(copies)]),
           "lt_fast_gemm_ms": bench([lambda i=i: vendor_fp8.scaled_mm(q, a_scale, *fp8[i], fast_accum=True)
                                     for i in range(copies)]),
           "lt_linear_ms": bench([lambda i=i: linear(i) for i in range(copies)])}
    out["lt_same_bits_as_triton"] = bool(_same(vendor_fp8.scaled_mm(q, a_scale, *fp8[0], fast_accum=False),
                                               tri.gemm(q, a_scale, *fp8[0], recipe, None, x.dtype)))
    return out


def sweep_rows(name: str, n: int, k: int, device: str, g) -> list[dict]:
    """Candidate tiles of the FP8 GEMM at a few M: time, and the table tile's bits at every one."""
    from samebits.kernels.fp8 import Fp8Recipe
    from samebits.kernels.triton import fp8 as tri

    recipe, bench = Fp8Recipe("channel", "token"), _timer(device)
    copies = _copies(device, n * k)
    fp8, _ = _weights(n, k, copies, device, g)
    rows = []
    for m in [m for m in SWEEP_M if device == "cuda" or m <= 64]:
        x = torch.randn(m, k, generator=g, device=device).to(torch.bfloat16)
        ref = tri.linear_fp8(x, *fp8[0], recipe)
        for cfg in SWEEP["decode" if m <= 64 else "prefill"]:
            rows.append({"shape": name, "m": m, "config": cfg, **_sweep_one(x, ref, cfg, fp8, recipe, bench)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _sweep_one(x, ref, cfg, fp8, recipe, bench) -> dict:
    """The whole Triton linear at this tile (with the quantisation kernel where the tile is not FUSED)."""
    from samebits.kernels.triton import fp8 as tri

    def run(i):
        return tri.linear_fp8(x, *fp8[i], recipe, config=cfg)

    return {"ms": bench([lambda i=i: run(i) for i in range(len(fp8))]), "same_bits": _same(run(0), ref)}


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="FP8 linear (deterministic) vs vendor FP8 and bf16, ms")
    cols = ("shape", "M", "route", "ours", "tri gemm", "lt gemm", "lt fast", "lt linear", "lt/ours", "bf16",
            "bf16/ours", "floor", "ours/floor")
    for c in cols:
        t.add_column(c)
    nan = float("nan")
    for r in report["rows"]:
        lt = r.get("lt_linear_ms", nan)
        t.add_row(r["shape"], str(r["m"]), r["route"], f"{r['ours_ms']:.4f}", f"{r['tri_gemm_ms']:.4f}",
                  f"{r.get('lt_gemm_ms', nan):.4f}", f"{r.get('lt_fast_gemm_ms', nan):.4f}", f"{lt:.4f}",
                  f"{lt / r['ours_ms']:.2f}", f"{r['bf16_ms']:.4f}", f"{r['bf16_ms'] / r['ours_ms']:.2f}",
                  f"{r['floor_ms']:.4f}", f"{r['ours_ms'] / r['floor_ms']:.2f}")
    Console().print(t)
    for c in report["checks"]:
        print(f"{c['shape']}: rows equal across M {c['rows_equal_across_m']}, fused == unfused "
              f"{c['fused_equals_unfused']}, vendor self-test {c['vendor_self_test']}")
    if report.get("sweep"):
        for r in report["sweep"]:
            print(f"sweep {r['shape']} M={r['m']} {r['config']}: {r['ms']:.4f} ms, same bits {r['same_bits']}")


def plot(report: dict, path: Path) -> None:
    names = list(dict.fromkeys(r["shape"] for r in report["rows"]))
    with figure(path, 1, len(names), figsize=(4 * len(names), 3.5), squeeze=False) as (_, axes):
        for ax, name in zip(axes[0], names):
            rows = [r for r in report["rows"] if r["shape"] == name]
            ms = [r["m"] for r in rows]
            for key, label in (("ours_ms", "samebits FP8"), ("lt_linear_ms", "vendor FP8"),
                               ("bf16_ms", "samebits bf16"),
                               ("floor_ms", "FP8 weight floor")):
                if key in rows[0]:
                    ax.plot(ms, [r[key] for r in rows], marker="o", label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{name} {rows[0]['n']}x{rows[0]['k']}")
            ax.set_xlabel("M")
        axes[0][0].set_ylabel("ms")
        axes[0][0].legend(fontsize=7)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help=f"M in {M_QUICK} only")
    ap.add_argument("--sweep", action="store_true", help="also time candidate tiles and check their bits")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run on tiny shapes (set TRITON_INTERPRET=1)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = args.device == "cuda"
    shapes = SHAPES_8B if cuda else SHAPES_TINY
    ms = (M_QUICK if args.quick else M_ALL) if cuda else M_CPU
    g = torch.Generator(device=args.device).manual_seed(0)
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu", "rows": [], "checks": [], "sweep": []}
    for name, (n, k) in shapes.items():
        rows, checks = shape_rows(name, n, k, ms, args.device, g)
        report["rows"] += rows
        report["checks"].append(checks)
        write_json(report, args.out / "fp8.json")  # partial results survive a timeout
    if args.sweep:
        for name, (n, k) in shapes.items():
            report["sweep"] += sweep_rows(name, n, k, args.device, g)
    write_json(report, args.out / "fp8.json")
    print_table(report)
    plot(report, args.out / "fp8.png")


# samebits: intentionally nondeterministic because a benchmark times vendor kernels beside samebits' own.
if __name__ == "__main__":
    main()
