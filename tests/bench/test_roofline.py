"""The roofline's arithmetic, checked by hand on a toy shape and for sense on the 8B shape; the step-max roofline by
hand and in its true relations to the ideal one."""
import random

import pytest

from samebits.bench.roofline import (
    H200_PEAK_BYTES,
    H200_PEAK_FLOPS,
    StepWork,
    active_params,
    decode_seconds,
    decode_steps,
    kv_bytes_per_token,
    layer_params,
    prefill_seconds,
    roofline,
    step_bytes,
    step_flops,
    step_roofline,
    step_work,
    touched_experts,
    weight_bytes,
)
from samebits.bench.shapes import shape_config
from samebits.models.config import ModelConfig
from samebits.models.moe_config import MoeConfig

TOY = ModelConfig("llama", vocab_size=10, hidden_size=2, intermediate_size=3, num_layers=1, num_heads=1,
                  num_kv_heads=1, head_dim=2, max_position_embeddings=64)
LLAMA_8B = ModelConfig("llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                       num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=8192)


def test_toy_sizes_by_hand():
    assert layer_params(TOY) == 2 * (2 + 2 * 2) + 2 * 2 + 3 * 2 * 3  # q,k,v in; o out; gate, up, down
    assert weight_bytes(TOY, 2) == (34 + 10 * 2) * 2
    assert kv_bytes_per_token(TOY, 2) == 1 * 2 * 1 * 2 * 2


def test_prefill_by_hand():
    # layers 2*34*3, lm_head for the last row 2*10*2, causal attention 4*1*1*2 * 3 rows * 2 keys on average
    assert prefill_seconds(TOY, [3], peak_flops=1.0) == 204 + 40 + 48


def test_decode_takes_the_larger_of_flops_and_bytes():
    # one decode row per later token; context 4 then 5: flops 108 + 8*ctx, bytes 108 + 8*ctx (halved by the peak)
    seconds, steps = decode_seconds(TOY, 2, [3], [3], max_num_seqs=8, peak_flops=1.0, peak_bytes=2.0)
    assert (seconds, steps) == (140 + 148, 2)
    seconds, _ = decode_seconds(TOY, 2, [3], [3], max_num_seqs=8, peak_flops=4.0, peak_bytes=1.0)
    assert seconds == 140 + 148


def test_max_num_seqs_serialises_decode():
    assert decode_seconds(TOY, 2, [3, 3], [2, 2], 2, 1.0, 1.0)[1] == 1
    assert decode_seconds(TOY, 2, [3, 3], [2, 2], 1, 1.0, 1.0)[1] == 2
    assert decode_seconds(TOY, 2, [3], [1], 1, 1.0, 1.0) == (0.0, 0)  # the only token comes from prefill


def test_8b_batch1_decode_is_the_weight_floor():
    bound = roofline(LLAMA_8B, [512], [65])
    per_step = bound.decode_s / bound.decode_steps
    assert bound.decode_steps == 64
    assert per_step == pytest.approx(weight_bytes(LLAMA_8B, 2) / H200_PEAK_BYTES, rel=0.02)
    assert 15.0e9 < weight_bytes(LLAMA_8B, 2) < 15.1e9


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="2 prompt lengths and 1 output"):
        roofline(TOY, [1, 2], [1])
    with pytest.raises(ValueError, match="max_num_seqs"):
        roofline(TOY, [1], [1], max_num_seqs=0)


TOY_MOE = ModelConfig("qwen3_moe", vocab_size=10, hidden_size=2, intermediate_size=3, num_layers=2, num_heads=1,
                      num_kv_heads=1, head_dim=2, max_position_embeddings=64,
                      moe=MoeConfig(num_experts=4, top_k=2, intermediate_size=5, norm_topk_prob=True, dense_layers=(1,)))


def test_moe_counts_the_experts_a_token_and_a_step_touch():
    attention, dense, router, expert = 2 * (2 + 2 * 2) + 2 * 2, 3 * 2 * 3, 4 * 2, 3 * 2 * 5
    assert layer_params(TOY_MOE) == 2 * attention + dense + router + 4 * expert
    assert active_params(TOY_MOE) == 2 * attention + dense + router + 2 * expert  # top 2 of the sparse layer's 4
    assert touched_experts(TOY_MOE, 1) == 2 and touched_experts(TOY_MOE, 2) == 4 * (1 - 0.5 ** 2)
    rest = 2 * attention + dense + router + 10 * 2
    assert weight_bytes(TOY_MOE, 2, rows=1) == (rest + 2 * expert) * 2
    assert weight_bytes(TOY_MOE, 2) == (rest + 4 * expert) * 2  # rows=None: every expert


