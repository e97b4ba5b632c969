"""Ranking policy: the near-tie band (planner/search.py NEAR_TIE_FRACTION)."""

from __future__ import annotations

from planner.catalog import resolve_cluster, resolve_model
from planner.requests import ServeRequest
from planner.serve_search import NEAR_TIE_FRACTION, plan_serving


def test_throughput_near_tie_goes_to_the_lower_tpot():
    """llama-3.1-70b-fp8 on 1x8xH100 at 1024/256 and vLLM's H100 default of 1024 sequences:
    tp=1 pp=4 dp=2 and tp=1 pp=8 deliver within a fraction of a percent of the same tokens/s
    (both compute-bound at this batch); the one with the lower TPOT ranks first, and every
    layout in the band is no faster per token."""
    plan = plan_serving(resolve_model("llama-3.1-70b-fp8"), resolve_cluster("1x8xH100"), ServeRequest())
    best = plan.recommended
    most = max(plan.layouts, key=lambda r: r.throughput_tokens_per_second)
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
