"""Benchmark: how fast `plan` answers, from 8 to 16,384 GPUs, and from a cold process.

    python bench/bench_plan.py                 # full tables (about 4 minutes on 2 cores);
                                               # progress on stderr, the markdown tables
                                               # (as committed in bench/README.md) on stdout
    python bench/bench_plan.py --quick         # fewer repeats, smaller sizes
    python bench/bench_plan.py --cli-only      # only what the user waits for: whole processes
    python bench/bench_plan.py --cli-only --checkout /tmp/old   # the same, of another checkout

Search timings are medians of repeated in-process runs after a warm-up run; peak
memory is tracemalloc's peak over one separate run (tracing slows the run, so it
is never timed). CLI timings are medians of fresh processes of the installed `plan`
script (or `python -m planner` in --checkout), with the bytes each writes to stdout.
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
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from planner.catalog import resolve_cluster, resolve_model  # noqa: E402
from planner.requests import DEFAULT_TOP_ROWS, ServeRequest, TrainRequest  # noqa: E402
from planner.serve_search import plan_serving  # noqa: E402
from planner.train_search import search  # noqa: E402

try:  # older commits kept module-level caches; a search now starts with its own memo
    from planner.train_search import clear_caches
except ImportError:  # pragma: no cover
    def clear_caches() -> None:
        pass

MODELS = ("llama-3.1-70b", "llama-3.1-405b", "gpt3-175b", "deepseek-v3")
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
    """The CLI's table (`plan --model M --cluster C`): the best DEFAULT_TOP_ROWS layouts, the
    rest bounded out where their bound cannot reach them (serve_search.bounded_evaluation);
    the count is every layout, estimated, rejected or bounded."""
    plan = plan_serving(model, cluster, ServeRequest(), keep_top=DEFAULT_TOP_ROWS)
    best = plan.recommended
    return (len(plan.layouts) + len(plan.rejected) + plan.num_configs_bounded,
            str(best.layout) if best else "none fits")


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


@dataclass(frozen=True)
class CliRow:
    command: str
    median_seconds: float
    output_bytes: int
    exit_code: int


SERVE_CLI = ("--model", "llama-3.1-405b", "--max-model-len", "8192")
TRAIN_CLI = ("--workload", "train", "--global-batch", "4096", "--seq-len", "2048")
CLI_CASES = (
    ("--help",),
    (*SERVE_CLI, "--cluster", "2x8xH100"),
    (*SERVE_CLI, "--cluster", "2x8xH100", "--json"),
    (*SERVE_CLI, "--cluster", "2048x8xH100"),
    (*SERVE_CLI, "--cluster", "2048x8xH100", "--json"),
    (*TRAIN_CLI, "--model", "llama-3.1-70b", "--cluster", "2x8xA100"),
    (*TRAIN_CLI, "--model", "llama-3.1-70b", "--cluster", "2x8xA100", "--json"),
    (*TRAIN_CLI, "--model", "llama-3.1-70b", "--cluster", "2048x8xA100"),
    (*TRAIN_CLI, "--model", "llama-3.1-70b", "--cluster", "2048x8xA100", "--json"),
    (*TRAIN_CLI, "--model", "gpt3-175b", "--cluster", "2048x8xA100"),
    (*TRAIN_CLI, "--model", "gpt3-175b", "--cluster", "2048x8xA100", "--json"),
    ("--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--input-len", "1024", "--output-len", "256",
     "--max-ttft-ms", "2000", "--max-tpot-ms", "30"),
    ("--model", "qwen3-30b-a3b", "--cluster", "1x8xH100", "--input-len", "20000", "--output-len", "16",
     "--max-ttft-ms", "50"),
)
"""16 and 16,384 GPUs for both workloads, as a table and as --json. gpt3-175b does not fit
on 16 A100s (the training search then only reports why), so 16 GPUs train llama-3.1-70b. Then
the serving issue's SLA question (aggregated and disaggregated plans and the verdict; the
issue asks for under 0.5 s), and a TTFT limit no layout meets (what would fit is re-planned on
bigger clusters: 17.6 s before layouts that miss a limit alone skipped the knee search, 2.3 s
after)."""


def cli_command(checkout: Path | None) -> tuple[list[str], Path]:
    """The installed `plan` console script (what users run), else python -m planner; with
    a checkout, python -m planner run from it (to time an older commit the same way)."""
    if checkout is not None:
        return [sys.executable, "-m", "planner"], checkout
    script = shutil.which("plan")
    return ([script] if script else [sys.executable, "-m", "planner"]), REPO


def cli_row(argv: tuple[str, ...], repeats: int, checkout: Path | None = None) -> CliRow:
    """Median wall time of `repeats` fresh processes (after one discarded run), stdout to a
    file so its size is what a user's redirect would get."""
    command, cwd = cli_command(checkout)
    times, size, code = [], 0, 0
    with tempfile.TemporaryFile() as out:
        for _ in range(repeats + 1):
            out.seek(0)
            out.truncate()
            start = time.perf_counter()
            code = subprocess.run([*command, *argv], cwd=cwd, stdout=out, stderr=subprocess.DEVNULL).returncode
            times.append(time.perf_counter() - start)
            size = out.tell()
    row = CliRow("plan " + " ".join(argv), statistics.median(times[1:]), size, code)
    print(f"  {row.median_seconds * 1e3:7.0f} ms {row.output_bytes:>11,} B exit {code}  {row.command}",
          file=sys.stderr)
    return row


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


def markdown(rows: list[Row], cli: list[CliRow]) -> str:
    lines = [f"Machine: {machine()}.", ""]
    if rows:
        lines += ["| workload | model | GPUs | median wall time | evaluated | evaluated/s | peak memory | top |",
                  "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        rate = r.num_evaluated / r.median_seconds if r.median_seconds else float("inf")
        lines.append(
            f"| {r.workload} | {r.model} | {r.num_gpus:,} | {r.median_seconds * 1e3:.1f} ms | "
            f"{r.num_evaluated:,} | {rate:,.0f} | {r.peak_bytes / 2**20:.1f} MiB | {r.top} |")
    lines += ["", "| CLI, whole process | median | stdout | exit |", "|---|---:|---:|---:|"]
    lines += [f"| `{r.command}` | {r.median_seconds * 1e3:.0f} ms | {_bytes(r.output_bytes)} | {r.exit_code} |"
              for r in cli]
    return "\n".join(lines)


def _bytes(num_bytes: int) -> str:
    if num_bytes >= 2**20:
        return f"{num_bytes / 2**20:.1f} MiB"
    return f"{num_bytes / 2**10:.1f} KiB" if num_bytes >= 2**10 else f"{num_bytes} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 repeats, up to 512 GPUs")
    parser.add_argument("--cli-only", action="store_true", help="only the whole-process CLI timings")
    parser.add_argument("--checkout", type=Path, help="time `python -m planner` in this checkout")
    args = parser.parse_args()
    repeats = 2 if args.quick else args.repeats
    counts = tuple(n for n in GPU_COUNTS if not args.quick or n <= 512)
    rows = [] if args.cli_only else search_rows(repeats, counts)
    cli = [cli_row(argv, repeats, args.checkout) for argv in CLI_CASES]
    print(markdown(rows, cli))


if __name__ == "__main__":
    main()
