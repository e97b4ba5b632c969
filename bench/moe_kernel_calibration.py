"""The serving step's fused-MoE kernels against AIConfigurator's measured vLLM 0.24.0 MoE ops on
H100, H200, B200, GB200 and L40S: the fit of the catalog's serving_moe_kernels and its error.

    python bench/moe_kernel_calibration.py          # error per GPU and expert format, before/after
    python bench/moe_kernel_calibration.py --fit    # also refit the five constants of each kernel
    python bench/moe_kernel_calibration.py --json

Data: tests/fixtures/aiconfigurator_silicon/vllm_moe_kernels.csv (tools/extract_aic_moe_kernels.py;
aiconfigurator-core 0.12.0, systems/data/<gpu>/moe/vllm/0.24.0/moe_perf.parquet): the fused MoE
op's latency on one GPU, balanced routing, no EP, tp <= 8 with >= 128 expert columns per GPU,
1-16,384 tokens, the kernel AIConfigurator collected for each (GPU, kernel key: a weight format,
marlin_mxfp4 for --moe-backend marlin, fp8_ep for block fp8 under EP, whose rows are at ep 2-256
and tp 1); shapes of Qwen3-30B/235B, Mixtral, DeepSeek-V3, gpt-oss and others.

Each row is priced by the planner's own serving_time.moe_layer_gemm_seconds with the routing the
collector used: token i goes to experts (i + j ceil(E/k)) mod E, so min(E, N k) experts are
touched (aiconfigurator collector/helper.py balanced_logits). "before" is the dense fallback
(no floor, DECODE_HBM_UTILIZATION, the dense GEMM rate and half-rate dimension), "after" the
catalog's kernel. The fit minimizes the mean squared log error over a family's rows by
coordinate descent on the logs of the five constants (floor, HBM share, rate, half-rate rows, pair passes),
minimizing the mean |log error|.
Errors are predicted / measured - 1. Importable; no I/O in the scoring functions. Not part of
the planner.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from planner import units  # noqa: E402
from planner.catalog import resolve_cluster, resolve_model  # noqa: E402
from planner.cost import efficiency as eff  # noqa: E402
from planner.cost.serving_time import (  # noqa: E402
    MoeKernelRates,
    achievable_flops_per_s,
    expert_gemm_terms,
    measured_moe_kernel_rates,
    mlp_gemms,
    moe_kernel_seconds_of_terms,
    routed_expert_bytes_read,
    routed_pair_pass_bytes,
)
from planner.layout import Layout  # noqa: E402
from planner.specs import MAX_PAIR_PASSES, ClusterSpec, ModelSpec  # noqa: E402

FIXTURE = REPO / "tests/fixtures/aiconfigurator_silicon/vllm_moe_kernels.csv"
CLUSTERS = {"h100_sxm": "1x8xH100-SXM5-80GB", "h200_sxm": "1x8xH200-SXM-141GB", "b200_sxm": "1x8xB200-SXM-180GB",
            "gb200": "1x4xGB200", "l40s": "1x8xL40S"}
BASE_SPEC = "qwen3-30b-a3b"
"""A MoE spec the rows' shapes are written into (only the expert shapes and format matter)."""
QUANTIZATION = {"bf16": None, "fp8": "fp8", "mxfp4": "mxfp4", "nvfp4": "nvfp4", "marlin_mxfp4": "mxfp4",
                "flashinfer_mxfp8_mxfp4": "mxfp4", "fp8_ep": "fp8"}
"""The fixture's kernel key (a ServingMoeKernels field: a weight format, backend_format for a
non-default MoE backend, format_ep for the engine's kernel under EP) -> the spec's quantization."""
HELD_FLOOR = {"marlin_mxfp4": "mxfp4"}
"""Kernel keys measured at one shape only, whose floor is held at another key's (fit_family)."""
DECODE_MAX_TOKENS = 256
PREFILL_MIN_TOKENS = 4096
FIT_STEPS = (0.5, 0.2, 0.05, 0.01, 0.002)
"""Log-space step sizes of the coordinate descent, coarse to fine."""
FIT_START_FLOOR_SECONDS = units.us_to_seconds(20)
FIT_MIN_FLOOR_SECONDS = units.us_to_seconds(1)
"""No fused op of several kernels takes less (on L40S the weight read covers the floor: the fit
goes to it)."""
FIT_START_PAIR_PASSES = 1.0
FIT_MIN_PAIR_PASSES = 0.01
"""The pair passes' search range starts at one pass and ends at MAX_PAIR_PASSES above and at
0.01 below (none: at 0.01 passes the term is under 0.1% of any row)."""


