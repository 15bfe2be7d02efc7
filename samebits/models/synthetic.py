"""Tiny random-weight checkpoints for tests and demos: real HF folders, written in milliseconds, no transformers.

`write_tiny_checkpoint(path, variant)` writes config.json, safetensors (optionally sharded with an index),
tokenizer.json (a byte-level BPE built with `tokenizers`), tokenizer_config.json with a ChatML template, and
generation_config.json. Same (variant, seed, overrides) -> same bytes. `random_model` builds a model of any
shape directly on a device, without files (for shapes too large to write, such as 8B); `random_loaded` wraps one with
the tiny tokenizer as the engine loads it.
"""
from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as _Backend
from tokenizers import decoders, models, pre_tokenizers

from samebits.models.config import ModelConfig

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Words whose byte-level spellings become merges, so common text encodes to fewer tokens than bytes.
_WORDS = ("the", "Ġthe", "Ġa", "Ġis", "Ġof", "Ġand", "Ġto", "Ġin", "Ġcapital", "ĠParis", "ĠFrance", "ĠWhat", "Ġhello",
          "Ġworld", "ing", "er", "ĠThe", "Ġcat", "Ġsat", "Ġon", "Ġmat")

# head_dim 64: the smallest the CUDA attention kernel takes, so every variant runs on the GPU too.
_BASE = {
    "vocab_size": 320, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
}
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
VARIANTS = {
    "llama3": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rope_theta": 500000.0,
               "rope_scaling": _LLAMA3_ROPE},
    "mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "rope_theta": 1000000.0,
                "sliding_window": 4096},
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "rope_theta": 1000000.0,
              "use_sliding_window": False},
    "qwen3": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "rope_theta": 1000000.0,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,  # q width 256 != hidden 128
              "attention_bias": False, "use_sliding_window": False},
    "smollm2": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rope_theta": 100000.0,
                "tie_word_embeddings": True},
    # Mixtures of experts (models/moe.py): few small experts, top 2 of 4 (Qwen3's norm_topk_prob on as in its
    # released checkpoints, Qwen2's off with a shared expert and one dense layer).
    "qwen3_moe": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "rope_theta": 1000000.0,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "attention_bias": False,
                  "use_sliding_window": False, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 64, "norm_topk_prob": True, "decoder_sparse_step": 1,
                  "mlp_only_layers": []},
    "mixtral": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "rope_theta": 1000000.0,
                "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 96},
    "qwen2_moe": {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "rope_theta": 1000000.0,
                  "use_sliding_window": False, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 64, "shared_expert_intermediate_size": 96, "norm_topk_prob": False,
                  "decoder_sparse_step": 1, "mlp_only_layers": [1]},
}
# Config keys an override may set: the ones ModelConfig.from_hf reads. Anything else is a typo.
OVERRIDABLE = set(_BASE) | {"rope_theta", "rope_scaling", "head_dim", "sliding_window", "use_sliding_window",
                            "attention_bias", "num_experts", "num_local_experts", "num_experts_per_tok",
                            "moe_intermediate_size", "norm_topk_prob", "shared_expert_intermediate_size",
                            "decoder_sparse_step", "mlp_only_layers"}


def tiny_hf_config(variant: str = "llama3", **overrides) -> dict:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    unknown = sorted(set(overrides) - OVERRIDABLE)
    if unknown:
        raise ValueError(f"unknown override(s) {unknown}; allowed: {sorted(OVERRIDABLE)}")
    return copy.deepcopy({**_BASE, **VARIANTS[variant], **overrides})  # callers may edit nested dicts


