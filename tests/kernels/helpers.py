"""Shared pieces of the kernel tests: M values, dtypes, bounds and the row-alone-vs-inside-a-batch check."""
from __future__ import annotations

import torch

from samebits.probe.compare import assert_same_bits, mismatch

BATCH_SIZES = list(range(1, 18)) + [31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 511, 512, 1024]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Max |error| relative to max |reference| against a float64 reference; dominated by the final rounding
# (2^-8 bf16, 2^-11 fp16) and fp32 accumulation over small K.
REL_TOL = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def fresh_generator(seed: int) -> torch.Generator:
    """A generator on the `seed` fixture's seed: fresh data every run, named in a failure's report, replayable."""
    return torch.Generator().manual_seed(seed)


def rand(shape, dtype, g, device="cpu", scale=1.0):
    return (torch.randn(shape, generator=g, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


def assert_close_to_ref(out, ref, dtype, what):
    err = (out.double() - ref).abs().max().item()
    bound = REL_TOL[dtype] * max(ref.abs().max().item(), 1e-30)
    assert err <= bound, f"{what}: max |err| {err:.3e} > bound {bound:.3e} ({dtype})"


def check_row_invariance(fn, row, make_batch, sizes, g, what):
    """fn(X[M, ...]) -> [M, ...]; the result for `row` alone must equal its result at a random slot in every M."""
    alone = fn(row[None])[0]
    for m in sizes:
        batch = make_batch(m)
        p = int(torch.randint(0, m, (1,), generator=g))
        batch[p] = row
        assert_same_bits(fn(batch)[p], alone, f"{what}: row alone vs slot {p} of M={m}")


def rows_that_differ(fn, row, make_batch, sizes) -> list[int]:
    alone = fn(row[None])[0]
    out = []
    for m in sizes:
        batch = make_batch(m)
        batch[0] = row
        if not mismatch(fn(batch)[0], alone).same:
            out.append(m)
    return out


def batch_variant_linear(linear):
    """A negative control's kernel: `linear` one ulp up wherever it computes more than one row, so its bits follow the
    batch on every machine (vendor CPU GEMMs need not: under AVX2,STRICT an Intel Xeon's MKL gave every batch size
    the same bits)."""
    def variant(x, w, bias=None):
        y = linear(x, w, bias)
        return torch.nextafter(y, torch.full_like(y, float("inf"))) if x.shape[0] > 1 else y
    return variant
