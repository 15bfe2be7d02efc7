"""Weight sync without restart: new weights copied into a running engine's tensors, in place.

In place, so every holder of the tensors keeps seeing them: a captured CUDA graph replays over the same addresses and
stays valid, the proven GEMM routes are per shape and stay proven. The source is checked whole before one byte is
copied (every name, shape and dtype), so a bad update leaves the old weights serving. After the copy the prefix cache
is dropped (its KV is the old model's) and the fingerprint carries the new weights' version, so every response names
the policy that produced it.

A source is a mapping of names to tensors, or a module (its parameters or state). Names are either ours (a
LlamaModel's own parameter names, e.g. a samebits Policy's, optionally under a common `model.` prefix) or HF's (a
transformers LlamaForCausalLM's state dict, a checkpoint's tensors; a transformers 5 MoE module's stacked experts).
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from samebits.models.digest import weights_digest
from samebits.models.llama import LlamaModel, short_names


class WeightsError(ValueError):
    """The new weights do not fit the engine's model; nothing was copied."""


class EngineBusy(RuntimeError):
    """Requests are in flight: new weights would change them midway."""


def update_weights(engine, source, version: str | None = None, keep_previous: bool = False) -> str:
    """Copy `source` into `engine`'s model; returns the weights version now in the fingerprint (`version`, or a
    digest of the new weights). `keep_previous`: hold a host copy of the weights replaced, until
    `restore_weights` puts them back or `forget_previous_weights` drops them (a fleet's update is all replicas or
    none: samebits/fleet/engine.py)."""
    _check_idle(engine, "update_weights")
    if engine.config.tensor_parallel_size > 1:  # the runner's model is rank 0's shard, the workers hold the rest
        raise WeightsError(f"update_weights: tensor_parallel_size={engine.config.tensor_parallel_size} is not "
                           "supported yet; only tensor_parallel_size=1")
    if engine.config.tp_invariant:  # the model holds its weights in the sharded layout (distributed/model.py)
        raise WeightsError("update_weights: all_reduce='invariant' is not supported yet")
    model = engine.runner.model
    if model.recipe is not None:  # its linears are e4m3 with scales (models/fp8.py), not a trainer's weights
        raise WeightsError("update_weights: FP8 models are not supported; serve the dense checkpoint to sync weights")
    pairs = plan(model, tensors_of(source))
    previous = [(dest, dest.detach().to("cpu", copy=True)) for dest, _ in pairs] if keep_previous else None
    _copy(engine, pairs)
    # The load-time digest's function, so updating to the weights loaded names them as the load did.
    version = version or weights_digest(model.named_parameters())
    from samebits.runtime.fingerprint import with_fields

    old = engine.fingerprint()
    engine._fingerprint = with_fields(old, weights=version)
    engine._previous_weights = None if previous is None else (previous, old)
    return version


def restore_weights(engine) -> str | None:
    """Put back the weights that the last `update_weights(keep_previous=True)` replaced, and their fingerprint;
    returns their version."""
    _check_idle(engine, "restore_weights")
    kept = getattr(engine, "_previous_weights", None)
    if kept is None:
        raise WeightsError("restore_weights: no update kept the weights it replaced (keep_previous=True)")
    pairs, fingerprint = kept
    _copy(engine, pairs)
    engine._fingerprint, engine._previous_weights = fingerprint, None
    return fingerprint.get("weights")


def forget_previous_weights(engine) -> None:
    """Drop the copy `update_weights(keep_previous=True)` kept: the update stands."""
    engine._previous_weights = None


def _check_idle(engine, what: str) -> None:
    if engine.has_unfinished_requests():
        raise EngineBusy(f"{what}: requests are in flight; update between rollout batches")


def _copy(engine, pairs) -> None:
    """Copy each source into its destination in place, then drop the prefix cache (its KV is the old model's)."""
    with torch.no_grad():
        for dest, tensor in pairs:
            dest.copy_(tensor)
    engine.scheduler.reset_prefix_cache()


def tensors_of(source) -> dict[str, torch.Tensor]:
    if isinstance(source, Mapping):
        return dict(source)
    inner = getattr(source, "model", None)
    if isinstance(inner, LlamaModel):  # a samebits Policy
        source = inner
    if isinstance(source, LlamaModel):
        return dict(source.named_parameters())
    if isinstance(source, torch.nn.Module):
        return source.state_dict()
    raise TypeError(f"update_weights: expected a mapping of tensors or a torch module, got {type(source).__name__}")


def plan(model: LlamaModel, tensors: dict[str, torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(destination view, source tensor) for every tensor, after checking all of them; WeightsError otherwise."""
    own = dict(model.named_parameters())
    tensors = _own_names(tensors, own)
    if set(tensors) <= set(own):
        expected, pairs = set(own), [(own[n].data, t) for n, t in tensors.items()]
        unexpected = []
    else:
        tensors = dict(model.hf_named(tensors.items()))  # a mixture's stacked experts, one per expert
        expected = model.expected_weight_names()
        unexpected = sorted(n for n in tensors if n not in expected and not model.ignorable(n))
        pairs = [(model.destination(n), t) for n, t in tensors.items() if n in expected]
    names = [n for n in tensors if n in expected]
    problems = _mismatches(names, pairs, model.dtype)
    missing = sorted(expected - set(tensors))
    if missing or unexpected or problems:
        raise WeightsError(f"update_weights refused, old weights kept: missing {short_names(missing)}, unexpected "
                           f"{short_names(unexpected)}, mismatched {short_names(problems)}")
    return pairs


def _own_names(tensors: dict, own: dict) -> dict:
    """A Policy's parameters arrive as `model.layers.0...`: strip the prefix when that makes them ours."""
    stripped = {n.removeprefix("model."): t for n, t in tensors.items()}
    return stripped if set(stripped) <= set(own) and not set(tensors) <= set(own) else tensors


def _mismatches(names: list[str], pairs: list, dtype: torch.dtype) -> list[str]:
    problems = []
    for name, (dest, tensor) in zip(names, pairs):
        if not isinstance(tensor, torch.Tensor):
            problems.append(f"{name} is a {type(tensor).__name__}, not a tensor")
        elif tuple(tensor.shape) != tuple(dest.shape):
            problems.append(f"{name} has shape {tuple(tensor.shape)}, the model holds {tuple(dest.shape)}")
        elif tensor.dtype != dtype:
            problems.append(f"{name} is {tensor.dtype}, the model holds {dtype} (cast it first)")
    return problems
