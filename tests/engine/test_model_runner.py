"""ModelRunner: the proven routes' self-tests run at load, only in deterministic runs: cuBLASLt's on CUDA (before the KV
pool is sized), the CPU GEMM route's on the CPU (weight shapes and both attention tile shapes)."""
import contextlib
from types import SimpleNamespace

import pytest
import torch

from samebits.kernels import vendor_gemm as vg
from samebits.kernels.cpu import attention as cpu_attention
from samebits.kernels.cpu import gemm as cpu_gemm


class _Model(torch.nn.Module):
    """What prove_routes reads of a model: its ops, device, config and GEMM weights (LlamaModel's rule: the 2-D ones)."""

    def __init__(self, device, deterministic):
        super().__init__()
        self.w2, self.b1 = torch.nn.Parameter(torch.zeros(128, 64)), torch.nn.Parameter(torch.zeros(128))
        self.ops = SimpleNamespace(deterministic=deterministic)
        self.device, self.config = torch.device(device), SimpleNamespace(num_kv_heads=2, head_dim=64)

    def gemm_weights(self):
        from samebits.models.llama import LlamaModel

        return LlamaModel.gemm_weights(self)


def _runner(device, deterministic):
    from samebits.engine.model_runner import ModelRunner

    runner = ModelRunner.__new__(ModelRunner)
    runner.model = _Model(device, deterministic)
    runner.device, runner.model_config = runner.model.device, runner.model.config
    return runner


@pytest.mark.parametrize("device,deterministic,route", [("cuda", True, "cublaslt"), ("cuda", False, None),
                                                        ("cpu", True, "cpu"), ("cpu", False, None)])
def test_engine_proves_weight_shapes_only_in_deterministic_runs(monkeypatch, device, deterministic, route):
    seen = {"cublaslt": [], "cpu": [], "attention": []}
    monkeypatch.setattr(vg, "prove_weights", lambda ws: seen["cublaslt"].extend(w.shape for w in ws))
    monkeypatch.setattr(cpu_gemm, "prove_weights", lambda ws: seen["cpu"].extend(w.shape for w in ws))
    monkeypatch.setattr(cpu_attention, "prove", lambda d: seen["attention"].append(d))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    _runner(device, deterministic).prove_routes()
    for name in ("cublaslt", "cpu"):
        assert seen[name] == ([torch.Size([128, 64])] if route == name else []), name
    assert seen["attention"] == ([64] if route == "cpu" else [])


@contextlib.contextmanager
def sync_is_an_error():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["deterministic", "fast"])
def test_a_step_launches_without_a_host_sync_on_cuda(tmp_path, mode):
    """execute() only enqueues: every host input goes up through pinned memory, so the host never waits for the GPU
    while it builds a step (prefill, prompt-logprob rows, graph decode, every sampling stage); only SampledStep's
    read-backs (to_host, prompt_to_host) wait."""
    from samebits.engine.llm import LLM
    from samebits.engine.sampling_params import SamplingParams
    from samebits.models.synthetic import write_tiny_checkpoint

    ckpt = write_tiny_checkpoint(tmp_path, "llama3", seed=3, torch_dtype="bfloat16", hidden_size=256,
                                 intermediate_size=512, vocab_size=1024, num_attention_heads=4, num_key_value_heads=2)
    llm = LLM(str(ckpt), mode=mode, device="cuda", kv_cache_tokens=8192, max_num_seqs=8)
    prompts = [[5 + i] * (9 + 13 * i) for i in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.8, seed=1, top_k=5, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=1.1, seed=2, top_p=0.7, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.9, seed=3, min_p=0.1, max_tokens=12, ignore_eos=True, prompt_logprobs=2)] * 2
    first = llm.generate(prompts, params[:6], use_tqdm=False)  # warm-up: graph capture and kernel compiles may sync
    execute = llm.engine.runner.execute

    def checked(out, previous=None):
        with sync_is_an_error():
            return execute(out, previous)

    llm.engine.runner.execute = checked
    again = llm.generate(prompts, params[:6], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in first]
    with sync_is_an_error(), pytest.raises(RuntimeError):  # negative control: the mode catches a blocking copy
        torch.tensor([1, 2, 3], device="cuda")


def test_read_back_cuts_each_rows_top_logprobs_to_its_own_count(seed):
    """Each sequence gets its own drawn token and logprob, and the first `logprobs` of its row's top alternatives in
    the row's order (the batch reads back the most any row asked for)."""
    from samebits.engine.model_runner import SampledStep
    from samebits.engine.sampler import SamplerOutput
    from samebits.engine.sampling_params import SamplingParams
    from samebits.engine.sequence import Sequence

    gen = torch.Generator().manual_seed(seed)
    counts = [None, 0, 3, 1, 2]
    seqs = [Sequence(f"r{i}", [1], SamplingParams(logprobs=k)) for i, k in enumerate(counts)]
    top_ids = torch.stack([torch.randperm(50, generator=gen)[:3] for _ in seqs])
    out = SamplerOutput(torch.arange(5) + 7, -torch.rand(5, generator=gen), top_ids, -torch.rand(5, 3, generator=gen))
    results = SampledStep(seqs, out).to_host()
    assert list(results) == [s.seq_id for s in seqs]
    for i, (s, k) in enumerate(zip(seqs, counts)):
        r = results[s.seq_id]
        assert (r.token_id, r.logprob) == (7 + i, out.logprobs[i].item())
        want = [(top_ids[i, j].item(), out.top_logprobs[i, j].item()) for j in range(k or 0)]
        assert list(r.top_logprobs.items()) == want


GIB = 2**30


@pytest.mark.parametrize("util,free,want_gib", [(None, 100, 80.0), (0.45, 100, 0.8 * (45 - 2)),
                                                 (0.45, 30, 0.8 * 30), (1.0, 100, 0.8 * 98)])
def test_gpu_memory_utilization_limits_the_kv_cache(monkeypatch, util, free, want_gib):
    """vLLM's gpu_memory_utilization on a 100 GiB GPU (its memory query faked): the KV cache takes its share of the
    budget past the engine's 2 GiB of weights, never more than the free memory allows; None: a share of the free."""
    from samebits.engine.config import EngineConfig
    from samebits.engine.model_runner import GPU_KV_MEMORY_FRACTION, choose_num_blocks, kv_bytes_per_token

    assert GPU_KV_MEMORY_FRACTION == 0.8
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free * GIB, 100 * GIB))
    config = EngineConfig(block_size=64, gpu_memory_utilization=util)
    model = SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=64)
    per_block = kv_bytes_per_token(model, torch.bfloat16) * 64
    got = choose_num_blocks(config, model, torch.bfloat16, torch.device("cuda", 0), 2 * GIB)
    assert got == int(want_gib * GIB) // per_block
    # The CPU's pool is fixed: the flag is accepted and changes nothing there (README, "Coming from vLLM").
    assert choose_num_blocks(config, model, torch.bfloat16, torch.device("cpu"), 2 * GIB) == \
        choose_num_blocks(EngineConfig(block_size=64), model, torch.bfloat16, torch.device("cpu"))
    with pytest.raises(ValueError, match="gpu_memory_utilization=0.01 gives this engine 1.0 GiB"):
        choose_num_blocks(EngineConfig(gpu_memory_utilization=0.01, block_size=64), model, torch.bfloat16,
                          torch.device("cuda", 0), 2 * GIB)
