"""The offline API, shaped like vLLM's: `LLM(...).generate(prompts, params)`, `.chat(...)`, `.score(...)`."""
from __future__ import annotations

import contextlib
import itertools

from samebits.engine.config import EngineConfig
from samebits.engine.outputs import RequestOutput
from samebits.engine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str = "smollm2-135m", **engine_kwargs):
        """`engine_kwargs` are EngineConfig fields (mode, device, dtype, max_num_seqs, ...); an unknown one is an
        error naming it."""
        from samebits.engine.llm_engine import LLMEngine

        self.config = EngineConfig.from_dict({"model": model, **engine_kwargs})
        with self._runtime():
            self.engine = LLMEngine(self.config)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def _runtime(self):
        if self.config.mode != "deterministic":
            return contextlib.nullcontext()
        from samebits.runtime import deterministic_runtime

        return deterministic_runtime()

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        token_lists, texts = self._normalize_prompts(prompts)
        params = self._params_per_prompt(sampling_params, len(token_lists))
        with self._runtime():
            ids = [self._add(t, p, text) for t, p, text in zip(token_lists, params, texts)]
            return self._run(ids, use_tqdm)

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        # Token ids, not text: the rendered template already holds its special tokens (no second BOS).
        prompts = [self.tokenizer.encode_chat(c, add_generation_prompt=True) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def score(self, prompt_token_ids, completion_token_ids) -> list[float] | list[list[float]]:
        """Teacher-forced logprob of each completion token, bit-equal to what `generate` reports for it."""
        single = bool(prompt_token_ids) and isinstance(prompt_token_ids[0], int)
        prompts = [prompt_token_ids] if single else prompt_token_ids
        completions = [completion_token_ids] if single else completion_token_ids
        with self._runtime():
            scores = self.engine.score(list(prompts), list(completions))
        return scores[0] if single else scores

    def _add(self, token_ids, params, text) -> str:
        request_id = str(next(self._ids))
        self.engine.add_request(request_id, token_ids, params, prompt=text)
        return request_id

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        from rich.progress import Progress

        done: dict[str, RequestOutput] = {}
        with Progress(disable=not use_tqdm, transient=True) as bar:
            task = bar.add_task("generating", total=len(ids))
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.advance(task)
        return [done[i] for i in ids]

    def _normalize_prompts(self, prompts) -> tuple[list[list[int]], list[str | None]]:
        if isinstance(prompts, str):
            prompts = [prompts]
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        tokens = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        return tokens, [p if isinstance(p, str) else None for p in prompts]

    @staticmethod
    def _params_per_prompt(sampling_params, n: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams()] * n
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * n
        if len(sampling_params) != n:
            raise ValueError(f"sampling_params: got {len(sampling_params)} for {n} prompts; give one or one per prompt")
        return list(sampling_params)
