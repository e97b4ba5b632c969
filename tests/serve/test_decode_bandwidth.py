"""The decode step's weight read at the share of HBM bandwidth the engine's linear kernels stream
at, by matmul precision (catalog serving_decode_hbm_utilization; fitted by
bench/decode_bandwidth_calibration.py from how TPOT falls with TP in AIConfigurator's measured
vLLM runs), the LM head at DECODE_HBM_UTILIZATION."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_gpu, resolve_model
from planner.cost import efficiency as eff
from planner.cost.serving_memory import stage_memory
from planner.cost.serving_time import (
    StepLoad,
    head_weight_bytes_read,
    linear_hbm_utilization,
    non_expert_weight_bytes_read,
    stage_step_time,
    step_constants,
    weight_read_seconds,
)
from planner.layout import Layout, place
from planner.requests import ServeRequest
from planner.schema import ValidationError

FIT_TOLERANCE = 0.02
"""The catalog's value is the fit's median, rounded to two places."""


def one_replica(spec: str, cluster_name: str, tp: int):
    model = resolve_model(spec)
    cluster = resolve_cluster(cluster_name)
    layout = Layout(tp, 1, 1)
    stage = stage_memory(model, cluster, layout, ServeRequest(max_model_len=4096), 8)[0]
    return model, cluster, layout, stage


def test_llama_70b_nvfp4_on_one_b200_hand_worked():
    model, cluster, layout, stage = one_replica("llama-3.1-70b-nvfp4", "1x1xB200", 1)
    # the untied LM head, 16-bit: 128,256 x 8,192 x 2 B = 2,101,346,304 B, plus the final norm's
    # 8,192 x 2 B = 16,384 B
    head = head_weight_bytes_read(model, stage, layout)
    assert head == 128256 * 8192 * 2 + 8192 * 2
    layers = non_expert_weight_bytes_read(model, stage, layout) - head
    # B200: 8,000 GB/s; the head at 0.76 (6.08e12 B/s), the NVFP4 layers at 0.66 (5.28e12 B/s)
    expected = head / 6.08e12 + layers / 5.28e12
    assert weight_read_seconds(model, cluster, stage, layout, 0.66) == pytest.approx(expected, rel=1e-12)
    assert linear_hbm_utilization(model, cluster) == 0.66
    # 70.6e9 layer weights at 0.5625 B (the NVFP4 values and their block scales) ~ 39.7 GB: ~7.5 ms
    assert 7.0e-3 < layers / 5.28e12 < 8.0e-3


def test_the_head_is_read_on_the_last_stage_only():
    model = resolve_model("llama-3.1-70b-nvfp4")
    cluster = resolve_cluster("1x4xB200")
    layout = Layout(2, 2, 1)
    stages = stage_memory(model, cluster, layout, ServeRequest(max_model_len=4096), 8)
    assert head_weight_bytes_read(model, stages[0], layout) == 0.0
    # the last stage's head is split over tp 2: 128,256 x 8,192 x 2 B / 2 + the final norm
    assert head_weight_bytes_read(model, stages[1], layout) == 128256 * 8192 * 2 / 2 + 8192 * 2


def test_a_tied_head_is_the_embedding_table():
    model = resolve_model("llama-3.1-8b").model_copy(update={"tie_word_embeddings": True})
    cluster = resolve_cluster("1x2xH100")
    layout = Layout(2, 1, 1)
    stage = stage_memory(model, cluster, layout, ServeRequest(max_model_len=4096), 8)[0]
    # the vocab-parallel table, 128,256 x 4,096 x 2 B / 2, read as the head, plus the final norm's
    # 4,096 x 2 B
    assert head_weight_bytes_read(model, stage, layout) == 128256 * 4096 * 2 / 2 + 4096 * 2


@pytest.mark.parametrize("spec,cluster_name,expected", [
    # measured: Hopper's 16-bit and fp8 kernels (NVFP4 dequantizes to 16-bit GEMMs there), B200's fp8
    ("llama-3.1-70b-fp8", "1x8xH100", 0.90), ("llama-3.1-70b", "1x8xH200", 0.90),
    ("llama-3.1-70b-nvfp4", "1x8xH100", 0.90), ("llama-3.1-70b-fp8", "1x8xH800", 0.90),
    ("llama-3.1-70b-fp8", "1x8xB200", 0.78),
    # the L40S's, read off its kernels alone (bench/decode_bandwidth_calibration.py --gemm)
    ("llama-3.1-8b", "1x1xL40S", 0.82), ("llama-3.1-8b-fp8", "1x1xL40S", 0.73),
    # not in the catalog: B200's 16-bit kernels, A100 (gpt-fast's own fit is the default), the L40
    ("llama-3.1-70b", "1x8xB200", eff.DECODE_HBM_UTILIZATION), ("llama-3.1-70b", "1x8xA100", eff.DECODE_HBM_UTILIZATION),
    ("llama-3.1-8b", "1x1xL40", eff.DECODE_HBM_UTILIZATION),
])
def test_measured_shares_and_the_default(spec, cluster_name, expected):
    model, cluster = resolve_model(spec), resolve_cluster(cluster_name)
    assert linear_hbm_utilization(model, cluster) == expected


def test_a_share_above_one_is_refused():
    gpu = resolve_gpu("B200")
    with pytest.raises(ValidationError):
        gpu.model_validate({**gpu.model_dump(), "serving_decode_hbm_utilization": {"fp4": 1.2}})


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.floats(1, 256), st.floats(0, 8192))
def test_nvfp4_decode_is_slower_than_at_the_default_share_by_the_layers_read_alone(tp, sequences, context):
    model, cluster, layout, stage = one_replica("llama-3.1-70b-nvfp4", f"1x{tp}xB200", tp)
    placement = place(cluster, layout)
    load = StepLoad(sequences, sequences * context)
    measured = step_constants(model, cluster, layout)
    default = replace(measured, linear_hbm_utilization=eff.DECODE_HBM_UTILIZATION)
    slow = stage_step_time(model, cluster, layout, placement, stage, load, constants=measured)
    fast = stage_step_time(model, cluster, layout, placement, stage, load, constants=default)
    layers = non_expert_weight_bytes_read(model, stage, layout) - head_weight_bytes_read(model, stage, layout)
    hbm = cluster.gpu.hbm_bytes_per_s
    extra = layers / (hbm * 0.66) - layers / (hbm * eff.DECODE_HBM_UTILIZATION)
    # where the weight read bounds the GEMMs the step is slower by exactly the extra read; where
    # compute bounds them, by less; never faster
    assert fast.seconds <= slow.seconds <= fast.seconds + extra * (1 + 1e-9)
    if slow.bound == "memory" and fast.bound == "memory":
        assert slow.seconds - fast.seconds == pytest.approx(extra, rel=1e-6)


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("decode_bandwidth_calibration")


def test_the_catalog_value_is_the_fit(bench):
    summary = {(row["gpu"], row["precision"]): row for row in bench.summarize(bench.series_fits(bench.load_rows()))}
    assert sorted(summary) == [("B200-SXM-180GB", "fp4"), ("B200-SXM-180GB", "fp8"), ("H100-SXM5-80GB", "bf16"),
                               ("H100-SXM5-80GB", "fp8"), ("H200-SXM-141GB", "fp8")]
    assert summary[("B200-SXM-180GB", "fp4")]["series"] == 4
    for row in summary.values():
        # every measured GPU and precision: the catalog holds the fit's median, rounded
        assert row["catalog_utilization"] == pytest.approx(row["median_utilization"], abs=FIT_TOLERANCE)
        assert 0.6 < row["min_utilization"] and row["max_utilization"] < 1.0
    # NVFP4's kernels stream 15% slower than fp8's on the same GPU, in the same runs
    assert summary[("B200-SXM-180GB", "fp4")]["median_utilization"] < 0.9 * summary[("B200-SXM-180GB", "fp8")][
        "median_utilization"]


def test_where_no_engine_ran_the_kernels_give_the_stream(bench):
    """L40S: the catalog's u is the slope of AIConfigurator's vLLM GEMMs at M <= 8 (no engine runs
    there); the method checked on H100, where it lands within 5% of the engine runs' u."""
    fits = {(row["gpu"], row["precision"]): row for row in bench.gemm_fits()}
    for precision in ("bf16", "fp8"):
        row = fits[("L40S", precision)]
        assert row["catalog_utilization"] == pytest.approx(row["utilization"], abs=FIT_TOLERANCE)
        assert row["shapes"] > 200
        h100 = fits[("H100-SXM5-80GB", precision)]
        assert h100["utilization"] == pytest.approx(h100["catalog_utilization"], rel=0.05)
    # the bf16 kernel streams faster than the per-tensor fp8 one on the L40S, as measured
    assert fits[("L40S", "bf16")]["utilization"] > fits[("L40S", "fp8")]["utilization"] + 0.05
