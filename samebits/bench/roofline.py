"""The time a generation workload cannot beat on a GPU: its FLOPs at the matrix peak and its bytes at HBM speed.

An idealised schedule of a Llama-family model: every prompt is prefilled compute-bound (matrix FLOPs plus causal
attention), then all requests decode together, up to `max_num_seqs` at a time, oldest first. A decode step costs the
larger of its FLOPs at `peak_flops` and its bytes at `peak_bytes` (the weights read once, plus the KV of every running
sequence). Achieved time / this bound is the share of the GPU a benchmark gets. Torch-free arithmetic.

The step-max roofline (`step_roofline`) costs the steps a run actually launched instead: each step the larger of its
FLOPs at the peak and its bytes (weights once per step, each chunk's context KV once) at HBM speed, summed. It charges
every step for its weights, so prefill chunks pay for theirs and a schedule with more steps than the ideal pays for
each, but a mixed step's decode rows ride on its prefill's FLOPs for free where the ideal schedule decodes them in
steps of their own: it is not above or below the ideal bound in general (tests/bench/test_roofline.py). What
always holds: it is at least the steps' FLOPs at the peak and at least their bytes at HBM speed, so never below the
ideal prefill bound when the steps compute every prompt token.

A mixture of experts counts what a token touches: FLOPs of its active parameters (attention, router, shared expert
and its k experts), and per decode step the bytes of the experts that step's rows route to, E * (1 - (1 - k/E)^rows)
of a sparse layer's E on average under uniform routing (what random-weight models show), never all of them.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from samebits.models.config import ModelConfig

# The lent H200's measured ceilings (docs/BENCHMARKS.md): a bf16 8192^3 matrix product on random data
# ~790 TFLOP/s, a device-to-device copy ~4.3 TB/s counting bytes read and written.
H200_PEAK_FLOPS = 790e12
H200_PEAK_BYTES = 4.3e12


def _attention_params(m: ModelConfig) -> int:
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    return m.hidden_size * (q + 2 * kv) + q * m.hidden_size


def _sparse_layers(m: ModelConfig) -> int:
    return 0 if m.moe is None else sum(m.moe.is_sparse(i) for i in range(m.num_layers))


def expert_params(m: ModelConfig) -> int:
    """One routed expert's gate, up and down."""
    return 3 * m.hidden_size * m.moe.intermediate_size


def _always_read(m: ModelConfig) -> int:
    """Every layer's parameters but the routed experts: attention, dense MLPs, routers, shared experts."""
    sparse = _sparse_layers(m)
    total = m.num_layers * _attention_params(m) + (m.num_layers - sparse) * 3 * m.hidden_size * m.intermediate_size
    if sparse:
        shared = m.moe.shared_expert_intermediate_size
        total += sparse * (m.moe.num_experts * m.hidden_size + (3 * shared + 1) * m.hidden_size * (shared > 0))
    return total


def layer_params(m: ModelConfig) -> int:
    """Every layer's parameters (all experts of a mixture)."""
    return _always_read(m) + _sparse_layers(m) * (m.moe.num_experts * expert_params(m) if m.moe else 0)


def active_params(m: ModelConfig) -> int:
    """The layer parameters one token computes with: a mixture's k experts of each sparse layer, not all E."""
    return _always_read(m) + _sparse_layers(m) * (m.moe.top_k * expert_params(m) if m.moe else 0)


def touched_experts(m: ModelConfig, rows: int) -> float:
    """The experts a step of `rows` tokens reads in one sparse layer, on average under uniform routing (each token
    picks k distinct of E): E * (1 - (1 - k/E)^rows)."""
    e, k = m.moe.num_experts, m.moe.top_k
    return e * (1.0 - (1.0 - k / e) ** rows)


def weight_bytes(m: ModelConfig, dtype_bytes: int, rows: int | None = None) -> float:
    """What one step of `rows` tokens must read: the layers (a mixture's touched experts; None: all of them) and the
    lm_head (the embedding is gathered, a few rows per token)."""
    layers = layer_params(m) if m.moe is None or rows is None else \
        _always_read(m) + _sparse_layers(m) * touched_experts(m, rows) * expert_params(m)
    return (layers + m.vocab_size * m.hidden_size) * dtype_bytes


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


