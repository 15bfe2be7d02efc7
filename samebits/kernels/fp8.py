"""FP8 (e4m3) linears: the recipe, the activation quantisation every backend computes, and the torch references.

A linear's FP8 recipe says how its weights carry their scales and how its activations are quantised:

- weights "channel": weight [N, K] e4m3 and one float32 scale per output row (a per-tensor scale is stored as N
  equal ones); "block": one scale per [128, 128] block, [ceil(N/128), ceil(K/128)] (DeepSeek-V3 / Qwen3-FP8);
- activations "token": a scale per row, from the row's own max; "group": a scale per row and 128-wide group of K
  (with block weights); "static": one scale fixed by the checkpoint; "tensor": vLLM's per-tensor dynamic scale, the
  max of the whole batch / 448, which makes a row's quantised values depend on its neighbours: fast mode only.

The numbers are kernels/configs.py "fp8". Every backend quantises activations to exactly the bits of
`quantize_activations` (the per-row scales are powers of two: applying one is exact) and sums K in steps of K_STEP
added in K order; how a step's products are summed is the device's (the GPU's tensor cores, the CPU's proven MKL blocks).
`reference_linear` is the exact value of the recipe (each step's sum in float64, where it is exact), which the
kernels' tests compare against; `dequantized_linear` is the vendor form (fast mode on the CPU).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from samebits.kernels.common import UnsupportedOpError, check
from samebits.kernels.configs import TILE_CONFIGS

_CFG = TILE_CONFIGS["fp8"]["config"]
FP8 = torch.float8_e4m3fn
FP8_MAX = _CFG["max"]
K_STEP = _CFG["k_step"]
MIN_SCALE_EXP = _CFG["min_scale_exp"]
WEIGHT_SCALES = ("channel", "block")
ACTIVATION_SCALES = ("token", "group", "static", "tensor")
BLOCK = (K_STEP, K_STEP)  # the one weight block size: its K side is the sum's step, where the block scale applies
IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

PER_TENSOR_REFUSAL = (
    "per-tensor dynamic activation scales are batch-variant: the scale is the max over the whole batch, so a row's "
    "quantised values depend on the rows it is batched with. Deterministic mode quantises activations per token "
    "instead: load with quantization='fp8' (`--quantization fp8`), or use mode='fast'")


@dataclass(frozen=True)
class Fp8Recipe:
    """How one model's FP8 linears are scaled (see the module docstring); validated on construction."""

    weights: str
    activations: str
    block: tuple[int, int] | None = None  # (rows, cols) of a weight block; block weights only

    def __post_init__(self):
        if self.weights not in WEIGHT_SCALES:
            raise ValueError(f"fp8 weights must be one of {WEIGHT_SCALES}, got {self.weights!r}")
        if self.activations not in ACTIVATION_SCALES:
            raise ValueError(f"fp8 activations must be one of {ACTIVATION_SCALES}, got {self.activations!r}")
        if (self.weights == "block") != (self.block is not None):
            raise ValueError(f"fp8 weight block {self.block!r}: a block size goes with weights='block' only")
        if self.block is not None and tuple(self.block) != BLOCK:
            raise ValueError(f"fp8 weight_block_size {list(self.block)} is not supported; only {list(BLOCK)}")
        if (self.weights == "block") != (self.activations == "group"):
            raise ValueError(f"fp8 activations={self.activations!r} with weights={self.weights!r}: block-scaled "
                             f"weights take activations scaled per token and {K_STEP}-wide group ('group'), and "
                             "only they do")

    @property
    def batch_invariant(self) -> bool:
        return self.activations != "tensor"

    def numerics(self) -> dict:
        """The fingerprint's `quantization` field."""
        return {"method": "fp8", "format": _CFG["format"], "weights": self.weights,
                "block": list(self.block) if self.block else None, "activations": self.activations}


def refuse_variant(recipe: Fp8Recipe, where: str) -> None:
    """Deterministic backends never run the per-tensor dynamic recipe."""
    if not recipe.batch_invariant:
        raise UnsupportedOpError(f"samebits deterministic {where}: {PER_TENSOR_REFUSAL}")


