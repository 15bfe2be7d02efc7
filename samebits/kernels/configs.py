"""Every kernel constant that changes output bits, in one table, with the reason beside it.

The fingerprint hashes `numerics_profile()`: change a value here and every lock taken before reports drift.
"""
from __future__ import annotations

# name -> {"config": ..., "why": ...}; filled by the kernels that own them.
TILE_CONFIGS: dict[str, dict] = {}

TILE_CONFIGS["attention.query_tile"] = {
    "config": {"rows": 64, "num_warps": 4, "num_stages": 2},
    "why": "rows = (token, GQA head) pairs; the H200 probe showed head_dim-128 row reductions change with the query "
    "tile, so one tile serves prefill, chunked prefill and decode alike.",
}

TILE_CONFIGS["attention.kv_tile"] = {
    "config": {"tokens": 64},
    "why": "keys are folded in tiles of this many tokens gathered through the block table, so the page size never "
    "changes the order.",
}

TILE_CONFIGS["attention.split_kv"] = {
    "config": {"tokens": 256, "merge": "ordered fold 0..n-1, fma(acc_run, a, acc_s * b)"},
    "why": "fixed split size in tokens: decode runs splits in parallel and merges them, prefill folds the same splits "
    "sequentially with the same formula.",
}

TILE_CONFIGS["attention.cpu"] = {
    "config": {"query_rows": 64, "kv_tokens": 64, "compute": "float32", "split_tokens": 256},
    "why": "torch CPU mm results depend on M, so every CPU attention matmul runs on padded fixed-shape chunks.",
}

TILE_CONFIGS["rope.table"] = {
    "config": {"angle": "float32 inv_freq * float32 position (HF)", "cos_sin": "float64, rounded to float32"},
    "why": "the table is built once on the CPU, so its bits do not depend on a device's cos/sin.",
}


def numerics_profile() -> dict:
    return {name: entry["config"] for name, entry in sorted(TILE_CONFIGS.items())}
