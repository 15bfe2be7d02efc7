"""ModelConfig: the one description of a Llama-family model, from an HF config.json or from GGUF metadata.

Everything the transformer needs is here and validated once; anything a checkpoint asks for that the model does not
implement fails at load with its name, instead of silently computing something else.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from samebits.models.moe_config import MOE_TYPES, MoeConfig, UnsupportedMoeError, moe_from_gguf, moe_from_hf

# HF model_type -> the architectures (class names) we accept for it.
SUPPORTED = {
    "llama": ("LlamaForCausalLM",),
    "mistral": ("MistralForCausalLM",),
    "qwen2": ("Qwen2ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
    "qwen3_moe": ("Qwen3MoeForCausalLM",),
    "qwen2_moe": ("Qwen2MoeForCausalLM",),
    "mixtral": ("MixtralForCausalLM",),
}
# quantization_config methods the loader reads (models/quantization.py: FP8 only).
QUANT_METHODS = ("fp8", "compressed-tensors")
# llama.cpp names; Mistral, SmolLM2 and Mixtral files say "llama"
GGUF_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe")
_GGUF_MODEL_TYPES = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe"}  # llama with experts: mixtral
ROPE_TYPES = ("default", "llama3")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


class UnsupportedModelError(ValueError):
    """The checkpoint asks for an architecture or feature this model does not implement."""


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"invalid model config: {message}")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # HF model_type: llama | mistral | qwen2 | qwen3 | qwen3_moe | qwen2_moe | mixtral
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # HF llama3 rope_scaling dict (rope_type + LLAMA3_ROPE_KEYS), or None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    moe: MoeConfig | None = None  # experts, routing and which layers are sparse (models/moe_config.py)

    def __post_init__(self):
        if self.architecture not in SUPPORTED:
            raise UnsupportedModelError(f"unsupported architecture {self.architecture!r}; supported: {sorted(SUPPORTED)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value > 0, f"{name} must be a positive int, got {value!r}")
        _require(self.num_heads % self.num_kv_heads == 0,
                 f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        _require(self.head_dim % 2 == 0, f"head_dim must be even for RoPE, got {self.head_dim}")
        _require(self.rms_norm_eps > 0 and self.rope_theta > 0, "rms_norm_eps and rope_theta must be positive")
        _check_rope_scaling(self.rope_scaling)
        _require(isinstance(self.eos_token_ids, tuple), "eos_token_ids must be a tuple")
        _require((self.moe is not None) == (self.architecture in MOE_TYPES),
                 f"architecture {self.architecture!r} {'needs' if self.moe is None else 'takes no'} MoE config")

    def hashed_fields(self) -> dict:
        """The config as the fingerprint hashes it: a dense model's without the `moe` field, so dense models keep the
        hash they had before MoE models existed."""
        fields = asdict(self)
        if self.moe is None:
            del fields["moe"]
        return fields

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        """From an HF config.json dict (transformers 4.x `rope_theta`/`rope_scaling` or 5.x `rope_parameters`)."""
        model_type = _hf_model_type(cfg)
        _reject_hf_features(cfg, model_type)
        try:
            moe = moe_from_hf(cfg, model_type)
        except UnsupportedMoeError as e:
            raise UnsupportedModelError(str(e)) from None
        heads = cfg["num_attention_heads"]
        theta, scaling = _hf_rope(cfg)
        return cls(
            architecture=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=_hf_max_positions(cfg),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=_hf_qkv_bias(cfg, model_type),
            o_bias=_hf_attention_bias(cfg, model_type),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_as_ids(cfg.get("eos_token_id")),
            moe=moe,
        )

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], vocab_size: int, tied: bool) -> ModelConfig:
        """From GGUF metadata (plain key -> value); vocab size and tying come from the tensors, not the metadata."""
        arch = check_gguf_architecture(meta)
        heads = meta[f"{arch}.attention.head_count"]
        hidden = meta[f"{arch}.embedding_length"]
        try:
            moe = moe_from_gguf(meta, arch)
        except UnsupportedMoeError as e:
            raise UnsupportedModelError(str(e)) from None
        return cls(
            architecture=_GGUF_MODEL_TYPES.get(arch, "mixtral" if moe else arch),
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=meta[f"{arch}.feed_forward_length"],
            num_layers=meta[f"{arch}.block_count"],
            num_heads=heads,
            num_kv_heads=meta.get(f"{arch}.attention.head_count_kv", heads),
            head_dim=meta.get(f"{arch}.attention.key_length", hidden // heads),
            max_position_embeddings=meta[f"{arch}.context_length"],
            rms_norm_eps=float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
            rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            tie_word_embeddings=tied,
            qkv_bias=arch in ("qwen2", "qwen2moe"),
            qk_norm=arch in ("qwen3", "qwen3moe"),
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=_as_ids(meta.get("tokenizer.ggml.eos_token_id")),
            moe=moe,
        )


def check_gguf_architecture(meta: Mapping[str, Any]) -> str:
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHS:
        raise UnsupportedModelError(f"unsupported GGUF architecture {arch!r}; supported: {list(GGUF_ARCHS)}")
    _reject_gguf_features(meta, arch)
    return arch


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


def _check_rope_scaling(scaling: dict | None) -> None:
    if scaling is None:
        return
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        raise UnsupportedModelError(f"unsupported rope scaling type {kind!r}; supported: {list(ROPE_TYPES)}")
    missing = [k for k in LLAMA3_ROPE_KEYS if k not in scaling]
    _require(not missing, f"llama3 rope scaling lacks {missing}")


def _hf_model_type(cfg: Mapping[str, Any]) -> str:
    model_type = cfg.get("model_type")
    archs = cfg.get("architectures") or []
    if model_type not in SUPPORTED:
        raise UnsupportedModelError(
            f"unsupported architecture {model_type!r} ({', '.join(archs) or 'no architectures listed'}); "
            f"supported model types: {sorted(SUPPORTED)}")
    unknown = [a for a in archs if a not in SUPPORTED[model_type]]
    if unknown:
        raise UnsupportedModelError(f"unsupported architecture {unknown[0]!r} for model_type {model_type!r}; "
                                    f"supported: {list(SUPPORTED[model_type])}")
    return model_type


def _reject_hf_features(cfg: Mapping[str, Any], model_type: str) -> None:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"unsupported feature hidden_act={act!r}; only 'silu' is implemented")
    if cfg.get("mlp_bias"):
        raise UnsupportedModelError("unsupported feature mlp_bias=true")
    method = (cfg.get("quantization_config") or {}).get("quant_method", "?")
    if cfg.get("quantization_config") and method not in QUANT_METHODS:
        raise UnsupportedModelError(f"unsupported feature quantization_config (quant_method={method!r}); supported: "
                                    f"{', '.join(QUANT_METHODS)} (FP8)")


def _hf_attention_bias(cfg: Mapping[str, Any], model_type: str) -> bool:
    """Llama and Qwen3(-MoE) read `attention_bias` for q/k/v/o; Qwen2 hard-codes q/k/v bias, Qwen2-MoE reads
    `qkv_bias` (default on); Mistral and Mixtral have none."""
    return model_type in ("llama", "qwen3", "qwen3_moe") and bool(cfg.get("attention_bias", False))


def _hf_qkv_bias(cfg: Mapping[str, Any], model_type: str) -> bool:
    if model_type == "qwen2_moe":
        return bool(cfg.get("qkv_bias", True))
    return model_type == "qwen2" or _hf_attention_bias(cfg, model_type)


def _hf_rope(cfg: Mapping[str, Any]) -> tuple[float, dict | None]:
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling")
    if scaling is not None:
        params = {**params, **scaling}
    theta = params.pop("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise UnsupportedModelError(f"unsupported rope scaling type {kind!r}; supported: {list(ROPE_TYPES)}")
    return theta, (params if kind == "llama3" else None)


def _hf_max_positions(cfg: Mapping[str, Any]) -> int:
    """Attention here is full causal: cap the context at a sliding window so the window never comes into play."""
    limit = cfg["max_position_embeddings"]
    window = cfg.get("sliding_window")
    uses_window = cfg.get("use_sliding_window", cfg.get("model_type") in ("mistral", "mixtral"))
    if uses_window and window:
        limit = min(limit, window)
    return limit


def _reject_gguf_features(meta: Mapping[str, Any], arch: str) -> None:
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind not in ("none", "linear") or (kind == "linear" and meta.get(f"{arch}.rope.scaling.factor", 1.0) != 1.0):
        raise UnsupportedModelError(f"unsupported GGUF feature rope scaling type {kind!r}")
    heads, hidden = meta.get(f"{arch}.attention.head_count", 1), meta.get(f"{arch}.embedding_length", 0)
    head_dim = meta.get(f"{arch}.attention.key_length", hidden // heads)
    rotary = meta.get(f"{arch}.rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise UnsupportedModelError(f"unsupported GGUF feature: partial rotary (rope dims {rotary} of head_dim {head_dim})")
    if arch in _GGUF_MODEL_TYPES and not meta.get(f"{arch}.expert_count", 0):
        raise UnsupportedModelError(f"GGUF architecture {arch!r} without {arch}.expert_count")
