"""Cumulative RequestOutputs sent as deltas: what crosses the engine process's pipe each step (engine_process.py).

A step's cumulative outputs grow with every token (256 requests of 300 tokens with logprobs take longer to pickle
than a decode step takes), so the engine's side sends only what is new since it last sent that request: the tokens,
logprobs and top logprobs appended, the text as (characters kept, new tail) (a stop string can cut text back), and
the few scalars whole. The server's side appends them to its copy and hands out fresh RequestOutputs equal to the
engine's own, every value (float bits, text, finish and stop reasons, cached tokens, times) carried, none recomputed.
Their lists are `ListView`s of the copy's, which only grow: a step costs the server O(new tokens), not a copy of
every list so far (that was most of the receiver's time: benchmarks/server_cpu.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from samebits.engine.outputs import CompletionOutput, ListView, RequestOutput


class DeltaEncoder:
    """The engine's side: per request, per sample, how many tokens and which text were sent."""

    def __init__(self) -> None:
        self._sent: dict[str, list[tuple[int, str]]] = {}

    def encode(self, outputs: list[RequestOutput]) -> list[tuple]:
        return [self._encode(out) for out in outputs]

    def forget(self, request_id: str) -> None:
        """The request was aborted: nothing more of it is sent."""
        self._sent.pop(request_id, None)

    def _encode(self, out: RequestOutput) -> tuple:
        sent = self._sent.get(out.request_id)
        head = None
        if sent is None:  # its first output: what never changes, once (prompt logprobs are complete by then)
            head = (out.prompt, out.prompt_token_ids, out.seed, out.prompt_logprobs)
            sent = [(0, "")] * len(out.outputs)
        samples = [_sample_delta(c, n, text) for c, (n, text) in zip(out.outputs, sent)]
        if out.finished:
            self._sent.pop(out.request_id, None)
        else:
            self._sent[out.request_id] = [(len(c.token_ids), c.text) for c in out.outputs]
        return (out.request_id, head, out.fingerprint, out.num_cached_tokens, out.finished, out.first_scheduled_time,
                samples)


def _sample_delta(c: CompletionOutput, n: int, text: str) -> tuple:
    keep = len(text) if c.text.startswith(text) else 0
    return (c.index, c.token_ids[n:], None if c.token_logprobs is None else c.token_logprobs[n:],
            None if c.top_logprobs is None else c.top_logprobs[n:], keep, c.text[keep:], c.cumulative_logprob,
            c.finish_reason, c.stop_reason, None if c.token_ranks is None else c.token_ranks[n:])


@dataclass
class _Sample:
    token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    token_ranks: list[int] | None = None
    text: str = ""


@dataclass
class _Request:
    prompt: str | None
    prompt_token_ids: list[int]
    seed: int | None
    prompt_logprobs: list | None
    samples: list[_Sample]


class DeltaDecoder:
    """The server's side: each open request's outputs so far, rebuilt into fresh cumulative RequestOutputs."""

    def __init__(self) -> None:
        self._requests: dict[str, _Request] = {}

    def decode(self, deltas: list[tuple]) -> list[RequestOutput]:
        return [self._decode(d) for d in deltas]

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def _decode(self, delta: tuple) -> RequestOutput:
        request_id, head, fingerprint, cached, finished, first_scheduled, samples = delta
        req = self._requests.get(request_id)
        if req is None:
            req = self._requests[request_id] = _Request(*head, [_Sample() for _ in samples])
        outputs = [_apply(s, d) for s, d in zip(req.samples, samples)]
        if finished:
            self._requests.pop(request_id)
        return RequestOutput(request_id, req.prompt, req.prompt_token_ids, outputs, cached, req.seed, fingerprint,
                             finished, req.prompt_logprobs, first_scheduled)


def _apply(sample: _Sample, delta: tuple) -> CompletionOutput:
    index, ids, logprobs, top, keep, tail, cumulative, finish_reason, stop_reason, ranks = delta
    sample.token_ids += ids
    if logprobs is not None:
        sample.token_logprobs = sample.token_logprobs or []
        sample.token_logprobs += logprobs
    if top is not None:
        sample.top_logprobs = sample.top_logprobs or []
        sample.top_logprobs += top
    if ranks is not None:
        sample.token_ranks = sample.token_ranks or []
        sample.token_ranks += ranks
    sample.text = sample.text[:keep] + tail
    # Views that stay as they are now, as the engine's fresh lists do: a reader may keep an output while later ones
    # arrive.
    n = len(sample.token_ids)
    return CompletionOutput(index, sample.text, ListView(sample.token_ids, 0, n),
                            None if sample.token_logprobs is None else ListView(sample.token_logprobs, 0, n),
                            None if sample.top_logprobs is None else ListView(sample.top_logprobs, 0, n),
                            cumulative, finish_reason, stop_reason,
                            None if sample.token_ranks is None else ListView(sample.token_ranks, 0, n))
