"""Layouts: factorizations of the world size and where groups land on nodes.

Rank order DP x PP x TP, TP innermost: rank r = (dp_index * pp + stage) * tp + tp_rank,
node = r // gpus_per_node.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import explain
from planner.catalog import resolve_cluster
from planner.layout import (
    Layout,
    divisors,
    dp_group_topology,
    factorizations,
    groups_cross_nodes,
    num_boundaries_crossing_nodes,
    place,
)


def _num_ordered_triples(n: int) -> int:
    return sum(1 for tp, pp in itertools.product(range(1, n + 1), repeat=2) if n % (tp * pp) == 0)


def test_factorizations_of_16() -> None:
    """16 = 2**4: ordered triples of exponents summing to 4 number C(4+2, 2) = 15."""
    layouts = factorizations(16)
    assert len(layouts) == 15
    assert len(set(layouts)) == 15
    assert (
        Layout(16, 1, 1) in layouts and Layout(1, 1, 16) in layouts and Layout(2, 4, 2) in layouts
    )


def test_factorizations_of_one() -> None:
    assert factorizations(1) == [Layout(1, 1, 1)]


@given(n=st.integers(1, 4096))
def test_factorizations_multiply_to_world_size(n: int) -> None:
    layouts = factorizations(n)
    assert all(layout.tp * layout.pp * layout.dp == n == layout.num_gpus for layout in layouts)
    assert len(set(layouts)) == len(layouts)


@given(n=st.integers(1, 200))
def test_factorizations_count_every_ordered_triple(n: int) -> None:
    assert len(factorizations(n)) == _num_ordered_triples(n)


@given(n=st.integers(1, 100_000))
def test_divisors(n: int) -> None:
    found = divisors(n)
    assert found == sorted(found) and all(n % d == 0 for d in found)
    assert found[0] == 1 and found[-1] == n


@pytest.mark.parametrize(
    ("group_size", "gpus_per_node", "crosses"),
    [
        (1, 8, False),
        (4, 8, False),
        (8, 8, False),
        (16, 8, True),  # one group spans two nodes
        (3, 8, True),  # group 2 is ranks 6, 7, 8: node 0 and node 1
        (6, 4, True),  # group 0 is ranks 0-5
        (2, 4, False),
    ],
)
def test_groups_cross_nodes(group_size: int, gpus_per_node: int, crosses: bool) -> None:
    assert groups_cross_nodes(group_size, gpus_per_node) is crosses


@pytest.mark.parametrize(
    ("layout", "gpus_per_node", "expected"),
    [
        # stages start at ranks 0, 2, 4, 6: all on node 0
        (Layout(tp=2, pp=4, dp=2), 8, 0),
        # stages start at ranks 0, 4, 8, 12: only the 4 -> 8 boundary changes node
        (Layout(tp=4, pp=4, dp=1), 8, 1),
        # each stage fills a node: all 3 boundaries cross
        (Layout(tp=8, pp=4, dp=1), 8, 3),
        (Layout(tp=1, pp=1, dp=16), 8, 0),
    ],
)
def test_num_boundaries_crossing_nodes(layout: Layout, gpus_per_node: int, expected: int) -> None:
    assert num_boundaries_crossing_nodes(layout, gpus_per_node) == expected


def test_place_on_two_nodes() -> None:
    """2x8xA100, tp=8 pp=2: TP on NVLink, the one pipeline boundary (rank 0 -> rank 8)
    crosses to node 1 over InfiniBand."""
    placement = place(resolve_cluster("2x8xA100"), Layout(tp=8, pp=2, dp=1))
    assert not placement.tp_crosses_node
    assert placement.tp_link.kind == "nvlink"
    assert placement.num_pp_boundaries_crossing_nodes == 1
    assert placement.pp_link.kind == "infiniband"


def test_place_single_gpu_and_single_node() -> None:
    one = place(resolve_cluster("1x1xH100"), Layout(1, 1, 1))
    assert one.tp_link is None and one.pp_link is None
    node = place(resolve_cluster("1x8xH100"), Layout(tp=4, pp=2, dp=1))
    assert node.tp_link.scope == "intra_node" and node.pp_link.scope == "intra_node"
    assert node.num_pp_boundaries_crossing_nodes == 0


def test_layout_str() -> None:
    assert str(Layout(8, 2, 1)) == "tp=8 pp=2 dp=1"


@pytest.mark.parametrize(
    ("layout", "expected", "first_replica"),
    [
        # Megatron order, B = tp*cp*dp = 2*1*2 = 4: stages start at ranks 0, 4, 8, 12 on 8-GPU
        # nodes; replica 0 sends 0 -> 4 -> 8 -> 12, replica 1 2 -> 6 -> 10 -> 14: only the
        # middle send of each changes node, 2 in all (vLLM's order keeps a replica in one node)
        (Layout(tp=2, pp=4, dp=2), 2, 1),
        # B = 4*1*4 = 16 >= 8: every send leaves the node: 1 stage boundary x 4 replicas
        (Layout(tp=4, pp=2, dp=4), 4, 1),
        # B = 2*2*1 = 4, senders c = 0, 1 start at ranks 0 and 2: 0 -> 4 and 2 -> 6 stay on node 0
        (Layout(tp=2, pp=2, dp=1, cp=2), 0, 0),
        # B = 1*2*2 = 4, pp = 3: senders at ranks 0-3 send 0-3 -> 4-7 (node 0) and 4-7 -> 8-11
        # (node 1): 4 in all; the first replica's (rank 0 -> 4 -> 8) crosses once
        (Layout(tp=1, pp=3, dp=2, cp=2), 4, 1),
    ],
)
def test_boundaries_crossing_nodes_megatron_order(layout: Layout, expected: int, first_replica: int) -> None:
    """Megatron's tp-cp-ep-dp-pp order puts the stage outermost: a send jumps tp*cp*dp ranks.
    `expected` counts every replica's and CP rank's sends (the explain map), `first_replica`
    the first one's (what place() prices the link by)."""
    assert explain.boundaries_crossing_nodes(layout, 8, pp_outermost=True) == expected
    assert num_boundaries_crossing_nodes(layout, 8, pp_outermost=True) == first_replica


