"""vLLM's tokenizer routes (server/tokenize.py) and lm-evaluation-harness's `local-completions` on them: the failing
call of 2026-12-04 (`--model local-completions --model_args model=...,base_url=...`, no tokenizer folder) runs a
loglikelihood and a generate_until task, twice, with identical answers."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest

from tests.child import module_argv
from tests.server.conftest import MODEL_NAME

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]


@pytest.fixture(scope="module")
def http(server):
    with server.client() as c:
        yield c


def test_tokenize_gives_the_served_prompt_ids(server, http):
    text = "The capital of France is"
    r = http.post("/tokenize", json={"model": MODEL_NAME, "prompt": text, "return_token_strs": True}).json()
    served = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": text, "max_tokens": 1}).json()
    assert r["count"] == len(r["tokens"]) == served["usage"]["prompt_tokens"]
    assert r["tokens"] == server.engine.tokenizer.encode(text)
    # Special-token text is the special token, as vLLM's /tokenize: lm-eval reads the eos id off it.
    eos = server.engine.tokenizer.special_tokens["eos_token"]
    eos_ids = http.post("/tokenize", json={"prompt": eos, "add_special_tokens": False}).json()["tokens"]
    assert eos_ids == [server.engine.tokenizer.backend.token_to_id(eos)]
    assert "".join(r["token_strs"]) == text and r["max_model_len"] == server.engine.max_model_len
    assert http.post("/tokenize", json={"prompt": text}).json()["token_strs"] is None
    chat = http.post("/tokenize", json={"messages": CHAT}).json()
    answer = http.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": CHAT, "max_tokens": 1}).json()
    assert chat["count"] == answer["usage"]["prompt_tokens"]


def test_detokenize_inverts_tokenize_and_tokenizer_info_names_the_special_tokens(server, http):
    text = "a b\tc ünï 🙂"
    ids = http.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert http.post("/detokenize", json={"model": MODEL_NAME, "tokens": ids}).json() == {"prompt": text}
    info = http.get("/tokenizer_info").json()
    assert info["eos_token"] == server.engine.tokenizer.special_tokens["eos_token"] and info["chat_template"]


@pytest.mark.parametrize("route,body,param", [
    ("/detokenize", {"tokens": [1, 10 ** 9]}, "tokens"),
    ("/tokenize", {"prompt": "a", "messages": CHAT}, "messages"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "a", "truncate_prompt_tokens": 3}, "truncate_prompt_tokens"),
    ("/tokenize", {"messages": CHAT, "add_special_tokens": True}, "add_special_tokens"),
])
def test_bad_tokenizer_requests_are_400s_naming_the_field(http, route, body, param):
    r = http.post(route, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert http.post(route, json={**body, "model": "other"}).status_code in (400, 404)


DOCS = [{"question": "Capital of France:", "choices": [" Paris", " Rome", " Oslo"], "answer": 0},
        {"question": "2 + 2 =", "choices": [" 4", " 5"], "answer": 0},
        {"question": "Opposite of hot:", "choices": [" cold", " warm", " wet"], "answer": 0}]
TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
test_split: test
doc_to_text: "{{{{question}}}}"
"""
CHOICE = "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\ndoc_to_target: answer\nmetric_list:\n" \
         "  - metric: acc\n"
ANSWER = ("output_type: generate_until\ndoc_to_target: \"{{choices[answer]}}\"\ngeneration_kwargs:\n"
          "  until: [\"\\n\"]\n  max_gen_toks: 6\n  temperature: 0\nmetric_list:\n  - metric: exact_match\n")


@pytest.mark.timeout(300)
def test_lm_eval_local_completions_runs_twice_identically_with_no_tokenizer_folder(server, tmp_path):
    if importlib.util.find_spec("lm_eval") is None:  # not imported here: it sets environment variables on import
        pytest.skip("lm-eval is not installed (the dev extra)")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8")
    for name, tail in (("samebits_choice", CHOICE), ("samebits_answer", ANSWER)):
        (tmp_path / f"{name}.yaml").write_text(TASK.format(name=name, docs=docs) + tail, encoding="utf-8")
    # No network and no cache of the user's: everything lm-eval and datasets write stays in tmp_path.
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    out = tmp_path / "runs.json"
    done = subprocess.run(module_argv("tests.server.lm_eval_worker", server.url, str(tmp_path), str(out)), env=env,
                          capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = json.loads(out.read_text())
    assert first["tokenizer_backend"] == "remote"  # found through /tokenizer_info and /tokenize
    assert first == second
    choice, answer = first["samples"]["samebits_choice"], first["samples"]["samebits_answer"]
    assert len(choice) == len(answer) == len(DOCS)
    # Per choice a (loglikelihood, is_greedy) pair; a generation is text.
    assert all(len(resps) == len(DOCS[i]["choices"]) for i, resps, _ in choice)
    assert all(isinstance(ll, float) and ll < 0 for _, resps, _ in choice for (ll, _greedy), in resps)
    assert all(isinstance(text, str) for _, resps, _ in answer for text, in resps)
    assert set(first["metrics"]["samebits_choice"]) >= {"acc,none"}
