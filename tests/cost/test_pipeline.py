"""Pipeline bubble: idle fraction of the step vs bubble over ideal compute, worked by hand.

Idle fraction (p-1)/(v*m + p-1); over compute (p-1)/(v*m) (Narayanan et al. 2021 sec. 2.2).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.cost.pipeline import (
    bubble_fraction,
    bubble_over_compute_ratio,
    pipeline_time_units,
    serving_stage_utilization,
)


def test_four_stages_one_micro_batch() -> None:
    """4 stages, 1 micro-batch: the step takes m + p - 1 = 4 units, each stage busy 1:
    idle 3/4 = 0.75; bubble over compute (p-1)/m = 3."""
    assert pipeline_time_units(4, 1) == 4
    assert bubble_fraction(4, 1) == pytest.approx(0.75)
    assert bubble_over_compute_ratio(4, 1) == pytest.approx(3.0)


def test_four_stages_four_micro_batches() -> None:
    """4 stages, 4 micro-batches: 4 + 4 - 1 = 7 units, each stage busy 4: idle 3/7;
    over compute 3/4."""
    assert pipeline_time_units(4, 4) == 7
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert bubble_over_compute_ratio(4, 4) == pytest.approx(0.75)


def test_interleaved_divides_the_bubble_by_v() -> None:
    """p=8, m=16, v=2: idle 7/(32+7) = 7/39; over compute 7/32 (half of v=1's 7/16)."""
    assert bubble_fraction(8, 16, 2) == pytest.approx(7 / 39)
    assert bubble_over_compute_ratio(8, 16, 2) == pytest.approx(7 / 32)
    assert bubble_over_compute_ratio(8, 16, 1) == pytest.approx(7 / 16)


def test_one_stage_has_no_bubble() -> None:
    assert bubble_fraction(1, 1) == 0.0
    assert bubble_over_compute_ratio(1, 5) == 0.0


@given(p=st.integers(1, 512), m=st.integers(1, 100_000), v=st.integers(1, 16))
def test_two_bubble_quantities_are_consistent(p: int, m: int, v: int) -> None:
    """fraction = r / (1 + r) where r is the bubble over compute."""
    r = bubble_over_compute_ratio(p, m, v)
    assert bubble_fraction(p, m, v) == pytest.approx(r / (1 + r))


@given(p=st.integers(1, 512), m=st.integers(1, 100_000), v=st.integers(1, 16))
def test_bubble_fraction_in_unit_interval(p: int, m: int, v: int) -> None:
    assert 0.0 <= bubble_fraction(p, m, v) < 1.0


@given(p=st.integers(2, 512), m=st.integers(1, 100_000), more=st.integers(1, 1000))
def test_bubble_shrinks_with_more_micro_batches(p: int, m: int, more: int) -> None:
    assert bubble_fraction(p, m + more) < bubble_fraction(p, m)
    assert bubble_over_compute_ratio(p, m + more) < bubble_over_compute_ratio(p, m)


def test_serving_stage_utilization() -> None:
    """p=4 stages with 2 batches in flight: each stage idles half the time; 8 in flight: full."""
    assert serving_stage_utilization(2, 4) == pytest.approx(0.5)
    assert serving_stage_utilization(8, 4) == 1.0
