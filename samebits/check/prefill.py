"""prefill vs decode: the logprob of each generated token against the same tokens scored as part of a prompt.

Decoding computes one row per step against a KV cache; scoring computes the whole sequence in one prefill. An
engine whose attention or GEMMs reduce differently in the two gives different bits for the same (context, token).
Prompt scoring uses `echo` + `logprobs` when the endpoint offers it, else vLLM's `prompt_logprobs`; with neither
the experiment says so and is skipped. When the endpoint names its tokens (`token_ids`: samebits, vLLM with
`return_token_ids`), the generated ids are continued and then scored as a token-id prompt, so the scored context is
the decoded one exactly; otherwise the prompt text plus the generated text is scored, which a model's odd output may
tokenise differently (then that prompt is not compared, and the report says so).
"""
from __future__ import annotations

from samebits.check.client import Reply
from samebits.check.compare import summarize
from samebits.check.config import CheckConfig
from samebits.check.experiment import Session, Trace
from samebits.check.needle import needle_prompt
from samebits.check.prompts import filler
from samebits.check.sample import Sample

NAME = "prefill"
PROMPTS = 2
ECHO, PROMPT_LOGPROBS = "echo+logprobs", "prompt_logprobs"


def planned(cfg: CheckConfig) -> int:
    return 2 + 3 * PROMPTS  # at most: the token-id route generates twice per prompt


def _echoed(reply: Reply) -> list[tuple[str, float | None]] | None:
    """(token, logprob) of the prompt part of an echo reply: all but the one generated token."""
    choices = reply.body.get("choices") or [{}]
    lp = choices[0].get("logprobs") if reply.status == 200 else None
    if not isinstance(lp, dict) or len(lp.get("tokens") or []) < 2:
        return None
    return list(zip(lp["tokens"], lp["token_logprobs"]))[:-1]


def _prompt_logprobs(reply: Reply) -> list[tuple[str, float | None]] | None:
    """(token, logprob) from vLLM's prompt_logprobs: per position None or {id: {logprob, decoded_token}}; with
    prompt_logprobs=0 each position holds only the prompt's own token."""
    choices = reply.body.get("choices") or [{}]
    plp = choices[0].get("prompt_logprobs") if reply.status == 200 else None
    if not isinstance(plp, list) or len(plp) < 2:
        return None
    out = []
    for entry in plp[1:]:
        if not isinstance(entry, dict) or len(entry) != 1:
            return None
        (value,) = entry.values()
        out.append((value.get("decoded_token"), value.get("logprob")))
    return out


PARSERS = {ECHO: (_echoed, {"echo": True}), PROMPT_LOGPROBS: (_prompt_logprobs, {"prompt_logprobs": 0})}


async def _method(session: Session, prompt: str) -> tuple[str | None, str]:
    """The first scoring method the endpoint honours, and why the others were not taken."""
    why = []
    for name, (parse, extra) in PARSERS.items():
        reply = await session.client.post("/completions", session.request(prompt, max_tokens=1, **extra).body)
        if parse(reply) is not None:
            return name, ""
        why.append(f"{name}: HTTP {reply.status} {reply.error_message[:80]}" if reply.status != 200
                   else f"{name}: ignored")
    return None, "; ".join(why)


async def _generate(session: Session, prompt: str | list[int]) -> tuple[Sample, dict]:
    req = session.request(prompt)
    reply = await session.client.post(req.path, req.body)
    return session.parse(req, reply), reply.body["choices"][0]  # parse: the HTTP and logprob checks of every other


async def _one(session: Session, trace: Trace, method: str, label: str, prompt: str) -> None:
    decoded, choice = await _generate(session, prompt)
    if decoded.identity == "token_ids" and decoded.tokens:  # continue the generated ids: a context known exactly
        context = list(decoded.tokens)
        decoded, _ = await _generate(session, context)
        scored_prompt, identity = context + list(decoded.tokens), "token_ids"
    else:
        decoded = Sample(tuple(choice["logprobs"]["tokens"]), tuple(choice["logprobs"]["token_logprobs"]),
                         "token_strings")
        scored_prompt, identity = prompt + choice["text"], "token_strings"
    if not decoded.tokens:
        trace.notes.append(f"{label}: nothing generated")
        return
    parse, extra = PARSERS[method]
    score = session.request(scored_prompt, max_tokens=1, **extra)
    scored = (parse(await session.client.post(score.path, score.body)) or [])[-len(decoded.tokens):]
    if len(scored) != len(decoded.tokens) or (
            identity == "token_strings" and tuple(t for t, _ in scored) != decoded.tokens):
        trace.notes.append(f"{label}: the generated text tokenises differently as a prompt; not compared")
        return
    as_prompt = Sample(decoded.tokens, tuple(v for _, v in scored), identity)
    trace.groups.append(summarize(label, decoded, [as_prompt], session.cfg.tolerance))


async def run(session: Session, trace: Trace) -> None:
    if session.cfg.api != "completions":
        trace.skipped = "needs the completions API (echo or prompt_logprobs); run with --api completions"
        return
    prompts = [needle_prompt(session)] + [filler(session.rng, session.cfg.filler_words) for _ in range(PROMPTS - 1)]
    method, why = await _method(session, prompts[0])
    if method is None:
        trace.skipped = f"the endpoint scores no prompts ({why})"
        return
    trace.method = method
    for i, prompt in enumerate(prompts):
        await _one(session, trace, method, f"prompt {i}", prompt)
    if not trace.groups:
        trace.skipped = "no generated sequence could be scored as a prompt"
