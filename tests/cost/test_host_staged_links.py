"""PCIe without GPU peer-to-peer (GeForce cards on NVIDIA's stock driver): NCCL stages every
transfer through host memory, priced as the link at HOST_STAGED_BANDWIDTH_FRACTION of its
bandwidth and at least HOST_STAGED_STEP_LATENCY_SECONDS per ring step
(planner/layout.intra_node_link; docs/cost-model.md#collectives-alpha-beta-ring-busbw)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_gpu
from planner.cost.comm import allreduce_seconds, p2p_seconds
from planner.cost.efficiency import HOST_STAGED_BANDWIDTH_FRACTION, HOST_STAGED_STEP_LATENCY_SECONDS
from planner.layout import Layout, intra_node_link, place
from planner.schema import ValidationError
from planner.specs import ClusterSpec


def cluster_with(gpu: str, peer_to_peer: bool, gpus: int = 2, measured: bool = False) -> ClusterSpec:
    raw = {"name": f"1x{gpus}x{gpu}", "num_nodes": 1, "gpus_per_node": gpus, "gpu": resolve_gpu(gpu),
           "intra_node": {"kind": "pcie", "bandwidth_gb_per_s": 31, "latency_us": 2.0, "peer_to_peer": peer_to_peer}}
    if measured:
        raw["measured"] = {"date": "2026-12-06", "backend": "nccl"}
    return ClusterSpec.model_validate(raw)


def test_the_staged_link_by_hand() -> None:
    """2x RTX 4090 (catalog: PCIe Gen4 31 GB/s, 2 us, no P2P): 31 GB/s x 0.42 = 13.02 GB/s per
    direction, max(2 us, 5 us) = 5 us per step."""
    link = intra_node_link(resolve_cluster("1x2xRTX-4090"))
    assert link.host_staged
    assert link.bandwidth_bytes_per_s == pytest.approx(13.02e9)
    assert link.latency_seconds == pytest.approx(5e-6)


def test_the_tp_allreduce_by_hand() -> None:
    """Llama-3.1-8B's prompt step all-reduce at tp 2 on 2x RTX 4090, S = 1,318,912 B: NCCL reaches
    0.77 of the staged 13.02 GB/s = 10.0254 GB/s busbw; T = 2(n-1) alpha + 2(n-1)/n S / beta =
    2 x 5 us + 1,318,912 / 10.0254e9 s = 10 + 131.56 = 141.56 us. With P2P (31 x 0.77 = 23.87
    GB/s, 2 us): 4 + 55.25 = 59.25 us."""
    staged = place(resolve_cluster("1x2xRTX-4090"), Layout(tp=2, pp=1, dp=1)).tp_group
    direct = place(cluster_with("RTX-4090", True), Layout(tp=2, pp=1, dp=1)).tp_group
    assert allreduce_seconds(1_318_912, staged, None) == pytest.approx(141.56e-6, rel=1e-4)
    assert allreduce_seconds(1_318_912, direct, None) == pytest.approx(59.25e-6, rel=1e-4)


def test_a_pipeline_send_is_staged_too() -> None:
    """A stage boundary's send/recv crosses the same host path: 1 MB at 13.02 GB/s + 5 us =
    76.80 + 5 = 81.80 us (with P2P 32.26 + 2 = 34.26 us)."""
    staged = place(resolve_cluster("1x2xRTX-3090"), Layout(tp=1, pp=2, dp=1)).pp_link
    direct = place(cluster_with("RTX-3090", True), Layout(tp=1, pp=2, dp=1)).pp_link
    assert p2p_seconds(1e6, staged) == pytest.approx(81.80e-6, rel=1e-3)
    assert p2p_seconds(1e6, direct) == pytest.approx(34.26e-6, rel=1e-3)


def test_a_probed_link_is_what_was_measured() -> None:
    """`plan probe` measures the path the GPUs really take, so no staging is applied on top."""
    link = intra_node_link(cluster_with("RTX-4090", False, measured=True))
    assert not link.host_staged
    assert link.bandwidth_bytes_per_s == pytest.approx(31e9)
    assert link.latency_seconds == pytest.approx(2e-6)


def test_which_catalog_gpus_lack_peer_to_peer() -> None:
    for name in ("RTX-3090", "RTX-4090", "RTX-5090"):
        assert not resolve_cluster(f"1x2x{name}").intra_node.peer_to_peer, name
    for name in ("L40S", "RTX-A6000", "A40", "RTX-6000-Ada", "RTX-PRO-6000", "H100", "A100"):
        assert resolve_cluster(f"1x2x{name}").intra_node.peer_to_peer, name


def test_peer_to_peer_must_be_a_boolean() -> None:
    with pytest.raises(ValidationError, match="peer_to_peer"):
        ClusterSpec.model_validate({"name": "x", "num_nodes": 1, "gpus_per_node": 2, "gpu": resolve_gpu("RTX-4090"),
                                    "intra_node": {"kind": "pcie", "bandwidth_gb_per_s": 31, "latency_us": 2,
                                                   "peer_to_peer": "no"}})


@given(size=st.floats(1.0, 1e10), ranks=st.integers(2, 8), latency_us=st.floats(0.01, 50.0),
       bandwidth=st.floats(1.0, 900.0))
def test_staging_never_makes_a_collective_faster(size: float, ranks: int, latency_us: float, bandwidth: float) -> None:
    def allreduce(p2p: bool) -> float:
        raw = {"name": "x", "num_nodes": 1, "gpus_per_node": ranks, "gpu": resolve_gpu("RTX-4090"),
               "intra_node": {"kind": "pcie", "bandwidth_gb_per_s": bandwidth, "latency_us": latency_us,
                              "peer_to_peer": p2p}}
        return allreduce_seconds(size, place(ClusterSpec.model_validate(raw), Layout(tp=ranks, pp=1, dp=1)).tp_group, None)

    assert allreduce(False) >= allreduce(True)
    assert HOST_STAGED_BANDWIDTH_FRACTION < 1 and HOST_STAGED_STEP_LATENCY_SECONDS > 0


def test_the_plan_says_the_link_is_staged_and_prices_it(tmp_path) -> None:
    """The header names the staged path; the same 2x RTX 4090 described with P2P prices the
    TP all-reduce faster (the CLI, end to end)."""
    import json
    import subprocess
    import sys

    def plan(cluster: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "planner", "--model", "llama-3.1-8b", "--cluster", cluster,
                               "--layout", "tp=2", "--max-model-len", "8192", "--mode", "aggregated", "--json"],
                              capture_output=True, text=True, env={"COLUMNS": "300", "PATH": ""})

    profile = tmp_path / "p2p.yaml"
    profile.write_text("name: 1x2x4090-p2p\nnum_nodes: 1\ngpus_per_node: 2\ngpu: RTX-4090\n"
                       "intra_node: {kind: pcie, bandwidth_gb_per_s: 31, latency_us: 2.0, peer_to_peer: true}\n")
    staged, direct = plan("1x2xRTX-4090"), plan(str(profile))
    assert staged.returncode == 0 and direct.returncode == 0, staged.stderr + direct.stderr
    per_layer = [json.loads(r.stdout)["recommended"]["tp_allreduce_seconds_per_layer"] for r in (staged, direct)]
    assert per_layer[0] > 2 * per_layer[1]
    text = subprocess.run([sys.executable, "-m", "planner", "--model", "llama-3.1-8b", "--cluster", "1x2xRTX-4090",
                           "--max-model-len", "8192", "--mode", "aggregated"],
                          capture_output=True, text=True, env={"COLUMNS": "400", "PATH": ""})
    assert "no GPU peer-to-peer: NCCL stages every transfer through host memory" in text.stdout


def test_explain_says_the_tp_group_goes_through_host_memory() -> None:
    from planner.explain import placement_map
    from planner.render.explain import placement_summary

    def caption(cluster: str) -> str:
        pm = placement_map(resolve_cluster(cluster), Layout(tp=2, pp=1, dp=1))
        return " ".join(placement_summary(pm))

    assert "all-reduces over pcie through host memory (no GPU peer-to-peer)" in caption("1x2xRTX-4090")
    assert "through host memory" not in caption("1x2xL40S")


@pytest.mark.parametrize(("gpu", "kind", "access"), [
    ("RTX-4090", "pcie", False),  # the card's own: no P2P on PCIe
    ("RTX-5090", "pcie", False),
    ("L40S", "pcie", True),  # a data-centre card on PCIe has it
    ("RTX-4090", "nvlink", True),  # a fabric the catalog's link is not: the profile's, direct
])
def test_a_profile_that_leaves_peer_to_peer_out_takes_the_gpus_own(gpu: str, kind: str, access: bool) -> None:
    """A hardware profile copied from the shipped 1x4xL40S one (no peer_to_peer key) for RTX 4090s
    had priced them with P2P (a review: 375 tok/s where the shorthand's staged path gives 261):
    peer access is the card's and its driver's, so an omitted key takes the catalog GPU's on the
    same fabric; a key given is kept either way (a patched driver may give GeForce cards P2P)."""
    raw = {"name": "p", "num_nodes": 1, "gpus_per_node": 2, "gpu": resolve_gpu(gpu),
           "intra_node": {"kind": kind, "bandwidth_gb_per_s": 31, "latency_us": 2.0}}
    cluster = ClusterSpec.model_validate(raw)
    assert cluster.intra_node.peer_to_peer is access
    assert intra_node_link(cluster).host_staged is (not access)
    given = ClusterSpec.model_validate({**raw, "intra_node": {**raw["intra_node"], "peer_to_peer": not access}})
    assert given.intra_node.peer_to_peer is (not access)
