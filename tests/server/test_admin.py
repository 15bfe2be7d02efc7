"""The admin route: weight sync into a live server behind the API key; the responses name the new weights, and their
logprobs are the synced trainer's bits; bad input is refused and the old weights keep serving."""
from __future__ import annotations

import pytest
import torch

from samebits.engine.llm import LLM
from samebits.engine.sampling_params import SamplingParams
from samebits.models.synthetic import write_tiny_checkpoint
from samebits.rl.policy import Policy
from samebits.runtime import deterministic_runtime
from tests.server.conftest import MODEL_NAME, make_engine, start_server

KEY = "admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = [5, 17, 42, 99, 7, 3]


@pytest.fixture(scope="module")
def locked(tiny_model_dir):
    live = start_server(make_engine(tiny_model_dir), api_keys=(KEY,))
    yield live
    live.stop()


def complete(http) -> dict:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 5, "temperature": 0.8, "seed": 4, "logprobs": 0}
    r = http.post("/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.headers["x-samebits-fingerprint"] == r.json()["system_fingerprint"], "the header names the same weights"
    return r.json()


def bits(values) -> list[int]:
    return torch.as_tensor(values, dtype=torch.float32).detach().view(torch.int32).tolist()


def test_update_weights_then_responses_are_the_new_policy(locked, tmp_path):
    new = write_tiny_checkpoint(tmp_path / "new", "llama3", seed=5)
    with locked.client() as http:
        before = complete(http)["system_fingerprint"]
        r = http.post("/admin/update_weights", json={"path": str(new), "version": "step-42"}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["weights"] == "step-42" and r.json()["fingerprint"] != before
        out = complete(http)
        assert out["system_fingerprint"] == r.json()["fingerprint"]
        assert http.get("/admin/weights", headers=AUTH).json()["weights"] == "step-42"
        assert http.get("/version", headers=AUTH).json()["weights"] == "step-42"
    # The response names text, not ids: the same request offline, on the new checkpoint, gives the ids.
    offline = LLM(model=str(new), device="cpu", max_num_seqs=128, max_model_len=256)
    sample = offline.generate([PROMPT], SamplingParams(temperature=0.8, seed=4, max_tokens=5, logprobs=0),
                              use_tqdm=False)[0].outputs[0]
    assert sample.text == out["choices"][0]["text"]
    with deterministic_runtime():
        trained = Policy.from_pretrained(new, device="cpu").logprobs([PROMPT], [sample.token_ids])[0]
    assert bits(out["choices"][0]["logprobs"]["token_logprobs"]) == bits(trained.detach()) == bits(sample.token_logprobs)


@pytest.mark.parametrize("body, status, match", [
    ({"path": "/nonexistent/ckpt"}, 400, "is neither an HF model folder nor a .safetensors file"),
    ({"path": "x", "extra": 1}, 400, "extra"),
    ("wrong-shape", 400, "update_weights refused, old weights kept"),
    ("malformed", 400, "cannot read safetensors"),
])
def test_bad_update_is_refused_and_old_weights_serve(locked, tmp_path, body, status, match):
    if body == "wrong-shape":
        body = {"path": str(write_tiny_checkpoint(tmp_path / "narrow", "llama3", seed=5, intermediate_size=128))}
    if body == "malformed":  # a header that promises more than the file holds: was a text/plain 500
        (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}")
        body = {"path": str(tmp_path / "bad.safetensors")}
    with locked.client() as http:
        before = complete(http)
        r = http.post("/admin/update_weights", json=body, headers=AUTH)
        assert r.status_code == status and match in r.json()["error"]["message"], r.text
        assert r.headers["content-type"] == "application/json" and r.headers["x-request-id"]
        after = complete(http)
    assert after["system_fingerprint"] == before["system_fingerprint"]
    assert after["choices"][0]["logprobs"] == before["choices"][0]["logprobs"]


def test_admin_needs_the_key(locked, server):
    with locked.client() as http:
        assert http.post("/admin/update_weights", json={"path": "x"}).status_code == 401
    with server.client() as http:  # a server without keys keeps its admin routes shut
        r = http.post("/admin/update_weights", json={"path": "x"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"
        assert "--api-key," in r.json()["error"]["message"] and "SAMEBITS_API_KEY" in r.json()["error"]["message"]
        assert http.get("/admin/weights").status_code == 403


def test_an_admin_route_that_fails_unexpectedly_answers_openai_json(locked, tmp_path, monkeypatch):
    """What the admin code does not foresee (here a reader that raises a bare error) is a JSON 500 with the request
    id, not Starlette's text/plain; the old weights keep serving. Control: the malformed-file case above is a 400."""
    from samebits.server import admin

    def broken(path, dtype):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(admin, "_read_tensors", broken)
    with locked.client() as http:
        before = complete(http)
        r = http.post("/admin/update_weights", json={"path": str(tmp_path)}, headers={**AUTH, "x-request-id": "t-9"})
        assert r.status_code == 500 and r.headers["content-type"] == "application/json" and r.headers["x-request-id"] == "t-9"
        assert r.json()["error"]["code"] == "internal_error" and "disk on fire" not in r.text, "no internals leak"
        assert complete(http)["choices"] == before["choices"]
