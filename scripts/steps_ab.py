"""H200 A/B: a decode step (benchmarks/steps.py's measure: deterministic, async scheduling, tight grids) with the
matmul table's first row as committed and as another tile, in interleaved rounds in one process.

    python scripts/steps_matmul_tile.py OUT_DIR OLD_ROW NEW_ROW [--batches 1] [--rounds 2]

A row is the table's comma-separated [max_M, BM, BN, BK, warps, stages, GROUP_M]. Every tile of the sequential-K
kernel gives the same bits (kernels/configs.py "matmul"), so only the time may differ; at batch 1 the row serves
the eager lm_head (docs/BENCHMARKS.md section 8). Writes OUT_DIR/steps_matmul_tile.json.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = [".", "benchmarks"]
import e2e  # benchmarks/e2e.py
from steps import measure  # benchmarks/steps.py

from samebits.diagnostics.bench.shapes import random_shape_model
from samebits.kernels.configs import TILE_CONFIGS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    table = TILE_CONFIGS["matmul"]["config"]
    rows = {name: [int(v) for v in text.split(",")] for name, text in (("old", args.old), ("new", args.new))}
    batches = [int(b) for b in args.batches.split(",")]
    loaded = random_shape_model("8b", e2e.DEVICE)
    results = []
    for r in range(args.rounds):
        for name, row in rows.items():
            table[0] = row
            for m in measure(loaded, "deterministic", True, "tight", batches, 512, 30):
                results.append({"round": r, "tile": name, "row": row, "batch": m["batch"], "wall_ms": m["wall_ms"],
                                "gpu_busy_ms": m["gpu_busy_ms"], "top_kernels_ms": m["top_kernels_ms"]})
                print(f"round {r} {name} {row} batch {m['batch']}: wall {m['wall_ms']:.3f} ms, "
                      f"busy {m['gpu_busy_ms']:.3f} ms", flush=True)
    (args.out / "steps_matmul_tile.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
