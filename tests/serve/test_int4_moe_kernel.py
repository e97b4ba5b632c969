"""INT4 weight-only experts (compressed-tensors WNA16, AWQ, GPTQ: Kimi-K2.5) as vLLM 0.33.0 runs
them: its WNA16 MoE oracle (fused_moe/oracle/int_wna16.py) tries FlashInfer's TRT-LLM kernel
first (Blackwell, no zero points), then Marlin. Marlin's MoE op (moe_wna16_marlin_gemm,
fused_moe/experts/marlin_moe.py) is the one measured with MXFP4 weights (catalog marlin_mxfp4),
so INT4 experts on Marlin take its rates; FlashInfer's INT4 kernel is not measured and keeps the
dense fallback. docs/cost-model.md (Serving: the MoE kernels)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from planner import units
from planner.catalog import resolve_cluster, resolve_model
from planner.cost.serving_time import int4_marlin_experts, moe_kernel


def test_kimi_on_h200_takes_the_marlin_kernel_hand_worked():
    """H200's marlin_mxfp4: floor 33.5 us, HBM utilisation 1.0 of 4.8 TB/s, 283 TFLOP/s, half
    rows 24 (planner/data/gpus.yaml)."""
    kimi, h200 = resolve_model("kimi-k2.5"), resolve_cluster("1x8xH200")
    assert int4_marlin_experts(kimi, h200)
    rates = moe_kernel(kimi, h200)
    assert rates.source == "measured"
    assert rates.floor_seconds == pytest.approx(units.us_to_seconds(33.5))
    assert rates.flops_per_s == pytest.approx(283e12)
    assert rates.half_rows == 24
    assert rates.hbm_bytes_per_s == pytest.approx(h200.gpu.hbm_bytes_per_s)


def test_blackwell_symmetric_int4_is_flashinfers_unmeasured_kernel():
    kimi, b200 = resolve_model("kimi-k2.5"), resolve_cluster("1x8xB200")
    assert not kimi.quantization_zero_point
    assert not int4_marlin_experts(kimi, b200)
    assert moe_kernel(kimi, b200).source == "model"


def test_zero_points_keep_marlin_on_blackwell_too():
    """FlashInfer's TRT-LLM INT4 MoE takes no zero points (_backend_incompatibility_reason), so an
    AWQ-style checkpoint falls through to Marlin on B200 as well."""
    awq_like = resolve_model("kimi-k2.5").model_copy(update={"quantization_zero_point": True})
    b200 = resolve_cluster("1x8xB200")
    assert int4_marlin_experts(awq_like, b200)
    assert moe_kernel(awq_like, b200).source == "measured"


def test_dense_int4_and_other_formats_are_untouched():
    h200 = resolve_cluster("1x8xH200")
    assert not int4_marlin_experts(resolve_model("llama-3.1-70b-awq"), h200)  # no experts
    assert not int4_marlin_experts(resolve_model("qwen3-235b-a22b-fp8"), h200)  # fp8's own kernel


@pytest.mark.parametrize("cluster, accepted", [("1x8xH200", True), ("1x8xB200", False)])
def test_moe_backend_marlin_is_accepted_where_vllm_picks_it(cluster, accepted):
    run = subprocess.run([sys.executable, "-m", "planner", "--model", "kimi-k2.5", "--cluster", cluster,
                          "--moe-backend", "marlin", "--layout", "tp=8", "--batch", "8", "--json"],
                         capture_output=True, text=True)
    if accepted:
        assert run.returncode == 0, run.stderr
        assert "--moe-backend marlin" in run.stdout
    else:
        assert run.returncode == 2
        assert "FlashInfer's INT4 kernel, unmeasured" in run.stderr and "\n" not in run.stderr.strip()
