"""Tensor parallelism: one process per rank, Megatron-sharded Llama, a fixed-order all-reduce, and a TP-invariant
mode whose bits are the same at every TP size (docs/TP.md). The ranks' side: the engine's tensor-parallel runner
(engine/tp_runner.py) drives them."""
from __future__ import annotations


def one_rank(config, loaded):
    """`loaded` as the engine runs it. TP-invariant mode at TP=1 runs the one rank's sharded model (TP_MAX pieces, the
    fixed merge tree) in the one-GPU ModelRunner, with its CUDA graphs and async scheduling, where the tensor-parallel
    runner runs eagerly: the same bits as every TP size. The full model is dropped here, not kept beside its shard.
    FP8 models are not sharded (docs/FP8.md): refused here at any TP size but 1 and in TP-invariant mode."""
    if loaded.model.recipe is not None and (config.tensor_parallel_size > 1 or config.tp_invariant):
        raise ValueError(f"an FP8 model runs at tensor_parallel_size=1 with all_reduce other than 'invariant' (got "
                         f"{config.tensor_parallel_size}, {config.all_reduce!r}): its linears are not sharded")
    if not config.tp_invariant or config.tensor_parallel_size > 1:
        return loaded
    import torch

    from samebits.distributed import shard as sh
    from samebits.distributed.group import Group
    from samebits.distributed.model import ShardedLlama

    full, one = loaded.model, sh.Shard(0, 1, True)
    model = ShardedLlama(loaded.config, full.ops, full.dtype, one, Group(0, 1), "ordered")
    with torch.no_grad():
        model.load_state_dict(sh.shard_state(full, one), strict=True)
    return loaded.laid_out_as(model.eval())


def parallel_numerics(config) -> dict:
    """The fingerprint's tensor-parallel fields: the TP size, the all-reduce route (None with no reduction across
    ranks) and whether TP-invariant mode is on."""
    route = "ordered" if config.tp_invariant else config.all_reduce
    return {"size": config.tensor_parallel_size, "all_reduce": route if config.tensor_parallel_size > 1 else None,
            "invariant": config.tp_invariant}