@dataclass(frozen=True)
class StepWork:
    """What one step computes: `tokens` rows through the layers, `samples` of them through the lm_head, `pairs`
    (query, key) pairs of causal attention, `keys` KV entries read (each chunk reads its context once)."""
    tokens: int
    samples: int
    pairs: int
    keys: int


def step_work(chunks: Iterable[tuple[int, int, bool]]) -> StepWork:
    """A step of chunks (new tokens, tokens computed before, sampled?): new row i at position start + i sees
    start + i + 1 keys."""
    tokens = samples = pairs = keys = 0
    for n, start, sample in chunks:
        tokens, samples, keys = tokens + n, samples + sample, keys + start + n
        pairs += n * start + n * (n + 1) // 2
    return StepWork(tokens, samples, pairs, keys)


def step_flops(m: ModelConfig, w: StepWork) -> float:
    return 2.0 * active_params(m) * w.tokens + 2.0 * m.vocab_size * m.hidden_size * w.samples + \
        attention_flops(m, w.pairs, 1)


def step_bytes(m: ModelConfig, w: StepWork, dtype_bytes: int) -> float:
    return weight_bytes(m, dtype_bytes, w.tokens) + kv_bytes_per_token(m, dtype_bytes) * w.keys


def step_seconds(m: ModelConfig, w: StepWork, dtype_bytes: int, peak_flops: float, peak_bytes: float) -> float:
    """The step's FLOPs at the peak or its bytes at HBM speed, whichever takes longer."""
    return max(step_flops(m, w) / peak_flops, step_bytes(m, w, dtype_bytes) / peak_bytes)


def step_roofline(m: ModelConfig, steps: Iterable[StepWork], dtype_bytes: int, peak_flops: float,
                  peak_bytes: float) -> float:
    """Seconds the given steps cannot beat: the sum of each step's `step_seconds`."""
    return sum(step_seconds(m, w, dtype_bytes, peak_flops, peak_bytes) for w in steps)


def prefill_seconds(m: ModelConfig, prompt_lens: list[int], peak_flops: float) -> float:
    """Every prompt in one step of its own, compute-bound: every row through the layers, the last through the
    lm_head."""
    return sum(step_flops(m, step_work([(n, 0, True)])) for n in prompt_lens) / peak_flops


def decode_steps(prompt_lens: list[int], output_lens: list[int], max_num_seqs: int) -> Iterable[StepWork]:
    """The ideal decode schedule's steps: the first output token comes from prefill; each later one is a decode row,
    up to max_num_seqs sequences at a time, oldest first."""
    waiting = [(p, o - 1) for p, o in zip(prompt_lens, output_lens) if o > 1]
    running: list[list[int]] = []  # [tokens before this step's row, decode rows left]
    while waiting or running:
        while waiting and len(running) < max_num_seqs:
            p, left = waiting.pop(0)
            running.append([p, left])
        yield step_work((1, r[0], True) for r in running)
        for r in running:
            r[0] += 1
            r[1] -= 1
        running = [r for r in running if r[1] > 0]


def decode_seconds(m: ModelConfig, dtype_bytes: int, prompt_lens: list[int], output_lens: list[int],
                   max_num_seqs: int, peak_flops: float, peak_bytes: float) -> tuple[float, int]:
    """-> (seconds, steps) of the ideal decode schedule (`decode_steps`)."""
    steps = list(decode_steps(prompt_lens, output_lens, max_num_seqs))
    return step_roofline(m, steps, dtype_bytes, peak_flops, peak_bytes), len(steps)


def roofline(m: ModelConfig, prompt_lens: list[int], output_lens: list[int], dtype_bytes: int = 2,
             max_num_seqs: int = 256, peak_flops: float = H200_PEAK_FLOPS,
             peak_bytes: float = H200_PEAK_BYTES) -> Bound:
    if len(prompt_lens) != len(output_lens):
        raise ValueError(f"roofline: {len(prompt_lens)} prompt lengths and {len(output_lens)} output lengths")
    if max_num_seqs < 1:
        raise ValueError(f"roofline: max_num_seqs must be >= 1, got {max_num_seqs}")
    decode_s, steps = decode_seconds(m, dtype_bytes, prompt_lens, output_lens, max_num_seqs, peak_flops, peak_bytes)
    return Bound(prefill_seconds(m, prompt_lens, peak_flops), decode_s, steps)
