"""H200 repro attempt: decode at 128 x 8192 then 256 x 8192 (K and V of exactly 2^31 elements), our kernel and SDPA
interleaved, each timing announced before it starts; where the benchmark's process died (docs/BENCHMARKS.md
section 3). Run it plain and under `compute-sanitizer --tool memcheck`; on 2026-12-02 it failed once in three.
--as-benchmark runs the benchmark's own decode_case for the two shapes instead (set CUDA_LAUNCH_BLOCKING=1 to have
the error raised at the launch that faults).

    python scripts/attention_2g_repro.py [--as-benchmark]
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from samebits.benchmarks.attention import HQ, D, _bench, _paged, decode_case
from samebits.kernels.attention import paged_attention


def _case(batch: int, gen) -> None:
    print("build", batch, flush=True)
    q, k, v, k_cache, v_cache, meta = _paged(batch, 8192, 1, gen)
    torch.cuda.synchronize()
    scale = D ** -0.5
    qs, ks, vs = q.view(batch, 1, HQ, D).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def sdpa():
        return F.scaled_dot_product_attention(qs, ks, vs, scale=scale, enable_gqa=True)

    def ours():
        return paged_attention(q, k_cache, v_cache, meta, scale)

    for name, fn, graph in (("ours graph", ours, True), ("sdpa graph", sdpa, True), ("ours eager", ours, False),
                            ("sdpa eager", sdpa, False)):
        print("start", batch, name, flush=True)
        print("done", batch, name, _bench(fn, graph=graph), flush=True)
        torch.cuda.synchronize()


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    for batch in (128, 256):
        if "--as-benchmark" in sys.argv:
            print("decode_case", batch, flush=True)
            print(decode_case(batch, 8192, gen), flush=True)
        else:
            _case(batch, gen)
        torch.cuda.empty_cache()
    print("ok", flush=True)


if __name__ == "__main__":
    main()
