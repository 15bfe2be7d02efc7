"""Decode CUDA graphs: the static-buffer, padded-batch forward gives the eager forward's bits (CPU checks the
buffers and padding; the GPU test checks real graph replay against eager)."""
import random
from types import SimpleNamespace

import pytest
import torch

from samebits.engine.cuda_graphs import DecodeGraphs
from samebits.engine.llm import LLM
from samebits.engine.sampling_params import SamplingParams
from samebits.models.synthetic import write_tiny_checkpoint

SHAPE = {"hidden_size": 256, "intermediate_size": 512, "vocab_size": 1024, "num_attention_heads": 4,
         "num_key_value_heads": 2}


def decode_step(llm, prompts):
    """Run the engine until every request decodes; return the next (decode-only) scheduler output."""
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(f"g{i}", p, SamplingParams(max_tokens=50, ignore_eos=True))
    while True:
        out = engine.scheduler.schedule()
        if all(s.num_new_tokens == 1 for s in out.scheduled):
            return engine, out
        engine.scheduler.apply(out, engine.processor.process(out, engine.runner.execute(out).to_host()))


def test_static_padded_buffers_give_the_eager_bits(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path, "llama3", seed=2, **SHAPE)
    llm = LLM(model=str(ckpt), device="cpu", kv_cache_tokens=4096, max_model_len=512)
    prompts = [[5 + i] * (10 + 7 * i) for i in range(5)]
    engine, out = decode_step(llm, prompts)
    runner = engine.runner
    graphs = DecodeGraphs(runner.model, runner.kv_caches, runner.block_size, runner.scratch_block, 512, 8)
    assert graphs.graph_key(out) == (8, 512)  # the grid: max_model_len 512, under one split
    eager = runner.forward(out.scheduled)
    graphs.fill(out.scheduled, 8)
    padded = graphs.model.forward(graphs.ids[:8], graphs.positions[:8], graphs.kv_caches, graphs.meta(8))
    assert torch.equal(padded[:len(prompts)], eager)
    # Negative control: the same comparison catches a buffer filled one position off.
    graphs.positions[0] += 1
    shifted = graphs.model.forward(graphs.ids[:8], graphs.positions[:8], graphs.kv_caches, graphs.meta(8))
    assert not torch.equal(shifted[:len(prompts)], eager)


def test_prefill_steps_are_not_taken_by_graphs(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path, "llama3", seed=2, **SHAPE)
    llm = LLM(model=str(ckpt), device="cpu", kv_cache_tokens=4096, max_model_len=512)
    llm.engine.add_request("p", [3] * 20, SamplingParams(max_tokens=2))
    out = llm.engine.scheduler.schedule()
    graphs = DecodeGraphs(llm.engine.runner.model, llm.engine.runner.kv_caches, 16, 0, 512, 8)
    assert graphs.graph_key(out) is None


def test_padded_decode_steps_run_eagerly(tmp_path):
    """A step the bucketed policy padded keeps its fixed eager shape; the same step unpadded replays a graph."""
    ckpt = write_tiny_checkpoint(tmp_path, "llama3", seed=2, **SHAPE)
    llm = LLM(model=str(ckpt), device="cpu", kv_cache_tokens=4096, max_model_len=512, policy="bucketed",
              max_num_seqs=8, max_num_batched_tokens=64)
    engine, out = decode_step(llm, [[5 + i] * (10 + 7 * i) for i in range(3)])
    graphs = DecodeGraphs(engine.runner.model, engine.runner.kv_caches, 16, 0, 512, 8)
    assert out.kind == "decode" and len(out.scheduled) + len(out.padding) == 8 and out.padding
    assert graphs.graph_key(out) is None
    out.padding = ()
    assert graphs.graph_key(out) is not None


@pytest.mark.gpu
def test_graph_replay_equals_eager_on_cuda(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path, "llama3", seed=2, torch_dtype="bfloat16", **SHAPE)
    prompts = [[7 + i] * (20 + 25 * i) for i in range(19)]  # longest 470 + 24 tokens: inside max_model_len 512
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=24, logprobs=0, ignore_eos=True)
    eager, graphed, graphs = eager_and_graphed(ckpt, prompts, params, max_num_seqs=32)
    assert graphs, "no graph was captured"
    assert graphed == eager


