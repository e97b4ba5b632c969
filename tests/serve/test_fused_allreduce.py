"""The serving step's TP all-reduce as vLLM runs it on Hopper and Blackwell: fused with the next
RMSNorm (AllReduceFusionPass, FlashInfer's trtllm_allreduce_fusion) up to a message size per TP
size, priced at the measured kernel (catalog serving_allreduce: AIConfigurator's TRT-LLM custom
all-reduce, tests/fixtures/aiconfigurator_silicon/trtllm_custom_allreduce.csv); larger messages
at the probe's curve where the cluster was measured, else at vLLM's own unfused all-reduce as
measured (catalog serving_allreduce_unfused, vllm_allreduce.csv); groups across nodes and GPUs
without the entries at NCCL's (the probe's curve or the ring model).
docs/cost-model.md (Serving: one engine step, its TP all-reduce)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from planner.catalog import resolve_cluster, resolve_gpu
from planner.cost.comm import allreduce_seconds
from planner.cost.serving_time import (
    fused_allreduce_curve,
    tp_allreduce_seconds_per_layer,
    unfused_allreduce_curve,
)
from planner.layout import Layout, place

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/aiconfigurator_silicon/trtllm_custom_allreduce.csv"
UNFUSED_FIXTURE = FIXTURE.with_name("vllm_allreduce.csv")
CATALOG_GPUS = {"h100_sxm": "H100-SXM5-80GB", "h200_sxm": "H200-SXM-141GB", "b200_sxm": "B200-SXM-180GB",
                "gb200": "GB200"}
VLLM_0_33_MAX_MIB = {"H100-SXM5-80GB": {2: 64, 4: 2, 8: 0.5}, "H200-SXM-141GB": {2: 64, 4: 2, 8: 0.5},
                     "B200-SXM-180GB": {2: 64, 4: 32, 8: 1}, "GB200": {2: 64, 4: 32}}
"""FI_ALLREDUCE_FUSION_MAX_SIZE_MB, vllm/compilation/passes/fusion/allreduce_rms_fusion.py at
0.33.0: capability 90 {2: 64, 4: 2, 8: 0.5}, 100 {2: 64, 4: 32, 8: 1}; GB200 measured on one
tray's 2 and 4 GPUs only."""


def tp8_in_one_node(cluster):
    """tp 8 over the cluster's first 8 GPUs (one node) and its placement."""
    layout = Layout(8, 1, 1)
    return layout, place(cluster, layout)


def test_the_catalog_curves_are_the_measurements():
    """Every other measured size (x4 steps, 256 B to 256 MiB: AIConfigurator's 128 to 128 Mi
    bf16 elements) at 3 significant digits, and vLLM 0.33.0's fusion limits."""
    for key, name in CATALOG_GPUS.items():
        curves = resolve_gpu(name).serving_allreduce
        assert sorted(c.num_ranks for c in curves) == sorted(VLLM_0_33_MAX_MIB[name])
        assert_curves_are_the_fixture(curves, FIXTURE, key)
        for curve in curves:
            assert curve.max_mib == VLLM_0_33_MAX_MIB[name][curve.num_ranks]