@dataclass(frozen=True)
class KernelRow:
    gpu: str
    weight_format: str
    hidden_size: int
    inter_size: int
    topk: int
    num_experts: int
    tp: int
    num_tokens: int
    measured_seconds: float
    ep: int = 1
    """The EP degree (rows of an EP kernel key): the rank holds E/ep experts and num_tokens are
    the EP group's, routed over all E."""


@dataclass(frozen=True)
class Priced:
    """A row's work as the planner sees it: the touched experts' bytes and the expert GEMMs."""

    weight_bytes: float
    gemm_terms: tuple[float, float]
    """The expert GEMMs as serving_time.expert_gemm_terms (fixed while a fit varies the kernel)."""
    measured_seconds: float
    pair_pass_bytes: float


def load_rows(path: Path = FIXTURE) -> list[KernelRow]:
    with path.open() as f:
        return [KernelRow(r["gpu"], r["weight_format"], int(r["hidden_size"]), int(r["inter_size"]), int(r["topk"]),
                          int(r["num_experts"]), int(r["tp"]), int(r["num_tokens"]),
                          units.ms_to_seconds(float(r["latency_ms"])), int(r["ep"])) for r in csv.DictReader(f)]


@functools.cache
def cluster(gpu: str) -> ClusterSpec:
    return resolve_cluster(CLUSTERS[gpu])


@functools.cache
def row_model(weight_format: str, hidden_size: int, inter_size: int, topk: int, num_experts: int) -> ModelSpec:
    return resolve_model(BASE_SPEC).model_copy(update={
        "hidden_size": hidden_size, "moe_intermediate_size": inter_size, "num_experts_per_tok": topk,
        "num_local_experts": num_experts, "quantization": QUANTIZATION[weight_format],
        "quantization_scope": "all" if weight_format in ("bf16", "fp8") else "experts"})


def model_of(row: KernelRow) -> ModelSpec:
    return row_model(row.weight_format, row.hidden_size, row.inter_size, row.topk, row.num_experts)


def row_layout(row: KernelRow) -> tuple[Layout, float]:
    """The planner's layout for a row and its replica's tokens: one replica of tp GPUs, or under
    EP the replica of Layout(tp=1, dp=ep, ep=ep) carrying num_tokens / ep (the collector's
    num_tokens are the EP group's)."""
    if row.ep > 1:
        return Layout(tp=1, pp=1, dp=row.ep, ep=row.ep), row.num_tokens / row.ep
    return Layout(tp=row.tp, pp=1, dp=1), float(row.num_tokens)


def priced(row: KernelRow) -> Priced:
    """The planner's bytes and GEMMs for the row under the collector's balanced routing."""
    model = model_of(row)
    layout, tokens = row_layout(row)
    touched = min(row.num_experts, row.num_tokens * row.topk)
    gemms = mlp_gemms(model, layout, tokens, touched)
    return Priced(routed_expert_bytes_read(model, layout, tokens, touched), expert_gemm_terms(gemms),
                  row.measured_seconds, routed_pair_pass_bytes(model, gemms))


def catalog_kernel(gpu: str, weight_format: str, rows: list[KernelRow]) -> MoeKernelRates:
    """The catalog's kernel of this key on this GPU (the dense fallback where it has none)."""
    measured = getattr(cluster(gpu).gpu.serving_moe_kernels, weight_format)
    if measured is None:
        return dense_fallback_kernel(gpu, weight_format, rows)
    return measured_moe_kernel_rates(measured, cluster(gpu))


