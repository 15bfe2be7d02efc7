"""FP8 checkpoints as users have them (models/quantization.py, models/fp8.py): each format loads without loss and
computes what its dequantised model computes, within FP8's tolerance; `--quantization`; the per-tensor dynamic
refusal; the fingerprint names the recipe."""
import json

import pytest
import torch

from samebits.kernels import fp8, get_ops
from samebits.models import UnsupportedModelError, load_model
from samebits.models.quantization import plan
from samebits.models.synthetic import write_tiny_checkpoint, write_tiny_gguf
from samebits.models.synthetic_fp8 import FORMATS, write_dequantized_checkpoint, write_tiny_fp8_checkpoint
from samebits.runtime import fingerprint
from tests.models.helpers import prefill_logits

PROMPTS = [list(range(3, 40)), list(range(100, 117))]
# The stated tolerance against the dequantised model: activations rounded to e4m3 (3 mantissa bits) at every linear
# move the tiny random models' logits by a few percent of their largest.
DEQUANTISED_REL = 0.12
FORMAT_OF = {"block": "fp8", "channel": "compressed-tensors", "static": "compressed-tensors",
             "ct_block": "compressed-tensors"}


def load(path, mode="deterministic", **kw):
    return load_model(path, mode, "cpu", progress=False, **kw)


def rel_error(a: list, b: list) -> float:
    return max(float((x - y).abs().max() / x.abs().max()) for x, y in zip(a, b))


def dequantised_weights(model) -> dict:
    """Each FP8 linear of `model` as e4m3 x scale, float32 [N, K]."""
    out = {}
    for i, layer in enumerate(model.layers):
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            out[f"{i}.{name}"] = fp8.dequantize_weight(getattr(layer, name), getattr(layer, name + "_scale"),
                                                       model.recipe)
    return out


@pytest.mark.parametrize("fmt", sorted(FORMAT_OF))
def test_each_format_loads_losslessly_and_computes_its_dequantised_model(tmp_path, fmt):
    path = write_tiny_fp8_checkpoint(tmp_path / fmt, fmt, scale_dtype=torch.bfloat16 if fmt == "channel" else
                                     torch.float32)
    dense = load(write_dequantized_checkpoint(path, tmp_path / "dense"), "fast")  # the reference: vendor ops
    model = load(path)
    assert model.model.recipe == FORMATS[fmt][3] and model.model.dtype == torch.float32
    # Lossless: the loaded e4m3 values and scales give the dequantised checkpoint's weights bit for bit.
    for i, layer in enumerate(dense.model.layers):
        for name, w in dequantised_weights(model.model).items():
            if name.startswith(f"{i}."):
                assert torch.equal(w, getattr(layer, name.split(".", 1)[1])), name
    ours, want = prefill_logits(model.model, PROMPTS), prefill_logits(dense.model, PROMPTS)
    assert rel_error(want, ours) <= DEQUANTISED_REL
    # The same recipe through the vendor form (fast mode: dequantised weights, F.linear): float32 sums apart, and a
    # rounding to e4m3 they may tip, a fraction of the tolerance.
    assert rel_error(prefill_logits(load(path, "fast").model, PROMPTS), ours) <= DEQUANTISED_REL / 10