def assert_curves_are_the_fixture(curves, fixture: Path, key: str) -> None:
    """Each curve keeps the fixture's GPU `key` points at 256 * 4^i B (i 0-10) within 0.6%
    (3 significant digits); a lone spike (a point over 1.5x both neighbours, x2 either side in
    size) is kept as the median of the three."""
    with fixture.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for curve in curves:
        measured = {int(r["message_bytes"]): float(r["latency_ms"]) / 1000 for r in rows
                    if r["gpu"] == key and int(r["num_gpus"]) == curve.num_ranks}
        assert curve.sizes_bytes == [256 * 4 ** i for i in range(11)]

        def expected(size: int, measured: dict[int, float] = measured) -> float:
            around = [measured.get(size // 2, measured[size]), measured[size], measured.get(size * 2, measured[size])]
            return sorted(around)[1] if measured[size] > 1.5 * max(around[0], around[2]) else measured[size]

        assert curve.median_seconds == pytest.approx([expected(s) for s in curve.sizes_bytes], rel=0.006)


def test_a_decode_all_reduce_hand_worked():
    """Llama-3.1-70B at tp 8 on one H100 node, 16 decoding sequences: the message is
    16 * 8192 * 2 B = 262,144 B <= 0.5 MiB, fused. That is 131,072 bf16 elements, a measured
    point of the curve (10.2 us); two per layer, 20.4 us. Halfway in log size to the next
    point, 1,048,576 B (26.0 us), the time is sqrt(10.2 * 26.0) = 16.28 us. NCCL's ring model
    would take 2*7*1 us + 2*(7/8)*262,144 B / (450 GB/s * 0.77) = 14 + 1.32 = 15.32 us each."""
    cluster = resolve_cluster("1x8xH100")
    layout, placement = tp8_in_one_node(cluster)
    seconds, source = tp_allreduce_seconds_per_layer(cluster, layout, placement, 262_144)
    assert source == "fused"
    assert seconds == pytest.approx(2 * 10.2e-6, rel=0.005)
    midway, _ = tp_allreduce_seconds_per_layer(cluster, layout, placement, 524_288)
    assert midway == pytest.approx(2 * math.sqrt(10.2e-6 * 26.0e-6), rel=0.005)
    nccl, nccl_source = tp_allreduce_seconds_per_layer(cluster, layout, placement, 262_144, engine_kernel=False)
    assert nccl_source == "model"
    assert nccl == pytest.approx(2 * (14e-6 + 2 * 7 / 8 * 262_144 / (450e9 * 0.77)), rel=0.001)


def test_above_the_limit_vllms_unfused_all_reduce_takes_over():
    """64 sequences at tp 8 on H100: 1 MiB > 0.5 MiB, so vLLM's unfused all-reduce, at its
    measured curve (catalog serving_allreduce_unfused: 1,048,576 B, 15.0 us; 30.0 us per
    layer; the ring model would take 2*7*1 us + 2*(7/8)*1 MiB / (450 GB/s * 0.77) = 14 + 5.30
    = 19.30 us each); on B200, whose limit at tp 8 is 1 MiB, the same message is still fused."""
    message = 64 * 8192 * 2
    h100 = resolve_cluster("1x8xH100")
    placement = place(h100, Layout(8, 1, 1))
    seconds, source = tp_allreduce_seconds_per_layer(h100, Layout(8, 1, 1), placement, message)
    assert source == "engine"
    assert seconds == pytest.approx(2 * 15.0e-6, rel=0.005)
    nccl, _ = tp_allreduce_seconds_per_layer(h100, Layout(8, 1, 1), placement, message, engine_kernel=False)
    assert nccl == pytest.approx(2 * allreduce_seconds(message, placement.tp_group, None))
    assert nccl == pytest.approx(2 * (14e-6 + 2 * 7 / 8 * message / (450e9 * 0.77)), rel=0.001)
    b200 = resolve_cluster("1x8xB200")
    assert fused_allreduce_curve(b200, Layout(8, 1, 1), place(b200, Layout(8, 1, 1)), message) is not None
    assert fused_allreduce_curve(b200, Layout(8, 1, 1), place(b200, Layout(8, 1, 1)), message + 1) is None


@pytest.mark.parametrize(("cluster_name", "layout", "source"), [
    ("2x4xH100", Layout(8, 1, 1), "model"),             # the TP group spans two nodes: no peer memory
    ("1x8xA100-SXM4-80GB", Layout(8, 1, 1), "engine"),  # Ampere: vLLM does not fuse; its own all-reduce, measured
    ("1x8xA100-SXM4-40GB", Layout(8, 1, 1), "engine"),  # the 80 GB part's curves: same fabric
    ("1x8xH100", Layout(1, 8, 1), None),                # no TP
])
def test_where_vllm_does_not_fuse_nothing_is_fused(cluster_name, layout, source):
    cluster = resolve_cluster(cluster_name)
    placement = place(cluster, layout)
    assert fused_allreduce_curve(cluster, layout, placement, 4096) is None
    assert (unfused_allreduce_curve(cluster, layout, placement) is not None) == (source == "engine")
    if layout.tp > 1:
        assert tp_allreduce_seconds_per_layer(cluster, layout, placement, 4096)[1] == source


UNFUSED_GPUS = {**{key: (name, sorted(VLLM_0_33_MAX_MIB[name])) for key, name in CATALOG_GPUS.items()},
                "a100_sxm": ("A100-SXM4-80GB", [2, 4, 8])}
"""The GPUs with a measured unfused curve and its group sizes: those with fused curves (vLLM
0.24.0) and A100 (vLLM 0.14.0, which it runs at every size: no fusion before Hopper; the 40 GB
part shares these curves, test_a100_40gb_shares_the_80gb_curves)."""


def test_the_unfused_catalog_curves_are_the_measurements():
    """vLLM's all-reduce (vllm_graph), every other measured size (256 B to 256 MiB) at 3
    significant digits; A100's 8-GPU 4,096 B point, 14.8 us between 5.6 and 6.3 us, is the
    median of the three."""
    for key, (name, ranks) in UNFUSED_GPUS.items():
        gpu = resolve_gpu(name)
        assert sorted(c.num_ranks for c in gpu.serving_allreduce_unfused) == ranks
        assert_curves_are_the_fixture(gpu.serving_allreduce_unfused, UNFUSED_FIXTURE, key)


def test_a100_40gb_shares_the_80gb_curves():
    """Same NVLink 3 / NVSwitch fabric and vLLM kernels: the 40 GB part's curves are the
    measured 80 GB part's."""
    assert resolve_gpu("A100-40GB").serving_allreduce_unfused == resolve_gpu("A100-80GB").serving_allreduce_unfused


def test_a100_decode_all_reduce_is_vllms_measured_one():
    """Llama-3.1-70B at tp 8 on one A100 node, 16 decoding sequences: 16 * 8192 * 2 B =
    262,144 B, a measured point of vLLM 0.14.0's all-reduce (17.1 us; 34.2 us per layer), where
    NCCL's ring model says 2*7*1 us + 2*(7/8)*262,144 B / (300 GB/s * 0.77) = 14 + 1.99 =
    15.99 us. At one sequence (16,384 B) 6.54 us against the ring's 14.1 us: vLLM's one-shot
    kernel, not 14 ring steps. No fused curve on A100."""
    cluster = resolve_cluster("1x8xA100")
    layout, placement = tp8_in_one_node(cluster)
    seconds, source = tp_allreduce_seconds_per_layer(cluster, layout, placement, 262_144)
    assert source == "engine"
    assert seconds == pytest.approx(2 * 17.1e-6, rel=0.005)
    one, _ = tp_allreduce_seconds_per_layer(cluster, layout, placement, 16_384)
    assert one == pytest.approx(2 * 6.54e-6, rel=0.005)
    nccl, _ = tp_allreduce_seconds_per_layer(cluster, layout, placement, 262_144, engine_kernel=False)
    assert nccl == pytest.approx(2 * (14e-6 + 2 * 7 / 8 * 262_144 / (300e9 * 0.77)), rel=0.001)
    assert fused_allreduce_curve(cluster, layout, placement, 4096) is None


def test_a_probe_curve_prices_what_vllm_does_not_fuse(tmp_path):
    """The probe measured this cluster's links: above the fusion limit its curve wins over the
    catalog's vLLM measurement (fused messages stay at the fused kernel). A 2 MiB all-reduce
    at tp 8 on a profile whose 8-rank intra-node curve says 40 us: 80 us per layer."""
    from planner.catalog import load_cluster

    (tmp_path / "p.yaml").write_text(
        "name: m\nnum_nodes: 1\ngpus_per_node: 8\ngpu: H100\n"
        "intra_node: {kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 1}\n"
        "measured:\n  allreduce_curves:\n"
        "  - {link: intra_node, num_ranks: 8, sizes_bytes: [1048576, 4194304], median_seconds: [4.0e-5, 4.0e-5]}\n")
    cluster = load_cluster(tmp_path / "p.yaml")
    layout, placement = tp8_in_one_node(cluster)
    seconds, source = tp_allreduce_seconds_per_layer(cluster, layout, placement, 2 * 1048576)
    assert source == "measured" and seconds == pytest.approx(80e-6)
    assert tp_allreduce_seconds_per_layer(cluster, layout, placement, 262_144)[1] == "fused"


def test_small_messages_are_cheaper_fused_than_in_the_ring_model():
    """At a few sequences (Llama-3.1-70B: 1-2 rows, 16-32 KiB) the one-shot kernel takes 3-6 us
    where the ring model's 2(n-1) latency hops alone are 6 us (tp 4) and 14 us (tp 8)."""
    for name in ("H100-SXM5-80GB", "H200-SXM-141GB", "B200-SXM-180GB"):
        cluster = resolve_cluster(f"1x8x{name}")
        for tp in (4, 8):
            layout = Layout(tp, 1, 1)
            placement = place(cluster, layout)
            for sequences in (1, 2):
                message = sequences * 8192 * 2
                fused = tp_allreduce_seconds_per_layer(cluster, layout, placement, message)
                nccl = tp_allreduce_seconds_per_layer(cluster, layout, placement, message, engine_kernel=False)
                assert fused[1] == "fused" and fused[0] < nccl[0], (name, tp, sequences)