def dense_fallback_kernel(gpu: str, weight_format: str, rows: list[KernelRow]) -> MoeKernelRates:
    """What the step used before the catalog had the kernel (serving_time.moe_kernel's fallback)."""
    row = next(r for r in rows if r.gpu == gpu and r.weight_format == weight_format)
    gpu_spec = cluster(gpu)
    return MoeKernelRates(0.0, gpu_spec.gpu.hbm_bytes_per_s * eff.DECODE_HBM_UTILIZATION,
                          achievable_flops_per_s(model_of(row), gpu_spec), eff.GEMM_HALF_RATE_DIMENSION, "model")


def predict(kernel: MoeKernelRates, p: Priced) -> float:
    return moe_kernel_seconds_of_terms(kernel, p.weight_bytes, p.gemm_terms, pair_pass_bytes=p.pair_pass_bytes)[0]


def families(rows: list[KernelRow]) -> dict[tuple[str, str], list[KernelRow]]:
    groups: dict[tuple[str, str], list[KernelRow]] = {}
    for row in rows:
        groups.setdefault((row.gpu, row.weight_format), []).append(row)
    return dict(sorted(groups.items()))


def score(kernel: MoeKernelRates, rows: list[KernelRow]) -> dict:
    """median and max |error| over the rows, and the median |error| and signed error of the
    decode-sized (<= 256 tokens) and prefill-sized (>= 4096) ones, and the prefill-sized ones'
    median signed error at each TP degree (the rows without EP)."""
    errors = [(r.num_tokens, predict(kernel, priced(r)) / r.measured_seconds - 1) for r in rows]
    decode = [e for n, e in errors if n <= DECODE_MAX_TOKENS]
    prefill = [e for n, e in errors if n >= PREFILL_MIN_TOKENS]
    by_tp: dict[int, list[float]] = {}
    for r, (n, e) in zip(rows, errors, strict=True):
        if n >= PREFILL_MIN_TOKENS and r.ep == 1:
            by_tp.setdefault(r.tp, []).append(e)
    return {"rows": len(errors), "median_abs": statistics.median(abs(e) for _, e in errors),
            "max_abs": max(abs(e) for _, e in errors),
            "decode_median_abs": statistics.median(abs(e) for e in decode), "decode_median_signed": statistics.median(decode),
            "prefill_median_abs": statistics.median(abs(e) for e in prefill),
            "prefill_median_signed": statistics.median(prefill),
            "prefill_median_signed_by_tp": {tp: statistics.median(v) for tp, v in sorted(by_tp.items())}}


def log_loss(kernel: MoeKernelRates, rows: list[Priced]) -> float:
    """Mean |log(predicted / measured)|: a median-type fit, robust to the few points a kernel
    runs far off its trend (L40S has points at 3-4x)."""
    return sum(abs(math.log(predict(kernel, p) / p.measured_seconds)) for p in rows) / len(rows)


def fit(rows: list[KernelRow], start: MoeKernelRates, hbm_bytes_per_s: float,
        floor_seconds: float | None = None) -> MoeKernelRates:
    """The five constants minimizing log_loss: coordinate descent on their logs, each step of
    FIT_STEPS tried up and down on each constant until none improves. The weight stream starts
    at the datasheet bandwidth and may only go below it: where the padded expert GEMMs bound
    every row (u(M) at a few rows per expert prices each touched expert like a weight read)
    it stays at 1. The floor stays at or above FIT_MIN_FLOOR_SECONDS and the pair passes in
    [FIT_MIN_PAIR_PASSES, MAX_PAIR_PASSES]; `floor_seconds` given, the floor is held there and
    the other four are fitted."""
    data = [priced(r) for r in rows]
    names = ("floor_seconds", "hbm_bytes_per_s", "flops_per_s", "half_rows", "pair_passes")[0 if floor_seconds is None else 1:]
    best = replace(start, floor_seconds=floor_seconds or FIT_START_FLOOR_SECONDS, hbm_bytes_per_s=hbm_bytes_per_s,
                   pair_passes=FIT_START_PAIR_PASSES, source="measured")
    best_loss = log_loss(best, data)
    for step in FIT_STEPS:
        improved = True
        while improved:
            improved = False
            for name in names:
                for factor in (math.exp(step), math.exp(-step)):
                    trial = replace(best, **{name: getattr(best, name) * factor})
                    if (trial.hbm_bytes_per_s > hbm_bytes_per_s or trial.floor_seconds < FIT_MIN_FLOOR_SECONDS
                            or not FIT_MIN_PAIR_PASSES <= trial.pair_passes <= MAX_PAIR_PASSES):
                        continue
                    loss = log_loss(trial, data)
                    if loss < best_loss:
                        best, best_loss, improved = trial, loss, True
    return best


