"""Compile every Triton kernel config samebits launches for sm_90 and print, per config, what the audit needs.

Run as a subprocess by test_ptx_audit.py, without TRITON_INTERPRET, so @triton.jit yields compilable kernels.
"""
import importlib
import itertools
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from samebits.kernels.configs import LAUNCH, TILE_CONFIGS
from samebits.kernels.triton.matmul import pipeline_stages

# atom.global.add.f32, red.shared.add.noftz.bf16x2, atom.add.f16 ...: any atomic or reduction on a float type.
FLOAT_ATOMIC = re.compile(r"\b(atom|red)(\.\w+)*\.(f16|bf16|f32|f64)(x2)?\b")
DTYPES = ("bf16", "fp16", "fp32")
WGMMA_E4M3 = re.compile(r"wgmma\.mma_async\S*\.e4m3\.e4m3")


def _jit(module, name):
    return getattr(importlib.import_module(f"samebits.kernels.triton.{module}"), name)


def _spec(fn, types, const, aligned, options):
    """As the runtime specializes a launch on dense tensors: pointers and sizes divisible by 16, unit strides."""
    sig = {a: types.get(a, "constexpr") for a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    return fn, sig, const, attrs, {**LAUNCH, **options}


def _matmul_specs():
    fn = _jit("matmul", "_matmul_kernel")
    specs = []
    for _, bm, bn, bk, warps, stages, group in TILE_CONFIGS["matmul"]["config"]:
        for dt in DTYPES:
            # The K-tail, bias variant holds every instruction of the others (masks and the bias load on top).
            for even_k, bias in ((False, True),):
                types = {p: f"*{dt}" for p in ("a_ptr", "b_ptr", "c_ptr", "bias_ptr")}
                types.update({a: "i32" for a in ("M", "N", "K", "stride_am", "stride_bn", "stride_cm")})
                const = {"stride_ak": 1, "stride_bk": 1, "stride_cn": 1, "HAS_BIAS": bias, "BM": bm, "BN": bn,
                         "BK": bk, "GROUP_M": group, "EVEN_K": even_k, "UPCAST": False,
                         "PRECISION": "ieee" if dt == "fp32" else "tf32"}
                aligned = ["a_ptr", "b_ptr", "c_ptr", "bias_ptr", "N", "K", "stride_am", "stride_bn", "stride_cm"]
                specs.append((f"matmul {bm}x{bn}x{bk} {dt} even_k={even_k}",
                              _spec(fn, types, const, aligned, {"num_warps": warps, "num_stages": pipeline_stages(
                                  bm, bn, bk, stages, 4 if dt == "fp32" else 2)})))
    return specs


def _fp8_specs():
    """The FP8 GEMM at every row of its table (channel weights with a bias; block weights on the prefill row), every
    activation form of the fused decode row, and the quantisation kernel per activation form: as triton/fp8.py
    launches them."""
    from samebits.kernels.fp8 import K_STEP

    fn, quant = _jit("fp8", "_fp8_matmul_kernel"), _jit("fp8", "_quantize_rows_kernel")
    specs = []
    rows = TILE_CONFIGS["matmul_fp8"]["config"]
    for _, bm, bn, bk, warps, stages, group, fused in rows:
        forms = [(0, False, False, True)]  # (ACT, FUSED, BLOCK_W, HAS_BIAS)
        if bm == rows[-1][1]:
            forms.append((1, False, True, False))
        if fused:
            forms += [(act, True, act == 1, False) for act in (0, 1, 2)]
        for act, fuse, block_w, bias in forms:
            a = "*bf16" if fuse else "*fp8e4nv"
            types = {"a_ptr": a, "as_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "c_ptr": "*bf16",
                     "bias_ptr": "*bf16"}
            types.update({n: "i32" for n in ("M", "N", "K", "stride_am", "stride_as", "stride_wn", "stride_ws",
                                             "stride_cm")})
            const = {"ACT": act, "FUSED": fuse, "BLOCK_W": block_w, "W_ROWS": K_STEP, "HAS_BIAS": bias, "BM": bm,
                     "BN": bn, "BK": bk, "GROUP_M": group, "EVEN_K": False, "UPCAST": False}
            aligned = ["a_ptr", "as_ptr", "w_ptr", "ws_ptr", "c_ptr", "bias_ptr", "N", "K", "stride_am", "stride_wn",
                       "stride_cm"]
            options = {"num_warps": warps, "num_stages": pipeline_stages(bm, bn, bk, stages, 2 if fuse else 1)}
            specs.append((f"fp8_matmul {bm}x{bn}x{bk} act={act} fused={fuse} block={block_w}",
                          _spec(fn, types, const, aligned, options)))
    qcfg = TILE_CONFIGS["fp8_quant"]["config"]
    for act in (0, 1, 2):
        types = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "in_ptr": "*fp32", "K": "i32",
                 "stride_x": "i32", "stride_q": "i32", "stride_s": "i32"}
        specs.append((f"fp8_quant act={act}", _spec(quant, types, {"ACT": act, "BLOCK": qcfg["block"],
                                                                    "STEP": K_STEP}, ["x_ptr", "q_ptr"],
                                                    {"num_warps": qcfg["num_warps"]})))
    return specs


