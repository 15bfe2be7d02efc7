"""Every kernel constant that changes output bits, in one table, with the reason beside it.

The fingerprint hashes `numerics_profile()`: change a value here and every lock taken before reports drift.
"""
from __future__ import annotations

from samebits.modes import TP_MAX

# name -> {"config": ..., "why": ...}; filled by the kernels that own them.
TILE_CONFIGS: dict[str, dict] = {}

TILE_CONFIGS["matmul"] = {
    # Rows: [max_M, BM, BN, BK, num_warps, num_stages, GROUP_M]; the first row whose max_M >= M is used.
    "config": [
        [1, 16, 64, 256, 4, 6, 8],
        [32, 16, 32, 128, 4, 6, 8],
        [128, 64, 32, 128, 4, 4, 8],
        [512, 64, 128, 64, 4, 4, 8],
        [1 << 62, 256, 128, 64, 8, 3, 8],
    ],
    "why": "K is always accumulated in sequence, one tl.dot per BK step into one fp32 accumulator, never split: "
    "measured on the H200 (docs/BACKGROUND.md, baseline canonical), that order gives the same bits for every tile "
    "shape, so the tile may follow M (small tiles and a deep pipeline for decode, big ones for prefill) while "
    "the K order stays fixed. tests/kernels/test_gpu.py guards that fact on every bucket. Tiles: the fastest of a "
    "sweep on the H200 (benchmarks/kernels.py --sweep; N=4096, K=4096 bf16), where all 28 candidates gave one "
    "set of bits; GROUP_M=8 everywhere so the M-tiles sharing a weight tile run back to back and read it from "
    "L2 (launch order only, never the math). M = 1 (batch-1 decode, the eager lm_head): 64 weight rows and K "
    "steps of 256 per program, the fastest of 40 tiles or within 2.2 % of it at every 8B weight shape, 15-24 % "
    "faster than [16, 32, 128], all 40 with the same bits; at M = 8 and 16 "
    "it was 1-7 % slower than [16, 32, 128] at qkv, o and the lm_head, faster at gate_up and down, so the row serves "
    "M = 1 alone (docs/results/gemm_decode.h200.m1.json, docs/results/HISTORY.md §2).",
}

TILE_CONFIGS["vendor_gemm"] = {
    "config": {"enabled": True, "k_multiple": 64, "min_n": 64, "workspace_kib": "1", "eager_min_gflop": 137.5,
               "test_m": [1, 2, 3, 8, 17, 64, 129, 256, 257, 512, 768, 1024, 1031, 2048, 3001, 4096, 8192]},
    "why": "cuBLASLt with a 1 KiB workspace cannot split K; on the H200 it gave the Triton kernel's bits at every M "
    "tried (1...8192, K a multiple of 64; docs/BACKGROUND.md baseline cublas_ws, and benchmarks/kernels.py), so it is "
    "used only for a weight shape whose self-test (every element equal to the Triton kernel at each test_m) passed "
    "in this process. Speed (benchmarks/kernels.py, H200): in a CUDA graph it matches stock cuBLAS at every M, ahead "
    "of the Triton kernel at M = 1; called eagerly torch adds host time to each call (its heuristic query), so eager "
    "calls take it only above eager_min_gflop (~ where the Triton kernel's GPU time passes that; docs/BENCHMARKS.md "
    "§2).",
}

TILE_CONFIGS["triton"] = {
    "config": {"enable_fp_fusion": False},
    "why": "Pinned at every launch: whether a*b+c becomes one FMA changes bits, and Triton 3.9 warns that its "
    "default flips in 3.10. No FMA contraction also matches what the CPU interpreter computes.",
}