def test_qwen3_30b_a3b_active_and_touched():
    m = shape_config("qwen3-30b-a3b")
    assert active_params(m) + 2 * m.vocab_size * m.hidden_size == pytest.approx(3.35e9, rel=0.01)  # "A3B"
    assert layer_params(m) + 2 * m.vocab_size * m.hidden_size == pytest.approx(30.5e9, rel=0.01)
    assert touched_experts(m, 1) == pytest.approx(8) and touched_experts(m, 64) == pytest.approx(125.94, abs=0.01)
    bound = roofline(m, [512], [65])
    assert bound.decode_s / bound.decode_steps == pytest.approx(weight_bytes(m, 2, rows=1) / H200_PEAK_BYTES,
                                                                rel=0.02)


def test_step_work_counts_causal_pairs_and_keys_read():
    # a chunk of 3 new tokens after 2 computed (rows see 3, 4, 5 keys, 5 keys read) and a decode row at position 6
    assert step_work([(3, 2, True), (1, 6, True), (2, 0, False)]) == StepWork(6, 2, 12 + 7 + 3, 5 + 7 + 2)


def test_step_max_of_a_tiny_step_list_by_hand():
    # TOY per step: flops 2*34*tokens + 2*20*samples + 4*2*pairs; bytes (34 + 20)*2 + 8*keys
    prefill, mixed, decode = StepWork(4, 1, 10, 4), StepWork(3, 2, 9, 7), StepWork(1, 1, 5, 5)
    assert [step_flops(TOY, w) for w in (prefill, mixed, decode)] == [392, 356, 148]
    assert [step_bytes(TOY, w, 2) for w in (prefill, mixed, decode)] == [140, 164, 148]
    # peaks 2 FLOP/s and 1 B/s: max(196, 140) + max(178, 164) + max(74, 148)
    assert step_roofline(TOY, [prefill, mixed, decode], 2, peak_flops=2.0, peak_bytes=1.0) == 196 + 178 + 148


def _random_steps(rng: random.Random, n: int) -> list[StepWork]:
    chunks = [[(rng.randint(1, 64), rng.randint(0, 512), rng.random() < 0.5) for _ in range(rng.randint(1, 8))]
              for _ in range(n)]
    return [step_work(c) for c in chunks]


def test_step_max_is_at_least_the_steps_flops_and_bytes(seed):
    steps = _random_steps(random.Random(seed), 50)
    total = step_roofline(LLAMA_8B, steps, 2, H200_PEAK_FLOPS, H200_PEAK_BYTES)
    assert total >= sum(step_flops(LLAMA_8B, w) for w in steps) / H200_PEAK_FLOPS
    assert total >= sum(step_bytes(LLAMA_8B, w, 2) for w in steps) / H200_PEAK_BYTES


def test_step_max_of_the_ideal_schedule_is_at_least_the_ideal_roofline():
    """Run on the ideal roofline's own schedule (each prompt a step of its own, then its decode steps), the step-max
    roofline equals its decode part and is at least its prefill part (which leaves the weights' bytes out)."""
    prompts, outputs = [512, 100, 2048, 7], [65, 200, 3, 1]
    ideal = roofline(LLAMA_8B, prompts, outputs, max_num_seqs=2)
    prefill = [step_work([(n, 0, True)]) for n in prompts]
    decode = list(decode_steps(prompts, outputs, 2))
    assert step_roofline(LLAMA_8B, decode, 2, H200_PEAK_FLOPS, H200_PEAK_BYTES) == pytest.approx(ideal.decode_s)
    assert step_roofline(LLAMA_8B, prefill, 2, H200_PEAK_FLOPS, H200_PEAK_BYTES) >= ideal.prefill_s
    # the 7-token prompt's step is memory-bound: its weights cost more than its FLOPs
    assert step_roofline(LLAMA_8B, prefill, 2, H200_PEAK_FLOPS, H200_PEAK_BYTES) > ideal.prefill_s * 1.01
    assert step_roofline(LLAMA_8B, prefill + decode, 2, H200_PEAK_FLOPS, H200_PEAK_BYTES) >= ideal.total_s


def test_a_mixed_schedule_can_put_the_step_max_below_the_ideal_roofline():
    """Not >= the ideal roofline in general: a short request's decode rows riding on a long prompt's compute-bound
    prefill chunks cost their FLOPs only, where the ideal schedule gives them decode steps that read every weight."""
    long, short, out = 8192, 16, 16
    chunks = 16
    steps = [step_work([(short, 0, True)])]
    steps += [step_work([(long // chunks, i * long // chunks, i == chunks - 1)] + ([(1, short + i, True)] if i < out - 1
                                                                                 else [])) for i in range(chunks)]
    ideal = roofline(LLAMA_8B, [long, short], [1, out])
    mixed = step_roofline(LLAMA_8B, steps, 2, H200_PEAK_FLOPS, H200_PEAK_BYTES)
    assert sum(w.tokens for w in steps) == long + short + out - 1  # the same work
    assert mixed < ideal.total_s
