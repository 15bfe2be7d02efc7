"""A Llama-family model whose decoder linears are FP8 (e4m3) with their scales; everything else stays in the model
dtype (embeddings, norms, biases, the head), as in the FP8 checkpoints users have.

Each quantised linear `name` (qkv_proj, o_proj, gate_up_proj, down_proj) of a layer holds `name` [N, K] e4m3,
`name_scale` (kernels/fp8.py `scale_shape`: [N], or one per 128x128 block) and, with static activations,
`name_input_scale` [parts] (q, k, v each bring their own; the linear uses their max, as vLLM does). Weights load by
the HF names the dense model takes, plus `<hf linear>.weight_scale` and `.input_scale` (models/quantization.py puts
a checkpoint's tensors in these names). Every linear runs `ops.linear_fp8` with the model's one recipe.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from samebits.kernels.fp8 import FP8, PER_TENSOR_REFUSAL, Fp8Recipe, scale_shape
from samebits.models.config import ModelConfig, UnsupportedModelError
from samebits.models.llama import _BIASES, _LAYER_NAME, _LAYER_PARAMS, DecoderLayer, LlamaModel

QUANTISED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
_PARTS = {"qkv_proj": ("q", "k", "v"), "gate_up_proj": ("gate", "up"), "o_proj": (None,), "down_proj": (None,)}
# HF suffixes of the quantised linears' weights (self_attn.q_proj.weight, ...), and the scale tensors' suffixes.
LINEAR_WEIGHTS = tuple(s for s, (attr, _) in _LAYER_PARAMS.items() if attr in QUANTISED and s.endswith(".weight"))
# A linear's scale tensors by HF name: self_attn.q_proj.weight -> self_attn.q_proj.weight_scale, .input_scale.
WEIGHT_SCALE, INPUT_SCALE = ".weight_scale", ".input_scale"


def _param(shape, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def is_linear_weight(name: str) -> bool:
    """Is the HF tensor `name` a decoder linear's weight (what an FP8 model holds in e4m3)?"""
    m = _LAYER_NAME.match(name)
    return m is not None and m.group(2) in LINEAR_WEIGHTS


