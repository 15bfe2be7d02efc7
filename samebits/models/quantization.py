"""FP8 checkpoints as users have them, and FP8 at load: which recipe a model runs (kernels/fp8.py), and its tensors in
the names models/fp8.py takes.

Checkpoint formats (config.json `quantization_config`):
- `quant_method: "fp8"` (transformers' FP8, DeepSeek-V3, Qwen3-*-FP8): with `weight_block_size` [128, 128], e4m3
  weights and `weight_scale_inv` per block (a multiplier, despite its name), activations dynamic per token and
  128-wide group; without a block size (vLLM's and AutoFP8's files), `weight_scale` per tensor and, with
  `activation_scheme: "static"`, `input_scale` per tensor; `"dynamic"` there is per-tensor dynamic (vLLM's reading).
- `quant_method: "compressed-tensors"`, `format: "float-quantized"` (llm-compressor's FP8, FP8_DYNAMIC, FP8_BLOCK
  schemes): one config group over the Linear layers, `float` 8-bit symmetric weights per channel, tensor or 128x128
  block (`weight_scale`), input activations per token (dynamic), per tensor (static `input_scale`, or dynamic) or per
  128-group (dynamic).

The flag (`EngineConfig.quantization`, `--quantization`): "fp8" quantises a dense checkpoint at load (per output row
weight scales, per-token activation scales: llm-compressor's FP8_DYNAMIC recipe); with an FP8 checkpoint it keeps the
stored weights and turns per-tensor dynamic activations into per-token ones. "fp8_per_tensor" is vLLM's online recipe
(per-tensor weight and dynamic activation scales): batch-variant, fast mode only. Deterministic mode refuses every
per-tensor dynamic recipe, saying why.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from samebits.dtypes import check_quantization
from samebits.kernels.fp8 import BLOCK, PER_TENSOR_REFUSAL, Fp8Recipe, quantize_weight
from samebits.models.config import QUANT_METHODS, UnsupportedModelError
from samebits.models.fp8 import WEIGHT_SCALE, Fp8LlamaModel, is_linear_weight
from samebits.models.llama import LlamaModel

HF_FP8, COMPRESSED = QUANT_METHODS
_SCALE_INV = ".weight_scale_inv"
# Modules a checkpoint may leave dense: the head and the embedding (never quantised here).
_DENSE_OK = re.compile(r"(model\.)?(lm_head|embed_tokens)$")
# Decoder linears an ignore pattern is tried against (layers past these are refused by the loader's dtype check).
_PROBE_LINEARS = tuple(f"model.layers.{i}.{m}" for i in range(128) for m in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
    "mlp.down_proj"))


@dataclass(frozen=True)
class Quantization:
    """How a model's FP8 weights come to be: read from the checkpoint (`source` its format) or made at load
    ("online", per-tensor weight scales with `per_tensor`)."""

    recipe: Fp8Recipe
    source: str
    per_tensor: bool = False

    def tensors(self, tensors: Iterable[tuple[str, torch.Tensor]], device) -> Iterator[tuple[str, torch.Tensor]]:
        """A checkpoint's (name, tensor) pairs in models/fp8.py's names; a dense one's linear weights quantised, on
        `device` (the same bits on every device: kernels/fp8.py quantize_weight)."""
        for name, tensor in tensors:
            if self.source != "online":
                yield (name.removesuffix(_SCALE_INV) + WEIGHT_SCALE if name.endswith(_SCALE_INV) else name), tensor
            elif is_linear_weight(name):
                weight, scale = quantize_weight(tensor.to(device), self.per_tensor)
                yield name, weight
                yield name.removesuffix(".weight") + WEIGHT_SCALE, scale
            else:
                yield name, tensor


def plan(quantization_config: dict | None, flag: str | None, mode: str) -> Quantization | None:
    """The model's quantisation from its checkpoint's config and the flag; None: dense. UnsupportedModelError naming
    the field for what is not supported, and for a per-tensor dynamic recipe in deterministic mode."""
    check_quantization(flag)
    if not quantization_config:
        if flag is None:
            return None
        per_tensor = flag == "fp8_per_tensor"
        quant = Quantization(Fp8Recipe("channel", "tensor" if per_tensor else "token"), "online", per_tensor)
    else:
        quant = _with_flag(_from_checkpoint(quantization_config), flag)
    if mode == "deterministic" and not quant.recipe.batch_invariant:
        raise UnsupportedModelError(f"deterministic mode refuses this FP8 recipe ({_origin(quant, flag)}): "
                                    f"{PER_TENSOR_REFUSAL}")
    return quant


def _origin(quant: Quantization, flag: str | None) -> str:
    if quant.source == "online":
        return f"quantization={flag!r}"
    return f"the checkpoint's {quant.source} quantization_config" + (f" with quantization={flag!r}" if flag else "")


def _with_flag(quant: Quantization, flag: str | None) -> Quantization:
    """The flag on an FP8 checkpoint changes only dynamic activations: "fp8" makes per-tensor ones per token,
    "fp8_per_tensor" makes per-token ones per tensor."""
    acts = quant.recipe.activations
    if flag is None or (flag == "fp8" and acts != "tensor") or (flag == "fp8_per_tensor" and acts == "tensor"):
        return quant
    if flag == "fp8":
        return dataclasses.replace(quant, recipe=dataclasses.replace(quant.recipe, activations="token"))
    if acts != "token":
        raise UnsupportedModelError(f"quantization='fp8_per_tensor' cannot apply to this {quant.source} checkpoint: "
                                    f"its activations are {acts!r} (only per-token dynamic ones can be made per "
                                    "tensor)")
    return dataclasses.replace(quant, recipe=dataclasses.replace(quant.recipe, activations="tensor"))


def _from_checkpoint(qc: dict) -> Quantization:
    method = qc.get("quant_method")
    if method == HF_FP8:
        return _hf_fp8(qc)
    if method == COMPRESSED:
        return _compressed(qc)
    raise UnsupportedModelError(f"unsupported feature quantization_config (quant_method={method!r}); supported: "
                                f"{HF_FP8!r}, {COMPRESSED!r}")


def _unsupported(field: str, value, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"unsupported quantization_config.{field}={value!r}: {why}")


def _hf_fp8(qc: dict) -> Quantization:
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise _unsupported("fmt", fmt, "only e4m3 weights are supported")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise _unsupported("activation_scheme", scheme, "expected 'dynamic' or 'static'")
    _check_dense_ok("modules_to_not_convert", qc.get("modules_to_not_convert") or [])
    _check_dense_ok("ignored_layers", qc.get("ignored_layers") or [])
    block = qc.get("weight_block_size")
    if block is not None:
        if scheme != "dynamic":
            raise _unsupported("activation_scheme", scheme, "block-scaled weights take dynamic activations")
        return Quantization(_recipe("weight_block_size", "block", "group", tuple(block)), HF_FP8)
    return Quantization(Fp8Recipe("channel", "static" if scheme == "static" else "tensor"), HF_FP8)


def _compressed(qc: dict) -> Quantization:
    fmt = qc.get("format")
    if fmt != "float-quantized":
        raise _unsupported("format", fmt, "only FP8 ('float-quantized') compressed-tensors checkpoints are supported")
    if qc.get("kv_cache_scheme"):
        raise _unsupported("kv_cache_scheme", qc["kv_cache_scheme"], "the KV cache stays in the model dtype")
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise _unsupported("config_groups", sorted(groups), "exactly one group (every Linear alike) is supported")
    (name, group), = groups.items()
    where = f"config_groups.{name}"
    targets = group.get("targets") or []
    if targets != ["Linear"]:
        raise _unsupported(f"{where}.targets", targets, "expected ['Linear']")
    if group.get("output_activations"):
        raise _unsupported(f"{where}.output_activations", group["output_activations"], "not supported")
    ignore = qc.get("ignore") or []
    _check_dense_ok("ignore", ignore)
    if not any(_matches(entry, "lm_head") for entry in ignore):
        raise _unsupported("ignore", ignore, "the checkpoint quantises lm_head; samebits keeps the head dense")
    weights = _float8(group.get("weights"), f"{where}.weights")
    acts = _float8(group.get("input_activations"), f"{where}.input_activations")
    if weights.get("dynamic"):
        raise _unsupported(f"{where}.weights.dynamic", True, "weights must be stored quantised")
    w_kind = {"channel": "channel", "tensor": "channel", "block": "block"}.get(weights.get("strategy"))
    if w_kind is None:
        raise _unsupported(f"{where}.weights.strategy", weights.get("strategy"), "expected channel, tensor or block")
    block = tuple(weights.get("block_structure") or ()) or None
    a_kind = _activation_kind(acts, f"{where}.input_activations")
    return Quantization(_recipe(f"{where}.weights.block_structure", w_kind, a_kind, block), COMPRESSED)


def _float8(args: dict | None, where: str) -> dict:
    if not args:
        raise UnsupportedModelError(f"unsupported {where}=None: weight-only FP8 is not supported (activations must be "
                                    "quantised too)")
    for key, want in (("num_bits", 8), ("type", "float"), ("symmetric", True)):
        if args.get(key, want) != want:
            raise _unsupported(f"{where}.{key}", args.get(key), f"expected {want!r}")
    return args


def _activation_kind(acts: dict, where: str) -> str:
    strategy, dynamic = acts.get("strategy"), bool(acts.get("dynamic"))
    if strategy == "token" and dynamic:
        return "token"
    if strategy == "tensor":
        return "tensor" if dynamic else "static"
    if strategy == "group" and dynamic and acts.get("group_size") == BLOCK[1]:
        return "group"
    raise _unsupported(f"{where}.strategy", strategy, f"expected dynamic token, static or dynamic tensor, or dynamic "
                       f"group of {BLOCK[1]} (dynamic={dynamic}, group_size={acts.get('group_size')})")


def _recipe(field: str, weights: str, activations: str, block) -> Fp8Recipe:
    try:
        return Fp8Recipe(weights, activations, block)
    except ValueError as e:
        raise UnsupportedModelError(f"unsupported quantization_config.{field}: {e}") from None


def _matches(entry: str, name: str) -> bool:
    """compressed-tensors' ignore entries: a module name, or `re:` and a pattern."""
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    return entry == name


def _check_dense_ok(field: str, entries: list) -> None:
    """Modules left dense may be the head or the embedding only: samebits quantises every decoder linear or none."""
    for entry in entries:
        regex = entry.startswith("re:")
        if (regex and any(_matches(entry, p) for p in _PROBE_LINEARS)) or (not regex and not _DENSE_OK.match(entry)):
            raise _unsupported(field, entries, f"{entry!r} would leave decoder linears dense; samebits quantises all "
                               "of them or none")


def quantize_dense(model: LlamaModel, flag: str, mode: str = "fast") -> Fp8LlamaModel:
    """An FP8 model of a dense `model`'s weights, quantised as `--quantization flag` does at load (random-shape
    benchmark models, which have no files)."""
    quant = plan(None, flag, mode)
    fp8 = Fp8LlamaModel(model.config, model.ops, model.dtype, quant.recipe)
    names = sorted(model.expected_weight_names())
    fp8.load_weights(quant.tensors(((n, model.destination(n)) for n in names), model.device))
    return fp8.eval()
