"""The roofline's arithmetic, checked by hand on a toy shape and for sense on the 8B shape."""
import pytest

from samebits.diagnostics.bench.shapes import shape_config
from samebits.diagnostics.roofline import (
    H200_PEAK_BYTES,
    active_params,
    decode_seconds,
    kv_bytes_per_token,
    layer_params,
    prefill_seconds,
    roofline,
    touched_experts,
    weight_bytes,
)
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