def _row_specs():
    specs = []
    rms, sm = _jit("norms", "_rms_norm_kernel"), _jit("softmax", "_softmax_kernel")
    rcfg, scfg, dcfg = (TILE_CONFIGS[k]["config"] for k in ("rms_norm", "softmax", "det_sum"))
    for dt in DTYPES:
        for res, one in itertools.product((False, True), (False, True)):
            types = {p: f"*{dt}" for p in ("x_ptr", "r_ptr", "w_ptr", "y_ptr", "s_ptr")}
            types.update({a: "i32" for a in ("H", "stride_x", "stride_r", "stride_y", "stride_s")}, eps="fp32")
            const = {"HAS_RES": res, "BLOCK": rcfg["max_block"], "ONE_BLOCK": one}
            specs.append((f"rms_norm {dt} res={res} one_block={one}", _spec(rms, types, const, ["x_ptr", "y_ptr"],
                                                                            {"num_warps": rcfg["num_warps"]})))
        for log in (False, True):
            types = {"x_ptr": f"*{dt}", "y_ptr": "*fp32", "N": "i32", "stride_x": "i32", "stride_y": "i32"}
            specs.append((f"softmax {dt} log={log}", _spec(sm, types, {"LOG": log, "BLOCK": scfg["max_block"]},
                                                          ["x_ptr", "y_ptr"], {"num_warps": scfg["num_warps"]})))
        types = {"x_ptr": f"*{dt}", "part_ptr": "*fp32", "n": "i32", "seg": "i32", "stride_x": "i32"}
        specs.append((f"det_sum stage 1 {dt}", _spec(_jit("reduce", "_segment_sum_kernel"), types,
                                                     {"SPLIT": dcfg["split"], "BLOCK": dcfg["block"]}, ["x_ptr"],
                                                     {"num_warps": dcfg["num_warps"]})))
    types = {"OUT": "*fp32", "SEED_LO": "*i64", "SEED_HI": "*i64", "POS": "*i64", "SAMPLE": "*i64", "V": "i32",
             "stride_ob": "i32"}
    specs.append(("philox uniforms", _spec(_jit("philox", "_philox_uniform_kernel"), types,
                                           {"STREAM": 0, "BLOCK": TILE_CONFIGS["philox"]["config"]["block"]},
                                           ["OUT"], {"num_warps": 4})))
    acfg = TILE_CONFIGS["silu_and_mul"]["config"]
    for dt in DTYPES:
        types = {"x_ptr": f"*{dt}", "y_ptr": f"*{dt}", "inter": "i32", "stride_x": "i32", "stride_y": "i32"}
        specs.append((f"silu_and_mul {dt}", _spec(_jit("activation", "_silu_and_mul_kernel"), types,
                                                  {"LIBDEVICE": True, "BLOCK": acfg["block"]}, ["x_ptr", "y_ptr"],
                                                  {"num_warps": acfg["num_warps"]})))
    race, rcfg = _jit("race", "_gumbel_race_kernel"), TILE_CONFIGS["gumbel_race"]["config"]
    types = {"Z": "*fp32", "KEYS": "*fp64", "IDS": "*i64", "SEED_LO": "*i64", "SEED_HI": "*i64", "POS": "*i64",
             "SAMPLE": "*i64", "V": "i32", "stride_z": "i32", "n_chunks": "i32"}
    specs.append(("gumbel race", _spec(race, types, {"STREAM": 0, "VOCAB_CHUNK": rcfg["vocab_chunk"],
                                                     "BLOCK": rcfg["block"]}, ["Z"], {"num_warps": 4})))
    types = {"KEYS": "*fp64", "IDS": "*i64", "TOKENS": "*i64", "BEST": "*fp64", "n_chunks": "i32"}
    specs.append(("gumbel race merge", _spec(_jit("race", "_merge_chunks_kernel"), types, {"CHUNKS": 16}, [],
                                             {"num_warps": 4})))
    specs.append(("det_sum merge", _spec(_jit("reduce", "_merge_kernel"), {"part_ptr": "*fp32", "out_ptr": "*fp32"},
                                         {"SPLIT": dcfg["split"]}, [], {"num_warps": 1})))
    return specs


