"""Models named by Hugging Face Hub id ("HuggingFaceTB/SmolLM2-135M-Instruct") resolved from the local Hugging Face
cache, as vLLM resolves them with HF_HUB_OFFLINE=1: never the network. The cache is HF_HUB_CACHE, else
HF_HOME/hub, else ~/.cache/huggingface/hub, read when the model is resolved (not when this module is imported)."""
from __future__ import annotations

import os
from pathlib import Path


def looks_like_hub_id(text: str) -> bool:
    """"org/name": one slash, not a path a user would write for a local folder or file."""
    org, _, name = text.partition("/")
    return text.count("/") == 1 and bool(org) and bool(name) and not text.startswith((".", "~"))


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home).expanduser() / "hub"


def resolve_hub_id(repo_id: str) -> Path:
    """The cached snapshot of `repo_id` at its main revision: the folder (an HF checkpoint) or, for a repository of
    one GGUF file and no config.json, that file. FileNotFoundError, one line naming where it looked."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache()
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    try:
        snapshot = Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        raise FileNotFoundError(f"no model {repo_id!r}: not a local path, and not in the Hugging Face cache (looked "
                                f"in {folder}; HF_HUB_CACHE or HF_HOME move it). samebits never downloads from the "
                                f"Hub: `hf download {repo_id}` puts it there") from None
    if (snapshot / "config.json").is_file():
        return snapshot
    ggufs = sorted(snapshot.glob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    raise FileNotFoundError(f"{repo_id!r} in the Hugging Face cache ({snapshot}) has no config.json and "
                            f"{len(ggufs)} .gguf files; give the path of the one to load")
