"""Every table the CLI prints fits an 80-column terminal with no cell folded: each is rendered at 80 and at 300
columns from small fake inputs, and must keep to 80 and have as many body lines as the wide render."""
import io
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from samebits.bench.report import lines as bench_lines
from samebits.bench.report import mode_table, steps_table
from samebits.check.report import table as check_table
from samebits.cli.demo import QUESTIONS, ModeResult, _table
from samebits.cli.main import cut_table, drift_table, field_table, models_table
from samebits.cli.rl_demo import HEADER, _line
from samebits.probe.report import table as probe_table

LONG = "Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64 architecture"


def rendered(table, width: int) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text().splitlines()


def body(lines: list[str]) -> int:
    return sum(line.startswith(("│", "┃")) for line in lines)


def assert_fits(table) -> None:
    narrow, wide = rendered(table, 80), rendered(table, 300)
    assert max(len(line) for line in narrow) <= 80, "\n".join(narrow)
    assert body(narrow) == body(wide), "a cell was folded at 80 columns:\n" + "\n".join(narrow)
    head = next(line for line in narrow if line.startswith("┃"))
    assert all(f" {c.header} " in head for c in table.columns), "a header was cut:\n" + "\n".join(narrow)


def fingerprint_table():
    fp = {"samebits": "0.1.0", "mkl": LONG, "gpu": {"name": "NVIDIA H200", "capability": "9.0", "sm_count": 132},
          "cpu_gemm": {"bmm B=6 K=576 N=960 t2": "rows 1,2,4,8,16,32,64,128,256,512; thread-independent"},
          "vendor_gemm": {}, "weights": "0123456789abcdef", "hash": "fedcba9876543210"}
    return field_table(fp, "samebits fingerprint", 80)


def env_table():
    return cut_table("environment problems", ("variable", "expected", "actual"),
                     [("CUBLAS_WORKSPACE_CONFIG", ":4096:8", "(unset)"), ("MKL_CBWR", "AUTO,STRICT", LONG)], 80)


