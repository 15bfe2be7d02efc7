"""The one seed check (engine/seeds.py check_seed): the engine's seed and a request's take and refuse the same values,
with the same message."""
import pytest

from samebits.engine.config import EngineConfig
from samebits.engine.sampling_params import SamplingParams
from samebits.engine.seeds import SEED_LIMIT


@pytest.mark.parametrize("bad", [-1, SEED_LIMIT, True, 1.0, "1"])
def test_the_engine_and_a_request_refuse_the_same_seeds(bad):
    with pytest.raises(ValueError) as engine:
        EngineConfig(seed=bad)
    with pytest.raises(ValueError) as request:
        SamplingParams(seed=bad)
    assert str(engine.value) == str(request.value) == f"seed must be None or an int in [0, 2**63), got {bad!r}"


@pytest.mark.parametrize("good", [None, 0, SEED_LIMIT - 1])
def test_the_engine_and_a_request_take_the_same_seeds(good):
    assert EngineConfig(seed=good).seed == SamplingParams(seed=good).seed == good
