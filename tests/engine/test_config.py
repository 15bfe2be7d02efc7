import pytest

from samebits.engine.config import EngineConfig


def test_defaults_match_issue():
    c = EngineConfig()
    assert (c.model, c.mode, c.policy, c.device, c.dtype) == ("smollm2-135m", "deterministic", "dynamic", None, None)
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len, c.block_size) == (256, 2048, None, None)
    assert (c.kv_cache_tokens, c.enable_prefix_caching, c.cuda_graphs, c.seed, c.max_waiting) == (
        None, True, True, None, None)
    assert (c.tensor_parallel_size, c.all_reduce, c.tp_invariant) == (1, "ordered", False)
    assert EngineConfig(all_reduce="invariant").tp_invariant


def test_block_size_none_takes_the_device_page():
    """64 on CUDA (whole KV tiles per page, samebits/engine/config.py BLOCK_SIZES), 16 elsewhere; a given size stays,
    and the resolved config is validated again."""
    assert (EngineConfig().on_device("cuda").block_size, EngineConfig().on_device("cpu").block_size) == (64, 16)
    assert EngineConfig(block_size=8).on_device("cuda").block_size == 8
    with pytest.raises(ValueError, match="kv_cache_tokens must be None or an int >= 64"):
        EngineConfig(kv_cache_tokens=32).on_device("cuda")


@pytest.mark.parametrize(
    "kwargs, field, limit",
    [
        ({"mode": "exact"}, "mode", "deterministic"),
        ({"policy": "static"}, "policy", "bucketed"),
        ({"model": ""}, "model", "non-empty"),
        ({"max_num_seqs": 0}, "max_num_seqs", ">= 1"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens", ">= 1"),
        ({"max_model_len": 1}, "max_model_len", ">= 2"),
        ({"block_size": 12}, "block_size", "power of two"),
        ({"block_size": 2048}, "block_size", "[1, 1024]"),
        ({"kv_cache_tokens": 8, "block_size": 16}, "kv_cache_tokens", ">= 16"),
        ({"seed": -1}, "seed", "2**63"),
        ({"max_waiting": 0}, "max_waiting", ">= 1"),
        ({"dtype": "int8"}, "dtype", "bfloat16"),
        ({"cuda_graphs": 1}, "cuda_graphs", "bool"),
        ({"enable_prefix_caching": None}, "enable_prefix_caching", "bool"),
        ({"policy": "bucketed", "max_num_seqs": 64, "max_num_batched_tokens": 32}, "max_num_batched_tokens",
         ">= max_num_seqs"),
        ({"tensor_parallel_size": 3}, "tensor_parallel_size", "(1, 2, 4, 8)"),
        ({"tensor_parallel_size": 16}, "tensor_parallel_size", "(1, 2, 4, 8)"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size", "(1, 2, 4, 8)"),
        ({"all_reduce": "ring"}, "all_reduce", "ordered"),
        ({"all_reduce": "invariant", "mode": "fast"}, "all_reduce='invariant'", "deterministic"),
        ({"quantization": "int4"}, "quantization", "fp8_per_tensor"),
    ],
)
def test_validation_names_field_and_limit(kwargs, field, limit):
    with pytest.raises(ValueError) as err:
        EngineConfig(**kwargs)
    assert field in str(err.value) and limit in str(err.value)


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown EngineConfig keys \\['gpu_memory'\\]"):
        EngineConfig.from_dict({"mode": "fast", "gpu_memory": 0.9})
    assert EngineConfig.from_dict({"mode": "fast"}).mode == "fast"


def test_dtype_and_device_normalised():
    assert EngineConfig(dtype="bf16") == EngineConfig(dtype="torch.bfloat16") == EngineConfig(dtype="bfloat16")
    assert EngineConfig(dtype="half").dtype == "float16"
    assert EngineConfig(dtype="auto") == EngineConfig(dtype=None) and EngineConfig(dtype="auto").dtype is None


def test_frozen_and_replace():
    c = EngineConfig()
    with pytest.raises(AttributeError):
        c.mode = "fast"
    assert c.replace(policy="bucketed").policy == "bucketed" and c.policy == "dynamic"
    with pytest.raises(ValueError, match="unknown"):
        c.replace(nope=1)
    assert EngineConfig.from_dict(c.to_dict()) == c


def test_async_scheduling_needs_one_rank():
    with pytest.raises(ValueError, match="async_scheduling=True needs tensor_parallel_size=1, got 2"):
        EngineConfig(async_scheduling=True, tensor_parallel_size=2)
    assert EngineConfig(tensor_parallel_size=2).async_scheduling is None, "unset, the engine leaves it off at TP > 1"
    assert EngineConfig(async_scheduling=True, all_reduce="invariant").async_scheduling, "one rank's sharded model"
