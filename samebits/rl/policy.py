"""`Policy`: the trainable model, the engine's own forward (models/llama.py) on `TrainOps` (rl/train_ops.py).

`policy.logprobs(prompts, completions)` packs whole sequences (varlen, no padding rows) into one flat batch over a
scratch paged KV cache and returns each completion token's logprob, differentiable. Every row is computed by the
engine's invariant kernels, which give a row the same bits whatever else is in the batch, and in prefill as in
decode; so the trainer's logprobs are the rollout's bit for bit, whatever the trainer's batch composition,
micro-batch size or order. `sampling_params` switches from the raw distribution to the sampling one (rl/sampling.py).
"""
from __future__ import annotations

import torch
from torch import nn

from samebits.arith import cdiv
from samebits.kernels import get_ops
from samebits.kernels.attention import AttentionMetadata
from samebits.kernels.common import to_device
from samebits.kernels.kv_cache import allocate_kv_cache
from samebits.models.config import ModelConfig
from samebits.models.llama import LlamaModel
from samebits.models.registry import build_model
from samebits.rl.sampling import per_row_params, token_logprobs
from samebits.rl.train_ops import TrainOps

# The scratch cache's page size: attention's bits never depend on it (kernels/attention.py), so any power of two does.
BLOCK_SIZE = 16


class Policy(nn.Module):
    """Owns its weights (trainable parameters of a LlamaModel); `mode` picks the forward's kernels: deterministic
    (the engine's) or fast (stock torch, the negative control)."""

    def __init__(self, model: LlamaModel, mode: str = "deterministic"):
        super().__init__()
        _refuse_fp8(model)
        model.set_ops(TrainOps(get_ops(mode, model.device)))
        for p in model.parameters():
            p.requires_grad_(True)
        self.model = model.train()

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def ops(self) -> TrainOps:
        return self.model.ops

    # ---- loading -------------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, name_or_path, device=None, dtype=None, mode: str = "deterministic") -> Policy:
        """From a built-in name, an HF folder or a GGUF file: the engine's loader, so the engine's weights."""
        from samebits.models import load_model

        return cls(load_model(name_or_path, mode, device, dtype).model, mode)

    @classmethod
    def from_hf(cls, hf_model: nn.Module, device=None, dtype=None, mode: str = "deterministic") -> Policy:
        """From a transformers LlamaForCausalLM (or Mistral, Qwen2, Qwen3 and the MoE families) module's config and
        weights."""
        config = ModelConfig.from_hf(hf_model.config.to_dict())
        first = next(hf_model.parameters())
        model = build_model(config, get_ops(mode, device or first.device), dtype or first.dtype)
        model.load_weights(hf_model.state_dict().items())
        return cls(model, mode)

    @classmethod
    def from_model(cls, source: LlamaModel, device=None, mode: str = "deterministic") -> Policy:
        """A trainable copy of a samebits model's weights (e.g. an engine's: `llm.engine.loaded.model`)."""
        _refuse_fp8(source)
        model = build_model(source.config, get_ops(mode, device or source.device), source.dtype)
        with torch.no_grad():
            for mine, theirs in zip(model.parameters(), source.parameters(), strict=True):
                mine.copy_(theirs)
        return cls(model, mode)

    # ---- the forward ---------------------------------------------------------------------------------------------
    def forward(self, prompts, completions, sampling_params=None) -> list[torch.Tensor]:
        return self.logprobs(prompts, completions, sampling_params)

    def logprobs(self, prompts: list[list[int]], completions: list[list[int]],
                 sampling_params=None) -> list[torch.Tensor]:
        """Per sequence, [len(completion)] float32 logprobs of its completion tokens given everything before them.

        `sampling_params`: None for the raw distribution, or a SamplingParams (one for all, or one per sequence)
        for the distribution the sampler drew from under it."""
        self._check(prompts, completions)
        params = per_row_params(sampling_params, completions)
        # Row p predicts token p + 1, so a completion's last token is never an input.
        seqs = [list(p) + list(c)[:-1] for p, c in zip(prompts, completions)]
        hidden = self._hidden(seqs)
        rows, offset = [], 0
        for p, c, s in zip(prompts, completions, seqs):
            rows += range(offset + len(p) - 1, offset + len(p) - 1 + len(c))
            offset += len(s)
        device = self.model.device
        logits = self.model.compute_logits(hidden.index_select(0, to_device(rows, torch.int64, device)))
        targets = to_device([t for c in completions for t in c], torch.int64, device)
        picked = token_logprobs(logits, targets, self.ops, params)
        return list(picked.split([len(c) for c in completions]))

    def _hidden(self, seqs: list[list[int]]) -> torch.Tensor:
        """Final hidden states [T, H] of the packed sequences, each a whole prefill over its own scratch blocks."""
        cfg, model = self.config, self.model
        lens = [len(s) for s in seqs]
        tables, first = [], 0
        for n in lens:
            tables.append(list(range(first, first + cdiv(n, BLOCK_SIZE))))
            first += len(tables[-1])
        meta = AttentionMetadata.build(lens, lens, tables, BLOCK_SIZE, model.device)
        caches = allocate_kv_cache(cfg.num_layers, first, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim, model.dtype,
                                   model.device)
        ids = to_device([t for s in seqs for t in s], torch.int64, model.device)
        positions = to_device([i for n in lens for i in range(n)], torch.int64, model.device)
        return model(ids, positions, caches, meta)

    def _check(self, prompts, completions) -> None:
        cfg = self.config
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts and {len(completions)} completions")
        for i, (p, c) in enumerate(zip(prompts, completions)):
            if not p or not c:
                raise ValueError(f"sequence {i}: prompt and completion must both be non-empty")
            bad = [t for t in (*p, *c) if not isinstance(t, int) or not 0 <= t < cfg.vocab_size]
            if bad:
                raise ValueError(f"sequence {i}: token ids must be ints in [0, {cfg.vocab_size}); got {bad[0]!r}")
            if len(p) + len(c) - 1 > cfg.max_position_embeddings:
                raise ValueError(f"sequence {i}: {len(p) + len(c)} tokens exceed max_position_embeddings="
                                 f"{cfg.max_position_embeddings}")



def _refuse_fp8(model: LlamaModel) -> None:
    if model.recipe is not None:
        raise ValueError("Policy: FP8 models are not trainable (their linears are e4m3 with scales, docs/FP8.md); "
                         "train the dense checkpoint")
