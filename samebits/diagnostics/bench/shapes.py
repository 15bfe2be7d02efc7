"""Random-weight models of real shapes, built on the device without files: the cost of a model is its shape.
Torch-free until a model is built (the CLI reads the shape names at start-up)."""
from __future__ import annotations

from pathlib import Path

# Llama-3-8B's and Llama-3.2-1B's shapes, and a tiny one for a CPU smoke run (wide enough that vendor matmuls change
# their blocking with the batch, as tests/engine/test_invariance.py's CPU shape).
SHAPES = {
    "8b": {"architecture": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
           "num_layers": 32, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "max_position_embeddings": 8192,
           "rope_theta": 500000.0},
    "tiny": {"architecture": "llama", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_layers": 2,
             "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "max_position_embeddings": 4096, "rope_theta": 500000.0},
    "1b": {"architecture": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
           "num_layers": 16, "num_heads": 32, "num_kv_heads": 8, "head_dim": 64, "max_position_embeddings": 8192,
           "rope_theta": 500000.0},
}


class NullTokenizer:
    """Random-weight models have no vocabulary worth decoding; the engine only needs these."""

    def __init__(self) -> None:
        self.eos_token_ids: set[int] = set()

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""


def random_shape_model(shape: str, device: str, quantization: str | None = None):
    """A LoadedModel of SHAPES[shape] with N(0, 0.02) weights, in the device's serving dtype (bf16 on CUDA, fp32 on
    the CPU), on fast ops until an engine sets its mode's; with `quantization` ("fp8", "fp8_per_tensor") its
    linears quantised as `--quantization` does at load (models/quantization.py)."""
    from samebits.kernels import get_ops
    from samebits.models.config import ModelConfig
    from samebits.models.loader import LoadedModel, resolve_dtype
    from samebits.models.quantization import quantize_dense
    from samebits.models.testing import random_model

    config = ModelConfig(**SHAPES[shape])
    model = random_model(config, get_ops("fast", device), resolve_dtype(None, device), seed=0)
    if quantization is not None:
        model = quantize_dense(model, quantization)
    name = f"random-{shape}" + (f"-{quantization}" if quantization else "")
    return LoadedModel(model, NullTokenizer(), config, name, Path("."))
