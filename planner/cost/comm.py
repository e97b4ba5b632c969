"""Collective and point-to-point communication time (alpha-beta model).

Legend: S message bytes (the full buffer each rank contributes), n ranks in the
group, alpha per-step latency (s), beta per-GPU link bandwidth one direction
(bytes/s) of the slowest link the ring crosses. Conventions: nccl-tests
doc/PERFORMANCE.md (busbw factors); docs/cost-model.md#collectives-alpha-beta-ring-busbw.
"""

from __future__ import annotations

import bisect
import math

from planner.cost.efficiency import (
    ALLTOALL_FIXED_SECONDS,
    DEEPEP_NVLINK_UTILIZATION,
    DEEPEP_RDMA_UTILIZATION,
    NCCL_BUSBW_FRACTION_OF_LINK,
)
from planner.layout import GroupTopology, Link
from planner.specs import AllreduceCurve

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, SEND_RECV = "all_reduce", "all_gather", "reduce_scatter", "send_recv"


def ring_coefficients(collective: str, num_ranks: int) -> tuple[float, float]:
    """(latency steps, volume factor) of a ring collective over n ranks, so that
    T = steps * alpha + factor * S / beta; the factor is also nccl-tests' busbw factor
    (doc/PERFORMANCE.md): all-reduce 2(n-1) and 2(n-1)/n, all-gather and reduce-scatter
    (n-1) and (n-1)/n, send/recv 1 and 1."""
    n = num_ranks
    if collective == ALL_REDUCE:
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if collective in (ALL_GATHER, REDUCE_SCATTER):
        return float(n - 1), (n - 1) / n
    if collective == SEND_RECV:
        return 1.0, 1.0
    raise ValueError(f"unknown collective {collective!r}")


def _ring_seconds(collective: str, message_bytes: float, num_ranks: int, link: Link | None) -> float:
    if num_ranks <= 1 or link is None:
        return 0.0
    steps, factor = ring_coefficients(collective, num_ranks)
    return steps * link.latency_seconds + factor * message_bytes / link.bandwidth_bytes_per_s


def ring_allreduce_seconds(message_bytes: float, num_ranks: int, link: Link | None) -> float:
    """T(S, n) = 2(n-1)*alpha + 2(n-1)/n * S/beta; 0 for one rank (nothing to combine)."""
    return _ring_seconds(ALL_REDUCE, message_bytes, num_ranks, link)


def ring_allgather_seconds(message_bytes: float, num_ranks: int, link: Link | None) -> float:
    """All-gather (or reduce-scatter) of an S-byte result: (n-1)*alpha + (n-1)/n * S/beta."""
    return _ring_seconds(ALL_GATHER, message_bytes, num_ranks, link)


def p2p_seconds(message_bytes: float, link: Link | None) -> float:
    """Send/recv of S bytes: alpha + S/beta (busbw factor 1), at the probe's own send/recv fit
    where the profile has one (Link.p2p_*; a gloo loopback measured 71 us and 3.5 GB/s for
    send/recv beside the all-reduce's 418 us a step and 1.5 GB/s), else the link's figures."""
    if link is None:
        return 0.0
    if link.has_p2p_fit:
        return link.p2p_latency_seconds + message_bytes / link.p2p_bandwidth_bytes_per_s
    return link.latency_seconds + message_bytes / link.bandwidth_bytes_per_s


EXTRAPOLATION_SIZE_RATIO = 16
"""Above the sweep a curve continues at the seconds per byte fitted over its largest sizes,
those within this ratio of the largest (at least the last two points)."""


def extrapolation_seconds_per_byte(curve: AllreduceCurve) -> float:
    """The seconds per byte a measured curve continues at above its sweep: the least-squares
    slope over its points within EXTRAPOLATION_SIZE_RATIO of the largest size (the last two at least),
    so that one noisy point does not set it; where that is not positive (the last points dip: a
    CPU probe measured 3.10 then 2.81 ms, which the last segment's slope would have continued as
    free bytes, 2.81 ms for 1 GiB), the chord from the smallest to the largest size."""
    sizes, times = curve.sizes_bytes, curve.median_seconds
    top = [i for i, size in enumerate(sizes) if size * EXTRAPOLATION_SIZE_RATIO >= sizes[-1]]
    top = top if len(top) >= 2 else [len(sizes) - 2, len(sizes) - 1]
    mean_size = sum(sizes[i] for i in top) / len(top)
    mean_time = sum(times[i] for i in top) / len(top)
    spread = sum((sizes[i] - mean_size) ** 2 for i in top)
    slope = sum((sizes[i] - mean_size) * (times[i] - mean_time) for i in top) / spread
    if slope > 0:
        return slope
    return max(0.0, (times[-1] - times[0]) / (sizes[-1] - sizes[0]))


