"""The serving step's GEMM rate against vLLM's own linear kernels (AIConfigurator's measurements).

    python bench/serving_gemm_calibration.py          # per GPU, precision and layer shape group
    python bench/serving_gemm_calibration.py --json

Data: tests/fixtures/aiconfigurator_silicon/serving_gemm_vllm.csv (tools/extract_aic_serving_gemm.py:
vLLM 0.24.0's bf16, per-tensor fp8 and NVFP4 linear kernels on H100, H200 and B200 at the forward
shapes of a Llama-3.1-8B and -70B layer, tp 1-8, M >= 2048 tokens). For each point the rate the
kernel implies under the serving step's shape rule is
    R = 2 M N K / ((t - q) u(M) u(N) u(K)),  u(x) = x / (x + GEMM_HALF_RATE_DIMENSION),
q the activation quantization the step prices apart (serving_time.quantize_bytes_per_element
x M K at the GPU's elementwise HBM rate). It is compared with
the rate the serving step uses (serving_time.achievable_flops_per_s: the catalog's
achievable_matmul_tflops, else 0.75 of the peak). Ratio below 1: the step prices these GEMMs
faster than vLLM runs them. Nothing is fitted here: the step's rates are unchanged (see
docs/cost-model.md, Serving: calibration, for why).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from planner.catalog import resolve_gpu  # noqa: E402
from planner.cost import efficiency as eff  # noqa: E402
from planner.cost.serving_time import quantize_bytes_per_element  # noqa: E402

FIXTURE = REPO / "tests/fixtures/aiconfigurator_silicon/serving_gemm_vllm.csv"
GPUS = {"h100_sxm": "H100-SXM5-80GB", "h200_sxm": "H200-SXM-141GB", "b200_sxm": "B200-SXM-180GB", "l40s": "L40S",
        "a100_sxm": "A100-SXM4-80GB"}
PRECISION = {"bfloat16": "bf16", "fp8": "fp8", "nvfp4": "fp4"}
HIDDEN_OF_MODEL = {4096: "8B", 8192: "70B"}


def layer_tp(n: int, k: int) -> tuple[str, int]:
    """Which model's layer and tp a (n, k) shape belongs to."""
    for h, f, qkv in ((4096, 14336, 6144), (8192, 28672, 10240)):
        for t in (1, 2, 4, 8):
            if (n, k) in {(qkv // t, h), (h, h // t), (2 * f // t, h), (h, f // t)}:
                return HIDDEN_OF_MODEL[h], t
    raise ValueError(f"shape {n} x {k} is no Llama-3.1-8B/70B layer GEMM")


def step_rate_flops_per_s(gpu, precision: str) -> float:
    """What the serving step prices these GEMMs at (serving_time.achievable_flops_per_s)."""
    peak = gpu.peak_flops_per_s(precision)
    return eff.achievable_matmul_flops_per_s(peak, gpu.serving_flops_per_s(precision))


def implied_rates(path: Path = FIXTURE) -> dict[tuple[str, str, str, int], list[float]]:
    """(gpu, precision, model, tp) -> the rate each measured point implies, FLOP/s."""
    half = eff.GEMM_HALF_RATE_DIMENSION
    out: dict[tuple[str, str, str, int], list[float]] = defaultdict(list)
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            gpu = resolve_gpu(GPUS[row["gpu"]])
            precision = PRECISION[row["gemm_dtype"]]
            m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
            seconds = float(row["latency_ms"]) * 1e-3
            elementwise = eff.elementwise_bytes_per_s(gpu.hbm_bytes_per_s, gpu.elementwise_hbm_utilization)
            quant_seconds = quantize_bytes_per_element(precision) * m * k / elementwise
            shape = (m / (m + half)) * (n / (n + half)) * (k / (k + half))
            out[(GPUS[row["gpu"]], precision, *layer_tp(n, k))].append(2 * m * n * k / ((seconds - quant_seconds) * shape))
    return out


def summarize(rates: dict) -> list[dict]:
    rows = []
    for (gpu_name, precision, model, tp), values in sorted(rates.items()):
        used = step_rate_flops_per_s(resolve_gpu(gpu_name), precision)
        median = statistics.median(values)
        rows.append({"gpu": gpu_name, "precision": precision, "layer": model, "tp": tp, "points": len(values),
                     "vllm_tflops": median / 1e12, "step_tflops": used / 1e12, "vllm_over_step": median / used})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = summarize(implied_rates())
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'gpu':<16} {'prec':<5} {'layer':<5} {'tp':>2} {'points':>6} {'vLLM TFLOP/s':>12} {'step uses':>9} {'ratio':>6}")
    for r in rows:
        print(f"{r['gpu']:<16} {r['precision']:<5} {r['layer']:<5} {r['tp']:>2} {r['points']:>6} "
              f"{r['vllm_tflops']:>12.0f} {r['step_tflops']:>9.0f} {r['vllm_over_step']:>6.2f}")


if __name__ == "__main__":
    main()


def fitted_medians(rates: dict) -> dict[tuple[str, str], float]:
    """(gpu, precision) -> the median implied rate over every shape: what serving_matmul_tflops holds."""
    pooled: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (gpu_name, precision, _, _), values in rates.items():
        pooled[(gpu_name, precision)] += values
    return {key: statistics.median(values) for key, values in pooled.items()}
