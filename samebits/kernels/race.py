"""The exponential race that draws a token: the torch reference of the fused Triton kernel (triton/race.py) and the
backend on the CPU.

token = argmax_i (z_i - log E_i), E_i = -log(u_i) ~ Exp(1), with z the row's filtered, temperature-scaled logits and
u_i the Philox uniform of (seed, sample_index, position, i) (kernels/philox.py). The key is formed in float64 exactly as
written here: the float32 uniform widened, log, negate, log, negate, then the widened logit added; every device's
float64 log is within an ulp of the true value, far below the spacing of float32 logits (engine/sampler.py says why
the race is taken in log space). The maximum is exact in any order and ties go to the lowest token id, so how a
kernel cuts the vocabulary cannot change the token; the row's maximum key is returned too, for the tests that hold
a kernel to this reference bit for bit.
"""
from __future__ import annotations

import torch

from samebits.kernels.philox import philox_uniforms


def race_keys(z: torch.Tensor, seeds, sample_indices, positions, stream: int,
              uniforms=philox_uniforms) -> torch.Tensor:
    """[S, V] float64 keys z_i - log(-log(u_i)) (z [S, V] float32; counters int64 [S]). `uniforms`: the Philox op
    that draws u (the torch reference here; benchmarks/kernels.py passes the Triton kernel's, same bits)."""
    g = uniforms(seeds, sample_indices, positions, z.shape[-1], stream).double()
    return z.double() + g.log_().neg_().log_().neg_()


def gumbel_race(z: torch.Tensor, seeds, sample_indices, positions, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (token int64 [S], its key float64 [S]): each row's winner, ties to the lowest id (argmax's first maximum)."""
    keys = race_keys(z, seeds, sample_indices, positions, stream)
    tokens = keys.argmax(dim=-1)
    return tokens, keys.gather(1, tokens[:, None])[:, 0]
