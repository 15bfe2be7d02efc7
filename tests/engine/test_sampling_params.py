import pytest

from samebits.engine.outputs import CompletionOutput, Logprob, RequestOutput
from samebits.engine.sampling_params import ContextLengthError, SamplingParams, check_context_length
from samebits.engine.sequence import Sequence, SequenceStatus, make_sequences


def test_defaults_match_issue():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens) == (1.0, 1.0, -1, 0.0, 16)
    assert (p.stop, p.stop_token_ids, p.ignore_eos, p.seed, p.n, p.logprobs) == (None, None, False, None, 1, None)


@pytest.mark.parametrize(
    "kwargs, field, limit",
    [
        ({"temperature": -0.1}, "temperature", ">= 0"),
        ({"temperature": float("inf")}, "temperature", "finite"),
        ({"temperature": float("nan")}, "temperature", "finite"),
        ({"top_p": 0.0}, "top_p", "(0, 1]"),
        ({"top_p": 1.5}, "top_p", "(0, 1]"),
        ({"top_k": -2}, "top_k", ">= 1"),
        ({"min_p": -0.01}, "min_p", "[0, 1]"),
        ({"min_p": 1.01}, "min_p", "[0, 1]"),
        ({"max_tokens": 0}, "max_tokens", ">= 1"),
        ({"max_tokens": True}, "max_tokens", ">= 1"),
        ({"n": 0}, "n", ">= 1"),
        ({"logprobs": 21}, "logprobs", "[0, 20]"),
        ({"logprobs": -1}, "logprobs", "[0, 20]"),
        ({"seed": -1}, "seed", "2**63"),
        ({"seed": 2**63}, "seed", "2**63"),
        ({"seed": 1.5}, "seed", "2**63"),
        ({"stop": 3}, "stop", "str"),
        ({"stop": ["a", 3]}, "stop", "str"),
        ({"stop": [""]}, "stop", "non-empty"),
        ({"stop_token_ids": [-1]}, "stop_token_ids", ">= 0"),
        ({"ignore_eos": 1}, "ignore_eos", "bool"),
        ({"skip_special_tokens": None}, "skip_special_tokens", "bool"),
        ({"include_stop_str_in_output": 0}, "include_stop_str_in_output", "bool"),
        ({"top_k": False}, "top_k", ">= 1"),
    ],
)
def test_validation_names_field_and_limit(kwargs, field, limit):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert field in str(err.value) and limit in str(err.value)


def test_edges_accepted_and_helpers():
    p = SamplingParams(temperature=0, top_p=1, top_k=1, min_p=1, max_tokens=1, seed=2**63 - 1, logprobs=20,
                       stop="x", stop_token_ids=[0, 5])
    assert p.stop_strings == ("x",) and p.stop_token_set == {0, 5}
    assert SamplingParams(stop=["a", "b"]).stop_strings == ("a", "b")
    assert SamplingParams(logprobs=0).logprobs == 0


def test_top_k_zero_is_off_as_in_vllm():
    assert SamplingParams(top_k=0) == SamplingParams(top_k=-1) and SamplingParams(top_k=0).top_k == -1


@pytest.mark.parametrize("name, words", [
    ("temprature", ["'temprature' is unknown", "temperature", "top_k", "skip_special_tokens"]),
    ("bad_words", ["'bad_words' is a vLLM field samebits does not implement", "temperature"]),
])
def test_unknown_names_are_named_with_the_valid_ones(name, words):
    with pytest.raises(TypeError) as err:
        SamplingParams(**{name: 0.5})
    assert all(w in str(err.value) for w in words), str(err.value)


def test_frozen():
    with pytest.raises(AttributeError):
        SamplingParams().temperature = 0.5


def test_outputs_shape():
    c = CompletionOutput(0, "hi", [1, 2], [-0.5, -0.25], None, -0.75, None)
    assert not c.finished()
    r = RequestOutput("r", "p", [3], [c], num_cached_tokens=0, seed=7, fingerprint="abc")
    assert r.outputs[0].token_ids == [1, 2] and not r.finished


def test_logprobs_in_vllms_shape():
    """logprobs[i][token_id] -> Logprob; the top-k carry their rank and win over the sampled entry, as in vLLM."""
    c = CompletionOutput(0, "ab", [5, 6], [-0.5, -2.0], [{5: -0.5, 9: -1.0}, {9: -0.25, 4: -1.5}],
                         token_ranks=[1, 7], decode=lambda ids: f"<{ids[0]}>")
    lp = c.logprobs
    assert len(lp) == 2 and lp[0][5] == Logprob(-0.5, 1, "<5>") and lp[0][9].rank == 2
    assert lp[1][6] == Logprob(-2.0, 7, "<6>")  # sampled outside the top-k: its real rank, the sampler's count
    assert list(lp[1]) == [6, 9, 4] and lp[-1] == lp[1] and lp[:1] == [lp[0]]
    assert [step[t].logprob for step, t in zip(lp, c.token_ids)] == c.token_logprobs
    assert CompletionOutput(0, "", [1], None).logprobs is None
    assert CompletionOutput(0, "", [1], [-1.0]).logprobs[0][1].decoded_token is None


def test_sequences_of_a_request():
    seqs = make_sequences("r", [1, 2, 3], SamplingParams(n=3), seed=9, arrival=10)
    assert [s.sample_index for s in seqs] == [0, 1, 2] and [s.arrival for s in seqs] == [10, 11, 12]
    assert len({s.seq_id for s in seqs}) == 3 and all(s.seed == 9 for s in seqs)
    seqs[0].reserve_token()
    seqs[0].resolve_token(4)
    assert seqs[1].token_ids == [1, 2, 3], "siblings must not share the token list"
    s = seqs[0]
    assert (s.num_tokens, s.num_prompt_tokens, s.num_generated, s.num_uncomputed) == (4, 3, 1, 4)
    assert s.output_token_ids == [4] and s.prompt_token_ids == [1, 2, 3] and s.status is SequenceStatus.WAITING


def test_empty_prompt_rejected():
    with pytest.raises(ValueError, match="at least 1 token"):
        Sequence("r", [])


def test_context_length_names_the_field_to_blame():
    check_context_length(10, 6, 16)
    with pytest.raises(ContextLengthError, match="your prompt has 16 tokens") as e:
        check_context_length(16, 1, 16)
    assert e.value.field == "prompt"
    with pytest.raises(ContextLengthError, match=r"requested 17 tokens \(10 in the messages, 7 in") as e:
        check_context_length(10, 7, 16, where="messages")
    assert e.value.field == "max_tokens" and isinstance(e.value, ValueError)


def test_output_kind_is_vllms_enum_and_delta_is_refused():
    from samebits.engine.sampling_params import RequestOutputKind

    assert SamplingParams().output_kind is RequestOutputKind.CUMULATIVE
    assert SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY).output_kind == 2
    for bad in (RequestOutputKind.DELTA, "final_only", 2):
        with pytest.raises(ValueError, match="output_kind must be RequestOutputKind.CUMULATIVE or FINAL_ONLY"):
            SamplingParams(output_kind=bad)