TILE_CONFIGS["cpu_gemm"] = {
    # block_rows: the fixed row counts MKL is ever called with; canonical_rows: the block every other size must equal.
    "config": {"block_rows": [4, 8, 16, 32, 64, 128, 256], "canonical_rows": 64, "min_n": 16,
               "proof_seed": 20261201},
    "why": "torch's CPU mm (MKL) picks its kernel, and so a row's reduction order, from the whole shape: raw mm "
    "changed a row's bits with M on both CPUs measured (AMD EPYC, Intel Sapphire Rapids with stock MKL: 33 of 33 "
    "placements at five shapes; benchmarks/cpu_route.py, docs/BENCHMARKS.md section 7). So every GEMM is cut into "
    "row blocks of these sizes, zero padded, one torch.mm per block (one torch.bmm over many blocks varied with the "
    "block count on Intel), N padded to min_n. Which sizes agree is a property of the CPU and MKL mode, not a "
    "guarantee: on AMD all of them, in every mode tried; on Intel with stock MKL as few as 64 and 128 (K=1536, "
    "N=576), with the bits following the thread count; on Intel with MKL_CBWR=AVX2,STRICT all of them, "
    "thread-independent. So kernels/cpu/gemm.py uses a size for a weight shape only after a self-test in this "
    "process shows it gives the canonical block's bits, and refuses the shape when the canonical block itself is "
    "not position-, neighbour- and run-invariant. 1 and 2 rows are never used (GEMV paths). M is covered by the "
    "largest blocks that fit, so at most a few padding rows are computed.",
}

TILE_CONFIGS["cpu_mkl"] = {
    "config": {"cnr": "AVX2,STRICT", "portable_cnr": "COMPATIBLE,STRICT"},
    "why": "MKL's strict conditional numerical reproducibility: results independent of the thread count, on one code "
    "path. The template pins `cnr`; a user exporting MKL_CBWR=`portable_cnr` instead gets it pinned. Measured on "
    "an AMD EPYC (torch 2.13) and an Intel Xeon Sapphire Rapids (torch 2.11), docs/results/cpu_numerics.*.jsonl: MKL "
    "refuses the Intel branches on AMD and runs AUTO strictly; the route's GEMM block then equals Intel's AVX2 "
    "branch bit for bit, but torch's CPU exp/log/sin/cos go through MKL's vector math, which follows the branch on "
    "Intel and not on AMD, so model bits differ (tokens agreed; thread-independent at 2 and 16 threads on Intel). "
    "COMPATIBLE agrees on both machines for GEMM and vector math (the default model's known answer was equal at 2 "
    "threads) but is not thread-independent (16 threads gave other bits on Intel: the route pins the count) and "
    "takes 2.2x the AVX2 path's time on `make demo` (AMD). So `cnr` is the fast default (batch-invariant and "
    "thread-independent, machines told apart by the fingerprint's answers) and `portable_cnr` the path whose bits "
    "tests/models/test_known_answer.py pins across machines at a fixed thread count.",
}

TILE_CONFIGS["cpu_reduce"] = {
    "config": {"tree": "halving: x[:, i] + x[:, i + P/2] on the width zero-padded to a power of two P"},
    "why": "CPU row sums (norms, softmax, det_sum) are added in an order written here, not torch's: torch's vectorised "
    "reductions follow the CPU's vector width (AVX2 and AVX-512 gave different softmax bits). Additions only, so "
    "every CPU rounds them alike; trailing zeros leave the result unchanged, so a row's sum does not depend on how "
    "far it was padded.",
}

TILE_CONFIGS["rms_norm"] = {
    "config": {"max_block": 4096, "num_warps": 8},
    "why": "One row per program; BLOCK = min(next_pow2(H), 4096) is a function of H alone, and the lane "
    "accumulators are summed by tl.sum over that fixed layout.",
}

TILE_CONFIGS["softmax"] = {
    "config": {"max_block": 16384, "num_warps": 16},
    "why": "One row per program; online max/sum per lane over BLOCK = min(next_pow2(N), 16384) columns, merged "
    "across lanes by one tl.max/tl.sum of fixed layout. 16384/16 warps: fastest of five on the H200 for a 128k "
    "vocabulary, well ahead of 4096/8 (benchmarks/kernels.py --sweep).",
}

TILE_CONFIGS["det_sum"] = {
    "config": {"split": 128, "block": 1024, "num_warps": 4},
    "why": "Seed §4's two-stage reduction (docs/BACKGROUND.md): n cut into a fixed SPLIT of equal segments of ceil(n/SPLIT) (a "
    "function of n alone), each summed by one program in BLOCK-wide steps, then merged in index order "
    "0..SPLIT-1.",
}


