"""The alpha-beta fit on synthetic sweeps with known alpha and beta (no torch)."""

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.probe.fit import exceeds_spec, fit_alpha_beta, slow_outliers
from planner.probe.sweep import (
    busbw_factor,
    op_coefficients,
    parse_collectives,
    size_sweep,
    summarize,
)

SIZES_BYTES = size_sweep(8, 256 * 2**20, 4)


def synthetic_seconds(op, num_ranks, alpha_seconds, bandwidth_bytes_per_s, noise_fraction, seed=0):
    """T = steps * alpha + factor * S / beta, times (1 + uniform noise)."""
    rng = random.Random(seed)
    steps, factor = op_coefficients(op, num_ranks)
    return [
        (steps * alpha_seconds + factor * s / bandwidth_bytes_per_s)
        * (1 + rng.uniform(-noise_fraction, noise_fraction))
        for s in SIZES_BYTES
    ]


@pytest.mark.parametrize(
    "op", ["all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all"]
)
@pytest.mark.parametrize("num_ranks", [2, 8])
def test_recovers_alpha_and_beta_within_5_percent(op, num_ranks):
    # NVLink-like: 6 us per step, 150 GB/s per rank; 2% multiplicative noise.
    seconds = synthetic_seconds(op, num_ranks, 6e-6, 150e9, 0.02)
    fit = fit_alpha_beta(op, num_ranks, SIZES_BYTES, seconds)
    assert fit.alpha_seconds == pytest.approx(6e-6, rel=0.05)
    assert fit.bandwidth_bytes_per_s == pytest.approx(150e9, rel=0.05)
    assert fit.rms_relative_residual < 0.03


@settings(max_examples=50, deadline=None)
@given(
    alpha_us=st.floats(0.5, 500.0),
    bandwidth_gb_per_s=st.floats(0.1, 1000.0),
    num_ranks=st.integers(2, 64),
)
def test_exact_data_is_recovered(alpha_us, bandwidth_gb_per_s, num_ranks):
    steps, factor = op_coefficients("all_reduce", num_ranks)
    transfer = factor * max(SIZES_BYTES) / (bandwidth_gb_per_s * 1e9)
    # a sweep whose largest transfer is under 2% of its time resolves no bandwidth (below)
    assume(transfer / (transfer + steps * alpha_us * 1e-6) >= 0.02)
    seconds = synthetic_seconds(
        "all_reduce", num_ranks, alpha_us * 1e-6, bandwidth_gb_per_s * 1e9, 0.0
    )
    fit = fit_alpha_beta("all_reduce", num_ranks, SIZES_BYTES, seconds)
    assert fit.alpha_seconds == pytest.approx(alpha_us * 1e-6, rel=1e-6)
    assert fit.bandwidth_bytes_per_s == pytest.approx(bandwidth_gb_per_s * 1e9, rel=1e-6)


def test_latency_only_sweep_has_no_bandwidth():
    fit = fit_alpha_beta("send_recv", 2, [8, 16, 32], [1e-5, 1e-5, 1e-5])
    assert fit.bandwidth_bytes_per_s is None
    assert fit.alpha_seconds == pytest.approx(1e-5)


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError):
        fit_alpha_beta("all_reduce", 2, [8, 8], [1e-5, 1e-5])


def test_busbw_factors_follow_nccl_tests():
    assert busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert busbw_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert busbw_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert busbw_factor("send_recv", 2) == 1.0
    assert busbw_factor("all_to_all", 4) == pytest.approx(3 / 4)


def test_all_to_all_model_by_hand():
    """n = 4 ranks, each sending S = 4e6 bytes in total (1e6 stays local), alpha 10 us,
    beta 50e9 bytes/s: T = 3 x 10 us + 3/4 x 4e6 / 50e9 s = 30 us + 60 us = 90 us;
    algbw = 4e6 / 90e-6 = 44.4 GB/s, busbw = 3/4 of it = 33.3 GB/s; the fit of two such
    points gives alpha and beta back."""
    assert op_coefficients("all_to_all", 4) == (3.0, 0.75)
    sizes_bytes = [1_000_000, 4_000_000]
    seconds = [30e-6 + 0.75 * s / 50e9 for s in sizes_bytes]  # 45 us, 90 us
    assert seconds[1] == pytest.approx(90e-6)
    summary = summarize("all_to_all", 4, 4_000_000, [90e-6])
    assert summary.algbw_bytes_per_s == pytest.approx(4e6 / 90e-6)
    assert summary.busbw_bytes_per_s == pytest.approx(0.75 * 4e6 / 90e-6)
    fit = fit_alpha_beta("all_to_all", 4, sizes_bytes, seconds)
    assert fit.alpha_seconds == pytest.approx(10e-6)
    assert fit.bandwidth_bytes_per_s == pytest.approx(50e9)


