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


def test_microbatch_group_size_by_hand():
    """Megatron's interleaved schedule runs each chunk on groups of N micro-batches, N in [p, m]
    with m % N zero or at least p; the least such N. p = 16: m = 20 -> 16..19 leave 4, 3, 2, 1
    (below 16), 20 leaves 0; m = 40 -> 20 (40 % 16 = 8, % 17 = 6, % 18 = 4, % 19 = 2, % 20 = 0);
    m = 48 -> 16; m = 15 -> none (below p). p = 4: m = 6 -> 6 (6 % 4 = 2, 6 % 5 = 1);
    m = 9 -> 5 (9 % 4 = 1, 9 % 5 = 4 >= 4)."""
    from planner.cost.pipeline import microbatch_group_size
    assert [microbatch_group_size(16, m) for m in (20, 40, 48, 15)] == [20, 20, 16, None]
    assert [microbatch_group_size(4, m) for m in (6, 9, 8)] == [6, 5, 4]


def test_interleaved_in_flight_with_a_larger_group_by_hand():
    """First stage, p = 4, v = 2: m = 8 (group 4) warms up 2*3 + 1*4 = 10 chunk forwards, + 1 in
    progress = 11 chunks = 5.5 micro-batches (p + (p-1)/v); m = 10 (group 5): 2*3 + 1*5 + 1 = 12
    chunks = 6.0; the last stage (i = 3) at m = 10: 0 + 5 + 1 = 6 chunks = 3.0."""
    from planner.cost.activations import micro_batches_in_flight
    assert micro_batches_in_flight("interleaved", 4, 8, 2, 0) == 5.5
    assert micro_batches_in_flight("interleaved", 4, 10, 2, 0) == 6.0
    assert micro_batches_in_flight("interleaved", 4, 10, 2, 3) == 3.0


def test_interleaving_needs_m_at_least_p_with_megatron_and_a_multiple_with_torchtitan():
    from planner.train import interleaving_batch_reasons
    assert interleaving_batch_reasons(10, 4, "megatron") == []
    assert "below p=4" in interleaving_batch_reasons(3, 4, "megatron")[0]
    # torch's rounds: max(1, m // p) of m / rounds micro-batches, the rounds dividing m
    assert interleaving_batch_reasons(10, 4, "torchtitan") == []  # 2 rounds of 5
    assert interleaving_batch_reasons(6, 4, "torchtitan") == []  # 1 round of 6 (a CLI read)
    assert "not a multiple of its 2 rounds" in interleaving_batch_reasons(9, 4, "torchtitan")[0]
    assert "below p=4" in interleaving_batch_reasons(3, 4, "torchtitan")[0]
    assert interleaving_batch_reasons(8, 4, "torchtitan") == []


def test_torchs_interleaved_rounds_are_megatrons_micro_batch_groups():
    """Wherever torch's ScheduleInterleaved1F1B takes m (its max(1, m // p) rounds divide m), its
    rounds hold microbatch_group_size(p, m) micro-batches, what the activations and the timeline
    price (p = 2..32, m = p..256)."""
    from planner.cost.pipeline import microbatch_group_size
    from planner.train import interleaving_batch_reasons
    for p in range(2, 33):
        for m in range(p, 257):
            if not interleaving_batch_reasons(m, p, "torchtitan"):
                assert microbatch_group_size(p, m) == m // (m // p), (p, m)


def test_megatron_command_names_the_group_only_where_p_does_not_divide_m():
    """70B on 8x8 H100, tp=8 pp=4 dp=2, b=2: B = 40 gives m = 10 (group 5, emitted), B = 32 m = 8
    (Megatron's default group of p, not emitted)."""
    from planner.catalog import resolve_model
    from planner.emit.megatron import parallel_args
    from planner.layout import TrainConfig
    model = resolve_model("llama-3.1-70b")
    config = TrainConfig(8, 4, 2, 2, "interleaved", 2, "none", True, 1)
    args = parallel_args(model, config, 40)
    assert args[args.index("--microbatch-group-size-per-virtual-pipeline-stage") + 1] == "5"
    assert "--microbatch-group-size-per-virtual-pipeline-stage" not in parallel_args(model, config, 32)


def test_a_rejected_layout_names_interleavings_micro_batches_once():
    """405B on 16 H100 at tp=1 pp=16 with a global batch of 8: 1F1B runs out of memory at every
    micro-batch size, and interleaving needs m >= p = 16 where b = 1, 2, 4, 8 leave m = 8, 4, 2,
    1: one line names them all (it was one line per m, cut at the reasons' limit), after the
    memory verdict."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.requests import LayoutFilter, TrainRequest
    from planner.train_search import search

    request = TrainRequest(global_batch=8, seq_len=8192, layout=LayoutFilter(tp=1, pp=16))
    plan = search(resolve_model("llama-3.1-405b"), resolve_cluster("2x8xH100"), request, suggest=False)
    assert not plan.layouts and len(plan.rejected) == 1
    reasons = plan.rejected[0].reasons
    assert reasons[0].startswith("out of memory on stage")
    assert reasons[1:] == ("interleaving needs at least p=16 micro-batches (Megatron): m = 1, 2, 4, 8 here",)


def test_a_step_share_under_one_percent_keeps_a_decimal():
    """The Why line's shares: 0.4% of the step read "0%" beside the table's 0.4% (a CLI read)."""
    from planner.render.train import share_text

    assert [share_text(x) for x in (0.0, 0.0003, 0.004, 0.0094, 0.0096, 0.07, 0.93)] == \
        ["0%", "<0.1%", "0.4%", "0.9%", "1%", "7%", "93%"]
