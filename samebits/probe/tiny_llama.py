"""A self-contained functional Llama forward for the whole-model probe, parameterised by an `ops` object.

Every reduction (linear, RMSNorm, attention) goes through `ops`; RoPE, SiLU and the residual adds are elementwise, so
their bits cannot depend on the batch. Full recompute per step: at probe sizes a KV cache would only add code.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaShape:
    # head_dim 64: a width the GPU attention kernel has a fixed tile for.
    vocab: int = 512
    hidden: int = 256
    intermediate: int = 512
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    eps: float = 1e-5
    theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _layer_shapes(s: LlamaShape) -> dict:
    d = s.head_dim
    return {"q": (s.heads * d, s.hidden), "k": (s.kv_heads * d, s.hidden), "v": (s.kv_heads * d, s.hidden),
            "o": (s.hidden, s.heads * d), "gate": (s.intermediate, s.hidden), "up": (s.intermediate, s.hidden),
            "down": (s.hidden, s.intermediate)}


def random_weights(s: LlamaShape, seed: int, dtype, device) -> dict:
    """Seeded weights drawn on `device` itself: a 1B shape drawn on the CPU would take longer than the probe."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=g, device=device) / shape[-1] ** 0.5).to(dtype)

    layers = [{name: rand(*shape) for name, shape in _layer_shapes(s).items()} for _ in range(s.layers)]
    for lw in layers:
        lw["attn_norm"] = torch.ones(s.hidden, device=device, dtype=dtype)
        lw["mlp_norm"] = torch.ones(s.hidden, device=device, dtype=dtype)
    embed = rand(s.vocab, s.hidden) * s.hidden ** 0.5
    return {"embed": embed, "layers": layers, "norm": torch.ones(s.hidden, device=device, dtype=dtype),
            "lm_head": rand(s.vocab, s.hidden)}


def _rope(x, positions, theta: float):
    """HF rotate_half layout, computed in float32."""
    import torch

    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    xf = x.float()
    rot = torch.cat([-xf[..., d // 2:], xf[..., : d // 2]], -1)
    return (xf * cos[:, None, :] + rot * sin[:, None, :]).to(x.dtype)


def _attention(ops, lw, h, s: LlamaShape, b: int, n: int):
    import torch

    d = s.head_dim
    pos = torch.arange(n, device=h.device)
    q = ops.linear(h, lw["q"]).view(b, n, s.heads, d)
    k = ops.linear(h, lw["k"]).view(b, n, s.kv_heads, d)
    v = ops.linear(h, lw["v"]).view(b, n, s.kv_heads, d)
    q, k = _rope(q, pos, s.theta), _rope(k, pos, s.theta)
    out = ops.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), d ** -0.5)
    return ops.linear(out.transpose(1, 2).reshape(b * n, s.heads * d), lw["o"])


def _mlp(ops, lw, h):
    import torch.nn.functional as F

    return ops.linear(F.silu(ops.linear(h, lw["gate"])) * ops.linear(h, lw["up"]), lw["down"])


def last_logits(ops, w: dict, s: LlamaShape, tokens):
    """tokens [B, L] -> float32 logits of each sequence's last position, [B, V]. Rows are flattened to [B*L, H]
    exactly as an engine batches them, so the matmul M is the batch-dependent shape."""
    b, n = tokens.shape
    x = w["embed"][tokens.reshape(-1)]
    for lw in w["layers"]:
        x = x + _attention(ops, lw, ops.rms_norm(x, lw["attn_norm"], s.eps), s, b, n)
        x = x + _mlp(ops, lw, ops.rms_norm(x, lw["mlp_norm"], s.eps))
    last = ops.rms_norm(x, w["norm"], s.eps).view(b, n, -1)[:, -1]
    return ops.linear(last, w["lm_head"]).float()


def greedy(ops, w: dict, s: LlamaShape, prompts, steps: int):
    """Greedy decode. Returns (tokens [B, L + steps], per-step logits list of [B, V])."""
    import torch

    tokens, logits = prompts, []
    for _ in range(steps):
        step = last_logits(ops, w, s, tokens)
        logits.append(step)
        tokens = torch.cat([tokens, step.argmax(-1, keepdim=True)], 1)
    return tokens, logits
