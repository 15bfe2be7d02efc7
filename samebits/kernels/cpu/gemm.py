"""The proven CPU GEMM route: MKL is only ever called on fixed-shape row blocks, and a block shape is used only after a
self-test in this process has shown it gives a row the canonical block's bits.

Triple: `block_gemm` (one block, a @ b^T with torch.mm) and `entry_gemm` (a batch of independent blocks, one
torch.bmm) are the launchers, the only places samebits calls MKL on floats; the canonical block, one torch.mm of 64
rows, is the reference every other call must equal; `self_test` and `_batch_test` are the proofs, run once per
(K, N, MKL thread count), and per batch size for torch.bmm, before a shape is used. What the proof checks, on random
data of the shape, in the exact layout the callers use:

- the canonical block gives every row the same bits at every position in the block, whatever its neighbours are
  (other rows, zero padding), run after run; otherwise the shape is refused (`CpuRouteUnproven`);
- each other block size gives every row the canonical bits; a size that does not is never used for the shape;
- at one MKL thread the canonical bits are the same; if not, the bits follow the thread count, which the process
  then pins: a later call at another count raises instead of computing other bits;
- torch.bmm over a batch of blocks gives every entry the bits of its own canonical torch.mm (on Intel with stock MKL a
  bmm over many blocks varied with their number); where it does not, `entry_gemm` calls torch.mm per entry.

Verdicts are shown in the fingerprint (`cpu_gemm`). They never change a bit: every admitted size gives the canonical
block's bits, and the thread count they may depend on is hashed in the fingerprint (`cpu_threads`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from samebits.kernels.common import UnsupportedOpError
from samebits.kernels.configs import TILE_CONFIGS
from samebits.kernels.cpu import mkl

_CFG = TILE_CONFIGS["cpu_gemm"]["config"]
BLOCK_ROWS: tuple[int, ...] = tuple(_CFG["block_rows"])
CANONICAL = _CFG["canonical_rows"]
MIN_N = _CFG["min_n"]
_FAST_CNR = TILE_CONFIGS["cpu_mkl"]["config"]["cnr"]
_PROOF_SHIFTS = (1, 5, CANONICAL // 2 + 3)
_MANY_ROWS = 16  # below this many rows left, one padded block is cheaper than several exact ones


class CpuRouteUnproven(UnsupportedOpError):
    """No block shape of the CPU route could be proven batch-invariant for this GEMM on this machine."""


@dataclass(frozen=True)
class Verdict:
    rows: tuple[int, ...]  # block sizes that give the canonical block's bits (empty: the shape is refused)
    thread_independent: bool  # the canonical bits are the same at one MKL thread
    failure: str = ""  # what the canonical block failed, when it did


# (K, N, threads) -> Verdict and (batch, K, N, threads) -> block sizes torch.bmm may take; process-wide, because
# MKL's code path and thread pool are.
_VERDICTS: dict[tuple, Verdict] = {}
_BATCHED: dict[tuple, tuple[int, ...]] = {}
_LOCK = threading.Lock()
_PINNED_THREADS: list[int] = []  # the count fixed by the first thread-dependent shape, once there is one


def block_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = a @ b^T for one block: a [r, K], b [N, K], out [r, N], float32 and contiguous."""
    return torch.mm(a, b.t(), out=out)


def current_threads() -> int:
    n = mkl.threads()
    return n if n is not None else torch.get_num_threads()


def verdict(k: int, n: int) -> Verdict:
    """The proof for a @ b^T with b [N, K] at the current MKL thread count, run the first time it is asked."""
    t = current_threads()
    key = (k, n, t)
    v = _VERDICTS.get(key)
    if v is None:
        with _LOCK:
            v = _VERDICTS.get(key)
            if v is None:
                v = _VERDICTS[key] = self_test(k, n)
    if not v.rows:
        raise CpuRouteUnproven(_refusal(k, n, v.failure))
    if not v.thread_independent:
        _pin_threads(t, k, n)
    return v


def _pin_threads(t: int, k: int, n: int) -> None:
    with _LOCK:
        if not _PINNED_THREADS:
            _PINNED_THREADS.append(t)
    if _PINNED_THREADS[0] != t:
        raise CpuRouteUnproven(
            f"samebits deterministic (cpu): MKL's bits for the GEMM K={k}, N={n} depend on the thread count "
            f"on this machine (MKL CNR {mkl.cnr_mode()}), and this process computed at {_PINNED_THREADS[0]} threads; "
            f"now {t}. Keep the count fixed for the process's life, or start Python with MKL_CBWR={_FAST_CNR} "
            "(`eval \"$(samebits env --shell)\"`), which makes MKL's results independent of it.")


