"""Hub ids from the local Hugging Face cache (models/hf_cache.py): `LLM(model="HuggingFaceTB/SmolLM2-135M-Instruct")`
failed on 2026-12-04 with the model in the cache; vLLM resolves it offline from HF_HUB_CACHE or HF_HOME."""
from __future__ import annotations

import pytest

from samebits.models.loader import resolve_path
from samebits.models.synthetic import write_tiny_checkpoint, write_tiny_gguf

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _cache(hub, repo: str = REPO, revision: str = "0123abcd"):
    """A cache laid out as huggingface_hub writes it: refs/main names the snapshot folder."""
    folder = hub / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    return folder / "snapshots" / revision


@pytest.fixture(autouse=True)
def no_cache_of_the_user(monkeypatch, tmp_path):
    for name in ("HF_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_hub_id_loads_from_hf_hub_cache_offline(monkeypatch, tmp_path):
    from samebits.engine.llm import LLM
    from samebits.engine.sampling_params import SamplingParams

    snapshot = write_tiny_checkpoint(_cache(tmp_path / "hub"), "smollm2")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    llm = LLM(model=REPO, device="cpu", kv_cache_tokens=1024, max_model_len=64)
    assert llm.llm_engine.loaded.path == snapshot and llm.llm_engine.model_name == REPO
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 2


def test_hf_home_and_a_gguf_repository(monkeypatch, tmp_path):
    gguf = write_tiny_gguf(_cache(tmp_path / "hf" / "hub", "org/tiny-GGUF") / "tiny.Q8_0.gguf")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert resolve_path("org/tiny-GGUF") == ("org/tiny-GGUF", gguf)


def test_missing_hub_id_is_one_line_naming_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError) as err:
        resolve_path(REPO)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct") in message
    assert "never downloads" in message
    # A local folder of that name wins over the cache: ids and paths never shadow each other silently.
    local = write_tiny_checkpoint(tmp_path / "HuggingFaceTB" / "SmolLM2-135M-Instruct", "smollm2")
    monkeypatch.chdir(tmp_path)
    assert resolve_path(REPO)[1].resolve() == local.resolve()
