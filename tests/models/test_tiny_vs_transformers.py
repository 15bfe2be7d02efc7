"""Tiny random checkpoints built and saved by transformers (safetensors, one sharded), loaded by samebits:
logits match transformers' own forward on 8 prompts, argmax identical everywhere. Also the GGUF path, for every
supported quant type, against transformers loading the same GGUF (its own dequantizer and Q/K un-permutation).
"""

import pytest
import torch

from samebits.models.loader_gguf import load_gguf
from samebits.models.loader_hf import load_hf_dir
from samebits.models.synthetic import tiny_hf_config, write_tiny_checkpoint, write_tiny_gguf, write_tokenizer_files
from tests.models.helpers import get_test_ops, prefill_logits

transformers = pytest.importorskip("transformers")

# fp32 CPU, logits up to ~4: measured max-abs-diff <= 3.7e-6 (safetensors) and <= 8.4e-7 (GGUF), fast and
# deterministic mode alike; the bound leaves room for kernel changes.
MAX_ABS_DIFF = 1e-4
PROMPTS = ["What is the capital of France?", "the cat sat on the mat", "hello", "Paris",
           "The capital of France is Paris, and the cat sat on the mat. " * 4,
           "ing er the and to in of is a", "1 + 1 = 2\n\n", "hello world " * 12]
# (variant, overrides, sharded): every family, tied and untied, Llama-3 rope scaling; qwen2 sharded and tied.
CASES = {
    "llama3-rope-scaling": ("llama3", {}, False),
    "mistral": ("mistral", {}, False),
    "qwen2-tied-sharded": ("qwen2", {"tie_word_embeddings": True}, True),
    "qwen3": ("qwen3", {}, False),
    "smollm2-tied": ("smollm2", {}, False),
    "llama-attention-bias": ("llama3", {"attention_bias": True, "rope_scaling": None}, False),
}


def _transformers_checkpoint(path, variant, overrides, sharded, seed=0):
    """Random weights (std 0.08) for sharper attention and larger logits than the 0.02 default; save_pretrained."""
    hf = tiny_hf_config(variant, **overrides)
    config = transformers.AutoConfig.for_model(**hf)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.08 * torch.randn_like(p))
    model.save_pretrained(path, max_shard_size="100KB" if sharded else "10GB")
    write_tokenizer_files(path, hf)
    return model.eval()


def _reference_logits(model, prompts):
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0].float() for p in prompts]


def _assert_close(ours, ref):
    diff = max(float((a - b).abs().max()) for a, b in zip(ours, ref))
    assert diff <= MAX_ABS_DIFF, f"max abs diff {diff:.3g} > {MAX_ABS_DIFF}"
    for a, b in zip(ours, ref):
        assert torch.equal(a.argmax(-1), b.argmax(-1))
    return diff


@pytest.mark.parametrize("case", sorted(CASES))
def test_transformers_checkpoint_matches(tmp_path, case):
    variant, overrides, sharded = CASES[case]
    ref_model = _transformers_checkpoint(tmp_path, variant, overrides, sharded)
    if sharded:
        assert (tmp_path / "model.safetensors.index.json").is_file()
    model, tok, cfg = load_hf_dir(tmp_path, get_test_ops("fast"), torch.float32)
    assert cfg.tie_word_embeddings == ref_model.config.tie_word_embeddings
    prompts = [tok.encode(p) for p in PROMPTS]
    _assert_close(prefill_logits(model, prompts), _reference_logits(ref_model, prompts))


@pytest.mark.parametrize("variant", ["llama3", "qwen3", "smollm2"])
def test_samebits_written_checkpoint_loads_in_transformers_identically(tmp_path, variant):
    path = write_tiny_checkpoint(tmp_path, variant, seed=5)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model, tok, _ = load_hf_dir(path, get_test_ops("fast"), torch.float32)
    prompts = [tok.encode(p) for p in PROMPTS]
    _assert_close(prefill_logits(model, prompts), _reference_logits(ref_model, prompts))


GGUF_CASES = [("smollm2", q) for q in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")] + [
    ("mistral", "Q4_0"), ("qwen2", "Q8_0"), ("qwen3", "Q4_1"), ("smollm2", "Q4_K"), ("qwen2", "Q6_K"),
    ("mistral", "Q2_K"), ("qwen2", "Q3_K"), ("smollm2", "Q5_K"), ("smollm2", "Q5_1")]


@pytest.mark.parametrize("variant,qtype", GGUF_CASES)
def test_gguf_matches_transformers_gguf(tmp_path, variant, qtype):
    # transformers' GGUF config mapping ignores key_length and assumes Qwen3's head_dim of 128.
    overrides = {"head_dim": 128} if variant == "qwen3" else {}
    if qtype.endswith("_K"):
        overrides["hidden_size"] = 256  # K-quant blocks are 256 wide
    path = write_tiny_gguf(tmp_path / f"{variant}.gguf", variant, seed=1, qtype=qtype, **overrides)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name,
                                                                  dtype=torch.float32).eval()
    model, tok, _ = load_gguf(path, get_test_ops("fast"), torch.float32)
    prompts = [tok.encode(p) for p in PROMPTS]
    _assert_close(prefill_logits(model, prompts), _reference_logits(ref_model, prompts))


def test_gguf_tokenizer_matches_the_folder_tokenizer(tmp_path):
    gguf_path = write_tiny_gguf(tmp_path / "m.gguf", "smollm2")
    folder = write_tiny_checkpoint(tmp_path / "hf", "smollm2")
    _, from_gguf, _ = load_gguf(gguf_path, get_test_ops("fast"), torch.float32)
    _, from_dir, _ = load_hf_dir(folder, get_test_ops("fast"), torch.float32)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    assert from_gguf.encode_chat(chat) == from_dir.encode_chat(chat)
    for text in PROMPTS + ["<|im_start|>user\nhi<|im_end|>", "  spaces\t\ttabs\n", "ünïcödé ☃ 😀"]:
        assert from_gguf.encode(text) == from_dir.encode(text), text
        assert from_gguf.decode(from_gguf.encode(text)) == from_dir.decode(from_dir.encode(text))
    assert from_gguf.eos_token_ids == from_dir.eos_token_ids == {2}
