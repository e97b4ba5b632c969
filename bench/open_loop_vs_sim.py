"""The analytic open loop against the step simulation: two mechanisms for one workload.

    python bench/open_loop_vs_sim.py             # the grid below, one line per case and a summary
    python bench/open_loop_vs_sim.py --quick     # four cases
    python bench/open_loop_vs_sim.py --pp        # pipeline layouts, pinned (the grid above has none)
    python bench/open_loop_vs_sim.py --short     # short outputs (1-16 tokens) on one replica, near capacity
    python bench/open_loop_vs_sim.py --slots     # arrivals that find every slot taken (KV cache, --batch)
    python bench/open_loop_vs_sim.py --long-prompts  # prompts of several chunks, short outputs
    python bench/open_loop_vs_sim.py --range-ratio 0.05  # simulated lengths drawn within +/-5% of the means

Identical lengths (the default, as `vllm bench serve --random-range-ratio 0` sends) over several
DP replicas behind vLLM's least-loaded router form cohorts in the simulation: requests that start
in one step finish in one step, their replica drops to the fewest in flight at once, and the next
arrivals all go there, so they start together again; cohorts merge and never split, and TTFT
grows with the burst's length (Llama-3.1-8B tp=1 dp=8 at 166 req/s: 56 ms in the first 18 s of a
30,000-prompt burst, 180 ms in the last) while the analytic steady state has none. Lengths within
+/-5% break them up (the same burst: 55-62 ms throughout). `--range-ratio` shows the grid that way.

With a finite --request-rate every layout is priced by the open-loop steady state
(planner/cost/continuous_batching.solve_open_loop: C = R/d x E2E(C)), while the recommended
layout's burst is simulated step by step with Poisson arrivals (planner/cost/serving_sim.py).
Both price each step with the same round_time, so their gap is the steady state's queueing
approximations (Poisson bunching beyond the round alignment, the mix of states at a jump),
not the step cost. For each case: the recommended layout at the rate, its analytic mean TTFT,
TPOT and E2E, and the simulated burst's (num_prompts = 60 s or ten analytic E2Es of arrivals, whichever is
longer, at least 200), the
error analytic / simulated - 1. No real measurement is involved: the real-data error of the
step cost is bench/serving_calibration.py's. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from planner.catalog import resolve_cluster, resolve_model  # noqa: E402
from planner.requests import LayoutFilter, ServeRequest  # noqa: E402
from planner.serve import burst_metrics  # noqa: E402
from planner.serve_search import plan_serving  # noqa: E402

BURST_SECONDS = 60.0
STEADY_E2ES = 10.0
"""The burst lasts at least this many of the analytic E2E latencies: a burst fills from empty, so
where a request stays tens of seconds a minute of arrivals is mostly the fill (Llama-3.1-405B
tp=8 pp=2 at 3.9 req/s, E2E 41 s: TPOT 123 ms over a 60 s burst, 160 ms over the middle of a
600 s one)."""
MIN_PROMPTS = 200
CONVOY_PROBE_RATE_PER_S = 0.01
"""A rate light enough for any layout, at which its plan reports the convoy's capacity."""
CASES = [
    # model, cluster, input, output, share of the recommended layout's capacity offered
    ("llama-3.1-8b", "1x8xH100", 1024, 128, (0.1, 0.4, 0.7)),
    ("llama-3.1-70b", "2x8xH100", 2048, 256, (0.1, 0.4, 0.7)),
    ("llama-3.1-70b-fp8", "1x8xH200", 4096, 512, (0.1, 0.4, 0.7)),
    ("qwen3-30b-a3b", "1x8xH100", 1024, 1024, (0.1, 0.4, 0.7)),
]
QUICK = [("llama-3.1-8b", "1x8xH100", 1024, 128, (0.1, 0.7)), ("llama-3.1-70b", "2x8xH100", 2048, 256, (0.1, 0.7))]
PP_CASES = [
    # model, cluster, input, output, shares of the pinned layout's own capacity (at a rate: its
    # convoy's, continuous_batching.convoy_capacity_per_s, where that is lower), layout
    ("llama-3.1-70b", "1x8xH100", 1024, 256, (0.1, 0.4, 0.7), dict(tp=4, pp=2)),
    ("llama-3.1-70b", "1x8xH100", 1024, 256, (0.1, 0.4, 0.7), dict(tp=2, pp=4)),
    ("llama-3.1-405b", "2x8xH100", 1024, 256, (0.1, 0.4, 0.7), dict(tp=8, pp=2)),
    ("qwen3-30b-a3b", "1x8xH100", 1024, 256, (0.1, 0.4, 0.7), dict(tp=2, pp=4)),
]


SHORT_CASES = [
    # one tp=8 replica, 512-token prompts, 1 to 16 output tokens, up to 0.8 of its capacity:
    # prompt-dominated steps, where Poisson arrivals bunch (continuous_batching.poisson_bunching)
    ("llama-3.1-70b", "1x8xH100", 512, output_len, (0.1, 0.5, 0.8), dict(tp=8, pp=1, dp=1))
    for output_len in (1, 2, 4, 16)
]


SLOT_CASES = [
    # near the engine's slots: a KV cache of 26 long sequences, --batch 1, --batch 8 on an MoE
    # (continuous_batching.with_slot_queue); 1,500 prompts at least (the queue's tail is long)
    ("llama-3.1-8b", "1x1xH100", 16000, 1000, (0.5, 0.8, 0.9), dict(tp=1, pp=1, dp=1), {}),
    ("llama-3.1-70b", "1x8xH100", 1024, 256, (0.5, 0.8), dict(tp=8, pp=1, dp=1), dict(batch=1)),
    ("deepseek-v3", "1x8xH200", 1024, 256, (0.5, 0.75, 0.9), dict(tp=8, pp=1, dp=1), dict(batch=8)),
]
SLOT_MIN_PROMPTS = 1500

