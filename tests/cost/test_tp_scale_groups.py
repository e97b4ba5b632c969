"""Quantization scale groups under tensor parallelism (int4 AWQ/GPTQ groups, block-fp8 blocks): vLLM 0.33.0 needs whole groups of
g inputs on every rank of a row-parallel layer (auto_awq.py, utils/marlin_utils.py), and its MoE
WNA16 fallback halves the group to no less than 32 (moe_wna16.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.params import tp_scale_group_reasons
from planner.requests import ServeRequest
from planner.serve_search import plan_serving
from planner.specs import ModelSpec


def int4(name: str, **update: object) -> ModelSpec:
    return resolve_model(name).model_copy(update={"quantization": "int4", **update})


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_qwen25_72b_ffn_leaves_part_groups_at_every_tp(tp: int) -> None:
    """29,568 = 231 x 128: /2 = 14,784 = 115.5 groups, /4 = 7,392 = 57.75, /8 = 3,696 = 28.875.
    (Qwen's own int4 checkpoints pad the FFN to 29,696 = 232 x 128 for this reason.)"""
    (reason,) = tp_scale_group_reasons(int4("qwen2.5-72b"), tp)
    assert f"MLP down projection inputs 29,568 / {tp} = {29568 // tp:,}" in reason
    assert tp_scale_group_reasons(int4("qwen2.5-72b"), 1) == []
    assert tp_scale_group_reasons(int4("qwen2.5-72b", intermediate_size=29696), tp) == []


@pytest.mark.parametrize("tp", [2, 4, 8, 16])
def test_llama_70b_awq_splits_to_tp16(tp: int) -> None:
    """28,672 / 16 = 1,792 = 14 x 128; attention output 64 x 128 = 8,192 / 16 = 512 = 4 x 128."""
    assert tp_scale_group_reasons(resolve_model("llama-3.1-70b-awq"), tp) == []


def test_attention_output_checked_only_when_attention_is_int4() -> None:
    """Llama 4 Scout: 40 heads x 128 = 5,120 / 16 = 320 = 2.5 groups of 128; with the MLPs
    alone in int4 (quantization_scope mlp) the attention output is not grouped."""
    assert "attention output inputs 5,120 / 16 = 320" in tp_scale_group_reasons(int4("llama-4-scout"), 16, 16)[0]
    assert tp_scale_group_reasons(int4("llama-4-scout", quantization_scope="mlp"), 16, 16) == []


def test_routed_experts_halve_the_group_down_to_32() -> None:
    """Qwen3-30B-A3B experts 768 wide: /8 = 96 = 3 x 32, so the MoE WNA16 kernels run it at
    group 32 (128 -> 64 -> 32); /16 = 48 holds no group of 32 (48 % 32 = 16). With EP the
    experts stay whole and any tp splits only attention (32 heads x 128 = 4,096 / 16 = 256)."""
    model = int4("qwen3-30b-a3b")
    assert tp_scale_group_reasons(model, 8) == []
    assert "expert FFN inputs 768 / 16 = 48" in tp_scale_group_reasons(model, 16)[0]
    assert tp_scale_group_reasons(model, 16, 16) == []


def test_per_channel_groups_split_anywhere() -> None:
    """GPTQ's group_size -1 is read as one group the width of the hidden size (hf_config):
    one scale per output channel, never split."""
    assert tp_scale_group_reasons(int4("qwen2.5-72b", quantization_group_size=8192), 8) == []


def test_the_search_rejects_what_vllm_cannot_load() -> None:
    """Qwen2.5-72B in int4 on 8 H100: every tp > 1 leaves part groups, so only tp=1 runs
    (38.6 GiB of weights fit one GPU), and the rejections say why."""
    plan = plan_serving(int4("qwen2.5-72b"), resolve_cluster("1x8xH100"), ServeRequest(mode="aggregated"))
    assert plan.layouts and all(e.layout.tp == 1 for e in plan.layouts)
    assert any(r.layout.tp == 8 and "int4 groups of 128" in " ".join(r.reasons) for r in plan.rejected)


@given(tp=st.sampled_from([1, 2, 4, 8, 16, 32]), groups=st.integers(1, 400), group=st.sampled_from([32, 64, 128]))
def test_whole_groups_per_rank_always_split(tp: int, groups: int, group: int) -> None:
    """A dense model whose every row-parallel input is a multiple of tp x g never fails the check."""
    width = groups * tp * group
    model = resolve_model("llama-3.1-8b").model_copy(update={
        "quantization": "int4", "quantization_group_size": group, "intermediate_size": width,
        "hidden_size": 32 * 128, "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128 * tp})
    assert tp_scale_group_reasons(model, tp) == []


def test_block_fp8_row_parallel_inputs_split_in_whole_blocks() -> None:
    """Qwen3-32B-FP8 (weight_block_size [128, 128]): FFN 25,600 / 8 = 3,200 = 25 x 128 splits,
    / 16 = 1,600 = 12.5 blocks does not (vLLM's RowParallelLinear raises on it). DeepSeek-V3's
    dense layers: 18,432 / 16 = 1,152 = 9 blocks, / 32 = 576 = 4.5; its routed experts are
    never the reason (vLLM refines or pads their blocks). A per-channel fp8 checkpoint
    (Llama-3.1-70B FP8) splits anywhere."""
    qwen = resolve_model(str(Path(__file__).parents[1] / "fixtures" / "hf_configs" / "Qwen--Qwen3-32B-FP8"
                             / "config.json"))
    assert qwen.quantization_block_size == 128
    assert tp_scale_group_reasons(qwen, 8) == []
    assert "MLP down projection inputs 25,600 / 16 = 1,600 a rank, not whole blocks" in tp_scale_group_reasons(qwen, 16)[0]
    deepseek = resolve_model("deepseek-v3")
    assert tp_scale_group_reasons(deepseek, 16) == []
    assert "18,432 / 32 = 576" in tp_scale_group_reasons(deepseek, 32)[0]
    assert tp_scale_group_reasons(resolve_model("llama-3.1-70b-fp8"), 32) == []
    # the engine's own online fp8 (--quantization fp8 on a 16-bit spec) has no blocks
    assert tp_scale_group_reasons(resolve_model("qwen3-32b").model_copy(update={"quantization": "fp8"}), 16) == []


def test_block_fp8_experts_split_where_their_blocks_refine() -> None:
    """Qwen3-235B-FP8's 1,536-wide experts: / 8 = 192, gcd(128, 192, 4,096) = 64 >= 32, so vLLM
    0.33.0 refines the blocks to 64; / 32 = 48, gcd 16 < 32: validate_fp8_block_shape_moe raises
    (no EP, the auto MoE backend). With EP the experts stay whole."""
    model = resolve_model("qwen3-235b-a22b-fp8")
    assert tp_scale_group_reasons(model, 8) == []
    assert "expert FFN inputs 1,536 / 32 = 48" in tp_scale_group_reasons(model, 32)[0]
    assert tp_scale_group_reasons(model, 32, 32) == []
