"""One Llama-family transformer (Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM2), every op through the kernel registry.

Tokens arrive flattened across sequences (`input_ids[T]`, `positions[T]`); the paged KV cache and `meta` say which
sequence each token belongs to. Nothing here reduces over a batch dimension itself, so batch invariance is exactly
that of the `Ops` it runs on. Q/K/V and gate/up are stored fused: one matmul each, same math per output column.
Grad mode is the caller's: the engine runs the forward under inference mode (engine/model_runner.py), the RL trainer
with autograd, on ops whose forward is this table's and whose backward is its own (rl/train_ops.py).
"""
from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import torch
from torch import nn

from samebits.kernels.ops import OpSet
from samebits.models.config import ModelConfig

# HF checkpoint name suffix -> (our parameter, which rows of it)
_LAYER_PARAMS = {
    "input_layernorm.weight": ("input_norm", None),
    "post_attention_layernorm.weight": ("post_norm", None),
    "self_attn.q_proj.weight": ("qkv_proj", "q"),
    "self_attn.k_proj.weight": ("qkv_proj", "k"),
    "self_attn.v_proj.weight": ("qkv_proj", "v"),
    "self_attn.q_proj.bias": ("qkv_bias", "q"),
    "self_attn.k_proj.bias": ("qkv_bias", "k"),
    "self_attn.v_proj.bias": ("qkv_bias", "v"),
    "self_attn.o_proj.weight": ("o_proj", None),
    "self_attn.o_proj.bias": ("o_bias", None),
    "self_attn.q_norm.weight": ("q_norm", None),
    "self_attn.k_norm.weight": ("k_norm", None),
    "mlp.gate_proj.weight": ("gate_up_proj", "gate"),
    "mlp.up_proj.weight": ("gate_up_proj", "up"),
    "mlp.down_proj.weight": ("down_proj", None),
}
_BIASES = {"qkv_proj": "qkv_bias", "o_proj": "o_bias"}
_TOP_PARAMS = {"model.embed_tokens.weight": "embed_tokens", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")
# Buffers some checkpoints carry that hold nothing we need (recomputed from the config).
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


def _empty(shape, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device, dense_mlp: bool = True):
        super().__init__()
        h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
        qkv = cfg.q_size + 2 * cfg.kv_size
        self.input_norm = _empty((h,), dtype, device)
        self.qkv_proj = _empty((qkv, h), dtype, device)
        self.register_parameter("qkv_bias", _empty((qkv,), dtype, device) if cfg.qkv_bias else None)
        self.o_proj = _empty((h, cfg.q_size), dtype, device)
        self.register_parameter("o_bias", _empty((h,), dtype, device) if cfg.o_bias else None)
        self.register_parameter("q_norm", _empty((d,), dtype, device) if cfg.qk_norm else None)
        self.register_parameter("k_norm", _empty((d,), dtype, device) if cfg.qk_norm else None)
        self.post_norm = _empty((h,), dtype, device)
        if dense_mlp:  # else the layer's MLP is a mixture of experts (models/moe.py)
            self.gate_up_proj = _empty((2 * i, h), dtype, device)
            self.down_proj = _empty((h, i), dtype, device)


class LlamaModel(nn.Module):
    recipe = None  # the FP8 recipe of the decoder's linears (models/fp8.py Fp8LlamaModel); None: dense
    # The RL trainer's activation checkpointing (rl/policy.py): each layer's forward runs again in the backward instead
    # of keeping its activations. The engine never sets it.
    checkpoint_layers = False

    def __init__(self, config: ModelConfig, ops: OpSet, dtype: torch.dtype = torch.float32, layer=DecoderLayer):
        """`layer(config, dtype, device)`: one decoder layer's parameters (an FP8 model's own, models/fp8.py)."""
        super().__init__()
        self.config = config
        self.ops = ops
        device = ops.device
        self.embed_tokens = _empty((config.vocab_size, config.hidden_size), dtype, device)
        self.layers = nn.ModuleList(self._make_layer(i, layer, dtype, device) for i in range(config.num_layers))
        self.norm = _empty((config.hidden_size,), dtype, device)
        tied = config.tie_word_embeddings
        self.register_parameter("lm_head", None if tied else _empty((config.vocab_size, config.hidden_size), dtype, device))
        self.register_buffer("cos_sin", _rope_table(config, device), persistent=False)

    def _make_layer(self, index: int, layer, dtype: torch.dtype, device) -> DecoderLayer:
        """Layer `index`: `layer`'s (models/moe.py makes a sparse layer's MLP its experts)."""
        return layer(self.config, dtype, device)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    def set_ops(self, ops: OpSet) -> None:
        """Switch kernels (fast <-> deterministic) without reloading; the ops must live on the weights' device."""
        if torch.device(ops.device).type != self.device.type:
            raise ValueError(f"ops are for {ops.device} but the model is on {self.device}")
        self.ops = ops

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches, meta) -> torch.Tensor:
        hidden = self.embed_tokens[input_ids]
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            # The caches are bound, not arguments: a checkpoint saves its tensor arguments, and the layer writes its
            # keys and values into them.
            run = functools.partial(self._layer, layer, k_cache, v_cache, positions, meta)
            if self.checkpoint_layers and torch.is_grad_enabled():
                from torch.utils.checkpoint import checkpoint

                hidden, residual = checkpoint(run, hidden, residual, use_reentrant=False, preserve_rng_state=False)
            else:
                hidden, residual = run(hidden, residual)
        normed, _ = self.ops.add_rms_norm(hidden, residual, self.norm, self.config.rms_norm_eps)
        return normed

    def _layer(self, layer: DecoderLayer, k_cache, v_cache, positions, meta, hidden, residual):
        """One decoder layer -> (its output, the residual stream before its MLP)."""
        x, residual = self._pre_norm(hidden, residual, layer.input_norm)
        hidden = self._attention(layer, x, positions, k_cache, v_cache, meta)
        x, residual = self._pre_norm(hidden, residual, layer.post_norm)
        return self._mlp(layer, x), residual

    def gemm_weights(self) -> list[torch.Tensor]:
        """One [N, K] weight per GEMM shape the forward runs: what the proven routes' self-tests must cover."""
        return [p for p in self.parameters() if p.dim() == 2]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return self.ops.linear(hidden, head).float()

    def _pre_norm(self, hidden, residual, weight):
        """Returns (normed input of the next block, residual stream including `hidden`)."""
        eps = self.config.rms_norm_eps
        if residual is None:
            return self.ops.rms_norm(hidden, weight, eps), hidden
        return self.ops.add_rms_norm(hidden, residual, weight, eps)

    def _attention(self, layer: DecoderLayer, x, positions, k_cache, v_cache, meta):
        cfg, ops = self.config, self.ops
        t, d = x.shape[0], cfg.head_dim
        qkv = self._linear(layer, "qkv_proj", x)
        # Views into qkv, not copies: rope_write_kv reads strided rows, writes a new q and the rotated k and v straight
        # into the cache (its launcher asserts what it needs), so no layer launches the 3 copy kernels.
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q, k, v = q.view(t, cfg.num_heads, d), k.view(t, cfg.num_kv_heads, d), v.view(t, cfg.num_kv_heads, d)
        if cfg.qk_norm:
            q, k = self._head_norm(q, layer.q_norm), self._head_norm(k, layer.k_norm)
        q = ops.rope_write_kv(q, k, v, positions, self.cos_sin, k_cache, v_cache, meta.slot_mapping)
        out = ops.attention(q, k_cache, v_cache, meta, d ** -0.5)
        return self._linear(layer, "o_proj", out.reshape(t, cfg.q_size))

    def _head_norm(self, x, weight):
        """Qwen3's per-head RMSNorm over head_dim, before RoPE."""
        t, heads, d = x.shape
        return self.ops.rms_norm(x.reshape(t * heads, d), weight, self.config.rms_norm_eps).reshape(t, heads, d)

    def _mlp(self, layer: DecoderLayer, x):
        gate_up = self._linear(layer, "gate_up_proj", x)
        return self._linear(layer, "down_proj", self.ops.silu_and_mul(gate_up))

    def _linear(self, layer: DecoderLayer, name: str, x):
        """The layer's linear `name` (qkv_proj, o_proj, gate_up_proj, down_proj) with its bias; the one seam tensor
        parallelism overrides to run it on shards (samebits/distributed/model.py)."""
        bias = getattr(layer, _BIASES[name]) if name in _BIASES else None
        return self.ops.linear(x, getattr(layer, name), bias)

    # ---- weights -------------------------------------------------------------------------------------------------

    @staticmethod
    def expected_weight_names_for(config: ModelConfig) -> set[str]:
        """The HF checkpoint names this config needs, exactly."""
        absent = set() if config.qkv_bias else {"q_proj.bias", "k_proj.bias", "v_proj.bias"}
        absent |= set() if config.o_bias else {"o_proj.bias"}
        absent |= set() if config.qk_norm else {"q_norm.weight", "k_norm.weight"}
        suffixes = [s for s in _LAYER_PARAMS if s.split(".", 1)[-1] not in absent]
        names = {f"model.layers.{i}.{s}" for i in range(config.num_layers) for s in suffixes}
        top = [n for n in _TOP_PARAMS if not (n == "lm_head.weight" and config.tie_word_embeddings)]
        return names | set(top)

    def expected_weight_names(self) -> set[str]:
        return self.expected_weight_names_for(self.config)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors in (cast to the model dtype); fail naming every missing or unexpected tensor."""
        expected = self.expected_weight_names()
        seen, unexpected = set(), []
        for name, tensor in self.hf_named(weights):
            if name in expected:
                self._copy_in(name, tensor)
                seen.add(name)
            elif not self.ignorable(name):
                unexpected.append(name)
        missing = sorted(expected - seen)
        if missing or unexpected:
            raise ValueError(f"checkpoint does not match the {self.config.architecture} config: "
                             f"missing {short_names(missing)}, unexpected {short_names(sorted(unexpected))}")

    def hf_named(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
        """The tensors under the names `expected_weight_names` uses (models/moe.py splits stacked experts)."""
        return weights

    def ignorable(self, name: str) -> bool:
        # Tied checkpoints sometimes still store lm_head; the model uses the embedding either way.
        return bool(_IGNORED.match(name)) or (name == "lm_head.weight" and self.lm_head is None)

    def _copy_in(self, name: str, tensor: torch.Tensor) -> None:
        dest = self.destination(name)
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ValueError(f"tensor {name} has shape {tuple(tensor.shape)}, the config implies {tuple(dest.shape)}")
        dest.copy_(tensor)

    def destination(self, name: str) -> torch.Tensor:
        """The rows of our (fused) parameter that the HF tensor `name` fills, as a view to copy into."""
        param, rows = self._target(name)
        return param.data if rows is None else param.data[rows]

    def _target(self, name: str) -> tuple[nn.Parameter, slice | None]:
        if name in _TOP_PARAMS:
            return getattr(self, _TOP_PARAMS[name]), None
        index, suffix = _LAYER_NAME.match(name).groups()
        attr, part = _LAYER_PARAMS[suffix]
        return getattr(self.layers[int(index)], attr), self._rows(part)

    def _rows(self, part: str | None) -> slice | None:
        cfg = self.config
        q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
        return {None: None, "q": slice(0, q), "k": slice(q, q + kv), "v": slice(q + kv, q + 2 * kv),
                "gate": slice(0, inter), "up": slice(inter, 2 * inter)}[part]


def short_names(names: list[str], limit: int = 6) -> str:
    if not names:
        return "none"
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _rope_table(config: ModelConfig, device) -> torch.Tensor:
    from samebits.models.rope_scaling import rope_cos_sin

    return rope_cos_sin(config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling, device)
