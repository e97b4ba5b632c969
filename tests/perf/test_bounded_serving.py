"""The bounded serving search (serve_search.bounded_evaluation) shows the plain search's rows.

A plan that shows only its best k layouts (the table, --top) prices each layout's bounds first
(serve.serving_bounds: tokens/s it cannot exceed, a TPOT it cannot go below) and skips the
layouts whose bound cannot reach the rows. Safe when
  - the bounds hold for every layout the search can meet, checked here against the estimate of
    every layout of shipped pairs under many requests (objectives, SLAs, --batch, clients,
    speculative decoding, DeepEP with dual-batch overlap, datasets, one output token);
  - the first k rows, their pareto marks and the summary's other layouts (most tokens/s,
    lowest one-sequence TPOT) are the plain search's: checked on those pairs and on random
    requests.
No timing here: bench/bench_plan.py measures the speed.
"""

from __future__ import annotations

import io
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import serve_search
from planner.catalog import resolve_cluster, resolve_model
from planner.cost.serving_time import StepLoad, round_time, stage_step_times, with_moe_backend
from planner.engines import parse_engine_versions
from planner.layout import Layout, Rejected
from planner.memo import Memo
from planner.render.serve import summary_layouts
from planner.requests import ServeRequest, Speculation, for_vllm_release
from planner.search import candidate_layouts, expert_search
from planner.serve import (
    WHOLE_SHAPES_MARGIN,
    ServeEstimate,
    estimate,
    expert_imbalance,
    knee_rate_bound,
    prompt_bound_tokens_per_second,
    replica_setup,
    serving_bounds,
)
from planner.serve_search import ServePlan, evaluate
from planner.specs import ClusterSpec, ModelSpec
from planner.units import ms_to_seconds

MTP = Speculation("mtp", 2, (0.8, 0.6))

REQUESTS = {
    "default": ServeRequest(),
    "latency": ServeRequest(objective="latency"),
    "tpot sla": ServeRequest(max_tpot_seconds=0.05),
    "ttft and e2e sla": ServeRequest(max_ttft_seconds=0.5, max_e2e_seconds=8.0, input_len=4096, output_len=512),
    "batch 8": ServeRequest(batch=8),
    "clients": ServeRequest(max_concurrency=100),
    "short output": ServeRequest(input_len=128, output_len=2),
    "one output token": ServeRequest(input_len=2048, output_len=1),
    "long prompt, small budget": ServeRequest(input_len=8192, output_len=128, max_num_batched_tokens=1024),
    "dataset": ServeRequest(input_len=900, output_len=220, dataset="mix.jsonl",
                            dataset_lengths=((200, 40), (1600, 400))),
}
"""Requests without an offered rate (the bounded search's)."""

PAIRS = {
    "deepseek-v3 on 4x8xH200": ("deepseek-v3", "4x8xH200"),
    "qwen3-30b-a3b on 4x8xH100": ("qwen3-30b-a3b", "4x8xH100"),
    "llama-3.1-70b on 8x8xH100": ("llama-3.1-70b", "8x8xH100"),
    "mixtral-8x7b on 4x8xA100": ("mixtral-8x7b", "4x8xA100"),
    "llama-3.1-8b on 2x8xA100-40GB": ("llama-3.1-8b", "2x8xA100-40GB"),
}


def _candidates(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest) -> list[Layout]:
    return candidate_layouts(cluster.num_gpus, request.layout, *expert_search(model, cluster), None, True)


def check_bounds(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest) -> int:
    """Every layout: the bounds' rejection is the estimate's; otherwise its tokens/s are at most
    the bound and the prompts' bound (prompt_bound_tokens_per_second) and its TPOTs (under load,
    at one sequence) at least the floor. The count of layouts estimated."""
    request = for_vllm_release(request)
    memo, checked = Memo(), 0
    for layout in _candidates(model, cluster, request):
        bound = serving_bounds(model, cluster, layout, request, memo)
        found = estimate(model, cluster, layout, request, memo)
        if isinstance(bound, Rejected):
            assert found == bound
            continue
        if isinstance(found, Rejected):  # an SLA no concurrency meets
            continue
        assert found.throughput_tokens_per_second <= bound.max_tokens_per_second * (1 + 1e-12), layout
        prompts = prompt_bound_tokens_per_second(model, cluster, layout, request, memo)
        assert found.throughput_tokens_per_second <= prompts * (1 + 1e-12), layout
        assert bound.min_tpot_seconds <= min(found.tpot_seconds, found.tpot_batch1_seconds) * (1 + 1e-12), layout
        checked += 1
    return checked