def test_quantization_fp8_quantises_a_dense_checkpoint_per_row(tmp_path):
    path = write_tiny_checkpoint(tmp_path / "dense", "qwen3", seed=3)
    dense, model = load(path, "fast"), load(path, quantization="fp8")
    assert model.model.recipe == fp8.Fp8Recipe("channel", "token") and dense.model.recipe is None
    q, scale = fp8.quantize_weight(dense.model.layers[1].gate_up_proj)
    assert torch.equal(model.model.layers[1].gate_up_proj.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(model.model.layers[1].gate_up_proj_scale, scale)
    assert rel_error(prefill_logits(dense.model, PROMPTS), prefill_logits(model.model, PROMPTS)) <= DEQUANTISED_REL
    with pytest.raises(ValueError, match="needs an HF safetensors folder"):
        load(write_tiny_gguf(tmp_path / "m.gguf"), quantization="fp8")
    with pytest.raises(ValueError, match="quantization must be"):
        load(path, quantization="int4")


@pytest.mark.parametrize("source", ["tensor", "hf_tensor", "flag"])
def test_per_tensor_dynamic_scales_are_refused_in_deterministic_mode_and_run_in_fast(tmp_path, source):
    if source == "flag":
        path, flag = write_tiny_checkpoint(tmp_path / "dense", "qwen3"), "fp8_per_tensor"
    else:
        path, flag = write_tiny_fp8_checkpoint(tmp_path / source, source), None
    with pytest.raises(UnsupportedModelError, match=r"batch-variant.*max over the whole batch.*per token.*"
                                                    r"quantization='fp8'"):
        load(path, quantization=flag)
    fast = load(path, "fast", quantization=flag)
    assert fast.model.recipe.activations == "tensor"
    with pytest.raises(UnsupportedModelError, match="batch-variant"):  # and it cannot be switched to deterministic
        fast.model.set_ops(get_ops("deterministic", "cpu"))
    if source != "flag":  # the offered way out: the checkpoint's weights, activations per token
        assert load(path, quantization="fp8").model.recipe.activations == "token"


@pytest.mark.parametrize("change,named", [
    ({"quant_method": "awq"}, "awq"),
    ({"fmt": "e5m2"}, "fmt"),
    ({"weight_block_size": [64, 64]}, "weight_block_size"),
    ({"activation_scheme": "static"}, "activation_scheme"),
    ({"modules_to_not_convert": ["model.layers.0.mlp.down_proj"]}, "modules_to_not_convert"),
])
def test_unsupported_hf_fp8_configs_are_named(change, named):
    with pytest.raises(UnsupportedModelError, match=named):
        plan({**FORMATS["block"][0], **change}, None, "deterministic")


def _ct(path: str, value) -> dict:
    config = json.loads(json.dumps(FORMATS["channel"][0]))
    *keys, last = path.split(".")
    node = config
    for key in keys:
        node = node[key]
    node[last] = value
    return config


@pytest.mark.parametrize("path,value,named", [
    ("kv_cache_scheme", {"num_bits": 8}, "kv_cache_scheme"),
    ("ignore", [], "lm_head"),
    ("ignore", ["lm_head", "re:.*layers\\.3\\..*"], "ignore"),
    ("config_groups.group_0.input_activations", None, "weight-only"),
    ("config_groups.group_0.weights.num_bits", 4, "num_bits"),
    ("config_groups.group_0.input_activations.strategy", "group", "strategy"),
    ("format", "pack-quantized", "format"),
])
def test_unsupported_compressed_tensors_configs_are_named(path, value, named):
    with pytest.raises(UnsupportedModelError, match=named):
        plan(_ct(path, value), None, "deterministic")


def test_the_fingerprint_names_the_recipe(tmp_path):
    block = load(write_tiny_fp8_checkpoint(tmp_path / "b", "block"), "fast")
    channel = load(write_tiny_fp8_checkpoint(tmp_path / "c", "channel"), "fast")
    dense = load(write_tiny_checkpoint(tmp_path / "d", "qwen3"), "fast")
    assert block.numerics()["quantization"] == {"method": "fp8", "format": "float8_e4m3fn", "weights": "block",
                                                "block": [128, 128], "activations": "group"}
    assert channel.numerics()["quantization"]["activations"] == "token" and dense.numerics()["quantization"] is None
    hashes = {fingerprint("deterministic", None, m.numerics())["hash"] for m in (block, channel, dense)}
    assert len(hashes) == 3
    # The recipe alone changes the hash: the same weights told as per-token or per-tensor dynamic.
    fields = channel.numerics()
    other = {**fields, "quantization": {**fields["quantization"], "activations": "tensor"}}
    assert fingerprint("fast", None, other)["hash"] != fingerprint("fast", None, fields)["hash"]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["block", "channel", "static"])
def test_fp8_checkpoints_on_cuda_agree_with_the_cpu_and_are_batch_invariant(tmp_path, fmt):
    path = write_tiny_fp8_checkpoint(tmp_path / fmt, fmt)
    cpu = load(path)
    gpu = load_model(path, "deterministic", "cuda", "fp32", progress=False)
    assert gpu.weights == cpu.weights  # the same e4m3 bytes and scales, digested on each device
    ours = prefill_logits(gpu.model, PROMPTS)
    assert rel_error(prefill_logits(cpu.model, PROMPTS), [o.cpu() for o in ours]) <= DEQUANTISED_REL
    assert torch.equal(prefill_logits(gpu.model, PROMPTS[1:])[0], ours[1])


@pytest.mark.gpu
def test_online_quantisation_gives_the_same_weights_on_cuda_and_cpu(tmp_path):
    path = write_tiny_checkpoint(tmp_path / "dense", "qwen3", seed=3)
    cpu = load(path, quantization="fp8")
    gpu = load_model(path, "deterministic", "cuda", "fp32", progress=False, quantization="fp8")
    assert gpu.weights == cpu.weights


@pytest.mark.gpu
def test_8b_shaped_fp8_model_runs_batch_invariantly():
    from samebits.models import ModelConfig
    from samebits.models.quantization import quantize_dense
    from samebits.models.synthetic import random_model
    from tests.models.helpers import decode_logits

    config = ModelConfig(architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=8192,
                         rope_theta=500000.0)
    model = quantize_dense(random_model(config, get_ops("deterministic", "cuda"), torch.bfloat16), "fp8",
                           "deterministic")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist() for n in (100, 37, 5)]
    batched = prefill_logits(model, prompts)
    assert all(torch.isfinite(x).all() for x in batched)
    assert torch.equal(prefill_logits(model, prompts[1:2])[0], batched[1])
    prompt, continuation = prompts[0][:40], prompts[0][40:48]
    steps = decode_logits(model, prompt, continuation)
    full = prefill_logits(model, [prompt + continuation])[0][len(prompt) - 1:]
    # Values here, as for the bf16 model (test_gpu.py); the bits of prefill against decode are the engine's test
    # (tests/engine/test_fp8_invariance.py, prompt logprobs against decode logprobs).
    assert float((steps - full).abs().max()) <= 0.05 * float(full.abs().max())
    del model
    torch.cuda.empty_cache()


def test_an_fp8_model_is_not_a_policy(tmp_path):
    from samebits.rl.policy import Policy

    with pytest.raises(ValueError, match="FP8 models are not trainable"):
        Policy.from_pretrained(write_tiny_fp8_checkpoint(tmp_path / "c", "channel"), device="cpu")
