"""The field policy, one place: every field of the OpenAI and vLLM request vocabulary is implemented (a typed field of
`protocol`), refused with a 400 that names it (below), or bookkeeping that changes no output (below).

A refused field sent with a neutral value is accepted, because clients send defaults (`presence_penalty: 0`,
`tools: []`); null is always neutral. A field outside the vocabulary is refused too, naming it: vLLM ignores unknown
fields with a warning, but a misspelt or newer sampling field that is silently ignored changes the answer without a
word, which a server whose every output is a function of the request cannot allow.
"""
from __future__ import annotations

from samebits.server.errors import invalid

# name -> its neutral values. Sampling changes samebits does not make: penalties, biases, constrained decoding.
_SAMPLING = {
    "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,), "length_penalty": (1,),
    "logit_bias": ({},), "min_tokens": (0,), "bad_words": ([],), "allowed_token_ids": (), "logits_processors": ([],),
    "use_beam_search": (False,), "truncate_prompt_tokens": (), "spaces_between_special_tokens": (True,),
    "prompt_logprobs": (), "return_tokens_as_token_ids": (False,),
    "response_format": ({"type": "text"},), "structured_outputs": (), "guided_json": (), "guided_regex": (),
    "guided_choice": (), "guided_grammar": (), "guided_decoding_backend": (), "guided_whitespace_pattern": (),
}
# Features samebits does not have. tool_choice and parallel_tool_calls are neutral whatever they say: tools are refused.
_FEATURES = {
    "tools": ([],), "tool_choice": ("none", "auto"), "parallel_tool_calls": (True, False), "functions": ([],),
    "function_call": ("none", "auto"), "audio": (), "modalities": (["text"],), "prediction": (),
    "reasoning_effort": (), "verbosity": (), "web_search_options": (), "prompt_embeds": (), "mm_processor_kwargs": ({},),
    "priority": (0,), "request_id": (), "cache_salt": (), "kv_transfer_params": (), "vllm_xargs": (),
}
REFUSED: dict[str, dict[str, tuple]] = {
    "completions": {**_SAMPLING, **_FEATURES, "suffix": ("",), "add_special_tokens": (True,)},
    "chat": {**_SAMPLING, **_FEATURES, "best_of": (1,), "echo": (False,), "add_special_tokens": (False,),
             "documents": ([],), "chat_template": ()},
}
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# The provider's bookkeeping: accepted, and no output depends on it.
BOOKKEEPING = ("metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier")


def _neutral(value, neutrals: tuple) -> bool:
    # false is not 0 here: a bool where a number belongs is not the number's default.
    return value is None or any(isinstance(value, bool) == isinstance(v, bool) and value == v for v in neutrals)


def check_fields(endpoint: str, extra: dict) -> None:
    """The body's fields beyond the typed (implemented) ones: each is bookkeeping, refused-but-neutral, or a 400."""
    refused = REFUSED[endpoint]
    for name, value in extra.items():
        if name in BOOKKEEPING:
            continue
        if name not in refused:
            raise invalid(f"{name} is not a field of {PATHS[endpoint]} in the OpenAI or vLLM API; samebits refuses unknown fields rather than ignore them", name)
        if not _neutral(value, refused[name]):
            shown = " or ".join(repr(v) for v in refused[name])
            hint = f"send {shown}, null or leave it out" if shown else "leave it out or send null"
            raise invalid(f"{name} is not supported by samebits; {hint}", name)
