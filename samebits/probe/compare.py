"""The one comparison used by probes and tests alike: bits, not tolerances."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Mismatch:
    elements: int
    differing: int
    max_abs_diff: float

    @property
    def fraction(self) -> float:
        return self.differing / self.elements if self.elements else 0.0

    @property
    def same(self) -> bool:
        return self.differing == 0

    def as_dict(self) -> dict:
        return {**asdict(self), "fraction": self.fraction}


def _bits(t):
    import torch

    # Compare bit patterns so -0.0 vs 0.0 and NaN payloads count as differences, as they would downstream.
    views = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
             torch.float64: torch.int64}
    return t.contiguous().view(views[t.dtype]) if t.dtype in views else t


def mismatch(a, b) -> Mismatch:
    """Elementwise bit comparison of two tensors of one shape and dtype."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare {tuple(a.shape)} {a.dtype} with {tuple(b.shape)} {b.dtype}")
    a, b = a.detach().cpu(), b.detach().cpu()
    differ = _bits(a) != _bits(b)
    diff = (a.double() - b.double()).abs() if a.is_floating_point() else (a.long() - b.long()).abs().double()
    max_diff = float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0
    return Mismatch(a.numel(), int(differ.sum()), max_diff if differ.any() else 0.0)


def assert_same_bits(a, b, what: str = "tensors") -> None:
    m = mismatch(a, b)
    if not m.same:
        raise AssertionError(
            f"{what}: {m.differing} of {m.elements} elements differ ({m.fraction:.2%}), max |diff| {m.max_abs_diff:.3e}"
        )
