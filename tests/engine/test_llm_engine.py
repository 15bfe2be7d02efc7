"""LLMEngine behaviour that the invariance suite does not cover: text, stop strings, validation, abort, score errors."""
import pytest

from samebits.engine.llm import LLM
from samebits.engine.sampling_params import SamplingParams
from samebits.models.synthetic import write_tiny_checkpoint


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "llama3", seed=3)
    return LLM(model=str(path), device="cpu", kv_cache_tokens=4096, max_model_len=256)


def test_incremental_text_equals_full_decode(llm):
    params = SamplingParams(temperature=1.0, seed=4, max_tokens=40, ignore_eos=True)
    for out in llm.generate(["hello world", "the cat sat on the mat"], params, use_tqdm=False):
        c = out.outputs[0]
        assert c.text == llm.tokenizer.decode(c.token_ids)


def test_stop_string_truncates_and_reports(llm):
    params = SamplingParams(temperature=1.0, seed=4, max_tokens=40, ignore_eos=True)
    full = llm.generate(["hello world"], params, use_tqdm=False)[0].outputs[0].text
    stop = full[10:13]
    assert stop and stop in full
    cut = llm.generate(["hello world"], SamplingParams(temperature=1.0, seed=4, max_tokens=40, ignore_eos=True,
                                                       stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == full[:full.find(stop)]


def test_length_limit_message_names_the_numbers(llm):
    with pytest.raises(ValueError, match="maximum context length is 256 tokens.*300 tokens"):
        llm.generate([[5] * 100], SamplingParams(max_tokens=200), use_tqdm=False)


def test_out_of_vocabulary_token_is_refused(llm):
    with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, 320\)"):
        llm.generate([[5, 320]], SamplingParams(max_tokens=2), use_tqdm=False)


def test_abort_frees_every_block(llm):
    engine = llm.engine
    engine.add_request("a", [5] * 50, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.scheduler.bm.usage > 0
    engine.abort_request("a")
    assert not engine.has_unfinished_requests()
    engine.scheduler.bm.check_integrity()
    assert all(b.ref_count == 0 for b in engine.scheduler.bm.blocks)


def test_score_rejects_empty_completion(llm):
    with pytest.raises(ValueError, match="completion_token_ids must not be empty"):
        llm.score([1, 2, 3], [])


def _generated(outs) -> list[tuple[list[int], list[int], str]]:
    return [(o.prompt_token_ids, o.outputs[0].token_ids, o.outputs[0].text) for o in outs]


def test_vllm_prompt_dicts_equal_plain_prompts(llm):
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)
    ids = llm.get_tokenizer().encode("hello world")
    plain = _generated(llm.generate(["hello world", ids], params, use_tqdm=False))
    assert _generated(llm.generate([{"prompt": "hello world"}, {"prompt_token_ids": ids}], params,
                                   use_tqdm=False)) == plain
    assert _generated(llm.generate({"prompt": "hello world"}, params, use_tqdm=False)) == plain[:1]
    assert _generated(llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)) == plain[1:]
    assert llm.generate({"prompt": "hello world"}, params, use_tqdm=False)[0].prompt == "hello world"
    with pytest.raises(ValueError, match="prompt: a dict prompt holds exactly one of"):
        llm.generate({"prompt": "x", "prompt_token_ids": ids}, params, use_tqdm=False)


def test_get_tokenizer_is_the_engine_tokenizer(llm):
    assert llm.get_tokenizer() is llm.engine.tokenizer


def test_chat_content_parts_and_template_options(llm):
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    text = [{"role": "user", "content": "hello world"}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}]
    assert _generated(llm.chat(parts, params, use_tqdm=False)) == _generated(llm.chat(text, params, use_tqdm=False))
    tok = llm.get_tokenizer()
    with_prompt = llm.chat(text, params, use_tqdm=False)[0].prompt_token_ids
    without = llm.chat(text, params, use_tqdm=False, add_generation_prompt=False)[0].prompt_token_ids
    for ids, gen in ((with_prompt, True), (without, False)):
        assert ids == tok.encode(tok.apply_chat_template(text, add_generation_prompt=gen), add_special_tokens=False)
    assert without != with_prompt
    opened = text + [{"role": "assistant", "content": "The answer is"}]
    cont = llm.chat(opened, params, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)
    assert tok.decode(cont[0].prompt_token_ids, skip_special_tokens=False).endswith("assistant\nThe answer is")
    with pytest.raises(ValueError, match="continue_final_message cannot be combined with add_generation_prompt"):
        llm.chat(opened, params, use_tqdm=False, continue_final_message=True)
    with pytest.raises(ValueError, match=r"messages\[0\].content: only text parts"):
        llm.chat([{"role": "user", "content": [{"type": "image_url"}]}], params, use_tqdm=False)
    with pytest.raises(ValueError, match="chat_template_kwargs may not set 'tools'"):
        llm.chat(text, params, use_tqdm=False, chat_template_kwargs={"tools": [{}]})


