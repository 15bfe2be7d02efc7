"""Which slice of every weight a rank holds (Megatron's split), and in which layout its GEMMs read it.

Every sharded dimension (attention heads, the MLP's intermediate units, the padded vocabulary) is cut into `splits`
equal units: the TP size, or in TP-invariant mode TP_MAX at every TP size. Rank r holds units [r*p, (r+1)*p), p =
splits / world, and runs one GEMM per unit ("piece"), so in TP-invariant mode every GEMM has the shape of one TP_MAX
shard whatever the TP size. Layouts:
- column-parallel (QKV, gate/up, the head): the pieces stacked on the output dim, each piece its parts' rows in order
  ([q; k; v] of its heads, [gate; up] of its units); `ColumnPlan.regroup` puts the outputs back as [q | k | v].
- row-parallel (o_proj, down_proj): [p, N, K/splits], one K chunk per piece, contiguous for the GEMM.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from samebits.arith import cdiv
from samebits.distributed.reduce import TP_MAX


@dataclass(frozen=True)
class Shard:
    rank: int
    world: int
    invariant: bool

    @property
    def splits(self) -> int:
        return TP_MAX if self.invariant else self.world

    @property
    def pieces(self) -> int:
        return self.splits // self.world

    def units(self) -> range:
        return range(self.rank * self.pieces, (self.rank + 1) * self.pieces)


def check_divisible(config, shard: Shard) -> None:
    """Refuse a model whose heads or intermediate units do not split evenly, naming the numbers; and a mixture of
    experts, whose experts are never split across ranks (no tensor- or expert-parallel MoE)."""
    n = shard.splits
    if config.moe is not None:
        mode = "TP-invariant mode (all_reduce='invariant')" if shard.invariant else \
            f"tensor_parallel_size={shard.world}"
        raise ValueError(f"{mode}: a mixture-of-experts model ({config.architecture}, num_experts="
                         f"{config.moe.num_experts}) runs at tensor_parallel_size=1 only; tensor- and expert-parallel "
                         "MoE are not implemented")
    for name in ("num_heads", "num_kv_heads", "intermediate_size"):
        value = getattr(config, name)
        if value % n:
            mode = f"TP-invariant mode (TP_MAX={TP_MAX})" if shard.invariant else f"tensor_parallel_size={n}"
            raise ValueError(f"{mode} needs {name} divisible by {n}; the model has {name}={value}")


def padded_vocab(config, shard: Shard) -> int:
    return cdiv(config.vocab_size, shard.splits) * shard.splits


def local_config(config, shard: Shard):
    """The model as one rank sees it: its heads and intermediate units. Tied, so LlamaModel allocates no full
    lm_head: the rank's head is its vocab pieces (model.py's `head`)."""
    w = shard.world
    return dataclasses.replace(config, num_heads=config.num_heads // w, num_kv_heads=config.num_kv_heads // w,
                               intermediate_size=config.intermediate_size // w, tie_word_embeddings=True)


def column(weight: torch.Tensor, parts: list[int], shard: Shard) -> torch.Tensor:
    """Rows of a fused [sum(parts), ...] weight (or bias) for this rank: per unit, each part's unit rows."""
    n, rows, start = shard.splits, [], 0
    offsets = []
    for size in parts:
        offsets.append(start)
        start += size
    for u in shard.units():
        for off, size in zip(offsets, parts):
            step = size // n
            rows.append(weight[off + u * step:off + (u + 1) * step])
    return torch.cat(rows).contiguous()


def row(weight: torch.Tensor, shard: Shard) -> torch.Tensor:
    """[N, K] -> [pieces, N, K/splits]: this rank's K chunks."""
    kc = weight.shape[1] // shard.splits
    return torch.stack([weight[:, u * kc:(u + 1) * kc] for u in shard.units()]).contiguous()


def vocab(head: torch.Tensor, shard: Shard, padded: int) -> torch.Tensor:
    """This rank's vocab rows of the [V, H] head, zero rows past V (their logits are cut off after the gather)."""
    if padded != head.shape[0]:
        head = torch.cat([head, head.new_zeros(padded - head.shape[0], head.shape[1])])
    return column(head, [padded], shard)


@dataclass(frozen=True)
class ColumnPlan:
    parts: tuple[int, ...]  # the output widths of one piece, in order

    def regroup(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """Per-piece outputs [T, sum(parts)] -> [T, all pieces' part 0 | all pieces' part 1 | ...]."""
        if len(outputs) == 1:
            return outputs[0]
        split = [y.split(list(self.parts), dim=-1) for y in outputs]
        return torch.cat([s[i] for i in range(len(self.parts)) for s in split], dim=-1)


def shard_state(model, shard: Shard) -> dict[str, torch.Tensor]:
    """The tensors of `ShardedLlama`'s state dict for `shard`, cut from a full LlamaModel."""
    cfg = model.config
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    state = {"embed_tokens": model.embed_tokens.data, "norm": model.norm.data}
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    state["head"] = vocab(head.data, shard, padded_vocab(cfg, shard))
    for i, layer in enumerate(model.layers):
        p = f"layers.{i}."
        state[p + "qkv_proj"] = column(layer.qkv_proj.data, [q, kv, kv], shard)
        state[p + "gate_up_proj"] = column(layer.gate_up_proj.data, [inter, inter], shard)
        state[p + "o_proj"] = row(layer.o_proj.data, shard)
        state[p + "down_proj"] = row(layer.down_proj.data, shard)
        if layer.qkv_bias is not None:
            state[p + "qkv_bias"] = column(layer.qkv_bias.data, [q, kv, kv], shard)
        for name in ("input_norm", "post_norm", "o_bias", "q_norm", "k_norm"):
            value = getattr(layer, name)
            if value is not None:
                state[p + name] = value.data
    return state
