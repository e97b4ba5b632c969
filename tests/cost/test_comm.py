"""Alpha-beta collective times worked by hand, measured-curve interpolation, and properties.

Ring all-reduce (nccl-tests doc/PERFORMANCE.md): T = 2(n-1)*alpha + 2(n-1)/n * S/beta.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.catalog import resolve_cluster
from planner.cost.comm import (
    allreduce_seconds,
    collective_link,
    curve_seconds,
    p2p_seconds,
    ring_allgather_seconds,
    ring_allreduce_seconds,
)
from planner.layout import GroupTopology, Layout, Link, place
from planner.schema import ValidationError
from planner.specs import AllreduceCurve

NVLINK = Link("nvlink", "intra_node", bandwidth_bytes_per_s=300e9, latency_seconds=1e-6)


def test_ring_allreduce_one_rank_is_free() -> None:
    assert ring_allreduce_seconds(1e9, 1, NVLINK) == 0.0
    assert ring_allreduce_seconds(1e9, 8, None) == 0.0


def test_ring_allreduce_eight_gpus_by_hand() -> None:
    """n=8, S=600 MB, beta=300 GB/s, alpha=1 us:
    2*7 = 14 steps * 1 us = 14 us; 14/8 * 600e6 / 300e9 = 1.75 * 2 ms = 3.5 ms;
    T = 3.514 ms."""
    assert ring_allreduce_seconds(600e6, 8, NVLINK) == pytest.approx(3.514e-3)


def test_ring_allreduce_two_gpus_by_hand() -> None:
    """n=2, S=16 MiB = 16,777,216 B, beta=300e9, alpha=1 us:
    2 steps * 1 us + 2/2 * 16,777,216 / 300e9 = 2e-6 + 55.924e-6 = 57.924 us."""
    assert ring_allreduce_seconds(16 * 2**20, 2, NVLINK) == pytest.approx(57.924e-6, rel=1e-4)


def test_allgather_by_hand() -> None:
    """n=4, S=4 MB, beta=1 GB/s, alpha=10 us: 3 * 10 us + 3/4 * 4e6/1e9 = 30 us + 3 ms = 3.03 ms.
    Half the all-reduce's steps and bytes."""
    link = Link("pcie", "intra_node", bandwidth_bytes_per_s=1e9, latency_seconds=10e-6)
    assert ring_allgather_seconds(4e6, 4, link) == pytest.approx(3.03e-3)
    assert ring_allreduce_seconds(4e6, 4, link) == pytest.approx(2 * 3.03e-3)
    assert ring_allgather_seconds(4e6, 1, link) == 0.0


def test_p2p_by_hand() -> None:
    """alpha + S/beta: 1 us + 64 MB / 300 GB/s = 1 us + 213.33 us = 214.33 us; no link = 0."""
    assert p2p_seconds(64e6, NVLINK) == pytest.approx(1e-6 + 64e6 / 300e9)
    assert p2p_seconds(64e6, NVLINK) == pytest.approx(214.333e-6, rel=1e-5)
    assert p2p_seconds(64e6, None) == 0.0


def test_tp_group_crossing_nodes_is_slower() -> None:
    """2x8xA100: tp=8 stays on NVLink (300 GB/s, 1 us per step); tp=16 spans both nodes and
    its ring crosses InfiniBand, where 8 x 200 Gb/s = 200 GB/s per node shared by 8 GPUs
    gives 25 GB/s per GPU (5 us per step). For S = 256 MiB = 268,435,456 B:
    tp=8:  14 * 1 us + 14/8 * 268,435,456 / 300e9 = 14 us + 1.5658 ms = 1.5798 ms
    tp=16: 30 * 5 us + 30/16 * 268,435,456 / 25e9 = 150 us + 20.133 ms = 20.283 ms."""
    cluster = resolve_cluster("2x8xA100")
    inside = place(cluster, Layout(tp=8, pp=1, dp=2))
    across = place(cluster, Layout(tp=16, pp=1, dp=1))
    assert not inside.tp_crosses_node and across.tp_crosses_node
    assert inside.tp_link.scope == "intra_node" and inside.tp_link.kind == "nvlink"
    assert across.tp_link.scope == "inter_node" and across.tp_link.kind == "infiniband"
    assert across.tp_link.bandwidth_bytes_per_s == pytest.approx(25e9)
    size = 256 * 2**20
    t8 = ring_allreduce_seconds(size, 8, inside.tp_link)
    t16 = ring_allreduce_seconds(size, 16, across.tp_link)
    assert t8 == pytest.approx(1.5798e-3, rel=1e-4)
    assert t16 == pytest.approx(20.283e-3, rel=1e-4)
    assert t16 > t8


# --- measured curves -------------------------------------------------------------------

CURVE = AllreduceCurve(
    link="intra_node",
    num_ranks=8,
    sizes_bytes=[2**10, 2**20, 2**30],
    median_seconds=[1e-5, 1e-4, 1e-2],
)


