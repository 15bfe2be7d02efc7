"""TPRunner: ModelRunner's interface (execute, forward, score_rows, num_blocks, ...) over N ranks.

Rank 0 is this process: the engine's scheduler plans each step here, the runner flattens it once into `StepInputs`,
sends them down every worker's pipe, and computes its own shard alongside; the collectives inside the forward keep
the ranks in step, and the full logits come back to every rank, so rank 0 samples with the one-GPU sampler.

Failure: a worker that dies (its socket closes: the collective raises at once), hangs (the collective's timeout) or
raises (its traceback comes up its pipe) ends the runner: every worker is stopped and the step raises `TPError`
naming the ranks; so does any exception, Ctrl-C included, that interrupts rank 0 mid-step, because the ranks are then
out of step. The workers also end by themselves when this process goes (their pipes close).
"""
from __future__ import annotations

import itertools
import weakref

import torch
import torch.multiprocessing as mp

from samebits.distributed import shard as sh
from samebits.distributed import worker
from samebits.distributed.group import Group, open_store
from samebits.distributed.rank import Rank, RankSpec, StepInputs
from samebits.engine.model_runner import SampledStep, choose_num_blocks, flatten, sampling_batch
from samebits.engine.prompt_logprobs import PromptRowsPlan, score_prompt_rows
from samebits.engine.sampler import Sampler, teacher_forced

TIMEOUT_S = 300.0  # a collective may take this long at most
START_S = 600.0  # a worker's start (imports, its shard, the proofs) and joining the group
_JOIN_S = 10.0


class TPError(RuntimeError):
    """A rank failed; the runner has stopped every rank."""


