"""The serving step's GEMM rates against vLLM 0.24.0's linear kernels as AIConfigurator measured
them (bench/serving_gemm_calibration.py; data tests/fixtures/aiconfigurator_silicon/serving_gemm_vllm.csv,
written by tools/extract_aic_serving_gemm.py; A100 at vLLM 0.14.0, the newest AIConfigurator measured there).

- fp8 (per-tensor CUTLASS) and NVFP4 (FlashInfer CuteDSL): the catalog's serving_matmul_tflops are
  the medians of the rate each measured point implies under the step's shape rule, net of the
  activation quantization the step prices apart: H100 fp8 1,025, H200 fp8 1,080 (with its measured elementwise share 0.84), B200 fp8 1,897
  and NVFP4 4,056 TFLOP/s, L40S fp8 390, against the best-kernel achievable rates training uses (1,403, 1,453,
  3,433; NVFP4 0.75 of 9,000). The shape rule leaves a spread: per layer and tp the implied rate
  runs from 0.5 to 1.4 of the fitted one (small 8B shapes at tp 8 slowest).
- bf16 is not refitted where the catalog has a measured achievable rate: vLLM's torch linear lands
  within 10% of it on H100 (794), B200 (1,745) and A100 (271; vLLM 0.14.0 runs 0.97-1.13 of it);
  H200's entry has none (0.75 of the peak: vLLM runs 1.12-1.17 of it), nor does L40S (vLLM runs
  0.89-0.92 of 0.75 x 362).
"""

from __future__ import annotations

import pytest

from planner.catalog import resolve_gpu


@pytest.fixture(scope="module")
def calibration(bench_module):
    return bench_module("serving_gemm_calibration")


@pytest.fixture(scope="module")
def rates(calibration):
    return calibration.implied_rates()


def test_every_gpu_precision_layer_and_tp_is_scored(calibration, rates) -> None:
    rows = calibration.summarize(rates)
    assert len(rows) == 80  # H100, H200, L40S: bf16 + fp8; B200: + fp4; A100: bf16; 2 layers x 4 tp
    assert all(r["points"] >= (6 if r["gpu"] == "A100-SXM4-80GB" else 46) for r in rows)


@pytest.mark.parametrize(("gpu", "precision", "tflops"), [
    ("H100-SXM5-80GB", "fp8", 1025), ("H200-SXM-141GB", "fp8", 1080),
    ("B200-SXM-180GB", "fp8", 1897), ("B200-SXM-180GB", "fp4", 4056),
    ("L40S", "fp8", 390),
])
def test_catalog_serving_rates_are_the_measured_medians(calibration, rates, gpu, precision, tflops) -> None:
    median = calibration.fitted_medians(rates)[(gpu, precision)]
    assert median == pytest.approx(tflops * 1e12, rel=0.001)
    assert resolve_gpu(gpu).serving_flops_per_s(precision) == pytest.approx(tflops * 1e12)


def test_bf16_step_rate_matches_vllms_kernel_where_measured(calibration, rates) -> None:
    """H100 (794 TFLOP/s) and B200 (1,745) carry a measured bf16 rate: vLLM's torch linear lands
    within 10% of it on every layer shape, so bf16 keeps it."""
    for r in calibration.summarize(rates):
        if r["precision"] == "bf16" and r["gpu"] in ("H100-SXM5-80GB", "B200-SXM-180GB"):
            assert 0.9 < r["vllm_over_step"] < 1.1, r
        if r["precision"] == "bf16" and r["gpu"] == "A100-SXM4-80GB":  # vLLM 0.14.0
            assert 0.95 < r["vllm_over_step"] < 1.15, r
    assert resolve_gpu("H100-SXM5-80GB").serving_flops_per_s("bf16") == pytest.approx(794e12)


def test_training_keeps_the_best_kernel_rate() -> None:
    """Transformer Engine's fp8 GEMMs (NeMo's runs) are not vLLM's: training reads
    achievable_matmul_tflops, 1,403 TFLOP/s on H100."""
    assert resolve_gpu("H100-SXM5-80GB").achievable_flops_per_s("fp8") == pytest.approx(1403e12)
