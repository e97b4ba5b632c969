"""Benchmark: how fast `plan` answers, from 8 to 16,384 GPUs, and from a cold process.

    python bench/bench_plan.py                 # full table (about 2 minutes on 2 cores);
                                               # progress on stderr, the markdown table
                                               # (as committed in bench/README.md) on stdout
    python bench/bench_plan.py --quick         # fewer repeats, smaller sizes

Search timings are medians of repeated in-process runs after a warm-up run; peak
memory is tracemalloc's peak over one separate run (tracing slows the run, so it
is never timed); CLI timings are medians of fresh `python -m planner` processes.
Nothing here is part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from planner.catalog import resolve_cluster, resolve_model  # noqa: E402
from planner.requests import ServeRequest, TrainRequest  # noqa: E402
from planner.serve_search import plan_serving  # noqa: E402
from planner.train_search import search  # noqa: E402

try:  # absent before the search memoised anything: lets this script time older commits
    from planner.train_search import clear_caches
except ImportError:  # pragma: no cover
    def clear_caches() -> None:
        pass

MODELS = ("llama-3.1-70b", "llama-3.1-405b", "gpt3-175b")
GPU_COUNTS = (8, 64, 512, 4096, 16384)
GPUS_PER_NODE = 8
GPU = "H100"


@dataclass(frozen=True)
class Row:
    workload: str
    model: str
    num_gpus: int
    median_seconds: float
    num_evaluated: int
    peak_bytes: int
    top: str


def train_request(model_name: str, num_gpus: int) -> TrainRequest:
    """Global batch grows with the cluster as real runs do (1536 sequences up to 512 GPUs)."""
    seq_len = 2048 if model_name.startswith("gpt3") else 4096
    return TrainRequest(global_batch=max(1536, num_gpus // 2), seq_len=seq_len)


def run_serve(model, cluster, model_name: str, num_gpus: int) -> tuple[int, str]:
    plan = plan_serving(model, cluster, ServeRequest())
    best = plan.recommended
    return len(plan.layouts) + len(plan.rejected), str(best.layout) if best else "none fits"


def run_train(model, cluster, model_name: str, num_gpus: int) -> tuple[int, str]:
    """The CLI's default training search (`plan --workload train`): every tp, pp, dp,
    micro-batch, 1F1B and interleaved with every v, recompute, SP and ZeRO; GPipe only
    when asked (it is dominated: 1F1B's time with at least its memory)."""
    plan = search(model, cluster, train_request(model_name, num_gpus))
    best = plan.layouts[0] if plan.layouts else None
    return plan.num_configs_evaluated, describe_train(best)


def describe_train(best) -> str:
    if best is None:
        return "none fits"
    c = best.config
    schedule = f"{c.schedule} v={c.virtual_stages}" if c.schedule == "interleaved" else c.schedule
    return (f"tp={c.tp} pp={c.pp} dp={c.dp} b={c.micro_batch_size} {schedule} {c.recompute}"
            f"{' sp' if c.sequence_parallel else ''} zero={c.zero_stage}")


def measure(fn: Callable[[], tuple[int, str]], repeats: int) -> tuple[float, int, str, int]:
    """Median of `repeats` cold searches (memos emptied first, as in a fresh process)."""
    fn()  # warm-up: lazy imports
    times = []
    for _ in range(repeats):
        clear_caches()
        start = time.perf_counter()
        evaluated, top = fn()
        times.append(time.perf_counter() - start)
    clear_caches()
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times), evaluated, top, peak


def search_rows(repeats: int, gpu_counts: tuple[int, ...]) -> list[Row]:
    rows = []
    for workload, runner in (("serve", run_serve), ("train", run_train)):
        for model_name in MODELS:
            model = resolve_model(model_name)
            for num_gpus in gpu_counts:
                cluster = resolve_cluster(f"{num_gpus // GPUS_PER_NODE}x{GPUS_PER_NODE}x{GPU}")
                seconds, evaluated, top, peak = measure(
                    lambda r=runner, m=model, c=cluster, n=model_name, g=num_gpus: r(m, c, n, g),
                    repeats)
                rows.append(Row(workload, model_name, num_gpus, seconds, evaluated, peak, top))
                print(f"  {workload:5} {model_name:15} {num_gpus:6} GPUs: {seconds * 1e3:9.2f} ms "
                      f"({evaluated:,} evaluated) top: {top}", file=sys.stderr)
    return rows


def cli_seconds(argv: list[str], repeats: int) -> float:
    """The installed `plan` console script when on PATH (what users run), else python -m planner."""
    script = shutil.which("plan")
    command = [script] if script else [sys.executable, "-m", "planner"]
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        subprocess.run([*command, *argv], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def markdown(rows: list[Row], cli: dict[str, float]) -> str:
    lines = [
        f"Machine: {machine()}.",
        "",
        "| workload | model | GPUs | median wall time | evaluated | evaluated/s | peak memory | top |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        rate = r.num_evaluated / r.median_seconds if r.median_seconds else float("inf")
        lines.append(
            f"| {r.workload} | {r.model} | {r.num_gpus:,} | {r.median_seconds * 1e3:.1f} ms | "
            f"{r.num_evaluated:,} | {rate:,.0f} | {r.peak_bytes / 2**20:.1f} MiB | {r.top} |")
    lines += ["", "| CLI, cold process | median |", "|---|---:|"]
    lines += [f"| `{name}` | {seconds * 1e3:.0f} ms |" for name, seconds in cli.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 repeats, up to 512 GPUs")
    args = parser.parse_args()
    repeats = 2 if args.quick else args.repeats
    counts = tuple(n for n in GPU_COUNTS if not args.quick or n <= 512)
    rows = search_rows(repeats, counts)
    cli = {
        "plan --help": cli_seconds(["--help"], repeats),
        "plan --model llama-3.1-70b --cluster 2x8xA100 --json": cli_seconds(
            ["--model", "llama-3.1-70b", "--cluster", "2x8xA100", "--json"], repeats),
        "plan --workload train --model gpt3-175b --cluster 64x8xH100 --global-batch 1536 "
        "--seq-len 2048 --json": cli_seconds(
            ["--workload", "train", "--model", "gpt3-175b", "--cluster", "64x8xH100",
             "--global-batch", "1536", "--seq-len", "2048", "--json"], repeats),
    }
    print(markdown(rows, cli))


if __name__ == "__main__":
    main()