def _refusal(k: int, n: int, why: str) -> str:
    return (f"samebits deterministic (cpu): no batch-invariant block of the GEMM K={k}, N={n} "
            f"on this machine: {why} (MKL CNR {mkl.cnr_mode()}, {current_threads()} threads). Start Python with "
            f"MKL_CBWR={_FAST_CNR} (`eval \"$(samebits env --shell)\"`) so MKL runs one reproducible code path, or "
            "use mode='fast'; refusing to run batch-variant kernels in deterministic mode")


def pick_rows(m: int, admitted: tuple[int, ...]) -> list[int]:
    """Block sizes covering m rows: the largest admitted block that fits while many rows are left, then the smallest
    that holds the rest. Speed only: every admitted size gives a row the same bits."""
    sizes = sorted(admitted)
    blocks, left = [], m
    while left > 0:
        fits = [r for r in sizes if r <= left]
        r = fits[-1] if fits and left >= _MANY_ROWS else next((r for r in sizes if r >= left), sizes[-1])
        blocks.append(r)
        left -= r
    return blocks


def _admitted(shapes: list[tuple[int, int]], rows: tuple[int, ...]) -> set[int]:
    """The sizes among `rows` admitted for every (K, N) in `shapes`, and the canonical size, which always is."""
    admitted = set(rows)
    for k, n in shapes:
        admitted &= set(verdict(k, n).rows)
    return admitted | {CANONICAL}


def block_for(shapes: list[tuple[int, int]], m: int, rows: tuple[int, ...]) -> int:
    """The smallest admitted block size (_admitted) that holds m rows: callers that make several GEMMs of one block
    of rows. m must be at most largest_block(shapes, rows)."""
    return min(r for r in _admitted(shapes, rows) if r >= m)


def largest_block(shapes: list[tuple[int, int]], rows: tuple[int, ...]) -> int:
    """The largest admitted block size (_admitted): which sizes a machine admits depends on its MKL kernels (an Intel
    Xeon at ATen's AVX2 capability admitted none above the canonical 64 rows), so callers cut their rows to it."""
    return max((r for r in _admitted(shapes, rows) if r <= max(rows)), default=CANONICAL)


def blocked_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [N, K]^T -> float32 [M, max(N, MIN_N)], each row's bits independent of M."""
    a, b = a.float(), _pad_n(b.float()).contiguous()
    m, k = a.shape
    sizes = pick_rows(m, verdict(k, b.shape[0]).rows)
    total = sum(sizes)
    if total != m or not a.is_contiguous():
        padded = a.new_zeros(total, k)
        padded[:m] = a
        a = padded
    return run_blocks(a, b, sizes)[:m]