def fit_family(gpu: str, weight_format: str, rows: list[KernelRow]) -> MoeKernelRates:
    """The fitted kernel of one (GPU, kernel key) family. A non-default backend's family
    (marlin_mxfp4) is measured at one shape only, where the op's fixed cost cannot be told
    from its per-expert work (a free fit puts 62-66 us into the floor, which then prices every
    gpt-oss decode step's 36 MoE layers 1.1 ms high): its floor is held at the default
    kernel's for the same format and GPU (the routing, alignment and launch kernels around the
    expert GEMMs are vLLM's own, whichever backend runs the GEMMs) and the other four fitted.
    The pair passes run at the GPU's elementwise HBM rate (serving_time.measured_moe_kernel_rates)."""
    group = [r for r in rows if r.gpu == gpu and r.weight_format == weight_format]
    floor = None
    if weight_format in HELD_FLOOR and getattr(cluster(gpu).gpu.serving_moe_kernels, HELD_FLOOR[weight_format]):
        floor = catalog_kernel(gpu, HELD_FLOOR[weight_format], rows).floor_seconds
    gpu_spec = cluster(gpu).gpu
    start = replace(dense_fallback_kernel(gpu, weight_format, rows), pair_bytes_per_s=eff.elementwise_bytes_per_s(
        gpu_spec.hbm_bytes_per_s, gpu_spec.elementwise_hbm_utilization))
    return fit(group, start, gpu_spec.hbm_bytes_per_s, floor)


def catalog_entry(kernel: MoeKernelRates, gpu: str) -> dict:
    """The fitted kernel as gpus.yaml's serving_moe_kernels entry."""
    return {"floor_us": round(units.seconds_to_us(kernel.floor_seconds), 1),
            "hbm_utilization": round(kernel.hbm_bytes_per_s / cluster(gpu).gpu.hbm_bytes_per_s, 3),
            "tflops": round(kernel.flops_per_s / 1e12), "half_rows": round(kernel.half_rows),
            "pair_passes": round(kernel.pair_passes, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit each kernel's five constants (about 20 s)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = load_rows()
    report = {}
    for (gpu, weight_format), group in families(rows).items():
        entry = {"before": score(dense_fallback_kernel(gpu, weight_format, rows), group),
                 "after": score(catalog_kernel(gpu, weight_format, rows), group)}
        if args.fit:
            fitted = fit_family(gpu, weight_format, rows)
            entry["fitted"] = catalog_entry(fitted, gpu)
            entry["fitted_score"] = score(fitted, group)
        report[f"{gpu} {weight_format}"] = entry
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print("Fused MoE op, error = predicted / measured - 1 (balanced routing, no EP)")
    print(f"{'gpu, format':18} {'rows':>5} {'':6} {'|err| med':>9} {'max':>6} {'decode med':>10} {'signed':>7} "
          f"{'prefill med':>11} {'signed':>7}  prefill signed by tp")
    for key, entry in report.items():
        for label in ("before", "after", "fitted_score"):
            if label in entry:
                v = entry[label]
                print(f"{key:18} {v['rows']:5d} {label[:6]:6} {v['median_abs']:9.0%} {v['max_abs']:6.0%} "
                      f"{v['decode_median_abs']:10.0%} {v['decode_median_signed']:+7.0%} "
                      f"{v['prefill_median_abs']:11.0%} {v['prefill_median_signed']:+7.0%}  "
                      + " ".join(f"{tp}:{e:+.0%}" for tp, e in v["prefill_median_signed_by_tp"].items()))
        if "fitted" in entry:
            print(f"{'':18} fitted: {entry['fitted']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