@given(tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2, 4]), pp=st.integers(1, 6),
       dp=st.integers(1, 6), gpn=st.sampled_from([4, 8]), pp_outermost=st.booleans())
def test_boundaries_crossing_nodes_counts_what_the_map_enumerates(tp, cp, pp, dp, gpn, pp_outermost) -> None:
    """The closed-form count equals walking every sender's send in the rank order."""
    layout = Layout(tp=tp, pp=pp, dp=dp, cp=cp if pp_outermost else 1)
    walked = 0
    for replica in range(layout.dp):
        for cp_rank in range(layout.cp):
            for stage in range(layout.pp - 1):
                a, b = explain._send_ranks(layout, replica, cp_rank, stage, pp_outermost)
                walked += a // gpn != b // gpn
    assert explain.boundaries_crossing_nodes(layout, gpn, pp_outermost) == walked


def test_placement_map_megatron_order_with_cp() -> None:
    """tp=2 cp=2 pp=2 dp=1 on one 8-GPU node, r = ((stage*dp + d)*cp + c)*tp + t: ranks 0-1 are
    s0 c0, 2-3 s0 c1, 4-5 s1 c0, 6-7 s1 c1; the sends are 0 -> 4 and 2 -> 6, both inside node 0."""
    cluster = resolve_cluster("1x8xH100")
    pm = explain.placement_map(cluster, Layout(tp=2, pp=2, dp=1, cp=2), pp_outermost=True)
    got = [(s.stage, s.cp_rank, s.tp_rank, s.dp_replica) for s in pm.slots]
    assert got == [(0, 0, 0, 0), (0, 0, 1, 0), (0, 1, 0, 0), (0, 1, 1, 0),
                   (1, 0, 0, 0), (1, 0, 1, 0), (1, 1, 0, 0), (1, 1, 1, 0)]
    assert [(b.cp_rank, b.from_stage, b.from_node, b.to_node) for b in pm.boundaries] == [(0, 0, 0, 0), (1, 0, 0, 0)]
    assert pm.num_boundaries == 2 and pm.num_boundaries_crossing_nodes == 0


def test_training_pipeline_link_in_megatron_order() -> None:
    """tp=2 pp=4 dp=4 on 4x8: vLLM's order would keep each replica's four stages in one node
    (ranks 0-7), Megatron's puts stage s on ranks [8s, 8s+8), one node each: the sends go over
    the NICs, and the DP group (ranks 0, 2, 4, 6) stays on NVLink."""
    cluster = resolve_cluster("4x8xH100")
    layout = Layout(tp=2, pp=4, dp=4)
    assert place(cluster, layout).pp_link.kind == "nvlink"
    assert place(cluster, layout, pp_outermost=True).pp_link.kind == "infiniband"
    group = dp_group_topology(cluster, layout)
    assert (group.ranks_per_node, group.num_nodes, group.intra.kind) == (4, 1, "nvlink")


