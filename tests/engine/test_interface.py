"""The engine as a server sees it (engine/interface.py): every engine the server holds is a ServedEngine and every
engine it reads is EngineFacts, the test fakes included; one that lacks a member is neither."""
import inspect

import pytest

from samebits.engine.async_engine import AsyncEngine
from samebits.engine.config import EngineConfig
from samebits.engine.engine_process import EngineView, ProcessAsyncEngine
from samebits.engine.interface import EngineFacts, ServedEngine
from samebits.engine.llm_engine import LLMEngine
from samebits.fleet.engine import FleetEngine
from tests.server.fake_engine import FakeLLMEngine
from tests.server.test_sse_bytes import GoldenEngine


def _methods(protocol) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(protocol).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def _refusals(cls, protocol) -> list[str]:
    """Protocol methods that `cls` lacks or whose signature does not take the protocol's arguments."""
    refused = []
    for name, declared in _methods(protocol).items():
        ours = getattr(cls, name, None)
        if not callable(ours):
            refused.append(f"{name}: missing")
            continue
        params = [p for p in declared.parameters.values() if p.name != "self"]
        args = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        kwargs = {p.name: p.name for p in params if p.kind is p.KEYWORD_ONLY}
        try:
            inspect.signature(ours).bind(None, *args, **kwargs)
        except TypeError as e:
            refused.append(f"{name}: {e}")
    return refused


@pytest.mark.parametrize("cls", [AsyncEngine, ProcessAsyncEngine, FleetEngine])
def test_the_servers_engines_take_the_served_engines_calls(cls):
    assert _refusals(cls, ServedEngine) == []


@pytest.mark.parametrize("cls", [LLMEngine, EngineView, FakeLLMEngine, GoldenEngine])
def test_the_engines_the_server_reads_take_its_calls(cls):
    assert _refusals(cls, EngineFacts) == []


def test_an_async_engine_over_each_fake_is_a_served_engine():
    for fake in (FakeLLMEngine(), GoldenEngine()):
        served = AsyncEngine(fake)
        assert isinstance(served, ServedEngine) and isinstance(served.engine, EngineFacts)


def test_an_engine_view_is_engine_facts():
    fake = FakeLLMEngine()
    view = EngineView(EngineConfig(), fake.info(), fake.tokenizer, fake.fingerprint(), fake.stats())
    assert isinstance(view, EngineFacts)


def test_negative_control_an_engine_without_validate_is_refused():
    class NoValidate(FakeLLMEngine):
        validate = None

    assert _refusals(NoValidate, EngineFacts) == ["validate: missing"]
    assert not isinstance(NoValidate(), EngineFacts)
