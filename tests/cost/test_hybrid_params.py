"""Hybrid models (recurrent layers beside attention): one recurrent layer's parameters and
state, and KV bytes per token counting only the attention layers. Hand-worked from the
checkpoints' config.json; arithmetic in each docstring.

Nemotron-H-56B: h 8192, 118 blocks = 54 Mamba2 + 10 attention + 54 MLP; Mamba2 H 256 heads
of P 64, N 256 state dims, G 8 groups, K 4; attention a 64, k 8, d 128.
Qwen3.5-27B: h 5120, 64 layers = 48 Gated DeltaNet + 16 attention (output gate); n_k 16 key
heads, n_v 48 value heads of d_k = d_v = 128, K 4; attention a 24, k 4, d 256.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.catalog import resolve_model
from planner.cost.flops import model_flops_per_sequence
from planner.cost.params import (
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    layer_params_per_gpu,
    num_attention_layers,
    param_counts,
    recurrent_params_per_layer,
    recurrent_state_bytes_per_sequence,
    tp_head_reasons,
)

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"


@pytest.fixture(scope="module")
def nemotron_h():
    return resolve_model(str(CORPUS / "nvidia--Nemotron-H-56B-Base-8K" / "config.json"))


@pytest.fixture(scope="module")
def qwen3_5():
    return resolve_model(str(CORPUS / "Qwen--Qwen3.5-27B" / "config.json"))


def test_mamba2_layer_params_nemotron_h_56b(nemotron_h) -> None:
    """I = 256 * 64 = 16,384; conv channels C = I + 2*8*256 = 20,480.
    in_proj 8192 * (16,384 + 20,480 + 256) = 304,087,040; out_proj 16,384 * 8192 = 134,217,728;
    conv1d 20,480 * 4 + 20,480 bias = 102,400; dt_bias, A_log, D 3 * 256 = 768; gated norm
    16,384. Sum 438,424,320."""
    assert recurrent_params_per_layer(nemotron_h) == 438_424_320


def test_mamba2_state_bytes_nemotron_h_56b(nemotron_h) -> None:
    """t = 1: conv (4-1) * 20,480 channels * 2 B (bf16) = 122,880; SSM 256 * 64 * 256 * 4 B
    (fp32) = 16,777,216; 16,900,096 B per sequence per Mamba2 layer.
    t = 8: 32 heads, one group of the 8: conv 3 * (32*64 + 2*1*256) * 2 = 15,360; SSM
    32 * 64 * 256 * 4 = 2,097,152; 2,112,512 B. All 54 layers at t = 8: 114,075,648 B."""
    assert recurrent_state_bytes_per_sequence(nemotron_h) == 16_900_096
    assert recurrent_state_bytes_per_sequence(nemotron_h, 1, 8) == 2_112_512
    assert recurrent_state_bytes_per_sequence(nemotron_h, 54, 8) == 114_075_648


def test_gated_deltanet_layer_params_and_state_qwen3_5_27b(qwen3_5) -> None:
    """key_dim 16*128 = 2,048, value_dim 48*128 = 6,144, conv channels 2*2,048 + 6,144 = 10,240.
    in_proj_qkv 5120 * 10,240 = 52,428,800; in_proj_z 5120 * 6,144 = 31,457,280; in_proj_b
    and in_proj_a 2 * 5120 * 48 = 491,520; conv1d 10,240 * 4 = 40,960 (no bias); dt_bias and
    A_log 96; gated norm 128; out_proj 6,144 * 5120 = 31,457,280. Sum 115,876,064.
    State, t = 1: conv 3 * 10,240 * 2 B = 61,440; delta rule 48 * 128 * 128 * 4 B (fp32,
    mamba_ssm_dtype) = 3,145,728; 3,207,168 B per sequence per layer."""
    assert recurrent_params_per_layer(qwen3_5) == 115_876_064
    assert recurrent_state_bytes_per_sequence(qwen3_5) == 3_207_168


def test_qwen3_5_gated_attention_doubles_q(qwen3_5) -> None:
    """Q 2 * 5120 * 24 * 256 (query and output gate) = 62,914,560; K, V 2 * 5120 * 4 * 256 =
    10,485,760; O 24 * 256 * 5120 = 31,457,280: 104,857,600 per attention layer."""
    assert param_counts(qwen3_5).attention_per_layer == 104_857_600


def test_kv_bytes_per_token_count_only_attention_layers(nemotron_h, qwen3_5) -> None:
    """Nemotron-H-56B: 10 attention layers * 2 * 8 * 128 * 2 B = 40,960 B (not 118 layers'
    483,328). Qwen3.5-27B: 16 * 2 * 4 * 256 * 2 = 65,536 B. One GPU at t = 8 (8 KV heads
    split, 4 replicated): 5,120 and 16,384 B."""
    assert num_attention_layers(nemotron_h) == 10 and num_attention_layers(qwen3_5) == 16
    assert kv_bytes_per_token(nemotron_h) == 40_960
    assert kv_bytes_per_token(qwen3_5) == 65_536
    assert kv_bytes_per_token_per_gpu(nemotron_h, 10, 8, "auto") == 5_120
    assert kv_bytes_per_token_per_gpu(qwen3_5, 16, 8, "auto") == 16_384


def test_tp_splits_recurrent_heads(qwen3_5, nemotron_h) -> None:
    """Qwen3.5-27B: 48 value heads split 16 ways but not 32 (nor do its 24 attention heads);
    Nemotron-H's 256 Mamba2 heads split 8 ways."""
    assert tp_head_reasons(nemotron_h, 8) == []
    assert tp_head_reasons(qwen3_5.model_copy(update={"num_attention_heads": 96}), 32) == [
        "linear-attention heads (16 key, 48 value) do not split over tp=32"]


def test_training_flops_count_each_layer_kind_once(nemotron_h) -> None:
    """Nemotron-H-56B, s = 4096, forward + backward = 3 x forward: the matmul weights of
    10 attention layers (8192 * (64 + 16) * 128 + 64 * 128 * 8192 = 150,994,944 each), 54 MLPs
    (2 * 8192 * 32,768 = 536,870,912) and 54 Mamba2 projections (8192 * 37,120 + 16,384 * 8192 =
    438,304,768) = 54,169,436,160, at 2 FLOP per weight per token; the attention core
    4 * s^2 * a * d on the 10 attention layers only; the LM head 2 * s * h * V.
    3 * (2*4096*54,169,436,160 + 10*4*4096^2*64*128 + 2*4096*8192*131,072) = 1.3799e15."""
    s = 4096
    expected = 3 * (2 * s * 54_169_436_160 + 10 * 4 * s**2 * 64 * 128 + 2 * s * 8192 * 131_072)
    assert model_flops_per_sequence(nemotron_h, s) == pytest.approx(expected, rel=1e-12)


def test_weights_and_params_per_gpu_split_the_recurrent_projections(nemotron_h) -> None:
    """The mean block of Nemotron-H-56B on one GPU of t = 8: matmuls (10 * attention with its
    8 KV heads split + 54 * Mamba2 + 54 * MLP) / 8 / 118 + the rest whole; summed over the 118
    blocks it is the blocks' matmul weights / 8 + their other parameters, so eight GPUs hold
    the blocks (plus 7 copies of the small parameters)."""
    counts = param_counts(nemotron_h)
    per_gpu = layer_params_per_gpu(nemotron_h, 8) * 118
    other = counts.blocks - 54_169_436_160
    assert per_gpu == pytest.approx(54_169_436_160 / 8 + other, rel=1e-12)
