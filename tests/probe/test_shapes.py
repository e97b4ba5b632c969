"""What the profile makes of synthetic sweeps (no torch): a curve per TP group size, each
collective's own bandwidth, and slow nodes and NICs named."""

import pytest

from planner.catalog import load_cluster
from planner.probe import profile, results

from .test_profile import SIZES_BYTES, seconds

INTRA = (5e-6, 100e9)  # alpha seconds, beta bytes/s per rank
INTER = (20e-6, 10e9)


def raw_from(nodes, phases, figures=None, slow=None):
    """Worker output for these phases: every group follows the ring model with its link's
    (alpha, beta), figures[(op, link)] overriding; slow[(phase index, group index)] scales beta."""
    figures, slow = figures or {}, slow or {}
    rows = []
    for index, phase in enumerate(phases):
        for group_index, ranks in enumerate(phase["groups"]):
            link = "intra_node" if phase["link"] == "intra_node" else "inter_node"
            alpha, beta = figures.get((phase["op"], link), INTRA if link == "intra_node" else INTER)
            beta *= slow.get((index, group_index), 1.0)
            for size in SIZES_BYTES:
                t = seconds(phase["op"], len(ranks), alpha, beta, size)
                rows += [
                    dict(
                        phase=index,
                        group=group_index,
                        size_bytes=size,
                        rank=rank,
                        repeat_seconds=[t, t * 1.01, t * 0.99],
                    )
                    for rank in ranks
                ]
    return dict(
        backend="nccl",
        device="cpu",
        torch_version="2.13.0",
        nccl_version=None,
        world_size=sum(map(len, nodes)),
        nodes=nodes,
        hostnames=[f"host{i}" for i in range(len(nodes))],
        node_id_from="group-rank",
        sizes_bytes=SIZES_BYTES,
        warmup=1,
        iterations=1,
        repeats=3,
        phases=phases,
        rows=rows,
        compute=[],
    )


def phase(op, link, mode, groups):
    return dict(op=op, link=link, mode=mode, groups=groups)


def one_node_of_four():
    node = [0, 1, 2, 3]
    return [node], [
        phase("all_reduce", "intra_node", "all_local_ranks", [node]),
        phase("all_gather", "intra_node", "all_local_ranks", [node]),
        phase("reduce_scatter", "intra_node", "all_local_ranks", [node]),
        phase("send_recv", "intra_node", "all_local_ranks", [[0, 1], [2, 3]]),
        phase("all_reduce", "intra_node", "tp_groups", [[0, 1], [2, 3]]),
    ]


def build(raw):
    rows = results.summarize_rows(raw)
    return profile.build_profile(raw, rows, results.fit_all(rows), profile.ProfileChoices())


def test_a_curve_per_tp_size_inside_a_node_and_the_planner_reads_it(tmp_path):
    document = build(raw_from(*one_node_of_four()))
    curves = document["measured"]["allreduce_curves"]
    assert [(c["link"], c["num_ranks"]) for c in curves] == [("intra_node", 2), ("intra_node", 4)]
    assert "intra_node_all_reduce_tp_groups_2" in document["measured"]["fits"]
    path = tmp_path / "m.yaml"
    profile.atomic_write_text(path, profile.dump_yaml(document))
    cluster = load_cluster(path)
    assert cluster.allreduce_curve("intra_node", 2) is not None
    assert cluster.allreduce_curve("intra_node", 4) is not None


