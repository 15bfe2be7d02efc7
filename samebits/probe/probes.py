"""Seed §1-2's experiments (docs/BACKGROUND.md), each measured with the shared bit comparison, per implementation.

A probe computes the same request two ways (alone vs in a batch, run 1 vs run n, prefill vs decode) and reports, for
each size, the fraction of output elements whose bits differ and the largest absolute difference.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

from samebits.probe.compare import Mismatch, mismatch
from samebits.probe.impls import Impl, NotBuilt, all_impls
from samebits.probe.tiny_llama import LlamaShape, greedy, random_weights

BATCH_SWEEP = (1, 2, 3, 4, 8, 16, 32, 33, 64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True)
class Sizes:
    matmul_k: int = 512
    matmul_n: int = 512
    matmul_m: tuple = BATCH_SWEEP
    runs: int = 50
    run_matmul_m: int = 64
    sum_n: int = 1 << 22
    sum_row: int = 1 << 14
    index_add_n: int = 1 << 18
    index_add_bins: int = 100
    attn_heads: int = 8
    attn_kv_heads: int = 8
    attn_dim: int = 64
    attn_ctx: int = 128
    attn_batches: tuple = (1, 2, 4, 8, 16, 32)
    prefill_lens: tuple = (16, 256, 1024)
    norm_hidden: int = 1024
    norm_rows: tuple = (1, 2, 3, 4, 8, 16, 32, 33, 64, 128, 256, 512, 1024)
    model: LlamaShape = field(default_factory=LlamaShape)
    prompts: int = 4
    prompts_alone: int = 4
    prompt_len: int = 8
    gen_tokens: int = 6


DEFAULT = Sizes()
# Seed §1's and the H200 baseline's sizes (docs/BACKGROUND.md): a 4096-wide layer, 32-head decode over 2048 tokens, a 1B Llama shape.
FULL = Sizes(matmul_k=4096, matmul_n=4096, sum_n=1 << 24, sum_row=1 << 17, index_add_n=1 << 20, attn_heads=32, attn_kv_heads=32,
             attn_dim=128, attn_ctx=2048, prefill_lens=(128, 512, 2048), norm_hidden=4096,
             model=LlamaShape(vocab=32000, hidden=2048, intermediate=5632, layers=16, heads=16, kv_heads=8),
             prompts=64, prompts_alone=16, prompt_len=32, gen_tokens=32)


@dataclass
class ProbeResult:
    name: str
    implementation: str
    dtype: str
    axis: str
    sizes: list
    mismatch_fraction: list
    max_abs_diff: list
    verdict: str
    note: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Ctx:
    device: object
    sizes: Sizes
    seed: int = 0

    def randn(self, *shape, dtype):
        import torch

        g = torch.Generator(device=self.device).manual_seed(self.seed)
        return torch.randn(*shape, generator=g, device=self.device, dtype=torch.float32).to(dtype)


def verdict_of(ms: list[Mismatch]) -> str:
    return "invariant" if all(m.same for m in ms) else "variant"


def result(name, impl: Impl, dtype, axis, sizes, ms: list[Mismatch], note="", **extra) -> ProbeResult:
    return ProbeResult(name, impl.name, _dtype_name(dtype), axis, list(sizes), [m.fraction for m in ms],
                       [m.max_abs_diff for m in ms], verdict_of(ms), note, extra)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def row0_sweep(compute: Callable[[int], object], sizes) -> list[Mismatch]:
    """Row 0 computed inside a batch of m rows vs the same row computed alone (m = 1)."""
    ref = compute(1)
    return [mismatch(compute(m), ref) for m in sizes]


def repeat_runs(compute: Callable[[], object], runs: int) -> tuple[list[Mismatch], int]:
    """Run 1 vs each later run; returns the worst comparison and how many runs differed from run 1."""
    first = compute()
    ms = [mismatch(compute(), first) for _ in range(runs - 1)]
    worst = max(ms, key=lambda m: (m.differing, m.max_abs_diff))
    return [worst], sum(not m.same for m in ms)


# --- 1. floating point is not associative -----------------------------------------------------------------------------

def probe_associativity(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    """Seed §2.1's (1e8 + -1e8) + 1 vs 1e8 + (-1e8 + 1) in float32: same numbers, two orders."""
    import torch

    a, b, c = (torch.tensor(v, dtype=torch.float32, device=ctx.device) for v in (1e8, -1e8, 1.0))
    left, right = (a + b) + c, a + (b + c)
    m = mismatch(left.view(1), right.view(1))
    return [result("fp32_associativity", impl, torch.float32, "order", [3], [m],
                   "(a+b)+c vs a+(b+c), a=1e8 b=-1e8 c=1", left=float(left), right=float(right))]


