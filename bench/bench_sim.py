"""Time the simulator on 1,000 requests x 1,024 output tokens at concurrency 1,024."""

import time

from planner.cost.serving_sim import EngineLimits, SimRequest, bench_metrics, simulate
from planner.cost.serving_time import StepLoad


def step_seconds(load: StepLoad) -> float:
    return (
        0.005
        + 2e-6 * load.decode_seqs
        + 1e-9 * load.decode_context_tokens
        + 5e-7 * load.prefill_tokens
    )


def main() -> None:
    requests = [SimRequest(0.0, 1024, 1024)] * 1000
    limits = EngineLimits(kv_cache_tokens=4_000_000, max_num_seqs=1024, max_num_batched_tokens=8192)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        result = simulate(requests, limits, step_seconds)
        best = min(best, time.perf_counter() - t0)
    m = bench_metrics(result)
    print(
        f"simulate: {best:.3f} s best of 5; {len(result.step_seconds)} steps; "
        f"TTFT p99 {m.ttft_seconds.p99:.3f} s, ITL mean {m.itl_seconds.mean * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
