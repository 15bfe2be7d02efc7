"""The grammar masks of one sampling batch: each constrained row's own allowed tokens, nothing shared between rows.

The masks are filled on the host when the batch is sampled (`apply`), each by its row's matcher, copied to the device
as packed bits (pinned and non-blocking on CUDA, like every other sampling input) and unpacked there into the row's
-inf mask, before the sampler's race (engine/sampler.py). A row whose request has no grammar is not touched, so its
bits are those it gets without any constrained neighbour.

With async scheduling (engine/llm_engine.py) a step is launched before the previous step's draws are read back; a
batch with a grammar row whose last token is such a draw is not `ready`: the runner then samples it after the read
back (model_runner.DeferredStep), while the step's forward pass is already running on the GPU.
"""
from __future__ import annotations

import torch

from samebits.arith import cdiv
from samebits.kernels.common import to_device
from samebits.structured.grammar import fill_rows

BITS = 32  # llguidance's mask word: bit t % 32 of word t // 32 is token t


def _bit_shifts(device) -> torch.Tensor:
    return torch.arange(BITS, dtype=torch.int32, device=device)


def unpack(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, cdiv(V, 32)] int32 words -> [R, V] bool, True where the token is allowed; elementwise, no reduction."""
    bits = (words.unsqueeze(-1) >> _bit_shifts(words.device)) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab].bool()


class GrammarRows:
    """The rows of a SamplingBatch whose sequence has a grammar (Sequence.grammar), with the positions they sample."""

    def __init__(self, rows: list[int], seqs: list, positions: list[int]):
        self.rows, self.seqs, self.positions = rows, seqs, positions

    @classmethod
    def of(cls, seqs, positions) -> GrammarRows | None:
        rows = [i for i, s in enumerate(seqs) if getattr(s, "grammar", None) is not None]
        if not rows:
            return None
        return cls(rows, [seqs[i] for i in rows], [positions[i] for i in rows])

    def ready(self) -> bool:
        """Every row's tokens before its position are read back (or the row already finished)."""
        return all(s.is_finished or s.num_resolved >= p for s, p in zip(self.seqs, self.positions))

    def host_words(self, vocab: int, pin: bool) -> torch.Tensor:
        """[R, cdiv(V, 32)] int32 masks filled by each row's own matcher; a finished row's (its draw is dropped)
        allows every token."""
        words = torch.full((len(self.rows), cdiv(vocab, BITS)), -1, dtype=torch.int32, pin_memory=pin)
        fill_rows(words, [(i, s, p) for i, (s, p) in enumerate(zip(self.seqs, self.positions)) if not s.is_finished])
        return words

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [B, V] with each grammar row's disallowed tokens at -inf; the other rows' bits untouched."""
        device, vocab = logits.device, logits.shape[-1]
        host = self.host_words(vocab, device.type == "cuda")
        words = host if device.type == "cpu" else host.to(device, non_blocking=True)
        index = to_device(self.rows, torch.int64, device)
        masked = logits.index_select(0, index).masked_fill(~unpack(words, vocab), float("-inf"))
        return logits.index_copy(0, index, masked)
