"""Time the simulator: 1,000 requests x 1,024 output tokens at concurrency 1,024 on one engine;
1,000 Poisson arrivals at 50/s over 2,048 replicas, most requests alone on theirs (replayed
against stepped)."""

import random
import time

from planner.cost.serving_sim import (
    EngineLimits,
    SimRequest,
    bench_metrics,
    simulate,
    simulate_replicas,
)
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

    arrivals = random.Random(0)
    sent, spread = 0.0, []
    for _ in range(1000):
        sent += arrivals.expovariate(50.0)
        spread.append(SimRequest(sent, 2048, 256))
    for replay in (True, False):
        t0 = time.perf_counter()
        result = simulate_replicas(spread, 2048, limits, step_seconds, replay_solos=replay)
        m = bench_metrics(result)
        print(f"simulate_replicas, 2,048 replicas at 50/s, {'replayed' if replay else 'stepped'}: "
              f"{time.perf_counter() - t0:.3f} s; {len(result.step_seconds)} steps; "
              f"E2E mean {m.e2e_seconds.mean:.4f} s")


if __name__ == "__main__":
    main()