def curve_seconds(curve: AllreduceCurve, message_bytes: float) -> float:
    """A measured all-reduce time at this exact size: log-log interpolation between the
    probe's medians (at least two: specs._Curve); below the sweep the smallest time (latency
    floor), above it linear at extrapolation_seconds_per_byte."""
    sizes, times = curve.sizes_bytes, curve.median_seconds
    if message_bytes <= sizes[0]:
        return times[0]
    if message_bytes >= sizes[-1]:
        return times[-1] + extrapolation_seconds_per_byte(curve) * (message_bytes - sizes[-1])
    i = bisect.bisect_right(sizes, message_bytes)
    x0, x1 = math.log(sizes[i - 1]), math.log(sizes[i])
    y0, y1 = math.log(times[i - 1]), math.log(times[i])
    weight = (math.log(message_bytes) - x0) / (x1 - x0)
    return math.exp(y0 + weight * (y1 - y0))


def collective_link(link: Link | None) -> Link | None:
    """A datasheet link at the bus bandwidth NCCL actually reaches on it (about 77%);
    a probe-measured link is already that, and stays as it is."""
    if link is None or link.measured:
        return link
    return Link(link.kind, link.scope, link.bandwidth_bytes_per_s * NCCL_BUSBW_FRACTION_OF_LINK,
                link.latency_seconds, host_staged=link.host_staged)


def group_allreduce_seconds(message_bytes: float, group: GroupTopology | None,
                            hierarchical: bool = True) -> float:
    """All-reduce of S bytes over a placed group with the alpha-beta ring model. Inside one
    node: a ring on the intra-node link. Spanning N nodes with g ranks in each: the
    hierarchical all-reduce NCCL's rail-aligned rings amount to,

        T = 2 * RS(S, g, intra) + AR(S/g, N, nic share)
          = 2(g-1)/g * S/B_intra + 2(N-1)/N * (S/g)/B_nic + latencies

    reduce-scatter inside the node, each GPU all-reduces its S/g shard over a ring of the N
    nodes on its own share of the node's NICs (every GPU of a node crosses at once, so
    1/gpus_per_node each), all-gather inside the node. Source: nccl-tests
    doc/PERFORMANCE.md (ring bus bandwidth); the two-level decomposition is Jia et al. 2018
    (hierarchical all-reduce), NCCL's multi-rail rings cross each node's NICs once per
    shard. Assumption: the phases do not overlap (conservative); `plan probe`'s measured
    curve replaces this when present. `hierarchical` False: the older flat ring of all
    n ranks at the NIC share, 2(n-1)/n * S/B_nic (serving still prices it so; its tests pin it)."""
    if group is None or group.num_ranks <= 1:
        return 0.0
    if not hierarchical and group.inter is not None:
        return ring_allreduce_seconds(message_bytes, group.num_ranks, group.inter)
    if group.inter is None:
        return ring_allreduce_seconds(message_bytes, group.num_ranks, group.intra)
    g = group.ranks_per_node
    in_node = 2 * ring_allgather_seconds(message_bytes, g, group.intra)
    return in_node + ring_allreduce_seconds(message_bytes / g, group.num_nodes, group.inter)


def group_allgather_seconds(message_bytes: float, group: GroupTopology | None) -> float:
    """All-gather (or reduce-scatter) of an S-byte result over a placed group. Inside one node
    a ring on the intra-node link. Spanning N nodes with g ranks in each, the two levels
    NCCL's rail-aligned rings amount to: each GPU's S/g share crosses a ring of the N nodes on
    its own NIC share, the node's g ranks meet over NVLink,

        T = (g-1)/g * S/B_intra + (N-1)/N * (S/g)/B_nic + latencies

    (a reduce-scatter runs the same two phases in the other order). A flat ring of all g*N
    ranks at the NIC share would take (gN-1)/(gN) * S/B_nic: g times longer across nodes.
    Sources as group_allreduce_seconds; the phases do not overlap (conservative)."""
    if group is None or group.num_ranks <= 1:
        return 0.0
    if group.inter is None:
        return ring_allgather_seconds(message_bytes, group.num_ranks, group.intra)
    g = group.ranks_per_node
    return (ring_allgather_seconds(message_bytes, g, group.intra)
            + ring_allgather_seconds(message_bytes / g, group.num_nodes, group.inter))


def effective_group(group: GroupTopology | None) -> GroupTopology | None:
    """The group with datasheet links derated to NCCL's achieved bus bandwidth."""
    if group is None:
        return None
    return GroupTopology(group.num_ranks, group.ranks_per_node, group.num_nodes,
                         collective_link(group.intra), collective_link(group.inter))


