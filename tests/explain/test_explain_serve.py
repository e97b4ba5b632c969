"""`plan explain` for serving: the README's example (llama-3.1-405b on 2x8xH100 ->
tp=8, pp=2: TP inside each node, one PP boundary over InfiniBand), and the sections
agree with the serving estimate they explain."""

from __future__ import annotations

from functools import cache

import pytest
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.explain import Explanation, explain_serving
from planner.layout import Layout
from planner.requests import LayoutFilter, ServeRequest
from planner.serve_search import plan_serving
from planner.specs import AllreduceCurve, Measured, SpecError


@cache
def example() -> Explanation:
    return explain_serving(resolve_model("llama-3.1-405b"), resolve_cluster("2x8xH100"),
                           ServeRequest(objective="latency"))


def test_example_explains_tp8_pp2() -> None:
    e = example()
    assert e.layout == Layout(8, 2, 1)
    assert e.is_recommended


def test_tp_groups_inside_each_node_one_boundary_over_infiniband() -> None:
    pm = example().placement
    for slot in pm.slots:
        assert slot.stage == slot.node, "stage 0 on node 0, stage 1 on node 1"
        assert slot.tp_rank == slot.local_index
    assert not pm.tp_crosses_node and pm.tp_link == "nvlink"
    assert len(pm.boundaries) == 1
    b = pm.boundaries[0]
    assert (b.from_stage, b.from_node, b.to_node, b.link) == (0, 0, 1, "infiniband")


def test_memory_bars_for_both_stages() -> None:
    bars = example().memory
    assert [bar.stages for bar in bars] == [(0,), (1,)]
    for bar in bars:
        assert {s.name for s in bar.segments} == {"weights", "activations", "overhead", "KV cache"}
        assert bar.used_bytes == pytest.approx(bar.budget_bytes)
        # vLLM's budget is 0.9 of the CUDA-visible total (H100: 79.11 of 79.65 GiB)
        visible = resolve_cluster("2x8xH100").gpu.cuda_visible_memory_bytes
        assert bar.headroom_bytes == pytest.approx(bar.capacity_bytes - 0.9 * visible)


def test_all_reduce_rows_add_up_to_the_breakdowns_tp_comm() -> None:
    e = example()
    decode = [r for r in e.collectives if r.phase == "decode" and r.kind == "all-reduce"]
    assert [r.name for r in decode] == ["after attention", "after MLP"]
    assert all(r.group_size == 8 and r.link == "nvlink" for r in decode)
    tp = next(s.seconds for s in e.breakdown.segments if s.name == "TP comm")
    assert sum(r.count_per_step * r.total_seconds for r in decode) == pytest.approx(tp)
    for r in e.collectives:
        # the alpha-beta (NCCL) terms add up to the time used, unless a measured curve priced
        # it: here vLLM's fused all-reduce + RMSNorm on the decode rows (H100, 8 ranks, a few
        # KiB: the catalog's serving_allreduce), shown beside NCCL's model
        if r.measured_seconds is None:
            assert r.latency_seconds + r.bandwidth_seconds == pytest.approx(r.total_seconds)
        else:
            assert r.total_seconds == r.measured_seconds
    assert all(r.measured_seconds is not None and r.total_seconds < r.latency_seconds for r in decode)


def test_a_prefill_collectives_share_is_of_its_chunks_step() -> None:
    """Llama-3.1-70B on 8 H100: 80 all-reduces of 98.8 us after attention in a prefill step of
    155.9 ms are 5.1% of it; divided by the TTFT (479 ms, a queue and the steps' alignment
    besides) they read 1.6% (found by a CLI read)."""
    from planner.serve_search import plan_serving as plan

    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100")
    e = explain_serving(model, cluster, ServeRequest())
    best = plan(model, cluster, ServeRequest()).recommended
    for row in (r for r in e.collectives if r.phase == "prefill"):
        step = best.steady.prompt_round_seconds
        assert row.share_of_step == pytest.approx(row.count_per_step * row.total_seconds / step)
        assert step < best.ttft_seconds


