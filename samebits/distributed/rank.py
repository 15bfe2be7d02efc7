"""What every rank holds and does, rank 0 and the workers alike: its shard of the model, its KV cache (its KV heads
of every block), and one step: the broadcast inputs -> hidden states, and the full logits of the rows asked for."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samebits.distributed.model import ShardedLlama
from samebits.distributed.shard import Shard
from samebits.kernels import get_ops
from samebits.kernels.attention import AttentionMetadata
from samebits.kernels.common import to_device
from samebits.kernels.kv_cache import allocate_kv_cache
from samebits.kernels.proofs import prove_routes


@dataclass(frozen=True)
class StepInputs:
    """One step as flat host lists, the same on every rank (rank 0 sends them, model_runner.py's flattening)."""

    ids: list[int]
    positions: list[int]
    q_lens: list[int]
    ctx_lens: list[int]
    tables: list[list[int]]
    rows: list[int]  # rows whose logits are wanted, in order


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs besides its weights; picklable, sent to each worker at spawn."""

    model_config: object
    mode: str
    dtype: torch.dtype
    world: int
    invariant: bool
    route: str
    block_size: int
    num_blocks: int  # managed blocks; one more is the padding rows' scratch block
    start_s: float  # joining the group, and a worker's start
    timeout_s: float  # every collective
    threads: int


class Rank:
    def __init__(self, spec: RankSpec, rank: int, device: torch.device, group, state: dict):
        self.spec, self.device = spec, device
        ops = get_ops(spec.mode, device)
        shard = Shard(rank, spec.world, spec.invariant)
        self.model = ShardedLlama(spec.model_config, ops, spec.dtype, shard, group, spec.route)
        self.model.load_state_dict(state, strict=True)
        self.model.eval()
        cfg = self.model.config  # this rank's heads
        self.kv_caches = allocate_kv_cache(cfg.num_layers, spec.num_blocks + 1, spec.block_size, cfg.num_kv_heads,
                                           cfg.head_dim, spec.dtype, device)
        self.prove_routes()

    def set_ops(self, mode: str) -> None:
        self.model.set_ops(get_ops(mode, self.device))
        self.prove_routes()

    def prove_routes(self) -> None:
        m = self.model
        prove_routes(m.ops, m.device, m.gemm_weights(), m.config.head_dim)

    @torch.inference_mode()
    def run(self, step: StepInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (hidden [T, H], float32 logits [len(rows), V] or None); collectives inside, so every rank runs it."""
        meta = AttentionMetadata.build(step.q_lens, step.ctx_lens, step.tables, self.spec.block_size, self.device)
        ids = to_device(step.ids, torch.int64, self.device)
        positions = to_device(step.positions, torch.int64, self.device)
        hidden = self.model.forward(ids, positions, self.kv_caches, meta)
        if not step.rows:
            return hidden, None
        rows = to_device(step.rows, torch.int64, self.device)
        return hidden, self.model.compute_logits(hidden.index_select(0, rows))