LONG_PROMPT_CASES = [
    # prompts of several budget-filling chunks, short outputs: whole prompts queue for the rounds
    # that carry them, and a request decodes among the prompts left behind it
    # (continuous_batching.prompt_queue)
    ("llama-3.1-70b-nvfp4", "1x8xH200", 16000, 8, (0.3, 0.6, 0.8), dict(tp=8, pp=1, dp=1), {}),
    ("llama-3.1-70b", "1x8xH100", 8000, 32, (0.3, 0.6, 0.8), dict(tp=8, pp=1, dp=1), {}),
    ("llama-3.1-8b", "1x1xH100", 32000, 64, (0.3, 0.6, 0.8), dict(tp=1, pp=1, dp=1), {}),
    ("llama-3.1-70b-nvfp4", "2x8xH200", 16000, 8, (0.3, 0.6, 0.8), dict(tp=8, pp=1, dp=2), {}),
    ("llama-3.1-70b-nvfp4", "2x8xH200", 16000, 8, (0.3, 0.6, 0.8), dict(tp=8, pp=2, dp=1), {}),
    ("llama-3.1-70b", "2x8xH100", 32000, 16, (0.1, 0.3, 0.6), dict(tp=2, pp=8, dp=1), {}),
]


def run_case(model_name: str, cluster_name: str, input_len: int, output_len: int, share: float,
             layout: dict[str, int] | None = None, extra: dict | None = None,
             min_prompts: int = MIN_PROMPTS, range_ratio: float | None = None) -> dict:
    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    pinned = LayoutFilter(**layout) if layout else LayoutFilter()
    extra = extra or {}
    capacity = plan_serving(model, cluster, ServeRequest(input_len=input_len, output_len=output_len,
                                                         layout=pinned, **extra)).recommended
    # the most it keeps up with at a rate: PP whole prompts convoy below the steady state's capacity
    # (the convoy's is priced under a rate: any light one)
    light = plan_serving(model, cluster, ServeRequest(input_len=input_len, output_len=output_len, layout=pinned,
                                                      request_rate_per_s=CONVOY_PROBE_RATE_PER_S, **extra)).recommended
    rate = share * min(capacity.throughput_tokens_per_second / output_len,
                       light.convoy_rate_per_s * light.layout.dp)
    best = plan_serving(model, cluster, ServeRequest(input_len=input_len, output_len=output_len,
                                                     request_rate_per_s=rate, layout=pinned, **extra)).recommended
    prompts = max(min_prompts, round(rate * max(BURST_SECONDS, STEADY_E2ES * best.e2e_seconds)))
    request = ServeRequest(input_len=input_len, output_len=output_len, request_rate_per_s=rate, num_prompts=prompts,
                           layout=pinned, random_range_ratio=range_ratio, **extra)
    simulated = burst_metrics(model, cluster, best, request)
    analytic = {"ttft": best.ttft_seconds, "tpot": best.tpot_seconds, "e2e": best.e2e_seconds}
    measured = {"ttft": simulated.ttft_seconds.mean, "tpot": simulated.tpot_seconds.mean,
                "e2e": simulated.e2e_seconds.mean}
    if output_len == 1:  # no TPOT (vllm bench serve reports none)
        analytic["tpot"] = measured["tpot"] = math.nan
    return {"case": f"{model_name} {cluster_name} {input_len}/{output_len} {rate:.3g}/s", "layout": str(best.layout),
            "concurrency": best.concurrency, **{f"{k}_error": analytic[k] / measured[k] - 1 for k in analytic},
            "analytic": analytic, "simulated": measured}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pp", action="store_true", help="pipeline layouts, pinned")
    parser.add_argument("--short", action="store_true", help="short outputs on one replica, near capacity")
    parser.add_argument("--slots", action="store_true", help="arrivals that find every slot taken")
    parser.add_argument("--long-prompts", action="store_true", help="prompts of several chunks, short outputs")
    parser.add_argument("--range-ratio", type=float, default=None,
                        help="simulate lengths drawn within +/- this share of the means (vllm bench serve's "
                             "--random-range-ratio); default: identical lengths")
    args = parser.parse_args()
    rows = []
    grid = LONG_PROMPT_CASES if args.long_prompts else SLOT_CASES if args.slots else [(*case, {}) for case in PP_CASES] if args.pp else [
        (*case, {}) for case in SHORT_CASES] if args.short else [
        (*case, None, {}) for case in (QUICK if args.quick else CASES)]
    for model, cluster, i, o, shares, layout, extra in grid:
        for share in shares:
            row = run_case(model, cluster, i, o, share, layout, extra, SLOT_MIN_PROMPTS if args.slots else MIN_PROMPTS,
                           args.range_ratio)
            rows.append(row)
            a, s = row["analytic"], row["simulated"]
            print(f"{row['case']:<52} {row['layout']:<22} C {row['concurrency']:7.2f}  "
                  + "  ".join(f"{k.upper()} {a[k] * 1e3:8.1f} / {s[k] * 1e3:8.1f} ms {row[k + '_error']:+5.0%}"
                              for k in ("ttft", "tpot", "e2e")))
    for k in ("ttft", "tpot", "e2e"):
        errors = [r[f"{k}_error"] for r in rows if not math.isnan(r[f"{k}_error"])]
        print(f"{k.upper()}: median |analytic/simulated - 1| {statistics.median(abs(e) for e in errors):.1%}, "
              f"max {max(abs(e) for e in errors):.1%}, median signed {statistics.median(errors):+.1%} ({len(rows)} cases)")


if __name__ == "__main__":
    main()
