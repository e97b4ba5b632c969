"""Latency-bandwidth (alpha-beta) fits of measured sweeps, and outlier flags.

Pure python (no torch, no numpy): the tests run it on synthetic data.

Models (ring algorithms, docs/cost-model.md#collectives-alpha-beta-ring-busbw; n ranks, S bytes = full buffer as in
nccl-tests, alpha seconds per step, beta bytes/s per rank and direction):

- all-reduce:                  T = 2(n-1) * alpha + 2(n-1)/n * S / beta
- all-gather, reduce-scatter:  T =  (n-1) * alpha +  (n-1)/n * S / beta
- send/recv (one way):         T =          alpha +            S / beta
- all-to-all (pairwise):       T =  (n-1) * alpha +  (n-1)/n * S / beta  (S: what each rank sends)

Each is linear in S, T = c0 + c1 * S, so alpha = c0 / steps and
beta = volume_factor / c1. beta is then directly comparable to nccl-tests
busbw and to a link's declared per-direction bandwidth.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from planner.probe.sweep import op_coefficients


@dataclass(frozen=True)
class AlphaBetaFit:
    """Fitted latency per step and bandwidth per rank; bandwidth None when the sweep never left the latency regime."""

    alpha_seconds: float
    bandwidth_bytes_per_s: float | None
    num_points: int
    rms_relative_residual: float

    def predict_seconds(self, op: str, num_ranks: int, size_bytes: float) -> float:
        steps, factor = op_coefficients(op, num_ranks)
        transfer_seconds = (
            0.0
            if self.bandwidth_bytes_per_s is None
            else factor * size_bytes / self.bandwidth_bytes_per_s
        )
        return steps * self.alpha_seconds + transfer_seconds


MIN_RESOLVED_TRANSFER_SHARE = 0.02
"""A fit resolves a bandwidth only where the fitted transfer makes at least this share of the
largest message's time (below it the slope is the latency's noise: docs/probe.md)."""


def _weighted_line(sizes: list[float], times: list[float]) -> tuple[float, float]:
    """Least squares T = c0 + c1 * S minimizing relative error (weights 1 / T^2)."""
    weights = [1.0 / t**2 for t in times]
    sw = sum(weights)
    sx = sum(w * s for w, s in zip(weights, sizes, strict=True))
    sxx = sum(w * s * s for w, s in zip(weights, sizes, strict=True))
    sy = sum(w * t for w, t in zip(weights, times, strict=True))
    sxy = sum(w * s * t for w, s, t in zip(weights, sizes, times, strict=True))
    determinant = sw * sxx - sx * sx
    if determinant <= 0.0:
        return sy / sw, 0.0
    c1 = (sw * sxy - sx * sy) / determinant
    c0 = (sy - c1 * sx) / sw
    if c0 < 0.0:  # latency below resolution: refit through the origin
        return 0.0, sxy / sxx
    return c0, c1


def fit_alpha_beta(
    op: str, num_ranks: int, sizes_bytes: list[int], seconds: list[float]
) -> AlphaBetaFit:
    """Fit alpha and beta of the op's model (op_coefficients) to (size, median time) points."""
    if len(set(sizes_bytes)) < 2 or len(sizes_bytes) != len(seconds):
        raise ValueError("a fit needs at least two distinct message sizes")
    if num_ranks < 2:
        raise ValueError("a fit needs at least two ranks")
    scale_bytes = float(max(sizes_bytes))
    x = [s / scale_bytes for s in sizes_bytes]  # conditioning: S in units of the largest size
    c0, c1_scaled = _weighted_line(x, seconds)
    c1 = c1_scaled / scale_bytes
    steps, factor = op_coefficients(op, num_ranks)
    bandwidth_bytes_per_s = factor / c1 if c1 > 0.0 else None
    fit = AlphaBetaFit(c0 / steps, bandwidth_bytes_per_s, len(sizes_bytes), 0.0)
    residuals = [
        (fit.predict_seconds(op, num_ranks, s) - t) / t
        for s, t in zip(sizes_bytes, seconds, strict=True)
    ]
    rms = math.sqrt(sum(r * r for r in residuals) / len(residuals))
    # the bandwidth is resolved only where the largest message's transfer is a share of its time
    # the latency's noise cannot make: otherwise the slope is that noise (a gloo sweep to 512 B,
    # transfer 0.6% of the time, fitted 0.01 GB/s on a 1.5 GB/s link)
    transfer_share = c1 * scale_bytes / (c0 + c1 * scale_bytes) if c1 > 0.0 else 0.0
    if transfer_share < MIN_RESOLVED_TRANSFER_SHARE:
        bandwidth_bytes_per_s = None
    return AlphaBetaFit(fit.alpha_seconds, bandwidth_bytes_per_s, len(sizes_bytes), rms)


def slow_outliers(bandwidth_by_key: dict, threshold_fraction: float = 0.7) -> list:
    """Keys whose bandwidth is below threshold_fraction of the median of the others."""
    if len(bandwidth_by_key) < 2:
        return []
    slow = []
    for key, value in bandwidth_by_key.items():
        others = [v for k, v in bandwidth_by_key.items() if k != key]
        if value < threshold_fraction * statistics.median(others):
            slow.append(key)
    return slow


def exceeds_spec(
    measured_bytes_per_s: float, spec_bytes_per_s: float, tolerance_fraction: float = 0.05
) -> bool:
    """True when a measured busbw beats the declared link: tree/NVLS/SHARP or a wrong spec, never trust it blindly."""
    return measured_bytes_per_s > spec_bytes_per_s * (1.0 + tolerance_fraction)
