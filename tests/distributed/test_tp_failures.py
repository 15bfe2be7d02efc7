"""Nothing hangs and nothing is left behind: a killed worker, a stuck worker (the collective's timeout), Ctrl-C and a
killed rank 0 each end every process of the engine, and the engine says which rank failed."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from samebits.distributed import runner as tp_runner
from samebits.distributed.runner import TPError
from samebits.engine.sampling_params import SamplingParams
from tests.distributed.helpers import checkpoint, make

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
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


def test_ctrl_c_and_a_killed_rank_0_end_every_process(ckpt):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = [subprocess.Popen([sys.executable, "-m", "tests.distributed.tp_child", ckpt], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                 start_new_session=True) for _ in range(2)]
    try:
        workers = [int(c.stdout.readline()) for c in children]
        time.sleep(0.5)  # inside the generate loop
        os.killpg(children[0].pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        children[1].kill()  # rank 0 dies without a word
        for c in children:
            c.wait(GONE_S)
        assert children[0].returncode != 0 and children[1].returncode == -signal.SIGKILL
        assert not wait_gone(workers), "a worker outlived its rank 0"
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
