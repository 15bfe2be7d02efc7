"""The field policy, one place: every field of the OpenAI and vLLM request vocabulary is implemented (a typed field of
`protocol`), refused with a 400 that names it (below), or bookkeeping that changes no output (below).

A refused field sent with a neutral value is accepted, because clients send defaults (`length_penalty: 1`,
`tools: []`); null is always neutral. A field outside the vocabulary is refused too, naming it: vLLM ignores unknown
fields with a warning, but a misspelt or newer sampling field that is silently ignored changes the answer without a
word, which a server whose every output is a function of the request cannot allow.
"""
from __future__ import annotations

from samebits.server.errors import invalid

# name -> its neutral values. Sampling changes samebits does not make: beam search, word bans.
_SAMPLING = {
    "length_penalty": (1,), "bad_words": ([],), "logits_processors": ([],),
    "use_beam_search": (False,), "truncate_prompt_tokens": (), "spaces_between_special_tokens": (True,),
    "return_tokens_as_token_ids": (False,),
}
# Tools are chat's (server/tools.py). On completions tool_choice and parallel_tool_calls are neutral whatever they
# say: tools are refused there.
_NO_TOOLS = {"tools": ([],), "tool_choice": ("none", "auto"), "parallel_tool_calls": (True, False)}
# Features samebits does not have.
_FEATURES = {
    "functions": ([],),
    "function_call": ("none", "auto"), "audio": (), "modalities": (["text"],), "prediction": (),
    "reasoning_effort": (), "verbosity": (), "web_search_options": (), "prompt_embeds": (),
    "mm_processor_kwargs": ({},),
    "priority": (0,), "request_id": (), "cache_salt": (), "kv_transfer_params": (), "vllm_xargs": (),
}
REFUSED: dict[str, dict[str, tuple]] = {
    "completions": {**_SAMPLING, **_FEATURES, **_NO_TOOLS, "suffix": ("",), "add_special_tokens": (True,)},
    "chat": {**_SAMPLING, **_FEATURES, "best_of": (1,), "echo": (False,), "add_special_tokens": (False,),
             "documents": ([],), "chat_template": ()},
}
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# The provider's bookkeeping: accepted, and no output depends on it.
BOOKKEEPING = ("metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier")
# Inside the body's objects, the same policy: a message replayed from an OpenAI response carries these as null or [].
REFUSED_IN_MESSAGE = {"function_call": (), "audio": (), "refusal": (), "annotations": ([],), "reasoning_content": ()}
REFUSED_IN_STREAM_OPTIONS = {"continuous_usage_stats": (False,)}


def _neutral(value, neutrals: tuple) -> bool:
    # false is not 0 here: a bool where a number belongs is not the number's default.
    return value is None or any(isinstance(value, bool) == isinstance(v, bool) and value == v for v in neutrals)


def _check(extra: dict, refused: dict[str, tuple], owner: str, prefix: str = "", param: str | None = None) -> None:
    for name, value in extra.items():
        field = prefix + name
        if name not in refused:
            raise invalid(f"{field} is not a field of {owner} in the OpenAI or vLLM API; samebits refuses unknown "
                          f"fields rather than ignore them", param or name)
        if not _neutral(value, refused[name]):
            shown = " or ".join(repr(v) for v in refused[name])
            hint = f"send {shown}, null or leave it out" if shown else "leave it out or send null"
            raise invalid(f"{field} is not supported by samebits; {hint}", param or name)


def check_fields(endpoint: str, req) -> None:
    """Every field beyond the typed (implemented) ones, in the body and in its objects: bookkeeping, refused but sent
    with a neutral value, or a 400 naming it."""
    _check({k: v for k, v in (req.model_extra or {}).items() if k not in BOOKKEEPING}, REFUSED[endpoint],
           PATHS[endpoint])
    if req.stream_options is not None:
        _check(req.stream_options.model_extra or {}, REFUSED_IN_STREAM_OPTIONS, "stream_options", "stream_options.",
               "stream_options")
    for i, m in enumerate(getattr(req, "messages", ())):
        _check(m.model_extra or {}, REFUSED_IN_MESSAGE, "a chat message", f"messages[{i}].", "messages")
        # Parts of other types are refused by their type (engine.prompts), a clearer message than their fields.
        parts = [(j, p) for j, p in enumerate(m.content if isinstance(m.content, list) else ()) if p.type == "text"]
        for j, part in parts:
            _check(part.model_extra or {}, {}, "a text content part", f"messages[{i}].content[{j}].", "messages")
