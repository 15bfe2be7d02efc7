"""Dtype names, spelled once: configs hold the canonical name (torch-free), the loader turns it into a torch.dtype."""
from __future__ import annotations

# torch.dtype objects are accepted through str() ("torch.bfloat16").
DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}


def normalize_dtype(dtype) -> str | None:
    """None, an alias or a torch.dtype -> its canonical name, or ValueError naming the field and the choices."""
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.").lower()
    if name not in DTYPE_ALIASES:
        raise ValueError(f"dtype must be None or one of {sorted(set(DTYPE_ALIASES.values()))}, got {dtype!r}")
    return DTYPE_ALIASES[name]
