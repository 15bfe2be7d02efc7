"""One rank's part of a Llama model: the LlamaModel of models/llama.py on the rank's shard (its heads, its MLP units),
with its four linears run through `_linear`, the seam llama.py leaves for this.

- column-parallel (qkv_proj, gate_up_proj): one GEMM per piece, outputs regrouped, no communication;
- row-parallel (o_proj, down_proj): the K-chunk partial sums (`ops.linear_partials`, float32), merged by the
  fixed tree locally, then across ranks by the route (reduce.py); the bias after the sum; rounded once;
- the head, vocab-parallel: the rank's logits, gathered in rank order into the full row (so the sampler's
  log_softmax and draw run on exactly the row one rank would compute).
The embedding, norms and residual stream are replicated: every rank holds the same hidden-state bits.
"""
from __future__ import annotations

import torch
from torch import nn

from samebits.distributed import shard as sh
from samebits.distributed.reduce import reduce_partials, tree_merge
from samebits.models.llama import LlamaModel

_ROW = ("o_proj", "down_proj")


class ShardedLlama(LlamaModel):
    def __init__(self, config, ops, dtype: torch.dtype, shard: sh.Shard, group, route: str):
        sh.check_divisible(config, shard)
        local = sh.local_config(config, shard)
        super().__init__(local, ops, dtype)
        self.full_config, self.shard, self.group, self.route = config, shard, group, route
        self.vocab_size = config.vocab_size
        p, device = shard.pieces, ops.device
        for layer in self.layers:  # row-parallel weights in their chunked layout (shard.py)
            for name in _ROW:
                n, k = getattr(layer, name).shape
                setattr(layer, name, _param((p, n, k // p), dtype, device))
        self.head = _param((sh.padded_vocab(config, shard) // shard.world, config.hidden_size), dtype, device)
        self.plans = {"qkv_proj": sh.ColumnPlan((local.q_size // p, local.kv_size // p, local.kv_size // p)),
                      "gate_up_proj": sh.ColumnPlan((local.intermediate_size // p,) * 2),
                      "head": sh.ColumnPlan((self.head.shape[0] // p,))}

    def _linear(self, layer, name: str, x):
        if name in _ROW:
            return self._row_parallel(x, getattr(layer, name), layer.o_bias if name == "o_proj" else None)
        bias = layer.qkv_bias if name == "qkv_proj" else None
        return self._column_parallel(x, getattr(layer, name), bias, self.plans[name])

    def _column_parallel(self, x, weight, bias, plan: sh.ColumnPlan):
        p = self.shard.pieces
        biases = bias.chunk(p) if bias is not None else [None] * p
        return plan.regroup([self.ops.linear(x, w, b) for w, b in zip(weight.chunk(p), biases)])

    def _row_parallel(self, x, chunks, bias):
        partial = tree_merge(self.ops.linear_partials(x, chunks))
        total = reduce_partials(partial, self.group, self.route)
        if bias is not None:
            total = total + bias.float()
        return total.to(x.dtype)

    def gemm_weights(self) -> list[torch.Tensor]:
        """One [N, K] view per GEMM shape this rank runs (a piece of each column-parallel weight, a K chunk of each
        row-parallel one, a piece of the head)."""
        p = self.shard.pieces
        out = [self.head.chunk(p)[0]]
        for layer in self.layers:
            out += [layer.qkv_proj.chunk(p)[0], layer.gate_up_proj.chunk(p)[0], layer.o_proj[0], layer.down_proj[0]]
        return out

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, H] -> float32 [R, V], the full vocabulary on every rank (gathered in rank order)."""
        local = self._column_parallel(hidden, self.head, None, self.plans["head"]).float()
        full = self.group.all_gather(local)  # [world, R, V/world]
        return torch.cat(list(full), dim=-1)[:, :self.vocab_size]


def _param(shape, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