def allreduce_seconds(message_bytes: float, group: GroupTopology | None,
                      curve: AllreduceCurve | None, hierarchical: bool = False) -> float:
    """One all-reduce over a placed group: the probe's measured curve at this exact size when
    it measured this link at this group size, else the ring model on the group's links at
    NCCL's achieved bus bandwidth. 0 for one rank."""
    if group is None or group.num_ranks <= 1:
        return 0.0
    if curve is not None:
        return curve_seconds(curve, message_bytes)
    return group_allreduce_seconds(message_bytes, effective_group(group), hierarchical)


def allgather_seconds(message_bytes: float, group: GroupTopology | None,
                      curve: AllreduceCurve | None) -> float:
    """One all-gather (or reduce-scatter) of an S-byte buffer over a placed group: the probe's
    measured curve at this size when it measured this collective on this link at this group
    size, else group_allgather_seconds on the group's links at NCCL's achieved bus bandwidth.
    0 for one rank."""
    if group is None or group.num_ranks <= 1:
        return 0.0
    if curve is not None:
        return curve_seconds(curve, message_bytes)
    return group_allgather_seconds(message_bytes, effective_group(group))


def group_alltoall_seconds(message_bytes: float, group: GroupTopology | None) -> float:
    """All-to-all where each of n ranks sends S bytes in total (S/n to every rank, itself
    included), over a group of g ranks per node on N nodes:

        T = (g-1)*alpha_intra + (N-1)*alpha_inter
            + max((g-1)/n * S / B_intra, (n-g)/n * S / B_nic)

    Inside one node (N = 1) that is nccl-tests' alltoall, busbw factor (n-1)/n
    (doc/PERFORMANCE.md). Across nodes every GPU of a node sends its off-node share at once
    on its 1/gpus_per_node share of the NICs while the on-node share goes over NVLink in
    parallel; one latency per peer inside the node and one per peer node (NCCL groups the
    sends to a node's GPUs on the same rail). docs/cost-model.md (Expert parallelism:
    all-to-all). 0 for one rank."""
    if group is None or group.num_ranks <= 1:
        return 0.0
    n, g = group.num_ranks, group.ranks_per_node
    seconds = 0.0
    intra_seconds = inter_seconds = 0.0
    if group.intra is not None and g > 1:
        seconds += (g - 1) * group.intra.latency_seconds
        intra_seconds = (g - 1) / n * message_bytes / group.intra.bandwidth_bytes_per_s
    if group.inter is not None and group.num_nodes > 1:
        seconds += (group.num_nodes - 1) * group.inter.latency_seconds
        inter_seconds = (n - g) / n * message_bytes / group.inter.bandwidth_bytes_per_s
    return seconds + max(intra_seconds, inter_seconds)


def alltoall_seconds(message_bytes: float, group: GroupTopology | None,
                     curve: AllreduceCurve | None) -> float:
    """One all-to-all over a placed group (S bytes sent per rank): the probe's measured curve
    at this size when it measured this link at this group size, else
    group_alltoall_seconds on the links at NCCL's achieved bus bandwidth plus the
    dispatch/combine kernel's fixed cost (efficiency.ALLTOALL_FIXED_SECONDS, fitted on
    DeepEP's measured floor). 0 for one rank."""
    if group is None or group.num_ranks <= 1:
        return 0.0
    if curve is not None:
        return curve_seconds(curve, message_bytes)
    return ALLTOALL_FIXED_SECONDS + group_alltoall_seconds(message_bytes, effective_group(group))


def deepep_seconds(nvlink_bytes: float, rdma_bytes: float, group: GroupTopology | None,
                   fixed_seconds: float) -> float:
    """One DeepEP dispatch or combine: its fixed cost (efficiency.deepep_fixed_seconds) plus
    the slower of its NVLink and RDMA traffic (moe.deepep_traffic), which run at once, each at
    DeepEP's measured share of the link's datasheet bandwidth (DEEPEP_NVLINK_UTILIZATION,
    DEEPEP_RDMA_UTILIZATION; the RDMA link is the GPU's share of its node's NICs). DeepEP's
    kernels, not NCCL's: no bus-bandwidth derating, no per-peer latencies. 0 for one rank.
    docs/cost-model.md (Expert parallelism: DeepEP)."""
    if group is None or group.num_ranks <= 1:
        return 0.0
    nvlink = (nvlink_bytes / (group.intra.bandwidth_bytes_per_s * DEEPEP_NVLINK_UTILIZATION)
              if group.intra is not None and nvlink_bytes > 0 else 0.0)
    rdma = (rdma_bytes / (group.inter.bandwidth_bytes_per_s * DEEPEP_RDMA_UTILIZATION)
            if group.inter is not None and rdma_bytes > 0 else 0.0)
    return fixed_seconds + max(nvlink, rdma)
