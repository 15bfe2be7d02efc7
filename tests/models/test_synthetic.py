"""write_tiny_checkpoint: fast, deterministic, loadable; overrides checked."""
import hashlib
import time

import pytest
import torch

from samebits.models.loader_hf import load_hf_dir
from samebits.models.synthetic import VARIANTS, write_tiny_checkpoint
from tests.models.helpers import get_test_ops, prefill_logits


def _digest(folder):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tiny_checkpoint_is_fast_deterministic_and_loads(tmp_path, variant):
    start = time.perf_counter()
    a = write_tiny_checkpoint(tmp_path / "a", variant, seed=3, sharded=variant == "qwen2")
    assert time.perf_counter() - start < 1.0
    b = write_tiny_checkpoint(tmp_path / "b", variant, seed=3, sharded=variant == "qwen2")
    assert _digest(a) == _digest(b)
    model, tok, cfg = load_hf_dir(a, get_test_ops(), torch.float32)
    assert cfg.architecture == VARIANTS[variant]["model_type"]
    logits = prefill_logits(model, [tok.encode("the cat sat on the mat")])[0]
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert tok.eos_token_ids == {2}


def test_seed_changes_weights(tmp_path):
    a = write_tiny_checkpoint(tmp_path / "a", "llama3", seed=0)
    b = write_tiny_checkpoint(tmp_path / "b", "llama3", seed=1)
    assert _digest(a)["model.safetensors"] != _digest(b)["model.safetensors"]


def test_overrides_apply_and_unknown_ones_fail(tmp_path):
    path = write_tiny_checkpoint(tmp_path / "m", "mistral", num_hidden_layers=3, hidden_size=96)
    _, _, cfg = load_hf_dir(path, get_test_ops(), torch.float32)
    assert (cfg.num_layers, cfg.hidden_size) == (3, 96)
    with pytest.raises(ValueError, match="num_layer"):
        write_tiny_checkpoint(tmp_path / "x", "mistral", num_layer=3)
    with pytest.raises(ValueError, match="unknown variant"):
        write_tiny_checkpoint(tmp_path / "y", "gpt2")


def test_random_model_is_seeded_and_runs():
    from samebits.models import ModelConfig
    from samebits.models.synthetic import random_model, tiny_hf_config

    config = ModelConfig.from_hf(tiny_hf_config("qwen3"))
    a, b = (random_model(config, get_test_ops("deterministic"), torch.float32, seed=7) for _ in range(2))
    c = random_model(config, get_test_ops("deterministic"), torch.float32, seed=8)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.embed_tokens, c.embed_tokens)
    logits = prefill_logits(a, [[5, 6, 7], [8, 9]])
    assert [tuple(x.shape) for x in logits] == [(3, 320), (2, 320)]
