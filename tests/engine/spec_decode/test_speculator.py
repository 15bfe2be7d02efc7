"""Which steps draft: a step whose drafts keep too little doubles the plain steps before the next try (up to
MAX_BACKOFF); one that keeps enough drafts again at once. The bits never depend on it (test_invariance.py)."""
from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.sampling_params import SamplingParams
from samebits.engine.sequence import Sequence
from samebits.engine.spec_decode.speculator import MAX_BACKOFF, Speculator
from samebits.models.synthetic import write_tiny_checkpoint

DECODING = [Sequence("r", [1, 2, 3], num_computed_tokens=2)]


def tries(speculator, steps: int, verified) -> list[int]:
    """The steps (of `steps`) that draft when every try's chunks are `verified`."""
    out = []
    for step in range(steps):
        if speculator.due(DECODING):
            out.append(step)
            speculator.observe(verified)
    return out


def test_failed_tries_back_off_and_a_good_one_resets():
    s = Speculator(drafter=None, num_speculative_tokens=4)
    assert tries(s, 20, [(4, 0), (4, 0)]) == [0, 2, 5, 10, 19]  # waits of 1, 2, 4, 8 plain steps
    assert tries(s, 200, []) == [16, 49, 114, 179]  # no drafts at all: a failure too; waits capped at MAX_BACKOFF
    assert s.wait == MAX_BACKOFF - (199 - 179)
    s.wait = 0
    assert tries(s, 5, [(4, 1), (4, 0)]) == [0, 1, 2, 3, 4]  # half a token a chunk or more: every step drafts
    assert (s.stats.num_drafts, s.stats.num_accepted_tokens) == (5 * 2 + 5 * 2, 5)
    s.wait = 3
    prefill = [Sequence("p", [1, 2, 3])]
    assert not any(s.due(prefill) for _ in range(10)) and s.wait == 3  # no decoding sequence: not a step between


def test_steps_between_tries_run_as_plain_steps(tmp_path):
    """A drafter that is never right: steps launched ahead (async scheduling) between tries, same outputs."""
    ckpt = str(write_tiny_checkpoint(tmp_path, "llama3", seed=4))
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0)

    def run(spec):
        engine = LLMEngine(EngineConfig(ckpt, device="cpu", kv_cache_tokens=512, async_scheduling=True,
                                        speculative_config=spec))
        if spec:
            engine.speculator.drafter.propose = lambda seqs: {s.seq_id: [0, 0, 0] for s in seqs}
        engine.add_request("r", [5, 6, 7], params)
        while engine.has_unfinished_requests():
            (out,) = engine.step() or (None,)
        return out.outputs[0], engine

    plain, _ = run(None)
    spec, engine = run({"method": "ngram", "num_speculative_tokens": 3})
    assert (spec.token_ids, spec.token_logprobs) == (plain.token_ids, plain.token_logprobs)
    assert 0 not in plain.token_ids and engine.speculator.stats.num_drafts == 5  # tries at decode steps 0, 2, 5, 10, 19
    assert engine.speculator.backoff == 16
