"""Which model class computes a config: the Llama-family transformer, or its mixture-of-experts form."""
from __future__ import annotations

import torch

from samebits.models.config import ModelConfig
from samebits.models.llama import LlamaModel


def model_class(config: ModelConfig) -> type[LlamaModel]:
    if config.moe is None:
        return LlamaModel
    from samebits.models.moe import MoeModel

    return MoeModel


def build_model(config: ModelConfig, ops, dtype: torch.dtype = torch.float32) -> LlamaModel:
    """An empty model of `config` on ops.device (weights uninitialised until load_weights)."""
    return model_class(config)(config, ops, dtype)
