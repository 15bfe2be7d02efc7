"""The output processor: the one place that turns a step's draws into text and decides which sequences finish.

Torch-free. For each sampled sequence it appends the token, records its logprobs, detokenizes incrementally and
applies every stop rule (eos unless ignore_eos, stop token ids, stop strings, max_tokens, max_model_len); the
scheduler then applies the returned `Finish` decisions once (`Scheduler.apply`). It owns each sample's output
(logprobs, text) and each request's identity (prompt, seed), and assembles the cumulative RequestOutputs.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from samebits.engine.outputs import (
    CompletionOutput,
    ListView,
    PromptLogprobs,
    PromptStepResult,
    RequestOutput,
    Resume,
    StepProgress,
    StepResult,
)
from samebits.engine.sampling_params import RequestOutputKind
from samebits.engine.sequence import Finish, Sequence, ends_by_length

_FINAL_ONLY = RequestOutputKind.FINAL_ONLY


@dataclass
class _SampleOutput:
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    # The token logprobs added left to right as they arrive: Python's sum() compensates since 3.12, so it would give
    # other bits on another Python.
    cumulative_logprob: float = 0.0
    # Incremental detokenization (vLLM-style offsets): text holds the decode of output ids [0, read).
    prefix: int = 0
    read: int = 0
    text: str = ""


@dataclass
class _Request:
    prompt: str | None
    prompt_token_ids: list[int]
    seed: int
    seqs: list[Sequence]
    # Prompt-logprob rows read back so far, in prompt order (SamplingParams.prompt_logprobs).
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_ranks: list[int] = field(default_factory=list)
    prompt_top: list[dict[int, float]] = field(default_factory=list)

    def take_prompt_rows(self, rows: PromptStepResult) -> None:
        if rows.first != len(self.prompt_logprobs):  # the scheduler hands out each row once, in order
            raise ValueError(f"prompt logprob rows from {rows.first} arrived after {len(self.prompt_logprobs)}")
        self.prompt_logprobs += rows.logprobs
        self.prompt_ranks += rows.ranks
        self.prompt_top += rows.top_logprobs

    def prompt_view(self) -> PromptLogprobs | None:
        """vLLM's prompt_logprobs once every row is in; None when not asked for (or, never seen, not yet in)."""
        if self.seqs[0].params.prompt_logprobs is None or len(self.prompt_logprobs) < len(self.prompt_token_ids) - 1:
            return None
        return PromptLogprobs(self.prompt_token_ids, self.prompt_logprobs, self.prompt_ranks, self.prompt_top)


def _first_scheduled(req: _Request) -> float | None:
    return min((s.first_scheduled for s in req.seqs if s.first_scheduled is not None), default=None)


def token_rule(seq: Sequence, eos_token_ids: frozenset[int], max_model_len: int) -> Finish | None:
    """The stop rules that read the last resolved token alone: eos, a stop token id, then max_tokens or max_model_len."""
    token, params = seq.last_token_id, seq.params
    if token in eos_token_ids and not params.ignore_eos:
        return Finish(seq, "stop")
    if token in params.stop_token_set:
        return Finish(seq, "stop", token)
    if ends_by_length(seq, seq.num_resolved, max_model_len):
        return Finish(seq, "length")
    return None


def find_stop_string(text: str, grown: int, stops: Iterable[str]) -> tuple[str, int] | None:
    """(stop, where) of the first stop string that ends in the last `grown` characters of text."""
    for stop in stops:
        at = text.find(stop, max(0, len(text) - grown - len(stop)))
        if at >= 0:
            return stop, at
    return None


