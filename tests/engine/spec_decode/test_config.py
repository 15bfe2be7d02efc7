"""SpeculativeConfig: vLLM's keys and defaults; every bad value is refused at load with its field and limit."""
import pytest

from samebits.engine.config import EngineConfig
from samebits.engine.spec_decode.config import MAX_SPECULATIVE_TOKENS, SpeculativeConfig


def test_vllms_keys_and_ngram_defaults():
    spec = EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 3}).speculative_config
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max, spec.model) == (5, 5, None)  # vLLM's defaults
    one = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    assert (one.prompt_lookup_min, one.prompt_lookup_max) == (4, 4)  # the bound given fills the other, as vLLM's
    json = '{"method": "draft_model", "model": "/m", "num_speculative_tokens": 2}'
    config = EngineConfig(speculative_config=json)
    assert config.speculative_config == SpeculativeConfig("draft_model", 2, model="/m")
    assert config.replace(seed=1).speculative_config == config.speculative_config  # to_dict and back
    assert EngineConfig().speculative_config is None


@pytest.mark.parametrize("value,says", [
    ({"method": "eagle", "num_speculative_tokens": 2}, ("speculative_config.method must be one of ('ngram', "
                                                       "'draft_model'), got 'eagle'")),
    ({"method": "ngram", "num_speculative_tokens": 0}, ("speculative_config.num_speculative_tokens must be an int in "
                                                       f"[1, {MAX_SPECULATIVE_TOKENS}], got 0")),
    ({"method": "ngram", "num_speculative_tokens": MAX_SPECULATIVE_TOKENS + 1}, f"in [1, {MAX_SPECULATIVE_TOKENS}]"),
    ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens must be an int"),
    ({"method": "ngram"}, "speculative_config.num_speculative_tokens is required"),
    ({"num_speculative_tokens": 2}, "speculative_config.method is required"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1},
     "speculative_config: unknown keys ['draft_tensor_parallel_size']"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "speculative_config.prompt_lookup_min must be <= prompt_lookup_max=2, got 4"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, "prompt_lookup_min must be an int >= 1"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "/m"}, "speculative_config.model is for method"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "speculative_config.model must name the draft model"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "model": "/m", "prompt_lookup_max": 3},
     "speculative_config.prompt_lookup_max is for method 'ngram'"),
    ("{not json", "speculative_config must be a JSON object"),
    (["ngram"], "speculative_config must be None or a dict"),
])
def test_bad_values_name_the_field_and_limit(value, says):
    with pytest.raises(ValueError) as e:
        EngineConfig(speculative_config=value)
    assert says in str(e.value)


@pytest.mark.parametrize("other,says", [
    ({"policy": "bucketed", "max_num_batched_tokens": 256}, "speculative_config needs policy='dynamic'"),
    ({"tensor_parallel_size": 2}, "speculative_config needs tensor_parallel_size=1"),
])
def test_engine_fields_speculation_cannot_run_with(other, says):
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match=says):
        EngineConfig(speculative_config=spec, **other)
    EngineConfig(**other)  # the field alone is fine