def check_linear_fp8(x, weight, scale, recipe, input_scale, bias) -> None:
    """The shapes and dtypes `Ops.linear_fp8` takes (docs/CONTRACTS.md); ValueError naming what is wrong."""
    op = "linear_fp8"
    check(isinstance(recipe, Fp8Recipe), op, f"recipe must be an Fp8Recipe, got {type(recipe).__name__}")
    check(x.dtype in IN_DTYPES, op, f"x is {x.dtype}; need one of {IN_DTYPES}")
    check(weight.dtype == FP8 and weight.dim() == 2, op, f"weight must be 2-D {FP8}, got {weight.dtype} "
          f"{tuple(weight.shape)}")
    n, k = weight.shape
    check(x.shape[-1] == k, op, f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: need x [..., K]")
    want = scale_shape(recipe, n, k)
    check(scale.dtype == torch.float32 and tuple(scale.shape) == want, op,
          f"scale must be float32 {want} for {recipe.weights} weights, got {scale.dtype} {tuple(scale.shape)}")
    static = recipe.activations == "static"
    check((input_scale is not None) == static, op, "input_scale goes with static activations, and only with them")
    check(input_scale is None or (input_scale.dtype == torch.float32 and input_scale.numel() == 1), op,
          "input_scale must be one float32 value")
    check(bias is None or (tuple(bias.shape) == (n,) and bias.dtype == x.dtype), op, f"bias must be [{n}] {x.dtype}")
    for t in (weight, scale, input_scale, bias):
        if t is not None:
            check(t.device == x.device, op, f"x is on {x.device}, a weight tensor on {t.device}")


def scale_shape(recipe: Fp8Recipe, n: int, k: int) -> tuple[int, ...]:
    if recipe.weights == "channel":
        return (n,)
    return (-(-n // recipe.block[0]), -(-k // recipe.block[1]))


def scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """int32 e: the least with amax <= FP8_MAX * 2^e (amax = m * 2^E, m in [1, 2): E - 8, or E - 7 where m > 1.75),
    at least MIN_SCALE_EXP. Read from the float32 bits: exact, the same on every device."""
    bits = amax.float().contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 - 8 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    return e.clamp(min=MIN_SCALE_EXP)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e as float32, exactly (MIN_SCALE_EXP <= e <= 127)."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def to_fp8(y: torch.Tensor) -> torch.Tensor:
    """float32 -> e4m3, clamped to +-FP8_MAX, nearest even (torch's cast)."""
    return y.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_activations(x2d: torch.Tensor, recipe: Fp8Recipe, input_scale: torch.Tensor | None = None):
    """x [M, K] -> (q [M, K] e4m3, scales): float32 [M] ("token"; "tensor": the one batch scale on every row),
    [M, ceil(K/K_STEP)] ("group"), or None ("static": the scale is the checkpoint's, folded into the weight scale)."""
    xf = x2d.float()
    if recipe.activations == "static":
        return to_fp8(xf / input_scale.reshape(())), None
    if recipe.activations == "tensor":
        amax = xf.abs().amax() if xf.numel() else xf.new_zeros(())
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        return to_fp8(xf / scale), scale.expand(xf.shape[0]).contiguous()
    if recipe.activations == "group":
        m, k = xf.shape
        groups = -(-k // K_STEP)
        padded = F.pad(xf, (0, groups * K_STEP - k)).view(m, groups, K_STEP)
        e = scale_exponent(padded.abs().amax(-1))
        q = to_fp8(padded * pow2(-e)[..., None]).view(m, groups * K_STEP)[:, :k].contiguous()
        return q, pow2(e)
    amax = xf.abs().amax(-1) if xf.shape[1] else xf.new_zeros(xf.shape[0])
    e = scale_exponent(amax)
    return to_fp8(xf * pow2(-e)[:, None]), pow2(e)


def quantize_weight(w: torch.Tensor, per_tensor: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A dense weight [N, K] -> (e4m3 [N, K], float32 scales [N]): amax / FP8_MAX per row (or the whole tensor's on
    every row), 1 for a zero row; w / scale correctly rounded, then clamped and cast. The same bits on every device."""
    wf = w.float()
    amax = wf.abs().amax(-1) if wf.shape[1] else wf.new_zeros(wf.shape[0])
    if per_tensor:
        amax = amax.amax().expand_as(amax)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return to_fp8(wf / scale[:, None]), scale.contiguous()


def expand_weight_scale(scale: torch.Tensor, recipe: Fp8Recipe, n: int, k: int) -> torch.Tensor:
    """float32 [N, K]: each weight's own scale."""
    if recipe.weights == "channel":
        return scale[:, None].expand(n, k)
    bn, bk = recipe.block
    return scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def dequantize_weight(weight: torch.Tensor, scale: torch.Tensor, recipe: Fp8Recipe) -> torch.Tensor:
    """float32 [N, K]: each e4m3 weight times its scale, rounded once."""
    n, k = weight.shape
    return weight.float() * expand_weight_scale(scale, recipe, n, k)


def dequantized_linear(x, weight, scale, recipe, input_scale=None, bias=None):
    """The vendor form: activations quantised by the recipe and dequantised (exact), weights dequantised, F.linear in
    float32, rounded once to x.dtype. Fast mode's CPU op; batch-variant only through the recipe and F.linear."""
    check_linear_fp8(x, weight, scale, recipe, input_scale, bias)
    x2 = x.reshape(-1, x.shape[-1])
    q, a_scale = quantize_activations(x2, recipe, input_scale)
    xd = q.float() * _expand_activation_scale(a_scale, x2.shape)
    wd = weight.float() * expand_weight_scale(scale, recipe, *weight.shape)
    y = F.linear(xd, wd, None if bias is None else bias.float())
    return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


def _expand_activation_scale(a_scale, shape) -> torch.Tensor | float:
    if a_scale is None:
        return 1.0
    if a_scale.dim() == 1:
        return a_scale[:, None]
    return a_scale.repeat_interleave(K_STEP, 1)[:, :shape[1]]


def reference_linear(x, weight, scale, recipe, input_scale=None, bias=None) -> torch.Tensor:
    """The recipe's exact value in float64: each K_STEP's sum of e4m3 products is exact there (at most ~50
    significant bits), then the scales as the kernels apply them. For static activations `scale` is the folded one
    (input_scale * weight scale), as the kernels take it."""
    x2 = x.reshape(-1, x.shape[-1])
    q, a_scale = quantize_activations(x2, recipe, input_scale)
    n, k = weight.shape
    acc = torch.zeros(x2.shape[0], n, dtype=torch.float64, device=x.device)
    for s in range(0, k, K_STEP):
        part = q[:, s:s + K_STEP].double() @ weight[:, s:s + K_STEP].double().t()
        if recipe.weights == "block":
            w_s = scale[:, s // K_STEP].double().repeat_interleave(recipe.block[0])[:n]
            part = part * a_scale[:, s // K_STEP, None].double() * w_s[None, :]
        acc = acc + part
    if recipe.weights == "channel":
        a = 1.0 if a_scale is None else a_scale[:, None].double()
        acc = acc * a * scale[None, :].double()
    if bias is not None:
        acc = acc + bias.double()
    return acc.reshape(*x.shape[:-1], n)