def test_cross_node_curves_are_consecutive_groups_only():
    nodes = [[0, 1], [2, 3], [4, 5], [6, 7]]
    phases = [
        phase("all_reduce", "intra_node", "all_local_ranks", nodes),
        phase("all_reduce", "inter_node", "all_local_ranks", [[0, 2, 4, 6], [1, 3, 5, 7]]),
        phase("all_reduce", "inter_node", "tp_groups", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        phase("all_reduce", "world", "all_local_ranks", [list(range(8))]),
    ]
    curves = build(raw_from(nodes, phases))["measured"]["allreduce_curves"]
    # tp=4 on 4x2 spans 2 nodes: the consecutive groups, not rank j of every node
    assert [(c["link"], c["num_ranks"], c["mode"]) for c in curves] == [
        ("intra_node", 2, "all_local_ranks"),
        ("inter_node", 4, "tp_groups"),
        ("inter_node", 8, "all_local_ranks"),
    ]


def test_each_collective_has_its_own_bandwidth_and_nvls_all_reduce_is_kept_apart():
    """All-reduce at 300 GB/s busbw beats the 100 GB/s ring rate of all-gather and
    reduce-scatter (NVLS): the link gets 100, all-reduce keeps 300, labelled."""
    nodes, phases = one_node_of_four()
    figures = {
        ("all_reduce", "intra_node"): (5e-6, 300e9),
        ("send_recv", "intra_node"): (2e-6, 40e9),
    }
    document = build(raw_from(nodes, phases, figures))
    by_op = document["measured"]["bandwidth_gb_per_s_by_op"]["intra_node"]
    assert by_op["all_reduce"] == pytest.approx(300.0, rel=1e-3)
    assert by_op["all_gather"] == pytest.approx(100.0, rel=1e-3)
    assert by_op["reduce_scatter"] == pytest.approx(100.0, rel=1e-3)
    assert by_op["send_recv"] == pytest.approx(40.0, rel=1e-3)
    assert by_op["all_reduce_algorithm"] == "above ring rate (NVLS/tree)"
    assert document["intra_node"]["bandwidth_gb_per_s"] == pytest.approx(100.0, rel=1e-3)
    assert any("beats the ring rate" in f for f in document["measured"]["flags"])


def test_a_ring_all_reduce_sets_the_link_as_before():
    document = build(raw_from(*one_node_of_four()))
    assert document["intra_node"]["bandwidth_gb_per_s"] == pytest.approx(100.0, rel=1e-3)
    assert (
        "all_reduce_algorithm" not in document["measured"]["bandwidth_gb_per_s_by_op"]["intra_node"]
    )


def two_nodes_of_four():
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7]]
    rails = [[j, 4 + j] for j in range(4)]
    return nodes, [
        phase("all_reduce", "intra_node", "all_local_ranks", nodes),
        phase("all_reduce", "inter_node", "all_local_ranks", rails),
        phase("send_recv", "inter_node", "all_local_ranks", rails),
    ]


def test_a_slow_nic_is_named_by_local_rank_and_nodes():
    nodes, phases = two_nodes_of_four()
    document = build(raw_from(nodes, phases, slow={(1, 2): 0.4, (2, 2): 0.4}))
    outliers = document["measured"]["outliers"]
    assert [(o["op"], o["link"], o["local_ranks"], o["node_indices"]) for o in outliers] == [
        ("all_reduce", "inter_node", [2], [0, 1]),
        ("send_recv", "inter_node", [2], [0, 1]),
    ]
    assert outliers[0]["fraction_of_median"] == pytest.approx(0.4, rel=0.02)
    flags = document["measured"]["flags"]
    assert any(
        "ranks [2, 6] on node 0 (host0), node 1 (host1), NIC of local rank 2" in f for f in flags
    ), flags


def test_a_slow_node_is_named_and_healthy_runs_flag_nothing():
    nodes = [[0, 1], [2, 3], [4, 5]]
    phases = [phase("all_reduce", "intra_node", "all_local_ranks", nodes)]
    assert build(raw_from(nodes, phases))["measured"]["outliers"] == []
    (slow,) = build(raw_from(nodes, phases, slow={(0, 1): 0.5}))["measured"]["outliers"]
    assert (slow["node_indices"], slow["hostnames"], slow["ranks"]) == ([1], ["host1"], [2, 3])