def rotation(names: list[str], per_request: int) -> list[tuple[str, str]]:
    """Each request on `per_request` of the pairs, taken in turn, so every pair meets several
    requests (a sweep of all of them costs the suite a minute)."""
    pairs = list(PAIRS)
    return [(pairs[(i * per_request + j) % len(pairs)], name)
            for i, name in enumerate(names) for j in range(per_request)]


BOUNDS_CASES = rotation(list(REQUESTS), 2)


@pytest.mark.parametrize(("pair", "request_name"), BOUNDS_CASES, ids=[" / ".join(case) for case in BOUNDS_CASES])
def test_the_bounds_hold_for_every_layout(pair: str, request_name: str) -> None:
    model_name, cluster_name = PAIRS[pair]
    assert check_bounds(resolve_model(model_name), resolve_cluster(cluster_name), REQUESTS[request_name]) > 0


@pytest.mark.parametrize("serve_request", [
    ServeRequest(speculation=MTP),
    ServeRequest(speculation=MTP, objective="latency"),
    ServeRequest(all2all_backend="deepep_low_latency", enable_dbo=True),
    ServeRequest(all2all_backend="deepep_high_throughput", kv_cache_dtype="fp8"),
    ServeRequest(input_len=12000, output_len=512),
], ids=["mtp", "mtp latency", "deepep ll dbo", "deepep ht fp8 kv", "two chunks a prompt"])
def test_the_bounds_hold_with_drafts_and_deepep(serve_request: ServeRequest) -> None:
    """DeepSeek-V3 across 4 nodes of H200: its MTP drafter, DeepEP's exchange, dual-batch
    overlap (a step priced as two overlapped halves) are load terms too; a 12,000-token prompt
    is cut into two chunks of the 8,192-token budget (the prompts' bound from the chunk's path
    alone)."""
    assert check_bounds(resolve_model("deepseek-v3"), resolve_cluster("4x8xH200"), serve_request) > 0


def test_the_bounds_hold_under_the_v0_engine() -> None:
    """vLLM 0.6.6.post1 (V0): the plan launches it with --enable-chunked-prefill, so its steady
    state (and the bounds' argument) is V1's; Mixtral-8x7B on 4x8 A100 at 3,000/300 tokens and 50
    clients."""
    request = ServeRequest(engine_versions=parse_engine_versions("vllm=0.6.6.post1"), input_len=3000, output_len=300,
                           max_concurrency=50)
    assert check_bounds(resolve_model("mixtral-8x7b"), resolve_cluster("4x8xA100"), request) > 0


@pytest.mark.parametrize(("model_name", "cluster_name", "layout"), [
    ("deepseek-v3", "4x8xH200", Layout(8, 1, 4, ep=8)),
    ("deepseek-v3", "4x8xH200", Layout(1, 1, 32, ep=8)),
    ("gpt-oss-120b", "2x8xH100", Layout(1, 1, 16)),
    ("qwen3-30b-a3b", "4x8xH100", Layout(2, 1, 16, ep=2)),
    ("kimi-k2.5", "2x8xH200", Layout(2, 1, 8, ep=8)),
], ids=["deepseek-v3 tp8 ep8", "deepseek-v3 dp32 ep8", "gpt-oss-120b dp16", "qwen3-30b-a3b tp2 ep2",
        "kimi-k2.5 tp2 ep8, 8k prompts"])