@pytest.mark.parametrize(("size", "seconds"), [(2**10, 1e-5), (2**20, 1e-4), (2**30, 1e-2)])
def test_curve_exact_at_measured_points(size: int, seconds: float) -> None:
    assert curve_seconds(CURVE, size) == pytest.approx(seconds)


def test_curve_log_log_between_points() -> None:
    """2**15 is halfway between 2**10 and 2**20 in log size, so the time is the geometric
    mean: sqrt(1e-5 * 1e-4) = 3.1623e-5 s. At 2**25 (halfway to 2**30): sqrt(1e-4 * 1e-2) = 1e-3."""
    assert curve_seconds(CURVE, 2**15) == pytest.approx(math.sqrt(1e-5 * 1e-4))
    assert curve_seconds(CURVE, 2**25) == pytest.approx(1e-3)


def test_curve_floor_below_the_sweep() -> None:
    """Smaller than the smallest measured message: the latency floor, 1e-5 s."""
    assert curve_seconds(CURVE, 1) == pytest.approx(1e-5)
    assert curve_seconds(CURVE, 512) == pytest.approx(1e-5)


def test_curve_linear_above_the_sweep() -> None:
    """Last segment slope (1e-2 - 1e-4) / (2**30 - 2**20) s per byte continues:
    at 2**31, 1e-2 + 9.9e-3 * 2**30 / (2**30 - 2**20) = 1e-2 + 9.9e-3 * 1024/1023 = 0.0199097 s."""
    assert curve_seconds(CURVE, 2**31) == pytest.approx(1e-2 + 9.9e-3 * 1024 / 1023)


def test_a_curve_needs_two_points() -> None:
    """One point cannot separate latency from bandwidth (1 KiB in 10 us scaled to 8 MB would
    be 80 ms). A dip between sizes (NCCL switching protocols, a noisy CPU probe) is kept."""
    with pytest.raises(ValidationError, match="at least two sizes"):
        AllreduceCurve(link="world", num_ranks=2, sizes_bytes=[1000], median_seconds=[2e-3])
    dip = AllreduceCurve(link="world", num_ranks=2, sizes_bytes=[1024, 4096, 2**20], median_seconds=[2e-5, 1.6e-5, 9e-5])
    assert curve_seconds(dip, 4096) == pytest.approx(1.6e-5)


def test_allreduce_prefers_the_measured_curve() -> None:
    """A placed group of 8 inside a node: the probe's curve when there is one, else the ring
    on the NVLink at NCCL's achieved busbw (0.77 of 300 GB/s); one rank costs nothing."""
    group = GroupTopology(8, 8, 1, NVLINK, None)
    assert allreduce_seconds(2**20, group, CURVE) == pytest.approx(1e-4)
    assert allreduce_seconds(2**20, group, None) == ring_allreduce_seconds(2**20, 8, collective_link(NVLINK))
    assert collective_link(NVLINK).bandwidth_bytes_per_s == pytest.approx(0.77 * 300e9)
    assert allreduce_seconds(2**20, GroupTopology(1, 1, 1, None, None), CURVE) == 0.0


# --- properties ------------------------------------------------------------------------

links = st.builds(
    Link,
    kind=st.just("nvlink"),
    scope=st.just("intra_node"),
    bandwidth_bytes_per_s=st.floats(1e6, 1e13),
    latency_seconds=st.floats(1e-7, 1e-3),
)
sizes = st.floats(0, 1e12)


@given(link=links, size=sizes, extra=st.floats(1, 1e12), n=st.integers(2, 4096))
def test_allreduce_grows_with_message_size(link: Link, size: float, extra: float, n: int) -> None:
    assert ring_allreduce_seconds(size + extra, n, link) > ring_allreduce_seconds(size, n, link)


@given(link=links, size=sizes)
def test_allreduce_is_zero_for_one_rank(link: Link, size: float) -> None:
    assert ring_allreduce_seconds(size, 1, link) == 0.0


@given(link=links, size=sizes, n=st.integers(2, 4096), extra=st.floats(1e-7, 1e-3))
def test_allreduce_grows_with_latency(link: Link, size: float, n: int, extra: float) -> None:
    slower = Link(link.kind, link.scope, link.bandwidth_bytes_per_s, link.latency_seconds + extra)
    assert ring_allreduce_seconds(size, n, slower) > ring_allreduce_seconds(size, n, link)


@given(link=links, size=sizes, n=st.integers(2, 4096))
def test_allreduce_is_two_allgathers(link: Link, size: float, n: int) -> None:
    """Ring all-reduce = reduce-scatter + all-gather, each (n-1) steps of S/n."""
    assert ring_allreduce_seconds(size, n, link) == pytest.approx(
        2 * ring_allgather_seconds(size, n, link)
    )


