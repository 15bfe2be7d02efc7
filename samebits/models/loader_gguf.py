"""A GGUF file: config from metadata, tensors dequantized to the model dtype, tokenizer and chat template from metadata.

Weights are renamed to HF names so one loader path (`LlamaModel.load_weights`) checks them all. llama.cpp's converter
permutes the Q/K rows of `llama`-architecture models, Mixtral's included (its RoPE pairs adjacent dims, HF's pairs the
two halves); that permutation is undone here. Qwen2/Qwen3 files (MoE too) are written unpermuted.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend

from samebits.models.config import ModelConfig, UnsupportedModelError, check_gguf_architecture
from samebits.models.gguf_file import GGUFTensor, read_gguf
from samebits.models.llama import LlamaModel
from samebits.models.registry import build_model
from samebits.models.tokenizer import Tokenizer
from samebits.progress import untracked

# Dequantized by `gguf.quants.dequantize`: elementwise numpy on each block (scale * quant - min), no reduction, so the
# float32 weights are a function of the file's bytes alone. The K-quants are there because Q4_K_M/Q5_K_M files mix
# them with Q5_0/Q5_1/Q8_0, llama.cpp's fallback for rows that are not a multiple of 256.
SUPPORTED_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1,
                   Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
# Why a type is refused, where there is more to say than "not supported".
_REFUSED_WHY = {Q.Q8_K: "llama.cpp uses Q8_K for activations only and the gguf package cannot dequantize it"}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight", "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    # Mixtures of experts: one tensor per layer holds every expert ([E, rows, cols]); models/moe.py splits it and
    # spells the router and experts as the family does.
    "ffn_gate_inp.weight": "mlp.gate.weight", "ffn_gate_exps.weight": "mlp.experts.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.up_proj.weight", "ffn_down_exps.weight": "mlp.experts.down_proj.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")
_PERMUTED = ("llama", "mixtral")  # written by llama.cpp's converter as arch "llama"
CONTROL, USER_DEFINED = 3, 4

# Pre-tokenizer splits by `tokenizer.ggml.pre`, as transformers' GGUF conversion maps them. The gpt2 default (the
# ByteLevel regex) serves the rest of the names listed.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")
_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
           "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
_BYTE_LEVEL_DEFAULT = ("default", "gpt2", "smollm")


def load_gguf(path: Path, ops, dtype: torch.dtype, track=untracked) -> tuple[LlamaModel, Tokenizer, ModelConfig]:
    """`track(tensors, total)`: what counts the tensors as they are dequantized (samebits/progress.py)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    meta, tensors = read_gguf(path)
    config = gguf_config(tensors, meta)
    tokenizer = gguf_tokenizer(meta)
    model = build_model(config, ops, dtype)
    model.load_weights(track(iter_tensors(tensors, config), total=len(tensors)))
    return model, tokenizer, config


def gguf_config(tensors: list[GGUFTensor], meta: dict) -> ModelConfig:
    check_gguf_architecture(meta)
    names = {t.name: t for t in tensors}
    if "rope_freqs.weight" in names:
        raise UnsupportedModelError("unsupported GGUF feature: rope_freqs tensor (Llama-3.1 rope scaling); "
                                    "load the HF safetensors folder instead")
    if "token_embd.weight" not in names:
        raise ValueError("GGUF file has no token_embd.weight tensor")
    vocab = names["token_embd.weight"].shape[0]
    return ModelConfig.from_gguf(meta, vocab_size=vocab, tied="output.weight" not in names)


def iter_tensors(tensors: list[GGUFTensor], config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    for tensor in tensors:
        name = hf_name(tensor.name)
        values = dequantize_tensor(tensor)
        if config.architecture in _PERMUTED:
            values = unpermute_qk(name, values, config)
        yield name, values


def hf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _BLOCK.fullmatch(name)
    if not match or match.group(2) not in _LAYER_NAMES:
        return name  # left as is: load_weights reports it as unexpected, by its GGUF name
    return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"


def gguf_name(hf: str) -> str:
    """Inverse of `hf_name` (for writing test files)."""
    top = {v: k for k, v in _TOP_NAMES.items()}
    if hf in top:
        return top[hf]
    index, suffix = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf).groups()
    layer = {v: k for k, v in _LAYER_NAMES.items()}
    return f"blk.{index}.{layer[suffix]}"


