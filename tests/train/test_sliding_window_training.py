"""Sliding-window attention in training (flops.window_pairs_fraction): the flash kernels skip
the blocks outside a layer's window, so its attention core costs only the pairs it keeps. As
gpt-oss-120b's Megatron-Bridge recipe runs it (window_size 128,0 and window_attn_skip_freq 2:
every second layer windowed) and as NeMo's own FLOPs calculator for it counts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.flops import layer_gemms_forward, window_pairs_fraction
from planner.cost.training_time import flash_attention_seconds
from planner.train import train_rates


def test_gpt_oss_window_pairs_by_hand():
    """gpt-oss-120b at S = 4,096, W = 128: a window layer keeps 4,096*128 - 128*127/2 =
    524,288 - 8,128 = 516,160 of the full causal 4,096*4,097/2 = 8,390,656 pairs, 6.152%;
    18 of 36 layers are windowed: (18 + 18*0.061516) / 36 = 0.530758. At 131,072 tokens a
    window layer keeps 0.195%, the mean 50.10%."""
    model = resolve_model("gpt-oss-120b")
    assert window_pairs_fraction(model, 4096) == pytest.approx((18 + 18 * 516_160 / 8_390_656) / 36)
    assert window_pairs_fraction(model, 4096) == pytest.approx(0.530758, abs=1e-6)
    assert window_pairs_fraction(model, 131_072) == pytest.approx(0.50098, abs=1e-5)


def test_no_window_or_a_window_as_long_as_the_sequence_changes_nothing():
    """Llama-3.1-8B has no window; Mistral-7B v0.1's 4,096-token window on every layer covers
    a 4,096-token sequence whole; at 32,768 tokens it keeps (32,768*4,096 - 4,096*4,095/2) /
    (32,768*32,769/2) = 125,831,168 / 536,887,296 = 23.4%."""
    assert window_pairs_fraction(resolve_model("llama-3.1-8b"), 8192) == 1.0
    v01 = resolve_model("mistral-7b").model_copy(update={"sliding_window": 4096})
    assert window_pairs_fraction(v01, 4096) == 1.0
    assert window_pairs_fraction(v01, 32_768) == pytest.approx(125_831_168 / 536_887_296)


@settings(deadline=None)  # a busy machine (CI beside other jobs) is not a failure
@given(st.integers(1, 1 << 20))
def test_the_fraction_is_a_share_and_falls_with_the_sequence(s):
    model = resolve_model("gpt-oss-120b")
    assert 0.5 <= window_pairs_fraction(model, s) <= 1.0
    assert window_pairs_fraction(model, 2 * s) <= window_pairs_fraction(model, s)


def test_the_flash_core_is_priced_on_the_pairs_kept():
    """The attention core's flash time scales by the fraction exactly (its FLOPs do)."""
    model, cluster = resolve_model("gpt-oss-120b"), resolve_cluster("1x8xH100")
    rates = train_rates(model, cluster)
    gemms = layer_gemms_forward(model, 1, 4096, 1)
    full = flash_attention_seconds(gemms, rates)
    kept = flash_attention_seconds(gemms, rates, window_pairs_fraction(model, 4096))
    assert kept[0] == pytest.approx(full[0] * 0.530758, rel=1e-6)
    assert kept[1] == pytest.approx(full[1] * 0.530758, rel=1e-6)
