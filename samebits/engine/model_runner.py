"""Turns one scheduled step into one model call: flatten the scheduled tokens, run, sample the rows that end a prompt."""
from __future__ import annotations

import itertools
import warnings

import torch

from samebits.arith import cdiv
from samebits.engine.config import EngineConfig
from samebits.engine.outputs import PromptStepResult, StepResult
from samebits.engine.prompt_logprobs import PromptRowsPlan, PromptScores, score_prompt_rows
from samebits.engine.sampler import Sampler, SamplerOutput, SamplingBatch, teacher_forced
from samebits.engine.sequence import PENDING
from samebits.engine.spec_decode.verify import accepted_prefix
from samebits.kernels.attention import AttentionMetadata
from samebits.kernels.common import to_device
from samebits.kernels.kv_cache import allocate_kv_cache
from samebits.kernels.proofs import prove_routes

# KV pool when kv_cache_tokens is not set: a fixed size on CPU, a share of free memory on GPU.
CPU_KV_TOKENS = 16384
GPU_KV_MEMORY_FRACTION = 0.80


class SampledStep:
    """One step's draws, and its prompt-logprob rows if any asked. They are copied to the host as soon as they are
    enqueued, behind one event, so reading back waits for this step alone, never for a step launched after it (async
    scheduling, llm_engine.py)."""

    def __init__(self, seqs: list, out: SamplerOutput | None = None, prompt: PromptScores | None = None,
                 drafts: list[tuple[int, ...]] | None = None):
        self.seqs = seqs  # the sampled sequences, in row order
        self.out = out  # stays on the device: the next step reads its pending tokens from it
        # Per sequence the drafts its chunk verifies, its rows then 1 + len(drafts) from row[seq_id]. The pending
        # filler reads row[seq_id] as the sequence's one draw: a verify step is never launched ahead of its read-back.
        self.drafts = drafts or [()] * len(seqs)
        self.row = dict(zip((s.seq_id for s in seqs), itertools.accumulate((len(d) + 1 for d in self.drafts),
                                                                           initial=0)))
        # (drafted, accepted) per verify chunk, filled by to_host (engine/spec_decode/verify.py SpecDecodeStats).
        self.verified: list[tuple[int, int]] = []
        self._host = None if out is None else [
            _copy_to_host(t) for t in (out.token_ids, out.logprobs, out.top_logprob_ids, out.top_logprobs)]
        self._ranks = None if out is None or out.ranks is None else _copy_to_host(out.ranks)
        self._prompt = None if prompt is None else (prompt.plan, [_copy_to_host(t) for t in prompt.tensors()])
        self._ready = None
        if (out is not None and out.token_ids.is_cuda) or (prompt is not None and prompt.logprobs.is_cuda):
            self._ready = torch.cuda.Event()
            self._ready.record()

    def _wait(self) -> None:
        if self._ready is not None:
            self._ready.synchronize()

    def complete(self) -> SampledStep:
        return self

    def to_host(self) -> dict[int, StepResult | list[StepResult]]:
        """StepResult per sampled sequence, by seq_id; for a chunk that verified drafts, those of its accepted drafts
        and its bonus token (verify.py); top-logprobs cut to each sequence's own count."""
        if self._host is None:
            return {}
        self._wait()
        # tolist turns float32 into the Python floats of exactly those values: no bit is lost.
        tokens, lps, ids, vals = (t.tolist() for t in self._host)
        ranks = self._ranks.tolist() if self._ranks is not None else [None] * len(tokens)

        def result(i: int, k: int | None) -> StepResult:
            return StepResult(tokens[i], lps[i], dict(zip(ids[i][:k], vals[i][:k])) if k else {},
                              ranks[i] if k is not None else None)

        results, self.verified = {}, []
        for s, drafts in zip(self.seqs, self.drafts):
            first, k = self.row[s.seq_id], s.params.logprobs
            if not drafts:
                results[s.seq_id] = result(first, k)
                continue
            accepted = accepted_prefix(drafts, tokens[first:first + len(drafts)])
            self.verified.append((len(drafts), accepted))
            results[s.seq_id] = [result(i, k) for i in range(first, first + accepted + 1)]
        return results

    def prompt_to_host(self) -> dict[int, PromptStepResult]:
        """The step's prompt-logprob rows per sequence, by seq_id (empty when no chunk had any)."""
        if self._prompt is None:
            return {}
        self._wait()
        return PromptScores.results(*self._prompt)


