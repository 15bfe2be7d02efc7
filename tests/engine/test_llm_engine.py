"""LLMEngine behaviour that the invariance suite does not cover: text, stop strings, validation, abort, score errors."""
import pytest

from samebits.engine.llm import LLM
from samebits.engine.sampling_params import SamplingParams
from samebits.models.testing import write_tiny_checkpoint


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "llama3", seed=3)
    return LLM(model=str(path), device="cpu", kv_cache_tokens=4096, max_model_len=256)


def test_incremental_text_equals_full_decode(llm):
    params = SamplingParams(temperature=1.0, seed=4, max_tokens=40, ignore_eos=True)
    for out in llm.generate(["hello world", "the cat sat on the mat"], params, use_tqdm=False):
        c = out.outputs[0]
        assert c.text == llm.tokenizer.decode(c.token_ids)


def test_stop_string_truncates_and_reports(llm):
    params = SamplingParams(temperature=1.0, seed=4, max_tokens=40, ignore_eos=True)
    full = llm.generate(["hello world"], params, use_tqdm=False)[0].outputs[0].text
    stop = full[10:13]
    assert stop and stop in full
    cut = llm.generate(["hello world"], SamplingParams(temperature=1.0, seed=4, max_tokens=40, ignore_eos=True,
                                                       stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == full[:full.find(stop)]


def test_length_limit_message_names_the_numbers(llm):
    with pytest.raises(ValueError, match="maximum context length is 256 tokens.*300 tokens"):
        llm.generate([[5] * 100], SamplingParams(max_tokens=200), use_tqdm=False)


def test_out_of_vocabulary_token_is_refused(llm):
    with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, 320\)"):
        llm.generate([[5, 320]], SamplingParams(max_tokens=2), use_tqdm=False)


def test_abort_frees_every_block(llm):
    engine = llm.engine
    engine.add_request("a", [5] * 50, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.scheduler.bm.usage > 0
    engine.abort_request("a")
    assert not engine.has_unfinished_requests()
    engine.scheduler.bm.check_integrity()
    assert all(b.ref_count == 0 for b in engine.scheduler.bm.blocks)


def test_score_rejects_empty_completion(llm):
    with pytest.raises(ValueError, match="completion_token_ids must not be empty"):
        llm.score([1, 2, 3], [])
