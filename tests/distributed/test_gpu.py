"""CUDA (the lead runs these): the Triton K-chunk partials on one GPU; on 2+ GPUs (NCCL) the CPU module's proof
again in bf16: TP-invariant bits at every TP size the host has, deterministic TP=2 run to run and whatever the step,
and the negative control."""
import pytest
import torch

from samebits.engine.sampling_params import SamplingParams
from samebits.models.synthetic import write_tiny_checkpoint
from tests.distributed.helpers import engine, prompts, run

pytestmark = pytest.mark.gpu
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
multi_gpu = pytest.mark.skipif(GPUS < 2, reason="needs 2 or more GPUs")
# head_dim 64: the smallest the CUDA attention kernel takes; heads divisible by TP_MAX=8; bf16.
SHAPE = {"hidden_size": 512, "intermediate_size": 1024, "vocab_size": 1001, "num_attention_heads": 8,
         "num_key_value_heads": 8, "head_dim": 64, "torch_dtype": "bfloat16"}
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, logprobs=2, ignore_eos=True)


def test_triton_partials_are_the_float32_chunk_gemms(seed):
    from samebits.kernels import get_ops
    from samebits.kernels.triton import matmul as tri

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(37, 8 * 128, generator=g, device="cuda").bfloat16()
    w = (torch.randn(8, 256, 128, generator=g, device="cuda") * 0.03).bfloat16()
    out = get_ops("deterministic", "cuda").linear_partials(x, w)
    for i in range(8):
        want = tri.matmul_kn(x[:, i * 128:(i + 1) * 128].contiguous(), w[i].t(), None, None, torch.float32)
        assert torch.equal(out[i].view(torch.int32), want.view(torch.int32)), f"chunk {i}"
    ref = torch.stack([x[:, i * 128:(i + 1) * 128].double() @ w[i].double().t() for i in range(8)])
    assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    one_row = get_ops("deterministic", "cuda").linear_partials(x[5:6], w)
    assert torch.equal(one_row.view(torch.int32), out[:, 5:6].view(torch.int32)), "partials changed with M"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("tp"), "llama3", seed=5, **SHAPE))


def make(ckpt, **kw):
    return engine(ckpt, device="cuda", cuda_graphs=False, **kw)


def test_invariant_mode_on_one_gpu_with_graphs_repeats_and_differs_from_deterministic(ckpt, seed):
    """TP-invariant mode at TP=1 on CUDA: the one rank's sharded model in the one-GPU runner, with decode graphs and
    async scheduling: run to run and alone equal; the plain deterministic kernels give other logprob bits (a K split
    of 8 chunks against one chunk: the negative control)."""
    ps = prompts(6, seed)
    with engine(ckpt, device="cuda", all_reduce="invariant") as llm:
        assert llm.engine.overlap and llm.engine.runner.graphs is not None
        together = run(llm, ps, GREEDY)
        assert run(llm, ps, GREEDY) == together
        assert run(llm, ps[:1], GREEDY) == together[:1]
    with engine(ckpt, device="cuda") as plain:
        assert run(plain, ps, GREEDY) != together


@multi_gpu
def test_invariant_bits_equal_at_every_tp_size(ckpt, seed):
    ps = prompts(8, seed)
    params = [GREEDY if i % 2 else SamplingParams(max_tokens=8, temperature=0.8, seed=seed + i, logprobs=2,
                                                  ignore_eos=True) for i in range(len(ps))]
    with make(ckpt, all_reduce="invariant") as one:
        want = run(one, ps, params)
        scores = one.score(ps[:2], [[5, 6, 7], [8, 9]])
    for tp in (t for t in (2, 4, 8) if t <= GPUS):
        with make(ckpt, tensor_parallel_size=tp, all_reduce="invariant") as llm:
            assert run(llm, ps, params) == want, f"TP={tp}"
            assert llm.score(ps[:2], [[5, 6, 7], [8, 9]]) == scores, f"scores at TP={tp}"


@multi_gpu
def test_deterministic_tp2_run_to_run_and_alone(ckpt, seed):
    ps = prompts(6, seed, lo=40, hi=80)
    with make(ckpt, tensor_parallel_size=2) as llm:
        together = run(llm, ps, GREEDY)
        assert run(llm, ps, GREEDY) == together
        assert [run(llm, [p], GREEDY)[0] for p in ps] == together


@multi_gpu
def test_negative_control_tp2_without_invariance_differs_from_tp1(ckpt, seed):
    ps = prompts(8, seed)
    with make(ckpt) as one, make(ckpt, tensor_parallel_size=2, all_reduce="native") as two:
        assert run(two, ps, GREEDY) != run(one, ps, GREEDY)
