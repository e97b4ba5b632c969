"""An MoE layer's fixed per-step cost (efficiency.moe_layer_overhead_factor): the fused-MoE
op's measured floor replaces the dense MLP's kernels in the per-layer fixed cost, not on top."""

from __future__ import annotations

import pytest

from planner.cost import efficiency as eff


def test_moe_layer_overhead_factor_by_hand():
    """gpt-fast's dense layer (the kernel count the per-layer cost is shared out by): 10 kernels,
    4 of them the MLP's. Routed experts only, at a
    measured kernel: the fused-MoE op (floor priced with it) replaces those 4, the router GEMM
    adds 1: (10 - 4 + 1) / 10 = 0.7. With shared experts, or no measured floor, the dense
    MLP's share stays: (10 + 1) / 10 = 1.1."""
    assert eff.moe_layer_overhead_factor(True) == pytest.approx(0.7)
    assert eff.moe_layer_overhead_factor(False) == pytest.approx(1.1)


@pytest.mark.parametrize(("name", "cluster_name", "expected_us"), [
    # vLLM's 56 us per layer (ENGINE_STEP_SECONDS_PER_LAYER): 32 dense layers x 56 us = 1792 us
    ("llama-3.1-8b", "1x1xH100", 32 * 56),
    # 36 MoE layers, no shared expert, H100's measured MXFP4 kernel: 36 x 0.7 x 56 = 1411.2 us
    ("gpt-oss-120b", "1x1xH100", 36 * 0.7 * 56),
    # the same on an A100, whose MXFP4 kernel is not in the catalog (no floor):
    # 36 x 1.1 x 56 = 2217.6 us
    ("gpt-oss-120b", "1x1xA100", 36 * 1.1 * 56),
    # 3 dense + 58 MoE layers with a shared expert: (3 + 58 x 1.1) x 56 = 3740.8 us
    ("deepseek-v3", "1x8xH200", (3 + 58 * 1.1) * 56),
])
def test_decode_step_fixed_cost_by_hand(serve_one, name, cluster_name, expected_us):
    tp = 8 if cluster_name.endswith("8xH200") else 1
    result = serve_one(name, cluster_name, (tp, 1, 1), batch=1, input_len=128, output_len=128, max_model_len=4096)
    assert result.decode_steps[0].overhead_seconds == pytest.approx(expected_us * 1e-6, rel=1e-9)