TILE_CONFIGS["attention.query_tile"] = {
    "config": {"layout": "rows on N below rows_on_m_from (S^T = K Q^T, O^T = V^T P^T), on M from it (S = Q K^T, "
                         "O = P V)", "row_sum": "ones-block MMA accumulated like O", "rows": 128, "decode_rows": 16,
               "rows_on_m_from": 64, "num_warps": 4, "prefill_warps": 8, "num_stages": 3, "fp_fusion": False},
    "why": "rows = (token, GQA head) pairs. Decode tiles (16 rows, 4 GQA rows used, not 4 of 64) put the rows on the "
    "MMA's N side, S^T = K Q^T and O^T = V^T P^T; prefill tiles (128 rows) on its M side, FlashAttention's layout, "
    "where the softmax max stays in a warp and P is the A operand in registers instead of staged through shared "
    "memory. On the H200 every element of S, of acc + P V and of a ones-MMA row sum has the same bits whichever side "
    "its row is on, at 16-128 rows and 4 or 8 warps (docs/results/mma_roles.h200.json; earlier, rows "
    "on N alone at 16-128 rows: docs/results/attention_rows_probe.h200.json). The row sum l is the one reduction "
    "whose order would follow the layout (tl.sum), so both layouts take it through the MMA, P times a ones block "
    "accumulated like O. That changed every bit of the kernel before (l was tl.sum of the fp32 P) and made prefill "
    "1.5-1.6x faster, decode equal or faster (docs/results/attention_variants.h200.rows_on_m.json). Every tile loads its block ids a "
    "tile ahead and runs 3 stages, so the K/V copies of tile j+2 are in flight while tile j computes. Prefill tiles "
    "are 128 rows at 8 warps (two warpgroups of 64 rows sharing each K/V copy; one program per SM, 134 KB of shared "
    "memory): with the TMA copies that was 3-4 % faster than 64 rows at 4 warps and 2 stages at 2048 tokens, 7-9 % at "
    "4096 and 12-18 % at 8192, in three interleaved rounds, bit for bit (docs/results/attention_variants.h200."
    "r128.json); 64 rows at 3 stages need 115 KB, one program per SM of 4 warps, and were 8-17 % slower. Decode "
    "tiles: 3 stages were 1.08-1.35x faster at batch <= 64 than 2. num_warps is bit-changing below 4: at 2 warps "
    "(mma.sync) rows differ, while stages 2-5 and 4 or 8 warps give every bit "
    "(docs/results/attention_stages.h200.json). "
    "fp_fusion is pinned for all attention, RoPE and KV-write kernels (the fold spells its fma out) so Triton's "
    "changing default never moves bits.",
}

TILE_CONFIGS["attention.kv_tile"] = {
    "config": {"tokens": 64},
    "why": "keys are folded in tiles of this many tokens gathered through the block table, so the page size never "
    "changes the order.",
}

TILE_CONFIGS["attention.split_kv"] = {
    "config": {"tokens": 1024, "merge": "ordered fold 0..n-1, fma(acc_run, a, acc_s * b)"},
    "why": "fixed split size in tokens: decode runs splits in parallel and merges them, prefill folds the same splits "
    "sequentially with the same formula. 1024 (and 3 stages, 64 rows) won an H200 sweep of rows 64/128, KV tile "
    "64/128, split 256-2048, stages 2/3 (benchmarks/attention.py --sweep): longer splits keep the tile loop "
    "pipelined; 128-row tiles doubled decode's wasted rows.",
}

TILE_CONFIGS["attention.cpu"] = {
    "config": {"query_rows": 256, "kv_tokens": 128, "value_pad": 16, "compute": "float32"},
    "why": "Two passes per entry (a query chunk's rows for one KV head): scores of every KV tile through the canonical "
    "block GEMM, the row max (exact), exp, then P @ [V | 1] tile by tile, added in tile order, so the softmax "
    "denominator comes out of the same GEMM as the output (the ones column; value_pad keeps rows aligned). A tile "
    "a row cannot see is skipped for it, so prefill, chunked prefill and decode fold the same tiles in the same "
    "order (kernels/cpu/attention.py). query_rows: up to 256 (token, GQA head) rows per chunk, the largest CPU "
    "block, so a prefill takes few chunks; kv_tokens 128 was chosen, not tuned (64/128/256 were within this "
    "machine's noise on a mixed decode/prefill benchmark).",
}

