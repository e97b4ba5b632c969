"""The fit of Megatron's host time per MoE block forward (efficiency.MOE_LAYER_FORWARD_HOST_SECONDS).

    python bench/moe_host_fit.py                          # the grid, then each family held out
    python bench/moe_host_fit.py --ms 6 6.5 7 7.5 8       # other grid points
    python bench/moe_host_fit.py --json
    python bench/moe_host_fit.py --pair-issue 2 --ms 6.2 6.4 6.6     # what-if: the combined 1F1B issues 2H
    python bench/moe_host_fit.py --per-expert-us 50 --ms 6.8 7.0     # what-if: H + 50 us per local expert

Each grid point sets the Megatron engine's host time per MoE block forward
(planner.train_engines.MOE_FORWARD_HOST_SECONDS, the constant's one reader) and scores the 34 NeMo
MoE rows as their Megatron-Bridge recipes ran them (bench/training_calibration.py --moe: each
row's dispatcher, all-to-all overlap and recompute, balanced routing). The constant is the grid
point of least median |error| over all rows (ties: the smaller). Held out: the same fit on the
rows of three model families, scored on the fourth's, to show how far the one constant carries
to a model it was not fitted on (docs/cost-model.md, Training: the host behind MoE layers). About
0.1 s per grid point on one core. Not part of the planner.

The what-ifs reprice the rows with a host time the planner does not use (the variants the docs
report as tried and not adopted), by wrapping planner.train.layer_terms for the run:
--pair-issue R prices the host's time under the combined 1F1B at R x H (one thread issues the
pair's forward and backward between the forward's syncs); --per-expert-us C adds C us per
expert on each GPU to H.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import training_calibration as calibration  # noqa: E402

from planner import train, train_engines, units  # noqa: E402

GRID_MS = tuple(round(6.0 + 0.1 * i, 1) for i in range(21))
"""6.0 to 8.0 ms by 0.1: the neighbourhood of the fitted value (a coarser 0-10 ms grid first)."""


def what_if(pair_issue: float = 1.0, per_expert_us: float = 0.0) -> None:
    """Reprice with the module docstring's what-ifs (1.0 and 0.0: the planner's own model)."""
    planned = train.layer_terms.__wrapped__ if hasattr(train.layer_terms, "__wrapped__") else train.layer_terms
    if pair_issue == 1.0 and per_expert_us == 0.0:
        train.layer_terms = planned
        return

    def layer_terms(model, cluster, config, s, placement, rates, imbalance, rotation, host):
        if model.is_moe and host > 0:
            host += units.us_to_seconds(per_expert_us) * model.num_local_experts / config.ep
            if config.moe_comm_overlap:
                host *= pair_issue
        return planned(model, cluster, config, s, placement, rates, imbalance, rotation, host)

    layer_terms.__wrapped__ = planned
    train.layer_terms = layer_terms


def errors_at(host_ms: float, rows: list[calibration.Row]) -> dict[str, float]:
    """Each row's error (predicted / published - 1) with host_ms per MoE block forward."""
    saved = train_engines.MOE_FORWARD_HOST_SECONDS["megatron"]
    train_engines.MOE_FORWARD_HOST_SECONDS["megatron"] = units.ms_to_seconds(host_ms)
    try:
        predicted = (calibration.predict(row) for row in rows)
        return {p["id"]: p["error"] for p in predicted if "error" in p}
    finally:
        train_engines.MOE_FORWARD_HOST_SECONDS["megatron"] = saved


def median_abs(errors: list[float]) -> float:
    return statistics.median(abs(e) for e in errors)


def best_point(table: dict[float, dict[str, float]], ids: set[str]) -> float:
    """The grid point of least median |error| over `ids` (ties: the smaller)."""
    return min(table, key=lambda ms: (median_abs([table[ms][i] for i in ids]), ms))


def fit(grid_ms: tuple[float, ...] = GRID_MS) -> dict:
    rows = calibration.load_rows(calibration.MOE_FIXTURE)
    table = {ms: errors_at(ms, rows) for ms in grid_ms}
    every = {row.id for row in rows}
    grid = [{"host_ms": ms, "median_abs": median_abs(list(errs.values())),
             "within_10": sum(abs(e) <= 0.10 for e in errs.values()),
             "within_15": sum(abs(e) <= 0.15 for e in errs.values()),
             "mean_signed": statistics.mean(errs.values())} for ms, errs in table.items()]
    held_out = []
    for family in sorted({row.spec for row in rows}):
        test = {row.id for row in rows if row.spec == family}
        chosen = best_point(table, every - test)
        held_out.append({"family": family, "rows": len(test), "fitted_ms": chosen,
                         "median_abs_held_out": median_abs([table[chosen][i] for i in test])})
    return {"grid": grid, "best_ms": best_point(table, every), "held_out": held_out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", type=float, nargs="+", default=GRID_MS, help="grid points, ms per MoE block forward")
    parser.add_argument("--pair-issue", type=float, default=1.0,
                        help="what-if: the host's time under the combined 1F1B as this multiple of H")
    parser.add_argument("--per-expert-us", type=float, default=0.0,
                        help="what-if: us added to H per expert on each GPU")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    what_if(args.pair_issue, args.per_expert_us)
    result = fit(tuple(args.ms))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'host ms':>8} {'|err| med':>9} {'<=10%':>5} {'<=15%':>5} {'mean':>7}")
    for point in result["grid"]:
        print(f"{point['host_ms']:8.1f} {100 * point['median_abs']:8.1f}% {point['within_10']:5d} "
              f"{point['within_15']:5d} {100 * point['mean_signed']:+6.1f}%")
    print(f"\nbest: {result['best_ms']:.1f} ms per MoE block forward")
    print("\neach family held out (fitted on the other three, scored on it):")
    for h in result["held_out"]:
        print(f"  {h['family']:<18} {h['rows']:>3} rows: fitted {h['fitted_ms']:.1f} ms, "
              f"median |error| {100 * h['median_abs_held_out']:.1f}%")


if __name__ == "__main__":
    main()
