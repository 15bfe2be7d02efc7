"""lm-evaluation-harness's `local-completions` against a live samebits server, run twice in this child process
(lm-eval sets torch's and numpy's seeds and its loggers: none of that may reach the test process). Writes both runs'
per-document answers and metrics as JSON.

    python -m tests.server.lm_eval_worker BASE_URL TASK_DIR OUT_JSON
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

TASKS = ["samebits_choice", "samebits_answer"]  # a loglikelihood task, a generate_until task (test_tokenize.py)


def run_once(base_url: str, task_dir: str) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    # As `--model local-completions --model_args model=tiny,base_url=...`: no tokenizer named, lm-eval finds one.
    lm = LocalCompletionsAPI(model="tiny", base_url=f"{base_url}/v1/completions", max_length=256, max_gen_toks=8,
                             max_retries=1)
    # lm-eval's own thousands of tasks are not indexed: only the two of task_dir.
    tasks = TaskManager(include_path=task_dir, include_defaults=False)
    out = simple_evaluate(model=lm, tasks=TASKS, task_manager=tasks, log_samples=True, bootstrap_iters=0)
    samples = {task: [[s["doc_id"], s["resps"], s["filtered_resps"]] for s in out["samples"][task]] for task in TASKS}
    metrics = {task: {k: v for k, v in out["results"][task].items() if k != "alias"} for task in TASKS}
    return {"samples": samples, "metrics": metrics, "tokenizer_backend": lm.tokenizer_backend}


if __name__ == "__main__":
    url, folder, target = sys.argv[1:]
    Path(target).write_text(json.dumps([run_once(url, folder), run_once(url, folder)]), encoding="utf-8")
