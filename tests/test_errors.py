"""FieldError carries its field as data, across a pickle (the engine process's pipe) as well."""
from __future__ import annotations

import pickle

import pytest

from samebits.engine.config import EngineConfig
from samebits.engine.sampling_params import ContextLengthError
from samebits.errors import FieldError, require
from samebits.structured.grammar import GrammarError


@pytest.mark.parametrize("error", [FieldError("top_p", "top_p must be in (0, 1], got 2"),
                                   ContextLengthError("max_tokens", "This model's maximum context length is 8"),
                                   GrammarError("regex", "unclosed group")])
def test_field_error_pickles_with_its_field(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and back.field == error.field and str(back) == str(error)
    assert isinstance(back, ValueError)


def test_require_raises_only_when_not_ok():
    require(True, "n", "n must be an int >= 1")
    with pytest.raises(FieldError, match=r"^n must be an int >= 1$") as e:
        require(False, "n", "n must be an int >= 1")
    assert e.value.field == "n"


@pytest.mark.parametrize(("values", "field"), [({"max_num_seqs": 0}, "max_num_seqs"), ({"dtype": "fp12"}, "dtype"),
                                               ({"quantization": "int3"}, "quantization"), ({"mode": "turbo"}, "mode"),
                                               ({"seed": -1}, "seed"), ({"block_size": 3}, "block_size")])
def test_engine_config_errors_name_their_field(values, field):
    with pytest.raises(FieldError, match=f"^{field}") as e:
        EngineConfig(**values)
    assert e.value.field == field


def test_unknown_config_keys_are_no_field():
    with pytest.raises(ValueError, match="unknown EngineConfig keys") as e:
        EngineConfig.from_dict({"turbo": True})
    assert not isinstance(e.value, FieldError)
