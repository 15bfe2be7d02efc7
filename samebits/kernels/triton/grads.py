"""The backward ops on CUDA (kernels/grads.py's table): the invariant Triton matmul for the linears (K in sequence;
a weight gradient takes the packed tokens as its K), and the Triton kernels of this folder for the rest."""
from __future__ import annotations

from samebits.kernels.triton import matmul as tri_matmul
from samebits.kernels.triton.activation_bwd import silu_and_mul_bwd  # noqa: F401 - a backward op (grads.GRADS)
from samebits.kernels.triton.attention_bwd import attention_bwd  # noqa: F401
from samebits.kernels.triton.column_sum import column_sum
from samebits.kernels.triton.norms_bwd import rms_norm_bwd  # noqa: F401


def linear_dx(dy, weight):
    """dy [..., N], weight [N, K] -> dx [..., K] = dy @ weight, in dy.dtype."""
    dx = tri_matmul.matmul_kn(dy.reshape(-1, dy.shape[-1]), weight)
    return dx.reshape(*dy.shape[:-1], weight.shape[1])


def linear_dw(dy, x):
    """dy [..., N], x [..., K] -> dW [N, K] = dy^T x in x.dtype: the tokens are the GEMM's K, added in sequence."""
    return tri_matmul.matmul_kn(dy.reshape(-1, dy.shape[-1]).t(), x.reshape(-1, x.shape[-1]))


def bias_grad(dy):
    """dy [..., N] -> [N] in dy.dtype: the sum over tokens in fixed splits merged in order."""
    return column_sum(dy.reshape(-1, dy.shape[-1]))
