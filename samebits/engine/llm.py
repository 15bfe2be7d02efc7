"""The offline API, shaped like vLLM's: `LLM(...).generate(prompts, params)`, `.chat(...)`,
`.teacher_forced_logprobs(...)` (also `.score`, its first name: vLLM's `score` is a pooling model's, another thing)."""
from __future__ import annotations

import contextlib
import dataclasses
import itertools

from samebits.engine.config import EngineConfig
from samebits.engine.outputs import RequestOutput
from samebits.engine.prompts import normalize_prompts, render_chat
from samebits.engine.sampling_params import RequestOutputKind, SamplingParams, check_vocab


class LLM:
    """One engine. `samebits.LLM` (samebits/llm.py) is this, or a fleet's (fleet/llm.py) with data_parallel_size > 1."""

    def __init__(self, model: str = "smollm2-135m", **engine_kwargs):
        """`engine_kwargs` are EngineConfig fields (mode, device, dtype, max_num_seqs, ...); an unknown one is an
        error naming it."""
        from samebits.engine.llm_engine import LLMEngine

        self.config = EngineConfig.from_dict({"model": model, **engine_kwargs})
        if self.config.data_parallel_size > 1:
            raise ValueError(f"data_parallel_size={self.config.data_parallel_size} runs replicas: samebits.LLM "
                             "builds them (samebits/llm.py); this LLM is one engine")
        with self._runtime():
            self.engine = LLMEngine(self.config)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def llm_engine(self):
        """vLLM's name for the engine behind this LLM (an LLMEngine: add_request, step, has_unfinished_requests)."""
        return self.engine

    def get_tokenizer(self):
        return self.engine.tokenizer

    def _runtime(self):
        if self.config.mode != "deterministic":
            return contextlib.nullcontext()
        from samebits.runtime import deterministic_runtime

        return deterministic_runtime()

    def generate(self, prompts=None, sampling_params=None, use_tqdm: bool = True, *,
                 prompt_token_ids=None) -> list[RequestOutput]:
        """`prompts`: a str, a list of token ids, a vLLM TextPrompt {"prompt": str} or TokensPrompt
        {"prompt_token_ids": [...]}, or a list of those. `prompt_token_ids` (vLLM's older keyword): token ids, one
        list or a list of lists, instead of `prompts`."""
        items = self._prompt_items(prompts, prompt_token_ids)
        params = self._params_per_prompt(sampling_params, len(items))
        for p in {id(p): p for p in params}.values():  # before any request is queued, so a bad one loses nothing
            check_vocab(p, self.engine.loaded.config.vocab_size)
            if p.structured_outputs is not None:
                self.engine.grammars.compile(p.structured_outputs)
        with self._runtime():
            ids = [self._add(t, p, text) for (text, t), p in zip(items, params)]
            outs = self._run(ids, use_tqdm)
            for out in outs:
                self._finish(out)
        return outs

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict | None = None,
             tools: list[dict] | None = None) -> list[RequestOutput]:
        """One conversation or a list of them; content may be OpenAI content parts, assistant tool calls and tool
        results. The options are vLLM's; `tools` (OpenAI function tools) reach the chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [render_chat(self.tokenizer, c, add_generation_prompt, continue_final_message, chat_template_kwargs,
                               tools) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def teacher_forced_logprobs(self, prompt_token_ids, completion_token_ids) -> list[float] | list[list[float]]:
        """Teacher-forced logprob of each completion token, bit-equal to what `generate` reports for it; one
        prompt and completion, or lists of them."""
        single = bool(prompt_token_ids) and isinstance(prompt_token_ids[0], int)
        prompts = [prompt_token_ids] if single else prompt_token_ids
        completions = [completion_token_ids] if single else completion_token_ids
        with self._runtime():
            scores = self.engine.score(list(prompts), list(completions))
        return scores[0] if single else scores

    def update_weights(self, weights, version: str | None = None) -> str:
        """Copy new weights in place (a state dict in HF or samebits names, a samebits Policy, a transformers
        module); refused whole on a wrong name, shape or dtype. Returns the weights version in the fingerprint."""
        from samebits.engine.weights import update_weights

        return update_weights(self.engine, weights, version)

    def score(self, prompt_token_ids, completion_token_ids) -> list[float] | list[list[float]]:
        """`teacher_forced_logprobs` under its first name. Not vLLM's `LLM.score` (a pooling model's similarity
        score), which samebits does not have; new code should call teacher_forced_logprobs."""
        return self.teacher_forced_logprobs(prompt_token_ids, completion_token_ids)

    def _finish(self, out: RequestOutput) -> None:
        """What the offline API adds to an engine output: decoded tokens for the Logprob records."""
        def decode(ids):
            return self.tokenizer.decode(ids, skip_special_tokens=False)

        for c in out.outputs:
            c.decode = decode
        if out.prompt_logprobs is not None:
            out.prompt_logprobs.decode = decode

    def _add(self, token_ids, params, text) -> str:
        request_id = str(next(self._ids))
        # As vLLM's LLM: only the finished output is read, so no step builds the others.
        params = dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
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

    def _prompt_items(self, prompts, prompt_token_ids) -> list[tuple[str | None, list[int]]]:
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("generate: give prompts or prompt_token_ids (one of them)")
        return normalize_prompts(prompts if prompts is not None else prompt_token_ids, self.tokenizer.encode)

    @staticmethod
    def _params_per_prompt(sampling_params, n: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams()] * n
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * n
        if len(sampling_params) != n:
            raise ValueError(f"sampling_params: got {len(sampling_params)} for {n} prompts; give one or one per prompt")
        return list(sampling_params)
