"""A constrained request's bits are a function of the request alone: alone, among 31 others with other grammars or
none, cold or prefix-cached, chunked and preempted, with async scheduling on or off; seeded sampling replays. The
negative control, a mask that is the union of the batch's masks, is caught by the same comparison."""
import json
import random
import re

import jsonschema
import pytest
import torch

from samebits.engine.llm import LLM
from samebits.engine.sampling_params import SamplingParams, StructuredOutputsParams
from samebits.models.synthetic import write_tiny_checkpoint
from tests.structured.helpers import share_masks_across_the_batch

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CONSTRAINTS = [
    StructuredOutputsParams(json=PERSON, disable_any_whitespace=True),
    StructuredOutputsParams(regex=r"[a-f]{2,5}-[0-9]{1,3}"),
    StructuredOutputsParams(choice=["red", "green", "blue whale"]),
    StructuredOutputsParams(json_object=True),
    StructuredOutputsParams(grammar='start: "(" NUM ("+" NUM)* ")"\nNUM: /[0-9]{1,2}/'),
    None,
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "llama3", seed=4))


def make(ckpt, **kw):
    return LLM(model=ckpt, device="cpu", mode="deterministic", **{"kv_cache_tokens": 4096, "max_model_len": 128, **kw})


@pytest.fixture(scope="module")
def llm(ckpt):
    return make(ckpt)


def key(out) -> list[tuple]:
    return [(tuple(c.token_ids), torch.tensor(c.token_logprobs, dtype=torch.float32).view(torch.int32).tolist(),
             c.finish_reason) for c in out.outputs]


def needle_params(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.8, seed=seed, max_tokens=10, logprobs=0, structured_outputs=CONSTRAINTS[0])


def workload(seed: int) -> tuple[list, list]:
    """The needle (a JSON-schema request) first, then 31 others sharing some of its prefix, each with another grammar
    or none, greedy or sampled, n = 1 or 2."""
    rng = random.Random(seed)
    needle = [rng.randrange(3, 300) for _ in range(20)]
    prompts = [needle] + [needle[:rng.choice([0, 16, 20])] + [rng.randrange(3, 300) for _ in range(rng.randint(2, 8))]
                          for _ in range(31)]
    params = [needle_params(seed)]
    params += [SamplingParams(temperature=rng.choice([0.0, 0.7, 1.0]), seed=rng.randrange(1 << 30), n=rng.choice([1, 2]),
                              max_tokens=rng.randint(2, 6), logprobs=0,
                              structured_outputs=rng.choice(CONSTRAINTS)) for _ in range(31)]
    return prompts, params


def run(llm, prompts, params) -> list:
    return [key(o) for o in llm.generate(prompts, params, use_tqdm=False)]


def check_grammars(params, outs) -> None:
    """Every sample that ended by its grammar or eos holds text its grammar accepts."""
    for p, out in zip(params, outs):
        so = p.structured_outputs
        for c in out.outputs:
            if so is None or c.finish_reason != "stop":
                continue
            if so.kind == "json":
                jsonschema.validate(json.loads(c.text), PERSON)
            elif so.kind == "json_object":
                assert isinstance(json.loads(c.text), dict)
            elif so.kind == "regex":
                assert re.fullmatch(so.regex, c.text), c.text
            elif so.kind == "choice":
                assert c.text in so.choice
            else:
                assert re.fullmatch(r"\([0-9]{1,2}(\+[0-9]{1,2})*\)", c.text), c.text


def test_needle_alone_equals_needle_among_31_cached_or_cold_chunked_preempted_async(ckpt, llm, seed):
    prompts, params = workload(seed)
    alone = run(llm, prompts[:1], params[:1])[0]  # cold; it leaves its prompt in the prefix cache
    assert llm.generate(prompts[:1], params[:1], use_tqdm=False)[0].num_cached_tokens > 0
    outs = llm.generate(prompts, params, use_tqdm=False)
    check_grammars(params, outs)
    together = [key(o) for o in outs]
    assert together[0] == alone  # among 31, its prefix cached
    # One engine that changes everything else at once: no prefix cache, 16-token prefill chunks, a KV pool of four
    # pages (preemption by recompute), async scheduling. A mask filled before its row's last token was read back fails
    # loudly (GrammarMatcher.check), so equal bits also mean every grammar step launched ahead was sampled after it.
    perturbed = make(ckpt, async_scheduling=True, enable_prefix_caching=False, kv_cache_tokens=64, max_model_len=64,
                     max_num_batched_tokens=16, max_num_seqs=16)
    assert perturbed.engine.overlap
    assert run(perturbed, prompts, params) == together
    assert perturbed.engine.scheduler.num_preemptions > 0


