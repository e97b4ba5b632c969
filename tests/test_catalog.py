"""The GPU catalog, shipped names and NxMxGPU shorthand."""

from __future__ import annotations

import pytest

from planner.catalog import (
    cluster_from_shorthand,
    gpu_catalog,
    resolve_cluster,
    resolve_gpu,
    resolve_model,
    shipped_clusters,
    shipped_models,
)
from planner.specs import SpecError

REQUIRED_MODELS = {
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "llama-2-70b",
    "qwen2.5-72b",
    "mistral-7b",
    "mixtral-8x7b",
    "gpt3-175b",
}
REQUIRED_CLUSTERS = {
    "1x8xA100",
    "2x8xA100",
    "1x8xH100",
    "2x8xH100",
    "4x8xH100",
    "1x8xH200",
    "1x8xB200",
    "1x4xL40S",
    "1x8xMI300X",
    "1x1xH100",
}


def test_catalog_lists_ship() -> None:
    assert REQUIRED_MODELS <= set(shipped_models())
    assert any(resolve_model(name).quantization for name in shipped_models())
    assert REQUIRED_CLUSTERS <= set(shipped_clusters())


def test_catalog_loads_every_gpu_of_the_hardware_reference() -> None:
    """The catalog ships 29 GPUs."""
    names = {gpu.name for gpu in gpu_catalog()}
    assert len(names) == len(gpu_catalog()) == 29
    for gpu in gpu_catalog():
        assert gpu.memory_bytes > 0 and gpu.hbm_bytes_per_s > 0
        assert resolve_gpu(gpu.name) is gpu
        for alias in gpu.aliases:
            assert resolve_gpu(alias) is gpu


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("A100", "A100-SXM4-80GB"),
        ("a100", "A100-SXM4-80GB"),
        ("A100-40GB", "A100-SXM4-40GB"),
        ("H100", "H100-SXM5-80GB"),
        ("h100_sxm", "H100-SXM5-80GB"),
        ("H200", "H200-SXM-141GB"),
        ("B200", "B200-SXM-180GB"),
        ("MI300X", "MI300X"),
        ("L40S", "L40S"),
        ("H800", "H800-SXM5-80GB"),
        ("h800_sxm", "H800-SXM5-80GB"),
        ("H800-80GB", "H800-SXM5-80GB"),
        ("A800", "A800-SXM4-80GB"),
        ("A800-SXM4-80GB", "A800-SXM4-80GB"),
        ("A800-PCIE", "A800-PCIE-80GB"),
        ("A800-40GB", "A800-PCIE-40GB"),
    ],
)
def test_aliases_resolve(alias: str, name: str) -> None:
    assert resolve_gpu(alias).name == name


@pytest.mark.parametrize("name", ["A200", "", "H100-SXM9"])
def test_unknown_gpu_fails(name: str) -> None:
    with pytest.raises(SpecError, match="unknown GPU"):
        resolve_gpu(name)


@pytest.mark.parametrize(
    ("name", "precision", "tflops"),
    [
        # vendor datasheets, dense
        ("H100", "bf16", 989),
        ("H100", "fp8", 1979),
        ("A100", "tf32", 156),
        ("B200", "fp4", 9000),
        ("MI300X", "bf16", 1307),
        ("A100", "fp8", None),  # "-": no such precision
        ("H100-NVL", "fp32", None),  # "?": unknown stays unknown
        ("A10G", "bf16", None),
        ("H800", "bf16", 989),  # H100's GH100, NVLink and FP64 cut
        ("H800", "fp8", 1979),
        ("A800", "tf32", 156),  # A100's GA100, NVLink cut
        ("A800", "fp8", None),
        ("GH200", "bf16", 989),  # its GPU is an H100 (132 SMs, 1980 MHz)
        ("GH200", "fp8", 1979),
        # GeForce tensor cores with FP32 accumulate (half their FP16-accumulate rate): Ada and
        # RTX Blackwell whitepapers, Appendix A; GA102 whitepaper
        ("RTX-4090", "bf16", 165.2),
        ("RTX-4090", "fp8", 330.3),  # whitepaper v2.02's corrected cell (660.6 is FP16 accumulate)
        ("RTX-3090", "bf16", 71.2),
        ("RTX-3090", "fp8", None),  # Ampere: no FP8
        ("RTX-5090", "bf16", 209.5),
        ("RTX-5090", "fp8", 419),
        ("RTX-5090", "fp4", 1676),
        # workstation and data-centre Ampere/Ada/Blackwell cards: FP32 accumulate at the full rate
        ("RTX-A6000", "bf16", 154.8),
        ("A40", "bf16", 149.7),
        ("A40", "tf32", 74.8),
        ("RTX-6000-Ada", "bf16", 364),
        ("RTX-6000-Ada", "fp8", 728),  # 2 x bf16, as L40S (the same AD102 at 142 SMs: 362 / 733)
        ("RTX-6000-Ada", "int8", None),  # not confirmed
        ("H100-NVL", "fp8", 1670),  # 2 x bf16, as every Hopper part (H100 architecture whitepaper)
        ("RTX-PRO-6000", "bf16", 503.8),
    ],
)
def test_catalog_peaks_follow_the_reference(
    name: str, precision: str, tflops: float | None
) -> None:
    assert getattr(resolve_gpu(name).peak_tflops, precision) == tflops


