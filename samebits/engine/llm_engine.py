"""The synchronous engine: requests in, one scheduled model step at a time, cumulative RequestOutputs back.

One step reads one way: the scheduler picks the chunks, the runner computes and samples them, the output processor
detokenizes and decides who finishes, and the scheduler applies those decisions (freeing blocks).

With async scheduling the next step is scheduled and launched before this one's draws are read back, so the host's
work (read-back, detokenizing, stop rules, scheduling, input building) runs while the GPU computes. The next step
reads the pending tokens on the device (ModelRunner.execute); a sequence the read-back finishes has computed one row
for nothing, which is dropped. A row's arithmetic never depends on its neighbours, so the bits are the same.
"""
from __future__ import annotations

import dataclasses

from samebits.distributed import one_rank, parallel_numerics
from samebits.engine.config import EngineConfig
from samebits.engine.model_runner import ModelRunner
from samebits.engine.output_processor import OutputProcessor
from samebits.engine.outputs import EngineInfo, EngineStats, RequestOutput, Resume, StepProgress
from samebits.engine.sampling_params import SamplingParams, check_prompt
from samebits.engine.scheduler import ScheduledSeq, Scheduler
from samebits.engine.seeds import SeedStream
from samebits.engine.tp_runner import TPRunner
from samebits.structured.grammar import Grammars


def runner_for(config: EngineConfig, loaded) -> ModelRunner | TPRunner:
    """The engine's runner: the one-GPU ModelRunner, or the tensor-parallel one over `tensor_parallel_size` ranks."""
    if config.tensor_parallel_size == 1:
        return ModelRunner(config, loaded)
    return TPRunner(config, loaded)