class Fp8DecoderLayer(DecoderLayer):
    """DecoderLayer's parameters, its four linears in e4m3 with their scales."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device, recipe: Fp8Recipe):
        super().__init__(cfg, dtype, "meta")  # the dense layer's shapes, nothing allocated
        for name, p in list(self.named_parameters(recurse=False)):
            if name not in QUANTISED:
                setattr(self, name, _param(p.shape, dtype, device))
                continue
            n, k = p.shape
            setattr(self, name, _param((n, k), FP8, device))
            setattr(self, name + "_scale", _param(scale_shape(recipe, n, k), torch.float32, device))
            if recipe.activations == "static":
                setattr(self, name + "_input_scale", _param((len(_PARTS[name]),), torch.float32, device))
                # What the linear runs with, set after loading: the parts' largest input scale, and the weight scale
                # folded with it (kernels/fp8.py: static activations take the folded scale). Derived, so not weights.
                self.register_buffer(name + "_act_scale", torch.empty(1, device=device), persistent=False)
                self.register_buffer(name + "_out_scale", torch.empty(n, device=device), persistent=False)


def check_layout(config: ModelConfig, recipe: Fp8Recipe) -> None:
    """Block scales of fused linears split at part boundaries only: each part a whole number of blocks (vLLM's
    requirement too). A mixture of experts has no FP8 form here (its experts are models/moe.py's)."""
    if config.moe is not None:
        raise UnsupportedModelError(f"FP8 (quantization_config or --quantization) of a mixture of experts "
                                    f"({config.architecture}) is not implemented; load its bf16 checkpoint")
    if recipe.weights != "block":
        return
    rows = recipe.block[0]
    for what, size in (("q size (heads x head_dim)", config.q_size), ("kv size", config.kv_size),
                       ("intermediate_size", config.intermediate_size)):
        if size % rows:
            raise UnsupportedModelError(f"fp8 block scales: {what} {size} is not a multiple of the block's "
                                        f"{rows} rows, so the fused linear's scales cannot be laid out")


class Fp8LlamaModel(LlamaModel):
    def __init__(self, config: ModelConfig, ops, dtype: torch.dtype, recipe: Fp8Recipe):
        check_layout(config, recipe)
        super().__init__(config, ops, dtype, layer=functools.partial(Fp8DecoderLayer, recipe=recipe))
        self.recipe = recipe
        self._refuse_variant(ops)

    def _refuse_variant(self, ops) -> None:
        if ops.deterministic and not self.recipe.batch_invariant:
            raise UnsupportedModelError(f"deterministic mode refuses this FP8 model: {PER_TENSOR_REFUSAL}")

    def set_ops(self, ops) -> None:
        self._refuse_variant(ops)
        super().set_ops(ops)

    def _linear(self, layer, name: str, x):
        bias = getattr(layer, _BIASES[name]) if name in _BIASES else None
        if self.recipe.activations == "static":
            scale, input_scale = getattr(layer, name + "_out_scale"), getattr(layer, name + "_act_scale")
        else:
            scale, input_scale = getattr(layer, name + "_scale"), None
        return self.ops.linear_fp8(x, getattr(layer, name), scale, self.recipe, input_scale, bias)

    def gemm_weights(self) -> list[torch.Tensor]:
        """The dense 2-D weights (embeddings, head) and the e4m3 ones, not their block scales."""
        scales = {id(p) for n, p in self.named_parameters() if n.endswith("_scale")}
        return [p for p in self.parameters() if p.dim() == 2 and id(p) not in scales]

    # ---- weights -------------------------------------------------------------------------------------------------

    def expected_weight_names(self) -> set[str]:
        names = super().expected_weight_names()
        bases = [n.removesuffix(".weight") for n in names if is_linear_weight(n)]
        scales = {b + WEIGHT_SCALE for b in bases}
        inputs = {b + INPUT_SCALE for b in bases}
        return names | scales | (inputs if self.recipe.activations == "static" else set())

    @torch.no_grad()
    def load_weights(self, weights) -> None:
        super().load_weights(weights)
        if self.recipe.activations == "static":
            for layer in self.layers:
                for name in QUANTISED:
                    act = getattr(layer, name + "_input_scale").amax().reshape(1)
                    getattr(layer, name + "_act_scale").copy_(act)
                    getattr(layer, name + "_out_scale").copy_(act * getattr(layer, name + "_scale"))

    def _copy_in(self, name: str, tensor: torch.Tensor) -> None:
        dest = self.destination(name)
        if name.endswith((WEIGHT_SCALE, INPUT_SCALE)):
            tensor = self._scale_as(name, tensor, dest)
        elif is_linear_weight(name) and tensor.dtype != FP8:
            raise ValueError(f"tensor {name} is {tensor.dtype}; this FP8 model's linear weights are {FP8}")
        elif not is_linear_weight(name) and tensor.dtype == FP8:
            raise UnsupportedModelError(f"tensor {name} is {FP8}, but only the decoder's linears are FP8 here (a "
                                        "quantised head or embedding is not supported)")
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ValueError(f"tensor {name} has shape {tuple(tensor.shape)}, the config implies {tuple(dest.shape)}")
        dest.copy_(tensor)

    def _scale_as(self, name: str, tensor: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
        """A checkpoint's scale as ours: float32 (exact from bf16), [N, 1] as [N], a per-tensor weight scale on every
        row of its part."""
        tensor = tensor.float()
        if tensor.numel() == dest.numel():
            return tensor.reshape(dest.shape)
        if tensor.numel() == 1 and name.endswith(WEIGHT_SCALE) and self.recipe.weights == "channel":
            return tensor.reshape(()).expand(dest.shape)
        return tensor  # the shape check names it

    def _target(self, name: str):
        if not name.endswith((WEIGHT_SCALE, INPUT_SCALE)):
            return super()._target(name)
        weight = name.removesuffix(WEIGHT_SCALE).removesuffix(INPUT_SCALE) + ".weight"
        index, suffix = _LAYER_NAME.match(weight).groups()
        attr, part = _LAYER_PARAMS[suffix]
        layer = self.layers[int(index)]
        if name.endswith(INPUT_SCALE):
            i = _PARTS[attr].index(part)
            return getattr(layer, attr + "_input_scale"), slice(i, i + 1)
        rows = self._rows(part)
        if rows is not None and self.recipe.weights == "block":
            rows = slice(rows.start // self.recipe.block[0], rows.stop // self.recipe.block[0])
        return getattr(layer, attr + "_scale"), rows
