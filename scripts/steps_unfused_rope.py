"""H200 A/B: benchmarks/steps.py with the model's RoPE and KV write as two launches (ops.rope_write_kv unfused), to time
beside `python benchmarks/steps.py` in one call (docs/BENCHMARKS.md section 8)."""
import runpy
import sys

sys.path[:0] = [".", "benchmarks"]
import samebits.kernels.triton.backend as b


def unfused(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping):
    q, k = b.rope(q, k, positions, cos_sin)
    b.write_kv(k, v, k_cache, v_cache, slot_mapping)
    return q


b.rope_write_kv = unfused
sys.argv = ["benchmarks/steps.py"] + sys.argv[1:]
runpy.run_path("benchmarks/steps.py", run_name="__main__")