def test_include_stop_str_and_special_tokens_end_to_end(llm):
    base = {"temperature": 1.0, "seed": 4, "max_tokens": 40, "ignore_eos": True}
    full = llm.generate(["hello world"], SamplingParams(**base), use_tqdm=False)[0].outputs[0].text
    stop = full[10:13]
    kept = llm.generate(["hello world"], SamplingParams(**base, stop=[stop], include_stop_str_in_output=True),
                        use_tqdm=False)[0].outputs[0]
    assert kept.text == full[:full.find(stop) + len(stop)] and kept.stop_reason == stop
    raw = llm.generate(["hello world"], SamplingParams(**base, skip_special_tokens=False), use_tqdm=False)[0].outputs[0]
    assert raw.text == llm.tokenizer.decode(raw.token_ids, skip_special_tokens=False)


def test_final_only_returns_the_finished_output_alone_with_the_cumulative_bits(llm):
    """RequestOutputKind.FINAL_ONLY (what LLM.generate asks for): one output, the finished one, equal bit for bit to
    the last cumulative output of the same request; a CUMULATIVE neighbour still gets every step's (the control)."""
    import struct

    from samebits.engine.sampling_params import RequestOutputKind
    from tests.engine.drive import drive

    kw = {"temperature": 1.0, "seed": 11, "max_tokens": 12, "logprobs": 2, "ignore_eos": True}
    seen: dict[str, int] = {}
    final = drive(llm.engine, [([5, 6, 7], SamplingParams(**kw, output_kind=RequestOutputKind.FINAL_ONLY)),
                               ([5, 6, 7], SamplingParams(**kw))],
                  on_output=lambda out: seen.__setitem__(out.request_id, seen.get(out.request_id, 0) + 1))
    assert seen["r0"] == 1 and seen["r1"] == 12
    a, b = (final[r].outputs[0] for r in ("r0", "r1"))

    def bits(values):
        return [struct.pack("<d", v) for v in values]

    assert (a.token_ids, a.text, a.top_logprobs) == (b.token_ids, b.text, b.top_logprobs)
    assert bits(a.token_logprobs) == bits(b.token_logprobs)
    assert bits([a.cumulative_logprob]) == bits([b.cumulative_logprob])


def test_progress_counts_every_request_a_step_advanced_due_or_not(llm):
    """LLMEngine.progress(): after each step, every request it advanced with its new tokens (a FINAL_ONLY one too,
    which gets no output until it finishes), in order, its outputs a subsequence; the counts add up to the tokens."""
    from samebits.engine.sampling_params import RequestOutputKind

    kw = {"temperature": 1.0, "seed": 5, "ignore_eos": True}
    reqs = [([5, 6, 7], SamplingParams(**kw, max_tokens=9, n=2, output_kind=RequestOutputKind.FINAL_ONLY)),
            ([8, 9], SamplingParams(**kw, max_tokens=6))]
    counted = {"r0": 0, "r1": 0}
    final = {}
    eng = llm.engine
    for i, (prompt, params) in enumerate(reqs):
        eng.add_request(f"r{i}", prompt, params)
    while eng.has_unfinished_requests():
        outs = eng.step()
        progress = eng.progress()
        ids = [p.request_id for p in progress]
        assert [o.request_id for o in outs] == [r for r in ids if r in {o.request_id for o in outs}]
        assert all(o.request_id != "r0" or o.finished for o in outs)  # FINAL_ONLY: the finished output alone
        for p in progress:
            counted[p.request_id] += p.new_tokens
            assert p.new_tokens > 0 and p.first_scheduled_time is not None
        final.update((o.request_id, o) for o in outs if o.finished)
    assert counted == {r: sum(len(c.token_ids) for c in final[r].outputs) for r in ("r0", "r1")} == {"r0": 18, "r1": 6}


def test_the_cpu_engine_takes_16_token_pages(llm):
    engine = llm.engine
    assert (engine.config.block_size, engine.scheduler.bm.block_size, engine.runner.block_size) == (16, 16, 16)


def test_vllm_offline_names_rejected_on_2026_12_04(llm):
    """The calls of the issue: best_of == n, prompt_token_ids=, samebits.TokensPrompt/TextPrompt, llm.llm_engine."""
    import samebits
    from samebits.engine.llm_engine import LLMEngine

    ids = [5, 17, 99, 4]
    greedy = SamplingParams(n=2, best_of=2, temperature=0.0, max_tokens=3, ignore_eos=True)
    out = llm.generate(prompt_token_ids=[ids], sampling_params=greedy, use_tqdm=False)[0]
    assert len(out.outputs) == 2 and out.prompt_token_ids == ids
    assert _generated(llm.generate([samebits.TokensPrompt(prompt_token_ids=ids)], greedy, use_tqdm=False)) == \
        _generated([out])
    text = llm.generate(samebits.TextPrompt(prompt="a b c"), greedy, use_tqdm=False)[0]
    assert text.prompt_token_ids == llm.tokenizer.encode("a b c")
    with pytest.raises(ValueError, match="best_of must be None or equal n \\(2\\)"):
        SamplingParams(n=2, best_of=3)
    with pytest.raises(ValueError, match="prompts or prompt_token_ids"):
        llm.generate([ids], prompt_token_ids=[ids])
    assert isinstance(llm.llm_engine, LLMEngine) and llm.llm_engine is llm.engine