@pytest.mark.parametrize(
    ("device_name", "catalog_name"),
    [
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA H200 NVL", "H200-NVL-141GB"),
        ("NVIDIA H200", "H200-SXM-141GB"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"),
        ("NVIDIA H800", "H800-SXM5-80GB"),  # its own entry, never an H100's
        ("NVIDIA A800-SXM4-80GB", "A800-SXM4-80GB"),  # never an A100's
        ("NVIDIA A800 80GB PCIe", "A800-PCIE-80GB"),
        ("NVIDIA H800 PCIe", None),  # not in the catalog: measured figures, never an H100's
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA GeForce RTX 4090 D", None),  # fewer cores: not the RTX 4090's rates
        ("NVIDIA A100-PCIE-40GB", None),  # 1,555 GB/s, 40 GB: never the 80 GB PCIe entry
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("NVIDIA GeForce RTX 3090 Ti", None),  # other bandwidth and clocks
        ("NVIDIA GeForce RTX 5090", "RTX-5090"),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("NVIDIA A40", "A40"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", None),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", None),
    ],
)
def test_device_names_map_to_their_own_catalog_entry(device_name, catalog_name):
    assert profile.catalog_gpu_name(device_name) == catalog_name
    if catalog_name:
        assert profile.catalog_gpu(catalog_name)["name"] == catalog_name


def test_a_measured_copy_rate_is_derated_once():
    """An unknown GPU's HBM figure is copy / DECODE_HBM_UTILIZATION, so the planner's decode
    derating (x DECODE_HBM_UTILIZATION) gives back exactly the measured 3000 GB/s."""
    from planner.cost.efficiency import DECODE_HBM_UTILIZATION

    nodes, phases = one_node_of_four()
    raw = raw_from(nodes, phases)
    raw["compute"] = [
        dict(
            rank=0,
            device_name="NVIDIA H800 PCIe",
            memory_bytes=80 * 2**30,
            matmul_flop_per_s={"bf16": 7e14, "fp16": 7e14},
            hbm_copy_bytes_per_s=3.0e12,
        )
    ]
    document = build(raw)
    gpu = document["gpu"]
    assert gpu["name"] == "NVIDIA H800 PCIe"
    assert gpu["hbm_bandwidth_gb_per_s"] * DECODE_HBM_UTILIZATION == pytest.approx(3000, rel=1e-3)
    assert gpu["achievable_matmul_tflops"]["bf16"] == 700.0
    assert document["measured"]["hbm_bandwidth_gb_per_s"] == 3000.0


@pytest.mark.parametrize(
    ("device_name", "catalog_name"),
    [("NVIDIA H800", "H800-SXM5-80GB"), ("NVIDIA A800-SXM4-80GB", "A800-SXM4-80GB")],
)
def test_a_catalog_gpu_gets_its_entry_not_an_inline_one(device_name, catalog_name):
    """H800 and A800 now have catalog entries: the profile takes the entry (datasheet peaks and
    HBM figure, no "not in the catalog" flag) plus the measured matmul rate."""
    nodes, phases = one_node_of_four()
    raw = raw_from(nodes, phases)
    raw["compute"] = [
        dict(
            rank=0,
            device_name=device_name,
            memory_bytes=80 * 2**30,
            matmul_flop_per_s={"bf16": 7e14, "fp16": 7e14},
            hbm_copy_bytes_per_s=1.9e12,
        )
    ]
    document = build(raw)
    gpu = document["gpu"]
    assert gpu["name"] == catalog_name
    assert gpu["peak_tflops"]["bf16"] is not None
    assert gpu["achievable_matmul_tflops"]["bf16"] == 700.0
    assert not any("not in the catalog" in flag for flag in document["measured"]["flags"])


@pytest.mark.parametrize(
    ("device_name", "chosen", "kind"),
    [
        ("NVIDIA GeForce RTX 4090", None, "pcie"),  # the catalog's typical fabric for the GPU
        ("NVIDIA L40S", None, "pcie"),
        ("NVIDIA H100 80GB HBM3", None, "nvlink"),
        ("NVIDIA H800 PCIe", None, "nvlink"),  # not in the catalog: NVLink, as before
        ("NVIDIA GeForce RTX 4090", "nvlink", "nvlink"),  # --intra-kind wins
    ],
)
def test_a_cuda_profile_takes_the_gpus_typical_fabric(device_name, chosen, kind):
    nodes, phases = one_node_of_four()
    raw = raw_from(nodes, phases)
    raw["device"] = "cuda"
    name = profile.catalog_gpu_name(device_name)  # the memory the card reports: its entry's
    memory_bytes = profile.catalog_gpu(name)["memory_gib"] * 2**30 if name else 24 * 2**30
    raw["compute"] = [dict(rank=0, device_name=device_name, memory_bytes=memory_bytes,
                           matmul_flop_per_s={"bf16": 1.5e14, "fp16": 1.5e14}, hbm_copy_bytes_per_s=9e11)]
    rows = results.summarize_rows(raw)
    document = profile.build_profile(raw, rows, results.fit_all(rows), profile.ProfileChoices(intra_kind=chosen))
    assert document["intra_node"]["kind"] == kind


def test_a_detected_gpu_whose_memory_differs_from_its_entry_is_measured():
    """A name pattern is a guess; the memory is measured. A card reporting 39.4 GiB under a name
    that maps to an 80 GB entry keeps its measured figures (an 80 GB plan on a 40 GB card: a read);
    one within 10% of its entry (the CUDA-visible 79.1 of 79.6 GiB) takes the entry."""
    def raw(memory_gib: float) -> dict:
        return {"compute": [{"device_name": "NVIDIA A100 80GB PCIe", "memory_bytes": memory_gib * 2**30,
                             "hbm_copy_bytes_per_s": 1.5e12,
                             "matmul_flop_per_s": {"bf16": 2.5e14, "fp16": 2.5e14}}]}

    flags: list[str] = []
    small = profile.gpu_entry(raw(39.4), profile.ProfileChoices(), flags)
    assert small["name"] == "NVIDIA A100 80GB PCIe" and small["memory_gib"] == pytest.approx(39.4)
    assert any("not the catalog's A100-PCIE-80GB" in f for f in flags)
    flags = []
    right = profile.gpu_entry(raw(79.1), profile.ProfileChoices(), flags)
    assert right["name"] == "A100-PCIE-80GB" and not flags
