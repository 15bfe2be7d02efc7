"""The synchronous engine: requests in, one scheduled model step at a time, cumulative RequestOutputs back."""
from __future__ import annotations

import random
import secrets
from dataclasses import dataclass

from samebits.engine.config import EngineConfig
from samebits.engine.model_runner import ModelRunner
from samebits.engine.outputs import CompletionOutput, EngineStats, RequestOutput
from samebits.engine.sampling_params import SamplingParams
from samebits.engine.scheduler import ScheduledSeq, Scheduler
from samebits.engine.sequence import Sequence

SEED_BITS = 63


@dataclass
class _Request:
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    seqs: list[Sequence]


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded=None):
        from samebits.models import load_model

        self.config = config
        self.loaded = loaded or load_model(config.model, config.mode, config.device, config.dtype)
        self.tokenizer = self.loaded.tokenizer
        self.model_name = self.loaded.name
        self.runner = ModelRunner(config, self.loaded)
        self.max_model_len = self._max_model_len()
        if config.cuda_graphs:
            self.runner.enable_cuda_graphs(self.max_model_len)
        eos = self.tokenizer.eos_token_ids
        self.scheduler = Scheduler.from_config(config, self.runner.num_blocks, self.max_model_len, eos)
        self.requests: dict[str, _Request] = {}
        self._detok: dict[int, tuple[int, int, str]] = {}  # seq_id -> (prefix, read, text)
        self._seeds = random.Random(config.seed) if config.seed is not None else None
        self._fingerprint: dict | None = None
        self.prompt_tokens = 0
        self.generation_tokens = 0

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

            self._fingerprint = fingerprint(self.config.mode)
        return self._fingerprint

    # ---- requests ------------------------------------------------------------------------------------------
    def _draw_seed(self) -> int:
        return self._seeds.getrandbits(SEED_BITS) if self._seeds else secrets.randbits(SEED_BITS)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError naming the field and the limit, as vLLM does, before anything is queued."""
        n, vocab = len(prompt_token_ids), self.loaded.config.vocab_size
        if n == 0:
            raise ValueError("prompt must not be empty")
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {vocab}); got {bad[0]!r}")
        if n + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{n + params.max_tokens} tokens ({n} in the prompt, {params.max_tokens} in the completion). "
                "Please reduce the prompt or max_tokens.")

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt: str | None = None) -> None:
        prompt_token_ids = list(prompt_token_ids)
        self.validate(prompt_token_ids, params)
        seed = params.seed if params.seed is not None else self._draw_seed()
        seqs = self.scheduler.add_request(request_id, prompt_token_ids, params, seed)
        self.requests[request_id] = _Request(prompt, prompt_token_ids, params, seed, seqs)
        self.prompt_tokens += len(prompt_token_ids) * len(seqs)

    def abort_request(self, request_id: str) -> None:
        self.scheduler.abort(request_id)
        self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        for s in req.seqs if req else ():
            self._detok.pop(s.seq_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- stepping ------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        out = self.scheduler.schedule()
        results = self.runner.execute(out)
        self.scheduler.update(out, {sid: r.token_id for sid, r in results.items()})
        touched = self._record(out, results)
        return [self._output(rid) for rid in touched]

    def _record(self, out, results) -> list[str]:
        touched: dict[str, None] = {}
        for item in out.scheduled:
            seq = item.seq
            result = results.get(seq.seq_id)
            if result is None:
                continue
            seq.logprobs.append(result.logprob)
            seq.top_logprobs.append(result.top_logprobs)
            self.generation_tokens += 1
            self._detokenize(seq)
            touched[seq.request_id] = None
        return list(touched)

    def _detokenize(self, seq: Sequence) -> None:
        """Incremental (vLLM-style offsets): decode only a short window, so a step costs O(1) in output length."""
        prefix, read, text = self._detok.get(seq.seq_id, (0, 0, ""))
        ids = seq.output_token_ids
        before = self.tokenizer.decode(ids[prefix:read])
        after = self.tokenizer.decode(ids[prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):  # wait for the rest of a split character
            text += after[len(before):]
            prefix, read = read, len(ids)
        if seq.is_finished:  # nothing more will come: flush what a split character held back
            text = self.tokenizer.decode(ids)
        self._detok[seq.seq_id] = (prefix, read, text)
        self._check_stop_strings(seq, text, len(after) - len(before))

    def _check_stop_strings(self, seq: Sequence, text: str, grown: int) -> None:
        for stop in seq.params.stop_strings:
            at = text.find(stop, max(0, len(text) - grown - len(stop)))
            if at >= 0:
                self._detok[seq.seq_id] = (0, 0, text[:at])
                self.scheduler.finish(seq, "stop", stop)
                return

    def _output(self, request_id: str) -> RequestOutput:
        req = self.requests[request_id]
        finished = all(s.is_finished for s in req.seqs)
        out = RequestOutput(request_id, req.prompt, req.prompt_token_ids, [self._completion(s) for s in req.seqs],
                            req.seqs[0].num_cached_tokens, req.seed, self.fingerprint()["hash"], finished)
        if finished:
            self._forget(request_id)
        return out

    def _completion(self, seq: Sequence) -> CompletionOutput:
        want = seq.params.logprobs is not None
        lps = list(seq.logprobs)
        return CompletionOutput(
            index=seq.sample_index, text=self._detok.get(seq.seq_id, (0, 0, ""))[2], token_ids=seq.output_token_ids,
            logprobs=lps if want else None, top_logprobs=list(seq.top_logprobs) if want else None,
            cumulative_logprob=float(sum(lps)), finish_reason=seq.finish_reason, stop_reason=seq.stop_reason)

    # ---- teacher-forced scoring ---------------------------------------------------------------------------
    def score(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """Logprob of each completion token given everything before it; needs an idle engine (offline API)."""
        if self.has_unfinished_requests():
            raise RuntimeError("score() runs only while no request is in flight")
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts and {len(completions)} completions")
        return [self._score_one(list(p), list(c)) for p, c in zip(prompts, completions)]

    def _score_one(self, prompt: list[int], completion: list[int]) -> list[float]:
        if not completion:
            raise ValueError("completion_token_ids must not be empty")
        self.validate(prompt, SamplingParams(max_tokens=len(completion)))
        tokens = prompt + completion
        # Row p predicts token p + 1, so the last token never needs computing.
        seq = Sequence(f"score-{id(tokens)}", tokens[:-1], SamplingParams(max_tokens=1))
        bm = self.scheduler.bm
        bm.allocate(seq)
        try:
            return self._score_chunks(seq, tokens, len(prompt) - 1)
        finally:
            bm.free(seq)

    def _score_chunks(self, seq: Sequence, tokens: list[int], first: int) -> list[float]:
        # Cached rows past `first` are recomputed: they rewrite the identical KV bits into the shared blocks.
        start, scores = min(seq.num_computed_tokens, first), []
        while start < seq.num_tokens:
            n = min(self.config.max_num_batched_tokens, seq.num_tokens - start)
            skip = max(0, first - start)
            targets = tokens[start + skip + 1:start + n + 1]
            if targets:
                scores += self.runner.score_rows(ScheduledSeq(seq, n, False, start, n), skip, targets)
            else:
                self.runner.forward([ScheduledSeq(seq, n, False, start, n)])
            start += n
            seq.num_computed_tokens = max(seq.num_computed_tokens, start)
            self.scheduler.bm.cache_computed_blocks(seq)
        return scores

    def stats(self) -> EngineStats:
        s = self.scheduler.stats()
        return EngineStats(s["num_running"], s["num_waiting"], s["kv_usage"], s["prefix_queries"], s["prefix_hits"],
                           s["num_preemptions"], self.prompt_tokens, self.generation_tokens)
