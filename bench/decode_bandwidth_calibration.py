"""How fast vLLM's linear kernels stream their weights in decode, read off how TPOT falls with TP.

    python bench/decode_bandwidth_calibration.py          # per GPU and matmul precision
    python bench/decode_bandwidth_calibration.py --json

Data: AIConfigurator's measured vLLM runs (tests/fixtures/aiconfigurator_silicon/vllm_agg.csv,
the set bench/serving_calibration.py scores). A decode step reads the layers' linear weights once,
and TP splits them: the weight read per GPU is B_t = B / t, while the step's fixed costs (the
engine's per-step work, the per-layer kernels' floors, attention at small batches) barely move
with t. So along one series (the same model, GPU, lengths and concurrency at tp 1, 2, 4, 8)

    TPOT(t) = c + B_t / (u * HBM) + H_t / (DECODE_HBM_UTILIZATION * HBM)

is a line in B_t / HBM whose slope is 1 / u, whatever c is: u is the share of datasheet HBM
bandwidth the linear kernels stream at, measured inside the engine (H_t, the LM head's 16-bit
read, is taken out at the default share first). B_t and H_t are the planner's own
(serving_time.non_expert_weight_bytes_read, head_weight_bytes_read). Only series where decode
dominates are used: 1,024 input tokens, at least 1,024 output tokens, at most 8 clients, at
least three TP degrees, dense models. The median over a GPU and precision's series is compared
with the catalog's serving_decode_hbm_utilization (what the serving step prices the read at;
DECODE_HBM_UTILIZATION where the catalog has none).

`--gemm`: where no engine runs were measured (the L40S), the same share read off the kernels
alone: AIConfigurator's vLLM GEMMs at decode batch sizes (M <= 8 rows) on matrices of at least
three times the L2 cache (tests/fixtures/aiconfigurator_silicon/serving_gemm_decode_vllm.csv,
tools/extract_aic_decode_gemm.py), fitted as t = t0 + W / (u * HBM) over the shapes (least
squares): the slope gives u whatever each call's fixed cost t0 is. On H100, where both exist, it
lands within 4% of the engine runs' u (bf16 0.889, fp8 0.937 against 0.90).

Not part of the planner; importable: `series_fits(rows)`, `summarize(fits)`, `gemm_fits()`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from serving_calibration import Run, load_rows  # noqa: E402

from planner.catalog import resolve_cluster, resolve_model  # noqa: E402
from planner.cost import efficiency as eff  # noqa: E402
from planner.cost.serving_memory import stage_memory  # noqa: E402
from planner.cost.serving_time import (  # noqa: E402
    head_weight_bytes_read,
    linear_hbm_utilization,
    matmul_precision,
    non_expert_weight_bytes_read,
)
from planner.layout import Layout  # noqa: E402
from planner.requests import ServeRequest  # noqa: E402

INPUT_LEN = 1024
MIN_OUTPUT_LEN = 1024
MAX_CONCURRENCY = 8
MIN_TP_DEGREES = 3


def decode_series(rows: list[Run]) -> dict[tuple[str, str, int, int, int], dict[int, Run]]:
    """(spec, gpu, input, output, concurrency) -> {tp: run} for the decode-dominated series."""
    series: dict[tuple[str, str, int, int, int], dict[int, Run]] = defaultdict(dict)
    for run in rows:
        if run.input_len == INPUT_LEN and run.output_len >= MIN_OUTPUT_LEN and run.concurrency <= MAX_CONCURRENCY:
            series[(run.spec, run.gpu, run.input_len, run.output_len, run.concurrency)][run.tp] = run
    return {key: runs for key, runs in series.items() if len(runs) >= MIN_TP_DEGREES}


def weight_read_terms(spec: str, gpu: str, tp: int) -> tuple[float, float, str, float]:
    """(B_t / HBM, H_t / (DECODE_HBM_UTILIZATION * HBM), matmul precision, the catalog's u) for
    one replica of `spec` on tp GPUs of `gpu`."""
    model = resolve_model(spec)
    cluster = resolve_cluster(f"1x{tp}x{gpu}")
    layout = Layout(tp, 1, 1)
    stage = stage_memory(model, cluster, layout, ServeRequest(max_model_len=4096), 1)[0]
    hbm = cluster.gpu.hbm_bytes_per_s
    head = head_weight_bytes_read(model, stage, layout)
    layers = non_expert_weight_bytes_read(model, stage, layout) - head
    return (layers / hbm, head / (hbm * eff.DECODE_HBM_UTILIZATION), matmul_precision(model, cluster),
            linear_hbm_utilization(model, cluster))


def series_fits(rows: list[Run]) -> list[dict]:
    """One fit per decode-dominated series of a dense model: its u (1 / slope)."""
    fits = []
    for (spec, gpu, input_len, output_len, concurrency), runs in sorted(decode_series(rows).items()):
        if resolve_model(spec).is_moe:
            continue
        xs, ys = [], []
        precision, catalog = "", 0.0
        for tp, run in sorted(runs.items()):
            linear_s, head_s, precision, catalog = weight_read_terms(spec, gpu, tp)
            xs.append(linear_s)
            ys.append(run.measured_tpot_seconds - head_s)
        fits.append({"spec": spec, "gpu": gpu, "precision": precision, "input_len": input_len,
                     "output_len": output_len, "concurrency": concurrency, "tp": sorted(runs),
                     "utilization": 1 / statistics.linear_regression(xs, ys).slope, "catalog_utilization": catalog})
    return fits


def summarize(fits: list[dict]) -> list[dict]:
    """Per GPU and matmul precision: the series' median u, their range and the catalog's."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for fit in fits:
        groups[(fit["gpu"], fit["precision"])].append(fit)
    return [{"gpu": gpu, "precision": precision, "series": len(group),
             "median_utilization": statistics.median(f["utilization"] for f in group),
             "min_utilization": min(f["utilization"] for f in group),
             "max_utilization": max(f["utilization"] for f in group),
             "catalog_utilization": group[0]["catalog_utilization"]}
            for (gpu, precision), group in sorted(groups.items())]


GEMM_FIXTURE = REPO / "tests/fixtures/aiconfigurator_silicon/serving_gemm_decode_vllm.csv"
GEMM_GPUS = {"h100_sxm": "H100-SXM5-80GB", "l40s": "L40S", "a100_sxm": "A100-SXM4-80GB"}
GEMM_PRECISIONS = {"bfloat16": ("bf16", 2), "fp8": ("fp8", 1)}


def gemm_fits() -> list[dict]:
    """Per GPU and precision: u from the least-squares slope of latency against weight bytes,
    t0 the intercept (s), and the catalog's u for that precision (DECODE_HBM_UTILIZATION where
    it has none)."""
    import csv

    points: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    with GEMM_FIXTURE.open() as handle:
        for row in csv.DictReader(handle):
            precision, width = GEMM_PRECISIONS[row["gemm_dtype"]]
            points[(row["gpu"], precision)].append((int(row["n"]) * int(row["k"]) * width,
                                                    float(row["latency_ms"]) / 1e3))
    fits = []
    for (gpu, precision), pairs in sorted(points.items()):
        catalog_gpu = resolve_cluster(f"1x1x{GEMM_GPUS[gpu]}").gpu
        line = statistics.linear_regression([w for w, _ in pairs], [t for _, t in pairs])
        catalog = catalog_gpu.decode_hbm_utilization(precision)
        fits.append({"gpu": catalog_gpu.name, "precision": precision, "shapes": len(pairs),
                     "utilization": 1 / (line.slope * catalog_gpu.hbm_bytes_per_s), "intercept_seconds": line.intercept,
                     "catalog_utilization": eff.DECODE_HBM_UTILIZATION if catalog is None else catalog})
    return fits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="the fits as JSON")
    parser.add_argument("--gemm", action="store_true", help="from the GEMMs alone (AIConfigurator, M <= 8)")
    args = parser.parse_args()
    if args.gemm:
        fits = gemm_fits()
        if args.json:
            print(json.dumps(fits, indent=2))
            return
        print(f"{'gpu':18s} {'precision':9s} {'shapes':>6s} {'u':>6s} {'t0 us':>6s} {'catalog':>8s}")
        for row in fits:
            print(f"{row['gpu']:18s} {row['precision']:9s} {row['shapes']:6d} {row['utilization']:6.3f} "
                  f"{row['intercept_seconds'] * 1e6:6.1f} {row['catalog_utilization']:8.3f}")
        return
    fits = series_fits(load_rows())
    summary = summarize(fits)
    if args.json:
        print(json.dumps({"series": fits, "summary": summary}, indent=2))
        return
    print(f"{'gpu':18s} {'precision':9s} {'series':>6s} {'u median':>9s} {'range':>13s} {'catalog':>8s}")
    for row in summary:
        print(f"{row['gpu']:18s} {row['precision']:9s} {row['series']:6d} {row['median_utilization']:9.3f} "
              f"{row['min_utilization']:6.3f}-{row['max_utilization']:.3f} {row['catalog_utilization']:8.3f}")


if __name__ == "__main__":
    main()
