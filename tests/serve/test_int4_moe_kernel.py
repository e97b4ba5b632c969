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


@pytest.mark.parametrize("cluster_name, floor_us, tflops, half_rows", [("1x8xH200", 33.5, 283, 24),
                                                                    ("1x8xB200", 19.6, 297, 22)])
def test_kimi_takes_the_measured_marlin_kernel_hand_worked(cluster_name, floor_us, tflops, half_rows):
    """The catalog's marlin_mxfp4 (planner/data/gpus.yaml): H200 floor 33.5 us, 283 TFLOP/s, half
    rows 24; B200 19.6 us, 297 TFLOP/s, 22; both at HBM utilisation 1.0. On B200 too: FlashInfer's
    INT4 kernel needs VLLM_USE_FLASHINFER_MOE_INT4=1, which the plan's command does not set."""
    kimi, cluster = resolve_model("kimi-k2.5"), resolve_cluster(cluster_name)
    assert int4_marlin_experts(kimi, cluster)
    rates = moe_kernel(kimi, cluster)
    assert rates.source == "measured"
    assert rates.floor_seconds == pytest.approx(units.us_to_seconds(floor_us))
    assert rates.flops_per_s == pytest.approx(tflops * 1e12)
    assert rates.half_rows == half_rows
    assert rates.hbm_bytes_per_s == pytest.approx(cluster.gpu.hbm_bytes_per_s)


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
