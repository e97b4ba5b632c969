"""The probe's timing arithmetic with a fake clock (no torch, no GPU)."""

import pytest

from planner.probe import timing


class FakeClock:
    """A host clock that each op and each device wait advance by a fixed amount."""

    def __init__(self):
        self.now_seconds = 0.0

    def __call__(self):
        return self.now_seconds

    def advance(self, seconds):
        self.now_seconds += seconds


def test_host_repeats_divide_each_repeat_by_its_iterations():
    clock = FakeClock()
    seconds = timing.host_repeats(
        step=lambda: clock.advance(2e-6),  # 2 us to launch and run an op
        sync=lambda: clock.advance(1.0),  # barriers lie outside the timed window
        wait_for_device=lambda: clock.advance(10e-6),  # the synchronize round trip
        clock=clock,
        iterations=5,
        repeats=3,
    )
    # (5 x 2 us + 10 us) / 5 = 4 us per op: the host figure includes the round trip
    assert seconds == pytest.approx([4e-6] * 3)


def test_event_milliseconds_become_seconds_per_op():
    # 5 ops in 0.1 ms: 20 us each
    assert timing.seconds_per_op_from_event_ms(0.1, 5) == pytest.approx(20e-6)


def test_busy_wait_covers_the_launches_and_at_least_a_millisecond():
    # 1.98 GHz SM clock: 1 ms floor = 1.98e6 cycles; 200 ops x 20 us = 4 ms = 7.92e6 cycles
    assert timing.busy_wait_cycles(5, 1.98e9) == 1_980_000
    assert timing.busy_wait_cycles(200, 1.98e9) == 7_920_000
    assert timing.busy_wait_cycles(5, 0) == 2_500_000  # no clock reported: 2.5 GHz assumed


def test_slowest_rank_per_repeat_then_median():
    by_rank = [
        [1.0, 5.0, 2.0],  # rank 0: one slow repeat
        [2.0, 1.0, 3.0],  # rank 1
    ]
    assert timing.slowest_rank_per_repeat(by_rank) == [2.0, 5.0, 3.0]
    assert timing.median_of_slowest(by_rank) == 3.0  # not the median of all times (2.0)


def test_host_overhead_fraction():
    assert timing.host_overhead_fraction(12e-6, 10e-6) == pytest.approx(0.2)


def test_a_cuda_point_keeps_the_host_clock_as_a_cross_check():
    from planner.probe import results

    def row(rank, events, host):
        return dict(
            phase=0,
            group=0,
            size_bytes=1024,
            rank=rank,
            repeat_seconds=events,
            host_repeat_seconds=host,
        )

    raw = dict(
        phases=[dict(op="all_reduce", link="intra_node", mode="all_local_ranks", groups=[[0, 1]])],
        rows=[
            row(0, [1e-5, 3e-5, 2e-5], [4e-5, 4e-5, 4e-5]),
            row(1, [2e-5, 1e-5, 2e-5], [5e-5, 3e-5, 6e-5]),
        ],
    )
    (point,) = results.summarize_rows(raw)
    assert point.median_seconds == pytest.approx(2e-5)  # slowest per repeat: 2, 3, 2 (x 1e-5)
    assert point.host_median_seconds == pytest.approx(5e-5)  # slowest per repeat: 5, 4, 6


def test_nccl_times_out_well_inside_the_run():
    assert timing.collective_timeout_seconds(600) == 300
    assert timing.collective_timeout_seconds(12) == 10  # at least 10 s
    assert timing.collective_timeout_seconds(5) == 5  # never past the run's own deadline


def test_more_ranks_than_visible_gpus_is_refused_before_launch():
    from planner.probe.checks import check_gpu_count
    from planner.probe.runner import ProbeError

    with pytest.raises(ProbeError, match=r"--nproc-per-node 9 exceeds the 8 visible GPUs"):
        check_gpu_count(9, 8, on_gpu=True)
    check_gpu_count(8, 8, on_gpu=True)
    check_gpu_count(4, 0, on_gpu=False)  # CPU ranks are not GPUs
    check_gpu_count(None, 8, on_gpu=True)  # default: one rank per visible GPU