def test_whole_expert_shapes_stay_within_the_margin(model_name: str, cluster_name: str, layout: Layout) -> None:
    """serving_bounds takes B / R(B) for every n / R(n) below the cap B, which a MoE step's whole
    rows per expert and whole experts per GPU break by a little (serve.WHOLE_SHAPES_MARGIN): at
    pp = 1 the knee's bound at c is (O / D) m c / R(c), so its largest value over c <= B over
    its value at B is max_n n / R(n) over B / R(B). On the layouts where sweeps of MoE pairs
    found the largest excess, it stays under 1 + margin (a margin below 1.06% fails on Kimi-K2.5
    at 8,000-token prompts, B = 78), and it exceeds 1 on DeepSeek-V3's (the dips are real)."""
    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    request = for_vllm_release(ServeRequest(input_len=8000, output_len=1024) if model_name == "kimi-k2.5"
                               else ServeRequest())
    bound = knee_rate_bound(model, cluster, layout, request, Memo())
    setup = replica_setup(model, with_moe_backend(cluster, request.moe_backend), layout, request)
    assert not isinstance(setup, Rejected)
    at_cap = bound(setup.cap)
    excess = max(bound(n) for n in range(1, setup.cap + 1)) / at_cap
    assert 1 <= excess <= 1 + WHOLE_SHAPES_MARGIN
    if layout.tp == 8:
        assert excess > 1.002  # 0.27% here: the dips are real
    if model_name == "kimi-k2.5":
        assert excess > 1.01  # the largest seen: 1.06%


def test_the_margin_multiplies_the_moe_bound() -> None:
    """The knee's bound at the cap B by hand for a MoE layout at pp = 1 (one micro-batch):
    (O / D) (1 + WHOLE_SHAPES_MARGIN) B / R(B), R(B) the decode round of B sequences at the
    request's decode context; for a dense layout without the margin."""
    request = for_vllm_release(ServeRequest())
    for model_name, cluster_name, layout, margin in (
            ("deepseek-v3", "4x8xH200", Layout(8, 1, 4, ep=8), 1 + WHOLE_SHAPES_MARGIN),
            ("llama-3.1-70b", "2x8xH100", Layout(8, 1, 2), 1.0)):
        model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
        setup = replica_setup(model, with_moe_backend(cluster, request.moe_backend), layout, request)
        assert not isinstance(setup, Rejected)
        cap = setup.cap
        load = StepLoad(cap, cap * request.decode_context_tokens)
        round_seconds = round_time(model, with_moe_backend(cluster, request.moe_backend), layout, setup.placement,
                                   setup.stages, load, 1, None, expert_imbalance(request), setup.constants).seconds
        bound = knee_rate_bound(model, cluster, layout, request, Memo())
        assert bound(cap) == pytest.approx(256 / 255 * margin * cap / round_seconds, rel=1e-12)


