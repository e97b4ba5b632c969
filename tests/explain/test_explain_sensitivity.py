"""How sure we are: the knobs perturb the model exactly as documented, a synthetic case
whose choice flips when the inter-node bandwidth halves reports the flip point, and a
clear-cut case reports "robust"."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.explain import explain_serving, serve_knob_base, serve_replan
from planner.layout import Layout
from planner.requests import ServeRequest
from planner.sensitivity import KnobBase, Knobs, Settings, analyze, apply_knobs
from planner.serve import estimate
from planner.serve_search import evaluate

FLIP_FACTOR = 0.7
"""Where the synthetic case is placed to flip: below 0.8 (so +/-20% survives) and above 0.5
(so halving the bandwidth flips it)."""


def with_nic(cluster, gbit_per_s: float):
    inter = cluster.inter_node.model_copy(update={"num_nics_per_node": 1, "nic_bandwidth_gbit_per_s": gbit_per_s})
    return cluster.model_copy(update={"inter_node": inter})


def synthetic_flip_case():
    """llama-3.1-70b, latency objective at 16 concurrent sequences, 2 nodes of 8 H100 with
    ONE NIC per node. With a fast NIC, tp=8 pp=2 (its pipeline sends of 8 rows x 16 KiB
    cross the network) is the fastest per token; with a slow one two tp=8 replicas (no
    network at all) win. Rather than pin a rate to a cost model still being refined, the
    test finds the NIC rate where the choice changes, by bisection, and puts the cluster's
    NIC at that rate / FLIP_FACTOR: halving it then crosses the flip, 20% does not."""
    model, request = resolve_model("llama-3.1-70b"), ServeRequest(objective="latency", batch=16)
    base = resolve_cluster("2x8xH100")

    def best(rate: float) -> Layout:
        return evaluate(model, with_nic(base, rate), request).recommended.layout

    slow, fast = 0.1, 10_000.0
    assert best(slow) != best(fast), "precondition: the network decides this case"
    for _ in range(40):
        middle = math.sqrt(slow * fast)
        slow, fast = (middle, fast) if best(middle) == best(0.1) else (slow, middle)
    return model, with_nic(base, fast / FLIP_FACTOR), request, best(10_000.0), best(0.1)


def test_halving_inter_node_bandwidth_reports_the_flip_point() -> None:
    model, cluster, request, fast_choice, slow_choice = synthetic_flip_case()
    e = explain_serving(model, cluster, request)
    report = e.sensitivity
    assert report.recommended == fast_choice
    assert evaluate(model, apply_knobs(cluster, Knobs(inter_bandwidth=0.5), serve_knob_base(
        model, cluster, e.layout, request)), request).recommended.layout == slow_choice
    knob = next(k for k in report.knobs if k.knob == "inter_bandwidth")
    assert knob.flip_down is not None
    assert knob.flip_down.factor == pytest.approx(FLIP_FACTOR, rel=0.02)
    assert knob.flip_down.value == pytest.approx(cluster.inter_node.nic_bandwidth_gbit_per_s * knob.flip_down.factor)
    assert knob.flip_down.to_layout == slow_choice
    assert knob.at_low == fast_choice, "at -20% it still holds"


def test_cli_prints_the_flip() -> None:
    from rich.console import Console

    from planner.render.explain import sensitivity_lines

    model, cluster, request, fast_choice, slow_choice = synthetic_flip_case()
    e = explain_serving(model, cluster, request)
    out = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for item in sensitivity_lines(e.sensitivity):
        out.print(item)
    text = out.export_text()
    line = next(line for line in text.splitlines() if "inter-node bandwidth" in line)
    assert any(f"{FLIP_FACTOR + d:.2f}x" in line for d in (-0.01, 0.0, 0.01)), line
    assert f"-> {slow_choice}" in line


def test_clear_cut_case_is_robust() -> None:
    result = CliRunner().invoke(app, ["explain", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                      "--objective", "latency"])
    assert result.exit_code == 0, result.output
    assert "robust: the recommendation" in result.output


def test_fragile_when_a_knob_flips_within_the_step() -> None:
    """Put the synthetic flip at 0.9: moving the bandwidth by -20% changes the choice."""
    model, cluster, request, fast_choice, slow_choice = synthetic_flip_case()
    closer = with_nic(cluster, cluster.inter_node.nic_bandwidth_gbit_per_s * FLIP_FACTOR / 0.9)
    report = explain_serving(model, closer, request).sensitivity
    assert report.verdict == "fragile"
    knob = next(k for k in report.knobs if k.knob == "inter_bandwidth")
    assert knob.at_low == slow_choice


BASE = KnobBase(hbm_utilization=0.66, matmul_fraction_of_peak=0.8, overhead_bytes=3 * 2**30, usable_fraction=0.9)


def test_knobs_scale_exactly_what_they_name() -> None:
    cluster = resolve_cluster("2x8xH100")
    moved = apply_knobs(cluster, Knobs(0.5, 0.25, 2.0, 3.0, 0.8, 1.2, 1.0), BASE)
    assert moved.intra_node.bandwidth_gb_per_s == 225
    assert moved.inter_node.nic_bandwidth_gbit_per_s == 100
    assert moved.intra_node.latency_us == 2 * cluster.intra_node.latency_us
    assert moved.inter_node.latency_us == 3 * cluster.inter_node.latency_us
    assert moved.gpu.hbm_bandwidth_gb_per_s == pytest.approx(0.8 * cluster.gpu.hbm_bandwidth_gb_per_s)
    assert moved.gpu.peak_tflops.bf16 == pytest.approx(1.2 * cluster.gpu.peak_tflops.bf16)
    kernel, before = moved.gpu.serving_moe_kernels.fp8, cluster.gpu.serving_moe_kernels.fp8
    assert kernel.tflops == pytest.approx(1.2 * before.tflops)
    assert (kernel.floor_us, kernel.hbm_utilization, kernel.half_rows) == (
        before.floor_us, before.hbm_utilization, before.half_rows)
    assert moved.gpu.memory_gib == cluster.gpu.memory_gib
    assert apply_knobs(cluster, Knobs(), BASE) == cluster
    # vLLM's all-reduce curves, which price TP inside the node, follow the intra-node knob too
    for name in ("serving_allreduce", "serving_allreduce_unfused"):
        for after, before in zip(getattr(moved.gpu, name), getattr(cluster.gpu, name), strict=True):
            assert after.median_seconds == pytest.approx([t / 0.5 for t in before.median_seconds])


def test_the_intra_node_knob_moves_a_tp_layouts_tpot() -> None:
    """Llama-3.1-70B tp=8 on one H100 node: at 0.8x the intra-node bandwidth its all-reduces
    (priced on vLLM's curves) take 1/0.8 as long and TPOT grows; it had stayed the same, the
    curves not moving with the link (a CLI read)."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100")
    layout, request = Layout(8, 1, 1), ServeRequest(batch=64)
    before = estimate(model, cluster, layout, request)
    after = estimate(model, apply_knobs(cluster, Knobs(intra_bandwidth=0.8), BASE), layout, request)
    assert after.tp_allreduce_seconds_per_layer == pytest.approx(before.tp_allreduce_seconds_per_layer / 0.8, rel=1e-6)
    assert after.tpot_seconds > before.tpot_seconds


