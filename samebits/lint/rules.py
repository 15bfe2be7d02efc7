"""The rule table: every rule's id, language, why and fix, defined here once (the docs table is generated from it)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    language: str  # cuda, triton, torch, compiled, any
    lexical: bool  # True: matched on tokens (CUDA, PTX/SASS text); False: on the Python ast
    why: str
    fix: str


_TABLE = (
    Rule("SB001", "suppression-without-reason", "any", True,
         "A `samebits:` marker that does not state why the code is deterministic is not a review statement.",
         "Write `samebits: deterministic because <the guarantee>` (or `intentionally nondeterministic because <why>`)."),
    Rule("SB101", "cuda-float-atomic-add", "cuda", True,
         "Float atomicAdd lands in the order the hardware finishes threads; float addition is not associative.",
         "Write per-block partials to a buffer and sum them in index order, or accumulate in integers."),
    Rule("SB102", "cuda-inline-ptx-float-atomic", "cuda", True,
         "A float `red.`/`atom.` in inline PTX is a float atomic the compiler cannot see past.",
         "Replace it with a fixed-order reduction; integer red/atom are fine."),
    Rule("SB103", "cuda-grid-from-sm-count", "cuda", True,
         "A grid, split count or loop bound from the SM count or occupancy changes the work split from GPU to GPU.",
         "Size the grid from the data's shape and constants; state the guarantee if each output is still one program's."),
    Rule("SB104", "cuda-split-from-batch", "cuda", True,
         "A split count chosen from M or the batch size makes a row's reduction order depend on its neighbours.",
         "Fix the split size (a constant, or a function of K only) and merge splits in a fixed order."),
    Rule("SB201", "triton-float-atomic", "triton", False,
         "tl.atomic_add/xchg/cas on floats land in hardware order; the sum's rounding changes run to run.",
         "Store partials per program and reduce them in index order; integer atomics and atomic_max/min are exact."),
    Rule("SB202", "triton-autotune-batch-key", "triton", False,
         "Autotune keyed on a batch-like argument lets the batch size pick the tiles of a reducing kernel.",
         "Drop M/batch/num_tokens from `key` (key on K, N, head dim) or pin one config for every batch size."),
    Rule("SB203", "triton-split-from-batch", "triton", False,
         "A SPLIT_K/split count computed from M or the batch makes the reduction order depend on the batch.",
         "Use a constant split size (or one from K only) and merge the splits in a fixed order."),
    Rule("SB204", "triton-grid-from-sm-count", "triton", False,
         "A grid, split or loop bound from the SM count differs between GPUs and can reorder a reduction.",
         "Size the grid from the shape; if the SM count only picks which program owns a whole tile, state so."),
    Rule("SB301", "torch-atomic-op", "torch", False,
         "index_add_/scatter_add_/scatter_reduce_/index_put_(accumulate)/bincount(weights)/histc/embedding_bag "
         "backward use float atomics on CUDA.",
         "Sort the indices and reduce segments in order (or a one-hot matmul); state the guarantee if CPU-only."),
    Rule("SB302", "torch-entry-without-deterministic-algorithms", "torch", False,
         "An entry point that never calls torch.use_deterministic_algorithms(True) lets nondeterministic ops run "
         "silently.",
         "Call torch.use_deterministic_algorithms(True) before any CUDA work in the entry point."),
    Rule("SB303", "torch-reduced-precision-on", "torch", False,
         "TF32 or reduced-precision bf16/fp16 reductions let cuBLAS/cuDNN pick a lower-precision, shape-tuned path.",
         "Set allow_tf32/allow_*_reduced_precision_reduction to False and float32 matmul precision to 'highest'."),
    Rule("SB304", "torch-entry-leaves-reduced-precision", "torch", False,
         "cuDNN TF32 and bf16 reduced-precision reduction default to on; an entry point that never turns them off "
         "keeps them.",
         "Set torch.backends.cudnn.allow_tf32 and "
         "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction to False in the entry point."),
    Rule("SB305", "cublas-workspace-after-torch-import", "torch", False,
         "cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when its handle is made; set after torch is imported it may be "
         "too late.",
         "Export CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment before the process starts."),
    Rule("SB306", "torch-global-generator-sampling", "torch", False,
         "torch.manual_seed plus sampling from the global generator: one request's draws depend on every other's.",
         "Give each request its own torch.Generator (or a counter-based RNG) and pass generator= to the sampler."),
    Rule("SB401", "ptx-float-atomic", "compiled", True,
         "A float red./atom. in compiled PTX is a float atomic, whatever the source looked like.",
         "Find the source op (tl.atomic_add, atomicAdd, split-K epilogue) and replace it with a fixed-order reduction."),
    Rule("SB402", "sass-float-atomic", "compiled", True,
         "A float RED/ATOM in SASS is a float atomic in the shipped binary.",
         "Rebuild from a source without float atomics; integer RED/ATOM are fine."),
    Rule("SB403", "compiled-split-k-kernel", "compiled", True,
         "A split-K/split-KV/stream-K kernel (cuBLAS splitKreduce, cutlass splitk, flash splitkv) splits the "
         "reduction by a heuristic of the batch shape and the GPU.",
         "Route the GEMM to a kernel without split-K (a fixed tile config, or cuBLASLt with no workspace)."),
)

RULES: dict[str, Rule] = {r.id: r for r in _TABLE}


def markdown_table() -> str:
    """The rule table as Markdown, for docs/LINT.md (a test checks the docs hold exactly this)."""
    rows = ["| id | name | language | matched on | why | fix |", "|---|---|---|---|---|---|"]
    for r in _TABLE:
        rows.append(f"| {r.id} | `{r.name}` | {r.language} | {'tokens' if r.lexical else 'ast'} | {r.why} | {r.fix} |")
    return "\n".join(rows)