def run_blocks(a: torch.Tensor, b: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """a [sum(sizes), K] cut into consecutive blocks of `sizes` rows, one `block_gemm` each -> [rows, N].

    The one calling pattern of the route: the self-test goes through it too, so it proves the calls made here."""
    out = a.new_empty(a.shape[0], b.shape[0])
    start = 0
    for r in sizes:
        block_gemm(a[start:start + r], b, out[start:start + r])  # row slices of 2-D tensors are contiguous
        start += r
    return out


def entry_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[i] = a[i] @ b[i]^T for independent entries (a [E, r, K], b [E, N, K], out [E, r, N], float32, contiguous),
    each with its canonical torch.mm bits: one torch.bmm where the batch was proven to give them, else one torch.mm per
    entry. r must be admitted for (K, N) (`block_for`)."""
    e, r, k = a.shape
    if r in batched_rows(e, k, b.shape[1]):
        return _bmm(a, b, out)
    for i in range(e):
        block_gemm(a[i], b[i], out[i])
    return out


def _bmm(a, b, out):
    return torch.bmm(a, b.transpose(1, 2), out=out)


def batched_rows(batch: int, k: int, n: int) -> tuple[int, ...]:
    """Block sizes at which one torch.bmm over `batch` entries gives each the bits of its own canonical torch.mm."""
    key = (batch, k, n, current_threads())
    rows = _BATCHED.get(key)
    if rows is None:
        with _LOCK:
            rows = _BATCHED.get(key)
            if rows is None:
                rows = _BATCHED[key] = _batch_test(batch, k, n)
    return rows


def _batch_test(batch: int, k: int, n: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(_CFG["proof_seed"] + 104729 * batch + 7919 * k + n)
    height = max(BLOCK_ROWS)
    a = torch.randn(batch, height, k, generator=g)
    b = torch.randn(batch, n, k, generator=g) * k ** -0.5
    ref = torch.stack([run_blocks(a[i], b[i], [CANONICAL] * (height // CANONICAL)) for i in range(batch)])
    admitted = []
    for r in BLOCK_ROWS:
        blocks = [_bmm(a[:, s:s + r].contiguous(), b, a.new_empty(batch, r, n)) for s in range(0, height, r)]
        if _same_bits(torch.cat(blocks, dim=1), ref):
            admitted.append(r)
    return tuple(admitted)


def _pad_n(b: torch.Tensor) -> torch.Tensor:
    """N padded with zero rows up to MIN_N: MKL's small-N paths gave row-position-dependent bits (2 <= N <= 11)."""
    n = b.shape[0]
    if n >= MIN_N:
        return b
    out = b.new_zeros(MIN_N, b.shape[1])
    out[:n] = b
    return out


def self_test(k: int, n: int) -> Verdict:
    """The proof; see the module docstring. Deterministic data (seeded by the shape), float32, the callers' layout.

    Sizes up to the canonical one are checked on the first canonical block's rows; larger ones on as many rows as
    they hold (all compared with canonical blocks), so a proof costs about five GEMMs of the largest block."""
    g = torch.Generator().manual_seed(_CFG["proof_seed"] + 7919 * k + n)
    a = torch.randn(max(BLOCK_ROWS), k, generator=g)
    b = torch.randn(n, k, generator=g) * k ** -0.5

    def blocks(x, r):
        return run_blocks(x, b, [r] * (x.shape[0] // r))

    ref = blocks(a, CANONICAL)
    head, head_ref = a[:CANONICAL], ref[:CANONICAL]
    failure = _canonical_failure(head, head_ref, blocks)
    if failure:
        return Verdict((), False, failure)
    admitted = tuple(r for r in BLOCK_ROWS if r == CANONICAL or _size_agrees(a, ref, r, blocks))
    return Verdict(admitted, _thread_independent(head, head_ref, blocks))


def _size_agrees(a, ref, r, blocks) -> bool:
    rows = max(r, CANONICAL)
    x, want = a[:rows], ref[:rows]
    return _same_bits(blocks(x, r), want) and _same_bits(_alone(x, r, blocks), want[:1])


def _canonical_failure(a, ref, blocks) -> str:
    if not _same_bits(blocks(a, CANONICAL), ref):
        return "two runs of the same block gave different bits"
    for s in _PROOF_SHIFTS:
        if not _same_bits(blocks(a.roll(s, dims=0), CANONICAL), ref.roll(s, dims=0)):
            return f"a row's bits changed when moved {s} places within the {CANONICAL}-row block"
    if not _same_bits(_alone(a, CANONICAL, blocks), ref[:1]):
        return f"a row alone in a zero-padded {CANONICAL}-row block differs from the row among others"
    return ""


def _alone(a, r, blocks):
    """Row 0 alone, zero padded to one r-row block (what a decode step of one sequence computes)."""
    x = torch.zeros_like(a[:r])
    x[:1] = a[:1]
    return blocks(x, r)[:1]


def _thread_independent(a, ref, blocks) -> bool:
    if not mkl.available():
        return False
    with mkl.local_threads(1):
        return _same_bits(blocks(a, CANONICAL), ref)


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    return torch.equal(x.view(torch.int32), y.view(torch.int32))


def known_answer() -> str:
    """Hash of one canonical block computed from integer-built data (exact on every CPU): equal on two machines
    when their MKL computes that block alike. (Runs one small MKL GEMM.)"""
    import hashlib

    def exact(rows, cols, salt):
        i = torch.arange(rows * cols, dtype=torch.int64)
        return (((i * 2654435761 + salt) % 2001) - 1000).to(torch.float32).view(rows, cols) / 1024.0

    a, b = exact(CANONICAL, 1024, 1), exact(256, 1024, 7)
    out = run_blocks(a, b, [CANONICAL])
    return hashlib.sha256(out.numpy().tobytes()).hexdigest()[:16]


def prove_weights(weights) -> dict[str, str]:
    """Prove every distinct 2-D weight's linear shape now (load time), so a refusal comes before serving. FP8 weights
    run as their K steps (kernels/cpu/fp8.py proves those)."""
    dense = [w for w in weights if w.dim() == 2 and w.device.type == "cpu" and w.element_size() > 1]
    for shape in sorted({tuple(w.shape) for w in dense}):
        verdict(shape[1], max(shape[0], MIN_N))
    return verdicts()


def verdicts() -> dict[str, str]:
    """For the fingerprint: 'K=576 N=960 t2' -> the admitted block sizes and thread independence; 'bmm B=6 ...' -> the
    block sizes one torch.bmm over that many entries may take."""
    out = {}
    for (k, n, t), v in sorted(_VERDICTS.items()):
        if not v.rows:
            out[f"K={k} N={n} t{t}"] = f"refused: {v.failure}"
        else:
            out[f"K={k} N={n} t{t}"] = f"rows {','.join(map(str, v.rows))}; " + (
                "thread-independent" if v.thread_independent else "pins the thread count")
    for (batch, k, n, t), rows in sorted(_BATCHED.items()):
        out[f"bmm B={batch} K={k} N={n} t{t}"] = f"rows {','.join(map(str, rows))}" if rows else "torch.mm per entry"
    return out
