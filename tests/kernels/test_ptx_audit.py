"""PTX audit: every Triton kernel config samebits launches, compiled for sm_90 (no GPU needed), has no float atomic."""
import json
import os
import subprocess

import pytest

from samebits.kernels.configs import TILE_CONFIGS
from tests.child import module_argv

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def audit():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(module_argv("tests.kernels.ptx_audit_worker"), env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_every_kernel_config_compiles_for_sm90_without_float_atomics(audit):
    kernels = {k: v for k, v in audit.items() if not k.startswith("control")}
    assert sum(k.startswith("matmul") for k in kernels) == len(TILE_CONFIGS["matmul"]["config"]) * 3
    bad = {name: r["float_atomics"] for name, r in kernels.items() if r["float_atomics"]}
    assert not bad, f"float atomics in deterministic kernels: {bad}"


def test_attention_kernels_are_audited(audit):
    names = {k.split()[1] for k in audit if k.startswith("attention ")}
    assert {"paged_attention_bf16_d128_fold_page16", "paged_attention_bf16_d128_partial_page16",
            "paged_attention_bf16_d128_fold_page64", "paged_attention_bf16_d128_partial_page64", "merge_splits_bf16_d128",
            "write_kv_bf16", "rope_bf16"} <= names


def test_moe_kernels_are_audited(audit):
    tiles = len(TILE_CONFIGS["moe"]["config"]["tiles"])
    assert sum(k.startswith(("moe gate_up", "moe down")) and k.endswith("bf16") for k in audit) == 2 * tiles
    assert all(audit[f"moe combine {dt}"] for dt in ("bf16", "fp16", "fp32"))


def test_audit_sees_a_float_atomic(audit):
    assert audit["control: tl.atomic_add fp32"]["float_atomics"], "the audit regex misses tl.atomic_add on fp32"


def test_matmul_configs_use_tensor_cores_and_a_pipeline(audit):
    # Performance, not bits: every 16-bit tile loads through cp.async, tiles of 64+ rows lower to wgmma.
    for name, r in audit.items():
        if name.startswith("matmul") and "fp32" not in name:
            assert r["cp_async"], f"{name}: no async-copy pipeline"
            if int(name.split()[1].split("x")[0]) >= 64:
                assert r["wgmma"], f"{name}: no wgmma"


def test_paged_attention_pipelines_its_loads_and_uses_wgmma(audit):
    # Bits and speed: below wgmma (mma.sync, at 2 warps) rows come out with other bits (kernels/configs.py,
    # attention.query_tile), and without cp.async or TMA the K/V loads do not overlap the arithmetic. fp32 runs exact
    # products without tensor cores.
    names = [n for n in audit if n.startswith("attention paged_attention") and "fp32" not in n]
    assert len(names) == 16, names  # 2 dtypes x 2 head dims x fold/partial x 2 page forms
    for name in names:
        assert audit[name]["wgmma"], f"{name}: no wgmma"
        # 16-token pages gather key by key through cp.async; pages of whole KV tiles copy each tile through TMA.
        if name.endswith("_page16"):
            assert audit[name]["cp_async"], f"{name}: K/V loads not pipelined through cp.async"
            assert not audit[name]["tma"], f"{name}: TMA copies where pages split a tile"
        else:
            assert audit[name]["tma"], f"{name}: K/V tiles not copied through TMA"
    # The controls: the same kernel at 2 warps (mma.sync) and without the alignment (no cp.async) are seen.
    assert not audit["control: paged attention at 2 warps"]["wgmma"]
    assert not audit["control: paged attention unaligned"]["cp_async"]


def test_the_gluon_decode_tile_is_audited(audit):
    # Both 16-bit dtypes and head dims, folding and partial (with the fused merge's integer counter): wgmma, TMA copies
    # and no float atomic, like attention.py's decode tiles whose bits it gives.
    names = [n for n in audit if n.startswith("attention gluon_decode")]
    assert len(names) == 8, names
    for name in names:
        assert audit[name]["wgmma"] and audit[name]["tma"], f"{name}: no wgmma or no TMA"
        assert not audit[name]["float_atomics"], f"{name}: {audit[name]['float_atomics']}"


def test_fp8_kernels_are_audited_and_multiply_e4m3_on_wgmma(audit):
    # Bits: below 64 rows Triton lowers an e4m3 tl.dot to mma.sync on float16 operands, another product than the
    # e4m3 wgmma every other tile uses (kernels/configs.py matmul_fp8), so every FP8 GEMM config must stay on wgmma.
    gemms = [n for n in audit if n.startswith("fp8_matmul")]
    rows = TILE_CONFIGS["matmul_fp8"]["config"]
    assert len(gemms) == len(rows) + 1 + 3 * sum(row[7] for row in rows)
    for name in gemms:
        assert audit[name]["wgmma_e4m3"] and not audit[name]["mma_sync"], f"{name}: not an e4m3 wgmma product"
        assert audit[name]["cp_async"], f"{name}: loads not pipelined"
    assert {f"fp8_quant act={a}" for a in range(3)} <= set(audit)
