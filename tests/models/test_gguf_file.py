"""Our GGUF header reader agrees with the gguf package's GGUFReader, field by field and byte by byte; our
dequantized weights are the gguf package's, bit for bit."""
import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize

from samebits.models.gguf_file import read_gguf
from samebits.models.loader_gguf import SUPPORTED_TYPES, gguf_config, gguf_name, iter_tensors, load_gguf
from samebits.models.synthetic import K_QUANT_SCALES, write_tiny_gguf
from tests.models.helpers import get_test_ops

K_QUANTS = sorted(K_QUANT_SCALES)
# K-quant blocks are 256 wide: every row width of the tiny model (hidden, q width, intermediate) is 256.
K_WIDE = {"hidden_size": 256}


def _q4_k_m(name: str) -> str:
    """As llama.cpp's Q4_K_M recipe: Q6_K for v_proj and down_proj, Q4_K for the rest, one Q5_0 fallback."""
    if name.endswith(("v_proj.weight", "down_proj.weight")):
        return "Q6_K"
    return "Q5_0" if name == "model.embed_tokens.weight" else "Q4_K"


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", *K_QUANTS])
def test_reader_matches_gguf_package(tmp_path, qtype):
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", qtype=qtype, **K_WIDE)
    meta, tensors = read_gguf(path)
    reference = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    assert meta == fields
    assert [(t.name, t.tensor_type, t.shape) for t in tensors] == [
        (t.name, t.tensor_type, tuple(int(d) for d in reversed(t.shape))) for t in reference.tensors]
    for ours, ref in zip(tensors, reference.tensors):
        assert np.array_equal(ours.data.reshape(-1), np.asarray(ref.data).view(np.uint8).reshape(-1))


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(tmp_path / "x.gguf")


@pytest.mark.parametrize("qtype", [*K_QUANTS, "Q5_0", "Q5_1", _q4_k_m])
def test_loaded_weights_are_gguf_dequantize_bit_for_bit(tmp_path, qtype):
    # qwen2: no Q/K un-permutation, so every tensor handed to load_weights is gguf's dequantized tensor as it stands.
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", qtype=qtype, **K_WIDE)
    reference = {t.name: t for t in gguf.GGUFReader(path).tensors}
    meta, tensors = read_gguf(path)
    config = gguf_config(tensors, meta)
    loaded = dict(iter_tensors(tensors, config))
    types = set()
    for name, values in loaded.items():
        ref = reference[gguf_name(name)]
        types.add(ref.tensor_type.name)
        expected = dequantize(np.asarray(ref.data), ref.tensor_type).astype(np.float32).reshape(values.shape)
        assert np.array_equal(values.numpy().view(np.uint32), expected.view(np.uint32)), name
        assert torch.equal(values, dict(iter_tensors(tensors, config))[name])
    assert ({"Q4_K", "Q6_K", "Q5_0"} if callable(qtype) else {qtype}) | {"F32"} == types
    model, _, _ = load_gguf(path, get_test_ops(), torch.float32)
    assert torch.equal(model.embed_tokens, loaded["model.embed_tokens.weight"])


def test_every_supported_type_is_one_the_package_dequantizes():
    for qtype in SUPPORTED_TYPES:
        block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        raw = np.zeros((1, block_bytes), dtype=np.uint8)
        assert dequantize(raw, qtype).shape == (1, block)
