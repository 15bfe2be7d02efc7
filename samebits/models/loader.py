"""load_model: a built-in name, an HF model folder or a GGUF file -> a model on the kernel registry."""
from __future__ import annotations

import copy
import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from samebits.dtypes import check_quantization, normalize_dtype
from samebits.models.config import ModelConfig
from samebits.models.digest import weights_digest
from samebits.models.llama import LlamaModel
from samebits.models.tokenizer import Tokenizer


@dataclass(frozen=True)
class LoadedModel:
    model: LlamaModel
    tokenizer: Tokenizer
    config: ModelConfig
    name: str
    path: Path
    # Computed once, when the model is built, on the weights' own device (models/digest.py).
    weights: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "weights", weights_digest(self.model.named_parameters()))

    def laid_out_as(self, model) -> LoadedModel:
        """These weights held by `model` in another layout (one rank's shards of them): the digest stays the loaded
        weights', which do not depend on how a runner lays them out."""
        other = copy.copy(self)
        object.__setattr__(other, "model", model)
        return other

    def numerics(self) -> dict:
        """The model's fields of the fingerprint: its weights, their dtype, the config the weights compute under (the
        same weights with another rope_theta or eps give other bits), and the FP8 recipe of its linears (method,
        weight block, activation scaling; None: dense)."""
        config = json.dumps(self.config.hashed_fields(), sort_keys=True).encode()
        recipe = self.model.recipe
        return {"weights": self.weights, "dtype": str(self.model.dtype).removeprefix("torch."),
                "model_config": hashlib.sha256(config).hexdigest()[:16],
                "quantization": recipe.numerics() if recipe is not None else None}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(name: str) -> torch.device:
    """torch.device for `name`; ValueError with the one-line reason when it cannot be used here."""
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {name!r}; use cpu or cuda") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}; use cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name} asked for, but CUDA is not available on this machine")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"no CUDA device {dev.index}; this machine has {torch.cuda.device_count()}")
    return dev


def resolve_dtype(dtype, device: str) -> torch.dtype:
    """None or "auto" -> bf16 on cuda (the serving dtype), fp32 on cpu (where bf16 matmuls are slow and no faster)."""
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    return getattr(torch, normalize_dtype(dtype))


def resolve_path(name_or_path: str | Path) -> tuple[str, Path]:
    """A built-in name is fetched into the cache; anything else must be an existing folder or .gguf file."""
    from samebits.models import hub

    text = str(name_or_path)
    if text in hub.BUILTIN:
        return text, hub.fetch(text)
    path = Path(text).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no model {text!r}: not a built-in name ({', '.join(hub.BUILTIN)}), "
                                "an HF model folder, or a .gguf file")
    return path.name, path


def load_model(name_or_path, mode: str = "deterministic", device=None, dtype=None,
               progress: bool | None = None, quantization: str | None = None) -> LoadedModel:
    """`progress`: a bar of tensors loaded on stderr; None shows it where stderr is a terminal (samebits/progress.py).
    `quantization`: None (the checkpoint's own weights, dense or FP8) or "fp8" / "fp8_per_tensor"
    (models/quantization.py); `dtype` stays the dtype of everything the FP8 recipe leaves dense."""
    from samebits.kernels import get_ops
    from samebits.progress import progress_bar

    device = str(device or default_device())
    resolve_device(device)  # before anything touches the device: one clear line, not torch's assertion
    check_quantization(quantization)
    name, path = resolve_path(name_or_path)
    torch_dtype = resolve_dtype(dtype, device)
    ops = get_ops(mode, device)
    with progress_bar(progress) as bar:
        track = functools.partial(bar.track, description=f"loading {name}")
        model, tokenizer, config = _load_path(path, ops, torch_dtype, track, quantization)
    return LoadedModel(model.eval(), tokenizer, config, name, path)


HF_FOLDER, GGUF_FILE = "HF folder", "GGUF file"


def source_kind(path: Path) -> str:
    """What the loader reads `path` as."""
    if path.is_dir():
        return HF_FOLDER
    if path.suffix == ".gguf":
        return GGUF_FILE
    raise ValueError(f"cannot load {path}: expected an HF model folder or a .gguf file")


def _load_path(path: Path, ops, dtype: torch.dtype, track, quantization: str | None = None):
    if source_kind(path) == HF_FOLDER:
        from samebits.models.loader_hf import load_hf_dir

        return load_hf_dir(path, ops, dtype, track, quantization)
    from samebits.models.loader_gguf import load_gguf

    if quantization is not None:
        raise ValueError(f"quantization={quantization!r} needs an HF safetensors folder; a GGUF file loads "
                         "dequantised to the model dtype")
    return load_gguf(path, ops, dtype, track)
