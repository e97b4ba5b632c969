"""Serving calibration: the planner's TPOT and TTFT against AIConfigurator's measured vLLM runs.

    python bench/serving_calibration.py              # per group and overall, on stdout
    python bench/serving_calibration.py --verbose    # also one line per run
    python bench/serving_calibration.py --json       # the summary as JSON
    python bench/serving_calibration.py --csv PATH   # another set with the same columns

Every row of the set (tests/fixtures/aiconfigurator_silicon/vllm_agg.csv, README.md beside
it) is one aggregated vLLM replica: `spec` on tp GPUs of `gpu` (one node), `batch_size`
concurrent requests of `isl` input and `osl` output tokens. The planner estimates exactly
that layout (planner.serve.estimate, tp x pp x dp = tp x 1 x 1, --batch = the concurrency);
the error of a quantity is predicted / measured - 1 (+0.25: the planner says 25% slower).
A row whose layout the planner rejects is not scored; it is listed with the reasons.
Importable: `load_rows(path)` and `score(rows)`, no I/O in `score`. Not part of the planner.
"""

from __future__ import annotations

import argparse
import csv
import json
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
from planner.serve import estimate  # noqa: E402

FIXTURE = REPO / "tests/fixtures/aiconfigurator_silicon/vllm_agg.csv"
QUANTITIES = ("tpot", "ttft")


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

    @property
    def group(self) -> str:
        return f"{self.spec} {self.gpu}"


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
    )


def load_rows(path: Path = FIXTURE) -> list[Run]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [parse_row(row) for row in csv.DictReader(handle)]


def predict(run: Run) -> dict:
    """The planner's estimate of one run: predicted times and errors, or the rejection."""
    model = resolve_model(run.spec)
    num_gpus = run.tp * run.pp
    cluster = cluster_from_shorthand(1, num_gpus, run.gpu, f"1x{num_gpus}x{run.gpu}")
    request = ServeRequest(input_len=run.input_len, output_len=run.output_len, batch=run.concurrency,
                           layout=LayoutFilter(tp=run.tp, pp=run.pp, dp=1))
    result = estimate(model, cluster, Layout(run.tp, run.pp, 1), request)
    if isinstance(result, Rejected):
        return {"id": run.id, "group": run.group, "rejected": list(result.reasons)}
    measured = {"tpot": run.measured_tpot_seconds, "ttft": run.measured_ttft_seconds}
    predicted = {"tpot": result.tpot_seconds, "ttft": result.ttft_seconds}
    return {
        "id": run.id, "group": run.group, "tp": run.tp, "input_len": run.input_len,
        "output_len": run.output_len, "concurrency": run.concurrency, "batch": result.batch,
        **{f"measured_{q}_seconds": measured[q] for q in QUANTITIES},
        **{f"predicted_{q}_seconds": predicted[q] for q in QUANTITIES},
        **{f"{q}_error": predicted[q] / measured[q] - 1 for q in QUANTITIES},
    }


def error_stats(errors: list[float]) -> dict[str, float]:
    """Median and max of |error| and the signed median (errors as fractions)."""
    magnitudes = [abs(e) for e in errors]
    return {"median_abs": statistics.median(magnitudes), "max_abs": max(magnitudes),
            "median_signed": statistics.median(errors), "num_runs": len(errors)}


def summarize(scored: list[dict]) -> dict:
    return {q: error_stats([s[f"{q}_error"] for s in scored]) for q in QUANTITIES} if scored else {}


def score(rows: list[Run]) -> dict:
    """Every run predicted; statistics per group (model x GPU) and overall, rejections listed."""
    results = [predict(run) for run in rows]
    scored = [r for r in results if "rejected" not in r]
    groups = sorted({r["group"] for r in scored})
    return {
        "num_rows": len(rows),
        "num_scored": len(scored),
        "rejected": [r for r in results if "rejected" in r],
        "num_kv_starved": sum(r["batch"] < r["concurrency"] for r in scored),
        "overall": summarize(scored),
        "groups": {g: summarize([r for r in scored if r["group"] == g]) for g in groups},
        "runs": scored,
    }


def percent(fraction: float, sign: str = "+") -> str:
    return f"{100 * fraction:{sign}.0f}%"


def stats_cells(stats: dict) -> str:
    return "  ".join(f"{percent(stats[q]['median_abs'], ''):>6} {percent(stats[q]['max_abs'], ''):>7} "
                     f"{percent(stats[q]['median_signed']):>6}" for q in QUANTITIES)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=FIXTURE, help="runs to score (default: the fixture)")
    parser.add_argument("--json", action="store_true", help="the summary as JSON (per-run rows with --verbose)")
    parser.add_argument("--verbose", action="store_true", help="one line per run")
    args = parser.parse_args()
    summary = score(load_rows(args.csv))
    if args.json:
        if not args.verbose:
            summary = {k: v for k, v in summary.items() if k != "runs"}
        print(json.dumps(summary, indent=2))
    else:
        print_report(summary, args.verbose)


if __name__ == "__main__":
    main()
