"""INT4 weight-only experts (compressed-tensors WNA16, AWQ, GPTQ: Kimi-K2.5) as vLLM 0.33.0 runs
them: its WNA16 MoE oracle (fused_moe/oracle/int_wna16.py) tries FlashInfer's TRT-LLM kernel
first, which runs only with VLLM_USE_FLASHINFER_MOE_INT4=1 (default 0) on SM100, then Marlin: by
default Marlin everywhere from Ampere on. Marlin's MoE op (moe_wna16_marlin_gemm,
fused_moe/experts/marlin_moe.py) is the one measured with MXFP4 weights (catalog marlin_mxfp4),
so INT4 experts take its rates where it is measured, else the dense fallback. docs/cost-model.md (Serving: the MoE kernels)."""

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


def test_blackwell_runs_marlin_too_unless_flashinfer_is_switched_on():
    """On B200 the FlashInfer INT4 kernel needs VLLM_USE_FLASHINFER_MOE_INT4=1, which the plan's
    command does not set: Marlin, at B200's measured rates (floor 19.6 us, 297 TFLOP/s)."""
    kimi, b200 = resolve_model("kimi-k2.5"), resolve_cluster("1x8xB200")
    assert int4_marlin_experts(kimi, b200)
    rates = moe_kernel(kimi, b200)
    assert rates.source == "measured"
    assert rates.floor_seconds == pytest.approx(units.us_to_seconds(19.6))
    assert rates.flops_per_s == pytest.approx(297e12)


def test_where_marlin_is_not_measured_the_dense_fallback_stays():
    kimi = resolve_model("kimi-k2.5")
    for name in ("1x8xA100", "1x8xRTX-PRO-6000"):
        cluster = resolve_cluster(name)
        assert int4_marlin_experts(kimi, cluster)
        assert moe_kernel(kimi, cluster).source == "model", name


def test_dense_int4_and_other_formats_are_untouched():
    h200 = resolve_cluster("1x8xH200")
    assert not int4_marlin_experts(resolve_model("llama-3.1-70b-awq"), h200)  # no experts
    assert not int4_marlin_experts(resolve_model("qwen3-235b-a22b-fp8"), h200)  # fp8's own kernel


@pytest.mark.parametrize("cluster, accepted", [("1x8xH200", True), ("1x8xB200", True), ("1x8xA100", False)])
def test_moe_backend_marlin_is_accepted_where_its_kernel_is_measured(cluster, accepted):
    run = subprocess.run([sys.executable, "-m", "planner", "--model", "kimi-k2.5", "--cluster", cluster,
                          "--moe-backend", "marlin", "--layout", "tp=8", "--batch", "8", "--json"],
                         capture_output=True, text=True)
    if accepted:
        assert run.returncode == 0, run.stderr
        assert "--moe-backend marlin" in run.stdout
    else:
        assert run.returncode == 2
        assert "not measured on A100-SXM4-80GB" in run.stderr and "\n" not in run.stderr.strip()