class OutputProcessor:
    def __init__(self, tokenizer, eos_token_ids: Iterable[int], max_model_len: int,
                 fingerprint: Callable[[], str | None] = lambda: None):
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.fingerprint = fingerprint
        self.requests: dict[str, _Request] = {}
        self.samples: dict[int, _SampleOutput] = {}  # by seq_id
        self.generation_tokens = 0
        self._touched: dict[str, int] = {}  # request id -> tokens taken since the last outputs()
        self.progress: list[StepProgress] = []  # the last outputs()'s, of every request it covered

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], seed: int,
                    seqs: list[Sequence], resume: Resume | None = None) -> list[Finish]:
        """Open the request's outputs; with `resume`, each sample starts where it was sent (its tokens appended to
        its sequence, to be teacher-forced) and a sample that had finished is returned as a Finish to apply."""
        self.requests[request_id] = _Request(prompt, prompt_token_ids, seed, seqs)
        self.samples.update((s.seq_id, _SampleOutput()) for s in seqs)
        if resume is None:
            return []
        finishes = (self._resume(s, resume.samples[s.sample_index]) for s in seqs)
        return [f for f in finishes if f is not None]

    def _resume(self, seq: Sequence, sent: CompletionOutput) -> Finish | None:
        sample, n = self.samples[seq.seq_id], len(sent.token_ids)
        # A request that asked for no logprobs shows none: the placeholders keep each list as long as the tokens and
        # are never read. The cumulative logprob is the sender's own sum, so the next token adds to the same bits.
        sample.logprobs = list(sent.token_logprobs) if sent.token_logprobs is not None else [math.nan] * n
        sample.top_logprobs = list(sent.top_logprobs) if sent.top_logprobs is not None else [{}] * n
        sample.cumulative_logprob = sent.cumulative_logprob
        if sent.finish_reason is not None:
            seq.token_ids += sent.token_ids
            sample.text = sent.text
            return Finish(seq, sent.finish_reason, sent.stop_reason)
        for token in sent.token_ids:  # the detokenizer's window as it stood after each token was taken
            seq.token_ids.append(token)
            self._detokenize(seq, sample, flush=False)
        if sample.text != sent.text:
            raise ValueError(f"resume: sample {seq.sample_index}'s tokens decode to {sample.text[-40:]!r}, the sent "
                             f"text ends {sent.text[-40:]!r}")
        # The sample's grammar takes the sent tokens as it took them when they were drawn; an unfinished sample's
        # grammar cannot have ended (that token would have finished it).
        if seq.grammar is not None and seq.grammar.advance(seq) is not None:
            raise ValueError(f"resume: sample {seq.sample_index}'s sent tokens end its grammar, yet it did not finish")
        return None

    def forget(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        for s in req.seqs if req else ():
            self.samples.pop(s.seq_id, None)
        self._touched.pop(request_id, None)

    # ---- one step ------------------------------------------------------------------------------------------
    def process(self, output, results: Mapping[int, StepResult],
                prompt_rows: Mapping[int, PromptStepResult] | None = None) -> list[Finish]:
        """Take the step's draws (`results[seq_id]` for each chunk with sample=True) and prompt-logprob rows
        (`prompt_rows[seq_id]` for each chunk with prompt_rows); return who finishes now."""
        for item in output.scheduled:
            if item.prompt_rows and not item.seq.is_finished:  # before any draw: a sample's output then holds them
                self.requests[item.seq.request_id].take_prompt_rows(prompt_rows[item.seq.seq_id])
        finished = []
        for item in output.scheduled:
            seq = item.seq
            if not item.sample or seq.is_finished:  # mid-prefill, or aborted mid-step: nothing to keep
                continue
            result = results.get(seq.seq_id)
            if result is None:
                raise ValueError(f"no sampled token for {seq!r}, whose chunk ended with sample=True")
            finish = self._take(seq, result)
            if finish is not None:
                finished.append(finish)
        return finished

    def _take(self, seq: Sequence, result: StepResult) -> Finish | None:
        seq.resolve_token(result.token_id)
        sample = self.samples[seq.seq_id]
        sample.logprobs.append(result.logprob)
        sample.cumulative_logprob += result.logprob
        sample.top_logprobs.append(result.top_logprobs)
        self.generation_tokens += 1
        self._touched[seq.request_id] = self._touched.get(seq.request_id, 0) + 1
        finish = token_rule(seq, self.eos_token_ids, self.max_model_len)
        # Like vLLM, the eos that ends a sample is not text unless the client asks for its stop in the output.
        hide_eos = finish is not None and finish.reason == "stop" and finish.stop_reason is None \
            and not seq.params.include_stop_str_in_output
        if seq.grammar is not None:  # a complete grammar ends the sample even at max_tokens (structured/grammar.py)
            end = seq.grammar.advance(seq)
            if end is not None and (finish is None or finish.reason == "length"):
                finish = Finish(seq, end)
        grown = self._detokenize(seq, sample, flush=finish is not None, hide_last=hide_eos)
        stops = seq.params.stop_strings
        # vLLM: no stop string ends a sample before min_tokens (the sampler masks eos and stop ids until then).
        hit = find_stop_string(sample.text, grown, stops) if stops and seq.num_generated > seq.params.min_tokens \
            else None
        if hit is None:
            return finish
        stop, at = hit
        sample.text = sample.text[:at + (len(stop) if seq.params.include_stop_str_in_output else 0)]
        # The token that hit max_tokens may also complete a stop string; like vLLM, report the stop.
        return finish if finish is not None and finish.reason == "stop" else Finish(seq, "stop", stop)

    def _detokenize(self, seq: Sequence, sample: _SampleOutput, flush: bool, hide_last: bool = False) -> int:
        """Decode only a short window, so a step costs O(1) in output length; returns how many characters the
        window grew by (where a new stop string can end). The windows are sliced from seq.token_ids at the output's
        offset, never from a copy of the whole output (`output_token_ids`), which would cost O(output) a step."""
        ids, skip, decode = seq.token_ids, seq.params.skip_special_tokens, self.tokenizer.decode
        first, end = seq.num_prompt_tokens, seq.num_resolved
        start = first + sample.prefix
        before = decode(ids[start:first + sample.read], skip_special_tokens=skip)
        after = decode(ids[start:end], skip_special_tokens=skip)
        if len(after) > len(before) and not after.endswith("\ufffd"):  # wait for the rest of a split character
            sample.text += after[len(before):]
            sample.prefix, sample.read = sample.read, end - first
        if flush:  # nothing more will come: flush what a split character held back
            sample.text = decode(ids[first:end - hide_last], skip_special_tokens=skip)
        return len(after) - len(before)

    # ---- outputs -------------------------------------------------------------------------------------------
    def outputs(self) -> list[RequestOutput]:
        """The cumulative output of every request the last steps touched, except unfinished FINAL_ONLY ones (their
        output is built once, when it is whole); finished requests are then forgotten. `progress` then holds how
        far each touched request went, due or not, in the same order."""
        touched, self._touched = self._touched, {}
        self.progress, outputs = [], []
        for request_id, n in touched.items():
            req = self.requests[request_id]
            first = _first_scheduled(req)
            self.progress.append(StepProgress(request_id, n, first))
            if self._due(req):
                outputs.append(self._output(request_id, req, first))
        return outputs

    @staticmethod
    def _due(req: _Request) -> bool:
        return req.seqs[0].params.output_kind is not _FINAL_ONLY or all(s.is_finished for s in req.seqs)

    def _output(self, request_id: str, req: _Request, first_scheduled: float | None) -> RequestOutput:
        finished = all(s.is_finished for s in req.seqs)
        out = RequestOutput(request_id, req.prompt, req.prompt_token_ids,
                            [self._completion(s, finished) for s in req.seqs],
                            req.seqs[0].num_cached_tokens, req.seed, self.fingerprint(), finished,
                            prompt_logprobs=req.prompt_view(), first_scheduled_time=first_scheduled)
        if finished:
            self.forget(request_id)
        return out

    def _completion(self, seq: Sequence, final: bool) -> CompletionOutput:
        """Lists in a request's final output; views of the sample's own lists before it (they change only past
        what the views read: Sequence.resolve_token writes, and drops, only beyond num_resolved), so a running
        request's output costs O(1) a step, not a copy of everything so far."""
        sample = self.samples[seq.seq_id]
        want = seq.params.logprobs is not None
        n = seq.num_generated
        if final:
            ids, lps, tops = seq.output_token_ids, list(sample.logprobs), list(sample.top_logprobs)
        else:
            first = seq.num_prompt_tokens
            ids = ListView(seq.token_ids, first, first + n)
            lps, tops = ListView(sample.logprobs, 0, n), ListView(sample.top_logprobs, 0, n)
        # Positional (the field order of CompletionOutput): keywords cost twice the call, per sample per step.
        return CompletionOutput(seq.sample_index, sample.text, ids, lps if want else None, tops if want else None,
                                sample.cumulative_logprob, seq.finish_reason, seq.stop_reason)
