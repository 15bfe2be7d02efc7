"""The draft-model drafter: the target's vocabulary or a refusal naming the field; its drafts are its own greedy
decoding (deterministic mode, so bit for bit), kept level with the target's tokens after rejections."""
from types import SimpleNamespace

import pytest

from samebits.engine.config import EngineConfig
from samebits.engine.llm import LLM
from samebits.engine.sampling_params import SamplingParams
from samebits.engine.sequence import Sequence
from samebits.engine.spec_decode.draft_model import DraftModelDrafter, check_vocabulary, load_draft
from samebits.models import load_model
from samebits.models.synthetic import write_tiny_checkpoint

SMALL = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1}


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("draft"), "llama3", seed=2, **SMALL))


def test_a_draft_with_another_vocabulary_is_refused_at_load(tmp_path, draft_path):
    other = write_tiny_checkpoint(tmp_path / "other", "llama3", seed=3, vocab_size=384, **SMALL)
    spec = {"method": "draft_model", "model": str(other), "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match=r"speculative_config\.model: the draft model's vocab_size 384 differs from "
                                         r"the target's 320"):
        LLM(draft_path, device="cpu", kv_cache_tokens=1024, speculative_config=spec)
    with pytest.raises(FileNotFoundError, match="no model"):
        LLM(draft_path, device="cpu", kv_cache_tokens=1024, speculative_config={**spec, "model": str(tmp_path / "x")})


def test_a_tokenizer_that_reads_ids_otherwise_is_refused():
    def loaded(vocab: dict):
        backend = SimpleNamespace(get_vocab=lambda with_added_tokens: vocab)
        return SimpleNamespace(config=SimpleNamespace(vocab_size=2), tokenizer=SimpleNamespace(backend=backend))

    check_vocabulary(loaded({"a": 0, "b": 1}), loaded({"a": 0, "b": 1}))
    says = r"speculative_config\.model: the draft model's tokenizer maps tokens to other"
    with pytest.raises(ValueError, match=says):
        check_vocabulary(loaded({"a": 1, "b": 0}), loaded({"a": 0, "b": 1}))


def test_the_target_named_as_its_own_draft_is_shared(draft_path):
    target = load_model(draft_path, device="cpu")
    assert load_draft(draft_path, "deterministic", target) is target


def greedy(llm, tokens: list[int], k: int) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=k, ignore_eos=True)
    return list(llm.generate([tokens], params, use_tqdm=False)[0].outputs[0].token_ids)


def test_drafts_are_the_drafts_greedy_decoding_after_acceptance_and_rejection(draft_path):
    loaded = load_model(draft_path, device="cpu")
    config = EngineConfig(draft_path, device="cpu", block_size=16, max_num_batched_tokens=32)
    drafter = DraftModelDrafter(4, loaded, config, num_tokens=128, max_model_len=512)
    alone = LLM(draft_path, device="cpu", kv_cache_tokens=1024)
    a, b = Sequence("a", list(range(3, 40))), Sequence("b", [5, 6, 7])  # a's prompt takes two 32-row forwards
    first = drafter.propose([a, b])
    assert first == {a.seq_id: greedy(alone, a.token_ids, 4), b.seq_id: greedy(alone, b.token_ids, 4)}
    a.token_ids += first[a.seq_id][:2] + [(first[a.seq_id][2] + 1) % 320]  # two accepted, then another token
    b.token_ids += first[b.seq_id] + [9]  # all four accepted, and the bonus token
    second = drafter.propose([a, b])
    assert second == {a.seq_id: greedy(alone, a.token_ids, 4), b.seq_id: greedy(alone, b.token_ids, 4)}
    assert drafter.propose([b]) == {b.seq_id: second[b.seq_id]}  # a is dropped: its blocks return to the pool
    assert drafter.bm.num_free_blocks == drafter.bm.num_blocks - 1  # b's 8 tokens and 3 drafts: one block


def test_a_shadow_without_blocks_drafts_nothing_and_drafts_stop_at_the_context(draft_path):
    loaded = load_model(draft_path, device="cpu")
    config = EngineConfig(draft_path, device="cpu", block_size=16)
    drafter = DraftModelDrafter(4, loaded, config, num_tokens=64, max_model_len=48)
    near_end, big = Sequence("end", list(range(3, 49))), Sequence("big", list(range(3, 40)))
    drafts = drafter.propose([near_end, big])  # 46 tokens take 3 of the 4 blocks; 37 more do not fit
    assert list(drafts) == [near_end.seq_id] and len(drafts[near_end.seq_id]) == 48 - 46
    assert drafter.bm.num_free_blocks == 1
