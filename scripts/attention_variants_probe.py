"""H200 probe: paged attention variants side by side with the kernel before a change and SDPA, bit for bit.

    git show main:samebits/kernels/triton/attention.py > scripts/_attention_before.py   # untracked: it travels
    python scripts/attention_variants_probe.py OUT_DIR scripts/_attention_before.py [--only prefill,family]

The before file is another copy of samebits/kernels/triton/attention.py (main's, when the tree holds a change to
it). Each variant's output is compared bit for bit with the first variant of its own kernel (a change may change
the bits on purpose; its launches must still agree), and each is timed (decode in a CUDA graph) beside SDPA on the
same data, so a change's speed-up is a ratio from one run. Variants set the launch's stages, rows, warps (of the
tiles timed: decode or prefill), the split strategy (`_PARALLEL`), the grid (`_GRID`) or module switches. Last, per
warp counts, whether prefill tiles and decode agree bit for bit, and the prefill times. The variants of the last
run and what they measured: docs/results/HISTORY.md §3 and docs/results/attention_variants.h200.r128.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os

import torch
import torch.nn.functional as F

from samebits.benchmarks.attention import BS, HQ, D, _bench, _paged
from samebits.kernels.attention import AttentionMetadata
from samebits.kernels.triton import attention as at

DECODE = [(1, 512), (1, 2048), (1, 8192), (1, 32768), (8, 512), (8, 2048), (32, 2048), (64, 512), (64, 2048),
          (256, 512), (256, 2048)]
# --cold: each timed call reads caches no earlier call of the graph touched since COLD_BYTES of others, so the KV comes
# from HBM as in an engine step (its GEMMs stream the weights through L2 between two layers' attention).
COLD_BYTES = 160 << 20
PREFILL = [1024, 2048, 4096, 8192]
# (name, module, rows or None, stages or None (the launcher's), warps[, switches]); a variant whose module
# attribute the module lacks (a switch of a pending change that this tree does not have) is skipped.
# "_GRID": the launch's metadata says max_context_len = that, as a CUDA graph's does (engine/cuda_graphs.py);
# "_PARALLEL": the launcher's parallel_splits. SPLIT 256 changes bits: with splits folded at large batches (no merge)
# and parallel at small ones, a smaller split may win at both ends (docs/results/HISTORY.md §3).
# The last run's decode variants (docs/results/attention_variants.h200.decode_rows.json): the committed decode tile
# (16 rows on N, 4 warps) against decode in prefill-style tiles, rows on M (64 rows at 4 or 8 warps, 128 at 8; the
# same bits by the MMA-roles probe), and the decode tile at 8 warps. "before" is main's copy of this kernel.
DECODE_VARIANTS = [("r16 w4", "after", None, None, 4),
                   ("r64 w4", "after", 64, None, 4, {"PREFILL_WARPS": 4}),
                   ("r64 w8", "after", 64, None, 4, {"PREFILL_WARPS": 8}),
                   ("r128 w8", "after", 128, None, 4, {"PREFILL_WARPS": 8}),
                   ("r16 w8", "after", None, None, 8),
                   ("r64 w4 par", "after", 64, None, 4, {"PREFILL_WARPS": 4, "_PARALLEL": True})]
# Prefill tiles with the rows on M (kernels/triton/attention.py): 64 rows at 4 warps (one warpgroup) or 8 (the N side
# shared by two), 128 rows at 8 (two warpgroups of 64 rows), 2 to 4 stages; the same bits by the MMA-roles probe.
PREFILL_VARIANTS = [("before r64 w4 s2", "before", 64, 2, 4), ("after r128 w8 s3", "after", 128, 3, 8),
                    ("after r64 w4 s2", "after", 64, 2, 4), ("after r128 w8 s4", "after", 128, 4, 8)]
# Mixed batches: `batch` decodes at `ctx`, then one `ctx`-token prompt; eager, as an engine runs them.
MIXED = [(64, 512), (192, 512), (192, 2048)]
MIXED_VARIANTS = [("before", "before", {}), ("after", "after", {}), ("after one launch", "after", {"split_decodes": False})]

# Below 4 warps Triton takes mma.sync, not wgmma (PTX), which changes bits, and 2 warps decoded 8-21 % faster at
# batch >= 32 (docs/results/attention_stages.h200.json); at 2 warps prefill ran 1.5-2x slower than at 4
# (docs/results/attention_variants.h200.json). Within each family prefill must equal decode: (warps, [(rows, stages)]).
# (decode warps, prefill warps, [(rows, stages)]).
FAMILIES = [(4, 4, [(64, 2), (64, 3)]), (4, 8, [(128, 3), (128, 2), (64, 3)])]


def _load(path):
    spec = importlib.util.spec_from_file_location("attention_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stages(mod):
    return mod.NUM_STAGES, getattr(mod, "DECODE_STAGES", None)


def _set_stages(mod, stages):
    mod.NUM_STAGES = stages[0]
    if stages[1] is not None and hasattr(mod, "DECODE_STAGES"):
        mod.DECODE_STAGES = stages[1]


def _warps_attr(mod, kind):
    """The module attribute that sets the warps of the tiles timed: prefill tiles have their own since they run 8."""
    return "PREFILL_WARPS" if kind == "prefill" and hasattr(mod, "PREFILL_WARPS") else "NUM_WARPS"


def _copies(tensors, cold: bool) -> list:
    """One tuple of the tensors, or (--cold) enough clones of them that cycling through all of them spills L2."""
    n = -(-COLD_BYTES // sum(t.numel() * t.element_size() for t in tensors)) if cold else 1
    return [tuple(tensors)] + [tuple(t.clone() for t in tensors) for _ in range(n - 1)]


def _each(fn, copies):
    """A call of fn on every copy (the first call's result returned) and the number of calls, to divide times by."""
    def call():
        outs = [fn(*c) for c in copies]
        return outs[0]
    return call, len(copies)


def _paged_call(attention, q, meta, scale, rows, kw, k_cache, v_cache):
    return attention(q, k_cache, v_cache, meta, scale, rows=rows, **kw)


def _run(mods, rows_out, kind, batch, ctx, variants, round_=0, cold=False):
    gen = torch.Generator().manual_seed(ctx + batch)  # the block shuffle; the values come from torch's CUDA stream
    q, k, v, k_cache, v_cache, meta = _paged(batch, ctx, 1 if kind == "decode" else ctx, gen)
    scale = D ** -0.5
    qs = q.view(batch, -1, HQ, D).transpose(1, 2)
    ks, vs = k.transpose(1, 2), v.transpose(1, 2)
    causal = kind == "prefill"
    graph = kind == "decode"
    sdpa_call, n_sdpa = _each(lambda kk, vv: F.scaled_dot_product_attention(qs, kk, vv, scale=scale, is_causal=causal,
                                                                            enable_gqa=True), _copies((ks, vs), cold))
    sdpa = _bench(sdpa_call, graph=graph) / n_sdpa
    caches = _copies((k_cache, v_cache), cold)
    refs = {}  # each module's first variant: a variant's bits are compared within its own kernel
    for name, which, rows, stages, warps, *extra in variants:
        mod = mods[which]
        switches = dict(extra[0]) if extra else {}
        parallel = switches.pop("_PARALLEL", None)  # the launcher's argument, not a module attribute
        grid = switches.pop("_GRID", None)
        if not all(hasattr(mod, key) for key in switches):
            print(f"{kind} b{batch} c{ctx} {name}: skipped, the kernel has no {sorted(switches)}", flush=True)
            continue
        warps_attr = _warps_attr(mod, kind)
        committed = _stages(mod), getattr(mod, warps_attr), {key: getattr(mod, key) for key in switches}
        if stages is not None:
            _set_stages(mod, (stages, stages))
        setattr(mod, warps_attr, warps)
        for key, value in switches.items():
            setattr(mod, key, value)
        kw = {} if parallel is None else {"parallel_splits": parallel}
        launch_meta = dataclasses.replace(meta, max_context_len=grid) if grid else meta
        one = functools.partial(_paged_call, mod.paged_attention, q, launch_meta, scale, rows, kw)
        call, n_calls = _each(one, caches)
        try:
            out = call()
            ref = refs.setdefault(which, out)
            same = bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))
            ms = _bench(call, graph=graph) / n_calls
        except Exception as e:  # noqa: BLE001 - out of shared memory or registers: record and go on
            rows_out.append({"kind": kind, "batch": batch, "context": ctx, "variant": name, "error": str(e)[:300]})
            print(f"{kind} b{batch} c{ctx} {name}: error {str(e)[:120]}", flush=True)
            continue
        finally:
            _set_stages(mod, committed[0])
            setattr(mod, warps_attr, committed[1])
            for key, value in committed[2].items():
                setattr(mod, key, value)
        rows_out.append({"kind": kind, "batch": batch, "context": ctx, "variant": name, "ms": ms, "sdpa_ms": sdpa,
                         "ratio": sdpa / ms, "same_bits": same, "round": round_, "cold": cold,
                         "copies": n_calls})
        print(f"{kind:7s} b{batch:<3d} c{ctx:<5d} {'cold ' if cold else ''}{name:11s} {ms * 1e3:8.1f} us  "
              f"sdpa {sdpa * 1e3:8.1f} us  "
              f"x{sdpa / ms:.2f}  same={same}", flush=True)