def test_the_bounds_of_one_layout_by_hand() -> None:
    """Llama-3.1-70B on 2x8 H100 at tp=4 pp=2 dp=2, 1,024/256 tokens: D = 255 decode rounds a
    request, B = its cap of sequences, R(B) the decode round of B sequences over k = 2
    micro-batches and R_0 one micro-batch's path at no load. Tokens/s at most
    dp * (O / D) * max(B / R(B), min(p, B) / R_0) = 2 * (256 / 255) * max(1024 / R(1024), 2 / R_0);
    TPOT at least R_0."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    request = for_vllm_release(ServeRequest())
    layout = Layout(4, 2, 2)
    setup = replica_setup(model, with_moe_backend(cluster, request.moe_backend), layout, request)
    assert not isinstance(setup, Rejected)
    cap = setup.cap
    assert cap == 1024  # vLLM's default max_num_seqs on H100 (serve.wanted_batch); the KV cache holds them

    def decode_round(seqs: int, in_flight: int) -> float:
        load = StepLoad(seqs, seqs * request.decode_context_tokens)
        return round_time(model, cluster, layout, setup.placement, setup.stages, load, in_flight, None,
                          expert_imbalance(request), setup.constants).seconds

    lone_path, full = decode_round(0, 1), decode_round(1024, 2)
    bound = serving_bounds(model, cluster, layout, request)
    assert bound.max_tokens_per_second == pytest.approx(2 * 256 / 255 * max(1024 / full, 2 / lone_path), rel=1e-12)
    assert bound.min_tpot_seconds == pytest.approx(lone_path, rel=1e-12)
    assert 1024 / full > 2 / lone_path  # the full batch, not the few-sequence pipeline, sets it here


def test_the_prompts_bound_of_one_layout_by_hand() -> None:
    """The same layout's second bound (serve.prompt_bound_tokens_per_second). D = 255, B = 1024,
    a budget of 8,192 tokens a step: a micro-batch's decodes take at most max(1, 1024 / 2) = 512
    of it, so a 1,024-token prompt is one chunk (N = ceil(1024 / 7680) = 1). P: one micro-batch
    carrying that chunk (1,024 tokens, 1024 * 1025 / 2 = 524,800 causal pairs) through both
    stages at no other load. lambda at the cap = 1024 / 256 = 4 requests a round, so S: the
    slower stage's step of 4 * 255 = 1,020 decodes (context 1,024 + 256 / 2 = 1,152 each), 4,096
    prompt tokens and 4 * 524,800 pairs. Per replica at most
    max(B (D + N) / (N + D B) / P, min(B^2 / (B + D (B - 1)) / P, ((D + 1) / D)^2 lambda / S))
    = max(1024 * 256 / 261,121 / P, min(1,048,576 / 261,889 / P, (256 / 255)^2 * 4 / S)),
    times O = 256 and d = 2."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    request = for_vllm_release(ServeRequest())
    layout = Layout(4, 2, 2)
    setup = replica_setup(model, with_moe_backend(cluster, request.moe_backend), layout, request)
    assert not isinstance(setup, Rejected)
    assert (setup.cap, setup.budget_tokens, request.prompt_pairs) == (1024, 8192, 524_800)
    chunk = StepLoad(0, 0, 1024, 524_800, 0.0, 1024)
    path = round_time(model, cluster, layout, setup.placement, setup.stages, StepLoad(0, 0), 1, chunk,
                      expert_imbalance(request), setup.constants).seconds
    share = 255 / 256  # the experts' tokens (a dense model has none: the share is not read)
    load = StepLoad(1020, 1020 * 1152, 4096, 4 * 524_800, 4, (1020 + 4096) * share)
    slowest = max(step.seconds for step in stage_step_times(model, cluster, layout, setup.placement, setup.stages,
                                                            load, expert_imbalance(request), setup.constants))
    per_replica = max(1024 * 256 / 261_121 / path, min(1_048_576 / 261_889 / path, (256 / 255) ** 2 * 4 / slowest))
    bound = prompt_bound_tokens_per_second(model, cluster, layout, request)
    assert bound == pytest.approx(2 * 256 * per_replica, rel=1e-12)
    first = serving_bounds(model, cluster, layout, request)
    assert bound < first.max_tokens_per_second  # the prompts' share of every round, which the first leaves out
    assert estimate(model, cluster, layout, request).throughput_tokens_per_second <= bound


