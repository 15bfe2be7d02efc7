"""One generated choice as the endpoint sent it: its tokens and their logprobs, parsed from either API's shape.

Tokens are the ids when the endpoint returns them (samebits does, vLLM with `return_token_ids`), else the token
strings of the logprobs; `identity` says which, since two ids can print as one string.
"""
from __future__ import annotations

from dataclasses import dataclass


class NoLogprobs(Exception):
    """The reply carries no logprobs: nothing can be compared bit for bit."""


@dataclass(frozen=True)
class Sample:
    tokens: tuple
    logprobs: tuple[float | None, ...]
    identity: str  # "token_ids" | "token_strings"

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.logprobs):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.logprobs)} logprobs")
        if self.identity not in ("token_ids", "token_strings"):
            raise ValueError(f"identity must be token_ids or token_strings, got {self.identity!r}")

    def as_dict(self) -> dict:
        return {"tokens": list(self.tokens), "logprobs": list(self.logprobs), "identity": self.identity}

    @classmethod
    def from_dict(cls, d: dict) -> Sample:
        return cls(tuple(d["tokens"]), tuple(d["logprobs"]), d["identity"])


def _choice(body: dict) -> dict:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise NoLogprobs("the reply has no choices")
    return choices[0]


def _tokens(choice: dict, strings: list) -> tuple[tuple, str]:
    ids = choice.get("token_ids")
    if isinstance(ids, list) and len(ids) == len(strings):
        return tuple(ids), "token_ids"
    return tuple(strings), "token_strings"


def parse_completion(body: dict) -> Sample:
    lp = _choice(body).get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
        raise NoLogprobs("completion choices carry no logprobs.token_logprobs")
    tokens, identity = _tokens(_choice(body), list(lp.get("tokens") or []))
    return Sample(tokens, tuple(lp["token_logprobs"]), identity)


def parse_chat(body: dict) -> Sample:
    lp = _choice(body).get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(content, list):
        raise NoLogprobs("chat choices carry no logprobs.content")
    tokens, identity = _tokens(_choice(body), [c.get("token") for c in content])
    return Sample(tokens, tuple(c.get("logprob") for c in content), identity)
