"""Query / key norms over every head (MiniMax-M2's qk_norm_type "per_layer"): under TP each rank
holds some heads, so every layer all-reduces each token's two fp32 partial sums of squares
before it can normalize (vLLM 0.33.0 minimax_rms_norm/rms_norm_tp.py, MiniMaxText01RMSNormTP).
One more small all-reduce per layer and step, priced as the layer's own all-reduces are at
that size. docs/cost-model.md (Serving: one engine step)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.serving_memory import stage_memory
from planner.cost.serving_time import (
    StepLoad,
    qk_norm_allreduce_seconds,
    stage_step_time,
    tp_allreduce_seconds_per_layer,
)
from planner.hf_config import load_hf_config
from planner.layout import Layout, place
from planner.requests import ServeRequest
from planner.serve import estimate

HF_CONFIGS = Path(__file__).resolve().parents[1] / "fixtures/hf_configs"


def minimax_on(cluster_name: str, tp: int, across_heads: bool = True):
    model = resolve_model("minimax-m2.5")
    if not across_heads:
        model = model.model_copy(update={"qk_norm_across_heads": False})
    cluster = resolve_cluster(cluster_name)
    layout = Layout(tp, 1, 1)
    stage = stage_memory(model, cluster, layout, ServeRequest(max_model_len=4096), 8)[0]
    return model, cluster, layout, place(cluster, layout), stage


def test_the_config_json_imports_the_norm_and_the_half_rotary():
    """MiniMax-M2.5's config.json: use_qk_norm true, qk_norm_type "per_layer" (not Qwen3's
    per-head norm), rotary_dim 64 of head_dim 128; the shipped spec is that import."""
    imported = load_hf_config(HF_CONFIGS / "MiniMaxAI--MiniMax-M2.5/config.json")
    assert imported.qk_norm_across_heads and not imported.qk_norm
    assert imported.partial_rotary_factor == 0.5
    shipped = resolve_model("minimax-m2.5")
    differing = {key for key, value in shipped.model_dump().items() if imported.model_dump()[key] != value}
    assert differing <= {"name", "source", "architecture"}  # provenance only
    per_head = load_hf_config(HF_CONFIGS / "MiniMaxAI--MiniMax-M3/config.json")  # qk_norm_type per_head
    assert per_head.qk_norm and not per_head.qk_norm_across_heads


def test_one_decode_step_hand_worked():
    """tp 8 on one H100 node, 32 decoding tokens: 32 * 8 B = 256 B, a measured point of vLLM's
    fused all-reduce curve at 8 ranks (catalog serving_allreduce: 3.23 us); the step carries
    it once per layer: 62 * 3.23 us = 200.3 us more than without the norm."""
    model, cluster, layout, placement, stage = minimax_on("1x8xH100", 8)
    assert qk_norm_allreduce_seconds(model, cluster, layout, placement, 32) == pytest.approx(3.23e-6, rel=0.005)
    load = StepLoad(32, 32 * 1024)
    with_norm = stage_step_time(model, cluster, layout, placement, stage, load)
    plain = minimax_on("1x8xH100", 8, across_heads=False)
    without = stage_step_time(plain[0], cluster, layout, placement, plain[4], load)
    assert with_norm.seconds - without.seconds == pytest.approx(62 * 3.23e-6, rel=0.005)
    assert with_norm.allreduce_seconds_per_layer - without.allreduce_seconds_per_layer == pytest.approx(
        3.23e-6, rel=0.005)


def test_nothing_at_tp_1_or_for_per_head_norms():
    model, cluster, layout, placement, _ = minimax_on("1x1xH200", 1)
    assert qk_norm_allreduce_seconds(model, cluster, layout, placement, 4096) == 0.0
    qwen3 = resolve_model("qwen3-235b-a22b-fp8")  # qk_norm per head: each rank normalizes its own heads
    cluster = resolve_cluster("1x8xH200")
    assert qk_norm_allreduce_seconds(qwen3, cluster, Layout(8, 1, 1), place(cluster, Layout(8, 1, 1)), 4096) == 0.0


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.floats(1, 16384))
def test_the_norms_all_reduce_is_one_of_the_layers_own_at_8_bytes_a_token(tp, tokens):
    """Never more than a layer all-reduce of the hidden state (3,072 bf16 = 6,144 B a token),
    and exactly half of tp_allreduce_seconds_per_layer (two all-reduces) at 8 B a token."""
    model, cluster, layout, placement, _ = minimax_on(f"1x{tp}xH200", tp)
    seconds = qk_norm_allreduce_seconds(model, cluster, layout, placement, tokens)
    both, _ = tp_allreduce_seconds_per_layer(cluster, layout, placement, 8 * tokens)
    assert seconds == pytest.approx(both / 2)
    hidden, _ = tp_allreduce_seconds_per_layer(cluster, layout, placement, 6144 * tokens)
    assert 0 < seconds <= hidden / 2 * (1 + 1e-12)


def test_the_estimates_per_layer_all_reduce_counts_the_norms_too():
    """The table's all-reduce/layer and the placement line: every TP all-reduce of one layer.
    MiniMax-M2.5 at tp 8 on H200, batch 8 (8 tokens a decode step): the two hidden-state
    all-reduces at 8 x 3,072 x 2 = 49,152 B plus the norms' at 8 x 8 = 64 B."""
    model = resolve_model("minimax-m2.5")
    cluster = resolve_cluster("1x8xH200")
    layout = Layout(8, 1, 1)
    placement = place(cluster, layout)
    result = estimate(model, cluster, layout, ServeRequest(batch=8, max_model_len=4096))
    assert result.allreduce_message_bytes == 8 * 3072 * 2
    both, _ = tp_allreduce_seconds_per_layer(cluster, layout, placement, 49_152)
    norms, _ = tp_allreduce_seconds_per_layer(cluster, layout, placement, 64)
    assert result.tp_allreduce_seconds_per_layer == pytest.approx(both + norms / 2)
    assert [c.message_bytes for c in result.collectives if c.name == "query / key norms"] == [64, 8 * 1024]