def eager_and_graphed(ckpt, prompts, params, max_num_seqs: int):
    """Each request's tokens and logprob bits with CUDA graphs off, then on; and the graphs' keys."""
    runs = {}
    for graphs in (False, True):
        llm = LLM(model=str(ckpt), device="cuda", cuda_graphs=graphs, kv_cache_tokens=16384, max_num_seqs=max_num_seqs)
        outs = llm.generate(prompts, params, use_tqdm=False)
        # Logprobs as int32 bit patterns: == on floats would let a -0.0 / 0.0 difference pass.
        runs[graphs] = [(o.outputs[0].token_ids, float32_bits(o.outputs[0].token_logprobs)) for o in outs]
    return runs[False], runs[True], set(llm.engine.runner.graphs.graphs)


@pytest.mark.gpu
def test_graphs_of_each_grid_length_equal_eager_on_cuda(tmp_path, monkeypatch):
    """Contexts that cross the KV split while decoding take graphs of two grid lengths (one split, folded; two, in
    parallel and merged): every token and logprob bit equals eager."""
    from samebits.engine.cuda_graphs import SPLIT_TOKENS
    from samebits.kernels.triton import attention

    ckpt = write_tiny_checkpoint(tmp_path, "llama3", seed=4, torch_dtype="bfloat16", max_position_embeddings=4096,
                                 **SHAPE)
    # 994..1014 tokens, 40 more each: the longest context crosses the split after the first decode steps.
    prompts = [[3 + i] * (SPLIT_TOKENS - 30 + 4 * i) for i in range(6)]
    params = SamplingParams(temperature=0.8, seed=9, max_tokens=40, logprobs=0, ignore_eos=True)
    eager, graphed, graphs = eager_and_graphed(ckpt, prompts, params, max_num_seqs=8)
    lens = {grid for _, grid in graphs}
    assert lens == {SPLIT_TOKENS, 2 * SPLIT_TOKENS}, f"graphs captured for grid lengths {lens}"
    assert graphed == eager
    # Negative control: the same comparison sees another fold order (512-token splits) inside the graphs.
    monkeypatch.setattr(attention, "SPLIT", SPLIT_TOKENS // 2)
    _, other, _ = eager_and_graphed(ckpt, prompts, params, max_num_seqs=8)
    assert other != eager


def test_a_graph_grid_covers_the_longest_context_in_doubling_splits(tmp_path):
    """grid_len: the KV split times a power of two, at least the longest context, at most max_model_len; a step's
    graph key changes when its longest context crosses a split, not with every token."""
    from samebits.engine.cuda_graphs import SPLIT_TOKENS as S

    def graphs(max_model_len):
        return DecodeGraphs(SimpleNamespace(device="cpu"), None, 16, 0, max_model_len, 8)

    g = graphs(8 * S)
    assert [g.grid_len(n) for n in (1, S, S + 1, 3 * S, 4 * S + 1, 8 * S)] == [S, S, 2 * S, 4 * S, 8 * S, 8 * S]
    assert graphs(3 * S).grid_len(2 * S + 5) == 3 * S and graphs(S // 2).grid_len(10) == S // 2
    steps = [[_decode_item([0], p) for p in (5, S - 1 + d)] for d in range(3)]  # the longest context S-1+d+1
    assert [g.graph_key(SimpleNamespace(scheduled=s, padding=())) for s in steps] == [(2, S), (2, 2 * S), (2, 2 * S)]


def float32_bits(values: list[float]) -> list[int]:
    return torch.tensor(values, dtype=torch.float32).view(torch.int32).tolist()


def test_float32_bits_tell_signed_zeros_apart():
    assert float32_bits([0.0]) != float32_bits([-0.0]) and float32_bits([-0.5]) == float32_bits([-0.5])


def _decode_item(table: list[int], position: int):
    return SimpleNamespace(seq=SimpleNamespace(block_table=table), start=position, token_ids=[7], num_new_tokens=1)


def test_partial_width_fill_leaves_the_full_width_tables(seed):
    """fill writes only the columns some step used; the tables read by a graph equal a full max_model_len write."""
    rng = random.Random(seed)
    graphs = DecodeGraphs(SimpleNamespace(device=torch.device("cpu")), None, 16, 99, 512, 8)
    for _ in range(20):
        n, bs = rng.randint(1, 8), 8
        items = [_decode_item([rng.randrange(90) for _ in range(rng.randint(1, 20))], 0) for _ in range(n)]
        graphs.fill(items, bs)
        want = [it.seq.block_table + [99] * (graphs.width - len(it.seq.block_table)) for it in items]
        want += [[99] * graphs.width] * (bs - n)
        assert torch.equal(graphs.tables[:bs], torch.tensor(want, dtype=torch.int32))
    assert graphs.written < graphs.width  # the point: short tables never paid for max_model_len columns
    # Negative control: forgetting the columns an earlier step wrote leaves its block ids behind.
    graphs.fill([_decode_item(list(range(20)), 0)], 1)
    graphs.written = 0
    graphs.fill([_decode_item([5], 0)], 1)
    assert not torch.equal(graphs.tables[:1], torch.tensor([[5] + [99] * (graphs.width - 1)], dtype=torch.int32))


def test_a_voided_capture_is_retried_then_that_size_stays_eager(tmp_path, monkeypatch):
    """A capture another thread voided must not leave decode eager forever: retried, bounded, per batch size."""
    from samebits.engine.cuda_graphs import CAPTURE_ATTEMPTS

    ckpt = write_tiny_checkpoint(tmp_path, "llama3", seed=2, **SHAPE)
    llm = LLM(model=str(ckpt), device="cpu", kv_cache_tokens=4096, max_model_len=512)
    engine, out = decode_step(llm, [[5 + i] * (10 + 7 * i) for i in range(5)])
    runner = engine.runner
    runner.graphs = graphs = DecodeGraphs(runner.model, runner.kv_caches, runner.block_size, runner.scratch_block,
                                          512, 8)

    def voided(key):
        raise RuntimeError("operation failed due to a previous error during capture")

    monkeypatch.setattr(graphs, "capture", voided)
    for attempt in range(CAPTURE_ATTEMPTS):
        key = graphs.graph_key(out)
        assert key is not None, f"attempt {attempt}: the size is still tried"
        with pytest.warns(UserWarning, match="retried"):
            assert runner._graph_forward(out.scheduled, key, None) is None
        assert runner.graphs is graphs, "one failure keeps the graphs"
    assert graphs.failed_captures[key] == CAPTURE_ATTEMPTS and graphs.graph_key(out) is None


@pytest.mark.gpu
def test_the_cuda_page_size_does_not_change_an_engines_bits(tmp_path, monkeypatch):
    """The CUDA default page (64 tokens: one block id per KV tile) against 16-token pages, eagerly: every request's
    tokens and logprob bits. Negative control: the same comparison sees 256-token splits (prompts up to 494 tokens)."""
    from samebits.kernels.triton import attention

    ckpt = write_tiny_checkpoint(tmp_path, "llama3", seed=2, torch_dtype="bfloat16", **SHAPE)
    prompts = [[7 + i] * (20 + 25 * i) for i in range(19)]
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=24, logprobs=0, ignore_eos=True)

    def bits(block_size):
        llm = LLM(model=str(ckpt), device="cuda", block_size=block_size, cuda_graphs=False, kv_cache_tokens=16384)
        assert llm.engine.config.block_size == (block_size or 64)
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [(o.outputs[0].token_ids, float32_bits(o.outputs[0].token_logprobs)) for o in outs]

    pages16 = bits(16)
    assert bits(None) == pages16
    monkeypatch.setattr(attention, "SPLIT", 256)
    assert bits(None) != pages16
