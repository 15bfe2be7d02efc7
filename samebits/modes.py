"""The two numerics modes, named once: every config, CLI flag and ops table checks against these."""
from __future__ import annotations

from samebits.errors import FieldError

# deterministic: samebits' invariant kernels (a row's bits never depend on its batch); fast: the vendor ops.
MODES = ("deterministic", "fast")
# Tensor-parallel sizes: the powers of two up to TP_MAX, the shard count of TP-invariant mode (kernels/configs.py
# "tensor_parallel" holds it with its reason); here so that the torch-free config can check a size.
TP_MAX = 8
TP_SIZES = tuple(1 << i for i in range(TP_MAX.bit_length()))


def check_mode(mode) -> str:
    """-> mode, or ValueError naming the field and the choices."""
    if mode not in MODES:
        raise FieldError("mode", f"mode must be one of {MODES}, got {mode!r}")
    return mode
