"""The bench on the tiny random shape on the CPU, both modes, a few requests: the report's numbers, deterministic
mode's alone == loaded bits, and a batch-variant kernel in fast mode as the negative control."""
import dataclasses

import pytest
import torch

from samebits.bench import bound
from samebits.bench.config import BenchConfig
from samebits.bench.invariance import alone_vs_loaded, picks
from samebits.bench.load import run_load
from samebits.bench.roofline import H200_PEAK_BYTES, H200_PEAK_FLOPS, StepWork, roofline, step_roofline
from samebits.bench.run import bench_workload, engine_for, load, run_bench
from samebits.bench.workload import workload
from samebits.kernels import get_ops
from samebits.progress import progress_bar
from samebits.runtime import runtime_for
from tests.kernels.helpers import batch_variant_linear

SEED = 3  # the workload's and the requests' seed, fixed
CONFIG = BenchConfig(random_shape="tiny", device="cpu", requests=4, prompt_tokens=(8, 48), output_tokens=(4, 12),
                     rerun_alone=4, seed=SEED)
STATS = {"seconds", "output_tok_per_s", "ttft_mean_s", "itl_mean_ms", "generated_tokens", "steps",
         "alone_vs_loaded_mismatches", "checked", "of_roofline", "step_roofline", "of_step_roofline"}


@pytest.fixture(scope="module")
def loaded():
    with runtime_for("deterministic"):
        return load(CONFIG, "cpu")


@pytest.fixture(scope="module")
def report(loaded):
    with progress_bar(show=False) as bar:
        return run_bench(CONFIG, loaded, bench_workload(CONFIG, loaded.config), "cpu", bar)


def test_report_has_every_number_and_no_roofline_on_the_cpu(report):
    assert set(report["modes"]) == {"deterministic", "fast"}
    for stats in report["modes"].values():
        assert STATS <= set(stats)
        assert stats["generated_tokens"] == report["workload"]["output_tokens"]
        assert stats["of_roofline"] is None and stats["step_roofline"] is None and stats["of_step_roofline"] is None
        steps = stats["steps"]
        assert sum(k["seconds"] for k in steps["by_kind"].values()) == pytest.approx(steps["in_step_s"])
        assert steps["in_step_s"] + steps["between_steps_s"] == pytest.approx(stats["seconds"])
    assert report["roofline"]["total_s"] is None and "cpu" in report["roofline"]["reason"]
    assert "deterministic_tax" in report and report["config"] == dataclasses.asdict(CONFIG)
    assert {m: fp["mode"] for m, fp in report["fingerprints"].items()} == {"deterministic": "deterministic",
                                                                           "fast": "fast"}


def test_deterministic_requests_alone_equal_their_bits_inside_the_load(report):
    det = report["modes"]["deterministic"]
    assert (det["alone_vs_loaded_mismatches"], det["checked"]) == (0, 4)


def test_negative_control_a_batch_variant_kernel_is_caught(loaded, monkeypatch):
    """The same comparison catches a kernel whose bits follow the batch: fast mode's linear moved one ulp wherever it
    computes more than one row (a decode step inside the load; alone, a request decodes one row). Fast mode's vendor
    kernels are not a control on every CPU: under the template's MKL_CBWR=AVX2,STRICT an Intel Xeon's MKL gave the
    GEMMs the same bits at every batch size, and this comparison saw 0 to 2 of 32 fast-mode requests differ there."""
    ops = get_ops("fast", "cpu")
    monkeypatch.setattr(ops, "linear", batch_variant_linear(ops.linear))
    config = dataclasses.replace(CONFIG, mode="fast")
    with progress_bar(show=False) as bar:
        report = run_bench(config, loaded, bench_workload(config, loaded.config), "cpu", bar)
    assert report["modes"]["fast"]["alone_vs_loaded_mismatches"] == CONFIG.rerun_alone


def test_the_check_counts_one_flipped_logprob_bit(loaded, seed):
    """An injected difference of one ulp in one logprob of one request is counted once, and only it."""
    work = workload(3, seed, (8, 24), (4, 6), loaded.config.vocab_size)
    with runtime_for("deterministic"):
        engine = engine_for(loaded, "deterministic", "dynamic", "cpu")
        outs, _ = run_load(engine, work, seed)
        assert alone_vs_loaded(engine, work, outs, picks(3, 3), seed) == 0
        c = outs[1].outputs[0]
        flipped = torch.tensor(c.token_logprobs[-1], dtype=torch.float32).view(torch.int32) ^ 1
        c.token_logprobs[-1] = flipped.view(torch.float32).item()
        assert alone_vs_loaded(engine, work, outs, picks(3, 3), seed) == 1


def test_a_request_longer_than_the_context_names_both_flags(loaded):
    config = dataclasses.replace(CONFIG, prompt_tokens=(8, 4000), output_tokens=(4, 200))
    with pytest.raises(ValueError, match=r"--prompt-tokens MAX 4000 \+ --output-tokens MAX 200 = 4200 exceeds.*4096"):
        bench_workload(config, loaded.config)


