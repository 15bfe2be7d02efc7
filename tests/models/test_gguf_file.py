"""Our GGUF header reader agrees with the gguf package's GGUFReader, field by field and byte by byte."""
import gguf
import numpy as np
import pytest

from samebits.models.gguf_file import read_gguf
from samebits.models.testing import write_tiny_gguf


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_reader_matches_gguf_package(tmp_path, qtype):
    path = write_tiny_gguf(tmp_path / "m.gguf", "qwen2", qtype=qtype)
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
