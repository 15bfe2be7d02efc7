"""A FakeLLMEngine that follows the engine contract (docs/CONTRACTS.md) exactly, for failure injection.

Tokens are a hash of (prompt, seed if sampling, sample index, position), so outputs are a function of the request
alone, like the real engine's; logprobs are float32 values; KV blocks are counted so abort/free can be checked.
"""
from __future__ import annotations

import hashlib
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import ClassVar

from samebits.engine.outputs import CompletionOutput, EngineInfo, EngineStats, RequestOutput, StepProgress
from samebits.engine.sampling_params import RequestOutputKind, SamplingParams
from samebits.errors import FieldError

VOCAB = 512
EOS = 0
BLOCK = 16


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _h(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


class FakeTokenizer:
    """Token t <-> one CJK character; text outside that range is encoded by code point modulo the vocabulary."""

    vocab_size = VOCAB
    eos_token_ids: ClassVar[set[int]] = {EOS}

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        return [(ord(ch) - 0x4E00) % VOCAB if ord(ch) >= 0x4E00 else ord(ch) % VOCAB for ch in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(0x4E00 + t) for t in ids if not (skip_special_tokens and t == EOS))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        text = "".join(f"{m['role']}:{m['content']}\n" for m in messages)
        return text + ("assistant:" if add_generation_prompt else "")


@dataclass
class _Req:
    rid: str
    prompt: str | None
    ids: list[int]
    params: SamplingParams
    seed: int
    samples: list[CompletionOutput] = field(default_factory=list)
    prefilled: bool = False


class FakeLLMEngine:
    def __init__(self, max_model_len: int = 256, max_num_seqs: int = 64, num_blocks: int = 4096,
                 step_delay_s: float = 0.0):
        self.tokenizer = FakeTokenizer()
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.num_blocks = num_blocks
        self.step_delay_s = step_delay_s
        self.model_name = "fake"
        self.fail_at_step: int | None = None  # raise inside step() number N (1-based): the loop dies there
        self.gate: threading.Event | None = None  # while set to an unset Event, step() waits (bounded)
        self.requests: dict[str, _Req] = {}
        self.steps = 0
        self._progress: list[StepProgress] = []

    def fingerprint(self) -> dict:
        return {"samebits": "0.1.0", "torch": "fake", "cuda_runtime": None, "cublas": None, "driver": None,
                "mode": "deterministic", "numerics_profile": "fakeprofile", "hash": "fakehash0123",
                "tensor_parallel": {"size": 1, "all_reduce": None, "invariant": False}}

    def draw_seed(self) -> int:
        self._drawn = getattr(self, "_drawn", 0) + 1
        return _h("drawn", str(self._drawn)) % 2**63

    def validate(self, prompt_token_ids, params, where="prompt") -> None:
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise FieldError("max_tokens", f"max_tokens {params.max_tokens} + prompt {len(prompt_token_ids)} exceeds "
                             f"max_model_len {self.max_model_len}")

    def add_request(self, request_id, prompt_token_ids, params, prompt=None, resume=None) -> None:
        assert resume is None, "the fake engine continues no sent output"
        if request_id in self.requests:
            raise FieldError("request_id", f"request_id {request_id!r} already exists")
        self.validate(prompt_token_ids, params)
        seed = params.seed if params.seed is not None else _h("seed", request_id) % 2**63
        samples = [CompletionOutput(i, "", [], [] if params.logprobs is not None else None,
                                    [] if params.logprobs else None) for i in range(params.n)]
        self.requests[request_id] = _Req(request_id, prompt, list(prompt_token_ids), params, seed, samples)

    def abort_request(self, request_id) -> None:
        self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def _running(self) -> list[_Req]:
        return list(self.requests.values())[: self.max_num_seqs]

    def step(self) -> list[RequestOutput]:
        if self.gate is not None:
            assert self.gate.wait(30), "test gate never opened"
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        self.steps += 1
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            raise RuntimeError("injected engine failure")
        running = self._running()
        before = [sum(len(c.token_ids) for c in r.samples) for r in running]
        outs = [self._advance(r) for r in running]
        self._progress = [StepProgress(r.rid, sum(len(c.token_ids) for c in r.samples) - n, None)
                          for r, n in zip(running, before)]
        for out in outs:
            if out.finished:
                del self.requests[out.request_id]
        return [out for r, out in zip(running, outs)
                if out.finished or r.params.output_kind is not RequestOutputKind.FINAL_ONLY]

    def progress(self) -> list[StepProgress]:
        return self._progress

    def _advance(self, r: _Req) -> RequestOutput:
        if r.prefilled:
            for s in r.samples:
                if s.finish_reason is None:
                    self._sample(r, s)
        r.prefilled = True
        done = all(s.finish_reason is not None for s in r.samples)
        return RequestOutput(r.rid, r.prompt, list(r.ids), [_copy(s) for s in r.samples], 0, r.seed, "fakehash0123",
                             done)

    def _sample(self, r: _Req, s: CompletionOutput) -> None:
        p, pos = r.params, len(s.token_ids)
        key = (tuple(r.ids), r.seed if p.temperature > 0 else 0, s.index if p.temperature > 0 else 0, pos)
        token = _h("tok", key) % VOCAB
        s.token_ids.append(token)
        s.text = self.tokenizer.decode(s.token_ids)
        if s.logprobs is not None:
            s.logprobs.append(_f32(-((_h("lp", key) % 100000) / 7919.0)))
        if s.top_logprobs is not None:
            s.top_logprobs.append({(token + k) % VOCAB: _f32(-k - 0.5) for k in range(p.logprobs)})
        self._finish(r, s, token)

    def _finish(self, r: _Req, s: CompletionOutput, token: int) -> None:
        p = r.params
        for stop in p.stop_strings:
            at = s.text.find(stop)
            if at >= 0:
                s.text, s.finish_reason, s.stop_reason = s.text[:at], "stop", stop
                return
        if token in p.stop_token_set or (token == EOS and not p.ignore_eos):
            s.finish_reason, s.stop_reason = "stop", (token if token != EOS else None)
        elif len(s.token_ids) >= p.max_tokens:
            s.finish_reason = "length"

    def info(self) -> EngineInfo:
        return EngineInfo(self.model_name, "fake", "deterministic", VOCAB, self.max_model_len, "float32", "cpu",
                          self.num_blocks, BLOCK)

    def stats(self) -> EngineStats:
        used = sum(-(-(len(r.ids) + max(len(s.token_ids) for s in r.samples)) // BLOCK) for r in self.requests.values())
        return EngineStats(num_running=min(len(self.requests), self.max_num_seqs),
                           num_waiting=max(0, len(self.requests) - self.max_num_seqs), kv_usage=used / self.num_blocks,
                           prefix_queries=0, prefix_hits=0, num_preemptions=0, prompt_tokens=0, generation_tokens=0)


def _copy(s: CompletionOutput) -> CompletionOutput:
    return CompletionOutput(s.index, s.text, list(s.token_ids), None if s.logprobs is None else list(s.logprobs),
                            None if s.top_logprobs is None else list(s.top_logprobs), None, s.finish_reason,
                            s.stop_reason)