def _moe_specs():
    """The fused MoE kernels at every row of the moe table in bf16 (the serving dtype) and at the first row in the
    other dtypes, as triton/moe.py launches them at real shapes (sizes and row strides multiples of 16)."""
    from samebits.kernels.triton.moe import _stages

    gate_up, down, comb = (_jit("moe", n) for n in ("_moe_gate_up_kernel", "_moe_down_kernel", "_moe_combine_kernel"))
    cfg = TILE_CONFIGS["moe"]["config"]
    specs = []
    rows = [(tile, "bf16") for tile in cfg["tiles"]] + [(cfg["tiles"][0], dt) for dt in DTYPES if dt != "bf16"]
    for (_, bm, bn, bk, warps, stages), dt in rows:
        size, common = 4 if dt == "fp32" else 2, {"UPCAST": False, "PRECISION": "ieee" if dt == "fp32" else "tf32",
                                                  "BM": bm, "BN": bn, "BK": bk, "EVEN_K": False}
        types = {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "h_ptr": f"*{dt}", "pairs_ptr": "*i32",
                 "block_expert_ptr": "*i32", **{a: "i32" for a in ("P", "K", "INTER", "stride_xm", "stride_we",
                                                                  "stride_wn", "stride_hm")}}
        specs.append((f"moe gate_up {bm}x{bn}x{bk} {dt}", _spec(
            gate_up, types, {**common, "TOPK": 8, "LIBDEVICE": True}, [a for a in types if a != "P"],
            {"num_warps": warps, "num_stages": _stages(bm, bn, bk, stages, size, 2)})))
        types = {"h_ptr": f"*{dt}", "w_ptr": f"*{dt}", "y_ptr": f"*{dt}", "pairs_ptr": "*i32",
                 "block_expert_ptr": "*i32", **{a: "i32" for a in ("P", "K", "N", "stride_hm", "stride_we",
                                                                  "stride_wn", "stride_ym")}}
        specs.append((f"moe down {bm}x{bn}x{bk} {dt}", _spec(
            down, types, common, [a for a in types if a != "P"],
            {"num_warps": warps, "num_stages": _stages(bm, bn, bk, stages, size, 1)})))
    for dt in DTYPES:
        types = {"y_ptr": f"*{dt}", "w_ptr": "*fp32", "out_ptr": f"*{dt}", "N": "i32", "stride_ym": "i32",
                 "stride_om": "i32"}
        specs.append((f"moe combine {dt}", _spec(comb, types, {"TOPK": 8, "BLOCK": cfg["combine_block"]},
                                                 ["y_ptr", "out_ptr"], {"num_warps": cfg["combine_warps"]})))
    return specs


def _paged_attention_specs(dtype, d, query_tile, block_n, split):
    fn = _jit("attention", "_paged_attention_kernel")
    specs = []
    # Pages of 16 tokens gather key by key; pages of whole KV tiles (CUDA's default) load one block id per tile and
    # copy every tile through the TMA descriptors the launcher passes.
    for (partial, rows), page in itertools.product(((False, query_tile["rows"]), (True, query_tile["decode_rows"])),
                                                   (16, block_n)):
        ptr = "*" + dtype
        tma = page % block_n == 0
        on_m = rows >= query_tile["rows_on_m_from"]
        fused = partial and not on_m  # the launcher's fused merge: integer counters
        sig = {"Q": ptr, "K": ptr, "V": ptr, "O": ptr, "PM": "*fp32", "PL": "*fp32", "PACC": "*fp32", "RUN": "*fp32",
               "SEM": "*i32" if fused else ptr, "cu_seqlens_q": "*i32", "context_lens": "*i32",
               "block_tables": "*i32", "qk_scale": "fp32", "n_split_grid": "i32", "num_q_heads": "i32"}
        sig.update({n: "i32" for n in ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_kb", "stride_ks",
                                       "stride_kh", "stride_vb", "stride_vs", "stride_vh", "stride_bt")})
        const = {"G": 4, "BQ": rows, "BLOCK_N": block_n, "D": d, "BS": page, "SPLIT": split,
                 "PARTIAL": partial, "UPCAST": False, "PRECISION": "ieee" if dtype == "fp32" else "tf32",
                 "ON_M": on_m, "RUN_IN_MEMORY": not partial, "TMA": tma, "FUSED_MERGE": fused}
        if not tma:
            const.update(KD=None, VD=None)
        sig.update({n: "constexpr" for n in const})
        if tma:
            sig.update({n: f"tensordesc<{dtype}[{block_n}, {d}]>" for n in ("KD", "VD")})
        warps = query_tile["prefill_warps"] if const["ON_M"] else query_tile["num_warps"]  # as the launcher picks
        options = {"num_warps": warps, "num_stages": query_tile["num_stages"]}
        specs.append((f"paged_attention_{dtype}_d{d}_{'partial' if partial else 'fold'}_page{page}", fn, sig, const,
                      options))
    return specs