def lock_drift_table():
    drift = [("gpu", {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sm_count": 132},
              {"name": "NVIDIA H200", "capability": "9.0", "sm_count": 132}), ("mkl", LONG, LONG[:40])]
    return drift_table(drift, Path("samebits.lock"), 80)


def cached_models_table():
    root = Path("/home/someone/.cache/samebits")
    return models_table([("smollm2-135m", root / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf", 98_400_000)],
                        root, 80)


def demo_table():
    fast, det = ModeResult("fast"), ModeResult("deterministic")
    for r, changed in ((fast, True), (det, False)):
        r.alone = [((1, 2), (3,))] * len(QUESTIONS)
        r.busy = [((1, 2), (4,) if changed else (3,))] * len(QUESTIONS)
        r.texts = ["The capital of France is Paris, a city of light."] * len(QUESTIONS)
    return _table([fast, det])


def _probe(name, impl, verdict, axis="batch", note="", **kw):
    return {"name": name, "dtype": "bfloat16", "implementation": impl, "verdict": verdict, "note": note, "axis": axis,
            "sizes": kw.pop("sizes", [1, 2, 4, 2048]), "mismatch_fraction": kw.pop("frac", [0, 0.5, 0.881, 0.9]),
            "max_abs_diff": [0, 1e-3, 3.1e-5, 2e-2], "extra": kw.pop("extra", {})}


def probes_table():
    probes = [
        _probe("attention_prefill_vs_decode", "vendor", "variant", "seq_len"),
        _probe("attention_prefill_vs_decode", "samebits", "invariant", "seq_len", frac=[0, 0, 0, 0]),
        _probe("fp32_associativity", "vendor", "variant", "order", sizes=[3], extra={"left": 1.0, "right": 0.0}),
        _probe("fp32_associativity", "samebits", "n/a", "order", "arithmetic: no kernel", sizes=[]),
        _probe("model_greedy", "vendor", "variant", "prompts", sizes=[4], frac=[0.1],
               extra={"sequences_differ": 1, "sequences": 4, "logit_rows_differ": 24, "logit_rows_compared": 240}),
        _probe("run_to_run_splitk_atomic", "vendor", "error", note="RuntimeError: " + LONG, sizes=[]),
    ]
    return probe_table({"device": "cuda", "full": True, "probes": probes})


def check_report_table():
    groups = [{"label": label, "diverged": 3, "observations": 3, "unique_outputs": 4, "first_divergence": 17,
               "max_abs_delta": 9.375e-2} for label in ("N=1", "N=128", "mixed burst of 128 vs cold")]
    experiments = [{"name": "needle", "status": "variant", "method": None, "note": "", "groups": groups},
                   {"name": "prefill", "status": "incomplete", "method": "echo+logprobs", "note": LONG,
                    "groups": groups[:1]},
                   {"name": "repeat", "status": "skipped", "method": None, "note": LONG, "groups": []}]
    report = {"url": "http://inference.example.com:8000", "model": "meta-llama/Llama-3.1-8B-Instruct",
              "api": "completions", "comparison": {"exact": True, "tolerance": 0}, "experiments": experiments,
              "verdict": "variant", "requests": 1234, "elapsed_s": 56.7,
              "endpoint": {"system_fingerprints": {"fp_0123456789abcdef": 1234}}}
    return check_table(report)


def _bench_report(roofline: dict) -> dict:
    """The widest numbers a bench row shows: hours of wall time, 5-digit tok/s, every request checked."""
    kinds = {k: {"steps": 12345, "seconds": 1234.56, "mean_ms": 12345.6, "mean_tokens": 8192, "mean_rows": 256}
             for k in ("decode", "mixed", "prefill", "empty")}
    stats = {"output_tok_per_s": 12345.6, "ttft_mean_s": 123.45, "itl_mean_ms": 1234.5, "seconds": 12345.67,
             "of_roofline": 0.4812, "of_step_roofline": 0.6123, "alone_vs_loaded_mismatches": 256, "checked": 256,
             "step_roofline": {"total_s": 1234.56, "by_kind_s": {"decode": 1234.56, "mixed": 123.45, "prefill": 12.34}},
             "steps": {"steps": 123456, "in_step_s": 12000.0, "between_steps_s": 345.67, "by_kind": kinds}}
    return {"model": "/home/someone/models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "device": "cuda",
            "workload": {"requests": 65536}, "roofline": roofline, "deterministic_tax": -0.0213,
            "modes": {"deterministic": stats, "fast": {**stats, "of_roofline": None, "of_step_roofline": None,
                                                        "step_roofline": None}}}


H200_BOUND = {"device": "NVIDIA H200", "dtype": "bfloat16", "total_s": 6.05, "prefill_s": 2.45, "decode_s": 3.6,
              "peak_flops": 790e12, "peak_bytes": 4.3e12}
UNKNOWN_BOUND = {"device": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16", "total_s": None}


def bench_table():
    return mode_table(_bench_report(H200_BOUND))


def bench_steps_table():
    return steps_table(_bench_report(H200_BOUND)["modes"])


TABLES = {"fingerprint": fingerprint_table, "env --check": env_table, "verify-lock": lock_drift_table,
          "models": cached_models_table, "demo": demo_table, "probe": probes_table, "check": check_report_table,
          "bench": bench_table, "bench steps": bench_steps_table}


@pytest.mark.parametrize("command", sorted(TABLES))
def test_table_fits_80_columns_unfolded(command):
    assert_fits(TABLES[command]())


def test_rl_demo_lines_fit_80_columns():
    from types import SimpleNamespace

    parity = SimpleNamespace(bitwise_equal=0.9375, kl_k3=1.25e-14, ratio_min=0.9999999, ratio_mean=1.0,
                             ratio_max=1.0000002)
    lines = [*HEADER.splitlines(), *_line(999, [SimpleNamespace(parity=parity, alarm=True, reward=0.5)] * 2).split("\n")]
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)


@pytest.mark.parametrize("bound", [H200_BOUND, UNKNOWN_BOUND])
def test_bench_lines_fit_80_columns(bound):
    lines = bench_lines(_bench_report(bound))
    assert len(lines) == 5 and max(len(line) for line in lines) <= 80, "\n".join(lines)


def test_negative_control_a_plain_table_of_the_same_values_folds():
    """The check above catches folding: the fingerprint's values in a default rich table wrap at 80 columns."""
    plain = Table(title="samebits fingerprint")
    plain.add_column("field")
    plain.add_column("value")
    plain.add_row("mkl", LONG)
    narrow, wide = rendered(plain, 80), rendered(plain, 300)
    assert body(narrow) > body(wide)