@pytest.mark.parametrize("name", sorted(REQUIRED_CLUSTERS))
def test_shipped_clusters_resolve_by_name(name: str) -> None:
    assert resolve_cluster(name).name == name


def test_l40s_profile_is_pcie_only() -> None:
    cluster = resolve_cluster("1x4xL40S")
    assert cluster.intra_node.kind == "pcie" and cluster.inter_node is None


def test_shorthand_4x8xh100_agrees_with_the_shipped_profile() -> None:
    """`4x8xH100` names a shipped file; the shorthand built from the catalog (DGX H100:
    NVLink 4, 8 x 400 Gb/s NDR) gives the same shape, GPU and links."""
    shipped = resolve_cluster("4x8xH100")
    built = cluster_from_shorthand(4, 8, "H100", "4x8xH100")
    assert shipped.num_gpus == built.num_gpus == 32
    assert shipped.gpu == built.gpu and built.gpu.name == "H100-SXM5-80GB"
    assert built.intra_node.kind == shipped.intra_node.kind == "nvlink"
    assert built.intra_node.bandwidth_gb_per_s == shipped.intra_node.bandwidth_gb_per_s
    assert built.inter_node.num_nics_per_node == shipped.inter_node.num_nics_per_node == 8
    assert (
        built.inter_node.node_bandwidth_bytes_per_s == shipped.inter_node.node_bandwidth_bytes_per_s
    )


def test_shorthand_builds_from_the_catalog() -> None:
    """3x4xA100 (not shipped): the typical DGX A100 networking scaled to 4 GPUs per node:
    8 NICs * 4/8 = 4 NICs of 200 Gb/s."""
    cluster = resolve_cluster("3x4xA100")
    assert cluster.num_nodes == 3 and cluster.gpus_per_node == 4
    assert cluster.gpu is resolve_gpu("A100")
    assert cluster.intra_node == resolve_gpu("A100").intra_node
    assert cluster.inter_node.num_nics_per_node == 4
    assert cluster.inter_node.nic_bandwidth_gbit_per_s == 200


def test_shorthand_single_gpu_has_no_links() -> None:
    cluster = resolve_cluster("1x1xB200")
    assert cluster.intra_node is None and cluster.inter_node is None