@given(size=st.integers(1, 2**34), extra=st.integers(1, 2**30))
def test_curve_never_decreases_with_size(size: int, extra: int) -> None:
    assert curve_seconds(CURVE, size + extra) >= curve_seconds(CURVE, size)


def test_a_dip_at_the_end_of_the_sweep_does_not_make_bytes_free() -> None:
    """A CPU probe's all-to-all ended 3.102 then 2.807 ms (1 and 2 MiB after 1.6 ms at 512 KiB):
    the last segment's slope is negative, and continuing it at 0 priced 1 GiB at 2.807 ms. The
    slope over the top sizes (within 16x of 2 MiB: 512 KiB, 1 MiB, 2 MiB) is the least-squares
    one: sizes 0.5, 1, 2 MiB (mean 7/6 MiB), times 1.6, 3.102, 2.807 ms (mean 2.503); it is
    positive, so 1 GiB costs 2.807 ms + slope * (1 GiB - 2 MiB)."""
    sizes = [2**19, 2**20, 2**21]
    dip = AllreduceCurve(link="intra_node", num_ranks=2, sizes_bytes=[2**10, *sizes],
                         median_seconds=[1e-4, 1.6e-3, 3.102e-3, 2.807e-3])
    times = [1.6e-3, 3.102e-3, 2.807e-3]
    mean_s, mean_t = sum(sizes) / 3, sum(times) / 3
    slope = (sum((s - mean_s) * (t - mean_t) for s, t in zip(sizes, times, strict=True))
             / sum((s - mean_s) ** 2 for s in sizes))
    assert slope > 0
    assert curve_seconds(dip, 2**30) == pytest.approx(2.807e-3 + slope * (2**30 - 2**21))
    assert curve_seconds(dip, 2**30) > 0.5  # not 2.8 ms: about 1 GB/s, as measured
    # the top points all falling: the chord from the smallest size, (2.807e-3 - 1e-4) / (2**21 - 2**10)
    falling = AllreduceCurve(link="intra_node", num_ranks=2, sizes_bytes=[2**10, 2**20, 2**21],
                             median_seconds=[1e-4, 3.102e-3, 2.807e-3])
    chord = (2.807e-3 - 1e-4) / (2**21 - 2**10)
    assert curve_seconds(falling, 2**22) == pytest.approx(2.807e-3 + chord * 2**21)


def test_a_pipeline_send_costs_the_probes_own_send_recv_fit() -> None:
    """A probe fits send/recv on its own (71.26 us, 3.502 GB/s on a gloo loopback) beside the
    all-reduce's link figures (418.1 us a step, 1.518 GB/s): a 1 MiB pipeline send costs
    71.26e-6 + 2**20 / 3.502e9 = 0.3707 ms, not 418.1e-6 + 2**20 / 1.518e9 = 1.109 ms (a read).
    Without a send/recv fit the link's figures stay."""
    from planner.layout import Link

    plain = Link("pcie", "intra_node", 1.518e9, 418.1e-6, measured=True)
    fitted = Link("pcie", "intra_node", 1.518e9, 418.1e-6, measured=True,
                  p2p_bandwidth_bytes_per_s=3.502e9, p2p_latency_seconds=71.26e-6)
    assert p2p_seconds(2**20, fitted) == pytest.approx(71.26e-6 + 2**20 / 3.502e9)
    assert p2p_seconds(2**20, fitted) * 1e3 == pytest.approx(0.3707, abs=1e-4)
    assert p2p_seconds(2**20, plain) == pytest.approx(418.1e-6 + 2**20 / 1.518e9)


def test_the_probe_writes_its_send_recv_fit_per_link() -> None:
    """intra_node: the fit as measured; inter_node measured one rank per node: that rank's rate
    shared by the node's local ranks (8 here), which send together at a pipeline boundary; a fit
    that resolved no bandwidth writes nothing."""
    from planner.probe.fit import AlphaBetaFit
    from planner.probe.profile import p2p_fields

    fits = {"intra_node_send_recv": (2, AlphaBetaFit(71.26e-6, 3.502e9, 10, 0.1)),
            "inter_node_send_recv_one_rank_per_node": (2, AlphaBetaFit(20e-6, 40e9, 10, 0.1)),
            "world_send_recv": (2, AlphaBetaFit(20e-6, None, 10, 0.1))}
    assert p2p_fields(fits, "intra_node", "", "p2p_bandwidth_gb_per_s") == {
        "p2p_bandwidth_gb_per_s": 3.502, "p2p_latency_us": 71.26}
    assert p2p_fields(fits, "inter_node", "_one_rank_per_node", "p2p_bandwidth_gb_per_s_per_gpu", 8) == {
        "p2p_bandwidth_gb_per_s_per_gpu": 5.0, "p2p_latency_us": 20.0}
    assert p2p_fields(fits, "world", "", "p2p_bandwidth_gb_per_s") == {}
    assert p2p_fields(fits, "inter_node", "", "p2p_bandwidth_gb_per_s_per_gpu") == {}
