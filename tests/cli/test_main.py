"""The `samebits` command itself: --version, `serve MODEL` as `vllm serve MODEL`, one-line errors for misuse."""
from importlib.metadata import version

import pytest
import torch
from typer.testing import CliRunner

from samebits.cli import app
from samebits.server import serve as serve_module
from samebits.server.config import ServerConfig
from tests.runtime.test_cli import assert_one_line_error


def run(*args):
    return CliRunner().invoke(app, list(args))


def test_version():
    res = run("--version")
    assert res.exit_code == 0 and res.output == f"samebits {version('samebits')}\n"


@pytest.fixture
def served(monkeypatch):
    """The ServerConfig that `samebits serve` would start, without starting it."""
    configs = []
    monkeypatch.setattr(serve_module, "serve", configs.append)
    return configs


@pytest.mark.parametrize("args,model", [
    (["serve", "/models/a"], "/models/a"),
    (["serve", "--model", "/models/b"], "/models/b"),
    (["serve", "/models/a", "--model", "/models/a"], "/models/a"),
    (["serve", "--port", "9000", "/models/a"], "/models/a"),
    (["serve"], ServerConfig().engine.model),
])
def test_serve_takes_the_model_as_argument_or_flag(served, args, model):
    res = run(*args)
    assert res.exit_code == 0, res.output
    assert [c.engine.model for c in served] == [model]


def test_serve_two_different_models_is_one_line_error(served):
    res = run("serve", "/models/a", "--model", "/models/b")
    assert_one_line_error(res)
    assert "'/models/a' (MODEL)" in res.output and "'/models/b' (--model)" in res.output
    assert served == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", [["serve", "--device", "cuda"], ["generate", "hi", "--device", "cuda"],
                                     ["demo", "--device", "cuda"]])
def test_cuda_on_a_machine_without_it_is_one_line_error(command):
    res = run(*command)
    assert_one_line_error(res)
    assert "CUDA is not available on this machine" in res.output


def test_unknown_device_is_one_line_error():
    res = run("serve", "--device", "tpu")
    assert_one_line_error(res)
    assert "unknown device 'tpu'" in res.output


def test_serve_has_the_tensor_parallel_flags(served):
    res = run("serve", "/models/a", "--tensor-parallel-size", "4", "--all-reduce", "invariant")
    assert res.exit_code == 0, res.output
    (config,) = served
    assert (config.engine.tensor_parallel_size, config.engine.all_reduce) == (4, "invariant")


def test_serve_bad_tensor_parallel_size_is_one_line_error(served):
    res = run("serve", "/models/a", "--tensor-parallel-size", "3")
    assert_one_line_error(res)
    assert "tensor_parallel_size must be one of (1, 2, 4, 8), got 3" in res.output and served == []


def test_serve_takes_vllms_speculative_config_json(served):
    res = run("serve", "/models/a", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}')
    assert res.exit_code == 0, res.output
    (config,) = served
    spec = config.engine.speculative_config
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max) == (
        "ngram", 4, 5, 5)


@pytest.mark.parametrize("value,says", [
    ('{"method": "eagle", "num_speculative_tokens": 4}', "speculative_config.method must be one of"),
    ('{"method": "ngram", "num_speculative_tokens": 17}', ("speculative_config.num_speculative_tokens must be an int in "
                                                          "[1, 16], got 17")),
    ("ngram", "speculative_config must be a JSON object"),
])
def test_serve_bad_speculative_config_is_one_line_error(served, value, says):
    res = run("serve", "/models/a", "--speculative-config", value)
    assert_one_line_error(res)
    assert says in res.output and served == []


def test_tokenizer_export_writes_an_hf_folder_or_one_line_error(tmp_path):
    from samebits.models.synthetic import write_tiny_checkpoint
    from samebits.models.tokenizer import Tokenizer

    model = write_tiny_checkpoint(tmp_path / "ckpt", "llama3")
    res = run("tokenizer", "export", str(tmp_path / "out"), "--model", str(model))
    assert res.exit_code == 0, res.output
    assert Tokenizer.from_hf_dir(tmp_path / "out").encode("a b c") == Tokenizer.from_hf_dir(model).encode("a b c")
    missing = run("tokenizer", "export", str(tmp_path / "x"), "--model", str(tmp_path / "none"))
    assert_one_line_error(missing)
    assert "no model" in missing.output


@pytest.mark.parametrize("args,model,names", [
    (["serve", "/models/a", "--served-model-name", "x", "y"], "/models/a", ("x", "y")),
    (["serve", "--served-model-name", "x", "y", "--port", "9", "/models/a"], "/models/a", ("x", "y")),
    (["serve", "/models/a", "--served-model-name", "x"], "/models/a", ("x",)),
])
def test_served_model_name_takes_several_names_vllms_way(served, args, model, names):
    """`--served-model-name a b` took b as the model path on 2026-12-04; vLLM reads both as names."""
    res = run(*args)
    assert res.exit_code == 0, res.output
    assert served[0].engine.model == model and served[0].served_model_name == names
    assert served[0].model_name == names[0]


def test_chat_template_must_be_a_file_or_a_template(served, tmp_path):
    res = run("serve", "/models/a", "--chat-template", str(tmp_path / "missing.jinja"))
    assert_one_line_error(res)
    assert "chat_template: no file at" in res.output


def test_serve_help_reads_at_80_columns_grouped_with_every_flag_whole_and_described():
    """`serve --help` at 80 columns on 2026-12-04: flag names cut (`--max-num-batched-…`), one ungrouped box,
    flags without a description; -h and -V refused."""
    import click
    import typer.main

    from samebits.cli.main import SERVE_GROUPS

    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "80"}, terminal_width=80).output
    assert CliRunner().invoke(app, ["serve", "-h"], env={"COLUMNS": "80"}, terminal_width=80).output == out
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out
    starts = [out.index(f"\n{group}:\n") for group in SERVE_GROUPS]
    assert starts == sorted(starts)
    command = typer.main.get_command(app).commands["serve"]
    ctx = click.Context(command)
    options = [p for p in command.params if p.param_type_name == "option"]
    assert len(options) > 45
    for option in options:
        for name in option.opts + option.secondary_opts:
            assert f"  {name} " in out or f" {name}\n" in out or f"{name} / " in out or f"/ {name}\n" in out, name
        help_text = " ".join(option.get_help_record(ctx)[1].split())
        assert option.help and "default" in help_text.lower(), option.name
    assert run("-V").output == run("--version").output == f"samebits {version('samebits')}\n"