def test_roofline_only_where_the_peaks_were_measured(loaded, monkeypatch):
    work = workload(4, SEED, (8, 48), (4, 12), loaded.config.vocab_size)
    monkeypatch.setattr(bound, "device_name", lambda device: "NVIDIA H200")
    h200 = bound.workload_bound(loaded.config, work, torch.bfloat16, "cuda", max_num_seqs=256)
    expect = roofline(loaded.config, [len(p) for p in work.prompts], work.max_tokens, 2, 256, H200_PEAK_FLOPS,
                      H200_PEAK_BYTES)
    assert (h200["total_s"], h200["decode_steps"], h200["reason"]) == (expect.total_s, expect.decode_steps, None)
    assert bound.of_roofline(h200, 2 * expect.total_s) == pytest.approx(0.5)
    fp32 = bound.workload_bound(loaded.config, work, torch.float32, "cuda", max_num_seqs=256)
    assert fp32["total_s"] is None and "NVIDIA H200 float32" in fp32["reason"]
    monkeypatch.setattr(bound, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    other = bound.workload_bound(loaded.config, work, torch.bfloat16, "cuda", max_num_seqs=256)
    assert other["total_s"] is None and bound.of_roofline(other, 1.0) is None
    assert "NVIDIA H100 80GB HBM3 bfloat16" in other["reason"]


def test_the_step_max_roofline_costs_the_runs_own_steps(report, loaded, monkeypatch):
    """At the H200's peaks: the sum over the steps the run logged, by kind, and the share of the run's wall time."""
    work = bench_workload(CONFIG, loaded.config)
    monkeypatch.setattr(bound, "device_name", lambda device: "NVIDIA H200")
    h200 = bound.workload_bound(loaded.config, work, torch.bfloat16, "cuda", max_num_seqs=256)
    stats = report["modes"]["deterministic"]
    steps = [StepWork(*row[1:]) for row in stats["steps"]["work"]]
    assert len(steps) == stats["steps"]["steps"]
    assert {row[0] for row in stats["steps"]["work"]} == set(stats["steps"]["by_kind"])
    got = bound.with_step_bound(stats, h200, loaded.config)
    expect = step_roofline(loaded.config, steps, 2, H200_PEAK_FLOPS, H200_PEAK_BYTES)
    assert got["step_roofline"]["total_s"] == pytest.approx(expect)
    assert sum(got["step_roofline"]["by_kind_s"].values()) == pytest.approx(expect)
    assert got["of_step_roofline"] == pytest.approx(expect / stats["seconds"])
    assert got["of_roofline"] == pytest.approx(h200["total_s"] / stats["seconds"])


@pytest.mark.gpu
def test_on_the_gpu_deterministic_is_invariant_and_the_roofline_known_only_on_the_h200():
    config = dataclasses.replace(CONFIG, device="cuda")
    with runtime_for("deterministic"):
        model = load(config, "cuda")
    with progress_bar(show=False) as bar:
        report = run_bench(config, model, bench_workload(config, model.config), "cuda", bar)
    assert report["modes"]["deterministic"]["alone_vs_loaded_mismatches"] == 0
    on_h200 = torch.cuda.get_device_name() == "NVIDIA H200"
    assert (report["roofline"]["total_s"] is not None) == on_h200
    assert (report["modes"]["fast"]["of_roofline"] is not None) == on_h200


def test_the_timed_load_computes_every_prompt_token(report):
    """The warm-up leaves none of the workload's blocks in the prefix cache: every prompt token and every decode
    row (the first output token comes from the prefill) is a batched token of the timed load."""
    w = report["workload"]
    for stats in report["modes"].values():
        batched = sum(k["mean_tokens"] * k["steps"] for k in stats["steps"]["by_kind"].values())
        assert batched == pytest.approx(w["prompt_tokens"] + w["output_tokens"] - w["requests"])
        assert sum(row[1] for row in stats["steps"]["work"]) == round(batched)


def test_a_warm_pass_runs_the_workload_untimed_and_leaves_nothing_cached(loaded):
    """--warm: a whole untimed pass first (reported as "cold"), then the prefix cache emptied, so the timed load
    still computes every prompt token."""
    from samebits.bench.run import measure

    work = bench_workload(CONFIG, loaded.config)
    with runtime_for("deterministic"):
        engine = engine_for(loaded, "deterministic", "dynamic", "cpu", kv_cache_tokens=4096)
        stats = measure(engine, work, [], SEED, warm=True)
    assert set(stats["cold"]) == {"seconds", "output_tok_per_s", "ttft_mean_s", "itl_mean_ms"}
    batched = sum(k["mean_tokens"] * k["steps"] for k in stats["steps"]["by_kind"].values())
    assert batched == pytest.approx(sum(map(len, work.prompts)) + sum(work.max_tokens) - len(work))


def test_every_mode_runs_with_the_first_modes_kv_pool(report):
    """Like for like: a later mode's pool is the first one's, not what an earlier engine left free."""
    assert len({stats["kv_cache_tokens"] for stats in report["modes"].values()}) == 1
