"""The two numerics modes, named once: every config, CLI flag and ops table checks against these."""
from __future__ import annotations

# deterministic: samebits' invariant kernels (a row's bits never depend on its batch); fast: the vendor ops.
MODES = ("deterministic", "fast")


def check_mode(mode) -> str:
    """-> mode, or ValueError naming the field and the choices."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode
