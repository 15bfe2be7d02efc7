"""Run in a subprocess by test_cpu_paths.py under one MKL / ATen code path (set by the environment before torch loads):
the CPU invariance checks at model shapes, printed as one JSON object. Kernel checks run first, so MKL computes in the
path under test before the engine's template could pin another mode.

Usage: python -m tests.kernels.cpu_paths_worker SEED
"""
from __future__ import annotations

import json
import sys
import tempfile
import traceback

import torch


def _same(a, b) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def _rows_invariant(fn, width, g, sizes=(1, 3, 17, 64, 200)) -> str:
    """'' when a row alone has the same bits at a random slot of every M; else what differed."""
    row = torch.randn(width, generator=g)
    alone = fn(row[None])[0]
    for m in sizes:
        batch = torch.randn(m, width, generator=g)
        p = int(torch.randint(0, m, (1,), generator=g))
        batch[p] = row
        if not _same(fn(batch)[p], alone):
            return f"row alone differs from slot {p} of M={m}"
    return ""


def kernel_checks(g) -> dict[str, str]:
    import samebits.kernels as K
    from samebits.kernels.cpu.backend import bmm

    out = {}
    for k, n in [(576, 960), (576, 3072), (1536, 576), (576, 8192), (1000, 1536), (4096, 4096)]:
        w = torch.randn(n, k, generator=g) * k ** -0.5
        out[f"linear K={k} N={n}"] = _rows_invariant(lambda x, w=w: K.linear(x, w), k, g)
    w = torch.randn(320, 96, generator=g)
    out["matmul"] = _rows_invariant(lambda x: K.matmul(x, w), 320, g)

    def entries(flat):  # each row is one bmm entry: 12 query rows and 12 key rows of width 64
        qk = flat.view(-1, 24, 64)
        return bmm(qk[:, :12], qk[:, 12:].transpose(1, 2)).reshape(flat.shape[0], -1)

    out["bmm entry"] = _rows_invariant(entries, 24 * 64, g, sizes=(2, 5, 33))
    nw = torch.randn(576, generator=g)
    out["rms_norm"] = _rows_invariant(lambda x: K.rms_norm(x, nw, 1e-5), 576, g)
    out["softmax V=49152"] = _rows_invariant(K.softmax, 49152, g, sizes=(2, 3, 65))
    out["log_softmax V=49152"] = _rows_invariant(K.log_softmax, 49152, g, sizes=(2, 3, 65))
    out["silu_and_mul I=100"] = _rows_invariant(K.silu_and_mul, 200, g)
    out["attention"] = attention_check()
    return out


def control(g) -> str:
    """The same row check on a deliberately M-dependent reduction (its split point follows M): must report it."""
    def split_sum(x):
        cut = 1 + len(x) % 63
        return (x[:, :cut].sum(-1) + x[:, cut:].sum(-1))[:, None]

    return "".join(_rows_invariant(lambda x: split_sum(x * 100.0), 64, g) for _ in range(20))


def attention_check() -> str:
    from tests.kernels.test_attention import chunked, full_prefill, make_world, run

    world = make_world([300, 77, 130], 9, 3, 64, 16, seed=3)
    full = full_prefill(world)
    for s, length in enumerate([300, 77, 130]):
        if not _same(chunked(world, s, [c for c in (5, 64, 129, 200) if c < length]), full[s]):
            return f"seq {s}: chunked prefill differs from full prefill"
    reqs = [(0, 250, 1), (1, 77, 1), (2, 3, 1)]
    for (s, ctx, _), o in zip(reqs, run(world, reqs)):
        if not _same(o, full[s][ctx - 1:ctx]):
            return f"seq {s}: decode at {ctx - 1} differs from prefill"
    return ""


def engine_check() -> str:
    from samebits.engine.llm import LLM
    from samebits.engine.sampling_params import SamplingParams
    from samebits.models.synthetic import write_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_tiny_checkpoint(tmp, "llama3", seed=1, hidden_size=256, intermediate_size=512, vocab_size=1024,
                                     num_attention_heads=4, num_key_value_heads=2)
        llm = LLM(model=str(ckpt), device="cpu", kv_cache_tokens=8192, max_num_batched_tokens=256)
        params = SamplingParams(temperature=0.7, seed=11, max_tokens=4, logprobs=0, ignore_eos=True)
        g = torch.Generator().manual_seed(5)
        needle = torch.randint(3, 1024, (30,), generator=g).tolist()
        fillers = [torch.randint(3, 1024, (int(n),), generator=g).tolist() for n in torch.randint(3, 60, (24,), generator=g)]

        def key(o):
            c = o.outputs[0]
            return c.token_ids, torch.tensor(c.token_logprobs, dtype=torch.float32).view(torch.int32).tolist()

        alone = key(llm.generate([needle], params, use_tqdm=False)[0])
        busy = llm.generate(fillers[:11] + [needle] + fillers[11:], params, use_tqdm=False)
        return "" if key(busy[11]) == alone else "needle alone differs from the needle among 24 fillers"


def main(seed: int) -> None:
    from samebits.kernels.cpu import mkl
    from samebits.kernels.cpu.gemm import known_answer, verdicts

    g = torch.Generator().manual_seed(seed)
    report = {"seed": seed, "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    try:
        report["checks"] = kernel_checks(g)
        report["checks"]["engine needle"] = engine_check()
        report["control"] = control(g)
    except Exception:  # noqa: BLE001 - any failure goes back to the parent test as JSON, with its traceback
        report["error"] = traceback.format_exc()
    report.update(mkl_cnr=mkl.cnr_mode(), known_answer=known_answer(), verdicts=verdicts())
    print(json.dumps(report))


if __name__ == "__main__":
    main(int(sys.argv[1]))