def test_overhead_knob_takes_exactly_the_extra_overhead_from_the_kv_cache() -> None:
    """+20% of 3 GiB overhead = 0.6 GiB less KV cache on every stage."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100")
    layout, request = Layout(8, 1, 1), ServeRequest()
    before = estimate(model, cluster, layout, request)
    after = estimate(model, apply_knobs(cluster, Knobs(overhead_memory=1.2), BASE), layout, request)
    assert before.stages[0].kv_cache_bytes - after.stages[0].kv_cache_bytes == pytest.approx(0.6 * 2**30, rel=1e-6)


def test_no_network_knobs_on_one_node_and_fractions_capped_at_one() -> None:
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    request = ServeRequest()
    e = explain_serving(model, cluster, request, None)
    report = analyze(cluster, e.layout, serve_knob_base(model, cluster, e.layout, request),
                     serve_replan(model, request, e.layout), Settings())
    names = [k.knob for k in report.knobs]
    assert "inter_bandwidth" not in names and "intra_bandwidth" in names
    for k in report.knobs:
        if k.knob in ("hbm_utilization", "matmul_efficiency"):
            assert k.base_value * k.high_factor <= 1 + 1e-9
            assert k.flip_up is None or k.flip_up.value <= 1 + 1e-9
    for m in report.metrics:
        assert m.low <= m.base <= m.high


def test_draft_acceptance_is_a_knob_only_with_speculative_decoding() -> None:
    """--draft-acceptance is the least certain input of speculative decoding: the knob scales
    every rate (at most 1; its base is the highest rate, 0.6, so it scans up to 1/0.6), and
    fewer accepted drafts mean a slower TPOT at -20%."""
    from planner.requests import Speculation

    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    request = ServeRequest(batch=64, speculation=Speculation("ngram", 3, (0.6, 0.45, 0.3)))
    e = explain_serving(model, cluster, request, None)
    base = serve_knob_base(model, cluster, e.layout, request)
    replan = serve_replan(model, request, e.layout)
    report = analyze(cluster, e.layout, base, replan, Settings())
    (knob,) = [k for k in report.knobs if k.knob == "draft_acceptance"]
    assert knob.base_value == 0.6 and knob.base_value * knob.high_factor <= 1 + 1e-9
    tpot = dict(replan(cluster, Knobs(draft_acceptance=0.8)).metrics)["tpot_seconds"]
    assert tpot > dict(replan(cluster, Knobs()).metrics)["tpot_seconds"]
    plain = analyze(cluster, e.layout, serve_knob_base(model, cluster, e.layout, ServeRequest(batch=64)),
                    serve_replan(model, ServeRequest(batch=64), e.layout), Settings())
    assert "draft_acceptance" not in [k.knob for k in plain.knobs]


def test_the_report_is_the_same_on_one_core_and_on_several() -> None:
    """Each knob moved down and up is an independent re-plan (parallel.map_in_workers): one
    worker and four give the same report, field for field, flips included (the synthetic
    case flips when the inter-node bandwidth halves)."""
    model, cluster, request, _, _ = synthetic_flip_case()
    e = explain_serving(model, cluster, request, None)
    base, replan = serve_knob_base(model, cluster, e.layout, request), serve_replan(model, request, e.layout)
    alone = analyze(cluster, e.layout, base, replan, Settings(), num_workers=1)
    spread = analyze(cluster, e.layout, base, replan, Settings(), num_workers=4)
    assert alone == spread
    assert any(k.flip_down is not None for k in alone.knobs)


def test_a_plan_at_a_rate_runs_the_light_analysis(monkeypatch) -> None:
    """At a finite --request-rate every re-plan solves each layout's open loop at the rate, so
    explain runs the +/-20% runs only (sensitivity.LIGHT: no flip searched beyond them) and says
    so; without a rate the full scan runs."""
    import planner.sensitivity as sensitivity

    seen = []
    analyze_of = sensitivity.analyze
    monkeypatch.setattr(sensitivity, "analyze", lambda *a, **k: seen.append(a[4]) or analyze_of(*a, **k))
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x2xH100")
    at_rate = explain_serving(model, cluster, ServeRequest(request_rate_per_s=4.0))
    closed = explain_serving(model, cluster, ServeRequest())
    assert seen == [sensitivity.LIGHT, Settings()]
    assert any("open loop at the rate" in note for note in at_rate.notes)
    assert not any("flips not searched" in note for note in closed.notes)