def check_ops_mode(config: EngineConfig, model) -> None:
    """The config owns the mode (it is what the fingerprint names): a model handed in must run that mode's ops."""
    if model.ops.mode != config.mode:
        raise ValueError(f"mode: the engine is configured {config.mode!r} but its model runs {model.ops.mode!r} ops, "
                         f"so the fingerprint would name other numerics than those computed; set the model's ops "
                         f"with get_ops({config.mode!r}, device) or configure mode={model.ops.mode!r}")


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded=None):
        from samebits.models import load_model

        self.loaded = one_rank(config, loaded or load_model(config.model, config.mode, config.device, config.dtype,
                                                            quantization=config.quantization))
        check_ops_mode(config, self.loaded.model)
        self.config = config = config.on_device(self.loaded.model.device.type)
        self.tokenizer = self.loaded.tokenizer
        self.model_name = self.loaded.name
        self.runner = runner_for(config, self.loaded)
        self.max_model_len = self._max_model_len()
        if config.cuda_graphs:
            self.runner.enable_cuda_graphs(self.max_model_len)
        self.speculator = self._speculator()
        self.overlap = config.async_scheduling if config.async_scheduling is not None \
            else self.runner.device.type == "cuda" and config.tensor_parallel_size == 1
        self.scheduler = Scheduler.from_config(config, self.runner.num_blocks, self.max_model_len,
                                               max_inflight=2 if self.overlap else 1)
        self._inflight = None  # (SchedulerOutput, SampledStep) launched and not yet read back
        self.processor = OutputProcessor(self.tokenizer, self.tokenizer.eos_token_ids, self.max_model_len,
                                         lambda: self.fingerprint()["hash"])
        self._seeds = SeedStream(config.seed)
        self.grammars = Grammars(self.tokenizer, self.loaded.config.vocab_size)
        self._fingerprint: dict | None = None
        self.prompt_tokens = 0

    def _speculator(self):
        """The drafter, when it drafts, and its counts when speculative_config is set (engine/spec_decode/)."""
        spec = self.config.speculative_config
        if spec is None:
            return None
        from samebits.engine.spec_decode.drafters import make_drafter
        from samebits.engine.spec_decode.speculator import Speculator

        num_tokens = self.runner.num_blocks * self.config.block_size
        return Speculator(make_drafter(self.config, self.loaded, num_tokens, self.max_model_len),
                          spec.num_speculative_tokens)

    def _max_model_len(self) -> int:
        limit = self.loaded.config.max_position_embeddings
        capacity = self.runner.num_blocks * self.config.block_size
        wanted = self.config.max_model_len or limit
        if wanted > limit:
            raise ValueError(f"max_model_len={wanted} exceeds the model's max_position_embeddings={limit}")
        return min(wanted, capacity)

    def fingerprint(self) -> dict:
        if self._fingerprint is None:
            from samebits.runtime import fingerprint

            self._fingerprint = fingerprint(self.config.mode, parallel_numerics(self.config), self.loaded.numerics())
        return self._fingerprint

    # ---- requests ------------------------------------------------------------------------------------------
    def draw_seed(self) -> int:
        """A request's seed when it sends none: from the engine's seed stream (`EngineConfig.seed`), else fresh."""
        return self._seeds.draw()

    def validate(self, prompt_token_ids: list[int], params: SamplingParams, where: str = "prompt") -> None:
        """Raise ValueError naming the field and the limit, as vLLM does, before anything is queued; `where` names
        the prompt in a context-length refusal ("prompt", or "messages" for chat)."""
        check_prompt(prompt_token_ids, params, self.loaded.config.vocab_size, self.max_model_len, where)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt: str | None = None, resume: Resume | None = None) -> None:
        """`resume`: the request's samples as another engine already sent them (a fleet's failover,
        samebits/fleet/engine.py): each sample starts with its sent tokens, teacher-forced in the prefill as a
        preempted sequence's are recomputed, and decodes on from there with the same draws (seed, sample index,
        position); its outputs are cumulative from the first sent token."""
        prompt_token_ids = list(prompt_token_ids)
        self.validate(prompt_token_ids, params)
        seed = params.seed if params.seed is not None else self.draw_seed()
        so = params.structured_outputs
        matchers = self.grammars.matchers(so, params.n) if so is not None else ()  # compiled before it is queued
        if resume is not None:
            resume.check(params, seed)
        seqs = self.scheduler.add_request(request_id, prompt_token_ids, params, seed)
        for seq, matcher in zip(seqs, matchers):
            seq.grammar = matcher
        for finish in self.processor.add_request(request_id, prompt, prompt_token_ids, seed, seqs, resume):
            self.scheduler.finish(finish)
        self.prompt_tokens += len(prompt_token_ids) * len(seqs)

    def abort_request(self, request_id: str) -> None:
        self.scheduler.abort(request_id)
        self.processor.forget(request_id)
        if not self.scheduler.has_unfinished():
            self.drain()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- stepping ------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        speculate = self.speculator is not None and self.speculator.due(self.scheduler.running)
        if speculate or not self.overlap:  # drafts follow resolved tokens: nothing may be in flight
            self.drain()
            self._finish_step(self._launch(None, speculate))
            return self.processor.outputs()
        previous, self._inflight = self._inflight, None
        if previous is not None and self._penalised_running():
            self._finish_step(previous)  # a penalty counts the row's tokens: its last one must be read back first
            previous = None
        if self.scheduler.has_unfinished():
            self._inflight = self._launch(previous)
        if previous is not None:
            self._finish_step(previous)
        if self._inflight is not None:  # sampled now if a grammar's masks waited for `previous` (DeferredStep)
            out, sampled, speculated = self._inflight
            self._inflight = out, sampled.complete(), speculated
        if self._inflight is not None and not self.scheduler.has_unfinished():
            self.drain()  # the step launched ahead holds only finished sequences: settle it, leave nothing in flight
        return self.processor.outputs()

    def progress(self) -> list[StepProgress]:
        """How far the last step() advanced each request it touched, including those it returned no output for
        (unfinished FINAL_ONLY ones): the server counts tokens and inter-token times by it."""
        return self.processor.progress

    def _penalised_running(self) -> bool:
        return any(s.params.has_penalties for s in self.scheduler.running)

    def _launch(self, previous, speculate: bool = False):
        drafts = self.speculator.propose(self.scheduler.running) if speculate else None
        out = self.scheduler.schedule(drafts)
        return out, self.runner.execute(out, previous[1] if previous is not None else None), speculate

    def _finish_step(self, launched) -> None:
        out, sampled, speculated = launched
        sampled = sampled.complete()
        finished = self.processor.process(out, sampled.to_host(), sampled.prompt_to_host())
        if speculated:
            self.speculator.observe(sampled.verified)
        self.scheduler.apply(out, finished)

    def drain(self) -> None:
        """Read back and apply the step in flight, if any (before scoring, changing ops or weights)."""
        launched, self._inflight = self._inflight, None
        if launched is not None:
            self._finish_step(launched)

    # ---- teacher-forced scoring ---------------------------------------------------------------------------
    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """Logprob of each completion token given everything before it; needs an idle engine (offline API)."""
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts and {len(completions)} completions")
        return [self._score_one(list(p), list(c)) for p, c in zip(prompts, completions)]

    def _score_one(self, prompt: list[int], completion: list[int]) -> list[float]:
        if not completion:
            raise ValueError("completion_token_ids must not be empty")
        self.validate(prompt, SamplingParams(max_tokens=len(completion)))
        tokens = prompt + completion
        # Row p predicts token p + 1, so the last token never needs computing.
        with self.scheduler.scoring_blocks(tokens[:-1]) as seq:
            return self._score_chunks(seq, tokens, len(prompt) - 1)

    def _score_chunks(self, seq, tokens: list[int], first: int) -> list[float]:
        # Cached rows past `first` are recomputed: they rewrite the identical KV bits into the shared blocks.
        start, scores = min(seq.num_computed_tokens, first), []
        while start < seq.num_tokens:
            n = min(self.config.max_num_batched_tokens, seq.num_tokens - start)
            skip = max(0, first - start)
            targets = tokens[start + skip + 1:start + n + 1]
            if targets:
                scores += self.runner.score_rows(ScheduledSeq(seq, n, False, start), skip, targets)
            else:
                self.runner.forward([ScheduledSeq(seq, n, False, start)])
            start += n
            self.scheduler.mark_computed(seq, start)
        return scores

    def info(self) -> EngineInfo:
        runner = self.runner
        return EngineInfo(self.model_name, str(self.loaded.path), self.config.mode, self.loaded.config.vocab_size,
                          self.max_model_len, runner.dtype, str(runner.device), runner.num_blocks, runner.block_size)

    def stats(self) -> EngineStats:
        s, spec = self.scheduler.stats(), self.speculator and self.speculator.stats
        stats = EngineStats(s["num_running"], s["num_waiting"], s["kv_usage"], s["prefix_queries"], s["prefix_hits"],
                            s["num_preemptions"], self.prompt_tokens, self.processor.generation_tokens)
        if spec is None:
            return stats
        return dataclasses.replace(stats, spec_num_drafts=spec.num_drafts, spec_num_draft_tokens=spec.num_draft_tokens,
                                   spec_num_accepted_tokens=spec.num_accepted_tokens,
                                   spec_accepted_per_pos=tuple(spec.accepted_per_pos))