def test_the_prompts_bound_stands_aside_where_it_does_not_hold() -> None:
    """math.inf (no bound): one output token (no decode rounds), dual-batch overlap (a step
    priced as two overlapped halves, which a smaller load need not undercut), and a cap whose
    concurrency fills the token budget (256 sequences of 8,192-token prompts against 1,024 a step)."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    layout = Layout(4, 2, 2)
    for request in (ServeRequest(input_len=2048, output_len=1),
                    ServeRequest(input_len=8192, output_len=128, max_num_batched_tokens=1024)):
        assert prompt_bound_tokens_per_second(model, cluster, layout, for_vllm_release(request)) == math.inf
    deepseek, h200 = resolve_model("deepseek-v3"), resolve_cluster("4x8xH200")
    request = for_vllm_release(ServeRequest(all2all_backend="deepep_high_throughput"))
    assert prompt_bound_tokens_per_second(deepseek, h200, Layout(1, 1, 32, 32), request) < math.inf
    overlapped = for_vllm_release(ServeRequest(all2all_backend="deepep_high_throughput", enable_dbo=True))
    assert prompt_bound_tokens_per_second(deepseek, h200, Layout(1, 1, 32, 32), overlapped) == math.inf


def _rows(plan: ServePlan, k: int) -> list[ServeEstimate]:
    return list(plan.layouts[:k])


def _summary_layouts(plan: ServePlan) -> tuple[Layout, Layout, Layout]:
    """What render/serve.summary_lines names beside the recommendation (summary_layouts)."""
    return tuple(r.layout for r in summary_layouts(plan))


def check_bounded_rows(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, keep_tops: tuple[int, ...],
                       monkeypatch: pytest.MonkeyPatch) -> list[ServePlan]:
    """The bounded search (bounding every search, however small) against the plain one, for
    each row limit: the same first rows (the same estimates), pareto marks on them, and summary
    layouts."""
    monkeypatch.setattr(serve_search, "BOUNDED_MIN_LAYOUTS", 0)
    plain = evaluate(model, cluster, request)
    plans = []
    for keep_top in keep_tops:
        bounded = evaluate(model, cluster, request, keep_top=keep_top)
        assert _rows(bounded, keep_top) == _rows(plain, keep_top)
        assert [r.layout in bounded.pareto for r in _rows(bounded, keep_top)] == \
            [r.layout in plain.pareto for r in _rows(plain, keep_top)]
        if plain.layouts:  # the lowest TPOT under load is summarised for the latency objective only
            fastest, lone, most = _summary_layouts(plain)
            b_fastest, b_lone, b_most = _summary_layouts(bounded)
            assert (b_lone, b_most) == (lone, most)
            assert b_fastest == fastest or request.objective != "latency"
        total = len(plain.layouts) + len(plain.rejected)
        assert len(bounded.layouts) + len(bounded.rejected) + bounded.num_configs_bounded == total
        assert bounded.bounded_below_row == (keep_top if bounded.num_configs_bounded else None)
        plans.append(bounded)
    return plans


ROW_CASES = rotation(["default", "latency", "tpot sla", "clients", "dataset"], 2)


@pytest.mark.parametrize(("pair", "request_name"), ROW_CASES, ids=[" / ".join(case) for case in ROW_CASES])
def test_the_bounded_search_keeps_the_first_rows(pair: str, request_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model_name, cluster_name = PAIRS[pair]
    plans = check_bounded_rows(resolve_model(model_name), resolve_cluster(cluster_name), REQUESTS[request_name],
                               (1, 3, 10), monkeypatch)
    assert plans[0].num_configs_bounded > 0  # one row: the bound skips something on every case here


def test_the_bound_skips_most_layouts_at_16384_gpus() -> None:
    """DeepSeek-V3 on 2048x8 H100, the table's 10 rows: 276 layouts, 223 rejected for structure
    or memory (184 before its fp8 scale blocks were checked: tp 32 and 64 split its dense layers'
    18,432 inputs into part blocks; 220 before the EP groups of one node's replicas at pp > 1);
    of the 53 that run only those whose bound reaches the rows
    are estimated (17 now, 23 of 89 when written), and the rows are the plain search's."""
    model, cluster = resolve_model("deepseek-v3"), resolve_cluster("2048x8xH100")
    plain = evaluate(model, cluster, ServeRequest())
    bounded = evaluate(model, cluster, ServeRequest(), keep_top=10)
    assert _rows(bounded, 10) == _rows(plain, 10)
    assert len(plain.layouts) == 53 and len(bounded.rejected) == len(plain.rejected) == 223
    assert bounded.num_configs_bounded >= 30
    assert _summary_layouts(bounded)[1:] == _summary_layouts(plain)[1:]


def test_the_threshold_counts_only_what_the_launch_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `counts` refusing the best layout's tp (as an engine refusing a TP degree would),
    the first rows among the rest are the plain search's first rows among the rest."""
    model, cluster = resolve_model("qwen3-30b-a3b"), resolve_cluster("4x8xH100")
    monkeypatch.setattr(serve_search, "BOUNDED_MIN_LAYOUTS", 0)
    plain = evaluate(model, cluster, ServeRequest())
    refused_tp = plain.layouts[0].layout.tp
    bounded = evaluate(model, cluster, ServeRequest(), keep_top=5, counts=lambda r: r.layout.tp != refused_tp)
    kept = lambda plan: [r for r in plan.layouts if r.layout.tp != refused_tp][:5]  # noqa: E731
    assert kept(bounded) == kept(plain)
    assert len(kept(plain)) == 5 and bounded.num_configs_bounded > 0


def test_a_rate_is_never_bounded() -> None:
    """Under a finite --request-rate with a summary (it counts every layout that keeps up),
    every layout is estimated."""
    model, cluster = resolve_model("deepseek-v3"), resolve_cluster("16x8xH100")
    request = ServeRequest(request_rate_per_s=20.0)
    assert request.offered_rate_per_s is not None
    assert evaluate(model, cluster, request, keep_top=3).num_configs_bounded == 0


@settings(max_examples=10, deadline=None, derandomize=True)
@given(
    pair=st.sampled_from(list(PAIRS)),
    lengths=st.sampled_from([(128, 128), (1024, 256), (3000, 64), (6000, 600), (20000, 200)]),
    budget=st.sampled_from([None, 2048, 16384]),
    clients=st.sampled_from([None, 40, 400]),
)
def test_the_bounds_hold_on_random_requests(pair: str, lengths: tuple[int, int], budget: int | None,
                                            clients: int | None) -> None:
    """Both bounds (and the TPOT floor) against every layout's estimate under random lengths,
    token budgets and client counts: prompts of one chunk or several (20,000 tokens against a
    2,048-token budget), lambda above and below one request a round, the budget reached or not."""
    model_name, cluster_name = PAIRS[pair]
    request = ServeRequest(input_len=lengths[0], output_len=lengths[1], max_num_batched_tokens=budget,
                           max_concurrency=clients)
    check_bounds(resolve_model(model_name), resolve_cluster(cluster_name), request)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    pair=st.sampled_from(["qwen3-30b-a3b on 4x8xH100", "llama-3.1-70b on 8x8xH100", "mixtral-8x7b on 4x8xA100"]),
    lengths=st.sampled_from([(128, 128), (1024, 256), (4096, 512), (256, 2048), (16000, 64)]),
    objective=st.sampled_from(["throughput", "latency"]),
    tpot_limit_ms=st.sampled_from([None, 20.0, 60.0]),
    batch=st.sampled_from([None, 1, 32]),
    keep_top=st.sampled_from([1, 2, 10]),
)
def test_the_bounded_search_keeps_the_first_rows_of_random_requests(pair, lengths, objective, tpot_limit_ms, batch,
                                                                     keep_top) -> None:
    model_name, cluster_name = PAIRS[pair]
    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    request = ServeRequest(input_len=lengths[0], output_len=lengths[1], objective=objective, batch=batch,
                           max_tpot_seconds=None if tpot_limit_ms is None else ms_to_seconds(tpot_limit_ms))
    with pytest.MonkeyPatch.context() as monkeypatch:
        check_bounded_rows(model, cluster, request, (keep_top,), monkeypatch)


