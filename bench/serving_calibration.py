"""Serving calibration: the planner's TPOT and TTFT against AIConfigurator's measured vLLM runs.

    python bench/serving_calibration.py              # per group and overall, on stdout
    python bench/serving_calibration.py --verbose    # also one line per run
    python bench/serving_calibration.py --json       # the summary as JSON
    python bench/serving_calibration.py --by-tp      # also each group's signed error per TP degree
    python bench/serving_calibration.py --csv PATH   # another set with the same columns

    python bench/serving_calibration.py --as-benchmarked            # the benchmark's own protocol
    python bench/serving_calibration.py --as-benchmarked --quick    # its rows at concurrency <= 16

Every row of the set (tests/fixtures/aiconfigurator_silicon/vllm_agg.csv, README.md beside
it) is one aggregated vLLM replica: `spec` on tp GPUs of `gpu` (one node), `batch_size`
concurrent requests of `isl` input and `osl` output tokens. The planner estimates exactly
that layout (planner.serve.estimate, tp x pp x dp = tp x 1 x 1, --batch = the concurrency);
the error of a quantity is predicted / measured - 1 (+0.25: the planner says 25% slower).

Two ways to predict a row:
- steady state (default): the planner's default answer, a closed loop of identical requests
  that has run forever (planner/cost/continuous_batching.py).
- --as-benchmarked: the run as its benchmark ran it, where that is known. The rows from
  SemiAnalysis' InferenceX dumps (source_file=<date>.csv; the others name AIConfigurator's own
  collection, whose client settings are not published) ran kimbochen/bench_serving's
  benchmark_serving.py with --num-prompts 10 x concurrency, --max-concurrency concurrency,
  --request-rate inf, --ignore-eos and --random-range-ratio 0.8 (InferenceX
  benchmarks/70b_fp8_h100_slurm.sh, gptoss_fp4_h100.sh; the ratio from AIConfigurator's
  replay of those rows), whose random dataset draws each input and output length uniformly
  from [int(0.8 L), L], and the dumps hold the mean TTFT and TPOT. So each such row is the
  planner's burst simulation (planner.serve.burst_metrics) of 10 x C requests with lengths
  drawn the same way (seed 0), scored on the means; the first C requests arrive together and
  queue for their prompts, which the steady state does not see.
A row whose layout the planner rejects is not scored; it is listed with the reasons.
Importable: `load_rows(path)` and `score(rows)`, no I/O in `score`. Not part of the planner.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from planner import units  # noqa: E402
from planner.catalog import cluster_from_shorthand, resolve_model  # noqa: E402
from planner.layout import Layout, Rejected  # noqa: E402
from planner.requests import LayoutFilter, ServeRequest  # noqa: E402
from planner.serve import burst_metrics, estimate  # noqa: E402

FIXTURE = REPO / "tests/fixtures/aiconfigurator_silicon/vllm_agg.csv"
QUANTITIES = ("tpot", "ttft")
PROMPTS_PER_CLIENT = 10
"""InferenceX: --num-prompts $(( CONC * 10 ))."""
RANDOM_RANGE_RATIO = 0.8
"""InferenceX's --random-range-ratio (AIConfigurator's replay of its rows: random_range_ratio 0.8)."""
QUICK_MAX_CONCURRENCY = 16


@dataclass(frozen=True)
class Run:
    """One measured serving run (a fixture row), times in seconds."""

    id: str
    spec: str
    gpu: str
    precision: str
    tp: int
    pp: int
    input_len: int
    output_len: int
    concurrency: int
    measured_ttft_seconds: float
    measured_tpot_seconds: float
    benchmark: str = "unknown"
    """inferencex: the InferenceX client protocol above; unknown: not published."""
    backend_version: str = ""
    """The engine release the row names (empty where the dump names none)."""
    ep: int = 1
    """The row's moe_ep_size: expert parallelism over the TP group (moe_ep_size = tp_size,
    `--enable-expert-parallel` without data parallelism); 1 = the experts TP-split."""

    @property
    def layout_ep(self) -> int:
        """The EP degree the server ran: the row's, except
        - Kimi-K2.5 NVFP4, whose rows say ep 4 (the workflow's search space) but whose script
          never passed --enable-expert-parallel (benchmarks/single_node/kimik2.5_fp4_b200.sh at
          a58dedd5a and 64c20b6b5 reads no EP_SIZE): those runs split the experts over TP;
        - MiniMax-M2.5 fp8 on H200 under vLLM 0.18.0, whose rows say ep 1 (the workflow's default
          EP_SIZE, utils/matrix_logic/generate_sweep_configs.py) but whose script passed
          --enable-expert-parallel for any EP_SIZE of 1 or more (minimaxm2.5_fp8_h200.sh at
          1d5cae141, the 0.18.0 image: `if [ "$EP_SIZE" -ge 1 ]`, where the other scripts test
          -gt 1): the experts spread whole over the 8 GPUs (vLLM 0.18.0 would refuse to split
          them: 1,536 / 8 = 192 columns a GPU is no whole number of the checkpoint's 128-wide fp8
          blocks, fp8_utils.validate_fp8_block_shape_moe). Its 0.16.0 rows (measured
          2026-03-01, the script's first version a36346339) passed no EP flag."""
        if self.spec == "kimi-k2.5-nvfp4":
            return 1
        if self.spec == "minimax-m2.5" and self.gpu.startswith("H200") and self.backend_version == "0.18.0":
            return self.tp
        return self.ep

    @property
    def server_settings(self) -> dict:
        """The vllm serve settings InferenceX's scripts set that change the estimate (none known
        for the other rows; SemiAnalysisAI/InferenceX benchmarks/, read at commits 1fc5d73 and
        ffdb196, which agree on these): --max-model-len ISL + OSL + 20 (1024/1024) or + 200 (an
        8192 side), else 10240 (script_max_model_len), except gptoss_fp4_h100.sh's fixed 10240;
        --kv-cache-dtype fp8 for Llama-3.1-70B (70b_fp8_h100_slurm.sh, 70b_fp8_h200_slurm.sh,
        70b_fp4_b200_docker.sh) and gpt-oss on B200 (gptoss_fp4_b200.sh); the Marlin MoE kernel
        for gpt-oss on Hopper (gptoss_fp4_h100.sh, gptoss_fp4_h200.sh: VLLM_MXFP4_USE_MARLIN=1,
        --moe-backend marlin in current vLLM); FlashInfer's MXFP4 kernel with MXFP8 activations
        for gpt-oss on B200 (gptoss_fp4_b200.sh: VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1, the
        planner's --moe-backend flashinfer_mxfp8). All use --max-num-batched-tokens 8192, the
        planner's H100-class default, and no prefix caching. Not carried: the B200 Llama scripts'
        cudagraph_mode FULL_DECODE_ONLY (prompt steps uncaptured; docs/cost-model.md, Serving:
        calibration) and their VLLM_FLASHINFER_ALLREDUCE_FUSION_THRESHOLDS_MB {"2":32,"4":32,"8":8}."""
        if self.benchmark != "inferencex":
            return {}
        # vLLM 0.10.2 (Llama), 0.15.1 and 0.18.0 (gpt-oss) tokenize in AsyncMicrobatchTokenizer's
        # batches (read in 0.10.2 and 0.22.0; cost/ingress.py), not 0.33.0's one prompt at a time
        tokenizer = {"prompt_tokenizer": "microbatch"}
        if self.spec == "minimax-m2.5":
            # minimaxm2.5_fp8_h200.sh at 5e2c705d3 (the 0.16.0 runs) and 1d5cae141 (0.18.0):
            # --gpu-memory-utilization 0.95, every other setting vLLM's default (16-bit KV cache);
            # minimaxm2.5_fp8_h100.sh at 1d5cae141: 0.90, --max-num-seqs 256 (above every C run),
            # --enable-expert-parallel (ep = tp 4)
            utilization = 0.90 if self.gpu.startswith("H100") else 0.95
            return {"max_model_len": self.script_max_model_len, "gpu_memory_utilization": utilization, **tokenizer}
        if self.spec == "minimax-m2.5-nvfp4":
            # minimaxm2.5_fp4_b200.sh: the nightly runs (2026-04-03) at 08bcde8f1,
            # --gpu-memory-utilization 0.95 --kv-cache-dtype fp8; the 0.19.0 runs (2026-04-08 and
            # -22) at a9c199207 / 7b40de998, 0.90, fp8 and --max-num-batched-tokens 2 x ISL
            if self.backend_version.startswith("nightly"):
                return {"max_model_len": self.script_max_model_len, "gpu_memory_utilization": 0.95,
                        "kv_cache_dtype": "fp8", **tokenizer}
            return {"max_model_len": self.script_max_model_len, "gpu_memory_utilization": 0.90, "kv_cache_dtype": "fp8",
                    "max_num_batched_tokens": 2 * self.input_len, **tokenizer}
        if self.spec == "kimi-k2.5-nvfp4":
            # kimik2.5_fp4_b200.sh at a58dedd5a (0.17.0, runs measured 2026-03-11T16:59Z):
            # --gpu-memory-utilization 0.90 --max-num-seqs CONC, the fused all-reduce + RMSNorm pass
            return {"max_model_len": self.script_max_model_len, "gpu_memory_utilization": 0.90, **tokenizer}
        if self.spec == "kimi-k2.5":
            # kimik2.5_int4_h200.sh / _b200.sh at 79a42e20a / 79ea3651a (0.16.0 / 0.15.1):
            # --gpu-memory-utilization 0.95 --max-num-seqs CONC and the fused all-reduce + RMSNorm
            # pass; B200 with VLLM_USE_FLASHINFER_MOE_INT4=1 (ran_flashinfer_int4_moe)
            return {"max_model_len": self.script_max_model_len, "gpu_memory_utilization": 0.95, **tokenizer}
        if self.spec.startswith("llama-3.1-70b"):
            return {"kv_cache_dtype": "fp8", "max_model_len": self.script_max_model_len, **tokenizer}
        if self.gpu.startswith("H100"):
            return {"max_model_len": 10240, "moe_backend": "marlin", **tokenizer}
        if self.gpu.startswith("H200"):
            return {"max_model_len": self.script_max_model_len, "moe_backend": "marlin", **tokenizer}
        return {"max_model_len": self.script_max_model_len, "kv_cache_dtype": "fp8", "moe_backend": "flashinfer_mxfp8",
                **tokenizer}

    @property
    def ran_vllm_0_10_2(self) -> bool:
        """InferenceX ran its Llama-3.1-70B rows under vLLM 0.10.2 (.github/workflows/70b-tmpl.yml
        at commit 24ea7def4, image vllm/vllm-openai:v0.10.2). Two of that release's defaults differ
        from current vLLM: piecewise CUDA graphs, attention outside the graph (vLLM PR #25444 made
        FULL_AND_PIECEWISE the default in 0.11), and no fused all-reduce + RMSNorm
        (PassConfig.enable_fi_allreduce_fusion False, vllm/config/compilation.py). The B200 scripts
        override both (70b_fp8_b200_docker.sh, 70b_fp4_b200_docker.sh: cudagraph_mode
        FULL_DECODE_ONLY, "enable_fi_allreduce_fusion": true); the Hopper ones override neither
        (70b_fp8_h100_slurm.sh, 70b_fp8_h200_slurm.sh). True for those Hopper rows."""
        return self.benchmark == "inferencex" and self.spec.startswith("llama-3.1-70b") and self.gpu.startswith("H")

    @property
    def engine_fuses_allreduce(self) -> bool:
        """Whether the server fused the TP all-reduce with the next RMSNorm, as current vLLM does
        by default on Hopper and Blackwell (the catalog's serving_allreduce); not under
        ran_vllm_0_10_2 defaults, which run vLLM's unfused all-reduce (serving_allreduce_unfused)."""
        return not self.ran_vllm_0_10_2

    @property
    def ran_flashinfer_int4_moe(self) -> bool:
        """Kimi-K2.5 INT4 on B200 ran with VLLM_USE_FLASHINFER_MOE_INT4=1 (kimik2.5_int4_b200.sh
        from 79ea3651a, committed 4 s before those runs began), which moves INT4 experts from
        Marlin (the planner's default, vLLM's without it) to FlashInfer's TRT-LLM kernel: not
        measured, so priced as the dense fallback."""
        return self.spec == "kimi-k2.5" and self.gpu.startswith("B200")

    @property
    def script_max_model_len(self) -> int:
        """InferenceX's CALCULATED_MAX_MODEL_LEN for this row's lengths."""
        if (self.input_len, self.output_len) == (1024, 1024):
            return self.input_len + self.output_len + 20
        if 8192 in (self.input_len, self.output_len):
            return self.input_len + self.output_len + 200
        return 10240

    @property
    def group(self) -> str:
        return f"{self.spec} {self.gpu}"


def benchmark_of(source: str) -> str:
    """InferenceX dumps are named by date (source_file=2026-04-06.csv; ...); AIConfigurator's own
    collection by a path (source_file=/Users/...)."""
    return "unknown" if source.startswith("source_file=/") else "inferencex"


def benchmark_lengths(run: Run, seed: int = 0) -> tuple[tuple[int, int], ...]:
    """10 x C (input, output) lengths as the random dataset draws them: uniform integers in
    [int(L * ratio), L] (benchmark_serving.py sample_random_requests)."""
    rng = random.Random(seed)
    return tuple((rng.randint(int(run.input_len * RANDOM_RANGE_RATIO), run.input_len),
                  rng.randint(int(run.output_len * RANDOM_RANGE_RATIO), run.output_len))
                 for _ in range(PROMPTS_PER_CLIENT * run.concurrency))


def parse_row(row: dict[str, str]) -> Run:
    """A fixture row as a Run; a missing, extra or malformed cell raises (nothing is skipped)."""
    if None in row or None in row.values():
        raise ValueError(f"row {row.get('id')!r}: {len(row)} cells, not one per column")
    return Run(
        id=row["id"], spec=row["spec"], gpu=row["gpu"], precision=row["precision"] or "bf16",
        tp=int(float(row["tp_size"])), pp=int(float(row["pp_size"])),
        input_len=int(row["isl"]), output_len=int(row["osl"]), concurrency=int(row["batch_size"]),
        measured_ttft_seconds=units.ms_to_seconds(float(row["silicon_ttft_ms"])),
        measured_tpot_seconds=units.ms_to_seconds(float(row["silicon_tpot_ms"])),
        benchmark=benchmark_of(row["silicon_data_source"]),
        ep=int(float(row["moe_ep_size"])) if row["moe_ep_size"] else 1,
        backend_version=row["backend_version"],
    )


def load_rows(path: Path = FIXTURE) -> list[Run]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [parse_row(row) for row in csv.DictReader(handle)]


def predict(run: Run, as_benchmarked: bool = False) -> dict:
    """The planner's estimate of one run: predicted times and errors, or the rejection.
    as_benchmarked: an InferenceX row is simulated as its benchmark ran (the module's doc)."""
    model = resolve_model(run.spec)
    num_gpus = run.tp * run.pp
    cluster = cluster_from_shorthand(1, num_gpus, run.gpu, f"1x{num_gpus}x{run.gpu}")
    if not run.engine_fuses_allreduce:
        cluster = cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update={"serving_allreduce": []})})
    if run.ran_flashinfer_int4_moe:  # not Marlin: FlashInfer's INT4 kernel, unmeasured (the dense fallback)
        kernels = cluster.gpu.serving_moe_kernels.model_copy(update={"marlin_mxfp4": None})
        cluster = cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update={"serving_moe_kernels": kernels})})
    simulate = as_benchmarked and run.benchmark == "inferencex"
    burst = {}
    if simulate:
        burst = {"num_prompts": PROMPTS_PER_CLIENT * run.concurrency, "max_concurrency": run.concurrency,
                 "request_rate_per_s": float("inf"), "dataset_lengths": benchmark_lengths(run)}
    request = ServeRequest(input_len=run.input_len, output_len=run.output_len, batch=run.concurrency,
                           layout=LayoutFilter(tp=run.tp, pp=run.pp, dp=1, ep=run.layout_ep), **run.server_settings,
                           **burst)
    result = estimate(model, cluster, Layout(run.tp, run.pp, 1, run.layout_ep), request)
    if isinstance(result, Rejected):
        return {"id": run.id, "group": run.group, "rejected": list(result.reasons)}
    measured = {"tpot": run.measured_tpot_seconds, "ttft": run.measured_ttft_seconds}
    wave = {}
    if simulate:
        metrics = burst_metrics(model, cluster, result, request)
        predicted = {"tpot": metrics.tpot_seconds.mean, "ttft": metrics.ttft_seconds.mean}
        if metrics.first_wave is not None:  # the requests sent after the first C, against the steady state
            wave = {"later_over_steady_ttft": metrics.first_wave.later_ttft_mean_seconds / result.ttft_seconds}
    else:
        predicted = {"tpot": result.tpot_seconds, "ttft": result.ttft_seconds}
    return {
        "id": run.id, "group": run.group, "benchmark": "simulated" if simulate else "steady",
        "tp": run.tp, "ep": run.layout_ep, "input_len": run.input_len,
        "output_len": run.output_len, "concurrency": run.concurrency, "batch": result.batch,
        **{f"measured_{q}_seconds": measured[q] for q in QUANTITIES},
        **{f"predicted_{q}_seconds": predicted[q] for q in QUANTITIES},
        **{f"{q}_error": predicted[q] / measured[q] - 1 for q in QUANTITIES},
        **wave,
    }


