"""The workload's roofline on this device (bench/roofline.py) at the device's measured peaks, or why there is
none: peaks are known only where they were measured, by device name and dtype. Beside it, the step-max roofline of
the steps a run actually launched (`step_bound`)."""
from __future__ import annotations

from samebits.bench.roofline import H200_PEAK_BYTES, H200_PEAK_FLOPS, StepWork, roofline, step_seconds
from samebits.bench.workload import Workload
from samebits.models.config import ModelConfig

# (torch.cuda.get_device_name, dtype) -> (matrix FLOP/s, HBM bytes/s), measured on that device (docs/BENCHMARKS.md).
# Another name (an H200 NVL, an H100) or dtype has other ceilings: no roofline rather than a wrong one.
PEAKS = {("NVIDIA H200", "bfloat16"): (H200_PEAK_FLOPS, H200_PEAK_BYTES)}


def device_name(device) -> str:
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def weights_dtype(model):
    """The dtype a model's decode streams its weights in: an FP8 model's linears are e4m3, for which no peaks are
    measured (its roofline is n/a, not the bf16 one)."""
    import torch

    return torch.float8_e4m3fn if model.recipe is not None else model.dtype


def workload_bound(config: ModelConfig, work: Workload, dtype, device, max_num_seqs: int) -> dict:
    """Seconds the workload cannot beat here (None with a `reason` where this device's peaks are unknown)."""
    import torch

    name, dtype_name = device_name(device), str(dtype).removeprefix("torch.")
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    peaks = PEAKS.get((name, dtype_name))
    if peaks is None:
        known = ", ".join(f"{n} {d}" for n, d in PEAKS)
        return {"device": name, "dtype": dtype_name, "dtype_bytes": dtype_bytes, "peak_flops": None,
                "peak_bytes": None, "prefill_s": None,
                "decode_s": None, "total_s": None, "decode_steps": None,
                "reason": f"no measured peaks for {name} {dtype_name} (known: {known})"}
    bound = roofline(config, [len(p) for p in work.prompts], work.max_tokens, dtype_bytes,
                     max_num_seqs=max_num_seqs, peak_flops=peaks[0], peak_bytes=peaks[1])
    return {"device": name, "dtype": dtype_name, "dtype_bytes": dtype_bytes, "peak_flops": peaks[0],
            "peak_bytes": peaks[1],
            "prefill_s": bound.prefill_s, "decode_s": bound.decode_s, "total_s": bound.total_s,
            "decode_steps": bound.decode_steps, "reason": None}


def of_roofline(bound: dict, seconds: float) -> float | None:
    """Achieved / roofline as a share: the roofline's time over the run's (1.0 = at the GPU's limit)."""
    return None if bound["total_s"] is None else bound["total_s"] / seconds


def step_bound(bound: dict, config: ModelConfig, steps: dict) -> dict | None:
    """The step-max roofline of a run's steps (StepLog.summary's `steps`) at `bound`'s peaks: total seconds and
    seconds by kind of step; None where the peaks are unknown."""
    if bound["total_s"] is None:
        return None
    by_kind: dict[str, float] = {}
    for kind, *work in steps["work"]:
        cost = step_seconds(config, StepWork(*work), bound["dtype_bytes"], bound["peak_flops"], bound["peak_bytes"])
        by_kind[kind] = by_kind.get(kind, 0.0) + cost
    return {"total_s": sum(by_kind.values()), "by_kind_s": by_kind}


def with_step_bound(stats: dict, bound: dict, config: ModelConfig) -> dict:
    """`stats` with both shares: of the ideal roofline and of the step-max roofline of its own steps."""
    steps = step_bound(bound, config, stats["steps"])
    return {**stats, "of_roofline": of_roofline(bound, stats["seconds"]), "step_roofline": steps,
            "of_step_roofline": None if steps is None else steps["total_s"] / stats["seconds"]}