class TPRunner:
    def __init__(self, engine_config, loaded):
        self.config = engine_config
        self.model_config = loaded.config
        full = loaded.model
        self.device, self.dtype = full.device, full.dtype
        self.block_size = engine_config.block_size
        self.world = engine_config.tensor_parallel_size
        shards = [sh.Shard(r, self.world, engine_config.tp_invariant) for r in range(self.world)]
        sh.check_divisible(self.model_config, shards[0])
        local = sh.local_config(self.model_config, shards[0])
        self.num_blocks = choose_num_blocks(engine_config, local, self.dtype, self.device)
        self.scratch_block = self.num_blocks
        self.spec = RankSpec(self.model_config, full.ops.mode, self.dtype, self.world, engine_config.tp_invariant,
                             "native" if engine_config.all_reduce == "native" else "ordered", self.block_size, self.num_blocks, START_S, TIMEOUT_S,
                             max(1, torch.get_num_threads() // self.world))
        self.procs, self.conns, self.error = [], [], None
        self._stop = weakref.finalize(self, _stop_workers, self.procs, self.conns)
        store = open_store(self.world, START_S)
        try:
            states = self._spawn(store, full, shards)  # kept until the workers hold their copies (CUDA IPC)
            group = Group.open(store, 0, self.world, self.device, START_S, TIMEOUT_S)
            self.rank0 = Rank(self.spec, 0, self.device, group, sh.shard_state(full, shards[0]))
            self._wait_ready()
            del states
        except BaseException:
            self.close()
            raise
        self.store = store  # the rendezvous lives as long as the group
        self.model = self.rank0.model
        self.kv_caches = self.rank0.kv_caches
        self.sampler = Sampler(full.ops)
        self.eos_token_ids = tuple(sorted(loaded.tokenizer.eos_token_ids))  # what min_tokens masks, as the stop rule
        self.graphs = None

    # ---- ranks ------------------------------------------------------------------------------------------------
    def _spawn(self, store, full, shards) -> list[dict]:
        ctx, states = mp.get_context("spawn"), []
        for s in shards[1:]:
            ours, theirs = ctx.Pipe()
            states.append(sh.shard_state(full, s))
            p = ctx.Process(target=worker.main, daemon=True, name=f"samebits-tp-rank{s.rank}",
                            args=(s.rank, self.spec, str(self.device), store.port, states[-1], theirs))
            p.start()
            theirs.close()
            self.procs.append(p)
            self.conns.append(ours)
        return states

    def _wait_ready(self) -> None:
        for rank, conn in enumerate(self.conns, start=1):
            if not conn.poll(START_S):
                raise TPError(f"rank {rank} did not start within {START_S:.0f} s")
            kind, detail = conn.recv()
            if kind != "ready":
                raise TPError(f"rank {rank} failed to start:\n{detail}")

    def _broadcast(self, message) -> None:
        for conn in self.conns:
            conn.send(message)

    def _run(self, step: StepInputs):
        """The step on every rank; rank 0's (hidden, logits). Any failure stops every rank."""
        if self.error is not None:
            raise TPError(f"tensor parallelism stopped earlier: {self.error}")
        dead = [r for r, p in enumerate(self.procs, start=1) if not p.is_alive()]
        if dead:
            self._fail(f"rank(s) {dead} died")
        try:
            self._broadcast(("step", step))
            return self.rank0.run(step)
        except BaseException as e:  # noqa: BLE001 - every failure, Ctrl-C included, stops the ranks; _fail re-raises
            self._fail(f"a step failed ({type(e).__name__}: {e})", e)

    def _fail(self, why: str, cause: BaseException | None = None):
        reports = [detail for conn in self.conns for kind, detail in _pending(conn) if kind == "error"]
        self.error = why + ("".join(f"\n{r}" for r in reports))
        for p in self.procs:  # out of step (or stopped): no goodbye to wait for
            p.kill()
        self.close()
        if isinstance(cause, KeyboardInterrupt):
            raise cause
        raise TPError(self.error) from cause

    def close(self) -> None:
        """Stop every worker and rank 0's group (a no-op once stopped). The runner cannot step afterwards."""
        self._stop()
        rank0 = getattr(self, "rank0", None)
        if rank0 is not None:
            rank0.model.group.close()
        if self.error is None:
            self.error = "closed"

    # ---- the ModelRunner interface ----------------------------------------------------------------------------
    def enable_cuda_graphs(self, max_model_len: int) -> None:
        """No CUDA graphs under tensor parallelism yet: every step runs eagerly (same bits, slower decode)."""

    def set_ops(self, ops) -> None:
        self._broadcast(("set_ops", ops.mode))
        self.rank0.set_ops(ops.mode)
        self.sampler = Sampler(ops)

    def _inputs(self, scheduled, padding, rows) -> StepInputs:
        ids, pos, q_lens, ctx_lens, tables = flatten(scheduled, padding, self.scratch_block, self.block_size)
        # Copies: the tables go to the workers and must not follow the sequences' later growth.
        return StepInputs(ids, list(pos), q_lens, ctx_lens, [list(t) for t in tables], list(rows))

    def forward(self, scheduled, padding: tuple[int, ...] = ()) -> torch.Tensor:
        return self._run(self._inputs(scheduled, padding, []))[0]

    def execute(self, output, previous: SampledStep | None = None) -> SampledStep:
        """ModelRunner.execute without async scheduling: every input token is on the host (the config refuses
        async_scheduling=True with tensor_parallel_size > 1)."""
        scheduled = output.scheduled
        if previous is not None:
            raise RuntimeError("the tensor-parallel runner does not take a step launched ahead (async scheduling)")
        if not scheduled:
            return SampledStep([], None)
        ends = list(itertools.accumulate(s.num_new_tokens for s in scheduled))
        sampled = [end - 1 for s, end in zip(scheduled, ends) if s.sample]
        plan = PromptRowsPlan.of(scheduled, ends)
        # The prompt rows' logits come with the sampled rows' in the one gather every rank runs.
        _, logits = self._run(self._inputs(scheduled, output.padding, sampled + (plan.rows if plan else [])))
        # Every rank gathers all the step's rows at once here: ROWS_PER_SLICE bounds only the scoring after it.
        prompt = None if plan is None else score_prompt_rows(
            lambda a, b: logits[len(sampled) + a:len(sampled) + b], plan, self.sampler.ops)
        items = [s for s in scheduled if s.sample]
        if not items:
            return SampledStep([], None, prompt)
        return SampledStep([s.seq for s in items],
                           self.sampler(logits[:len(sampled)], sampling_batch(items, self.eos_token_ids)), prompt)

    @torch.inference_mode()
    def score_rows(self, item, skip: int, targets: list[int]) -> list[float]:
        _, logits = self._run(self._inputs([item], (), range(skip, skip + len(targets))))
        return teacher_forced(logits, targets, self.sampler.ops)


def _pending(conn) -> list:
    out = []
    try:
        while conn.poll(0):
            out.append(conn.recv())
    except (EOFError, OSError):
        pass
    return out


def _stop_workers(procs, conns) -> None:
    """Ask each worker to end, then make sure: terminate, and kill what still runs."""
    for conn in conns:
        try:
            conn.send(None)
        except OSError:
            pass
    for p in procs:
        p.join(_JOIN_S)
        if p.is_alive():
            p.terminate()
            p.join(_JOIN_S)
        if p.is_alive():
            p.kill()
            p.join()
    for conn in conns:
        conn.close()
