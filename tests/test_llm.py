"""samebits.LLM (samebits/llm.py): one engine, or the fleet's LLM when data_parallel_size > 1; the one-engine LLM
refuses a data_parallel_size it would not honour."""
import pytest

import samebits
from samebits.engine.llm import LLM as EngineLLM
from samebits.fleet.llm import FleetLLM


def _record(seen):
    def init(self, model, **engine_kwargs):
        seen.append((type(self), model, engine_kwargs))

    return init


def test_data_parallel_size_above_one_builds_the_fleets_llm(monkeypatch):
    seen = []
    monkeypatch.setattr(FleetLLM, "__init__", _record(seen))
    llm = samebits.LLM("tiny", data_parallel_size=2)
    assert type(llm) is FleetLLM and seen == [(FleetLLM, "tiny", {"data_parallel_size": 2})]


def test_one_replica_builds_one_engine(monkeypatch):
    seen = []
    monkeypatch.setattr(EngineLLM, "__init__", _record(seen))
    llm = samebits.LLM("tiny", data_parallel_size=1)
    assert isinstance(llm, EngineLLM) and not isinstance(llm, FleetLLM)
    assert seen == [(samebits.LLM, "tiny", {"data_parallel_size": 1})]


def test_the_one_engine_llm_refuses_replicas():
    with pytest.raises(ValueError, match="data_parallel_size=2 runs replicas"):
        EngineLLM("tiny", data_parallel_size=2)
