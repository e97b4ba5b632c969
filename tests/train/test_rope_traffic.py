"""The rotary embedding's HBM traffic (params.rotary_elements_per_token), priced in the training
layer's elementwise count and the serving step's (docs/cost-model.md, Training: step time;
Serving: one engine step)."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_model
from planner.cost.params import rotary_elements_per_token
from planner.cost.serving_time import elementwise_bytes_per_token
from planner.cost.training_time import elementwise_bytes_per_layer


def test_rotary_elements_by_hand():
    """Llama-3.1-8B: (32/t + max(1, 8/t)) * 128: t = 1 -> 40 * 128 = 5,120; t = 8 -> (4 + 1) *
    128 = 640. DeepSeek-V3 (MLA): the decoupled rope parts, (128/t + 1) * 64: t = 8 -> 17 * 64 =
    1,088. GPT-3 (learned positions): none."""
    llama, deepseek, gpt3 = (resolve_model(n) for n in ("llama-3.1-8b", "deepseek-v3", "gpt3-175b"))
    assert rotary_elements_per_token(llama, 1) == 5120
    assert rotary_elements_per_token(llama, 8) == 640
    assert rotary_elements_per_token(deepseek, 8) == 1088
    assert rotary_elements_per_token(gpt3, 8) == 0


def test_rope_traffic_in_training_elementwise():
    """Llama-3.1-8B at t = 1, flash, s = 8192, b = 1, per token: layernorms and bias-dropout-adds
    (10*2 + 2) * 4096 = 90,112; Q/K/V split and context transposes 2*2*(2*32 + 2*8)*128 = 40,960;
    RoPE 2*2*(32 + 8)*128 = 20,480; SwiGLU 3*2*14336 = 86,016: 237,568 B per token, no score
    traffic."""
    traffic, scores = elementwise_bytes_per_layer(resolve_model("llama-3.1-8b"), 8192, 1, 1, False, "flash")
    assert scores == 0
    assert traffic == pytest.approx(8192 * (90_112 + 40_960 + 20_480 + 86_016))


def test_learned_positions_have_no_rotary_traffic():
    """GPT-3 at t = 8, materialized attention, s = 2048, per token: 26h of non-score traffic and
    26h of scores ((6*2 + 1) * 96 * 2048 / 8 = 319,488 = 26h), 52h as before RoPE was priced;
    its serving step has no rotary term either:
    2 * 4 * 2 * 12288 + 2 * 2 * 49152 / 8 = 196,608 + 24,576 = 221,184 B per token."""
    gpt3 = resolve_model("gpt3-175b")
    traffic, scores = elementwise_bytes_per_layer(gpt3, 2048, 1, 8, False, "materialized")
    assert traffic - scores == pytest.approx(2048 * 26 * 12288)
    assert scores == pytest.approx(2048 * 26 * 12288)
    assert elementwise_bytes_per_token(gpt3, 8) == 221_184