@pytest.mark.parametrize(
    ("arg", "match"),
    [
        ("2x8xA999", "unknown GPU"),
        ("0x8xA100", "must be positive"),
        ("2x8xA100-PCIE", "no typical node networking"),
        ("nonsense", "neither a file"),
    ],
)
def test_bad_cluster_names(arg: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        resolve_cluster(arg)


def test_unknown_model_name() -> None:
    with pytest.raises(SpecError, match="neither a file nor a shipped model"):
        resolve_model("llama-9-1t")


def test_file_paths_resolve_like_names(repo_root) -> None:
    assert resolve_model(str(repo_root / "model_specs/llama-3.1-70b.yaml")) == resolve_model(
        "llama-3.1-70b"
    )
    assert resolve_cluster(str(repo_root / "hardware_profiles/2x8xA100.yaml")) == resolve_cluster(
        "2x8xA100"
    )


def test_shorthand_for_a_gpu_without_a_catalog_fabric_is_one_line() -> None:
    """Every catalog GPU: NxMxGPU either builds a cluster or says in a SpecError which part
    of the fabric the catalog lacks (never a pydantic traceback)."""
    from planner.catalog import cluster_from_shorthand, gpu_catalog

    for gpu in gpu_catalog():
        for nodes, per_node in ((1, 1), (1, 4), (2, 8)):
            try:
                cluster = cluster_from_shorthand(nodes, per_node, gpu.name, f"{nodes}x{per_node}x{gpu.name}")
            except SpecError as exc:
                assert "fabric" in str(exc) or "networking" in str(exc), str(exc)
            else:
                assert cluster.num_gpus == nodes * per_node


@pytest.mark.parametrize(
    ("name", "hbm_gb_per_s", "nvlink_gb_per_s_per_direction"),
    [("H800", 3350, 200), ("A800", 2039, 200), ("A800-PCIE", 1935, None), ("A800-40GB", 1555, None)],
)
def test_export_variants_keep_memory_and_lose_nvlink(
    name: str, hbm_gb_per_s: float, nvlink_gb_per_s_per_direction: float | None
) -> None:
    """400 GB/s NVLink bidirectional is 200 GB/s per direction, the convention of H100's 450."""
    gpu = resolve_gpu(name)
    assert gpu.hbm_bandwidth_gb_per_s == hbm_gb_per_s
    if nvlink_gb_per_s_per_direction is None:
        assert gpu.intra_node.kind == "pcie"
    else:
        assert gpu.intra_node.kind == "nvlink"
        assert gpu.intra_node.bandwidth_gb_per_s == nvlink_gb_per_s_per_direction
        assert resolve_gpu("H100").intra_node.bandwidth_gb_per_s == 450


def test_shipped_model_names_are_case_insensitive_as_cluster_names_are():
    """--model LLAMA-3.1-70B is the shipped llama-3.1-70b, as --cluster 1X8XH100 is 1x8xH100."""
    from planner.catalog import resolve_model

    assert resolve_model("LLAMA-3.1-70B") == resolve_model("llama-3.1-70b")


def test_a_profile_measured_over_gloo_says_so_where_it_is_described():
    """plan probe --merge-into from a CPU run keeps the profile's nvlink kind with the host
    path's figures (2.3 GB/s); plans on it said only "links measured by plan probe"."""
    from planner.render.catalog import describe_cluster
    from planner.specs import Measured

    h100 = resolve_cluster("1x8xH100")
    gloo = h100.model_copy(update={"measured": Measured(date="2026-12-05", backend="gloo")})
    nccl = h100.model_copy(update={"measured": Measured(date="2026-12-05", backend="nccl")})
    assert "warning: measured with gloo on the hosts' CPUs" in describe_cluster(gloo)
    assert "warning" not in describe_cluster(nccl) and "links measured by plan probe" in describe_cluster(nccl)


@pytest.mark.parametrize(("given", "name"), [
    ("NVIDIA GeForce RTX 4090", "RTX-4090"),  # nvidia-smi's names
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"),
    ("NVIDIA L40S", "L40S"),
    ("AMD Instinct MI300X", "MI300X"),  # rocm-smi's
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000"),
    ("Tesla A100", "A100-SXM4-80GB"),
])
def test_a_gpu_as_the_driver_names_it(given: str, name: str) -> None:
    assert resolve_gpu(given).name == name


def test_an_unknown_gpu_names_the_nearest() -> None:
    """A typo ('L4OS' for L40S) gets the nearest catalog names first, then the whole list."""
    with pytest.raises(SpecError, match=r"unknown GPU 'L4OS' \(did you mean L40S, L4\? known: A100"):
        resolve_gpu("L4OS")
    with pytest.raises(SpecError, match=r"unknown GPU 'NVIDIA' \(known: "):
        resolve_gpu("NVIDIA")
    # two aliases of one GPU near the typo name it once
    with pytest.raises(SpecError, match=r"\(did you mean A800-PCIE-40GB, A100-PCIE-80GB\? known"):
        resolve_gpu("NVIDIA A100-PCIE-40GB")
