"""Hand-worked checks of the training formulas (arithmetic in each docstring)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost import activations as act
from planner.cost.flops import (
    megatron_flops_per_sequence,
    megatron_flops_per_step,
    model_flops_per_sequence,
    model_flops_per_step,
    selective_recompute_flops_per_step,
)
from planner.cost.pipeline import bubble_fraction, bubble_over_compute_ratio
from planner.cost.training_memory import model_state_bytes
from planner.specs import ModelSpec

# A GPT block small enough to do by hand: h = 64, a = 4 heads (d = 16), f = 4h = 256.
TINY = ModelSpec(name="tiny", num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                 intermediate_size=256, gated_mlp=False, vocab_size=1000,
                 max_position_embeddings=128, tie_word_embeddings=True, dtype="float16")
S, B_MICRO = 128, 2  # s*b*h = 128*2*64 = 16384; a*s/h = 4*128/64 = 8


def test_table2_no_parallelism():
    """s*b*h*(34 + 5*a*s/h) = 16384 * (34 + 40) = 1,212,416 bytes."""
    assert act.activation_bytes_per_layer(TINY, S, B_MICRO, 1, False, "none") == 1_212_416


def test_table2_tensor_parallel():
    """t = 4: s*b*h*(10 + 24/4 + 5*8/4) = 16384 * (10 + 6 + 10) = 425,984 bytes."""
    assert act.activation_bytes_per_layer(TINY, S, B_MICRO, 4, False, "none") == 425_984


def test_table2_tensor_and_sequence_parallel():
    """t = 4: s*b*h*(34/4 + 40/4) = 16384 * 18.5 = 303,104 bytes."""
    assert act.activation_bytes_per_layer(TINY, S, B_MICRO, 4, True, "none") == 303_104


def test_table2_selective_recompute():
    """TP only: 16384 * (10 + 6) = 262,144; TP + SP: 16384 * 34/4 = 139,264 bytes."""
    assert act.activation_bytes_per_layer(TINY, S, B_MICRO, 4, False, "selective") == 262_144
    assert act.activation_bytes_per_layer(TINY, S, B_MICRO, 4, True, "selective") == 139_264


def test_flash_attention_keeps_statistics_not_scores():
    """Flash, t = 4, no recompute: the selective row plus the logsumexp, 4 bytes per query
    row per head: 4 * a*s*b/t = 4 * 4*128*2/4 = 1,024. TP only: 262,144 + 1,024 = 263,168;
    TP + SP: 139,264 + 1,024 = 140,288. Selective recompute keeps the same (nothing to drop),
    and its recompute working set is 0 where materialized needs 5*a*s^2*b/t = 163,840."""
    assert act.activation_bytes_per_layer(TINY, S, B_MICRO, 4, False, "none", "flash") == 263_168
    assert act.activation_bytes_per_layer(TINY, S, B_MICRO, 4, True, "none", "flash") == 140_288
    assert act.activation_bytes_per_layer(TINY, S, B_MICRO, 4, True, "selective", "flash") == 140_288
    assert act.recompute_working_bytes(TINY, S, B_MICRO, 4, True, "selective", "flash") == 0
    assert act.recompute_working_bytes(TINY, S, B_MICRO, 4, True, "selective") == 163_840


def test_flash_attention_time():
    """Flash attention core for TINY at t = 4 on a 100 TFLOP/s peak: the forward's two
    per-head GEMMs are 2 * (2*s*s*d) * b*a/t = 2 * 2*128*128*16 * 2 = 2,097,152 FLOP,
    causal half 1,048,576; forward at 0.73 of peak = 1,048,576 / 73e12 = 14.364 ns;
    backward 2.5x the FLOPs at 0.63 = 2,621,440 / 63e12 = 41.610 ns."""
    from planner.cost.flops import layer_gemms_forward
    from planner.cost.training_time import TrainRates, flash_attention_seconds

    rates = TrainRates(peak_flops_per_s=100e12, matmul_flops_per_s=87e12, elementwise_bytes_per_s=1.6e12)
    forward, backward = flash_attention_seconds(layer_gemms_forward(TINY, B_MICRO, S, 4), rates)
    assert forward == pytest.approx(1_048_576 / 73e12)
    assert backward == pytest.approx(2_621_440 / 63e12)


def test_table2_full_recompute():
    """2*s*b*h = 2 * 16384 = 32,768 bytes without SP, whatever t; with SP the layer input
    is sharded along s: 32,768 / 4 = 8,192 at t = 4."""
    for tp, sp, expected in ((1, False, 32_768), (4, False, 32_768), (4, True, 8_192)):
        assert act.activation_bytes_per_layer(TINY, S, B_MICRO, tp, sp, "full") == expected


def test_micro_batches_in_flight():
    """GPipe m; 1F1B min(p, m); interleaved p*(1 + (p-1)/(p*v)): p=4, v=2 -> 4*(1 + 3/8) = 5.5."""
    assert act.micro_batches_in_flight("gpipe", 4, 16) == 16
    assert act.micro_batches_in_flight("1f1b", 4, 16) == 4
    assert act.micro_batches_in_flight("1f1b", 4, 2) == 2
    assert act.micro_batches_in_flight("interleaved", 4, 16, 2) == 5.5


def test_optimizer_sharding():
    """P = 1e9: weights 2e9, grads 4e9, optimizer 12e9; ZeRO-1 over d=8: optimizer 1.5e9;
    ZeRO-2: grads 0.5e9 too; ZeRO-3: weights 0.25e9 too."""
    plain = model_state_bytes(1e9, 8, 0)
    assert (plain.weights_bytes, plain.gradient_bytes, plain.optimizer_bytes) == (2e9, 4e9, 12e9)
    assert model_state_bytes(1e9, 8, 1).optimizer_bytes == 1.5e9
    zero2 = model_state_bytes(1e9, 8, 2)
    assert (zero2.weights_bytes, zero2.gradient_bytes, zero2.optimizer_bytes) == (2e9, 0.5e9, 1.5e9)
    assert model_state_bytes(1e9, 8, 3).total_bytes == 0.25e9 + 0.5e9 + 1.5e9


def test_narayanan_eq3_by_hand():
    """B=1, s=6, L=1, h=2, V=32: 96*1*6*1*4 * (1 + 6/12 + 32/32) = 2304 * 2.5 = 5760."""
    assert megatron_flops_per_step(1, 6, 1, 2, 32) == pytest.approx(5760)


def test_korthikanti_eq7_eq8_by_hand():
    """B=1, s=6, L=1, h=2, V=24: eq. 7: 72*6*4 * (1 + 6/12 + 24/24) = 1728 * 2.5 = 4320;
    eq. 8: 1728 * (1 + 6/6 + 1) = 5184."""
    assert model_flops_per_step(1, 6, 1, 2, 24) == pytest.approx(4320)
    assert selective_recompute_flops_per_step(1, 6, 1, 2, 24) == pytest.approx(5184)


def test_per_layer_counts_reduce_to_the_published_formulas():
    """For a GPT block the GEMM-by-GEMM count equals eq. 3 and eq. 7 (per sequence)."""
    L, h, V = TINY.num_hidden_layers, TINY.hidden_size, TINY.vocab_size
    assert megatron_flops_per_sequence(TINY, S) == pytest.approx(megatron_flops_per_step(1, S, L, h, V))
    assert model_flops_per_sequence(TINY, S) == pytest.approx(model_flops_per_step(1, S, L, h, V))


def test_causal_count_halves_the_attention_core():
    """Flash (causal) counting, as Megatron-LM core_v0.19.0 reports: the attention core's
    4*s^2*a*d per layer forward is halved. TINY (L = 4, a*d = 64) at s: 3 passes * 4 layers *
    4*s^2*64 / 2 fewer FLOPs in the model count, 4 passes in Megatron's full-recompute count."""
    core = 4 * S * S * TINY.num_attention_heads * TINY.head_dim
    L = TINY.num_hidden_layers
    assert model_flops_per_sequence(TINY, S) - model_flops_per_sequence(TINY, S, causal=True) == \
        pytest.approx(3 * L * core / 2)
    assert megatron_flops_per_sequence(TINY, S) - megatron_flops_per_sequence(TINY, S, causal=True) == \
        pytest.approx(4 * L * core / 2)