def dequantize_tensor(tensor: GGUFTensor) -> torch.Tensor:
    """Float32 values in HF layout ([rows, cols])."""
    if tensor.tensor_type not in SUPPORTED_TYPES:
        why = _REFUSED_WHY.get(tensor.tensor_type, "which is not supported")
        raise UnsupportedModelError(f"tensor {tensor.name} uses GGUF type {tensor.tensor_type.name}, {why}; "
                                    f"supported: {[t.name for t in SUPPORTED_TYPES]}")
    values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
    if not values.flags.writeable:  # F32 comes back as a view of the read-only memory map
        values = values.copy()
    return torch.from_numpy(values.reshape(tensor.shape))


def unpermute_qk(name: str, values: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Inverse of llama.cpp's `permute`: per head, rows were interleaved (pairs); put the two halves back."""
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        heads = config.num_heads
    elif name.endswith(("k_proj.weight", "k_proj.bias")):
        heads = config.num_kv_heads
    else:
        return values
    rows = values.shape[0]
    split = values.reshape(heads, rows // heads // 2, 2, *values.shape[1:])
    return split.transpose(1, 2).reshape(values.shape)


# ---- tokenizer ---------------------------------------------------------------------------------------------------


def gguf_tokenizer(meta: dict) -> Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedModelError(f"unsupported GGUF tokenizer model {kind!r}; only 'gpt2' (byte-level BPE) is "
                                    "implemented; load the HF folder (tokenizer.json) instead")
    tokens = list(meta["tokenizer.ggml.tokens"])
    backend = byte_level_bpe(tokens, list(meta["tokenizer.ggml.merges"]), meta)
    _add_marked_tokens(backend, tokens, list(meta.get("tokenizer.ggml.token_type") or []))
    specials = _special_tokens(meta, tokens)
    if meta.get("tokenizer.ggml.add_bos_token") and specials.get("bos_token"):
        backend.post_processor = _bos_processor(specials["bos_token"], tokens.index(specials["bos_token"]))
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return Tokenizer(backend, specials, meta.get("tokenizer.chat_template"), () if eos is None else (int(eos),))


def byte_level_bpe(tokens: list[str], merges: list[str], meta: dict) -> _Backend:
    """As transformers' GGUF conversion: GPT-2 BPE, ByteLevel pre-tokenizer (or the file's split) and decoder."""
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {_respell(t, alphabet, spelling): i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], dropout=None,
                     continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    backend = _Backend(bpe)
    backend.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"),
                                           bool(meta.get("tokenizer.ggml.add_space_prefix", False)))
    backend.decoder = decoders.ByteLevel()
    return backend


def _respell(token: str, alphabet: set[str], spelling: dict[int, str]) -> str:
    # A token written in raw text rather than the byte alphabet is re-spelled byte by byte.
    return token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8"))


def _pre_tokenizer(pre: str, add_prefix_space: bool):
    if pre in _SPLITS:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre not in _BYTE_LEVEL_DEFAULT:
        raise UnsupportedModelError(f"unsupported GGUF pre-tokenizer {pre!r}; supported: "
                                    f"{sorted([*_SPLITS, *_BYTE_LEVEL_DEFAULT])}")
    return pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)


def _add_marked_tokens(backend: _Backend, tokens: list[str], types: list[int]) -> None:
    """Control tokens become special (never split, skipped on decode); user-defined ones plain added tokens."""
    alphabet = set(_bytes_to_unicode().values())
    # A control token outside the byte alphabet is a llama.cpp mislabel; transformers skips it, so do we.
    control = [t for t, k in zip(tokens, types) if k == CONTROL and set(t) <= alphabet]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, k in zip(tokens, types) if k == USER_DEFINED]
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _special_tokens(meta: dict, tokens: list[str]) -> dict[str, str]:
    keys = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
            "pad_token": "padding_token_id"}
    found = {name: meta.get(f"tokenizer.ggml.{key}") for name, key in keys.items()}
    return {name: tokens[i] for name, i in found.items() if i is not None and 0 <= i < len(tokens)}


def _bos_processor(bos: str, bos_id: int):
    return processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                         special_tokens=[(bos, bos_id)])


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte-level BPE alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table
