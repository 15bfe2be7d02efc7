"""LlamaModel on the real kernel registry: batch invariance, prefill == decode, modes, dtypes, set_ops."""
import pytest
import torch

from samebits.kernels import get_ops
from samebits.models import LlamaModel, load_model
from samebits.models.synthetic import VARIANTS, write_tiny_checkpoint, write_tiny_gguf
from tests.models.helpers import decode_logits, greedy, prefill_logits

PROMPTS = ["What is the capital of France?", "the cat sat on the mat " * 6, "hello", "Paris is the capital"]


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def tiny(request, tmp_path_factory):
    path = write_tiny_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=2)
    return load_model(path, mode="deterministic")


def test_defaults_are_cpu_fp32_deterministic(tiny):
    assert tiny.model.device.type == "cpu" and tiny.model.dtype == torch.float32
    assert tiny.model.ops.mode == "deterministic" and isinstance(tiny.model, LlamaModel)


def test_deterministic_mode_is_batch_invariant_bitwise(tiny):
    prompts = [tiny.tokenizer.encode(p) for p in PROMPTS]
    alone = prefill_logits(tiny.model, prompts[:1])[0]
    batched = prefill_logits(tiny.model, prompts)[0]
    reordered = prefill_logits(tiny.model, prompts[::-1])[-1]
    assert torch.equal(alone, batched) and torch.equal(alone, reordered)


def test_decode_steps_match_prefill(tiny):
    prompt = tiny.tokenizer.encode("the cat sat on the mat")
    generated = greedy(tiny.model, prompt, 20, eos=set())
    full = prefill_logits(tiny.model, [prompt + generated])[0]
    assert full[len(prompt) - 1:-1].argmax(-1).tolist() == generated


def test_fast_and_deterministic_modes_agree_closely(tiny):
    prompts = [tiny.tokenizer.encode(p) for p in PROMPTS]
    det = prefill_logits(tiny.model, prompts)
    tiny.model.set_ops(get_ops("fast", "cpu"))
    try:
        fast = prefill_logits(tiny.model, prompts)
    finally:
        tiny.model.set_ops(get_ops("deterministic", "cpu"))
    assert max(float((a - b).abs().max()) for a, b in zip(det, fast)) < 1e-4


def test_bf16_runs_and_logits_are_fp32(tmp_path):
    path = write_tiny_checkpoint(tmp_path, "qwen3")
    fp32 = load_model(path)
    bf16 = load_model(path, dtype="bf16")
    ids = fp32.tokenizer.encode(PROMPTS[1])
    a, b = prefill_logits(fp32.model, [ids])[0], prefill_logits(bf16.model, [ids])[0]
    assert b.dtype == torch.float32 and bf16.model.dtype == torch.bfloat16
    assert float((a - b).abs().max()) < 0.05 * float(a.abs().max())


def test_set_ops_refuses_another_device(tiny):
    with pytest.raises(ValueError, match="cuda"):
        tiny.model.set_ops(get_ops("fast", "cuda"))


def test_decode_logits_match_prefill_rows(tiny):
    prompt, continuation = tiny.tokenizer.encode("the cat sat"), tiny.tokenizer.encode(" on the mat, hello world")
    steps = decode_logits(tiny.model, prompt, continuation)
    full = prefill_logits(tiny.model, [prompt + continuation])[0][len(prompt) - 1:]
    assert float((steps - full).abs().max()) < 1e-5


def test_load_model_takes_a_gguf_path(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2", qtype="Q8_0")
    loaded = load_model(path)
    assert (loaded.name, loaded.path, loaded.config.architecture) == ("tiny.gguf", path, "qwen2")
    assert loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")
