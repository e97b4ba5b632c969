"""Ranking policy: the near-tie band (planner/search.py NEAR_TIE_FRACTION)."""

from __future__ import annotations

from planner.catalog import resolve_cluster, resolve_model
from planner.requests import ServeRequest
from planner.serve_search import NEAR_TIE_FRACTION, plan_serving


def test_throughput_near_tie_goes_to_the_lower_tpot():
    """llama-3.1-405b bf16 on 2x8xH100 at vLLM's H100 default of 1024 sequences: tp=4 pp=4
    and tp=8 pp=2 deliver within a fraction of a percent of the same tokens/s (both are
    compute-bound at this batch), but tp=8 pp=2 has far lower TPOT and TTFT: it ranks first,
    and the highest-throughput layout is still reported."""
    plan = plan_serving(resolve_model("llama-3.1-405b"), resolve_cluster("2x8xH100"), ServeRequest())
    best = plan.recommended
    most = max(plan.layouts, key=lambda r: r.throughput_tokens_per_second)
    assert (best.layout.tp, best.layout.pp) == (8, 2)
    assert best.throughput_tokens_per_second >= most.throughput_tokens_per_second * (1 - NEAR_TIE_FRACTION)
    band = [r for r in plan.layouts
            if r.throughput_tokens_per_second >= most.throughput_tokens_per_second * (1 - NEAR_TIE_FRACTION)]
    assert best.tpot_seconds == min(r.tpot_seconds for r in band)


def test_outside_the_band_throughput_decides():
    """Every layout ranked below the band is ordered by throughput alone."""
    plan = plan_serving(resolve_model("llama-3.1-70b"), resolve_cluster("2x8xA100"), ServeRequest())
    top = max(r.throughput_tokens_per_second for r in plan.layouts)
    rest = [r for r in plan.layouts if r.throughput_tokens_per_second < top * (1 - NEAR_TIE_FRACTION)]
    rates = [r.throughput_tokens_per_second for r in rest]
    assert rates == sorted(rates, reverse=True)
    assert plan.layouts[len(plan.layouts) - len(rest):] == tuple(rest)
