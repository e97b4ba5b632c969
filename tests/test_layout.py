"""Layouts: factorizations of the world size and where groups land on nodes.

Rank order DP x PP x TP, TP innermost: rank r = (dp_index * pp + stage) * tp + tp_rank,
node = r // gpus_per_node.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.catalog import resolve_cluster
from planner.layout import (
    Layout,
    divisors,
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
