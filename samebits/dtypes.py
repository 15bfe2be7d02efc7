"""Dtype names, spelled once: configs hold the canonical name (torch-free), the loader turns it into a torch.dtype."""
from __future__ import annotations

from samebits.errors import FieldError

# torch.dtype objects are accepted through str() ("torch.bfloat16").
DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}


# vLLM's default spelling of "let the loader choose": the same as None (bf16 on cuda, fp32 on cpu).
AUTO = "auto"


def normalize_dtype(dtype) -> str | None:
    """None or "auto", an alias or a torch.dtype -> its canonical name (None for the loader's choice), or ValueError
    naming the field and the choices."""
    if dtype is None or dtype == AUTO:
        return None
    name = str(dtype).removeprefix("torch.").lower()
    if name not in DTYPE_ALIASES:
        raise FieldError("dtype",
                         f"dtype must be None, {AUTO!r} or one of {sorted(set(DTYPE_ALIASES.values()))}, got {dtype!r}")
    return DTYPE_ALIASES[name]


# `--quantization` (vLLM's flag): "fp8" quantises a dense checkpoint at load, per output row weight scales and
# per-token activation scales; "fp8_per_tensor" is vLLM's online fp8 recipe, per-tensor weight and dynamic activation
# scales, which deterministic mode refuses (models/quantization.py says what each does to an FP8 checkpoint).
QUANTIZATIONS = ("fp8", "fp8_per_tensor")


def check_quantization(value) -> str | None:
    """-> value (None: the checkpoint's own), or ValueError naming the field and the choices."""
    if value is not None and value not in QUANTIZATIONS:
        raise FieldError("quantization", f"quantization must be None or one of {QUANTIZATIONS}, got {value!r}")
    return value
