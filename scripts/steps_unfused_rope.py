"""H200 A/B: the decode steps of `python -m samebits.benchmarks.steps` with the model's RoPE and KV write as two
launches (ops.rope_write_kv unfused), to time beside the fused steps in one call (docs/BENCHMARKS.md section 8)."""
import runpy
import sys

import samebits.kernels.triton.backend as b


def unfused(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping):
    q, k = b.rope(q, k, positions, cos_sin)
    b.write_kv(k, v, k_cache, v_cache, slot_mapping)
    return q


b.rope_write_kv = unfused
sys.argv = ["steps"] + sys.argv[1:]
runpy.run_module("samebits.benchmarks.steps", run_name="__main__")