def test_breakdown_sums_to_tpot_and_timeline_is_decode() -> None:
    e = example()
    tpot = next(m.value for m in e.metrics if m.name == "TPOT")
    assert sum(s.seconds for s in e.breakdown.segments) == pytest.approx(tpot)
    assert e.breakdown.total_seconds == pytest.approx(tpot)
    assert e.timeline.schedule == "decode" and e.timeline.num_stages == 2


def test_cli_shows_every_section() -> None:
    result = CliRunner().invoke(app, ["explain", "--model", "llama-3.1-405b", "--cluster", "2x8xH100",
                                      "--objective", "latency"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "tp=8 pp=2 dp=1" in out
    assert out.count("TP8 nvlink") == 2, "one bracket per node"
    assert "stage 0 -> 1, node 0 -> node 1, over infiniband" in out
    assert "stage 0 (embedding)" in out and "stage 1 (LM head)" in out
    assert "after attention" in out and "after MLP" in out
    assert "Pipeline timeline: decode" in out and "b1 t1" in out
    assert "Time breakdown" in out and "How sure we are" in out


def test_default_is_the_objectives_recommendation() -> None:
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    for objective in ("throughput", "latency"):
        request = ServeRequest(objective=objective)
        e = explain_serving(model, cluster, request, None)
        assert e.layout == plan_serving(model, cluster, request).recommended.layout


def test_layout_filter_explains_a_non_recommended_layout() -> None:
    e = explain_serving(resolve_model("llama-3.1-405b"), resolve_cluster("2x8xH100"),
                        ServeRequest(layout=LayoutFilter(tp=4, pp=4)))
    assert e.layout == Layout(4, 4, 1) and not e.is_recommended
    assert e.sensitivity.explained == Layout(4, 4, 1) and e.sensitivity.recommended == Layout(8, 2, 1)


def test_infeasible_layout_is_a_spec_error_with_the_reason() -> None:
    with pytest.raises(SpecError, match="weights exceed memory"):
        explain_serving(resolve_model("llama-3.1-405b"), resolve_cluster("2x8xH100"),
                        ServeRequest(layout=LayoutFilter(tp=1, pp=1)), None)


def test_measured_curve_sits_beside_the_model() -> None:
    cluster = resolve_cluster("2x8xH100")
    curve = AllreduceCurve(link="intra_node", num_ranks=8, sizes_bytes=[1 << 20, 1 << 26],
                           median_seconds=[40e-6, 500e-6])
    measured = cluster.model_copy(update={"measured": Measured(allreduce_curves=[curve])})
    e = explain_serving(resolve_model("llama-3.1-405b"), measured, ServeRequest(objective="latency"), None)
    rows = [r for r in e.collectives if r.kind == "all-reduce"]
    assert all(r.measured_seconds is not None for r in rows)
    assert all(r.total_seconds == r.measured_seconds for r in rows)
    assert rows[0].latency_seconds + rows[0].bandwidth_seconds != pytest.approx(rows[0].measured_seconds)


@pytest.mark.parametrize(("cluster_name", "source"), [("1x8xH200", "measured"), ("1x8xA100", "model")])
def test_moe_breakdown_shows_the_routed_experts_apart(cluster_name: str, source: str) -> None:
    """Qwen3-235B-A22B fp8 at tp 4: the fused-MoE ops of its 94 MoE layers are their own
    segment, named by where their rate comes from (H200: the catalog's measured kernel; A100:
    the dense rates), equal to the decode step's moe_seconds; the segments still sum to TPOT
    and the render draws every one (up to nine segments besides the bubble)."""
    model, cluster = resolve_model("qwen3-235b-a22b-fp8"), resolve_cluster(cluster_name)
    e = explain_serving(model, cluster, ServeRequest(layout=LayoutFilter(tp=4, pp=1), mode="aggregated"))
    name = f"routed experts (fused MoE op, {source} kernel)"
    experts = next(s.seconds for s in e.breakdown.segments if s.name == name)
    assert experts > 0
    plan = plan_serving(model, cluster, ServeRequest(layout=LayoutFilter(tp=4, pp=1), mode="aggregated"))
    best = plan.recommended
    assert experts == pytest.approx(best.batches_in_flight * best.decode_steps[best.slowest_stage].moe_seconds)
    assert sum(s.seconds for s in e.breakdown.segments) == pytest.approx(e.breakdown.total_seconds)
    result = CliRunner().invoke(app, ["explain", "--model", "qwen3-235b-a22b-fp8", "--cluster", cluster_name,
                                      "--layout", "tp=4,pp=1", "--mode", "aggregated"])
    assert result.exit_code == 0, result.output
    assert "routed experts" in result.output


def test_moe_and_very_large_serving_explanations_run_the_light_sensitivity(monkeypatch):
    """An MoE model's re-plans (some 5 ms a layout) or more than 1,024 GPUs get the +/-20% runs
    only, and the notes say so; Llama-3.1-8B on one node keeps the full analysis."""
    from planner import sensitivity

    seen = []
    real = sensitivity.analyze

    def spy(cluster, layout, base, replan, settings):
        seen.append(settings)
        return real(cluster, layout, base, replan, settings)

    monkeypatch.setattr(sensitivity, "analyze", spy)
    moe = explain_serving(resolve_model("qwen3-30b-a3b"), resolve_cluster("1x8xH100"), ServeRequest())
    assert seen[-1] == sensitivity.LIGHT and any("the +/-20% runs only" in n for n in moe.notes)
    dense = explain_serving(resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100"), ServeRequest())
    assert seen[-1] == sensitivity.Settings() and not any("the +/-20% runs only" in n for n in dense.notes)


def test_breakdown_idle_is_the_headers_bubble_under_prompt_load() -> None:
    """Llama-3.1-70B tp=2 pp=8 on 2x8 H100 at vLLM's default 1,024 sequences: most rounds carry
    prompt chunks, whose carriers' path paces the round while the other stages wait. The
    header's bubble (1 - mean busy / mean round) is that waiting; the breakdown counted all of
    the prompt rounds' extra time as prompt work and drew no bubble (it said 0% beside 64%).
    Now the added time splits as the busiest stage's extra work over the round's extra time:
    its idle plus the sends is the header's fraction of TPOT (TPOT is the mean round less the
    request's own share, 1/1,024 of the prompt time: the two differ by well under 1%)."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    e = explain_serving(model, cluster, ServeRequest(layout=LayoutFilter(tp=2, pp=8)), None)
    segments = {s.name: s.seconds for s in e.breakdown.segments}
    bubble = next(m.value for m in e.metrics if m.name == "bubble")
    assert bubble > 0.5
    assert (segments["bubble"] + segments["PP comm"]) / e.breakdown.total_seconds == pytest.approx(bubble, abs=0.01)
    assert 0 < segments["prompt chunks in the step"] < e.breakdown.total_seconds * (1 - bubble)
    assert sum(segments.values()) == pytest.approx(e.breakdown.total_seconds)


@pytest.mark.parametrize(("model_name", "cluster_name", "layout", "request_fields"), [
    ("llama-3.1-70b", "1x8xH100", LayoutFilter(tp=4, pp=2), {"batch": 64}),
    ("qwen3-30b-a3b", "1x8xH100", LayoutFilter(tp=2, pp=4), {"request_rate_per_s": 2.0}),
    ("llama-3.1-8b", "1x8xH100", LayoutFilter(tp=8), {"max_concurrency": 300, "max_tpot_seconds": 0.008}),
    ("gpt-oss-120b", "1x1xH200", LayoutFilter(tp=1), {"input_len": 8192, "output_len": 1024, "batch": 8}),
])
def test_ttft_breakdown_adds_up_to_the_ttft(model_name, cluster_name, layout, request_fields) -> None:
    """The TTFT breakdown's parts are what steady_state adds: the 10 ms first-token cost, the
    clients' wait for a slot, the budget queue, the prompt's own service over its chunks
    (prompt_service_seconds, split by the chunk round's parts) and, left over, the wait for the
    step in progress; none negative, and they sum to the estimate's TTFT. 300 clients over a
    TPOT cap: the slot wait is the steady state's."""
    request = ServeRequest(mode="aggregated", layout=layout, **request_fields)
    e = explain_serving(resolve_model(model_name), resolve_cluster(cluster_name), request, None)
    b = e.ttft_breakdown
    ttft = next(m.value for m in e.metrics if m.name == "TTFT")
    assert b is not None and b.total_seconds == pytest.approx(ttft)
    parts = {s.name: s.seconds for s in b.segments}
    assert all(v >= 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(b.total_seconds, rel=1e-9)
    assert parts["first-token cost (client, API server, detokenize)"] == pytest.approx(0.010)
    service = sum(v for name, v in parts.items() if name.startswith("prompt: "))
    assert service > 0
    if "max_concurrency" in request_fields:
        assert parts["waiting for an engine slot (clients beyond it)"] > 0.9 * b.total_seconds
    if model_name == "gpt-oss-120b":
        assert parts["prompt: routed experts"] > parts["prompt: attention"] > 0


def test_a_ttft_breakdown_with_many_parts_renders() -> None:
    """Mixtral on tp=2 pp=2 dp=2 ep=4 at 2 req/s: 11 TTFT parts (first-token cost, nine of the
    prompt's, the wait) against 10 bar symbols raised a KeyError after the header was printed
    (exit 1). Every part gets a symbol; the text and the SVG render."""
    args = ["explain", "--model", "mixtral-8x7b", "--cluster", "1x8xH100", "--layout", "tp=2,pp=2,dp=2,ep=4",
            "--request-rate", "2", "--no-sensitivity"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    legend = " ".join(result.output.split()).split("the mean time to first token under load")[1]
    symbols = [part.split("]")[0] for part in legend.split("[")[1:]]
    assert len(symbols) >= 11 and len(set(symbols)) == len(symbols)


def test_a_slot_wait_at_a_rate_is_the_arrivals_in_the_ttft_breakdown():
    """Llama-3.1-70B tp=8 with --batch 1 at 0.3 req/s: arrivals wait for the one slot (an M/D/1
    queue, some 8.8 s); the TTFT breakdown names them, not clients, and they are nearly all of it."""
    request = ServeRequest(mode="aggregated", layout=LayoutFilter(tp=8, pp=1, dp=1), batch=1, request_rate_per_s=0.3)
    e = explain_serving(resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100"), request, None)
    parts = {s.name: s.seconds for s in e.ttft_breakdown.segments}
    assert parts["waiting for an engine slot (arrivals finding every one busy)"] > 0.9 * e.ttft_breakdown.total_seconds
    assert sum(parts.values()) == pytest.approx(e.ttft_breakdown.total_seconds, rel=1e-9)


def test_the_step_scheduled_ahead_is_its_own_ttft_part():
    """Llama-3.1-70B tp=8 at 2 req/s: under async scheduling (vLLM's default) an arrival waits out
    the step in progress and then the step already scheduled after it; the breakdown shows that
    second wait apart (the steady state's ahead_seconds, about one decoder's round: 12.5 ms at
    this load). Without async scheduling the part is gone and TTFT is that much lower."""
    def explained(ahead: bool | None):
        request = ServeRequest(mode="aggregated", layout=LayoutFilter(tp=8, pp=1, dp=1), request_rate_per_s=2.0,
                               async_scheduling=ahead)
        return explain_serving(resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100"), request, None)

    on, off = explained(None), explained(False)
    parts = {s.name: s.seconds for s in on.ttft_breakdown.segments}
    steady = plan_serving(resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100"), ServeRequest(
        mode="aggregated", layout=LayoutFilter(tp=8, pp=1, dp=1), request_rate_per_s=2.0)).recommended.steady
    assert parts["waiting out the step scheduled ahead (async scheduling)"] == pytest.approx(steady.ahead_seconds)
    assert 0.5 * steady.decoding_round_seconds < steady.ahead_seconds <= steady.decoding_round_seconds
    assert not any("scheduled ahead" in s.name for s in off.ttft_breakdown.segments)
    assert off.ttft_breakdown.total_seconds == pytest.approx(on.ttft_breakdown.total_seconds - steady.ahead_seconds,
                                                             rel=0.05)