def test_the_table_says_what_its_bound_left_out_and_json_top_matches_it(run_plan) -> None:
    """Qwen3-30B-A3B on 4x8 H100 (57 candidate layouts): the table's title counts the layouts
    not estimated below its 10 rows; --json --top 3 counts them too and lists the same three
    layouts as --json, which estimates every layout (num_layouts_bounded 0)."""
    args = ("--model", "qwen3-30b-a3b", "--cluster", "4x8xH100", "--mode", "aggregated")
    table = run_plan(*args)
    assert table.returncode == 0, table.stderr
    assert "more not estimated: bounded below row 10)" in " ".join(table.stdout.split())
    top = run_plan(*args, "--json", "--top", "3")
    every = run_plan(*args, "--json")
    top_json, every_json = json.loads(top.stdout), json.loads(every.stdout)
    assert top_json["num_layouts_bounded"] > 0 and every_json["num_layouts_bounded"] == 0
    assert top_json["layouts"] == every_json["layouts"][:3]


def explains_re_plans_report_the_same(monkeypatch: pytest.MonkeyPatch, model_name: str, cluster_name: str,
                                      request: ServeRequest, bounding: str) -> None:
    """plan explain's light sensitivity report with the re-plans bounded (serve_search's
    `bounding` function) is the one plain re-plans give, and the re-plans did skip layouts."""
    from rich.console import Console

    from planner import sensitivity
    from planner.explain import explain_serving
    from planner.render.explain import render_explanation

    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)

    def report(bounded_from: int) -> str:
        monkeypatch.setattr(serve_search, "BOUNDED_MIN_LAYOUTS", bounded_from)
        out = Console(file=io.StringIO(), width=140, record=True)
        render_explanation(explain_serving(model, cluster, request, sensitivity.LIGHT), out)
        return out.export_text()

    calls: list[int] = []
    bounded = getattr(serve_search, bounding)

    def counted(*args, **kwargs):
        evaluate_all = bounded(*args, **kwargs)
        return lambda candidates: [calls.append(r.num_bounded) or r for r in evaluate_all(candidates)]

    monkeypatch.setattr(serve_search, bounding, counted)
    assert report(0) == report(10**9)
    assert sum(calls) > 0  # the re-plans did skip layouts