# --- 2. matmul: row 0 alone vs inside a batch of M rows ----------------------------------------------------------------

def probe_matmul_batch(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    import torch

    s = ctx.sizes
    return [_matmul_sweep(impl, ctx, dtype, s) for dtype in (torch.bfloat16, torch.float32)]


def _matmul_sweep(impl: Impl, ctx: Ctx, dtype, s: Sizes) -> ProbeResult:
    x = ctx.randn(max(s.matmul_m), s.matmul_k, dtype=dtype)
    w = Ctx(ctx.device, s, ctx.seed + 1).randn(s.matmul_n, s.matmul_k, dtype=dtype)
    ms = row0_sweep(lambda m: impl.ops.linear(x[:m], w)[:1], s.matmul_m)
    return result("matmul_batch", impl, dtype, "batch", s.matmul_m, ms, f"x[M,{s.matmul_k}] @ W[{s.matmul_k},{s.matmul_n}]")


# --- 3. run to run: the same op on the same input, repeated -------------------------------------------------------------

def probe_run_matmul(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    import torch

    s = ctx.sizes
    x = ctx.randn(s.run_matmul_m, s.matmul_k, dtype=torch.bfloat16)
    w = Ctx(ctx.device, s, ctx.seed + 1).randn(s.matmul_n, s.matmul_k, dtype=torch.bfloat16)
    ms, runs_differ = repeat_runs(lambda: impl.ops.linear(x, w), s.runs)
    return [result("run_to_run_matmul", impl, torch.bfloat16, "runs", [s.runs], ms,
                   f"[{s.run_matmul_m},{s.matmul_k}] @ [{s.matmul_k},{s.matmul_n}]", runs_differing=runs_differ)]


def probe_run_sum(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    import torch

    v = ctx.randn(ctx.sizes.sum_n, dtype=torch.float32)
    ms, runs_differ = repeat_runs(lambda: impl.ops.sum(v).view(1), ctx.sizes.runs)
    return [result("run_to_run_sum", impl, torch.float32, "runs", [ctx.sizes.runs], ms,
                   f"sum of {ctx.sizes.sum_n} floats", runs_differing=runs_differ)]


def probe_run_index_add(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    import torch

    s = ctx.sizes
    src = ctx.randn(s.index_add_n, dtype=torch.float32)
    g = torch.Generator(device=ctx.device).manual_seed(ctx.seed)
    idx = torch.randint(0, s.index_add_bins, (s.index_add_n,), generator=g, device=ctx.device)
    # samebits: intentionally nondeterministic because the vendor column measures index_add_'s float atomics
    ms, runs_differ = repeat_runs(lambda: torch.zeros(s.index_add_bins, device=ctx.device).index_add_(0, idx, src),
                                  s.runs)
    return [result("run_to_run_index_add", impl, torch.float32, "runs", [s.runs], ms,
                   f"index_add_ of {s.index_add_n} values into {s.index_add_bins} bins (atomics on GPU)",
                   runs_differing=runs_differ)]


def probe_run_splitk_atomic(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    """Vendor column: seed §2.2's bug, a split-K matmul whose partial sums land with tl.atomic_add in the order the
    hardware finishes them. Samebits column: ops.linear at the same shape."""
    import torch

    s = ctx.sizes
    x = ctx.randn(s.run_matmul_m, s.matmul_k, dtype=torch.bfloat16)
    w = Ctx(ctx.device, s, ctx.seed + 1).randn(s.matmul_n, s.matmul_k, dtype=torch.bfloat16)
    fn, note = _splitk_fn(impl, x, w)
    ms, runs_differ = repeat_runs(fn, s.runs)
    return [result("run_to_run_splitk_atomic", impl, torch.bfloat16, "runs", [s.runs], ms, note,
                   runs_differing=runs_differ)]


def _splitk_fn(impl: Impl, x, w):
    if impl.name != "vendor":
        return (lambda: impl.ops.linear(x, w)), "ops.linear at the split-K demo's shape"
    from samebits.kernels.demos.splitk_atomic import splitk_atomic_matmul

    return (lambda: splitk_atomic_matmul(x, w)), "DEMO OF THE BUG: Triton split-K accumulating with tl.atomic_add"


def probe_sum_rows_batch(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    """Seed §5's CUDA route (docs/BACKGROUND.md): CUB's reduction (through CuPy) is run-to-run stable; is a row's sum also independent
    of how many rows share the call? Vendor: CUB on CUDA, torch.sum on CPU. Samebits: the two-stage det_sum."""
    import torch

    s = ctx.sizes
    x = ctx.randn(max(s.norm_rows), s.sum_row, dtype=torch.float32)
    fn, note = _row_sum_fn(impl, ctx)
    ms = row0_sweep(lambda b: fn(x[:b])[:1], s.norm_rows)
    runs, runs_differ = repeat_runs(lambda: fn(x), s.runs)
    return [result("sum_rows_batch", impl, torch.float32, "batch", s.norm_rows, ms, note,
                   run_to_run_differing=runs_differ, run_to_run_max_abs_diff=runs[0].max_abs_diff)]


def _row_sum_fn(impl: Impl, ctx: Ctx):
    if impl.name != "vendor":
        from samebits.kernels import det_sum

        return (lambda t: det_sum(t, dim=1)), f"det_sum over rows of {ctx.sizes.sum_row}"
    if getattr(ctx.device, "type", ctx.device) != "cuda":
        return (lambda t: t.sum(dim=1)), f"torch.sum over rows of {ctx.sizes.sum_row} (CPU)"
    return _cub_row_sums, f"CUB segmented reduce (CuPy, accelerator 'cub') over rows of {ctx.sizes.sum_row}"


def _cub_row_sums(t):
    import cupy
    import torch
    from cupy._core import _accelerator

    saved = _accelerator.get_routine_accelerators()
    _accelerator.set_routine_accelerators(["cub"])
    try:
        return torch.from_dlpack(cupy.from_dlpack(t.contiguous()).sum(axis=1))
    finally:
        _accelerator.set_routine_accelerators(saved)


# --- 4. attention -------------------------------------------------------------------------------------------------------

def probe_attention_decode(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    """One decode query per sequence over its own context: sequence 0 alone vs among B sequences."""
    import torch

    s, dt = ctx.sizes, torch.bfloat16
    b = max(s.attn_batches)
    q = ctx.randn(b, s.attn_heads, 1, s.attn_dim, dtype=dt)
    k = Ctx(ctx.device, s, ctx.seed + 1).randn(b, s.attn_kv_heads, s.attn_ctx, s.attn_dim, dtype=dt)
    v = Ctx(ctx.device, s, ctx.seed + 2).randn(b, s.attn_kv_heads, s.attn_ctx, s.attn_dim, dtype=dt)
    scale = s.attn_dim ** -0.5
    ms = row0_sweep(lambda n: impl.ops.attend(q[:n], k[:n], v[:n], scale)[:1], s.attn_batches)
    return [result("attention_decode_batch", impl, dt, "batch", s.attn_batches, ms,
                   f"{s.attn_heads} heads x {s.attn_dim}, context {s.attn_ctx}")]


def probe_prefill_vs_decode(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    """The last row of a causal prefill vs the same token computed as a decode step over the same keys."""
    import torch

    s, dt = ctx.sizes, torch.bfloat16
    ms = [_prefill_vs_decode(impl, ctx, n, dt) for n in s.prefill_lens]
    return [result("attention_prefill_vs_decode", impl, dt, "seq_len", s.prefill_lens, ms,
                   f"{s.attn_heads} heads x {s.attn_dim}, last prefill row vs decode")]


def _prefill_vs_decode(impl: Impl, ctx: Ctx, n: int, dt) -> Mismatch:
    s = ctx.sizes
    q = ctx.randn(1, s.attn_heads, n, s.attn_dim, dtype=dt)
    k = Ctx(ctx.device, s, ctx.seed + 1).randn(1, s.attn_kv_heads, n, s.attn_dim, dtype=dt)
    v = Ctx(ctx.device, s, ctx.seed + 2).randn(1, s.attn_kv_heads, n, s.attn_dim, dtype=dt)
    scale = s.attn_dim ** -0.5
    prefill = impl.ops.attend(q, k, v, scale)[:, :, -1:]
    return mismatch(prefill, impl.ops.attend(q[:, :, -1:], k, v, scale))


# --- 5. row-wise reductions: RMSNorm and log_softmax --------------------------------------------------------------------

def probe_rms_norm(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    import torch

    s, dt = ctx.sizes, torch.bfloat16
    h = ctx.randn(max(s.norm_rows), s.norm_hidden, dtype=dt)
    w = torch.ones(s.norm_hidden, device=ctx.device, dtype=dt)
    ms = row0_sweep(lambda m: impl.ops.rms_norm(h[:m], w, 1e-6)[:1], s.norm_rows)
    return [result("rms_norm_batch", impl, dt, "batch", s.norm_rows, ms, f"hidden {s.norm_hidden}")]


def probe_log_softmax(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    import torch

    s = ctx.sizes
    h = ctx.randn(max(s.norm_rows), s.norm_hidden, dtype=torch.float32)
    ms = row0_sweep(lambda m: impl.ops.log_softmax(h[:m], -1)[:1], s.norm_rows)
    return [result("log_softmax_batch", impl, torch.float32, "batch", s.norm_rows, ms, f"width {s.norm_hidden}")]


# --- 6. the whole model: greedy generation alone vs in one batch ---------------------------------------------------------

def probe_model(impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    import torch

    return [_model_run(impl, ctx, dt) for dt in (torch.bfloat16, torch.float32)]


def _model_run(impl: Impl, ctx: Ctx, dt) -> ProbeResult:
    import torch

    s = ctx.sizes
    w = random_weights(s.model, ctx.seed, dt, ctx.device)
    g = torch.Generator(device=ctx.device).manual_seed(ctx.seed)
    prompts = torch.randint(0, s.model.vocab, (s.prompts, s.prompt_len), generator=g, device=ctx.device)
    batch_tokens, batch_logits = greedy(impl.ops, w, s.model, prompts, s.gen_tokens)
    alone = [greedy(impl.ops, w, s.model, prompts[i:i + 1], s.gen_tokens) for i in range(s.prompts_alone)]
    return _model_result(impl, dt, s, batch_tokens, batch_logits, alone)


def _model_result(impl: Impl, dt, s: Sizes, batch_tokens, batch_logits, alone) -> ProbeResult:
    import torch

    seqs_differ = sum(not torch.equal(toks[0], batch_tokens[i]) for i, (toks, _) in enumerate(alone))
    rows = [mismatch(lg[0], batch_logits[t][i]) for i, (toks, logits) in enumerate(alone)
            for t, lg in enumerate(logits) if torch.equal(toks[0, : s.prompt_len + t], batch_tokens[i, : s.prompt_len + t])]
    differ = sum(not m.same for m in rows)
    whole = Mismatch(len(rows), differ, max((m.max_abs_diff for m in rows), default=0.0))
    note = f"{s.prompts_alone} prompts alone vs in a batch of {s.prompts}, {s.gen_tokens} greedy tokens"
    return result("model_greedy", impl, dt, "prompts", [s.prompts], [whole], note, sequences=s.prompts_alone,
                  sequences_differ=seqs_differ, logit_rows_compared=len(rows), logit_rows_differ=differ)


# --- registry and runner -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    name: str
    fn: Callable[[Impl, Ctx], list[ProbeResult]]
    dtypes: tuple
    axis: str
    samebits: str = ""  # why the samebits column does not apply; empty when it does
    needs_cuda: bool = False


NO_OP = "not an engine op"
PROBES: dict[str, Probe] = {p.name: p for p in (
    Probe("fp32_associativity", probe_associativity, ("float32",), "order", samebits="arithmetic: no kernel"),
    Probe("matmul_batch", probe_matmul_batch, ("bfloat16", "float32"), "batch"),
    Probe("run_to_run_matmul", probe_run_matmul, ("bfloat16",), "runs"),
    Probe("run_to_run_sum", probe_run_sum, ("float32",), "runs"),
    Probe("run_to_run_index_add", probe_run_index_add, ("float32",), "runs", samebits=NO_OP),
    Probe("run_to_run_splitk_atomic", probe_run_splitk_atomic, ("bfloat16",), "runs", needs_cuda=True),
    Probe("sum_rows_batch", probe_sum_rows_batch, ("float32",), "batch"),
    Probe("attention_decode_batch", probe_attention_decode, ("bfloat16",), "batch"),
    Probe("attention_prefill_vs_decode", probe_prefill_vs_decode, ("bfloat16",), "seq_len"),
    Probe("rms_norm_batch", probe_rms_norm, ("bfloat16",), "batch"),
    Probe("log_softmax_batch", probe_log_softmax, ("float32",), "batch"),
    Probe("model_greedy", probe_model, ("bfloat16", "float32"), "prompts"),
)}


def not_applicable(probe: Probe, impl_name: str, why: str, verdict: str = "n/a") -> list[ProbeResult]:
    return [ProbeResult(probe.name, impl_name, dt, probe.axis, [], [], [], verdict, why) for dt in probe.dtypes]


def _skip_reason(probe: Probe, impl: Impl, ctx: Ctx) -> str:
    if impl.name == "samebits" and probe.samebits:
        return probe.samebits
    if probe.needs_cuda and getattr(ctx.device, "type", ctx.device) != "cuda":
        return "needs CUDA"
    return "" if impl.available else impl.unavailable


def run_one(probe: Probe, impl: Impl, ctx: Ctx) -> list[ProbeResult]:
    import torch

    why = _skip_reason(probe, impl, ctx)
    if why:
        return not_applicable(probe, impl.name, why)
    try:
        with torch.inference_mode():
            return probe.fn(impl, ctx)
    except (ImportError, NotBuilt) as e:
        return not_applicable(probe, impl.name, f"not built ({e})")
    except Exception as e:  # noqa: BLE001 - one cell's crash must not lose the other cells of a long GPU run
        return _refused_or_errored(probe, impl, e)


def _refused_or_errored(probe: Probe, impl: Impl, e: Exception) -> list[ProbeResult]:
    """The kernels refuse (rather than fall back on) inputs they have no invariant path for: that is this cell's
    measured answer. Any other exception (a kernel that fails to compile, out of memory) is an `error` verdict, and
    the command exits non-zero once the report is written."""
    if isinstance(e, RuntimeError) and type(e).__module__.startswith("samebits.kernels"):
        return not_applicable(probe, impl.name, f"unsupported: {e}")
    return not_applicable(probe, impl.name, f"{type(e).__name__}: {e}".splitlines()[0][:300], verdict="error")


def select(only: str | None) -> list[Probe]:
    """Probes named in a comma-separated list (all when None); KeyError names the first unknown one."""
    if not only:
        return list(PROBES.values())
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROBES]
    if unknown or not names:
        raise KeyError(unknown[0] if unknown else only)
    return [PROBES[n] for n in names]


def iter_probes(device, sizes: Sizes = DEFAULT, probes: list[Probe] | None = None, impls: list[Impl] | None = None,
                seed: int = 0) -> Iterator[tuple[str, list[ProbeResult]]]:
    """Yields (label, results) after each probe x implementation, so a caller can show progress."""
    ctx = Ctx(device, sizes, seed)
    impls = all_impls(device) if impls is None else impls
    for probe in probes or list(PROBES.values()):
        for impl in impls:
            yield f"{probe.name} [{impl.name}]", run_one(probe, impl, ctx)


def run_probes(device, sizes: Sizes = DEFAULT, probes: list[Probe] | None = None, impls: list[Impl] | None = None,
               seed: int = 0) -> list[ProbeResult]:
    return [r for _, rs in iter_probes(device, sizes, probes, impls, seed) for r in rs]
