"""CUDA: tiny checkpoints agree with the CPU, and an 8B-shaped random Llama (bf16) runs, batch-invariantly.

The real default model's weights are proven on the CPU (test_default_model.py): its 93 MB GGUF is larger than what
one transfer to the GPU machine carries.
"""
import pytest
import torch

from samebits.kernels import get_ops
from samebits.models import ModelConfig, load_model
from samebits.models.digest import weights_digest
from samebits.models.synthetic import VARIANTS, random_model, write_tiny_checkpoint
from tests.models.helpers import decode_logits, prefill_logits

pytestmark = pytest.mark.gpu

PROMPTS = ["What is the capital of France?", "the cat sat on the mat " * 6, "hello"]
LLAMA3_8B = ModelConfig(
    architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
    num_kv_heads=8, head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
    bos_token_id=128000, eos_token_ids=(128001, 128009))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tiny_checkpoint_on_cuda_matches_cpu(tmp_path, variant):
    path = write_tiny_checkpoint(tmp_path, variant, seed=4)
    cpu = load_model(path, mode="deterministic", device="cpu", dtype="fp32")
    gpu = load_model(path, mode="deterministic", device="cuda", dtype="fp32")
    prompts = [cpu.tokenizer.encode(p) for p in PROMPTS]
    ref, out = prefill_logits(cpu.model, prompts), prefill_logits(gpu.model, prompts)
    assert max(float((a - b.cpu()).abs().max()) for a, b in zip(ref, out)) < 1e-3
    assert torch.equal(prefill_logits(gpu.model, prompts[:1])[0], out[0])  # batch-invariant on the GPU too


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tiny_checkpoint_bf16_default_on_cuda(tmp_path, variant):
    path = write_tiny_checkpoint(tmp_path, variant, seed=4)
    gpu = load_model(path, device="cuda")
    assert gpu.model.dtype == torch.bfloat16
    ids = gpu.tokenizer.encode(PROMPTS[1])
    logits = prefill_logits(gpu.model, [ids])[0]
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


@pytest.fixture(scope="module")
def llama8b():
    model = random_model(LLAMA3_8B, get_ops("deterministic", "cuda"), torch.bfloat16, seed=0)
    yield model
    del model
    torch.cuda.empty_cache()


def test_8b_shaped_model_runs_batch_invariantly(llama8b):
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, LLAMA3_8B.vocab_size, (n,), generator=gen).tolist() for n in (100, 37, 5)]
    batched = prefill_logits(llama8b, prompts)
    assert [tuple(x.shape) for x in batched] == [(n, LLAMA3_8B.vocab_size) for n in (100, 37, 5)]
    assert all(torch.isfinite(x).all() for x in batched)
    assert torch.equal(prefill_logits(llama8b, prompts[1:2])[0], batched[1])


def test_8b_shaped_model_decodes_like_it_prefills(llama8b):
    # bf16: a decode step and a prefill row may round differently, so compare values, not argmax.
    prompt, continuation = list(range(1000, 1040)), list(range(2000, 2008))
    steps = decode_logits(llama8b, prompt, continuation)
    full = prefill_logits(llama8b, [prompt + continuation])[0][len(prompt) - 1:]
    assert float((steps - full).abs().max()) <= 0.05 * float(full.abs().max())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_weights_digest_at_load_is_the_same_on_cuda_and_cpu(tmp_path, dtype):
    path = write_tiny_checkpoint(tmp_path, "llama3", seed=4)
    cpu = load_model(path, device="cpu", dtype=dtype)
    gpu = load_model(path, device="cuda", dtype=dtype)
    assert gpu.model.device.type == "cuda" and gpu.weights == cpu.weights
    other = load_model(write_tiny_checkpoint(tmp_path / "other", "llama3", seed=5), device="cuda", dtype=dtype)
    assert other.weights != gpu.weights  # negative control: other weights, another digest


def test_weights_digest_of_an_8b_model_is_fast_on_the_device_and_equals_the_cpu_one(llama8b):
    """16 GB of bf16 digested where they live: well under a second of load time on an H200. Its largest tensors
    (the embedding and the layer 0 MLP, more than one chunk each) give the CPU's digest when copied to the host."""
    weights_digest(llama8b.layers[0].named_parameters())  # warm-up: the kernels' first launch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    weights_digest(llama8b.named_parameters())
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) < 2000.0, f"{start.elapsed_time(end):.0f} ms"
    some = [("embed_tokens", llama8b.embed_tokens), ("gate_up", llama8b.layers[0].gate_up_proj)]
    assert weights_digest(some) == weights_digest([(n, t.cpu()) for n, t in some])
