"""BenchConfig refuses every bad value with the flag's name and its limit."""
import pytest

from samebits.bench.config import BenchConfig

BAD = [
    ({"requests": 0}, r"--requests must be an int in \[1, 65536\], got 0"),
    ({"requests": True}, r"--requests must be an int"),
    ({"prompt_tokens": (0, 8)}, r"--prompt-tokens MIN must be an int in \[1, 1048576\], got 0"),
    ({"output_tokens": (16, 8)}, r"--output-tokens MAX must be an int in \[16, 1048576\], got 8"),
    ({"prompt_tokens": (8,)}, r"--prompt-tokens takes two numbers, MIN MAX"),
    ({"rerun_alone": 9, "requests": 8}, r"--rerun-alone must be an int in \[0, 8\], got 9"),
    ({"mode": "slow"}, r"--mode must be one of deterministic, fast, both, got 'slow'"),
    ({"random_shape": "70b"}, r"--random-shape must be one of 1b, 8b, mixtral-8x7b, .*, tiny-moe, got '70b'"),
    ({"random_shape": "tiny", "model": "m.gguf"}, r"--model m.gguf and --random-shape tiny both given"),
    ({"seed": -1}, r"--seed must be an int in \[0, 9223372036854775807\], got -1"),
    ({"quantization": "int4"}, r"--quantization must be None or one of \('fp8', 'fp8_per_tensor'\), got 'int4'"),
]


@pytest.mark.parametrize("values,message", BAD)
def test_bad_value_names_the_flag_and_its_limit(values, message):
    with pytest.raises(ValueError, match=message):
        BenchConfig(**values)


def test_unknown_keys_are_refused_and_modes_run_deterministic_first():
    with pytest.raises(ValueError, match=r"unknown BenchConfig keys \['request'\]"):
        BenchConfig.from_dict({"request": 4})
    assert BenchConfig().modes == ("deterministic", "fast")
    assert BenchConfig(mode="fast").modes == ("fast",)
    assert BenchConfig(requests=1, rerun_alone=0).rerun_alone == 0