class DeferredStep:
    """A step launched whose sampling waits for the previous step's read-back: a grammar row's mask needs the token
    that step drew (structured/masks.py). The engine completes it after that read-back, while the GPU runs its
    forward pass; a step is completed before the next one is launched or read back."""

    def __init__(self, sample):
        self._sample = sample

    def complete(self) -> SampledStep:
        return self._sample()


def _copy_to_host(t: torch.Tensor) -> torch.Tensor:
    if not t.is_cuda:
        return t
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)


def flatten(scheduled, padding: tuple[int, ...], scratch_block: int, block_size: int):
    """A step's chunks as one batch: token ids, positions, query and context lengths, block tables; then the padding
    dummies. A dummy sees only itself; its rows wrap onto the one scratch block, whose contents nobody reads."""
    ids, pos, q_lens, ctx_lens, tables = [], [], [], [], []
    for s in scheduled:
        ids += s.token_ids
        pos += range(s.start, s.context_len)
        q_lens.append(s.num_new_tokens)
        ctx_lens.append(s.context_len)
        tables.append(s.seq.block_table)
    for k in padding:
        ids += [0] * k
        pos += range(k)
        q_lens.append(k)
        ctx_lens.append(k)
        tables.append([scratch_block] * cdiv(k, block_size))
    return ids, pos, q_lens, ctx_lens, tables


def sampling_batch(items, eos_token_ids) -> SamplingBatch:
    """The SamplingBatch of the scheduled chunks `items` that sample: one row each, drawn at the chunk's end (not
    seq.num_tokens, which counts the pending slots), and before it one per verified draft, drawn where it sits."""
    rows = [(s.seq, p) for s in items for p in range(s.context_len - len(s.drafts), s.context_len + 1)]
    seqs = [seq for seq, _ in rows]
    return SamplingBatch.of([s.params for s in seqs], [s.seed for s in seqs], [s.sample_index for s in seqs],
                            [p for _, p in rows], seqs, eos_token_ids)


def sampled_rows(scheduled, ends: list[int]) -> list[int]:
    """The rows of a step's flattened batch that sample, in sampling_batch's order: each sampling chunk's last, and
    before it one per draft it verifies."""
    return [r for s, end in zip(scheduled, ends) if s.sample for r in range(end - 1 - len(s.drafts), end)]


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * elem


def model_bytes(model) -> int:
    """Device bytes of a model's weights and buffers: what an engine holds before its KV cache."""
    return sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))


def choose_num_blocks(engine_config: EngineConfig, model_config, dtype: torch.dtype, device: torch.device,
                      weights_bytes: int = 0) -> int:
    """KV pages: kv_cache_tokens' if set; on the CPU a fixed pool; on CUDA a share of the free memory, or with
    gpu_memory_utilization (vLLM's) that share of what the budget leaves past this engine's weights, never more than
    the free memory allows: two engines of 0.45 each fit one GPU."""
    bs = engine_config.block_size
    if engine_config.kv_cache_tokens is not None:
        return engine_config.kv_cache_tokens // bs
    if device.type != "cuda":
        return CPU_KV_TOKENS // bs
    free, total = torch.cuda.mem_get_info(device)
    kv_bytes = free * GPU_KV_MEMORY_FRACTION
    util = engine_config.gpu_memory_utilization
    if util is not None:
        left = total * util - weights_bytes
        if left <= 0:
            raise ValueError(f"gpu_memory_utilization={util} gives this engine {total * util / 2**30:.1f} GiB of the "
                             f"GPU's {total / 2**30:.1f} GiB; its weights alone take {weights_bytes / 2**30:.1f} GiB")
        kv_bytes = min(kv_bytes, left * GPU_KV_MEMORY_FRACTION)
    return int(kv_bytes) // (kv_bytes_per_token(model_config, dtype) * bs)


