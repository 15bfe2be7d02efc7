"""H200 A/B of a decode step (samebits/benchmarks/steps.py's measure: deterministic, async scheduling, tight
grids), the two variants in interleaved rounds in one process. Neither variant may change a bit; only the time may differ.

    python scripts/steps_ab.py OUT_DIR tile OLD_ROW NEW_ROW [--batches 1] [--rounds 2]
    python scripts/steps_ab.py OUT_DIR norm [--batches 1,64] [--rounds 2]
    python scripts/steps_ab.py OUT_DIR gluon [--batches 1] [--rounds 2]

tile: the matmul table's first row as committed and as another tile, each a comma-separated [max_M, BM, BN, BK,
warps, stages, GROUP_M] (every tile of the sequential-K kernel gives the same bits, kernels/configs.py "matmul"; at
batch 1 the row serves the eager lm_head). norm: RMSNorm rows that fit one block kept in registers (the kernel's
ONE_BLOCK) or read again by the two-pass loop (kernels/triton/norms.py). gluon: decode attention of few programs in
the Gluon tile or in attention.py's kernel (kernels/triton/attention.py GLUON_PROGRAMS). Writes OUT_DIR/steps_ab.WHAT.json.
"""
import argparse
import functools
import json
from pathlib import Path

from samebits.benchmarks import e2e
from samebits.benchmarks.steps import measure
from samebits.bench.shapes import random_shape_model
from samebits.kernels.configs import TILE_CONFIGS


def _tile_variants(old: str, new: str) -> dict:
    table = TILE_CONFIGS["matmul"]["config"]
    rows = {"old": [int(v) for v in old.split(",")], "new": [int(v) for v in new.split(",")]}
    return {name: (row, lambda row=row: table.__setitem__(0, row)) for name, row in rows.items()}


def _norm_variants() -> dict:
    from samebits.kernels.triton import norms

    launch = norms._launch
    return {"two-pass": ("two_pass=True", lambda: setattr(norms, "_launch", functools.partial(launch, two_pass=True))),
            "one-block": ("one block where H fits", lambda: setattr(norms, "_launch", launch))}


def _gluon_variants() -> dict:
    from samebits.kernels.triton import attention

    programs = attention.GLUON_PROGRAMS
    return {"triton": ("GLUON_PROGRAMS=0", lambda: setattr(attention, "GLUON_PROGRAMS", 0)),
            "gluon": (f"GLUON_PROGRAMS={programs}", lambda: setattr(attention, "GLUON_PROGRAMS", programs))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("what", choices=["tile", "norm", "gluon"])
    ap.add_argument("rows", nargs="*", help="tile: OLD_ROW NEW_ROW")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    variants = {"tile": lambda: _tile_variants(*args.rows), "norm": _norm_variants, "gluon": _gluon_variants}[args.what]()
    batches = [int(b) for b in args.batches.split(",")]
    loaded = random_shape_model("8b", e2e.DEVICE)
    results = []
    for r in range(args.rounds):
        for name, (setting, apply) in variants.items():
            apply()
            for m in measure(loaded, "deterministic", True, "tight", batches, 512, 30):
                results.append({"round": r, "variant": name, "setting": setting, "batch": m["batch"],
                                "wall_ms": m["wall_ms"], "gpu_busy_ms": m["gpu_busy_ms"],
                                "top_kernels_ms": m["top_kernels_ms"]})
                print(f"round {r} {name} {setting} batch {m['batch']}: wall {m['wall_ms']:.3f} ms, "
                      f"busy {m['gpu_busy_ms']:.3f} ms", flush=True)
    (args.out / f"steps_ab.{args.what}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
