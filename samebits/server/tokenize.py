"""vLLM's tokenizer routes: POST /tokenize, POST /detokenize, GET /tokenizer_info. lm-evaluation-harness's
`local-completions` finds them (its remote tokenizer) and needs no tokenizer folder of its own; a chat's ids are the
ones a chat request with the same messages is served with."""
from __future__ import annotations

from samebits.server.errors import invalid
from samebits.server.protocol import DetokenizeRequest, TokenizeRequest
from samebits.server.requests import chat_ids
from samebits.server.state import ServerState


def _check(state: ServerState, req) -> None:
    if req.model_extra:
        field = next(iter(req.model_extra))
        raise invalid(f"{field} is not a field of a {type(req).__name__.removesuffix('Request').lower()} request",
                      field)
    if req.model is not None:
        state.check_model(req.model)


def tokenize(state: ServerState, req: TokenizeRequest) -> dict:
    """{count, max_model_len, tokens, token_strs}, vLLM's response; token_strs only when asked for."""
    _check(state, req)
    if (req.prompt is None) == (req.messages is None):
        raise invalid("send either prompt or messages", "prompt" if req.prompt is None else "messages")
    state.check_text_size(req)
    if req.prompt is not None:
        # Special-token text is the special token, as in vLLM's /tokenize (HF's default): lm-eval reads the eos
        # token's id off it. A client may send any ids as a prompt, so this opens nothing that completions close.
        ids = state.tokenizer.encode(req.prompt, req.add_special_tokens is not False)
    elif req.add_special_tokens:
        raise invalid("add_special_tokens must be false with messages: the chat template writes them",
                      "add_special_tokens")
    else:
        ids = chat_ids(state, req)
    strs = [state.token_text(t) for t in ids] if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids, "token_strs": strs}


def detokenize(state: ServerState, req: DetokenizeRequest) -> dict:
    _check(state, req)
    bad = next((t for t in req.tokens if not 0 <= t < state.vocab_size), None)
    if bad is not None:
        raise invalid(f"token id {bad} is outside the vocabulary [0, {state.vocab_size})", "tokens")
    return {"prompt": state.tokenizer.decode(req.tokens, skip_special_tokens=False)}


def tokenizer_info(state: ServerState) -> dict:
    """vLLM's /tokenizer_info: the tokenizer's config (its class, special tokens, chat template)."""
    return state.tokenizer.hf_config()
