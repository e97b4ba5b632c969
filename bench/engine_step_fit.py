"""The fit of vLLM's fixed costs in the serving step: per layer, per step and per sequence.

    python bench/engine_step_fit.py                      # the neighbourhood of the catalog point
    python bench/engine_step_fit.py --layer-us 50 56 62 --step-ms 0 0.25 --sequence-us 5 10 20
    python bench/engine_step_fit.py --json

Each grid point sets ENGINE_STEP_SECONDS_PER_LAYER, ENGINE_STEP_SECONDS and
ENGINE_STEP_SECONDS_PER_SEQUENCE (planner/cost/efficiency.py) and scores the TPOT of the fit set as
benchmarked (bench/serving_calibration.py --as-benchmarked): AIConfigurator's measured vLLM runs
whose engine captured decode steps in full CUDA graphs (fit_rows). Printed: each point's median
|TPOT error| over the fit set, and its TTFT's. The constants in efficiency.py are the best point of
a 30-point grid over 38-59 us x 0-1 ms x 5-20 us (docs/cost-model.md, Serving: the engine's
per-step cost); each point takes about 80 s of one core, so the default neighbourhood (10 points)
takes about 7 minutes on 2 cores. Not part of the planner.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from serving_calibration import Run, load_rows, score  # noqa: E402

from planner import units  # noqa: E402
from planner.cost import efficiency as eff  # noqa: E402

OUTSIDE_THE_FIT = ("llama-3.1-8b", "qwen3-235b", "minimax-m2.5", "kimi-k2.5")  # kimi-k2.5-nvfp4 too
"""AIConfigurator's own harness runs whose measured TPOT no steady state or burst reproduces
(docs/cost-model.md, Serving: calibration, "What is left"), and the MiniMax-M2.5 and Kimi-K2.5 runs added
to the calibration set after the fit (session 50), scored against it but not fitted to."""


def fit_rows(rows: list[Run]) -> list[Run]:
    """The runs whose engine captured decode steps in full CUDA graphs (vLLM >= 0.11's default,
    the B200 Llama scripts' FULL_DECODE_ONLY: every run but Run.ran_vllm_0_10_2's piecewise ones),
    less the OUTSIDE_THE_FIT groups."""
    return [r for r in rows if not r.ran_vllm_0_10_2 and not r.spec.startswith(OUTSIDE_THE_FIT)]


def score_point(point: tuple[float, float, float]) -> dict:
    """One grid point (us per layer, ms per step, us per sequence) scored on the fit set."""
    layer_us, step_ms, sequence_us = point
    eff.ENGINE_STEP_SECONDS_PER_LAYER = units.us_to_seconds(layer_us)
    eff.ENGINE_STEP_SECONDS = units.ms_to_seconds(step_ms)
    eff.ENGINE_STEP_SECONDS_PER_SEQUENCE = units.us_to_seconds(sequence_us)
    runs = score(fit_rows(load_rows()), as_benchmarked=True)["runs"]
    return {"layer_us": layer_us, "step_ms": step_ms, "sequence_us": sequence_us, "runs": len(runs),
            "tpot_median_abs": statistics.median(abs(r["tpot_error"]) for r in runs),
            "ttft_median_abs": statistics.median(abs(r["ttft_error"]) for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer-us", type=float, nargs="+", default=[53.0, 56.0, 59.0])
    parser.add_argument("--step-ms", type=float, nargs="+", default=[0.0])
    parser.add_argument("--sequence-us", type=float, nargs="+", default=[5.0, 10.0, 20.0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    points = list(itertools.product(args.layer_us, args.step_ms, args.sequence_us))
    if args.layer_us == [53.0, 56.0, 59.0] and args.step_ms == [0.0]:
        points.append((56.0, 0.25, 10.0))
    with ProcessPoolExecutor(args.workers) as pool:
        results = sorted(pool.map(score_point, points), key=lambda r: r["tpot_median_abs"])
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'us/layer':>8} {'ms/step':>7} {'us/seq':>6} {'runs':>4}  TPOT |err| med  TTFT |err| med")
    for r in results:
        print(f"{r['layer_us']:8.0f} {r['step_ms']:7.2f} {r['sequence_us']:6.0f} {r['runs']:4d}  "
              f"{100 * r['tpot_median_abs']:13.1f}%  {100 * r['ttft_median_abs']:13.1f}%")


if __name__ == "__main__":
    main()
