"""MiMo-V2-Flash's two attention kinds with value heads narrower than query/key heads, worked by
hand from its config.json (h 4096, a 64 query heads on every layer; hybrid_layer_pattern: 9 full
layers of k 4 KV heads, 39 sliding-window layers (128 tokens) of k 8; d 192 for queries and keys,
d_v 128 for values everywhere; 256 experts of 2048, top 8, in 47 layers, layer 0 a dense MLP of
16384; vocab 152,576, untied; fp8 block-scaled weights, bf16 activations).
Sources: vllm/model_executor/models/mimo_v2_flash.py (MiMoV2Attention: hybrid_layer_pattern 1 =
sliding window with the swa_* shape; o_proj takes a * v_head_dim); Xiaomi's MiMo-V2-Flash model
card (309B total, 15B active parameters).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.params import (
    attention_linear_weights_of_kind,
    attention_replicated_weights,
    kv_bytes_per_token,
    kv_bytes_per_token_per_layer_by_kind,
    multiply_adds_per_attention_pair,
    param_counts,
    tp_head_reasons,
)
from planner.hf_config import load_hf_config
from planner.specs import ModelSpec, SpecError

CONFIG = Path(__file__).parents[1] / "fixtures" / "hf_configs" / "XiaomiMiMo--MiMo-V2-Flash" / "config.json"


@pytest.fixture(scope="module")
def mimo() -> ModelSpec:
    return load_hf_config(CONFIG)


def test_the_import_reads_the_layer_pattern_into_two_shapes(mimo: ModelSpec) -> None:
    """hybrid_layer_pattern has 39 ones (window) and 9 zeros (full); the window layers' swa_*
    shape becomes the spec's, the full layers' 4 KV heads num_global_key_value_heads."""
    assert (mimo.num_key_value_heads, mimo.head_dim, mimo.v_head_dim) == (8, 192, 128)
    assert (mimo.num_global_key_value_heads, mimo.global_head_dim) == (4, None)
    assert (mimo.sliding_window, mimo.num_window_layers, mimo.num_dense_layers) == (128, 39, 1)
    assert (mimo.num_local_experts, mimo.num_experts_per_tok, mimo.num_shared_experts) == (256, 8, 0)
    assert (mimo.quantization, mimo.is_mla) == ("fp8", False)


def test_one_full_and_one_window_layer_attention_weights(mimo: ModelSpec) -> None:
    """Full: Q 4096*64*192 = 50,331,648, K 4096*4*192 = 3,145,728, V 4096*4*128 = 2,097,152,
    O 64*128*4096 = 33,554,432: 89,128,960.
    Window: Q 50,331,648, K 4096*8*192 = 6,291,456, V 4096*8*128 = 4,194,304, O 33,554,432:
    94,371,840."""
    assert attention_linear_weights_of_kind(mimo, full=True) == 89_128_960
    assert attention_linear_weights_of_kind(mimo, full=False) == 94_371_840


def test_kv_bytes_per_token_use_the_value_width(mimo: ModelSpec) -> None:
    """bf16 KV, one GPU: full 4 * (192 + 128) * 2 = 2,560; window 8 * 320 * 2 = 5,120 (with
    d_v = d it would be 3,072 and 6,144). Whole model: 9 * 2,560 + 39 * 5,120 = 222,720.
    tp=8: full 4 heads replicated to 1 per GPU, 1 * 320 * 2 = 640; window 8/8 = 1, 640.
    fp8 KV: one byte each, (1,280, 2,560)."""
    assert kv_bytes_per_token_per_layer_by_kind(mimo, 1, "auto") == (2_560, 5_120)
    assert kv_bytes_per_token(mimo) == 222_720
    assert kv_bytes_per_token_per_layer_by_kind(mimo, 8, "auto") == (640, 640)
    assert kv_bytes_per_token_per_layer_by_kind(mimo, 1, "fp8") == (1_280, 2_560)


def test_k_and_v_projections_kept_per_gpu(mimo: ModelSpec) -> None:
    """In the model, the mean layer's K and V: full 4096*4*320 = 5,242,880, window
    4096*8*320 = 10,485,760; (9 * 5,242,880 + 39 * 10,485,760) / 48 = 9,502,720.
    Per GPU at tp=8: one KV head of each kind, 4096*1*320 = 1,310,720."""
    assert attention_replicated_weights(mimo, 8) == (9_502_720, 1_310_720)


def test_attention_pair_work_uses_key_and_value_dims(mimo: ModelSpec) -> None:
    """64 * (192 + 128) = 20,480 multiply-adds per (query, key) pair on both kinds."""
    assert multiply_adds_per_attention_pair(mimo) == (20_480, 20_480)


def test_total_and_active_match_xiaomis_published_counts(mimo: ModelSpec) -> None:
    """Ours: 308,778,766,336 total, 15,445,921,792 active; the card says 309B and 15B."""
    counts = param_counts(mimo)
    assert counts.total == pytest.approx(309e9, rel=0.01)
    assert counts.active == pytest.approx(15e9, rel=0.05)


def test_tp_checks_both_kinds_kv_heads(mimo: ModelSpec) -> None:
    """tp=8: window 8 heads split, full 4 heads replicated (8 % 4 == 0): fine. tp=3 does not
    divide 64 query heads."""
    assert tp_head_reasons(mimo, 8) == []
    assert tp_head_reasons(mimo, 3) == ["attention heads 64 not divisible by tp=3"]


@pytest.mark.parametrize(("update", "message"), [
    ({"swa_num_attention_heads": 32}, "swa_num_attention_heads: sliding-window layers with their own"),
    ({"swa_v_head_dim": 192}, "swa_v_head_dim: sliding-window layers with their own"),
    ({"hybrid_layer_pattern": [0, 1]}, "hybrid_layer_pattern: expected one flag per layer"),
    ({"hybrid_layer_pattern": [2] * 48}, "hybrid_layer_pattern: expected one flag per layer"),
])
def test_shapes_the_model_does_not_describe_are_refused_in_one_line(
        tmp_path: Path, update: dict[str, object], message: str) -> None:
    raw = {**json.loads(CONFIG.read_text()), **update}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SpecError, match=message) as caught:
        load_hf_config(path)
    assert "\n" not in str(caught.value)


def test_a_pattern_without_full_layers_is_one_shape(tmp_path: Path) -> None:
    """Every layer sliding: the swa_* shape everywhere and no global shape."""
    raw = {**json.loads(CONFIG.read_text()), "hybrid_layer_pattern": [1] * 48}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    model = load_hf_config(path)
    assert (model.num_window_layers, model.num_key_value_heads, model.num_global_key_value_heads) == (48, 8, None)


def test_plan_on_8_h200s_prints_a_vllm_command() -> None:
    result = CliRunner().invoke(app, ["--model", str(CONFIG), "--cluster", "1x8xH200", "--mode", "aggregated"])
    assert result.exit_code == 0, result.output
    assert "vllm serve" in result.output


def test_training_plans_but_emits_no_megatron_command() -> None:
    """Megatron's --kv-channels cannot give the full layers 4 KV heads beside 8, nor values 128
    dims beside 192: the plan stands and its launch is not emitted, with that reason; --emit none
    plans the same search."""
    args = ["--workload", "train", "--model", str(CONFIG), "--cluster", "32x8xH100",
            "--global-batch", "1024", "--seq-len", "4096"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 0, refused.output
    text = " ".join(refused.output.split())
    assert "Launch: not emitted" in text and "MiMo-V2" in text and "pretrain_gpt.py" not in text
    planned = CliRunner().invoke(app, [*args, "--emit", "none"])
    assert planned.exit_code == 0, planned.output


def test_v_head_dim_needs_no_mla_but_cannot_contradict_k_eq_v() -> None:
    base = {"name": "m", "num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
            "intermediate_size": 4096, "vocab_size": 1000, "head_dim": 192,
            "max_position_embeddings": 4096}
    assert ModelSpec(**base, v_head_dim=128).v_head_dim == 128
    with pytest.raises(ValueError, match="v_head_dim: 128 cannot differ"):
        ModelSpec(**base, v_head_dim=128, attention_k_eq_v=True, sliding_window=64, num_sliding_window_layers=2)


def test_training_gemms_use_the_value_width(mimo: ModelSpec) -> None:
    """One window-shaped layer's attention GEMMs at b = 1, s = 4096, t = 1: QKV
    [4096, 4096] x [4096, 64*192 + 8*(192 + 128) = 14,848]; output projection
    [4096, 64*128 = 8,192] x [8,192, 4096]; context per head [4096, 4096] x [4096, 128]."""
    from planner.cost.flops import layer_gemms_forward

    qkv, out, _, _, scores, context = layer_gemms_forward(mimo, 1, 4096, 1)[:6]
    assert (qkv.m, qkv.n, qkv.k) == (4096, 14_848, 4096)
    assert (out.m, out.n, out.k) == (4096, 4096, 8192)
    assert (scores.n, scores.k, context.n, context.k) == (4096, 192, 128, 4096)