def test_a_grammar_complete_at_max_tokens_stops_and_one_cut_short_is_length(llm):
    so = StructuredOutputsParams(choice=["yes"])
    n = len(llm.tokenizer.encode("yes", add_special_tokens=False))
    (done, cut) = llm.generate([[7, 8], [7, 8]], [SamplingParams(max_tokens=n, structured_outputs=so),
                                                  SamplingParams(max_tokens=n - 1, structured_outputs=so)],
                               use_tqdm=False)
    assert (done.outputs[0].text, done.outputs[0].finish_reason) == ("yes", "stop")
    assert cut.outputs[0].finish_reason == "length" and "yes".startswith(cut.outputs[0].text)


def test_seeded_sampling_replays_and_another_seed_differs(llm, seed):
    """A regex whose every token is free among several (a compact JSON prefix is forced token by token)."""
    prompts, _ = workload(seed)

    def sampled(s: int) -> list:
        p = SamplingParams(temperature=1.0, seed=s, max_tokens=10, logprobs=0, structured_outputs=CONSTRAINTS[1])
        return run(llm, prompts[:1], [p])[0]

    first = sampled(seed)
    assert sampled(seed) == first
    assert sampled(seed + 1) != first


def test_negative_control_a_mask_shared_by_the_batch_is_caught(llm, seed, monkeypatch):
    """Every grammar row given the union of the batch's masks (a shared mask) changes the needle among others."""
    prompts, params = workload(seed)
    alone = run(llm, prompts[:1], params[:1])[0]
    share_masks_across_the_batch(monkeypatch)
    assert run(llm, prompts, params)[0] != alone


# The CUDA shape of tests/engine/test_invariance.py: bf16, head_dim 128 attention, a vocabulary past the tokenizer's.
CUDA_SHAPE = {"hidden_size": 1024, "intermediate_size": 2816, "vocab_size": 8192, "num_attention_heads": 8,
              "num_key_value_heads": 2, "num_hidden_layers": 4, "torch_dtype": "bfloat16"}


@pytest.mark.gpu
def test_cuda_needle_alone_equals_among_31_with_graphs_and_async_and_a_shared_mask_is_caught(tmp_path, seed,
                                                                                              monkeypatch):
    """On the GPU the grammar masks travel pinned and non-blocking, decode steps replay CUDA graphs and a step with
    grammar rows launched ahead is sampled after the read-back (model_runner.DeferredStep)."""
    ckpt = str(write_tiny_checkpoint(tmp_path, "llama3", seed=4, **CUDA_SHAPE))

    def cuda(**kw):
        return LLM(model=ckpt, device="cuda", mode="deterministic", kv_cache_tokens=16384, max_model_len=256, **kw)

    llm = cuda()
    assert llm.engine.overlap and llm.engine.runner.graphs is not None
    prompts, params = workload(seed)
    alone = run(llm, prompts[:1], params[:1])[0]
    outs = llm.generate(prompts, params, use_tqdm=False)
    check_grammars(params, outs)
    together = [key(o) for o in outs]
    assert together[0] == alone
    tight = cuda(async_scheduling=False, enable_prefix_caching=False, max_num_batched_tokens=16)
    assert run(tight, prompts, params) == together
    assert llm.engine.runner.graphs.graphs, "decode steps replayed CUDA graphs"
    share_masks_across_the_batch(monkeypatch)
    assert run(llm, prompts, params)[0] != alone


def test_a_bad_grammar_is_refused_before_any_request_is_queued(llm):
    from samebits.structured.grammar import GrammarError

    bad = SamplingParams(structured_outputs=StructuredOutputsParams(regex="(ab"))
    with pytest.raises(GrammarError, match="structured_outputs.regex is not valid"):
        llm.generate([[5, 6], [7, 8]], [SamplingParams(max_tokens=2), bad], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