@pytest.mark.parametrize("schedule_v, m, fraction, ratio", [
    (1, 1, 3 / 4, 3.0),      # 4 stages, 1 micro-batch: 75% idle
    (1, 4, 3 / 7, 3 / 4),    # 4 + 4 - 1 = 7 units, each busy 4
    (1, 8, 3 / 11, 3 / 8),   # gpipe and 1f1b share the formulas
    (2, 8, 3 / 19, 3 / 16),  # interleaved v=2: (p-1)/(v*m + p-1), (p-1)/(v*m)
])
def test_bubble_quantities(schedule_v, m, fraction, ratio):
    assert bubble_fraction(4, m, schedule_v) == fraction
    assert bubble_over_compute_ratio(4, m, schedule_v) == ratio


@settings(max_examples=60, deadline=None)
@given(s=st.sampled_from([128, 512, 2048, 8192]), b=st.integers(1, 8), tp=st.sampled_from([1, 2, 4]),
       sp=st.booleans(), recompute=st.sampled_from(["none", "selective", "full"]))
def test_flash_never_stores_more_than_materialized(s, b, tp, sp, recompute):
    """4 bytes of statistics per row against 5*s bytes of scores per row: flash keeps less
    (selective recompute: the scores are dropped either way, flash keeps 4*a*s*b/t more)."""
    sp = sp and tp > 1
    flash = act.activation_bytes_per_layer(TINY, s, b, tp, sp, recompute, "flash")
    materialized = act.activation_bytes_per_layer(TINY, s, b, tp, sp, recompute, "materialized")
    if recompute == "selective":
        assert flash == materialized + act.softmax_stats_bytes(TINY, s, b, tp)
    else:
        assert flash <= materialized


def test_without_pipelining_one_micro_batch_is_in_flight_whatever_the_schedule():
    """GPipe holds all m micro-batches on every stage (8 of 8 at p = 4); with p = 1 there is no
    pipeline to fill: each micro-batch's forward and backward run before the next, so 1, as
    1F1B gives (--schedule gpipe on a layout without PP charged all 8, and 70B on 4x8 H100 came
    out "nothing fits")."""
    from planner.cost.activations import micro_batches_in_flight

    assert micro_batches_in_flight("gpipe", 4, 8) == 8.0
    assert micro_batches_in_flight("gpipe", 1, 8) == micro_batches_in_flight("1f1b", 1, 8) == 1.0