TILE_CONFIGS["rope.table"] = {
    "config": {"angle": "float32 inv_freq * float32 position (HF)", "cos_sin": "float64, rounded to float32"},
    "why": "the table is built once on the CPU, so its bits do not depend on a device's cos/sin.",
}

TILE_CONFIGS["philox"] = {
    "config": {"rounds": 10, "uniform_bits": 24, "block": 1024},
    "why": "integer arithmetic only (exact everywhere), so the block size cannot change a bit; the 24-bit uniforms "
    "k * 2^-24 are exact in float32. rounds/bits are listed because changing them changes every sample.",
}

TILE_CONFIGS["silu_and_mul"] = {
    "config": {"block": 1024, "num_warps": 4, "arithmetic": "float32 x / (1 + expf(-x)) * up, div.rn, rounded once"},
    "why": "elementwise: each output from its own gate and up values, so the block cannot change a bit; the "
    "arithmetic is torch's CUDA silu (libdevice expf, correctly rounded division), so the kernel gives the unfused "
    "form's bits (triton/activation.py; the GPU test holds it to them).",
}

TILE_CONFIGS["gumbel_race"] = {
    "config": {"vocab_chunk": 8192, "block": 512},
    "why": "the fused race (triton/race.py) takes each row's vocabulary in chunks of vocab_chunk tokens in parallel, "
    "block Philox calls (4 tokens each) at a time, and merges the chunks' winners; the maximum is exact and ties go to "
    "the lowest id, so neither number can change a token. Listed for the fingerprint, not tuned for bits.",
}

TILE_CONFIGS["tensor_parallel"] = {
    "config": {"tp_max": TP_MAX, "shards": "every sharded GEMM at the shape of one of tp_max shards",
               "merge": "adjacent pairwise tree over the tp_max K-chunk partial sums, float32, rounded once"},
    "why": "TP-invariant mode (samebits/distributed/, docs/TP.md): the row-parallel linears' K is cut into tp_max "
    "equal chunks at every TP size, each chunk's float32 partial sum one GEMM of its own, and the partials merged by "
    "(c0+c1)+(c2+c3)... level by level; a rank at TP=t holds tp_max/t neighbouring chunks, so its local merge is a "
    "subtree and the merge of the t gathered partials is the rest of the same tree: the order is a function of K and "
    "tp_max, never of t. Column-parallel linears and the vocab-parallel head run one GEMM per shard of the "
    "tp_max-way split, so every GEMM has the same shape at every t. 8: the largest TP of one H200 host (docs/TP.md).",
}

TILE_CONFIGS["moe"] = {
    # tiles: [max_T, BM, BN, BK, num_warps, num_stages], the first row whose max_T >= the step's tokens T.
    "config": {
        "tiles": [
            [32, 16, 64, 128, 4, 4],
            [128, 16, 128, 128, 8, 3],
            [256, 32, 128, 128, 8, 3],
            [1024, 64, 128, 64, 4, 4],
            [1 << 62, 128, 128, 64, 8, 4],
        ],
        "combine_block": 1024, "combine_warps": 4,
        "routing": "router logits by the invariant linear; float32 softmax over the experts (one row per program); "
                   "top k by (score, then the lower expert index); the k weights renormalised (norm_topk_prob) by a "
                   "sum taken left to right in rank order",
        "combine": "by top-k rank: acc = w0 * y0, then acc = acc + wj * yj, float32, no FMA, rounded once",
        "expert_k_order": "in sequence, one tl.dot per BK step (CUDA); the proven CPU GEMM per expert (CPU)",
    },
    "why": "A token's expert output must not depend on how many other tokens chose that expert: pairs (token, rank) "
    "are sorted by expert into BM-row blocks and every row is reduced over K in sequence into one float32 "
    "accumulator (no split-K, no atomics), which on the H200 gives a row the same bits in every tile shape "
    "(`matmul`), so the tile may follow the step's token count; tests/kernels/triton/test_moe_gpu.py holds the "
    "fused kernels to the dense kernel's bits per expert at every row of this table and whatever the experts' "
    "loads. Ties in the top k go to the lower expert index (kernels/moe.py keys each score with its index), a "
    "function of the row alone. The combine folds the k outputs by top-k rank rather than expert id: the rank "
    "order is the router's own output order, so no per-row sort is needed, and the largest weight comes first; "
    "each step is one IEEE operation on the row's values, so CPU and GPU, vector width and thread count agree on "
    "it. Tiles: decode steps give an expert a few rows (16- and 32-row blocks, wide K steps to stream its weights), "
    "prefill hundreds (64- and 128-row blocks), after vLLM's H100 fused-MoE table for E=128, N=768 (Qwen3-30B-A3B; "
    "its BN of the gate/up GEMM halved here, where one program holds a gate and an up tile); not yet tuned on the "
    "H200.",
}

