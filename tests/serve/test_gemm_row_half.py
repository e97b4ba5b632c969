"""The serving GEMMs' half-rate rows capped at the GPU's ridge (efficiency.gemm_row_half):
a skinny GEMM's padded rows never cost more than its weight read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.cost import efficiency as eff
from planner.cost.serving_time import decode_weight_bytes_read


def test_h20_ridge_by_hand():
    """H20: 148 TFLOP/s bf16 dense, no measured serving rate: R = 0.75 * 148e12 = 111e12;
    weights read at 0.76 * 4.0e12 = 3.04e12 B/s; b = 2 B per bf16 weight:
    M* = R b / (2 B) = 111e12 * 2 / (2 * 3.04e12) = 36.51 rows < 128: the cap binds."""
    rate, read = 0.75 * 148e12, 0.76 * 4.0e12
    assert eff.gemm_row_half(rate, 2.0, read) == pytest.approx(111e12 / 3.04e12, rel=1e-12)
    assert eff.gemm_row_half(rate, 2.0, read) == pytest.approx(36.513, rel=1e-4)


def test_h100_keeps_the_fitted_half():
    """H100: the measured 794 TFLOP/s bf16 over 0.76 * 3.35e12: M* = 794e12 / 2.546e12 =
    311.9 >= 128, so 128 stays; 4-bit weights (0.5 B) on the same 16-bit GEMMs (W4A16):
    M* = 794e12 * 0.5 / (2 * 2.546e12) = 77.97, which binds."""
    read = 0.76 * 3.35e12
    assert eff.gemm_row_half(794e12, 2.0, read) == 128
    assert eff.gemm_row_half(794e12, 0.5, read) == pytest.approx(77.97, rel=1e-3)


@given(rate=st.floats(1e12, 1e16), weight_bytes=st.floats(0.25, 4), read=st.floats(1e11, 1e14),
       rows=st.integers(1, 65536))
def test_padding_never_costs_more_than_one_weight_read_beyond_the_real_rows(rate, weight_bytes, read, rows):
    """u(M) = M/(M + h): compute = 2 N K (M + h) / R <= 2 N K M / R + N K b / B, the real
    rows at full rate plus one weight read, and h never exceeds the shared 128."""
    half = eff.gemm_row_half(rate, weight_bytes, read)
    assert 0 < half <= eff.GEMM_HALF_RATE_DIMENSION
    n_k = 1.0
    padded = 2 * n_k * (rows + half) / rate
    assert padded <= (2 * n_k * rows / rate + n_k * weight_bytes / read) * (1 + 1e-12)


def test_h20_batch1_decode_is_bound_by_the_weight_read(serve_one):
    """Llama-3.1-8B on one H20 at batch 1: the linear layers take about the weight read:
    compute = read * (1 + 36.5) / 36.5 / (u(N) u(K)) = read * 1.027 / ~0.95 (4096-wide GEMMs,
    u = 4096 / 4224 per side), 4-8% above the read, where the uncapped rule priced them at
    129 rows of compute, about 3.6x the read (20 ms per token against 7 ms now)."""
    result = serve_one("llama-3.1-8b", "1x1xH20", (1, 1, 1), batch=1, input_len=128, output_len=128,
                       max_model_len=4096)
    step = result.decode_steps[0]
    stage = result.stages[0]
    read_seconds = decode_weight_bytes_read(serve_model(), stage, result.layout, 1) / (
        4.0e12 * eff.DECODE_HBM_UTILIZATION)
    assert read_seconds * 1.0 <= step.gemm_seconds <= read_seconds * 1.10
    assert result.tpot_batch1_seconds < 0.010


def serve_model():
    from planner.catalog import resolve_model

    return resolve_model("llama-3.1-8b")



@pytest.mark.parametrize("name", ["llama-3.1-70b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b", "llama-3.1-8b-fp8"])
def test_the_dense_gemms_share_factors_into_rows_and_widths(name):
    """dense_gemm_shape_utilization = u(M) * W(model, t): every GEMM outside the fused-MoE op has
    the step's M rows, so sum F / sum (F / (u(M) u(N) u(K))) = u(M) sum F / sum (F / (u(N) u(K))),
    F = 2 M N K c (the factor W counted once per spec). Checked against the FLOP-weighted mean
    over the GEMMs themselves (the mixer's; a dense model's MLP too), t = 1-8, 1-8,192 rows."""
    from planner.catalog import resolve_model
    from planner.cost.serving_time import (
        dense_gemm_shape_utilization,
        flop_weighted_utilization,
        mixer_gemms,
        mlp_gemms,
    )
    from planner.layout import Layout

    model = resolve_model(name)
    for tp in (1, 2, 4, 8):
        layout = Layout(tp, 1, 1)
        for rows in (1, 7, 128, 1000, 8192):
            gemms = mixer_gemms(model, tp, rows) + ([] if model.is_moe else mlp_gemms(model, layout, rows))
            expected = flop_weighted_utilization(gemms, 200.0)
            assert dense_gemm_shape_utilization(model, layout, rows, 200.0) == pytest.approx(expected, rel=1e-12)


def test_a_fractional_mean_load_prices_the_gemms_between_whole_rows():
    """dense_gemm_shape_utilization takes a fractional M (a mean load) as it is: the GEMMs' time
    for x rows, proportional to x / u(x) = x + M_half, is linear, so 1.4 and 1.5 rows cost
    1.4 + h and 1.5 + h (h = 128: 129.4 and 129.5 units) where round(M) had priced 1.4 at
    1.4 (1 + 128) = 180.6 and 1.5 at 1.5 (2 + 128) / 2 = 97.5, a round shorter at the higher load."""
    from planner.catalog import resolve_model
    from planner.cost.serving_time import dense_gemm_shape_utilization
    from planner.layout import Layout

    model, layout = resolve_model("llama-3.1-8b"), Layout(1, 1, 1)
    width = dense_gemm_shape_utilization(model, layout, 1.0) * (1 + 128)  # W, at M = 1: u(1) = 1/129
    for rows, expected in ((1.4, 129.4), (1.5, 129.5), (2.5, 130.5), (3.0, 131.0)):
        assert rows / dense_gemm_shape_utilization(model, layout, rows) * width == pytest.approx(expected, rel=1e-12)


@given(low=st.floats(1.0, 300.0), step=st.floats(1e-6, 5.0))
def test_the_gemms_time_never_falls_as_the_rows_rise(low, step):
    """x / u(x) never falls as x rises, at fractional x too (what keeps a decode round monotone
    in its mean load, which E2E-limited searches bisect over)."""
    from planner.catalog import resolve_model
    from planner.cost.serving_time import dense_gemm_shape_utilization
    from planner.layout import Layout

    model, layout = resolve_model("qwen3-235b-a22b-fp8"), Layout(2, 1, 1)
    high = low + step
    assert high / dense_gemm_shape_utilization(model, layout, high) >= \
        low / dense_gemm_shape_utilization(model, layout, low) * (1 - 1e-12)