def write_tiny_checkpoint(path, variant: str = "llama3", seed: int = 0, sharded: bool = False, **overrides) -> Path:
    """Write a loadable HF folder for a tiny random model; returns the folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf = tiny_hf_config(variant, **overrides)
    config = ModelConfig.from_hf(hf)
    tensors = random_weights(config, seed, getattr(torch, hf["torch_dtype"]))
    _write_json(path / "config.json", hf)
    _write_safetensors(path, tensors, sharded)
    write_tokenizer_files(path, hf)
    return path


def random_weights(config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """HF-named random tensors: N(0, 0.02) matrices and biases, norms near 1 so they are not no-ops."""
    from samebits.models.registry import model_class

    shapes = _hf_shapes(config)
    names = sorted(model_class(config).expected_weight_names_for(config))
    gen = torch.Generator().manual_seed(seed)
    return {n: _random_tensor(n, shapes(n), gen).to(dtype) for n in names}


def _random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    noise = torch.randn(shape, generator=gen)
    return 1.0 + 0.1 * noise if "norm" in name else 0.02 * noise


_EXPERT_PART = re.compile(r".*(?:experts\.\d+\.|shared_expert\.)(\w+)\.weight")


def _hf_shapes(cfg: ModelConfig):
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    moe = cfg.moe
    by_suffix = {"q_proj.weight": (cfg.q_size, h), "k_proj.weight": (cfg.kv_size, h), "v_proj.weight": (cfg.kv_size, h),
                 "q_proj.bias": (cfg.q_size,), "k_proj.bias": (cfg.kv_size,), "v_proj.bias": (cfg.kv_size,),
                 "o_proj.weight": (h, cfg.q_size), "o_proj.bias": (h,), "q_norm.weight": (d,), "k_norm.weight": (d,),
                 "gate_proj.weight": (i, h), "up_proj.weight": (i, h), "down_proj.weight": (h, i),
                 "layernorm.weight": (h,), "embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,),
                 "lm_head.weight": (cfg.vocab_size, h)}

    def shape(name: str) -> tuple[int, ...]:
        expert = _EXPERT_PART.fullmatch(name)
        if expert:  # w1/gate_proj, w3/up_proj: [I, H]; w2/down_proj: [H, I]
            inter = moe.shared_expert_intermediate_size if "shared_expert." in name else moe.intermediate_size
            return (h, inter) if expert.group(1) in ("w2", "down_proj") else (inter, h)
        if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
            return moe.num_experts, h
        if name.endswith("shared_expert_gate.weight"):
            return 1, h
        return next(s for suffix, s in by_suffix.items() if name.endswith(suffix))

    return shape


def _write_json(file: Path, data: dict) -> None:
    file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_safetensors(path: Path, tensors: dict[str, torch.Tensor], sharded: bool) -> None:
    if not sharded:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(tensors)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    files = [f"model-{k + 1:05d}-of-00002.safetensors" for k in range(2)]
    for file, part in zip(files, halves):
        save_file({n: tensors[n] for n in part}, str(path / file), metadata={"format": "pt"})
    weight_map = {n: f for f, part in zip(files, halves) for n in part}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    _write_json(path / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


def build_tokenizer() -> _Backend:
    """Byte-level BPE: the ChatML special tokens, the 256 byte symbols, then merges spelling `_WORDS`."""
    # Specials first, as in SmolLM2: <|endoftext|>=0, <|im_start|>=1 (bos), <|im_end|>=2 (eos).
    symbols = list(SPECIALS) + sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(symbols)}
    merges = []
    for word in _WORDS:
        for end in range(2, len(word) + 1):
            left, right, whole = word[: end - 1], word[end - 1], word[:end]
            if whole not in vocab:
                merges.append((left, right))
                vocab[whole] = len(vocab)
    tok = _Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    return tok


def write_tokenizer_files(path: Path, hf: dict) -> None:
    """tokenizer.json, tokenizer_config.json (ChatML template) and generation_config.json for a tiny HF config."""
    path = Path(path)
    tok = build_tokenizer()
    if tok.get_vocab_size() > hf["vocab_size"]:
        raise ValueError(f"vocab_size {hf['vocab_size']} is smaller than the tiny tokenizer's {tok.get_vocab_size()}")
    tok.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "chat_template": CHATML, "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512})
    _write_json(path / "generation_config.json", {"bos_token_id": hf["bos_token_id"], "eos_token_id": hf["eos_token_id"]})


_GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe",
              "qwen2_moe": "qwen2moe", "mixtral": "llama"}
_EXPERT_NAME = re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight")
_EXPERT_PARTS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj", "gate_proj": "gate_proj",
                 "up_proj": "up_proj", "down_proj": "down_proj"}


def write_tiny_gguf(path, variant: str = "smollm2", seed: int = 0, qtype: str | Callable[[str], str] = "Q8_0",
                    **overrides) -> Path:
    """A tiny random model as one GGUF file: 2-D weights in `qtype` (a type name, or a function of the HF tensor
    name for mixed files such as Q4_K_M), norms F32, llama Q/K rows permuted the way llama.cpp's converter does,
    tokenizer and chat template in the metadata. K-quant rows need widths that are multiples of 256."""
    import gguf

    hf = tiny_hf_config(variant, **overrides)
    config = ModelConfig.from_hf(hf)
    if config.rope_scaling:
        raise ValueError("llama3 rope scaling has no GGUF metadata form; use another variant or rope_scaling=None")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), _GGUF_ARCH[config.architecture])
    _gguf_metadata(writer, config)
    _gguf_tokenizer(writer, config.vocab_size)
    type_of = qtype if callable(qtype) else lambda _: qtype
    gen = np.random.default_rng(seed)
    for name, tensor in sorted(_stacked_experts(random_weights(config, seed)).items()):
        _gguf_tensor(writer, name, tensor, config, gguf.GGMLQuantizationType[type_of(name)], gen)
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    return path


def _stacked_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """As llama.cpp's converter writes a mixture of experts: each layer's experts stacked per projection, the router
    and projections under the names loader_gguf.py reads them by (models/moe.py spells them back), the shared
    expert's gate as one row."""
    out, experts = {}, {}
    for name, tensor in tensors.items():
        match = _EXPERT_NAME.fullmatch(name)
        if match:
            experts.setdefault((match.group(1), _EXPERT_PARTS[match.group(3)]), {})[int(match.group(2))] = tensor
        elif name.endswith("shared_expert_gate.weight"):
            out[name] = tensor.reshape(-1)
        else:
            out[name.replace("block_sparse_moe.gate.weight", "mlp.gate.weight")] = tensor
    for (layer, part), per in experts.items():
        out[f"model.layers.{layer}.mlp.experts.{part}.weight"] = torch.stack([per[e] for e in sorted(per)])
    return out