def error_stats(errors: list[float]) -> dict[str, float]:
    """Median and max of |error| and the signed median (errors as fractions)."""
    magnitudes = [abs(e) for e in errors]
    return {"median_abs": statistics.median(magnitudes), "max_abs": max(magnitudes),
            "median_signed": statistics.median(errors), "num_runs": len(errors)}


def summarize(scored: list[dict]) -> dict:
    return {q: error_stats([s[f"{q}_error"] for s in scored]) for q in QUANTITIES} if scored else {}


def quick_rows(rows: list[Run]) -> list[Run]:
    """The InferenceX rows at concurrency <= QUICK_MAX_CONCURRENCY and at most 1,024 output
    tokens: their simulations take seconds, not the quarter hour of the whole set."""
    return [r for r in rows if r.benchmark == "inferencex" and r.concurrency <= QUICK_MAX_CONCURRENCY
            and r.output_len <= 1024]


def score(rows: list[Run], as_benchmarked: bool = False) -> dict:
    """Every run predicted; statistics per group (model x GPU) and overall, rejections listed."""
    results = [predict(run, as_benchmarked) for run in rows]
    scored = [r for r in results if "rejected" not in r]
    groups = sorted({r["group"] for r in scored})
    return {
        "num_rows": len(rows),
        "num_scored": len(scored),
        "rejected": [r for r in results if "rejected" in r],
        "num_kv_starved": sum(r["batch"] < r["concurrency"] for r in scored),
        "overall": summarize(scored),
        "groups": {g: summarize([r for r in scored if r["group"] == g]) for g in groups},
        "groups_by_tp": {g: {tp: summarize([r for r in scored if r["group"] == g and r["tp"] == tp])
                             for tp in sorted({r["tp"] for r in scored if r["group"] == g})} for g in groups},
        "later_over_steady_ttft": quantiles([r["later_over_steady_ttft"] for r in scored
                                             if "later_over_steady_ttft" in r]),
        "runs": scored,
    }


