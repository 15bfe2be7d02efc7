"""Compile every Triton kernel config samebits launches for sm_90 and print, per config, what the audit needs.

Run as a subprocess by test_ptx_audit.py, without TRITON_INTERPRET, so @triton.jit yields compilable kernels.
"""
import importlib
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from samebits.kernels.configs import LAUNCH, TILE_CONFIGS

# atom.global.add.f32, red.shared.add.noftz.bf16x2, atom.add.f16 ...: any atomic or reduction on a float type.
FLOAT_ATOMIC = re.compile(r"\b(atom|red)(\.\w+)*\.(f16|bf16|f32|f64)(x2)?\b")
DTYPES = ("bf16", "fp16", "fp32")


def _jit(module, name):
    return getattr(importlib.import_module(f"samebits.kernels.{module}"), name)


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
                              _spec(fn, types, const, aligned, {"num_warps": warps, "num_stages": stages})))
    return specs


def _row_specs():
    specs = []
    rms, sm = _jit("rmsnorm", "_rms_norm_kernel"), _jit("softmax", "_softmax_kernel")
    rcfg, scfg, dcfg = (TILE_CONFIGS[k]["config"] for k in ("rms_norm", "softmax", "det_sum"))
    for dt in DTYPES:
        for res in (False, True):
            types = {p: f"*{dt}" for p in ("x_ptr", "r_ptr", "w_ptr", "y_ptr", "s_ptr")}
            types.update({a: "i32" for a in ("H", "stride_x", "stride_r", "stride_y", "stride_s")}, eps="fp32")
            specs.append((f"rms_norm {dt} res={res}", _spec(rms, types, {"HAS_RES": res, "BLOCK": rcfg["max_block"]},
                                                           ["x_ptr", "y_ptr"], {"num_warps": rcfg["num_warps"]})))
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
    specs.append(("det_sum merge", _spec(_jit("reduce", "_merge_kernel"), {"part_ptr": "*fp32", "out_ptr": "*fp32"},
                                         {"SPLIT": dcfg["split"]}, [], {"num_warps": 1})))
    return specs


def _attention_specs():
    """Paged attention, its split merge, KV write and RoPE: the attention module lists its own launch configs."""
    from samebits.kernels.attention import audit_specs

    keys = ("num_warps", "num_stages", "enable_fp_fusion")
    return [(f"attention {a['name']}", (a["fn"], a["signature"], a["constexprs"], {}, {k: a[k] for k in keys}))
            for a in audit_specs()]


def _ptx(spec):
    fn, sig, const, attrs, options = spec
    return triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def _float_atomics(ptx):
    return [line.strip() for line in ptx.splitlines() if FLOAT_ATOMIC.search(line)]


@triton.jit
def _atomic_control(x_ptr, out_ptr):
    tl.atomic_add(out_ptr, tl.load(x_ptr))


def _report(ptx):
    return {"float_atomics": _float_atomics(ptx)[:3], "cp_async": "cp.async" in ptx, "wgmma": "wgmma" in ptx}


def main():
    specs = _matmul_specs() + _row_specs() + _attention_specs()
    specs.append(("control: tl.atomic_add fp32", _spec(_atomic_control, {"x_ptr": "*fp32", "out_ptr": "*fp32"}, {},
                                                        [], {"num_warps": 1})))
    # ptxas runs as a subprocess, so threads overlap the compiles.
    with ThreadPoolExecutor(4) as pool:
        ptxs = list(pool.map(_ptx, [s for _, s in specs]))
    json.dump({name: _report(p) for (name, _), p in zip(specs, ptxs)}, sys.stdout)


if __name__ == "__main__":
    main()