def test_a_mesh_fabric_gives_a_group_only_its_peers_links():
    """MI300X nodes are a full mesh of Infinity Fabric links, 7 per GPU of 64 GB/s (the catalog's
    448 GB/s is their sum), no switch: a group of g of the node's 8 GPUs reaches g - 1 of them.
    TP 2 or a pipeline send: 448/7 = 64 GB/s; TP 4: 3 x 64 = 192 GB/s; TP 8: 448. A CP ring's
    hop is a send to one peer: 64 GB/s even at cp = 4. NVSwitch (H100) gives every group the
    GPU's 450 GB/s."""
    from planner.catalog import resolve_cluster
    from planner.layout import Layout, intra_node_link, place

    mi300x, h100 = resolve_cluster("1x8xMI300X"), resolve_cluster("1x8xH100")
    assert intra_node_link(mi300x, 2).bandwidth_bytes_per_s == pytest.approx(64e9)
    assert intra_node_link(mi300x, 4).bandwidth_bytes_per_s == pytest.approx(192e9)
    assert intra_node_link(mi300x, 8).bandwidth_bytes_per_s == pytest.approx(448e9)
    assert intra_node_link(mi300x).bandwidth_bytes_per_s == pytest.approx(448e9)
    assert intra_node_link(h100, 2).bandwidth_bytes_per_s == pytest.approx(450e9)
    tp4 = place(mi300x, Layout(4, 2, 1))
    assert tp4.tp_link.bandwidth_bytes_per_s == pytest.approx(192e9)
    assert tp4.pp_link.bandwidth_bytes_per_s == pytest.approx(64e9)
    ring = place(mi300x, Layout(2, 1, 1, cp=4), pp_outermost=True)
    assert ring.cp_group.intra.bandwidth_bytes_per_s == pytest.approx(192e9)  # the group's collectives
    assert ring.cp_link.bandwidth_bytes_per_s == pytest.approx(64e9)  # the ring's hop


def test_the_training_search_also_tries_the_widest_ep_group_the_experts_allow():
    """tp 1 over 256 data-parallel ranks, 8 GPUs a node, 128 experts: every replica's group
    (256) would leave GPUs without an expert, so the search tried only the node (8); with
    `widest` (training) also 128, one expert a GPU (GPT-OSS-120B on 32 B200 nodes: +44%).
    tp 2 x dp 96, 64 experts: 2 x 32 = 64 (32 divides 96). Where every replica's group fits
    the experts nothing is added."""
    from planner.layout import expert_parallel_degrees

    assert expert_parallel_degrees(1, 256, 8, 128) == [8]
    assert expert_parallel_degrees(1, 256, 8, 128, widest=True) == [8, 128]
    assert expert_parallel_degrees(2, 96, 8, 64, widest=True) == [2, 8, 64]
    assert expert_parallel_degrees(1, 64, 8, 128, widest=True) == expert_parallel_degrees(1, 64, 8, 128) == [8, 64]


def test_serving_ep_over_one_node_counts_the_replicas_a_node_holds():
    """vLLM's rank order puts a replica's stages in one node: at tp=1 pp=2 an 8-GPU node holds 4
    DP ranks of each stage, so the EP group over one node is 4 (training's Megatron order fills a
    node with one stage: 8). Qwen3-30B-A3B on 2x8 H100, 71/2,497 tokens: it was searched at
    ep = 8 only (both nodes), 8,204 tok/s per GPU against one node's 9,215; now 9,215 on both."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.layout import expert_parallel_degrees
    from planner.requests import ServeRequest
    from planner.serve_search import evaluate

    assert expert_parallel_degrees(1, 8, 8, 128, pp_in_node=2) == [4, 8]
    assert expert_parallel_degrees(1, 16, 8, 128, pp_in_node=2) == [4, 8, 16]
    assert expert_parallel_degrees(1, 8, 8, 128) == [8]
    request = ServeRequest(input_len=71, output_len=2497, mode="aggregated")
    per_gpu = {}
    for name in ("1x8xH100", "2x8xH100"):
        cluster = resolve_cluster(name)
        best = evaluate(resolve_model("qwen3-30b-a3b"), cluster, request).recommended
        per_gpu[name] = best.throughput_tokens_per_second / cluster.num_gpus
    assert per_gpu["2x8xH100"] >= 0.99 * per_gpu["1x8xH100"]