def test_collectives_parse_into_schedule_order():
    assert parse_collectives("all_to_all, all_reduce") == ("all_reduce", "all_to_all")
    for bad in ("all_reduce,alltoall", "", " , "):
        with pytest.raises(ValueError, match="choose from all_reduce"):
            parse_collectives(bad)
    # 1 MB all-reduce over 8 ranks in 10 us: algbw 100 GB/s, busbw 175 GB/s.
    summary = summarize("all_reduce", 8, 10**6, [1e-5, 2e-5, 1e-5])
    assert summary.algbw_bytes_per_s == pytest.approx(1e11)
    assert summary.busbw_bytes_per_s == pytest.approx(1.75e11)
    assert summary.spread_fraction == pytest.approx(1.0)


def test_size_sweep_ends_at_max():
    assert size_sweep(8, 100, 4) == [8, 32, 100]
    with pytest.raises(ValueError):
        size_sweep(64, 8, 4)


def test_slow_node_and_above_spec_are_flagged():
    assert slow_outliers({"node0": 100.0, "node1": 98.0, "node2": 40.0, "node3": 101.0}) == [
        "node2"
    ]
    assert slow_outliers({"pair0": 100.0, "pair1": 95.0}) == []
    assert exceeds_spec(482e9, 300e9)  # NVLS busbw above an NVLink-3 spec
    assert not exceeds_spec(235e9, 300e9)


def test_a_sweep_inside_the_latency_regime_resolves_no_bandwidth():
    """A gloo sweep to 512 B on a 1.5 GB/s link: 110 us a step, the largest message's transfer
    512 / 1.5e9 = 0.34 us (0.3% of the time, under the 2% a bandwidth needs) under 30% noise:
    its slope is noise, so no bandwidth (it had fitted 0.01 GB/s, and the plan priced TPOT 27.8 s
    on it; now the profile says the link is a lower bound). The same link swept to 8 MiB
    resolves 1.5 GB/s within the noise."""
    sizes = [8, 32, 128, 512]
    rng = random.Random(1)
    noisy = [(110e-6 + s / 1.5e9) * (1 + rng.uniform(-0.3, 0.3)) for s in sizes]
    assert fit_alpha_beta("send_recv", 2, sizes, noisy).bandwidth_bytes_per_s is None
    exact = [110e-6 + s / 1.5e9 for s in sizes]  # even noiseless, 0.3% is below the 2% resolved
    assert fit_alpha_beta("send_recv", 2, sizes, exact).bandwidth_bytes_per_s is None
    wide = [8 * 4**i for i in range(11)]  # to 8 MiB
    clean = [(110e-6 + s / 1.5e9) * (1 + rng.uniform(-0.02, 0.02)) for s in wide]
    assert fit_alpha_beta("send_recv", 2, wide, clean).bandwidth_bytes_per_s == pytest.approx(1.5e9, rel=0.1)


def test_a_group_left_in_the_latency_regime_is_not_called_slow():
    """Three pairs swept to 64 KiB at 100 us a step: 30 and 31 GB/s resolve, 34 GB/s's transfer
    falls under 2% of the time and resolves none. Counted as 0 it was named the slow pair (at 0%
    of its peers: a review); left out, no pair is slow."""
    from planner.probe.results import ResultRow, find_outliers, group_bandwidths

    sizes = [2**k for k in range(3, 17)]
    rows = [ResultRow("send_recv", "intra_node", "all_local_ranks", group, [2 * group, 2 * group + 1], size,
                      100e-6 + size / bandwidth, 0.0, 1.0, 1.0)
            for group, bandwidth in enumerate((3.0e10, 3.1e10, 3.4e10)) for size in sizes]
    series = ("send_recv", "intra_node", "all_local_ranks", 2)
    assert set(group_bandwidths(rows, series)) == {0, 1}
    assert find_outliers(rows, ["a"], [[0, 1, 2, 3, 4, 5]]) == []


