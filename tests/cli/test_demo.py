"""`samebits generate` and the demo's batch construction."""
from typer.testing import CliRunner

from samebits.cli import app
from samebits.cli.demo import _busy_batch, _cell
from samebits.models.synthetic import write_tiny_checkpoint


def test_generate_prints_text_seed_and_finish(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path, "llama3", seed=1)
    res = CliRunner().invoke(app, ["generate", "hello world", "--model", str(ckpt), "--device", "cpu",
                                   "--max-tokens", "5", "--temperature", "0.7", "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert "seed 3" in res.output and "finish" in res.output


def test_generate_bad_model_is_one_line_error(tmp_path):
    res = CliRunner().invoke(app, ["generate", "x", "--model", str(tmp_path / "missing"), "--device", "cpu"])
    assert res.exit_code != 0 and "error" in res.output and "Traceback" not in res.output


def test_busy_batch_keeps_every_prompt_once_and_reports_where():
    prompts = [[1, 2], [3], [4, 5, 6]]
    fillers = [[9] * k for k in range(1, 20)]
    batch, where = _busy_batch(prompts, fillers)
    assert len(batch) == len(prompts) + len(fillers)
    assert [batch[i] for i in where] == prompts


def test_demo_cells_rank_token_changes_above_bit_changes():
    assert "tokens" in _cell({"tokens": True, "logprob_bits": True})
    assert "bits" in _cell({"tokens": False, "logprob_bits": True})
    assert "same" in _cell({"tokens": False, "logprob_bits": False})
