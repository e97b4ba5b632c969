"""vLLM's V1 workers refuse to start when the free memory after the CUDA context is below
--gpu-memory-utilization x total (request_memory, vllm/v1/worker/utils.py at 0.33.0)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from planner.catalog import gpu_catalog, resolve_cluster
from planner.engines import EngineVersions
from planner.requests import ServeRequest
from planner.serve_search import utilization_refusal


def test_an_h100_starts_at_0_99_and_not_at_0_995():
    """H100: 79.11 GiB visible; the context's 500 MiB = 0.488 GiB leaves 78.62 GiB free, a
    fraction 78.62 / 79.11 = 0.9938: 0.99 x 79.11 = 78.32 GiB starts, 0.995 x 79.11 = 78.71
    GiB does not."""
    cluster = resolve_cluster("1x1xH100")
    assert utilization_refusal(cluster, ServeRequest(gpu_memory_utilization=0.99)) is None
    refusal = utilization_refusal(cluster, ServeRequest(gpu_memory_utilization=0.995))
    assert refusal is not None and "78.71 GiB" in refusal and "at most 0.99" in refusal


def test_v0_and_sglang_have_no_such_check():
    cluster = resolve_cluster("1x1xA100")
    v0 = ServeRequest(gpu_memory_utilization=1.0, engine_versions=EngineVersions(vllm="0.6.6.post1"))
    assert utilization_refusal(cluster, v0) is None
    assert utilization_refusal(cluster, ServeRequest(gpu_memory_utilization=1.0, pool_engine="sglang")) is None


@given(st.sampled_from(["1x1xH100", "1x1xA100", "1x1xL40S", "1x1xB200", "1x1xRTX-4090"]),
       st.floats(0.05, 1.0))
def test_refused_exactly_above_the_free_fraction(cluster_name, utilization):
    cluster = resolve_cluster(cluster_name)
    total = cluster.gpu.cuda_visible_memory_bytes
    refused = utilization_refusal(cluster, ServeRequest(gpu_memory_utilization=utilization)) is not None
    assert refused == (utilization * total > total - 500 * 2**20)
    if utilization <= 0.9:
        assert not refused


def test_every_catalog_gpu_refuses_all_of_its_memory():
    for gpu in gpu_catalog():
        cluster = resolve_cluster(f"1x1x{gpu.name}")
        assert utilization_refusal(cluster, ServeRequest(gpu_memory_utilization=1.0)) is not None
