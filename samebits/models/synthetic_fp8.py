"""Tiny random FP8 checkpoints in the formats users have, written from a dense tiny model (models/synthetic.py), and
their dequantised twins, for tests.

`write_tiny_fp8_checkpoint(path, fmt)`: the tiny dense model's weights in bf16 (what FP8 checkpoints are made from),
each decoder linear quantised the way that format's tools do (amax / 448 scales per block, row or tensor; e4m3 values
nearest-even), the rest kept in bf16, with its config's `quantization_config`. `write_dequantized_checkpoint(fp8_path, path)`: the same model with every linear weight
e4m3 x scale in float32 and no quantisation, the "dequantised model" an FP8 model is compared with. Same (fmt,
variant, seed, overrides) -> same bytes.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from samebits.kernels.fp8 import BLOCK, FP8_MAX, Fp8Recipe, dequantize_weight, quantize_weight, to_fp8
from samebits.models.config import ModelConfig
from samebits.models.fp8 import is_linear_weight
from samebits.models.synthetic import random_weights, tiny_hf_config, write_tokenizer_files

_CT_FLOAT8 = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "actorder": None}


def _compressed(weights: dict, inputs: dict | None) -> dict:
    """compressed-tensors' quantization_config with one group over every Linear but the head (llm-compressor's)."""
    group = {"targets": ["Linear"], "weights": {**_CT_FLOAT8, "dynamic": False, **weights},
             "input_activations": None if inputs is None else {**_CT_FLOAT8, **inputs}, "output_activations": None}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": group},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "quantization_status": "compressed"}


# fmt -> (quantization_config, weight scale layout, scale tensor name, the recipe samebits reads it as)
FORMATS = {
    # Qwen3-*-FP8 / DeepSeek-V3: 128x128 blocks, weight_scale_inv, dynamic activations per token and 128-group.
    "block": ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": list(BLOCK)},
              "block", "weight_scale_inv", Fp8Recipe("block", "group", BLOCK)),
    # llm-compressor FP8_DYNAMIC: per-channel weights [N, 1], dynamic per-token activations.
    "channel": (_compressed({"strategy": "channel"}, {"strategy": "token", "dynamic": True}),
                "channel", "weight_scale", Fp8Recipe("channel", "token")),
    # llm-compressor FP8 (static): per-tensor weights and activations, `input_scale`.
    "static": (_compressed({"strategy": "tensor"}, {"strategy": "tensor", "dynamic": False}),
               "tensor", "weight_scale", Fp8Recipe("channel", "static")),
    # llm-compressor FP8_BLOCK: 128x128 blocks, dynamic per-group activations.
    "ct_block": (_compressed({"strategy": "block", "block_structure": list(BLOCK)},
                             {"strategy": "group", "group_size": BLOCK[1], "dynamic": True}),
                 "block", "weight_scale", Fp8Recipe("block", "group", BLOCK)),
    # Per-tensor dynamic activations: the batch-variant recipe (compressed-tensors, and vLLM's fp8 file format).
    "tensor": (_compressed({"strategy": "channel"}, {"strategy": "tensor", "dynamic": True}),
               "channel", "weight_scale", Fp8Recipe("channel", "tensor")),
    "hf_tensor": ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "tensor", "weight_scale",
                  Fp8Recipe("channel", "tensor")),
}
# Static input scales: a magnitude each linear's inputs reach in the tiny models (normed rows; attention outputs;
# silu(gate) * up), over FP8_MAX, so that few values clamp.
_INPUT_AMAX = {"q_proj": 4.0, "k_proj": 4.0, "v_proj": 4.0, "gate_proj": 4.0, "up_proj": 4.0, "o_proj": 1.0,
               "down_proj": 0.2}


def write_tiny_fp8_checkpoint(path, fmt: str = "block", variant: str = "qwen3", seed: int = 0,
                              scale_dtype: torch.dtype = torch.float32, **overrides) -> Path:
    """An FP8 HF folder of the tiny dense model (variant, seed, overrides); qwen3's widths are whole 128-blocks."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown fmt {fmt!r}; choose from {sorted(FORMATS)}")
    qc, layout, scale_name, _ = FORMATS[fmt]
    hf = {**tiny_hf_config(variant, **overrides), "torch_dtype": "bfloat16"}
    config = ModelConfig.from_hf(hf)
    tensors = {}
    for name, w in sorted(random_weights(config, seed, torch.bfloat16).items()):
        if not is_linear_weight(name):
            tensors[name] = w
            continue
        base = name.removesuffix(".weight")
        tensors[name], scale = _quantize(w, layout)
        tensors[f"{base}.{scale_name}"] = scale.to(scale_dtype)
        if fmt == "static":
            amax = _INPUT_AMAX[base.rsplit(".", 1)[-1]]
            tensors[f"{base}.input_scale"] = torch.tensor([amax / FP8_MAX], dtype=scale_dtype)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _write(path, {**hf, "quantization_config": copy.deepcopy(qc)}, tensors)
    return path


def _quantize(w: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, its scales as that format stores them)."""
    if layout == "channel":
        q, scale = quantize_weight(w)
        return q, scale[:, None]  # compressed-tensors' [N, 1]
    if layout == "tensor":
        q, scale = quantize_weight(w, per_tensor=True)
        return q, scale[:1].reshape(())
    n, k = w.shape
    rows, cols = BLOCK
    blocks = torch.nn.functional.pad(w.float(), (0, -k % cols, 0, -n % rows))
    blocks = blocks.view(blocks.shape[0] // rows, rows, blocks.shape[1] // cols, cols)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = to_fp8(blocks / scale[:, None, :, None]).view(blocks.shape[0] * rows, -1)[:n, :k].contiguous()
    return q, scale


def write_dequantized_checkpoint(fp8_path, path) -> Path:
    """The dense float32 model an FP8 checkpoint stands for: every linear weight e4m3 x its scale, rounded once."""
    fp8_path, path = Path(fp8_path), Path(path)
    hf = json.loads((fp8_path / "config.json").read_text(encoding="utf-8"))
    _, layout, scale_name, recipe = FORMATS[_format_of(hf["quantization_config"])]
    with safe_open(str(fp8_path / "model.safetensors"), framework="pt") as f:
        stored = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118 - a safetensors handle is not a dict
    tensors = {}
    for name, t in stored.items():
        if is_linear_weight(name):
            scale = stored[f"{name.removesuffix('.weight')}.{scale_name}"].float()
            scale = scale.reshape(-1).expand(t.shape[0]) if layout != "block" else scale
            tensors[name] = dequantize_weight(t, scale.contiguous(), recipe)
        elif not name.endswith((f".{scale_name}", ".input_scale")):
            tensors[name] = t
    path.mkdir(parents=True, exist_ok=True)
    _write(path, {k: v for k, v in hf.items() if k != "quantization_config"}, tensors)
    return path


def _format_of(qc: dict) -> str:
    return next(fmt for fmt, (config, *_) in FORMATS.items() if config == qc)


def _write(path: Path, hf: dict, tensors: dict) -> None:
    (path / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer_files(path, hf)