def _merge_spec(dtype, d, query_tile, split):
    sig = {"O": "*" + dtype, "PM": "*fp32", "PL": "*fp32", "PACC": "*fp32", "cu_seqlens_q": "*i32",
           "context_lens": "*i32", "n_split_grid": "i32", "num_q_heads": "i32", "stride_ot": "i32", "stride_oh": "i32"}
    const = {"G": 4, "BQ": query_tile["decode_rows"], "D": d, "SPLIT": split}
    sig.update({n: "constexpr" for n in const})
    return (f"merge_splits_{dtype}_d{d}", _jit("attention", "_merge_splits_kernel"), sig, const,
            {"num_warps": query_tile["num_warps"], "num_stages": 1})


def _copy_specs(dtype):
    ptr = "*" + dtype
    kv = {"K": ptr, "V": ptr, "KC": ptr, "VC": ptr, "slots": "*i64", "stride_kt": "i32", "stride_vt": "i32",
          "HD": "constexpr", "BLOCK": "constexpr"}
    rope = {"Q": ptr, "K": ptr, "QO": ptr, "KO": ptr, "positions": "*i64", "COS_SIN": "*fp32",
            **{a: "i32" for a in ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_qot", "stride_qoh",
                                  "stride_kot", "stride_koh", "num_q_heads", "num_k_heads")},
            "HALF": "constexpr", "BLOCK_Q": "constexpr", "BLOCK_K": "constexpr"}
    rope_kv = {"Q": ptr, "K": ptr, "V": ptr, "QO": ptr, "KC": ptr, "VC": ptr, "positions": "*i64", "slots": "*i64",
               "COS_SIN": "*fp32", **{a: "i32" for a in ("stride_qt", "stride_qh", "stride_kt", "stride_kh",
                                                         "stride_vt", "stride_qot", "stride_qoh", "num_q_heads",
                                                         "num_k_heads")},
               "HALF": "constexpr", "BLOCK_Q": "constexpr", "BLOCK_K": "constexpr", "BLOCK_V": "constexpr"}
    options = {"num_warps": 4, "num_stages": 1}
    return [(f"write_kv_{dtype}", _jit("kv_write", "_write_kv_kernel"), kv, {"HD": 1024, "BLOCK": 1024}, options),
            (f"rope_{dtype}", _jit("rope", "_rope_kernel"), rope, {"HALF": 64, "BLOCK_Q": 32, "BLOCK_K": 8},
             options),
            (f"rope_write_kv_{dtype}", _jit("rope", "_rope_write_kv_kernel"), rope_kv,
             {"HALF": 64, "BLOCK_Q": 32, "BLOCK_K": 8, "BLOCK_V": 1024}, options)]


def _attention_specs():
    """Paged attention (fold and partial), its split merge, KV write and RoPE, at representative shapes, with the
    attention block's pinned fp_fusion."""
    query_tile = TILE_CONFIGS["attention.query_tile"]["config"]
    block_n = TILE_CONFIGS["attention.kv_tile"]["config"]["tokens"]
    split = TILE_CONFIGS["attention.split_kv"]["config"]["tokens"]
    raw = []
    for dtype in DTYPES:
        for d in (64, 128):
            raw += _paged_attention_specs(dtype, d, query_tile, block_n, split)
            raw.append(_merge_spec(dtype, d, query_tile, split))
        raw += _copy_specs(dtype)
    fusion = {"enable_fp_fusion": query_tile["fp_fusion"]}
    return [(f"attention {name}", (fn, sig, const, _runtime_alignment(fn, sig) if name.startswith("paged") else {},
                                   {**options, **fusion})) for name, fn, sig, const, options in raw]


