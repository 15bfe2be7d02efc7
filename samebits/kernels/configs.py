"""Every kernel constant that changes output bits, in one table, with the reason beside it.

The fingerprint hashes `numerics_profile()`: change a value here and every lock taken before reports drift.
"""
from __future__ import annotations

# name -> {"config": ..., "why": ...}; filled by the kernels that own them.
TILE_CONFIGS: dict[str, dict] = {}


def numerics_profile() -> dict:
    return {name: entry["config"] for name, entry in sorted(TILE_CONFIGS.items())}