def _mixed(mods, rows_out, batch, ctx):
    """A mixed batch's attention, eager: every variant's bits equal the first's, each timed."""
    q, _, _, k_cache, v_cache, meta = _paged(batch + 1, ctx, 1, torch.Generator().manual_seed(ctx - batch))
    meta = AttentionMetadata.build([1] * batch + [ctx], [ctx] * (batch + 1), meta.block_tables.tolist(), BS, "cuda")
    q = torch.randn(batch + ctx, HQ, D, device="cuda", dtype=q.dtype)
    refs = {}
    for name, which, kw in MIXED_VARIANTS:
        call = functools.partial(mods[which].paged_attention, q, k_cache, v_cache, meta, D ** -0.5, **kw)
        out = call()
        ref = refs.setdefault(which, out)
        row = {"kind": "mixed", "batch": batch, "context": ctx, "variant": name, "ms": _bench(call),
               "same_bits": bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))}
        rows_out.append(row)
        print(f"mixed   b{batch:<3d} c{ctx:<5d} {name:16s} {row['ms'] * 1e3:8.1f} us  same={row['same_bits']}",
              flush=True)


def _family(rows_out, length, warps, prefill_warps, prefill_tiles):
    """Decode tiles at `warps`, prefill tiles at `prefill_warps`: every prefill tile's rows equal to each other and
    its last row equal to the decode of that token (prefill == decode, the kernel's invariance); prefill times beside
    SDPA's."""
    q, k, v, k_cache, v_cache, meta = _paged(1, length, length, torch.Generator().manual_seed(length))
    scale = D ** -0.5
    qs, ks, vs = q.view(1, -1, HQ, D).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    sdpa = _bench(lambda: F.scaled_dot_product_attention(qs, ks, vs, scale=scale, is_causal=True, enable_gqa=True))
    one = AttentionMetadata.build([1], [length], meta.block_tables.tolist(), k_cache.shape[1], q.device)
    committed = at.NUM_STAGES, at.NUM_WARPS, at.PREFILL_WARPS
    try:
        at.NUM_WARPS, at.PREFILL_WARPS = warps, prefill_warps
        decoded = at.paged_attention(q[-1:], k_cache, v_cache, one, scale)
        first = None
        for rows, stages in prefill_tiles:
            at.NUM_STAGES = stages
            call = functools.partial(at.paged_attention, q, k_cache, v_cache, meta, scale, rows=rows)
            out = call()
            first = out if first is None else first
            row = {"kind": "family", "warps": warps, "prefill_warps": prefill_warps, "context": length, "rows": rows,
                   "stages": stages, "ms": _bench(call), "sdpa_ms": sdpa,
                   "same_as_first_tile": bool(torch.equal(out.view(torch.int16), first.view(torch.int16))),
                   "last_row_equals_decode": bool(torch.equal(out[-1:].view(torch.int16), decoded.view(torch.int16)))}
            row["ratio"] = sdpa / row["ms"]
            rows_out.append(row)
            print(f"family w{warps}/{prefill_warps} prefill c{length} r{rows} s{stages}: {row['ms'] * 1e3:8.1f} us  "
                  f"x{row['ratio']:.2f}  tiles agree={row['same_as_first_tile']}  "
                  f"prefill==decode={row['last_row_equals_decode']}", flush=True)
    finally:
        at.NUM_STAGES, at.NUM_WARPS, at.PREFILL_WARPS = committed


