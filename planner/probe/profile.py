"""Build, merge and atomically write the hardware profile that `plan probe` measures.

Pure python + yaml (no torch). File keys carry human units (GB/s = 1e9
bytes/s, Gbit/s = 1e9 bits/s, us, TFLOP/s); they are converted here only.

The inter-node link is per node, as the schema wants, and derived from what
was measured (the ``inter_node_basis`` key and a flag say which):
- ``all_local_ranks``: every local rank ran its own inter-node all-reduce at
  the same time, so the node's NICs carried all of them: node bandwidth =
  local ranks x fitted per-rank bandwidth (a sum).
- ``one_rank_per_node``: one rank per node crossed (a node with one rank);
  its bandwidth is a lower bound for the node (one rank rarely fills
  several NICs).
The link latency is the alpha of the all-reduce fit (per ring step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner import units
from planner.probe.fit import AlphaBetaFit
from planner.probe.results import (
    ALL_RANKS,
    ONE_RANK_PER_NODE,
    POOR_FIT_RELATIVE_RESIDUAL,
    ResultRow,
    rounded,
)

CPU_DEFAULT_GPU = "A100-SXM4-80GB"
# torch.cuda.get_device_name() -> catalog name; first match wins, so specific before generic.
DEVICE_NAME_PATTERNS = (
    (r"GB200", "GB200"),
    (r"B200", "B200-SXM-180GB"),
    (r"H200", "H200-SXM-141GB"),
    (r"H100.*NVL", "H100-NVL-94GB"),
    (r"H100.*PCI", "H100-PCIE-80GB"),
    (r"H100", "H100-SXM5-80GB"),
    (r"A100.*PCI", "A100-PCIE-80GB"),
    (r"A100.*40GB", "A100-SXM4-40GB"),
    (r"A100", "A100-SXM4-80GB"),
    (r"L40S", "L40S"),
    (r"\bL4\b", "L4"),
    (r"A10G", "A10G"),
    (r"4090", "RTX-4090"),
    (r"MI325X", "MI325X"),
    (r"MI300X", "MI300X"),
)


@dataclass(frozen=True)
class ProfileChoices:
    """What the user chose rather than what was measured."""

    name: str | None = None
    gpu: str | None = None  # catalog name; default detected on CUDA, CPU_DEFAULT_GPU on CPU
    intra_kind: str | None = None  # nvlink|pcie|xgmi; default nvlink on CUDA, pcie on CPU
    inter_kind: str | None = None  # infiniband|roce|ethernet; default infiniband on CUDA, ethernet on CPU


def catalog_gpu_name(device_name: str) -> str | None:
    for pattern, name in DEVICE_NAME_PATTERNS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return name
    return None


def catalog_gpu(name: str) -> dict | None:
    """The catalog entry as a plain mapping, or None when the catalog does not know the name."""
    try:
        from planner.catalog import resolve_gpu

        return resolve_gpu(name).model_dump(mode="json", exclude_none=True)
    except (ImportError, ValueError):
        return None


def gpu_entry(raw: dict, choices: ProfileChoices, flags: list[str]) -> str | dict:
    if not raw["compute"]:
        flags.append("gpu figures are the catalog's, not measured (CPU run)")
        return choices.gpu or CPU_DEFAULT_GPU
    first = raw["compute"][0]
    name = choices.gpu or catalog_gpu_name(first["device_name"])
    achievable = {
        dtype: rounded(units.flops_per_s_to_tflops(min(c["matmul_flop_per_s"][dtype] for c in raw["compute"])))
        for dtype in ("bf16", "fp16")
    }
    entry = catalog_gpu(name) if name else None
    if entry is None:
        flags.append(f"GPU {first['device_name']!r} not in the catalog: peaks unknown, HBM bandwidth is the measured copy rate")
        memory_gib = rounded(units.bytes_to_gib(first["memory_bytes"]))
        hbm_gb_per_s = rounded(units.bytes_per_s_to_gb_per_s(first["hbm_copy_bytes_per_s"]))
        entry = {"name": first["device_name"], "memory_gib": memory_gib, "hbm_bandwidth_gb_per_s": hbm_gb_per_s,
                 "peak_tflops": dict.fromkeys(("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4"))}
    entry["achievable_matmul_tflops"] = achievable
    return entry


def _link_numbers(fit: AlphaBetaFit, rows: list[ResultRow], key: tuple, flags: list[str], label: str) -> tuple[float, float]:
    """(bandwidth bytes/s per rank, latency seconds per step) with positive fallbacks when the fit degenerates."""
    bandwidth_bytes_per_s = fit.bandwidth_bytes_per_s
    if bandwidth_bytes_per_s is None:
        bandwidth_bytes_per_s = max(r.busbw_bytes_per_s for r in rows if (r.op, r.link, r.mode) == key)
        flags.append(f"{label}: sweep never left the latency regime; bandwidth is the best measured busbw")
    latency_seconds = fit.alpha_seconds
    if latency_seconds <= 0.0:
        latency_seconds = min(r.median_seconds for r in rows if (r.op, r.link, r.mode) == key)
        flags.append(f"{label}: latency below timing resolution; latency is the smallest measured time (upper bound)")
    if fit.rms_relative_residual > POOR_FIT_RELATIVE_RESIDUAL:
        flags.append(f"{label}: poor alpha-beta fit (rms relative residual {fit.rms_relative_residual:.0%})")
    return bandwidth_bytes_per_s, latency_seconds


def intra_link(fits: dict, rows: list[ResultRow], kind: str, flags: list[str]) -> dict | None:
    if "intra_node_all_reduce" not in fits:
        return None
    _, fit = fits["intra_node_all_reduce"]
    key = ("all_reduce", "intra_node", ALL_RANKS)
    bandwidth_bytes_per_s, latency_seconds = _link_numbers(fit, rows, key, flags, "intra_node")
    return {"kind": kind, "bandwidth_gb_per_s": rounded(units.bytes_per_s_to_gb_per_s(bandwidth_bytes_per_s)),
            "latency_us": rounded(units.seconds_to_us(latency_seconds))}


def inter_link(fits: dict, rows: list[ResultRow], kind: str, num_nics: int, local_size: int, flags: list[str]) -> dict | None:
    mode = ALL_RANKS if "inter_node_all_reduce" in fits else ONE_RANK_PER_NODE
    name = "inter_node_all_reduce" if mode == ALL_RANKS else "inter_node_all_reduce_one_rank_per_node"
    if name not in fits:
        return None
    _, fit = fits[name]
    per_rank_bytes_per_s, latency_seconds = _link_numbers(fit, rows, ("all_reduce", "inter_node", mode), flags, "inter_node")
    if mode == ALL_RANKS:
        node_bytes_per_s = local_size * per_rank_bytes_per_s
        flags.append(f"inter_node bandwidth = sum over {local_size} local ranks running concurrent inter-node all-reduces")
    else:
        node_bytes_per_s = per_rank_bytes_per_s
        flags.append("inter_node bandwidth is a lower bound: only one rank per node crossed the network")
    nic_gbit_per_s = node_bytes_per_s * units.BITS_PER_BYTE / units.BITS_PER_GBIT / num_nics
    return {"kind": kind, "num_nics_per_node": num_nics, "nic_bandwidth_gbit_per_s": rounded(nic_gbit_per_s),
            "latency_us": rounded(units.seconds_to_us(latency_seconds)), "basis": mode}
