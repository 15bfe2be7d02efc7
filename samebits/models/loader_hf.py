"""An HF model folder: config.json, safetensors (one file, or shards through the index), tokenizer files."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from samebits.models import quantization as q
from samebits.models.config import ModelConfig, _as_ids
from samebits.models.llama import LlamaModel
from samebits.models.registry import build_model
from samebits.models.tokenizer import Tokenizer
from samebits.progress import untracked

INDEX = "model.safetensors.index.json"


def read_hf_config(path: Path) -> dict:
    file = Path(path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"no config.json in {path}: an HF model folder needs config.json, *.safetensors and "
                                "tokenizer.json")
    return json.loads(file.read_text(encoding="utf-8"))


def read_config(path: Path) -> ModelConfig:
    return ModelConfig.from_hf(read_hf_config(path))


def safetensors_files(path: Path) -> list[Path]:
    """The shard files the index names (all must exist), else every *.safetensors in the folder."""
    path = Path(path)
    index = path / INDEX
    if index.is_file():
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{INDEX} in {path} names shard files that are missing: {missing}")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path} (pickled .bin/.pt checkpoints are not supported)")
    return files


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            names = list(f.keys())  # a safetensors handle, not a dict: iterating it is not supported
            for name in names:
                yield name, f.get_tensor(name)


def generation_eos_ids(path: Path) -> tuple[int, ...]:
    file = Path(path) / "generation_config.json"
    if not file.is_file():
        return ()
    return _as_ids(json.loads(file.read_text(encoding="utf-8")).get("eos_token_id"))


def tensor_count(files: list[Path]) -> int:
    total = 0
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            total += len(list(f.keys()))
    return total


def load_hf_dir(path: Path, ops, dtype: torch.dtype, track=untracked,
                quantization: str | None = None) -> tuple[LlamaModel, Tokenizer, ModelConfig]:
    """`track(tensors, total)`: what counts the tensors as they load (samebits/progress.py). `quantization`: the
    `--quantization` flag (models/quantization.py); an FP8 checkpoint loads as FP8 without it."""
    path = Path(path)
    hf = read_hf_config(path)
    config = ModelConfig.from_hf(hf)
    quant = q.plan(hf.get("quantization_config"), quantization, ops.mode)
    files = safetensors_files(path)
    # Read the tokenizer before the weights so a missing file fails fast.
    tokenizer = Tokenizer.from_hf_dir(path, extra_eos_ids=config.eos_token_ids + generation_eos_ids(path))
    tensors = track(iter_tensors(files), total=tensor_count(files))
    if quant is None:
        model = build_model(config, ops, dtype)
        model.load_weights(tensors)
    else:
        model = q.Fp8LlamaModel(config, ops, dtype, quant.recipe)
        model.load_weights(quant.tensors(tensors, ops.device))
    return model, tokenizer, config