def test_a_poor_send_fit_is_not_written_above_its_largest_message():
    """Sends flat at 35 us up to 128 KiB, then 1,832 us at 512 KiB and 2,009 us at 1 MiB (a gloo
    run of a critical read): the relative-error fit resolves a few GB/s and prices a 1 MiB send
    far below its 2,009 us. A poor fit's p2p bandwidth is the one that, beside the fitted latency
    (alpha = 34.2 us), gives the largest message its measured time: 1,048,576 B / (2,009 - 34.2) us
    = 0.531 GB/s (the message's own rate, 0.522, beside alpha had priced it 2,043 us), and a flag
    says so; a good fit is written as fitted."""
    from planner.probe.profile import p2p_fields
    from planner.probe.results import POOR_FIT_RELATIVE_RESIDUAL, ResultRow, fit_all

    times = {2**k: 35e-6 for k in range(3, 18)} | {2**19: 1832e-6, 2**20: 2009e-6}
    rows = [ResultRow("send_recv", "intra_node", "all_local_ranks", 0, [0, 1], size, seconds, 0.0, 1.0, 1.0)
            for size, seconds in sorted(times.items())]
    fits = fit_all(rows)
    _, fit = fits["intra_node_send_recv"]
    assert fit.rms_relative_residual > POOR_FIT_RELATIVE_RESIDUAL and fit.bandwidth_bytes_per_s > 1e9
    flags: list[str] = []
    fields = p2p_fields(fits, "intra_node", "", "p2p_bandwidth_gb_per_s", rows=rows, flags=flags)
    assert fit.alpha_seconds == pytest.approx(34.2e-6, rel=1e-3)
    assert fields["p2p_bandwidth_gb_per_s"] == pytest.approx(2**20 / (2009e-6 - fit.alpha_seconds) / 1e9, rel=1e-3)
    assert fields["p2p_bandwidth_gb_per_s"] == pytest.approx(0.531, rel=1e-3)
    written = fields["p2p_latency_us"] * 1e-6 + 2**20 / (fields["p2p_bandwidth_gb_per_s"] * 1e9)
    assert written == pytest.approx(2009e-6, rel=1e-3)  # the profile prices the message as measured
    assert flags and "gives its largest message (1,048,576 B) its measured time" in flags[0]
    clean = [ResultRow("send_recv", "intra_node", "all_local_ranks", 0, [0, 1], size, 20e-6 + size / 2e9,
                       0.0, 1.0, 1.0) for size in sorted(times)]
    good = p2p_fields(fit_all(clean), "intra_node", "", "p2p_bandwidth_gb_per_s", rows=clean, flags=flags)
    assert good["p2p_bandwidth_gb_per_s"] == pytest.approx(2.0, rel=0.05) and len(flags) == 1


def test_a_poor_all_reduce_fit_is_not_written_above_its_largest_message():
    """The send cap's counterpart for a link's all-reduce figure: flat at 40 us to 128 KiB, then
    3 ms at 1 MiB (a flat-then-jump curve of a review) fits far above the 1 MiB point's busbw; the
    link's bandwidth is the one that, beside the fitted latency (alpha = 19.6 us a step, 2 steps
    for 2 ranks), gives that point its 3 ms: 1,048,576 B / (3 ms - 2 x 19.6 us) = 0.354 GB/s (the
    busbw itself, 0.350, had priced it 3.04 ms); 2(n - 1) / n = 1 at n = 2."""
    from planner.probe.profile import _link_numbers
    from planner.probe.results import ResultRow, fit_all

    times = {2**k: 40e-6 for k in range(3, 18)} | {2**19: 2.6e-3, 2**20: 3e-3}
    rows = [ResultRow("all_reduce", "intra_node", "all_local_ranks", 0, [0, 1], size, seconds, 0.0,
                      size / seconds, size / seconds) for size, seconds in sorted(times.items())]
    (_, fit), = fit_all(rows).values()
    flags: list[str] = []
    bandwidth, _ = _link_numbers(fit, rows, ("all_reduce", "intra_node", "all_local_ranks"), flags, "intra_node")
    assert fit.alpha_seconds == pytest.approx(19.64e-6, rel=1e-3)
    assert bandwidth == pytest.approx(2**20 / (3e-3 - 2 * fit.alpha_seconds))
    assert bandwidth == pytest.approx(0.35416e9, rel=1e-4)
    assert fit.predict_seconds("all_reduce", 2, 2**20) < 3e-3  # the fit itself prices it too fast
    assert 2 * fit.alpha_seconds + 2**20 / bandwidth == pytest.approx(3e-3)
    assert fit.bandwidth_bytes_per_s > bandwidth
    assert flags[-1].startswith("intra_node all_reduce: poor fit; its bandwidth is the one that, beside the fitted "
                                "latency, gives its largest message")


def test_the_cap_stands_aside_where_the_latency_alone_is_longer():
    """capped_bandwidth: the beta with which steps alpha + factor S / beta equals the measured T.
    A 2-rank all-reduce (2 steps, factor 1) of 1 MiB in 3 ms beside alpha = 19.6 us: 1,048,576 B /
    (3 ms - 39.2 us) = 354.2 MB/s. Where the fitted latency alone takes longer than T (alpha = 2
    ms: 4 ms of steps), no bandwidth reproduces T: inf, no cap (factor S / T beside that alpha had
    priced the message over 2 T)."""
    import math

    from planner.probe.profile import capped_bandwidth

    assert capped_bandwidth("all_reduce", 2, 2**20, 3e-3, 19.6e-6) == pytest.approx(2**20 / (3e-3 - 39.2e-6))
    assert capped_bandwidth("all_reduce", 2, 2**20, 3e-3, 2e-3) == math.inf
    assert capped_bandwidth("send_recv", 2, 2**20, 2009e-6, 34.2e-6) == pytest.approx(2**20 / (2009e-6 - 34.2e-6))
