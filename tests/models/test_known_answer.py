"""Known answer: the default model's deterministic greedy token ids and float32 logprob bits for three fixed prompts,
hashed, on the CPU's portable path (MKL_CBWR=COMPATIBLE,STRICT exported before torch loads; kernels/configs.py
`cpu_mkl`), in a fresh process. The same hash on two machines means they computed those requests bit for bit alike.

Recorded on an AMD EPYC (Zen 4, AVX-512) with torch 2.13.0+cpu, MKL 2024.2 at 2 threads (equal at 1), and equal bit
for bit on an Intel Xeon Sapphire Rapids with torch 2.11.0 at 2 threads. The thread count is pinned: on that Intel
machine the portable path gave another answer at 16 threads (MKL's COMPATIBLE branch is not thread-independent there;
the route pins the count and the fingerprint hashes it). On the template's default fast path (AVX2,STRICT) the AMD
machine gives c37fdbf3d02c0152 and the Intel one b69238eeee7d3313 at 2 and 16 threads: same tokens, other logprob bits
(MKL's vector math follows the CPU vendor there; the fingerprint's cpu_vector_math_answer tells them apart).
docs/results/HISTORY.md §7 has the cross-machine table.
"""
import json
import os
import subprocess
import sys

import pytest

from samebits.kernels.configs import TILE_CONFIGS

pytestmark = pytest.mark.slow
PORTABLE = TILE_CONFIGS["cpu_mkl"]["config"]["portable_cnr"]
THREADS = "2"  # the count the answer was recorded at (the portable path's bits follow it on large machines)
EXPECTED = "dab6f2bc1e207ac6"

_SCRIPT = r"""
import hashlib, json, torch
from samebits import LLM, SamplingParams
llm = LLM(model="smollm2-135m", mode="deterministic", device="cpu")
prompts = ["What is the capital of France?", "Write a haiku about rain.", "def fibonacci(n):"]
params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=0, ignore_eos=True)
outs = llm.chat([[{"role": "user", "content": p}] for p in prompts[:2]], params, use_tqdm=False)
outs += llm.generate(prompts[2:], params, use_tqdm=False)
rows = [[o.outputs[0].token_ids, torch.tensor(o.outputs[0].token_logprobs, dtype=torch.float32).view(torch.int32).tolist()]
        for o in outs]
from samebits.kernels.cpu import mkl
print(json.dumps({"hash": hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16], "rows": rows,
                  "mkl_cnr": mkl.cnr_mode(), "threads": torch.get_num_threads()}))
"""


def known_answer(extra_env: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MKL_", "ATEN_CPU", "OMP_"))}
    env.update({"MKL_CBWR": PORTABLE, "OMP_NUM_THREADS": THREADS}, **(extra_env or {}))
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_default_model_known_answer():
    got = known_answer()
    assert got["mkl_cnr"] == PORTABLE and got["threads"] == int(THREADS), (got["mkl_cnr"], got["threads"])
    assert got["hash"] == EXPECTED, f"known answer {got['hash']} (MKL {got['mkl_cnr']}, {got['threads']} threads)"
