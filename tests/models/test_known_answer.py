"""Known answer: the default model's deterministic greedy token ids and float32 logprob bits for three fixed prompts,
hashed, on the CPU in the template's pinned MKL mode (MKL_CBWR=AVX2,STRICT set before torch loads), in a fresh process.

The same hash on two machines means they computed those requests bit for bit alike. Recorded on an AMD EPYC (Zen 4,
AVX-512; MKL runs AUTO,STRICT there: it refuses the Intel branches) with torch 2.13.0+cpu, MKL 2024.2, 2 threads;
docs/BENCHMARKS.md says where else it was checked and what came out.
"""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXPECTED = "c37fdbf3d02c0152"

_SCRIPT = r"""
import hashlib, json, torch
from samebits import LLM, SamplingParams
llm = LLM(model="smollm2-135m", mode="deterministic", device="cpu")
prompts = ["What is the capital of France?", "Write a haiku about rain.", "def fibonacci(n):"]
params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=0, ignore_eos=True)
outs = llm.chat([[{"role": "user", "content": p}] for p in prompts[:2]], params, use_tqdm=False)
outs += llm.generate(prompts[2:], params, use_tqdm=False)
rows = [[o.outputs[0].token_ids, torch.tensor(o.outputs[0].logprobs, dtype=torch.float32).view(torch.int32).tolist()]
        for o in outs]
from samebits.runtime import mkl
print(json.dumps({"hash": hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16], "rows": rows,
                  "mkl_cnr": mkl.cnr_mode(), "threads": torch.get_num_threads()}))
"""


def known_answer(extra_env: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MKL_", "ATEN_CPU"))}
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env.update({"MKL_CBWR": "AVX2,STRICT", "PYTHONPATH": path}, **(extra_env or {}))
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_default_model_known_answer():
    got = known_answer()
    assert got["mkl_cnr"] in ("AVX2,STRICT", "AUTO,STRICT"), got["mkl_cnr"]
    assert got["hash"] == EXPECTED, f"known answer {got['hash']} (MKL {got['mkl_cnr']}, {got['threads']} threads)"
