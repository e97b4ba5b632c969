"""Property tests (hypothesis) for the serving planner: monotone memory, linear DP
scaling, deterministic ranking. Example counts are small: each example plans real specs."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner.search as search
import planner.serve_search as serve_search
from planner.catalog import cluster_from_shorthand, resolve_model
from planner.cost.serving_memory import stage_memory, structural_reasons
from planner.layout import Layout, divisors
from planner.requests import ServeRequest
from planner.serve import ServeEstimate, estimate

MODELS = [
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "mixtral-8x7b",
    "mistral-7b",
    "qwen2.5-72b",
    "gpt3-175b",
    "llama-3.1-70b-awq",
]
QUICK = settings(max_examples=25, deadline=None)


def worst_stage_weight_bytes(model, tp: int, pp: int) -> float:
    cluster = cluster_from_shorthand(1, 8, "H100", "1x8xH100")
    stages = stage_memory(model, cluster, Layout(tp, pp, 1), ServeRequest(max_model_len=4096), 256)
    return max(s.weights_bytes for s in stages)


def valid_tps(model) -> list[int]:
    return [t for t in (1, 2, 4, 8, 16, 32, 64) if not structural_reasons(model, Layout(t, 1, 1))]


@QUICK
@given(name=st.sampled_from(MODELS), data=st.data())
def test_weights_per_gpu_never_grow_with_tp(name, data):
    model = resolve_model(name)
    tps = valid_tps(model)
    low = data.draw(st.sampled_from(tps[:-1]), label="tp")
    high = data.draw(st.sampled_from([t for t in tps if t > low]), label="larger tp")
    pp = data.draw(st.sampled_from([1, 2, 3, 4, 8]), label="pp")
    assert worst_stage_weight_bytes(model, high, pp) <= worst_stage_weight_bytes(model, low, pp)


@QUICK
@given(name=st.sampled_from(MODELS), data=st.data())
def test_weights_per_gpu_never_grow_with_pp(name, data):
    model = resolve_model(name)
    layers = model.num_hidden_layers
    low = data.draw(st.integers(1, layers - 1), label="pp")
    high = data.draw(st.integers(low + 1, layers), label="larger pp")
    tp = data.draw(st.sampled_from(valid_tps(model)), label="tp")
    assert worst_stage_weight_bytes(model, tp, high) <= worst_stage_weight_bytes(model, tp, low)


@QUICK
@given(
    name=st.sampled_from(["llama-3.1-8b", "mistral-7b", "mixtral-8x7b", "llama-3.1-70b"]),
    degrees=st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (8, 1), (4, 2)]),
    copies=st.sampled_from([2, 3, 4, 8]),
    batch=st.sampled_from([None, 1, 16]),
)
def test_dp_replicas_scale_throughput_linearly(name, degrees, copies, batch):
    """Same tp, pp on a cluster `copies` times larger (the replica keeps the same
    placement): dp = copies gives exactly copies times the tokens/s of dp = 1, and the
    same per-sequence TPOT and TTFT."""
    tp, pp = degrees
    model = resolve_model(name)
    replica_gpus = tp * pp
    request = ServeRequest(max_model_len=8192, batch=batch)
    small = cluster_from_shorthand(1, replica_gpus, "H100", "small")
    if replica_gpus * copies <= 8:
        large = cluster_from_shorthand(1, replica_gpus * copies, "H100", "large")
    else:
        large = cluster_from_shorthand(copies, replica_gpus, "H100", "large")
    one = estimate(model, small, Layout(tp, pp, 1), request)
    many = estimate(model, large, Layout(tp, pp, copies), request)
    assert type(one) is type(many)
    if isinstance(one, ServeEstimate):
        assert many.throughput_tokens_per_second == pytest.approx(
            copies * one.throughput_tokens_per_second, rel=1e-12
        )
        assert many.tpot_seconds == pytest.approx(one.tpot_seconds, rel=1e-12)
        assert many.ttft_seconds == pytest.approx(one.ttft_seconds, rel=1e-12)
        assert many.kv_cache_tokens == one.kv_cache_tokens


def ranking(plan) -> list[tuple[int, int, int]]:
    return [(r.layout.tp, r.layout.pp, r.layout.dp) for r in plan.layouts]


@settings(max_examples=10, deadline=None)
@given(
    name=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b"]),
    cluster_name=st.sampled_from([(2, 8, "A100"), (1, 8, "H100"), (1, 4, "L40S")]),
    objective=st.sampled_from(["throughput", "latency"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_ranking_is_deterministic_and_order_free(name, cluster_name, objective, seed):
    """Planning twice gives the same order; evaluating the candidates in a shuffled order
    gives the same ranking, Pareto front and rejections (explicit sort keys, no reliance
    on enumeration order)."""
    model = resolve_model(name)
    cluster = cluster_from_shorthand(*cluster_name, "x".join(map(str, cluster_name)))
    request = ServeRequest(max_model_len=16384, objective=objective)
    first = serve_search.plan_serving(model, cluster, request)
    again = serve_search.plan_serving(model, cluster, request)
    assert ranking(first) == ranking(again)

    original = search.candidate_layouts

    def shuffled(num_gpus, req, *args, **kwargs):
        layouts = list(original(num_gpus, req, *args, **kwargs))
        random.Random(seed).shuffle(layouts)
        return layouts

    search.candidate_layouts = shuffled
    try:
        reordered = serve_search.plan_serving(model, cluster, request)
    finally:
        search.candidate_layouts = original
    assert ranking(reordered) == ranking(first)
    assert reordered.pareto == first.pareto
    assert [r.layout for r in reordered.rejected] == [r.layout for r in first.rejected]


def test_every_factorization_is_planned_once():
    """tp * pp * dp = GPUs for every layout, feasible or rejected, none twice (16 GPUs:
    15 ordered factorizations)."""
    model = resolve_model("llama-3.1-70b")
    cluster = cluster_from_shorthand(2, 8, "A100", "2x8xA100")
    plan = serve_search.plan_serving(model, cluster, ServeRequest(max_model_len=8192))
    layouts = [r.layout for r in plan.layouts] + [r.layout for r in plan.rejected]
    assert all(lay.num_gpus == 16 for lay in layouts)
    assert len(set(layouts)) == len(layouts) == sum(len(divisors(16 // t)) for t in divisors(16))


def test_serving_layouts_may_leave_gpus_idle_when_the_count_is_odd():
    """7 GPUs: the divisors give tp or pp of 1 or 7 only; serving also tries power-of-two
    tp and pp with as many replicas as fit: tp*pp = 2 -> 3 replicas, 4 -> 1 (one or three GPUs
    idle). 8 GPUs add none (every power of two up to 8 divides 8). gpt-oss-120b at TPOT
    <= 25 ms on 7 H100s: tp=2 x 3 replicas, 18,391 tok/s, where tp=1 x 7 (EP) gave 15,380."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.layout import Layout
    from planner.requests import LayoutFilter, ServeRequest
    from planner.search import candidate_layouts
    from planner.serve_search import plan_serving

    seven = candidate_layouts(7, LayoutFilter(), leave_idle=True)
    extra = set(seven) - set(candidate_layouts(7, LayoutFilter()))
    assert extra == {Layout(2, 1, 3), Layout(1, 2, 3), Layout(4, 1, 1), Layout(2, 2, 1), Layout(1, 4, 1)}
    assert candidate_layouts(8, LayoutFilter(), leave_idle=True) == candidate_layouts(8, LayoutFilter())
    plan = plan_serving(resolve_model("gpt-oss-120b"), resolve_cluster("1x8xH100"),
                        ServeRequest(num_gpus=7, max_tpot_seconds=0.025, mode="aggregated"))
    assert (plan.recommended.layout.tp, plan.recommended.layout.dp) == (2, 3)
