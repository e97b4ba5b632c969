"""The serving step's GEMM rates against vLLM 0.24.0's linear kernels as AIConfigurator measured
them (bench/serving_gemm_calibration.py; data tests/fixtures/aiconfigurator_silicon/serving_gemm_vllm.csv).

What the comparison shows (vLLM's implied rate / the step's, median per layer and tp):
- bf16 agrees: B200 0.94-0.99, H100 1.05-1.09 (H200 1.12-1.17: its catalog entry has no measured
  bf16 rate, so the step uses 0.75 of the peak).
- per-tensor fp8 and NVFP4 run slower in vLLM than the catalog's best-kernel rates the step uses:
  H100 fp8 0.75-0.89 at the 70B layer (0.39 at 8B, tp 8), B200 fp8 0.61-0.76, NVFP4 0.59-0.71.
  The step keeps its rates: with vLLM's, the as-benchmarked TTFT on the calibration set improves
  on B200 and H200 (Llama fp8 36% -> 17% and 19% -> 4% median |error|) but the 8xH100 anchor
  (test_serving_calibration) turns from within 9% to 14% median and 22% max too slow, so the
  kernels the measured runs used (vLLM 0.10-0.11) and the ones measured here (0.24.0) differ.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    spec = importlib.util.spec_from_file_location("serving_gemm_calibration", REPO / "bench/serving_gemm_calibration.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.summarize(module.implied_rates())


def test_every_gpu_precision_layer_and_tp_is_scored(rows) -> None:
    keys = {(r["gpu"], r["precision"], r["layer"], r["tp"]) for r in rows}
    assert len(keys) == len(rows) == 56  # H100, H200: bf16 + fp8; B200: + fp4; 2 layers x 4 tp
    assert all(r["points"] >= 46 for r in rows)


def test_bf16_step_rate_matches_vllms_kernel_where_measured(rows) -> None:
    """H100 (794 TFLOP/s) and B200 (1,745) carry a measured bf16 rate: vLLM's torch linear lands
    within 10% of it on every layer shape."""
    for r in rows:
        if r["precision"] == "bf16" and r["gpu"] != "H200-SXM-141GB":
            assert 0.9 < r["vllm_over_step"] < 1.1, r


def test_low_precision_kernels_run_below_the_step_rate(rows) -> None:
    """The recorded gap: vLLM's fp8 and NVFP4 kernels imply at most 0.94 of the step's rate on
    every shape (so the step's prefill is optimistic there; see the module docstring)."""
    low = [r for r in rows if r["precision"] in ("fp8", "fp4")]
    assert len(low) == 32
    assert max(r["vllm_over_step"] for r in low) < 0.95