TILE_CONFIGS["attention.backward"] = {
    # head_dim -> [BM query rows, BN keys, num_warps, num_stages] of both passes
    "config": {"tiles": {"64": [64, 64, 4, 2], "128": [64, 64, 8, 2]},
               "dq": "a query block's keys in order 0..diagonal: a logsumexp pass, then dQ += dS K tile by tile",
               "dkdv": "a key block's query heads g = 0..G-1, each one's query blocks in order diagonal..end: "
                       "dV += P^T dO, dK += dS^T Q"},
    "why": "The RL trainer's attention backward (triton/attention_bwd.py), FlashAttention-2's two passes without a "
    "float atomic: every dQ, dK and dV element is written by exactly one program, which adds its terms in the order "
    "above, a function of the tile and of the sequence's own length; tiles start at the sequence's first token, so a "
    "sequence's gradient never depends on what else is packed. BM and BN change bits (they group the MMA's sums), the "
    "warps and stages do not above 2 warps (attention.query_tile). Reasoned, not swept: attention is under 2 % of a "
    "1B/8B training step at RL lengths.",
}

TILE_CONFIGS["train.backward"] = {
    "config": {"token_rows": 32, "column_block": 128, "column_warps": 4, "norm_warps": 8, "max_hidden": 16384,
               "cpu_tokens": 256, "merge": "float32 partials added in split order 0..n-1, rounded once"},
    "why": "The RL trainer's weight gradients of norms and biases sum over the packed tokens: cut into fixed splits of "
    "token_rows rows, each split one program adding its rows in order, the float32 partials merged in split order "
    "(triton/column_sum.py), so the order is a function of the token count alone. Linear weight gradients are the "
    "invariant matmul with the tokens as K, accumulated in sequence (triton/matmul.py). On the CPU a linear's weight "
    "gradient is cut into cpu_tokens-token chunks (the last zero-padded), one proven GEMM each (cpu/gemm.py: a shape "
    "proven once, not once per token count), added in chunk order; the norm and bias sums take the halving tree "
    "(cpu/reduce.py).",
}

TILE_CONFIGS["fp8"] = {
    "config": {"format": "float8_e4m3fn", "max": 448.0, "k_step": 128, "min_scale_exp": -64,
               "activation_scale": "2^e, the least e with amax <= max * 2^e (amax of the row, or of the row's "
                                   "k_step-wide group for block-scaled weights), at least 2^min_scale_exp",
               "static_activation": "x / input_scale, correctly rounded",
               "rounding": "clamp to +-max, then nearest e4m3 value, ties to even",
               "sum": "each k_step of K: one tensor-core product from a zero float32 accumulator; steps added to "
                      "the float32 sum in K order",
               "epilogue": "channel weights: (sum * a_scale) * w_scale, + bias, rounded once; block weights: "
                           "sum += (step * a_scale) * w_scale per k_step; static activations: w_scale is "
                           "input_scale * w_scale, rounded once at load",
               "online_weights": "per output row: amax / max in float32 (1 for a zero row), w / scale correctly "
                                 "rounded, then as activations"},
    "why": "FP8 weights and activations (kernels/fp8.py, docs/FP8.md). Activation scales are a function of the row "
    "alone (per token, or per token and k_step group for the 128x128 block format): a per-tensor dynamic scale is "
    "the max over the whole batch and is refused in deterministic mode. Scales are powers of two, so applying one is "
    "exact: the activation scale commutes with the weight scale in any epilogue order (cuBLASLt/CUTLASS put it on "
    "either side as they transpose by shape), the quantised values are x * 2^-e rounded once, the same on every "
    "device, and the range lost is at most one binade of headroom (e4m3's relative precision is the same in every "
    "binade). The rounding is written as integer arithmetic on the float32 bits (triton/fp8.py) because Triton's "
    "interpreter rounds float32 -> e4m3 wrongly; it equals torch's cast bit for bit. k_step 128: the block format's K "
    "block, and the promotion interval of CUTLASS's FP8 kernels without fast accumulation (four m64nNk32 wgmma per "
    "float32 add), whose bits the vendor route must equal to be taken (vendor_fp8). On the H200 the e4m3 wgmma "
    "accumulates a step in its own reduced precision; fixing the step makes that a function of K alone.",
}