def test_plan_explains_re_plans_are_bounded_and_report_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan explain's sensitivity re-plans read the recommendation and the explained layout only:
    they are bounded at one row with the explained layout always estimated, and the report is
    the one the plain re-plans give (Qwen3-30B-A3B on 4x8 H100, latency objective)."""
    explains_re_plans_report_the_same(monkeypatch, "qwen3-30b-a3b", "4x8xH100", ServeRequest(objective="latency"),
                                      "bounded_evaluation")


@pytest.mark.parametrize("model_name, cluster_name, rate, objective", [
    ("qwen3-235b-a22b-fp8", "16x8xH100", 30.0, "throughput"),
    ("deepseek-v3", "4x8xH200", 8.0, "throughput"),
    ("qwen3-30b-a3b", "4x8xH200", 100.0, "latency"),
    ("llama-3.1-8b", "16x8xH100", 2000.0, "throughput"),
])
def test_re_plans_at_a_rate_are_bounded_and_rank_the_same(model_name, cluster_name, rate, objective) -> None:
    """bounded_at_rate (a search with no summary at a finite --request-rate: plan explain's
    re-plans) keeps the plain search's first row: those that keep up rank by E2E (throughput),
    at least (O - 1) x the TPOT bound, or by TPOT (latency); one whose tokens/s bound is below
    the rate's cannot keep up. Qwen3-235B fp8 on 16x8 H100 at 30 req/s skips 56 of 95 layouts
    (plan explain 23.7 -> 12.9 s)."""
    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    request = ServeRequest(request_rate_per_s=rate, objective=objective)
    plain = evaluate(model, cluster, request)
    bounded = evaluate(model, cluster, request, keep_top=1, summary=False)
    assert bounded.layouts[0] == plain.layouts[0]
    if model_name == "qwen3-235b-a22b-fp8":
        assert bounded.num_configs_bounded >= 50


def test_plan_explains_re_plans_at_a_rate_report_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sensitivity report of an explain at a --request-rate is the one plain re-plans give
    (Qwen3-30B-A3B on 4x8 H100 at 40 req/s), and its re-plans did skip layouts."""
    explains_re_plans_report_the_same(monkeypatch, "qwen3-30b-a3b", "4x8xH100", ServeRequest(request_rate_per_s=40.0),
                                      "bounded_at_rate")