def _gluon_specs():
    """The Gluon decode tile (kernels/triton/attention_gluon.py) in both 16-bit dtypes and head dims, folding and
    partial with its fused merge, on pages of whole KV tiles (the only pages it takes), as attention.py launches it."""
    from triton.experimental.gluon import language as gl

    fn = _jit("attention_gluon", "_decode_kernel")
    query_tile = TILE_CONFIGS["attention.query_tile"]["config"]
    block_n = TILE_CONFIGS["attention.kv_tile"]["config"]["tokens"]
    specs = []
    for (dtype, gl_dtype), d, partial in itertools.product((("bf16", gl.bfloat16), ("fp16", gl.float16)), (64, 128),
                                                         (False, True)):
        desc = f"tensordesc<{dtype}[{block_n}, {d}],{gl.NVMMASharedLayout.get_default_for([block_n, d], gl_dtype)!r}>"
        sig = {"Q": "*" + dtype, "KD": desc, "VD": desc, "O": "*" + dtype, "PM": "*fp32", "PL": "*fp32",
               "PACC": "*fp32", "SEM": "*i32" if partial else "*" + dtype, "cu_seqlens_q": "*i32",
               "context_lens": "*i32", "block_tables": "*i32", "qk_scale": "fp32", "n_split_grid": "i32",
               "num_q_heads": "i32"}
        sig.update({n: "i32" for n in ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_bt")})
        const = {"G": 4, "BQ": query_tile["decode_rows"], "BLOCK_N": block_n, "D": d, "BS": block_n,
                 "SPLIT": TILE_CONFIGS["attention.split_kv"]["config"]["tokens"], "PARTIAL": partial,
                 "STAGES": importlib.import_module("samebits.kernels.triton.attention_gluon").STAGES,
                 "FUSED_MERGE": partial}
        sig.update({n: "constexpr" for n in const})
        specs.append((f"attention gluon_decode_{dtype}_d{d}_{'partial' if partial else 'fold'}",
                      (fn, sig, const, _runtime_alignment(fn, sig),
                       {"num_warps": 4, "enable_fp_fusion": query_tile["fp_fusion"]})))
    return specs


def _runtime_alignment(fn, sig):
    """The divisibility the runtime specialises a paged-attention launch on: every pointer (torch allocations) and
    every cache, query and output stride is a multiple of 16 elements at the head dims with a tile; the block
    table's row stride need not be, so it is left unaligned. Without it the K/V loads would not pipeline here."""
    aligned = [a for a in fn.arg_names if sig.get(a, "").startswith("*") or (a.startswith("stride_") and a != "stride_bt")]
    return {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}


def _ptx(spec):
    fn, sig, const, attrs, options = spec
    source = ASTSource
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton.compile(source(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def _float_atomics(ptx):
    return [line.strip() for line in ptx.splitlines() if FLOAT_ATOMIC.search(line)]


@triton.jit
def _atomic_control(x_ptr, out_ptr):
    tl.atomic_add(out_ptr, tl.load(x_ptr))


def _report(ptx):
    return {"float_atomics": _float_atomics(ptx)[:3], "cp_async": "cp.async" in ptx, "wgmma": "wgmma" in ptx,
            "tma": "cp.async.bulk.tensor" in ptx, "wgmma_e4m3": bool(WGMMA_E4M3.search(ptx)),
            "mma_sync": "mma.sync" in ptx}


def main():
    specs = _matmul_specs() + _fp8_specs() + _row_specs() + _moe_specs() + _attention_specs() + _gluon_specs()
    specs.append(("control: tl.atomic_add fp32", _spec(_atomic_control, {"x_ptr": "*fp32", "out_ptr": "*fp32"}, {},
                                                        [], {"num_warps": 1})))
    fn, sig, const, attrs, options = dict(specs)["attention paged_attention_bf16_d128_partial_page16"]
    specs.append(("control: paged attention at 2 warps", (fn, sig, const, attrs, {**options, "num_warps": 2})))
    specs.append(("control: paged attention unaligned", (fn, sig, const, {}, options)))
    # ptxas runs as a subprocess, so threads overlap the compiles.
    with ThreadPoolExecutor(4) as pool:
        ptxs = list(pool.map(_ptx, [s for _, s in specs]))
    json.dump({name: _report(p) for (name, _), p in zip(specs, ptxs)}, sys.stdout)


if __name__ == "__main__":
    main()
