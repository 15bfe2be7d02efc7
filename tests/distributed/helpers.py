"""Shared by the tensor-parallel tests: a tiny checkpoint every TP size can shard, engines, and bit keys."""
from __future__ import annotations

import contextlib
import random

import torch

from samebits.engine.llm import LLM
from samebits.models.synthetic import write_tiny_checkpoint

# Heads, KV heads and intermediate units divisible by TP_MAX=8 (TP-invariant mode cuts them in 8); GQA (2 heads per
# KV head); qkv biases (qwen2); a vocabulary of 1001, not a multiple of 8, so the head's zero padding is exercised.
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "vocab_size": 1001, "num_attention_heads": 16,
         "num_key_value_heads": 8, "head_dim": 8}


def checkpoint(path) -> str:
    return str(write_tiny_checkpoint(path, "qwen2", seed=3, **SHAPE))


ENGINE = {"device": "cpu", "kv_cache_tokens": 4096, "max_num_batched_tokens": 256}


def make(ckpt: str, **kw) -> LLM:
    return LLM(model=ckpt, **{**ENGINE, **kw})


@contextlib.contextmanager
def engine(ckpt: str, **kw):
    llm = make(ckpt, **kw)
    try:
        yield llm
    finally:
        close = getattr(llm.engine.runner, "close", None)
        if close is not None:
            close()


def prompts(n: int, seed: int, lo: int = 3, hi: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 1001) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def bits(values) -> list[int]:
    return torch.tensor(values, dtype=torch.float32).view(torch.int32).tolist()


def key(out) -> list[tuple]:
    """Token ids, the float32 bits of every logprob and of every top logprob, per sample."""
    return [(tuple(c.token_ids), bits(c.token_logprobs),
             [sorted((t, bits([v])[0]) for t, v in top.items()) for top in (c.top_logprobs or [])])
            for c in out.outputs]


def run(llm: LLM, ps, params) -> list:
    return [key(o) for o in llm.generate(ps, params, use_tqdm=False)]