def test_the_capacity_bound_at_a_rate_takes_the_engines_cap() -> None:
    """The bounds at a rate are priced for the engine's --max-num-seqs default, as an estimate at
    a rate runs it, also under the latency objective (whose no-rate plan runs one sequence: a
    bound from it called every Qwen3-30B-A3B layout unable to keep up with 100 req/s), and with a
    memo of their own (the search's, read at the rate, had priced one sequence)."""
    model, cluster = resolve_model("qwen3-30b-a3b"), resolve_cluster("4x8xH200")
    request = ServeRequest(request_rate_per_s=100.0, objective="latency")
    bounded = evaluate(model, cluster, request, keep_top=1, summary=False)
    best = bounded.layouts[0]
    assert not best.overloaded and best.max_num_seqs > 1
    assert best == evaluate(model, cluster, request).layouts[0]


def test_stage_steps_memo_gives_what_a_fresh_pricing_gives() -> None:
    """stage_step_times keeps every stage's step for a load in the caller's memo (one lookup
    where each stage's was one, the load hashed once): a second call returns the very tuple the
    first stored, and both equal a pricing with no memo, on a layout whose first and last
    stages are priced apart (DeepSeek-V3 tp=8 pp=4: 61 layers, stages of unequal layers)."""
    model, cluster = resolve_model("deepseek-v3"), resolve_cluster("4x8xH200")
    request = for_vllm_release(ServeRequest())
    layout = Layout(8, 4, 1)
    setup = replica_setup(model, with_moe_backend(cluster, request.moe_backend), layout, request)
    assert not isinstance(setup, Rejected)
    load = StepLoad(64, 64 * 2048, 512, 512 * 256, 0.5)
    memo: dict = {}
    first = stage_step_times(model, cluster, layout, setup.placement, setup.stages, load,
                             expert_imbalance(request), setup.constants, memo)
    again = stage_step_times(model, cluster, layout, setup.placement, setup.stages, load,
                             expert_imbalance(request), setup.constants, memo)
    fresh = stage_step_times(model, cluster, layout, setup.placement, setup.stages, load,
                             expert_imbalance(request), setup.constants)
    assert again is first
    assert first == fresh
    assert len(first) == 4 and len({stage.num_layers for stage in setup.stages}) > 1


KNEE_CASES = [
    ("deepseek-v3", "2x8xH100", ServeRequest(max_num_batched_tokens=1024)),
    ("qwen3-30b-a3b", "4x8xH100", ServeRequest(input_len=4096, output_len=512, max_num_batched_tokens=2048)),
    ("llama-3.1-8b", "1x8xH100", ServeRequest(input_len=8192, output_len=64, max_num_batched_tokens=512)),
    ("llama-3.1-70b", "1x8xH100", ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=2.0,
                                               max_tpot_seconds=0.03, max_num_batched_tokens=512)),
]


@pytest.mark.parametrize(("model_name", "cluster_name", "serve_request"), KNEE_CASES,
                         ids=[f"{m} on {c}" for m, c, _ in KNEE_CASES])
def test_the_knee_searchs_rate_bound_holds_at_every_concurrency(model_name, cluster_name, serve_request,
                                                               monkeypatch) -> None:
    """serve.replica_rate_bound, serving_bounds' argument at a concurrency c in place of the cap:
    every knee search the plan runs (budget-bound layouts, the SLA search's peak) gets a bound no
    concurrency's steady state passes, at every concurrency up to its upper end (the search
    skips a sample whose bound is under its bar), and the search's answer with the bound is the
    one without it."""
    import planner.serve as serve

    searched = serve.peak_throughput_concurrency
    seen: list[tuple] = []

    def watched(steady_at, upper, tie=0.0, bound=None):
        seen.append((steady_at, upper, bound))
        return searched(steady_at, upper, tie, bound)

    monkeypatch.setattr(serve, "peak_throughput_concurrency", watched)
    evaluate(resolve_model(model_name), resolve_cluster(cluster_name), serve_request)
    assert seen
    for steady_at, upper, bound in seen[:4]:
        assert bound is not None
        step = max(1, upper // 64)
        for c in (*range(1, upper + 1, step), upper):
            assert steady_at(c).throughput_tokens_per_second <= bound(c) * (1 + 1e-12), (c, upper)
        for tie in (0.0, 0.03):
            assert searched(steady_at, upper, tie, bound) == searched(steady_at, upper, tie)
