"""MoeConfig: the mixture-of-experts part of a model config (Qwen3-MoE, Qwen2-MoE, Mixtral), read from config.json or
GGUF metadata, and every MoE feature the model does not implement refused by the key that asks for it.

Routing as HF computes it for these families: router logits, a float32 softmax over all experts, the top k, the k
weights renormalised to sum to one where `norm_topk_prob` (always for Mixtral). A layer is sparse unless listed in
`mlp_only_layers` or off the `decoder_sparse_step` grid (Qwen); a dense layer runs the Llama MLP of `intermediate_size`.
Qwen2-MoE adds one shared expert per sparse layer, gated by sigmoid(a linear of the hidden state).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SCORING = ("softmax",)  # the router's score function: softmax over all experts (no sigmoid/grouped routing)
MOE_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral")
# HF config keys of MoE features other families use (DeepSeek, GLM, ...): accepted only at their neutral value, so a
# config that asks for one is refused by name instead of computing another model. key -> the neutral values.
NEUTRAL = {
    "scoring_func": (None, "softmax"),
    "topk_method": (None, "greedy"),
    "n_group": (None, 1),
    "topk_group": (None, 1),
    "routed_scaling_factor": (None, 1, 1.0),
    "n_shared_experts": (None, 0),
    "ep_size": (None, 1),  # expert parallelism: every expert lives on the one device here
    "moe_layer_freq": (None, 1),
    "first_k_dense_replace": (None, 0),
    "router_bias": (None, False),
}


class UnsupportedMoeError(ValueError):
    """An MoE feature this model does not implement (models/config.py re-raises it as UnsupportedModelError)."""


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"invalid MoE config: {message}")


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int  # HF num_experts_per_tok
    intermediate_size: int  # of one expert (HF moe_intermediate_size; Mixtral's intermediate_size)
    norm_topk_prob: bool
    dense_layers: tuple[int, ...] = ()  # layers that run the dense MLP instead (Qwen mlp_only_layers / sparse step)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's gated shared expert; 0: none
    scoring: str = "softmax"

    def __post_init__(self):
        for name in ("num_experts", "top_k", "intermediate_size"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value > 0, f"{name} must be a positive int, got {value!r}")
        _require(self.top_k <= self.num_experts,
                 f"num_experts_per_tok ({self.top_k}) must be at most num_experts ({self.num_experts})")
        _require(isinstance(self.shared_expert_intermediate_size, int) and self.shared_expert_intermediate_size >= 0,
                 f"shared_expert_intermediate_size must be an int >= 0, got {self.shared_expert_intermediate_size!r}")
        _require(isinstance(self.dense_layers, tuple), "dense_layers must be a tuple")
        if self.scoring not in SCORING:
            raise UnsupportedMoeError(f"unsupported MoE feature scoring_func={self.scoring!r}; supported: {SCORING}")

    def is_sparse(self, layer: int) -> bool:
        return layer not in self.dense_layers


def moe_from_hf(cfg: Mapping[str, Any], model_type: str) -> MoeConfig | None:
    """The MoE part of an HF config.json dict, None for a dense family."""
    if model_type not in MOE_TYPES:
        return None
    for key, neutral in NEUTRAL.items():
        if cfg.get(key) not in neutral:
            raise UnsupportedMoeError(f"unsupported MoE feature {key}={cfg[key]!r}; implemented: {neutral[-1]!r}")
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")  # transformers 5 writes Qwen's as the latter
    if model_type == "mixtral":
        return MoeConfig(experts, cfg["num_experts_per_tok"], cfg["intermediate_size"], True)
    layers = cfg["num_hidden_layers"]
    return MoeConfig(experts, cfg["num_experts_per_tok"], cfg["moe_intermediate_size"],
                     bool(cfg.get("norm_topk_prob", False)),
                     _qwen_dense_layers(layers, cfg.get("mlp_only_layers") or [], cfg.get("decoder_sparse_step", 1)),
                     int(cfg.get("shared_expert_intermediate_size") or 0) if model_type == "qwen2_moe" else 0)


def _qwen_dense_layers(layers: int, mlp_only: list[int], step: int) -> tuple[int, ...]:
    """HF's rule (Qwen2MoeDecoderLayer): sparse where not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0."""
    _require(isinstance(step, int) and step >= 1, f"decoder_sparse_step must be an int >= 1, got {step!r}")
    return tuple(i for i in range(layers) if i in mlp_only or (i + 1) % step)


def moe_from_gguf(meta: Mapping[str, Any], arch: str) -> MoeConfig | None:
    """llama.cpp's metadata: qwen3moe and qwen2moe, and Mixtral (arch llama with experts). llama.cpp renormalises the
    top k for qwen3moe and llama, not for qwen2moe (its build_moe_ffn calls), as HF does."""
    experts = meta.get(f"{arch}.expert_count", 0)
    if not experts:
        return None
    gating = meta.get(f"{arch}.expert_gating_func", 1)  # llama.cpp: 1 softmax, 2 sigmoid
    if gating != 1:
        raise UnsupportedMoeError(f"unsupported GGUF MoE feature {arch}.expert_gating_func={gating} (1 = softmax is "
                                  "implemented)")
    for key, neutral in (("expert_weights_scale", (1, 1.0)), ("expert_group_count", (0, 1)),
                         ("expert_shared_count", (0, 1))):
        value = meta.get(f"{arch}.{key}", neutral[0])
        if value not in neutral:
            raise UnsupportedMoeError(f"unsupported GGUF MoE feature {arch}.{key}={value!r}")
    inter = meta.get(f"{arch}.expert_feed_forward_length") or meta[f"{arch}.feed_forward_length"]
    shared = meta.get(f"{arch}.expert_shared_feed_forward_length", 0) if arch == "qwen2moe" else 0
    return MoeConfig(experts, meta[f"{arch}.expert_used_count"], inter,
                     bool(meta.get(f"{arch}.expert_weights_norm", arch != "qwen2moe")),
                     shared_expert_intermediate_size=shared)
