"""The one progress bar: the loader counts every tensor (HF folder, sharded or not, and GGUF) when asked, and says
nothing where stderr is no terminal (tests, logs) unless asked."""
import pytest

from samebits.models import load_model
from samebits.models.synthetic import write_tiny_checkpoint, write_tiny_gguf


@pytest.mark.parametrize("kind", ["hf", "hf sharded", "gguf"])
def test_loading_counts_every_tensor_when_asked(tmp_path, capsys, kind):
    path = {"hf": lambda: write_tiny_checkpoint(tmp_path, "llama3", seed=1),
            "hf sharded": lambda: write_tiny_checkpoint(tmp_path, "llama3", seed=1, sharded=True),
            "gguf": lambda: write_tiny_gguf(tmp_path / "tiny.gguf", seed=1)}[kind]()
    loaded = load_model(path, device="cpu", progress=True)
    tensors = len(loaded.model.expected_weight_names())
    err = capsys.readouterr().err
    assert f"loading {path.name}" in err and f"{tensors}/{tensors}" in err, err


def test_no_bar_where_stderr_is_no_terminal(tmp_path, capsys):
    """The default (progress=None) in a test, whose stderr is captured: silent; the negative control is above."""
    load_model(write_tiny_checkpoint(tmp_path, "llama3", seed=1), device="cpu")
    assert capsys.readouterr().err == ""
