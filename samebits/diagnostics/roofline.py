"""The time a generation workload cannot beat on a GPU: its FLOPs at the matrix peak and its bytes at HBM speed.

An idealised schedule of a dense Llama-family model: every prompt is prefilled compute-bound (matrix FLOPs plus
causal attention), then all requests decode together, up to `max_num_seqs` at a time, oldest first. A decode step
costs the larger of its FLOPs at `peak_flops` and its bytes at `peak_bytes` (the weights read once, plus the KV of
every running sequence). Achieved time / this bound is the share of the GPU a benchmark gets. Torch-free arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass

from samebits.models.config import ModelConfig

# The lent H200's measured ceilings (docs/BENCHMARKS.md): a bf16 8192^3 matrix product on random data
# ~790 TFLOP/s, a device-to-device copy ~4.3 TB/s counting bytes read and written.
H200_PEAK_FLOPS = 790e12
H200_PEAK_BYTES = 4.3e12


def layer_params(m: ModelConfig) -> int:
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    attn = m.hidden_size * (q + 2 * kv) + q * m.hidden_size
    return m.num_layers * (attn + 3 * m.hidden_size * m.intermediate_size)


def weight_bytes(m: ModelConfig, dtype_bytes: int) -> int:
    """What one step must read: the layers and the lm_head (the embedding is gathered, a few rows per token)."""
    return (layer_params(m) + m.vocab_size * m.hidden_size) * dtype_bytes


def kv_bytes_per_token(m: ModelConfig, dtype_bytes: int) -> int:
    return m.num_layers * 2 * m.num_kv_heads * m.head_dim * dtype_bytes


def attention_flops(m: ModelConfig, queries: float, context: float) -> float:
    """QK^T and PV for `queries` rows each over `context` keys (on average)."""
    return 4.0 * m.num_layers * m.num_heads * m.head_dim * queries * context


@dataclass(frozen=True)
class Bound:
    prefill_s: float
    decode_s: float
    decode_steps: int

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


def prefill_seconds(m: ModelConfig, prompt_lens: list[int], peak_flops: float) -> float:
    flops = 0.0
    for n in prompt_lens:
        # every row through the layers, the last row through the lm_head; causal: row i sees i + 1 keys
        flops += 2.0 * layer_params(m) * n + 2.0 * m.vocab_size * m.hidden_size
        flops += attention_flops(m, n, (n + 1) / 2)
    return flops / peak_flops


def decode_seconds(m: ModelConfig, dtype_bytes: int, prompt_lens: list[int], output_lens: list[int],
                   max_num_seqs: int, peak_flops: float, peak_bytes: float) -> tuple[float, int]:
    """-> (seconds, steps). The first output token comes from prefill; each later one is a decode row."""
    waiting = [(p, o - 1) for p, o in zip(prompt_lens, output_lens) if o > 1]
    running: list[list[int]] = []  # [context length, decode rows left]
    seconds, steps = 0.0, 0
    while waiting or running:
        while waiting and len(running) < max_num_seqs:
            p, left = waiting.pop(0)
            running.append([p + 1, left])
        rows = len(running)
        context = sum(r[0] for r in running)
        flops = rows * 2.0 * (layer_params(m) + m.vocab_size * m.hidden_size) + attention_flops(m, 1, context)
        nbytes = weight_bytes(m, dtype_bytes) + kv_bytes_per_token(m, dtype_bytes) * context
        seconds += max(flops / peak_flops, nbytes / peak_bytes)
        steps += 1
        for r in running:
            r[0] += 1
            r[1] -= 1
        running = [r for r in running if r[1] > 0]
    return seconds, steps


def roofline(m: ModelConfig, prompt_lens: list[int], output_lens: list[int], dtype_bytes: int = 2,
             max_num_seqs: int = 256, peak_flops: float = H200_PEAK_FLOPS,
             peak_bytes: float = H200_PEAK_BYTES) -> Bound:
    if len(prompt_lens) != len(output_lens):
        raise ValueError(f"roofline: {len(prompt_lens)} prompt lengths and {len(output_lens)} output lengths")
    if max_num_seqs < 1:
        raise ValueError(f"roofline: max_num_seqs must be >= 1, got {max_num_seqs}")
    decode_s, steps = decode_seconds(m, dtype_bytes, prompt_lens, output_lens, max_num_seqs, peak_flops, peak_bytes)
    return Bound(prefill_seconds(m, prompt_lens, peak_flops), decode_s, steps)
