"""A GPU without a confirmed tensor peak: a measured matmul rate (a `plan probe` profile) is
used; with neither, serving and training refuse (compute is never priced as free)."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_cluster, resolve_gpu, resolve_model
from planner.cost import efficiency as eff
from planner.cost.serving_time import achievable_flops_per_s, attention_flops_per_s
from planner.errors import SpecError
from planner.specs import AchievableTflops
from planner.train import train_rates


def _a10g_cluster(measured_tflops: float | None):
    cluster = resolve_cluster("1x4xA10G")
    if measured_tflops is None:
        return cluster
    measured = AchievableTflops(bf16=measured_tflops, fp16=measured_tflops)
    gpu = cluster.gpu.model_copy(update={"achievable_matmul_tflops": measured})
    return cluster.model_copy(update={"gpu": gpu})


def test_catalog_a10g_has_no_tensor_rate() -> None:
    gpu = resolve_gpu("A10G")
    assert gpu.peak_flops_per_s("bf16") is None
    assert eff.dense_peak_flops_per_s(gpu, "bf16") is None


def test_measured_rate_stands_in_for_the_missing_peak() -> None:
    # probe measured 70 TFLOP/s bf16: serving's GEMMs run at it; the dense peak is read
    # backwards through the default 0.75: 70e12 / 0.75 = 93.33e12; flash attention at the
    # default forward share 0.73 of it: 93.33e12 * 0.73 = 68.13e12. A training step sustains 0.93 of
    # its kernels' rates (efficiency.TRAIN_SUSTAINED_RATE_FRACTION): 0.93 * 70e12 = 65.1e12.
    cluster = _a10g_cluster(70.0)
    model = resolve_model("llama-3.1-8b")
    assert achievable_flops_per_s(model, cluster) == pytest.approx(70e12)
    assert eff.dense_peak_flops_per_s(cluster.gpu, "bf16") == pytest.approx(93.333e12, rel=1e-4)
    assert attention_flops_per_s(cluster) == pytest.approx(68.133e12, rel=1e-4)
    rates = train_rates(model, cluster)
    assert rates.matmul_flops_per_s == pytest.approx(65.1e12)
    assert rates.peak_flops_per_s == pytest.approx(93.333e12, rel=1e-4)


def test_neither_peak_nor_measurement_refuses() -> None:
    cluster = _a10g_cluster(None)
    model = resolve_model("llama-3.1-8b")
    with pytest.raises(SpecError, match="GPU A10G: no bf16 tensor-core rate"):
        achievable_flops_per_s(model, cluster)
    with pytest.raises(SpecError, match="GPU A10G: no bf16 tensor-core rate"):
        attention_flops_per_s(cluster)
    with pytest.raises(SpecError, match="A10G: no dense bf16 peak"):
        train_rates(model, cluster)


def test_a_catalog_peak_still_wins_over_the_inferred_one() -> None:
    gpu = resolve_gpu("H100")
    assert eff.dense_peak_flops_per_s(gpu, "bf16") == pytest.approx(989e12)