def _gguf_metadata(writer, cfg: ModelConfig) -> None:
    writer.add_block_count(cfg.num_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if cfg.moe is not None:
        writer.add_expert_count(cfg.moe.num_experts)
        writer.add_expert_used_count(cfg.moe.top_k)
        writer.add_expert_feed_forward_length(cfg.moe.intermediate_size)
        if cfg.moe.shared_expert_intermediate_size:
            writer.add_expert_shared_feed_forward_length(cfg.moe.shared_expert_intermediate_size)


def _gguf_tokenizer(writer, vocab_size: int) -> None:
    tok = json.loads(build_tokenizer().to_str())
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    # As llama.cpp's converter: the token list is padded to the embedding rows with unused [PADn] tokens.
    pads = [f"[PAD{i}]" for i in range(len(tokens), vocab_size)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens + pads)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens] + [5] * len(pads))  # 3 control, 5 unused
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    writer.add_bos_token_id(vocab["<|im_start|>"])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_pad_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)


def _gguf_tensor(writer, name: str, tensor: torch.Tensor, cfg: ModelConfig, qtype, gen: np.random.Generator) -> None:
    from gguf.quants import quantize

    from samebits.models.loader_gguf import gguf_name

    values = _llama_cpp_permute(name, tensor, cfg).numpy().astype("float32")
    if values.ndim == 1:  # llama.cpp keeps norms and biases in F32
        writer.add_tensor(gguf_name(name), values)
        return
    data = random_k_blocks(values.shape, qtype, gen) if qtype.name in K_QUANT_SCALES else quantize(values, qtype)
    writer.add_tensor(gguf_name(name), data, raw_dtype=qtype)


# Byte offsets of each block's float16 super-scales (d, and dmin where there is one) in ggml's K-quant layouts
# (ggml-common.h: block_q2_K .. block_q6_K). The gguf package cannot quantize these types, so test files carry
# random blocks whose scales are set to finite values.
K_QUANT_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
_K_WEIGHT_RANGE = 0.05  # largest |weight|: about the N(0, 0.02) of the other types, so activations stay tame


def random_k_blocks(shape: tuple[int, int], qtype, gen: np.random.Generator) -> np.ndarray:
    """uint8 [rows, bytes per row] of random K-quant blocks, the super-scales set so that |weight| <= 0.05."""
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    block, block_bytes = GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    if cols % block:
        raise ValueError(f"{qtype.name} rows are whole {block}-wide blocks; got width {cols}")
    blocks = gen.integers(0, 256, (rows * cols // block, block_bytes), dtype=np.uint8)
    offsets = K_QUANT_SCALES[qtype.name]

    def set_scales(value: float) -> None:
        for at in offsets:
            blocks[:, at:at + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)

    set_scales(1.0)
    unit = float(np.abs(dequantize(blocks, qtype)).max())
    set_scales(_K_WEIGHT_RANGE / unit)
    return blocks.reshape(rows, -1)


def _llama_cpp_permute(name: str, w: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    if cfg.architecture not in ("llama", "mistral", "mixtral") or not name.endswith(("q_proj.weight", "k_proj.weight")):
        return w
    heads = cfg.num_heads if "q_proj" in name else cfg.num_kv_heads
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def random_model(config: ModelConfig, ops, dtype: torch.dtype = torch.bfloat16, seed: int = 0):
    """A model of any shape with N(0, 0.02) weights generated on ops.device (for 8B-shaped GPU runs)."""
    from samebits.models.registry import build_model

    model = build_model(config, ops, dtype)
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen, device=param.device, dtype=torch.float32)
        param.data.copy_(1.0 + 0.1 * noise if "norm" in name else 0.02 * noise)
    return model.eval()


def random_loaded(hf_overrides: dict, name: str, mode: str, device: str | None = None, dtype: str | None = None):
    """A LoadedModel of `tiny_hf_config("llama3", **hf_overrides)`'s shape with random weights and the tiny test
    tokenizer, no checkpoint files (an importable factory, so an engine process can build it: engine_process.py)."""
    import tempfile

    from samebits.kernels import get_ops
    from samebits.models.loader import LoadedModel, default_device
    from samebits.models.tokenizer import Tokenizer

    device = device or default_device()
    config = ModelConfig.from_hf(tiny_hf_config("llama3", **hf_overrides))
    torch_dtype = getattr(torch, dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
    model = random_model(config, get_ops(mode, device), torch_dtype)
    folder = write_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="samebits-tok-")))
    return LoadedModel(model, Tokenizer.from_hf_dir(folder), config, name, folder)


def hf_parameters_to(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A transformers module's parameters cast to dtype in place, its buffers left as they are: RoPE's inv_freq stays
    float32, as `from_pretrained(dtype=...)` leaves it. `Module.to(dtype)` would round it to bf16 (an angle error of
    up to ~0.5 rad at position 500, head dim 64) and `.float()` would not undo that: a comparison would hold samebits'
    exact RoPE against another model."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model