def test_vllm_engine_arguments_are_accepted_on_the_cpu(tmp_path):
    """LLM(gpu_memory_utilization=0.9) was refused on 2026-12-04; on the CPU it is accepted and the KV pool stays
    the CPU's fixed one. Two engines of one seed draw the same seeds (vLLM's LLM(seed=...))."""
    from samebits.engine.model_runner import CPU_KV_TOKENS

    path = str(write_tiny_checkpoint(tmp_path, "llama3", seed=3))
    kw = {"device": "cpu", "gpu_memory_utilization": 0.9, "max_num_seqs": 4, "enforce_eager": True, "seed": 0}
    a, b = LLM(model=path, **kw), LLM(model=path, **kw)
    assert a.config.enforce_eager and not a.config.cuda_graphs and a.config.max_num_seqs == 4
    runner = a.llm_engine.runner
    assert runner.num_blocks * runner.block_size == CPU_KV_TOKENS
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    assert [o.seed for o in a.generate([[5, 6]] * 2, params, use_tqdm=False)] == \
        [o.seed for o in b.generate([[5, 6]] * 2, params, use_tqdm=False)]


@pytest.mark.gpu
def test_two_engines_share_one_gpu_by_gpu_memory_utilization(tmp_path):
    """The issue's second engine in one CUDA process ran out of memory (each took the free memory); with vLLM's
    gpu_memory_utilization each keeps to its share of the GPU, and both give the same bits."""
    import torch

    from tests.engine.test_invariance import SHAPES

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    path = str(write_tiny_checkpoint(tmp_path, "llama3", seed=3, **SHAPES["cuda"]))
    total = torch.cuda.mem_get_info()[1]
    engines = [LLM(model=path, device="cuda", gpu_memory_utilization=0.4) for _ in range(2)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
    outs = [_generated(e.generate([[5, 17, 99, 4]], params, use_tqdm=False)) for e in engines]
    assert outs[0] == outs[1]
    for e in engines:
        runner = e.llm_engine.runner
        kv = runner.num_blocks * runner.block_size * 2 * runner.model_config.num_layers * \
            runner.model_config.num_kv_heads * runner.model_config.head_dim * 2
        assert kv <= 0.4 * total, (kv, total)


@pytest.mark.parametrize("threshold", [None, 0])
def test_a_short_request_behind_a_long_prefill_gets_its_first_token_at_the_next_step(llm, threshold):
    """The engine's steps (engine/scheduler/prefills.py): a 2-token request added while a 240-token prompt is being
    prefilled in 64-token steps gets its first token from the next step, whose batch is no larger than one chunk of
    the long prompt, with the bits it has alone; then an abort of the long prompt mid-prefill leaves the next step to
    the short one. Negative control: with no cap (0) the short request waits for the long prompt's whole prefill."""
    from samebits.engine.llm_engine import LLMEngine

    config = llm.engine.config.replace(max_num_batched_tokens=64, long_prefill_token_threshold=threshold)
    engine = LLMEngine(config, llm.engine.loaded)
    greedy = SamplingParams(temperature=0.0, max_tokens=3, logprobs=0, ignore_eos=True)
    engine.add_request("long", [5 + i % 200 for i in range(240)], SamplingParams(max_tokens=1))
    engine.step()
    engine.add_request("short", [7, 9], greedy)
    steps, short = 0, None
    while short is None:
        steps += 1
        short = next((o for o in engine.step() if o.request_id == "short"), None)
        assert engine.scheduler.stats()["num_running"] <= 2
    assert steps == (1 if threshold is None else 3)
    assert short.outputs[0].token_ids[:1] == llm.generate([[7, 9]], greedy, use_tqdm=False)[0].outputs[0].token_ids[:1]
    if threshold is None:
        engine.abort_request("long")
        assert engine.scheduler.bm.usage > 0 and engine.scheduler.running == engine.scheduler.requests["short"]
        engine.step()
        assert [p.request_id for p in engine.progress()] == ["short"]
    while engine.has_unfinished_requests():
        engine.step()
    engine.scheduler.bm.check_integrity()


def test_a_model_running_another_modes_ops_is_refused(llm):
    """The config owns the mode (llm_engine.check_ops_mode): an engine configured for one mode over a model set to the
    other's ops refuses to start instead of fingerprinting numerics it does not compute; the same model with its own
    mode's ops passes (the control)."""
    from samebits.engine.llm_engine import check_ops_mode
    from samebits.kernels import get_ops

    model = llm.engine.loaded.model
    other = "fast" if llm.engine.config.mode == "deterministic" else "deterministic"
    check_ops_mode(llm.engine.config, model)
    with pytest.raises(ValueError, match=f"mode: the engine is configured .* runs {other!r} ops"):
        check_ops_mode(llm.engine.config, type("Model", (), {"ops": get_ops(other, "cpu")})())
