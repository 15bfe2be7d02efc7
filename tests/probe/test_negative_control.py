"""Negative control: a reduction whose chunking follows the batch size must be caught by the very code (probe,
comparison, verdict) that reports a fixed-order reduction as clean. If this passes, an "invariant" cell means something.
"""
import itertools

import pytest
import torch

from samebits.probe.impls import Impl, VendorOps
from samebits.probe.probes import PROBES, Ctx, Sizes, run_one

CPU = torch.device("cpu")
SIZES = Sizes(matmul_k=64, matmul_n=24, matmul_m=(1, 2, 4, 8, 16), norm_hidden=96, norm_rows=(1, 2, 4, 8, 16))


def chunked_row_sum(v, chunks: int, partial_dtype):
    """Sum float32 v [M, ..., K] over K: each chunk left to right, its total stored in `partial_dtype` (as a split-K
    workspace in the input dtype does), then the totals left to right. Only elementwise adds, so the order is exactly
    what `chunks` says and nothing else."""
    k = v.shape[-1]
    bounds = [k * i // chunks for i in range(chunks + 1)]
    total = None
    for lo, hi in itertools.pairwise(bounds):
        part = v[..., lo]
        for j in range(lo + 1, hi):
            part = part + v[..., j]
        part = part.to(partial_dtype).float()
        total = part if total is None else total + part
    return total


class ChunkedOps(VendorOps):
    """linear and rms_norm on chunked_row_sum, with the chunk count chosen by `chunks_for(rows in the batch)`."""

    def __init__(self, chunks_for):
        super().__init__(CPU)
        self.chunks_for = chunks_for

    def linear(self, x, w, bias=None):
        prod = x.float()[:, None, :] * w.float()[None, :, :]
        return chunked_row_sum(prod, self.chunks_for(x.shape[0]), x.dtype).to(x.dtype)

    def rms_norm(self, x, w, eps):
        xf = x.float()
        ms = chunked_row_sum(xf * xf, self.chunks_for(x.shape[0]), x.dtype) / x.shape[-1]
        return (xf * torch.rsqrt(ms + eps)[:, None]).to(x.dtype) * w


def split_more_when_small(rows: int) -> int:
    # What split-K heuristics do: few rows leave the machine idle, so cut the reduction finer.
    return 8 if rows < 4 else 1


def fixed(rows: int) -> int:
    return 8


@pytest.mark.parametrize("probe", ["matmul_batch", "rms_norm_batch"])
def test_batch_dependent_chunking_is_reported_variant(probe):
    results = run_one(PROBES[probe], Impl("control", ChunkedOps(split_more_when_small)), Ctx(CPU, SIZES))
    assert results and all(r.verdict == "variant" for r in results), [(r.dtype, r.mismatch_fraction) for r in results]
    for r in results:
        flips = [f > 0 for f in r.mismatch_fraction]
        # Sizes 1 and 2 share the 8-way split with the reference; from 4 rows on the split changes.
        assert flips == [False, False, True, True, True], (r.dtype, r.mismatch_fraction)


@pytest.mark.parametrize("probe", ["matmul_batch", "rms_norm_batch"])
def test_fixed_chunking_is_reported_invariant(probe):
    results = run_one(PROBES[probe], Impl("control", ChunkedOps(fixed)), Ctx(CPU, SIZES))
    assert results and all(r.verdict == "invariant" for r in results)
    assert all(d == 0.0 for r in results for d in r.max_abs_diff)
