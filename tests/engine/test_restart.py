"""Same request, same bits after a restart: two fresh processes give identical tokens and logprob bits."""
import json
import subprocess
import sys

from samebits.models.synthetic import write_tiny_checkpoint

SCRIPT = """
import json, sys, torch
from samebits import LLM, SamplingParams
llm = LLM(model=sys.argv[1], device="cpu", kv_cache_tokens=4096, max_model_len=512)
outs = llm.generate([[5, 6, 7] * 9, [11] * 40], SamplingParams(temperature=0.9, seed=int(sys.argv[2]), max_tokens=12,
                                                                logprobs=0, ignore_eos=True), use_tqdm=False)
print(json.dumps([[o.outputs[0].token_ids, torch.tensor(o.outputs[0].token_logprobs).view(torch.int32).tolist()]
                  for o in outs]))
"""


def run(ckpt, seed: int):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(ckpt), str(seed)], capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_processes_give_the_same_bits(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path, "llama3", seed=4)
    first = run(ckpt, 1)
    assert run(ckpt, 1) == first
    assert run(ckpt, 2) != first  # negative control: the comparison sees a different request
