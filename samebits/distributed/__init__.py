"""Tensor parallelism: one process per rank, Megatron-sharded Llama, a fixed-order all-reduce, and a TP-invariant
mode whose bits are the same at every TP size (docs/TP.md). `runner_for` picks the engine's runner."""
from __future__ import annotations


def runner_for(config, loaded):
    if not config.sharded:
        from samebits.engine.model_runner import ModelRunner

        return ModelRunner(config, loaded)
    from samebits.distributed.runner import TPRunner

    return TPRunner(config, loaded)


def parallel_numerics(config) -> dict:
    """The fingerprint's tensor-parallel fields: the TP size, the all-reduce route (None with no reduction across
    ranks) and whether TP-invariant mode is on."""
    route = "ordered" if config.tp_invariant else config.all_reduce
    return {"size": config.tensor_parallel_size, "all_reduce": route if config.tensor_parallel_size > 1 else None,
            "invariant": config.tp_invariant}
