"""The engine's fingerprint names the numerics identity of its answers: the runtime's fields plus the weights digest
taken at load, the dtype, the model config, the mode and the tensor-parallel route."""
import pytest

from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.models.synthetic import write_tiny_checkpoint
from samebits.runtime import deterministic_runtime, fingerprint
from samebits.runtime.fingerprint import UNHASHED

SHAPE = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 320}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp")
    return [str(write_tiny_checkpoint(root / f"seed{s}", "llama3", seed=s, **SHAPE)) for s in (1, 2)]


def engine_fingerprint(model: str, **config) -> dict:
    with deterministic_runtime():
        return LLMEngine(EngineConfig(model=model, device="cpu", kv_cache_tokens=256, **config)).fingerprint()


def test_the_same_model_and_dtype_give_the_same_hash(checkpoints):
    first, again = engine_fingerprint(checkpoints[0]), engine_fingerprint(checkpoints[0])
    assert first["hash"] == again["hash"] and first["weights"] == again["weights"]
    assert first["dtype"] == "float32" and first["mode"] == "deterministic"


@pytest.mark.parametrize("change", ["other weights", "dtype", "mode"])
def test_other_weights_dtype_or_mode_give_another_hash(checkpoints, change):
    base = engine_fingerprint(checkpoints[0])
    other = {"other weights": lambda: engine_fingerprint(checkpoints[1]),
             "dtype": lambda: engine_fingerprint(checkpoints[0], dtype="bfloat16"),
             "mode": lambda: engine_fingerprint(checkpoints[0], mode="fast")}[change]()
    assert other["hash"] != base["hash"]
    field = {"other weights": "weights", "dtype": "dtype", "mode": "mode"}[change]
    assert other[field] != base[field]


def test_negative_control_the_runtime_fingerprint_alone_cannot_tell_the_models_apart(checkpoints):
    """What `system_fingerprint` was before the model's fields: the same hash for both checkpoints."""
    with deterministic_runtime():
        runtime = fingerprint("deterministic")
    a, b = (engine_fingerprint(c) for c in checkpoints)
    assert a["hash"] != b["hash"]
    strip = UNHASHED | {"weights", "dtype", "model_config", "quantization"}
    assert {k: v for k, v in a.items() if k not in strip} == {k: v for k, v in runtime.items() if k not in strip} \
        == {k: v for k, v in b.items() if k not in strip}
