"""Issue 16's CPU proof (gloo, 2 and 4 ranks, one spawn per engine for the whole module).

- deterministic mode at TP=2 and 4: a request's tokens and logprob bits are the same run to run, alone or among others, in
  one prefill chunk or several (so whatever the number of tokens in the step);
- TP-invariant mode: the same bits at TP=1, 2 and 4, for generate (greedy and sampled, top logprobs) and for score;
- negative control: the plain summed all-reduce at TP=2 differs from TP=1 (without the invariant mode the K split
  moves bits), so the equalities above are not trivially true of this model.
"""
import pytest

from samebits.engine.sampling_params import SamplingParams
from tests.distributed.helpers import bits, checkpoint, engine, prompts, run

pytestmark = pytest.mark.timeout(300)

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, logprobs=2, ignore_eos=True)


def sampled(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=6, temperature=0.9, top_p=0.9, seed=seed, logprobs=2, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return checkpoint(tmp_path_factory.mktemp("tp"))


@pytest.fixture(scope="module")
def det2(ckpt):
    with engine(ckpt, tensor_parallel_size=2) as llm:
        yield llm


@pytest.fixture(scope="module")
def det4(ckpt):
    """At 4 ranks the order of the cross-rank sum matters (at 2 it cannot: p0 + p1 = p1 + p0)."""
    with engine(ckpt, tensor_parallel_size=4) as llm:
        yield llm


@pytest.fixture(scope="module")
def invariant(ckpt):
    """TP-invariant engines at TP=1, 2, 4 (all alive for the module: 1 + 1 + 3 processes)."""
    inv = {"all_reduce": "invariant"}
    with engine(ckpt, **inv) as one, engine(ckpt, tensor_parallel_size=2, **inv) as two, \
            engine(ckpt, tensor_parallel_size=4, **inv) as four:
        yield {1: one, 2: two, 4: four}


@pytest.mark.parametrize("tp", [2, 4])
def test_deterministic_same_bits_run_to_run_and_whatever_the_step(tp, request, seed):
    det = request.getfixturevalue(f"det{tp}")
    ps = prompts(8, seed, lo=40, hi=60)
    params = [GREEDY if i % 2 else sampled(seed + i) for i in range(len(ps))]
    together = run(det, ps, params)
    assert run(det, ps, params) == together, f"TP={tp} deterministic differs run to run"
    # Together, the prompts pass the 256-token budget, so some prefill is cut into chunks; alone, none is.
    assert sum(map(len, ps)) > 256
    alone = [run(det, [p], [q])[0] for p, q in zip(ps, params)]
    assert alone == together, "a request's bits changed with the other requests (and tokens) in its steps"


def test_invariant_generate_same_bits_at_tp_1_2_4(invariant, seed):
    ps = prompts(5, seed)
    params = [GREEDY if i % 2 else sampled(seed + i) for i in range(len(ps))]
    want = run(invariant[1], ps, params)
    for tp in (2, 4):
        assert run(invariant[tp], ps, params) == want, f"TP-invariant bits differ between TP=1 and TP={tp}"


def test_invariant_score_same_bits_at_tp_1_2_4(invariant, seed):
    ps, completions = prompts(3, seed), prompts(3, seed + 1, lo=2, hi=12)
    want = invariant[1].score(ps, completions)
    for tp in (2, 4):
        got = invariant[tp].score(ps, completions)
        assert [bits(s) for s in got] == [bits(s) for s in want], f"scores differ between TP=1 and TP={tp}"


def test_invariant_score_equals_generate_logprobs(invariant, seed):
    ps = prompts(2, seed)
    outs = invariant[2].generate(ps, GREEDY, use_tqdm=False)
    scores = invariant[2].score(ps, [o.outputs[0].token_ids for o in outs])
    assert [bits(s) for s in scores] == [bits(o.outputs[0].token_logprobs) for o in outs]


def test_prompt_logprobs_at_tp_2_equal_score_and_tp_1(invariant, det2, seed):
    """The prompt rows ride in the sampled rows' gather (engine/tp_runner.py): at TP=2 they equal the engine's
    own teacher-forced scores, and with the invariant mode TP=1's bits."""
    ps = prompts(3, seed, lo=20, hi=40)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=2)

    def prompt_bits(llm):
        outs = llm.generate(ps, params, use_tqdm=False)
        return [bits([step[t].logprob for step, t in zip(o.prompt_logprobs[1:], p[1:])]) for o, p in zip(outs, ps)]

    for llm in (det2, invariant[2]):
        assert prompt_bits(llm) == [bits(s) for s in llm.score([p[:1] for p in ps], [p[1:] for p in ps])]
    assert prompt_bits(invariant[2]) == prompt_bits(invariant[1])


def test_negative_control_summed_all_reduce_tp2_differs_from_tp1(ckpt, det2, invariant, seed):
    """At two ranks the rank-order sum is the plain summed all-reduce (p0 + p1 = p1 + p0 exactly); the K split alone
    moves bits, which the invariant mode's fixed chunking removes."""
    ps = prompts(5, seed)
    with engine(ckpt) as one:
        plain = run(one, ps, GREEDY)
    assert run(det2, ps, GREEDY) != plain, "TP=2 without the invariant mode gave TP=1's bits: no order is seen"
    assert run(invariant[2], ps, GREEDY) == run(invariant[1], ps, GREEDY)



def test_fingerprint_names_tp_size_route_and_invariance(det2, invariant):
    assert det2.engine.fingerprint()["tensor_parallel"] == {"size": 2, "all_reduce": "ordered", "invariant": False}
    fp = invariant[4].engine.fingerprint()
    assert fp["tensor_parallel"] == {"size": 4, "all_reduce": "ordered", "invariant": True}
    one = invariant[1].engine.fingerprint()
    assert one["tensor_parallel"] == {"size": 1, "all_reduce": None, "invariant": True}
    assert len({det2.engine.fingerprint()["hash"], fp["hash"], one["hash"]}) == 3


def test_invariant_at_tp1_runs_the_one_gpu_runner_on_the_one_rank_shard(invariant):
    """So TP=1 gets CUDA graphs and async scheduling; the bits across sizes are the tests above."""
    from samebits.distributed.model import ShardedLlama
    from samebits.engine.model_runner import ModelRunner

    one = invariant[1].engine
    assert type(one.runner) is ModelRunner and isinstance(one.runner.model, ShardedLlama)
    assert one.loaded.model is one.runner.model, "the full model is not kept beside its shard"


def test_update_weights_refuses_the_sharded_layout(invariant):
    from samebits.engine.weights import WeightsError

    with pytest.raises(WeightsError, match="all_reduce='invariant' is not supported yet"):
        invariant[1].update_weights({})


def test_the_weights_digest_is_the_loaded_models_at_every_tp_size(invariant):
    digests = {tp: llm.engine.fingerprint()["weights"] for tp, llm in invariant.items()}
    assert len(set(digests.values())) == 1, digests


def test_every_tp_size_on_the_cpu_takes_16_token_pages(det2, invariant):
    """block_size None: the device's page (engine/config.py BLOCK_SIZES), for the sharded runners too."""
    assert {e.config.block_size for e in (det2.engine, invariant[1].engine, invariant[4].engine)} == {16}
    assert det2.engine.runner.block_size == 16