class ModelRunner:
    def __init__(self, engine_config: EngineConfig, loaded):
        self.config = engine_config
        self.model = loaded.model
        self.model_config = loaded.config
        self.device = self.model.device
        self.dtype = self.model.dtype
        self.block_size = engine_config.block_size
        self.prove_routes()
        self.num_blocks = choose_num_blocks(engine_config, self.model_config, self.dtype, self.device,
                                            model_bytes(self.model))
        mc = self.model_config
        # One block past the managed pool is scratch: bucketed padding rows write their KV there.
        self.scratch_block = self.num_blocks
        self.kv_caches = allocate_kv_cache(mc.num_layers, self.num_blocks + 1, self.block_size, mc.num_kv_heads,
                                           mc.head_dim, self.dtype, self.device)
        self.sampler = Sampler(self.model.ops)
        self.eos_token_ids = tuple(sorted(loaded.tokenizer.eos_token_ids))  # what min_tokens masks, as the stop rule
        self.graphs = self.verify_graphs = None

    def prove_routes(self) -> None:
        m = self.model
        prove_routes(m.ops, m.device, m.gemm_weights(), m.config.head_dim)

    def enable_cuda_graphs(self, max_model_len: int) -> None:
        """Decode-only steps replay CUDA graphs (see cuda_graphs.py); a no-op off CUDA."""
        if self.device.type != "cuda":
            return
        from samebits.engine.cuda_graphs import DecodeGraphs

        args = self.model, self.kv_caches, self.block_size, self.scratch_block, max_model_len, self.config.max_num_seqs
        self.graphs = DecodeGraphs(*args)
        spec = self.config.speculative_config
        if spec is not None:  # steps that verify drafts: a graph of 1 + k rows a sequence (spec_decode/graphs.py)
            from samebits.engine.spec_decode.graphs import VerifyGraphs

            self.verify_graphs = VerifyGraphs(*args, spec.num_speculative_tokens)

    def set_ops(self, ops) -> None:
        self.model.set_ops(ops)
        self.sampler = Sampler(ops)
        self.prove_routes()  # before any recapture: a graph only takes cuBLASLt for shapes already proven
        if self.graphs is not None:  # captured graphs hold the old kernels
            self.enable_cuda_graphs(self.graphs.max_model_len)

    @torch.inference_mode()
    def forward(self, scheduled, padding: tuple[int, ...] = (), fill_pending=None) -> torch.Tensor:
        """Hidden states [T, H] of every scheduled token in schedule order, then the padding dummies' rows.
        `fill_pending(input_ids)` writes the ids still on the device (see `execute`)."""
        ids, pos, q_lens, ctx_lens, tables = flatten(scheduled, padding, self.scratch_block, self.block_size)
        meta = AttentionMetadata.build(q_lens, ctx_lens, tables, self.block_size, self.device)
        input_ids = to_device(ids, torch.int64, self.device)
        positions = to_device(pos, torch.int64, self.device)
        if fill_pending is not None:
            fill_pending(input_ids)
        return self.model.forward(input_ids, positions, self.kv_caches, meta)

    @torch.inference_mode()
    def execute(self, output, previous: SampledStep | None = None) -> SampledStep:
        """Run one scheduled step and sample the sequences whose chunk reaches their last token. A chunk whose last
        token is still pending takes it from `previous`, the step before, on the device: no read-back in between."""
        scheduled = output.scheduled
        if not scheduled:
            return SampledStep([])
        # The last row of each chunk; known on the host, so one small copy, no device scan.
        ends = list(itertools.accumulate(s.num_new_tokens for s in scheduled))
        fill = self._pending_filler(scheduled, ends, previous)
        hidden = None
        for graphs in (self.graphs, self.verify_graphs):
            key = graphs.graph_key(output) if graphs is not None else None
            if key is not None:
                hidden = self._graph_forward(output.scheduled, key, fill, graphs)
                break
        if hidden is None:
            hidden = self.forward(scheduled, output.padding, fill)
        prompt = self._prompt_scores(hidden, PromptRowsPlan.of(scheduled, ends))
        items = [s for s in scheduled if s.sample]
        if not items:
            return SampledStep([], None, prompt)
        rows = to_device(sampled_rows(scheduled, ends), torch.int64, self.device)
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        seqs, batch = [s.seq for s in items], sampling_batch(items, self.eos_token_ids)
        drafts = [s.drafts for s in items]
        if batch.grammar is not None and not batch.grammar.ready():
            return DeferredStep(lambda: SampledStep(seqs, self._draw(logits, batch, items), prompt, drafts))
        return SampledStep(seqs, self._draw(logits, batch, items), prompt, drafts)

    def _draw(self, logits: torch.Tensor, batch: SamplingBatch, items) -> SamplerOutput:
        """Every sampled row's draw, a verified draft's row included: the sampler's own, so each is the draw plain
        decoding makes at that position (engine/spec_decode/verify.py). The seam the negative control replaces with
        standard speculative sampling, which reads `items`' drafts."""
        return self.sampler(logits, batch)

    def _prompt_scores(self, hidden: torch.Tensor, plan: PromptRowsPlan | None) -> PromptScores | None:
        """The prompt-logprob rows' scores, apart from the sampled rows so theirs run exactly as without them."""
        if plan is None:
            return None
        rows = to_device(plan.rows, torch.int64, self.device)
        return score_prompt_rows(lambda a, b: self.model.compute_logits(hidden.index_select(0, rows[a:b])), plan,
                                 self.sampler.ops)

    def _pending_filler(self, scheduled, ends: list[int], previous: SampledStep | None):
        """A function writing, into a step's input ids, the pending tokens `previous` drew; None if there are none."""
        where, rows = [], []
        drawn_rows = previous.row if previous is not None else {}
        for s, end in zip(scheduled, ends):
            if s.seq.token_ids[s.context_len - 1] == PENDING:
                row = drawn_rows.get(s.seq.seq_id)
                if row is None:
                    raise RuntimeError(f"{s.seq!r}: its pending token was not drawn by the previous step")
                where.append(end - 1)
                rows.append(row)
        if not where:
            return None
        index = to_device([where, rows], torch.int64, self.device)
        drawn = previous.out.token_ids

        def fill(input_ids: torch.Tensor) -> None:
            input_ids.index_copy_(0, index[0], drawn.index_select(0, index[1]))

        return fill

    def _graph_forward(self, scheduled, key, fill, graphs=None):
        """`graphs` (the decode graphs by default, or the verify graphs) replayed for the step; None when its capture
        failed."""
        try:
            return (graphs or self.graphs).forward(scheduled, key, fill)
        except RuntimeError as e:  # a capture failure costs speed, never bits: eager computes the same rows
            warnings.warn(f"CUDA graph capture failed ({e}); this step runs eagerly and the capture is retried "
                          "(cuda_graphs.CAPTURE_ATTEMPTS)", stacklevel=2)
            return None

    @torch.inference_mode()
    def score_rows(self, item, skip: int, targets: list[int]) -> list[float]:
        """Teacher-forced logprobs of targets by rows skip.. of one chunk, through the sampler's own log_softmax."""
        hidden = self.forward([item])[skip:skip + len(targets)]
        return teacher_forced(self.model.compute_logits(hidden), targets, self.model.ops)
