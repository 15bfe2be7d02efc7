"""Mixture-of-experts transformers (Qwen3-MoE, Qwen2-MoE, Mixtral): the Llama-family model of models/llama.py with a
sparse MLP in place of the dense one, every op through the kernel registry (docs/MOE.md).

A sparse MLP routes each token alone: router logits through the invariant linear, a float32 softmax (one row per
program), the top k by `ops.moe_topk` (ties to the lower expert index), the k weights renormalised in rank order
(kernels/moe.py), then `ops.moe_experts`, whose per-token result never depends on how many other tokens chose the
same experts and which folds the k outputs in rank order. Experts are stored stacked, [E, 2I, H] (gate | up rows) and
[E, H, I], so one kernel reads every expert of a layer.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

from samebits.kernels import moe as moe_math
from samebits.models.config import ModelConfig
from samebits.models.llama import _LAYER_NAME, _LAYER_PARAMS, DecoderLayer, LlamaModel, _empty

# HF spellings of a sparse layer's tensors: (router, expert prefix, gate, up, down).
_SPELLING = {
    "qwen": ("mlp.gate.weight", "mlp.experts", "gate_proj", "up_proj", "down_proj"),
    "mixtral": ("block_sparse_moe.gate.weight", "block_sparse_moe.experts", "w1", "w3", "w2"),
}
_SHARED = {"mlp.shared_expert.gate_proj.weight": ("shared_gate_up", "gate"),
           "mlp.shared_expert.up_proj.weight": ("shared_gate_up", "up"),
           "mlp.shared_expert.down_proj.weight": ("shared_down", None),
           "mlp.shared_expert_gate.weight": ("shared_gate", None)}
_DENSE_MLP = tuple(s for s in _LAYER_PARAMS if s.startswith("mlp."))
# A layer's experts stacked in one tensor, split here per expert: GGUF's ffn_*_exps (named by loader_gguf.py), and
# transformers 5's in-memory experts (a module's state_dict: gate_up_proj [E, 2I, H], gate rows first; down_proj).
_STACKED = re.compile(r"mlp\.experts\.(gate_proj|up_proj|down_proj)\.weight")
_FUSED = re.compile(r"mlp\.experts\.(gate_up_proj|down_proj)")
_EXPERT = re.compile(r"(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight")


def _spelling(config: ModelConfig) -> tuple[str, ...]:
    return _SPELLING["mixtral" if config.architecture == "mixtral" else "qwen"]


class MoeDecoderLayer(DecoderLayer):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device):
        super().__init__(cfg, dtype, device, dense_mlp=False)
        moe, h = cfg.moe, cfg.hidden_size
        e, i, s = moe.num_experts, moe.intermediate_size, moe.shared_expert_intermediate_size
        self.router = _empty((e, h), dtype, device)
        self.experts_gate_up = _empty((e, 2 * i, h), dtype, device)
        self.experts_down = _empty((e, h, i), dtype, device)
        for name, shape in (("shared_gate_up", (2 * s, h)), ("shared_down", (h, s)), ("shared_gate", (1, h))):
            self.register_parameter(name, _empty(shape, dtype, device) if s else None)


class MoeModel(LlamaModel):
    def _make_layer(self, index: int, layer, dtype: torch.dtype, device) -> DecoderLayer:
        if self.config.moe.is_sparse(index):
            return MoeDecoderLayer(self.config, dtype, device)
        return super()._make_layer(index, layer, dtype, device)

    def _mlp(self, layer: DecoderLayer, x):
        if not isinstance(layer, MoeDecoderLayer):
            return super()._mlp(layer, x)
        moe, ops = self.config.moe, self.ops
        probs = ops.softmax(ops.linear(x, layer.router))  # float32 [T, E], HF's softmax(logits, dtype=float)
        ids = ops.moe_topk(probs, moe.top_k)
        weights = moe_math.topk_weights(probs, ids, moe.norm_topk_prob)
        out = ops.moe_experts(x, layer.experts_gate_up, layer.experts_down, ids, weights)
        if layer.shared_gate_up is None:
            return out
        shared = ops.linear(ops.silu_and_mul(ops.linear(x, layer.shared_gate_up)), layer.shared_down)
        return out + moe_math.shared_gate(ops.linear(x, layer.shared_gate)) * shared

    def gemm_weights(self) -> list[torch.Tensor]:
        """The 2-D weights and one expert of each sparse layer: the per-expert GEMM shapes of the CPU route."""
        out = super().gemm_weights()
        for layer in self.layers:
            if isinstance(layer, MoeDecoderLayer):
                out += [layer.experts_gate_up[0], layer.experts_down[0]]
        return out

    # ---- weights -------------------------------------------------------------------------------------------------

    @staticmethod
    def expected_weight_names_for(config: ModelConfig) -> set[str]:
        names = LlamaModel.expected_weight_names_for(config)
        moe = config.moe
        router, prefix, *parts = _spelling(config)
        for i in range(config.num_layers):
            if not moe.is_sparse(i):
                continue
            layer = f"model.layers.{i}."
            names -= {layer + s for s in _DENSE_MLP}
            names.add(layer + router)
            names |= {f"{layer}{prefix}.{e}.{p}.weight" for e in range(moe.num_experts) for p in parts}
            if moe.shared_expert_intermediate_size:
                names |= {layer + s for s in _SHARED}
        return names

    def hf_named(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """HF names as the family spells them: stacked experts split into one tensor per expert, the qwen-spelled
        router of a GGUF Mixtral respelled, a 1-D shared-expert gate made [1, H]."""
        router, prefix, *parts = _spelling(self.config)
        spelled = dict(zip(_SPELLING["qwen"][2:], parts))
        for name, tensor in weights:
            match = _LAYER_NAME.fullmatch(name)
            suffix = match.group(2) if match else ""
            stacked = _STACKED.fullmatch(suffix) or _FUSED.fullmatch(suffix)
            if stacked and tensor.dim() == 3:
                base = f"model.layers.{match.group(1)}.{prefix}"
                halves = {"gate_up_proj": ("gate_proj", "up_proj")}.get(stacked.group(1), (stacked.group(1),))
                for part, t in zip(halves, tensor.chunk(len(halves), dim=1), strict=True):
                    yield from ((f"{base}.{e}.{spelled[part]}.weight", w) for e, w in enumerate(t))
            elif suffix == _SPELLING["qwen"][0]:
                yield f"model.layers.{match.group(1)}.{router}", tensor
            elif suffix == "mlp.shared_expert_gate.weight" and tensor.dim() == 1:
                yield name, tensor[None]
            else:
                yield name, tensor

    def _target(self, name: str):
        match = _LAYER_NAME.fullmatch(name)
        layer = self.layers[int(match.group(1))] if match else None
        if not isinstance(layer, MoeDecoderLayer):
            return super()._target(name)
        suffix = match.group(2)
        router, _, gate, up, down = _spelling(self.config)
        if suffix == router:
            return layer.router, None
        if suffix in _SHARED:
            attr, part = _SHARED[suffix]
            return getattr(layer, attr), self._halves(self.config.moe.shared_expert_intermediate_size, part)
        expert = _EXPERT.fullmatch(suffix)
        if expert is None:
            return super()._target(name)
        e, part = int(expert.group(1)), expert.group(2)
        if part == down:
            return layer.experts_down, e
        half = {gate: "gate", up: "up"}[part]
        return layer.experts_gate_up, (e, self._halves(self.config.moe.intermediate_size, half))

    @staticmethod
    def _halves(inter: int, part: str | None) -> slice | None:
        return {None: None, "gate": slice(0, inter), "up": slice(inter, 2 * inter)}[part]
