"""vLLM's "draft_model" method: a smaller model with the target's vocabulary proposes its greedy continuation.

The draft runs in the engine's process on the target's device, on its own paged KV cache and block manager (no prefix
caching), one shadow sequence per decoding target sequence. Each step a shadow is first brought level with its
target: the tokens they share stay computed, the rest of the target's (the accepted drafts and the bonus token, or a
whole prompt the first time) is computed in chunks of at most max_num_batched_tokens rows, whose last row gives the
first draft; k - 1 one-row steps give the others. Its bits never reach an output, only the acceptance rate: the
target draws every kept token itself (verify.py). A shadow that finds no free block is dropped and drafts nothing.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from samebits.engine.model_runner import GPU_KV_MEMORY_FRACTION, ModelRunner, kv_bytes_per_token
from samebits.engine.scheduler.batch import ScheduledSeq
from samebits.engine.scheduler.block_manager import BlockManager
from samebits.engine.sequence import Sequence
from samebits.engine.spec_decode.config import FIELD
from samebits.kernels.common import to_device


def load_draft(name_or_path: str, mode: str, target):
    """The draft model on the target's device and dtype; the target itself when it names the target's weights."""
    from samebits.models.loader import load_model, resolve_path

    if Path(resolve_path(name_or_path)[1]).resolve() == Path(target.path).resolve():
        return target
    dtype = str(target.model.dtype).removeprefix("torch.")
    draft = load_model(name_or_path, mode, str(target.model.device), dtype)
    check_vocabulary(draft, target)
    return draft


def check_vocabulary(draft, target) -> None:
    """A draft token is verified as a target token id: both models must read ids as the same tokens."""
    d, t = draft.config.vocab_size, target.config.vocab_size
    if d != t:
        raise ValueError(f"{FIELD}.model: the draft model's vocab_size {d} differs from the target's {t}; a draft "
                         "model must share the target's tokenizer")
    if draft.tokenizer.backend.get_vocab(True) != target.tokenizer.backend.get_vocab(True):
        raise ValueError(f"{FIELD}.model: the draft model's tokenizer maps tokens to other ids than the target's; a "
                         "draft model must share the target's tokenizer")


def draft_kv_tokens(engine_config, loaded, num_tokens: int) -> int:
    """The draft's KV pool: as many tokens as the target's, or on CUDA what the free memory holds of them."""
    bs = engine_config.block_size
    if loaded.model.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(loaded.model.device)
        per_token = kv_bytes_per_token(loaded.config, loaded.model.dtype)
        num_tokens = min(num_tokens, int(free * GPU_KV_MEMORY_FRACTION) // per_token // bs * bs)
    if num_tokens < bs:
        raise ValueError(f"{FIELD}.model: no device memory is left for the draft model's KV cache")
    return num_tokens


@dataclasses.dataclass(eq=False)
class _Shadow:
    seq: Sequence  # the draft's copy of the target's tokens, then its own drafts
    level: int  # leading tokens known to equal the target's (its resolved tokens never change)


class DraftModelDrafter:
    def __init__(self, num_speculative_tokens: int, loaded, engine_config, num_tokens: int, max_model_len: int):
        self.k = num_speculative_tokens
        config = engine_config.replace(speculative_config=None, cuda_graphs=False,
                                       kv_cache_tokens=draft_kv_tokens(engine_config, loaded, num_tokens))
        self.runner = ModelRunner(config, loaded)
        self.bm = BlockManager(self.runner.num_blocks, config.block_size, enable_prefix_caching=False)
        self.budget = engine_config.max_num_batched_tokens
        # The draft computes positions up to num_tokens + k - 2: within its own rope table and the target's context.
        self.max_len = min(max_model_len, loaded.config.max_position_embeddings)
        self._shadows: dict[int, _Shadow] = {}

    def propose(self, seqs: list[Sequence]) -> dict[int, list[int]]:
        """seq_id -> its drafts (up to k greedy tokens), for each decoding sequence of `seqs` that can draft; the
        shadows of the others are dropped."""
        old, self._shadows = self._shadows, {}
        for seq in seqs:
            limit = min(self.k, self.max_len - seq.num_tokens)
            if limit > 0:
                self._shadows[seq.seq_id] = self._level(old.pop(seq.seq_id, None), seq.token_ids)
        for shadow in old.values():
            self.bm.free(shadow.seq)
        drafts = self._catch_up()
        for step in range(1, self.k):
            going = [i for i, d in drafts.items()
                     if len(d) == step and i in self._shadows and step < self.max_len - self._shadows[i].level]
            self._extend(going, drafts)
        return drafts

    def _level(self, shadow: _Shadow | None, tokens: list[int]) -> _Shadow:
        """A shadow whose tokens are `tokens`, computed as far as it already agreed with them (all but the last at
        most, whose row gives the first draft)."""
        if shadow is None:
            seq = Sequence("draft", list(tokens))
            self.bm.allocate(seq, 0)
            return _Shadow(seq, len(tokens))
        seq, same = shadow.seq, shadow.level
        while same < min(seq.num_tokens, len(tokens)) and seq.token_ids[same] == tokens[same]:
            same += 1
        seq.token_ids[same:] = tokens[same:]
        seq.num_computed_tokens = min(seq.num_computed_tokens, same, len(tokens) - 1)
        self.bm.trim(seq)
        shadow.level = len(tokens)
        return shadow

    def _catch_up(self) -> dict[int, list[int]]:
        """Compute every shadow's uncomputed tokens, max_num_batched_tokens rows a forward; the first drafts."""
        drafts: dict[int, list[int]] = {}
        todo = list(self._shadows)
        while todo:
            budget, items, ids = self.budget, [], []
            for i in todo:
                seq = self._shadows[i].seq
                n = min(seq.num_uncomputed, budget)
                if n and self._room(i, n):
                    items.append(self._item(seq, n))
                    ids.append(i)
                    budget -= n
            for i, token in zip([i for i, s in zip(ids, items) if s.sample], self._greedy(items)):
                drafts[i] = [token]
                self._shadows[i].seq.token_ids.append(token)
            todo = [i for i in todo if i in self._shadows and i not in drafts]
        return drafts

    def _extend(self, going: list[int], drafts: dict[int, list[int]]) -> None:
        """One more draft for each of `going`: its last draft computed in one one-row forward."""
        items, ids = [], []
        for i in going:
            if self._room(i, 1):
                items.append(self._item(self._shadows[i].seq, 1))
                ids.append(i)
        for i, token in zip(ids, self._greedy(items)):
            drafts[i].append(token)
            self._shadows[i].seq.token_ids.append(token)

    def _room(self, seq_id: int, n: int) -> bool:
        """Blocks for n more tokens of the shadow; one that finds none is dropped (it drafts nothing this step)."""
        seq = self._shadows[seq_id].seq
        if self.bm.can_append(seq, n):
            self.bm.append_slots(seq, n)
            return True
        self.bm.free(seq)
        del self._shadows[seq_id]
        return False

    @staticmethod
    def _item(seq: Sequence, n: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        seq.num_computed_tokens += n
        return ScheduledSeq(seq, n, start + n == seq.num_tokens, start)

    @torch.inference_mode()
    def _greedy(self, items: list[ScheduledSeq]) -> list[int]:
        """The draft's argmax after each sampling chunk of `items`, run as one forward."""
        if not items:
            return []
        hidden = self.runner.forward(items)
        ends, rows = 0, []
        for s in items:
            ends += s.num_new_tokens
            if s.sample:
                rows.append(ends - 1)
        if not rows:
            return []
        index = to_device(rows, torch.int64, hidden.device)
        return self.runner.model.compute_logits(hidden.index_select(0, index)).argmax(dim=-1).tolist()
