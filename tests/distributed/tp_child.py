"""Child process of test_tp_failures.py: a TP=2 engine that prints its worker's pid, then generates until stopped."""
import sys

from samebits.engine.sampling_params import SamplingParams
from tests.distributed.helpers import make

if __name__ == "__main__":
    llm = make(sys.argv[1], tensor_parallel_size=2)
    print(" ".join(str(p.pid) for p in llm.engine.runner.procs), flush=True)
    while True:
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