TILE_CONFIGS["matmul_fp8"] = {
    # Rows: [max_M, BM, BN, BK, num_warps, num_stages, GROUP_M, FUSED]; the first row whose max_M >= M is used.
    "config": [
        [4, 64, 16, 128, 4, 6, 1, 0],
        [16, 64, 32, 128, 4, 6, 1, 0],
        [64, 64, 64, 128, 4, 5, 8, 0],
        [256, 64, 128, 128, 4, 4, 8, 0],
        [1 << 62, 128, 128, 128, 8, 4, 8, 0],
    ],
    "why": "The FP8 GEMM (triton/fp8.py): K in k_step blocks in sequence, never split, so the tile may follow M. BK "
    "is the k_step. BM is at least 64 at every M: below 64 rows Triton lowers an e4m3 tl.dot to mma.sync on float16 "
    "operands (checked in tests/kernels/ptx_audit_worker.py), another product whose bits differ from wgmma's e4m3 "
    "one; rows past M are masked, so the 63 idle rows of a decode tile read nothing. Decode rows split N finely "
    "(16-32 weight rows a program, the full K loop each) so that 8B's N = 4096 still gives 128-256 programs "
    "streaming the weights; prefill rows take 128x128 tiles at 8 warps (the sum and the step both live in "
    "registers: 128x256 would spill). FUSED: the program quantises its own activation rows (the row max in a "
    "prologue over K, then each tile as it is loaded) instead of a separate kernel, the same arithmetic (the same "
    "bits, checked by benchmarks/fp8.py); off in every row: on the H200 the fused M <= 4 launch took 10x the "
    "quantise-then-GEMM pair at the 8B shapes (its prologue runs once per program, N / BN of them). Tiles are "
    "reasoned, not yet swept on the H200 (benchmarks/fp8.py --sweep times the alternatives and checks their bits).",
}

TILE_CONFIGS["fp8_quant"] = {
    "config": {"block": 1024, "num_warps": 4},
    "why": "Per-token quantisation (triton/fp8.py): one row per program, the row max (exact in any order) over "
    "BLOCK-wide chunks, then each element scaled and rounded on its own: the block cannot change a bit.",
}

TILE_CONFIGS["vendor_fp8"] = {
    "config": {"enabled": True, "use_fast_accum": False, "min_m": 128, "k_multiple": 128, "n_multiple": 16,
               "test_m": [128, 129, 192, 256, 257, 320, 1000, 1024, 2048, 3001, 4096, 4097, 8192]},
    "why": "torch._scaled_mm with row-wise scales (on the H200 torch's CUTLASS kernel, the same k_step promotion "
    "without fast accumulation) is taken only for an FP8 weight shape whose self-test (every element equal to the "
    "Triton kernel at each test_m: both sides of its 256-row padding, its 192-row and 4096-row special cases, of "
    "64- and 128-row tiles by SM count) passed in this process; a failed test only means the Triton kernel runs. "
    "min_m: decode steps stay on the Triton kernel, whose small-M tiles stream the weights (vendor FP8 was 0.9-1.3x "
    "bf16 at M <= 16, measured on the H200); the route serves M >= min_m only, so only those are tested.",
}

# Compiler options passed to every Triton launch.
LAUNCH = dict(TILE_CONFIGS["triton"]["config"])


def numerics_profile() -> dict:
    return {name: entry["config"] for name, entry in sorted(TILE_CONFIGS.items())}