PARTS = ("decode", "mixed", "prefill", "family")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("before", help="another copy of samebits/kernels/triton/attention.py")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {PARTS}")
    ap.add_argument("--rounds", type=int, default=1, help="time every decode and prefill case this many times, "
                    "the variants interleaved in each round, so that a disturbed case shows as a disagreement")
    ap.add_argument("--cold", action="store_true", help="decode also timed with the KV read from HBM (COLD_BYTES "
                    "of other caches between two calls), after the usual L2-warm timing")
    args = ap.parse_args()
    parts = set(args.only.split(","))
    assert parts <= set(PARTS), f"--only: unknown parts {sorted(parts - set(PARTS))}, expected some of {PARTS}"
    os.makedirs(args.out_dir, exist_ok=True)
    mods = {"before": _load(args.before), "after": at}
    rows: list[dict] = []
    for round_ in range(args.rounds):
        for batch, ctx in DECODE if "decode" in parts else ():
            for cold in (False, True) if args.cold else (False,):
                _run(mods, rows, "decode", batch, ctx, DECODE_VARIANTS, round_, cold)
    for batch, ctx in MIXED if "mixed" in parts else ():
        _mixed(mods, rows, batch, ctx)
    for round_ in range(args.rounds):
        for length in PREFILL if "prefill" in parts else ():
            _run(mods, rows, "prefill", 1, length, PREFILL_VARIANTS, round_)
    for warps, prefill_warps, tiles in FAMILIES if "family" in parts else ():
        for length in (1024, 4096):
            _family(rows, length, warps, prefill_warps, tiles)
    with open(os.path.join(args.out_dir, "attention_variants.json"), "w") as f:
        json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
