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
    # Mixtures of experts (models/moe.py): Qwen3-30B-A3B's shape (61 GB in bf16: one H200), Mixtral-8x7B's (93 GB),
    # and a tiny one for a CPU smoke run. `moe` holds MoeConfig's fields.
    "qwen3-30b-a3b": {"architecture": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
                      "intermediate_size": 6144, "num_layers": 48, "num_heads": 32, "num_kv_heads": 4, "head_dim": 128,
                      "max_position_embeddings": 40960, "rope_theta": 1000000.0, "qk_norm": True,
                      "moe": {"num_experts": 128, "top_k": 8, "intermediate_size": 768, "norm_topk_prob": True}},
    "mixtral-8x7b": {"architecture": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                     "num_layers": 32, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
                     "max_position_embeddings": 32768, "rope_theta": 1000000.0,
                     "moe": {"num_experts": 8, "top_k": 2, "intermediate_size": 14336, "norm_topk_prob": True}},
    "tiny-moe": {"architecture": "qwen3_moe", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
                 "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "max_position_embeddings": 4096,
                 "rope_theta": 1000000.0, "qk_norm": True,
                 "moe": {"num_experts": 8, "top_k": 2, "intermediate_size": 128, "norm_topk_prob": True}},
}


class NullTokenizer:
    """Random-weight models have no vocabulary worth decoding; the engine only needs these."""

    def __init__(self) -> None:
        self.eos_token_ids: set[int] = set()

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""


def shape_config(shape: str):
    """The ModelConfig of SHAPES[shape]."""
    from samebits.models.config import ModelConfig
    from samebits.models.moe_config import MoeConfig

    fields = dict(SHAPES[shape])
    moe = fields.pop("moe", None)
    return ModelConfig(**fields, moe=MoeConfig(**moe) if moe else None)


def random_shape_model(shape: str, device: str, quantization: str | None = None):
    """A LoadedModel of SHAPES[shape] with N(0, 0.02) weights, in the device's serving dtype (bf16 on CUDA, fp32 on
    the CPU), on fast ops until an engine sets its mode's; with `quantization` ("fp8", "fp8_per_tensor") its
    linears quantised as `--quantization` does at load (models/quantization.py)."""
    from samebits.kernels import get_ops
    from samebits.models.loader import LoadedModel, resolve_dtype
    from samebits.models.quantization import quantize_dense
    from samebits.models.synthetic import random_model

    config = shape_config(shape)
    model = random_model(config, get_ops("fast", device), resolve_dtype(None, device), seed=0)
    if quantization is not None:
        model = quantize_dense(model, quantization)
    name = f"random-{shape}" + (f"-{quantization}" if quantization else "")
    return LoadedModel(model, NullTokenizer(), config, name, Path("."))