def quantiles(values: list[float]) -> dict | None:
    """The 10th, 50th and 90th percentiles and the count; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p10": at(0.1), "median": statistics.median(ordered), "p90": at(0.9), "num_runs": len(ordered)}


def percent(fraction: float, sign: str = "+") -> str:
    return f"{100 * fraction:{sign}.0f}%"


def stats_cells(stats: dict) -> str:
    return "  ".join(f"{percent(stats[q]['median_abs'], ''):>6} {percent(stats[q]['max_abs'], ''):>7} "
                     f"{percent(stats[q]['median_signed']):>6}" for q in QUANTITIES)


def print_by_tp(summary: dict) -> None:
    """Each group's signed median TPOT and TTFT error per TP degree: how the error moves with TP."""
    print(f"{'group':<38} signed median TPOT / TTFT error by tp")
    for group, by_tp in summary["groups_by_tp"].items():
        cells = "  ".join(f"tp{tp}: {percent(stats['tpot']['median_signed'])} / {percent(stats['ttft']['median_signed'])}"
                          for tp, stats in by_tp.items())
        print(f"{group:<38} {cells}")
    print()


def print_report(summary: dict, verbose: bool) -> None:
    if verbose:
        print(f"{'id':<90} {'tp':>2} {'isl':>5} {'osl':>5} {'conc':>4}  tpot ms meas/pred  ttft ms meas/pred")
        for r in summary["runs"]:
            cells = "  ".join(
                f"{units.seconds_to_ms(r[f'measured_{q}_seconds']):8.1f} "
                f"{units.seconds_to_ms(r[f'predicted_{q}_seconds']):8.1f} {percent(r[f'{q}_error']):>6}"
                for q in QUANTITIES)
            print(f"{r['id'][:90]:<90} {r['tp']:>2} {r['input_len']:>5} {r['output_len']:>5} "
                  f"{r['concurrency']:>4}  {cells}")
        print()
    header = "TPOT |err| med    max signed  TTFT |err| med    max signed"
    print(f"{'group':<38} {'runs':>4}  {header}")
    for group, stats in summary["groups"].items():
        print(f"{group:<38} {stats['tpot']['num_runs']:>4}  {stats_cells(stats)}")
    if summary["overall"]:
        print(f"{'overall':<38} {summary['num_scored']:>4}  {stats_cells(summary['overall'])}")
    print(f"\n{summary['num_scored']} of {summary['num_rows']} runs scored; "
          f"{len(summary['rejected'])} rejected by the planner; {summary['num_kv_starved']} KV-starved "
          f"(the planner's KV cache holds fewer sequences than the run's concurrency)")
    for r in summary["rejected"]:
        print(f"  rejected {r['id']}: {'; '.join(r['rejected'])}")
    later = summary["later_over_steady_ttft"]
    if later is not None:
        print(f"\nThe first wave: vllm bench serve sends a run's first C requests at once; in the {later['num_runs']} "
              f"simulated runs the requests sent after them average {later['median']:.2f} of the steady state's TTFT "
              f"(median; 10th-90th percentile {later['p10']:.2f}-{later['p90']:.2f}), so the measured means' excess "
              f"over the steady state is the first wave's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=FIXTURE, help="runs to score (default: the fixture)")
    parser.add_argument("--json", action="store_true", help="the summary as JSON (per-run rows with --verbose)")
    parser.add_argument("--verbose", action="store_true", help="one line per run")
    parser.add_argument("--as-benchmarked", action="store_true",
                        help="simulate the InferenceX rows as their benchmark ran them (slow: ~15 min for all)")
    parser.add_argument("--by-tp", action="store_true", help="also each group's signed median error per TP degree")
    parser.add_argument("--quick", action="store_true",
                        help=f"only the InferenceX rows at concurrency <= {QUICK_MAX_CONCURRENCY}, output <= 1,024")
    args = parser.parse_args()
    rows = load_rows(args.csv)
    summary = score(quick_rows(rows) if args.quick else rows, args.as_benchmarked)
    if args.json:
        if not args.verbose:
            summary = {k: v for k, v in summary.items() if k != "runs"}
        print(json.dumps(summary, indent=2))
    else:
        if args.by_tp:
            print_by_tp(summary)
        print_report(summary, args.verbose)


if __name__ == "__main__":
    main()
