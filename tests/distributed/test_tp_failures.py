"""Nothing hangs and nothing is left behind: a killed worker, a stuck worker (the collective's timeout), Ctrl-C and a
killed rank 0 each end every process of the engine, and the engine says which rank failed."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from samebits.engine import tp_runner
from samebits.engine.sampling_params import SamplingParams
from samebits.engine.tp_runner import TPError
from tests.distributed.helpers import ENGINE, checkpoint, make
from tests.subprocess_server import free_port, wait_healthy

pytestmark = pytest.mark.timeout(300)
GREEDY = SamplingParams(max_tokens=3, temperature=0.0)
GONE_S = 30.0  # a process told to end (or orphaned) must be gone by then


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return checkpoint(tmp_path_factory.mktemp("tp"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill 0; it has ended, only its parent has not reaped it.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def wait_gone(pids, limit: float = GONE_S) -> list[int]:
    end = time.monotonic() + limit
    while time.monotonic() < end and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_killed_worker_ends_the_step_with_an_error_and_every_process(ckpt):
    llm = make(ckpt, tensor_parallel_size=2)
    runner = llm.engine.runner
    assert llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    (worker,) = runner.procs
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(GONE_S)
    start = time.monotonic()
    with pytest.raises(TPError, match="rank"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert time.monotonic() - start < 10
    with pytest.raises(TPError, match="stopped earlier"):
        runner.forward([])
    assert not any(p.is_alive() for p in runner.procs)


def test_stuck_worker_times_out_instead_of_hanging(ckpt, monkeypatch):
    monkeypatch.setattr(tp_runner, "TIMEOUT_S", 3.0)
    llm = make(ckpt, tensor_parallel_size=2)
    (worker,) = llm.engine.runner.procs
    os.kill(worker.pid, signal.SIGSTOP)  # alive, never answering
    start = time.monotonic()
    with pytest.raises(TPError, match="step failed"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert time.monotonic() - start < 3.0 + 15
    assert not wait_gone([worker.pid])


def children_of(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def test_serve_over_two_ranks_then_ctrl_c_ends_every_process(ckpt):
    """`samebits serve --tensor-parallel-size 2` answers with the TP headers; Ctrl-C (SIGINT to the whole
    foreground group, as a terminal sends it) ends the server and its worker."""
    port = free_port()
    cmd = [sys.executable, "-m", "samebits", "serve", ckpt, "--port", str(port), "--device", "cpu",
           "--tensor-parallel-size", "2", "--all-reduce", "invariant", "--kv-cache-tokens", "2048", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        r = httpx.post(f"{url}/v1/completions", timeout=60,
                       json={"model": ckpt, "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 3
        h = r.headers
        assert (h["x-samebits-tensor-parallel-size"], h["x-samebits-all-reduce"], h["x-samebits-tp-invariant"]) == (
            "2", "ordered", "True")
        workers = children_of(proc.pid)
        assert workers, "no worker process"
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(GONE_S)
        assert not wait_gone(workers), "a worker outlived the server"
    finally:
        if proc.poll() is None:
            proc.kill()

# A TP=2 engine that prints its worker's pid, then generates until stopped. A `-c` script: the workers it spawns
# re-import no __main__ module.
_TP_CHILD = """
import json, sys
from samebits.engine.llm import LLM
from samebits.engine.sampling_params import SamplingParams
llm = LLM(model=sys.argv[1], tensor_parallel_size=2, **json.loads(sys.argv[2]))
print(" ".join(str(p.pid) for p in llm.engine.runner.procs), flush=True)
while True:
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
"""


def test_killed_rank_0_leaves_no_worker(ckpt):
    child = subprocess.Popen([sys.executable, "-c", _TP_CHILD, ckpt, json.dumps(ENGINE)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        workers = [int(p) for p in child.stdout.readline().split()]
        time.sleep(0.5)  # inside the generate loop
        child.kill()  # rank 0 dies without a word
        child.wait(GONE_S)
        assert workers and not wait_gone(workers), "a worker outlived its rank 0"
    finally:
        if child.poll() is None:
            child.kill()


