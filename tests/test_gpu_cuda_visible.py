"""The CUDA-visible total per GPU (what vLLM's gpu_memory_utilization multiplies)."""

import pytest

from planner.catalog import gpu_catalog, resolve_gpu
from planner.specs import CUDA_RESERVED_GIB_TYPICAL
from planner.units import gib_to_bytes


def test_visible_total_is_below_the_nvidia_smi_total_for_every_gpu() -> None:
    for gpu in gpu_catalog():
        assert 0 < gpu.memory_bytes - gpu.cuda_visible_memory_bytes < gib_to_bytes(1), gpu.name


@pytest.mark.parametrize("name, visible_gib", [("H100-SXM5-80GB", 79.11), ("A100-SXM4-80GB", 79.15),
                                               ("H200-SXM-141GB", 139.80), ("B200-SXM-180GB", 178.35),
                                               ("RTX-3090", 23.70), ("RTX-4090", 23.64), ("RTX-5090", 31.37),
                                               ("RTX-PRO-6000", 94.97)])
def test_cited_visible_totals(name: str, visible_gib: float) -> None:
    assert resolve_gpu(name).cuda_visible_memory_bytes == gib_to_bytes(visible_gib)


def test_uncited_gpu_derives_visible_total_by_the_stated_rule() -> None:
    """L4: nvidia-smi 22.49 GiB - 0.61 GiB typical reservation = 21.88 GiB."""
    gpu = resolve_gpu("L4")
    assert gpu.cuda_visible_memory_gib is None
    assert gpu.cuda_visible_memory_bytes == gib_to_bytes(22.49 - CUDA_RESERVED_GIB_TYPICAL)
