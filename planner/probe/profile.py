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

import copy
import datetime
import math
import os
import re
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from planner import units
from planner.cost.efficiency import DECODE_HBM_UTILIZATION
from planner.probe.fit import AlphaBetaFit, exceeds_spec
from planner.probe.results import (
    ALL_RANKS,
    ONE_RANK_PER_NODE,
    POOR_FIT_RELATIVE_RESIDUAL,
    ResultRow,
    curve,
    curves_section,
    find_outliers,
    fits_section,
    results_section,
    rounded,
)
from planner.probe.sweep import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    OPS,
    REDUCE_SCATTER,
    SEND_RECV,
    op_coefficients,
)

CPU_DEFAULT_GPU = "A100-SXM4-80GB"
NEW_FILE_MODE = 0o666  # open()'s mode for a new file, before the umask
# torch.cuda.get_device_name() -> catalog name; first match wins, so specific before generic.
# None: a known device the catalog has no figures for (measured figures, never a sibling's).
DEVICE_NAME_PATTERNS: tuple[tuple[str, str | None], ...] = (
    (r"GB200", "GB200"),
    (r"B200", "B200-SXM-180GB"),
    (r"GH200", "GH200"),
    (r"H200.*NVL", "H200-NVL-141GB"),
    (r"H200", "H200-SXM-141GB"),
    (r"\bH20\b", "H20"),
    (r"H800.*PCI", None),  # "NVIDIA H800 PCIe": HBM bandwidth unconfirmed, not in the catalog
    (r"H800", "H800-SXM5-80GB"),  # "NVIDIA H800"
    (r"A800.*40GB", "A800-PCIE-40GB"),
    (r"A800.*PCI", "A800-PCIE-80GB"),  # "NVIDIA A800 80GB PCIe"
    (r"A800", "A800-SXM4-80GB"),  # "NVIDIA A800-SXM4-80GB"
    (r"H100.*NVL", "H100-NVL-94GB"),
    (r"H100.*PCI", "H100-PCIE-80GB"),
    (r"H100", "H100-SXM5-80GB"),
    (r"A100.*(PCI.*40GB|40GB.*PCI)", None),  # "NVIDIA A100-PCIE-40GB": 1,555 GB/s, not in the catalog
    (r"A100.*PCI", "A100-PCIE-80GB"),
    (r"A100.*40GB", "A100-SXM4-40GB"),
    (r"A100", "A100-SXM4-80GB"),
    (r"L40S", "L40S"),
    (r"\bL40\b", "L40"),
    (r"RTX 6000 Ada", "RTX-6000-Ada"),
    (r"\bL4\b", "L4"),
    (r"A10G", "A10G"),
    (r"4090 D", None),  # the China-market part: fewer cores, other tensor rates
    (r"4090", "RTX-4090"),
    (r"3090 Ti", None),  # 1008 GB/s and other clocks: not the RTX 3090's figures
    (r"3090", "RTX-3090"),
    (r"5090 D", None),  # the China-market part: other tensor rates
    (r"5090", "RTX-5090"),
    (r"RTX A6000", "RTX-A6000"),
    (r"\bA40\b", "A40"),
    (r"RTX PRO 6000.*(Max-Q|Server)", None),  # other clocks (Max-Q) or bandwidth (Server Edition)
    (r"RTX PRO 6000", "RTX-PRO-6000"),
    (r"MI325X", "MI325X"),
    (r"MI300X", "MI300X"),
)


@dataclass(frozen=True)
class ProfileChoices:
    """What the user chose rather than what was measured."""

    name: str | None = None
    gpu: str | None = None  # catalog name; default detected on CUDA, CPU_DEFAULT_GPU on CPU
    intra_kind: str | None = None  # nvlink|pcie|xgmi; default on CUDA the catalog GPU's typical fabric (nvlink if unknown), pcie on CPU
    inter_kind: str | None = (
        None  # infiniband|roce|ethernet; default infiniband on CUDA, ethernet on CPU
    )


MEMORY_MATCH_FRACTION = 0.1
"""A detected GPU takes its catalog entry only where the measured memory is within this share of
the entry's (the CUDA-visible total sits a little under the datasheet's)."""


def catalog_gpu_name(device_name: str) -> str | None:
    return next(
        (name for pattern, name in DEVICE_NAME_PATTERNS if re.search(pattern, device_name, re.IGNORECASE)),
        None,
    )


def catalog_gpu(name: str) -> dict | None:
    """The catalog entry as a plain mapping, or None when the catalog does not know the name."""
    try:
        from planner.catalog import resolve_gpu

        return resolve_gpu(name).model_dump(mode="json", exclude_none=True)
    except (ImportError, ValueError):
        return None


def hbm_peak_equivalent(copy_bytes_per_s: float) -> float:
    """The datasheet-like HBM figure for a GPU known only by its measured copy rate.

    The planner derates a GPU's HBM bandwidth by DECODE_HBM_UTILIZATION (what decode
    reaches of the datasheet figure); a copy rate is already achieved, so it is stored
    as copy / DECODE_HBM_UTILIZATION and the planner's derating gives the measured rate
    back, instead of derating it a second time."""
    return copy_bytes_per_s / DECODE_HBM_UTILIZATION


def canonical_gpu_name(name: str | None) -> str | None:
    """--gpu as the catalog names it (`h100` -> H100-SXM5-80GB, what `plan gpus` lists; it had been
    written as given: a critical read); a name the catalog lacks stays (the checks refused it)."""
    if name is None:
        return None
    from planner.catalog import resolve_gpu
    from planner.errors import SpecError

    try:
        return resolve_gpu(name).name
    except SpecError:
        return name


def gpu_entry(raw: dict, choices: ProfileChoices, flags: list[str]) -> str | dict:
    chosen = canonical_gpu_name(choices.gpu)
    if not raw["compute"]:
        flags.append("gpu figures are the catalog's, not measured (CPU run)")
        return chosen or CPU_DEFAULT_GPU
    first = raw["compute"][0]
    name = chosen or catalog_gpu_name(first["device_name"])
    achievable = {
        dtype: rounded(
            units.flops_per_s_to_tflops(min(c["matmul_flop_per_s"][dtype] for c in raw["compute"]))
        )
        for dtype in ("bf16", "fp16")
    }
    entry = catalog_gpu(name) if name else None
    if entry is not None and not choices.gpu and abs(
            units.gib_to_bytes(entry["memory_gib"]) - first["memory_bytes"]) > MEMORY_MATCH_FRACTION * first["memory_bytes"]:
        # a name pattern is a guess; the memory is measured: an 80 GB entry for a 40 GB card
        # would plan twice its memory
        flags.append(f"GPU {first['device_name']!r}: measured {units.bytes_to_gib(first['memory_bytes']):.1f} GiB, "
                     f"not the catalog's {name} ({entry['memory_gib']} GiB): measured figures used")
        entry = None
    if entry is None:
        flags.append(
            f"GPU {first['device_name']!r} not in the catalog: peaks unknown, HBM bandwidth from "
            "the measured copy rate (measured.hbm_bandwidth_basis)"
        )
        memory_gib = rounded(units.bytes_to_gib(first["memory_bytes"]))
        hbm_gb_per_s = rounded(
            units.bytes_per_s_to_gb_per_s(hbm_peak_equivalent(first["hbm_copy_bytes_per_s"]))
        )
        entry = {
            "name": first["device_name"],
            "memory_gib": memory_gib,
            "hbm_bandwidth_gb_per_s": hbm_gb_per_s,
            "peak_tflops": dict.fromkeys(("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")),
        }
    entry["achievable_matmul_tflops"] = achievable
    return entry


def _link_numbers(
    fit: AlphaBetaFit, rows: list[ResultRow], key: tuple, flags: list[str], label: str
) -> tuple[float, float]:
    """(bandwidth bytes/s per rank, latency seconds per step) with positive fallbacks when the fit degenerates."""
    bandwidth_bytes_per_s = fit.bandwidth_bytes_per_s
    if bandwidth_bytes_per_s is None:
        bandwidth_bytes_per_s = max(
            r.busbw_bytes_per_s for r in rows if (r.op, r.link, r.mode) == key
        )
        largest = max(r.size_bytes for r in rows if (r.op, r.link, r.mode) == key)
        flags.append(
            f"{label}: sweep never left the latency regime (its largest message, {largest:,} B, is mostly "
            f"latency); bandwidth is the best measured busbw, a lower bound: raise --max-bytes"
        )
    latency_seconds = fit.alpha_seconds
    if latency_seconds <= 0.0:
        latency_seconds = min(r.median_seconds for r in rows if (r.op, r.link, r.mode) == key)
        flags.append(
            f"{label}: latency below timing resolution; latency is the smallest measured time (upper bound)"
        )
    if fit.rms_relative_residual > POOR_FIT_RELATIVE_RESIDUAL:
        flags.append(
            f"{label} all_reduce: poor alpha-beta fit (rms relative residual {fit.rms_relative_residual:.0%})"
        )
        if fit.bandwidth_bytes_per_s is not None:
            # as a poor send fit (p2p_fields): not above the bandwidth that gives the largest
            # message's slowest group its measured time beside the fitted latency (a flat-then-jump
            # inter-node curve had written a NIC figure far above the measured one: a review)
            largest_bytes = max(r.size_bytes for r in rows if (r.op, r.link, r.mode) == key)
            slowest = max((r for r in rows if (r.op, r.link, r.mode) == key and r.size_bytes == largest_bytes),
                          key=lambda r: r.median_seconds)
            achieved_bytes_per_s = capped_bandwidth(ALL_REDUCE, len(slowest.ranks), largest_bytes,
                                                    slowest.median_seconds, latency_seconds)
            if achieved_bytes_per_s < bandwidth_bytes_per_s:
                bandwidth_bytes_per_s = achieved_bytes_per_s
                flags.append(f"{label} all_reduce: poor fit; its bandwidth is the one that, beside the fitted "
                             f"latency, gives its largest message ({largest_bytes:,} B) its measured time, "
                             f"{units.bytes_per_s_to_gb_per_s(achieved_bytes_per_s):.4g} GB/s")
    return bandwidth_bytes_per_s, latency_seconds


def capped_bandwidth(op: str, num_ranks: int, size_bytes: float, measured_seconds: float,
                     alpha_seconds: float) -> float:
    """The bandwidth a poor fit is capped at: the beta with which the op's alpha-beta time
    (fit.py's models), at the fitted alpha, equals the time measured at the largest message,
    beta = factor S / (T - steps alpha); inf (no cap) where the fitted latency alone takes that
    long, as no bandwidth then reproduces T (a cap of factor S / T had priced it over 2 T, a
    review). (The busbw itself, latency included, beside the fitted alpha had priced that very
    message steps x alpha over its measured time: 4 gloo ranks at 4 MiB, 16.0 ms against 12.0
    measured, a critical read.)"""
    steps, factor = op_coefficients(op, num_ranks)
    transfer_seconds = measured_seconds - steps * alpha_seconds
    if transfer_seconds <= 0.0:
        return math.inf
    return factor * size_bytes / transfer_seconds


FIT_SCOPES = ("intra_node", "inter_node", "world")


def flag_every_poor_fit(fits: dict, flags: list[str]) -> None:
    """A poor fit of any series the profile keeps (measured.fits) is flagged, as docs/probe.md
    says, where no flag names it yet: the world_* and all-to-all series at 33-48% went unflagged
    (a critical read). Labelled as the others, `intra_node all_gather`, `world all_reduce`."""
    for name, (_, fit) in fits.items():
        if fit.rms_relative_residual <= POOR_FIT_RELATIVE_RESIDUAL:
            continue
        scope = next((s for s in FIT_SCOPES if name.startswith(f"{s}_")), None)
        label = name if scope is None else f"{scope} {name[len(scope) + 1:]}"
        # the link figures' flags name a one-rank-per-node series by its op alone (a review)
        base = label.removesuffix(f"_{ONE_RANK_PER_NODE}")
        if not any(flag.startswith((f"{label}:", f"{base}:")) for flag in flags):
            flags.append(f"{label}: poor alpha-beta fit (rms relative residual {fit.rms_relative_residual:.0%})")


def collective_rates(fits: dict, link: str, suffix: str) -> dict[str, float]:
    """op -> the bandwidth of that op's own alpha-beta fit on this link (ops that left the latency regime)."""
    rates = {}
    for op in OPS:
        name = f"{link}_{op}{suffix}"
        if name in fits and fits[name][1].bandwidth_bytes_per_s is not None:
            rates[op] = fits[name][1].bandwidth_bytes_per_s
    return rates


def ring_link_rate(
    rates: dict[str, float], allreduce_bytes_per_s: float, label: str, flags: list[str]
) -> float:
    """The link's bandwidth for every collective the planner prices from it: the all-reduce
    fit, unless it beats the ring rate that all-gather and reduce-scatter reach (the slower
    of the two). A ring all-reduce is a reduce-scatter then an all-gather, so its busbw
    cannot beat theirs; above it, NCCL ran NVLS or a tree (nccl-tests doc/PERFORMANCE.md).
    That all-reduce figure is kept (the measured curves, the fits) and labelled, not fed to
    the other collectives."""
    ring = [rates[op] for op in (ALL_GATHER, REDUCE_SCATTER) if op in rates]
    if not ring or not exceeds_spec(allreduce_bytes_per_s, min(ring)):
        return allreduce_bytes_per_s
    flags.append(
        f"{label}: all_reduce {units.bytes_per_s_to_gb_per_s(allreduce_bytes_per_s):.4g} GB/s "
        f"beats the ring rate {units.bytes_per_s_to_gb_per_s(min(ring)):.4g} GB/s of "
        "all_gather/reduce_scatter (NVLS or tree): kept for all-reduce (curves, fits), "
        "the link bandwidth is the ring rate"
    )
    return min(ring)


def bandwidths_section(fits: dict, nccl: bool, flags: list[str] | None = None) -> dict:
    """link -> op -> GB/s, each op from its own fit (inter-node: the all-local-ranks mode when
    measured, else one rank per node; per rank, like the fits). `flags`: a poor fit of an op
    other than all-reduce (whose fit _link_numbers flags) is added there too, since its figure
    is in the profile (all-gather and reduce-scatter fits at 41-46% went unflagged; found by a
    CLI sweep)."""
    section = {}
    for link in ("intra_node", "inter_node"):
        for suffix in ("", f"_{ONE_RANK_PER_NODE}"):
            rates = collective_rates(fits, link, suffix)
            if rates and link not in section:
                for op in rates:
                    fit = fits[f"{link}_{op}{suffix}"][1]
                    if flags is not None and op != ALL_REDUCE and fit.rms_relative_residual > POOR_FIT_RELATIVE_RESIDUAL:
                        flags.append(f"{link} {op}: poor alpha-beta fit (rms relative residual "
                                     f"{fit.rms_relative_residual:.0%})")
                section[link] = {
                    op: rounded(units.bytes_per_s_to_gb_per_s(rate)) for op, rate in rates.items()
                }
                if (
                    nccl
                    and ALL_REDUCE in rates
                    and any(
                        exceeds_spec(rates[ALL_REDUCE], rates[op])
                        for op in (ALL_GATHER, REDUCE_SCATTER)
                        if op in rates
                    )
                ):
                    section[link]["all_reduce_algorithm"] = "above ring rate (NVLS/tree)"
    return section


def intra_link(
    fits: dict, rows: list[ResultRow], kind: str, flags: list[str], nccl: bool
) -> dict | None:
    if "intra_node_all_reduce" not in fits:
        return None
    _, fit = fits["intra_node_all_reduce"]
    key = ("all_reduce", "intra_node", ALL_RANKS)
    bandwidth_bytes_per_s, latency_seconds = _link_numbers(fit, rows, key, flags, "intra_node")
    bandwidth_bytes_per_s = ring_link_rate(
        collective_rates(fits, "intra_node", "") if nccl else {},
        bandwidth_bytes_per_s,
        "intra_node",
        flags,
    )
    return {
        "kind": kind,
        "bandwidth_gb_per_s": rounded(units.bytes_per_s_to_gb_per_s(bandwidth_bytes_per_s)),
        "latency_us": rounded(units.seconds_to_us(latency_seconds)),
        **p2p_fields(fits, "intra_node", "", "p2p_bandwidth_gb_per_s", rows=rows, flags=flags),
    }


P2P_KEYS = ("p2p_bandwidth_gb_per_s", "p2p_bandwidth_gb_per_s_per_gpu", "p2p_latency_us")


def p2p_fields(fits: dict, link: str, suffix: str, bandwidth_key: str, ranks_sharing: int = 1,
               rows: list[ResultRow] | None = None, flags: list[str] | None = None) -> dict:
    """The link's send/recv fit as the profile's p2p figures (what a pipeline send costs:
    comm.p2p_seconds), where it resolved a bandwidth and a latency; `ranks_sharing`: the ranks
    whose concurrent sends the measured rate is shared by (one rank per node measured, every
    local rank sending at a pipeline boundary). {} otherwise. A poor fit (rms relative residual
    over POOR_FIT_RELATIVE_RESIDUAL) is not taken above the bandwidth that gives its largest
    message its measured time beside the fitted latency (capped_bandwidth): flat 35 us sends to
    128 KiB and then 2,009 us at 1 MiB had fitted 4.07 GB/s, pricing a 1 MiB send at 294 us (a
    critical read); `rows` give that message, `flags` say so."""
    entry = fits.get(f"{link}_send_recv{suffix}")
    if entry is None:
        return {}
    num_ranks, fit = entry
    if fit.bandwidth_bytes_per_s is None or fit.alpha_seconds <= 0.0:
        return {}
    bandwidth_bytes_per_s = fit.bandwidth_bytes_per_s
    if rows is not None and fit.rms_relative_residual > POOR_FIT_RELATIVE_RESIDUAL:
        mode = ALL_RANKS if not suffix else ONE_RANK_PER_NODE
        points = curve(rows, ("send_recv", link, mode, num_ranks))
        if points:
            largest_bytes = max(points)
            achieved_bytes_per_s = capped_bandwidth(SEND_RECV, num_ranks, largest_bytes, points[largest_bytes],
                                                    fit.alpha_seconds)
            if achieved_bytes_per_s < bandwidth_bytes_per_s:
                bandwidth_bytes_per_s = achieved_bytes_per_s
                if flags is not None:
                    shared = "" if ranks_sharing == 1 else f" over the {ranks_sharing} ranks that share it"
                    flags.append(f"{link} send_recv: poor fit; p2p bandwidth is the one that, beside the fitted "
                                 f"latency, gives its largest message ({largest_bytes:,} B) its measured "
                                 f"time{shared}, "
                                 f"{units.bytes_per_s_to_gb_per_s(achieved_bytes_per_s / ranks_sharing):.4g} GB/s, "
                                 f"not the "
                                 f"fit's {units.bytes_per_s_to_gb_per_s(fit.bandwidth_bytes_per_s / ranks_sharing):.4g}")
    return {bandwidth_key: rounded(units.bytes_per_s_to_gb_per_s(bandwidth_bytes_per_s / ranks_sharing)),
            "p2p_latency_us": rounded(units.seconds_to_us(fit.alpha_seconds))}


def inter_link(
    fits: dict,
    rows: list[ResultRow],
    kind: str,
    num_nics: int,
    local_size: int,
    flags: list[str],
    nccl: bool,
) -> dict | None:
    mode = ALL_RANKS if "inter_node_all_reduce" in fits else ONE_RANK_PER_NODE
    name = (
        "inter_node_all_reduce" if mode == ALL_RANKS else "inter_node_all_reduce_one_rank_per_node"
    )
    if name not in fits:
        return None
    _, fit = fits[name]
    per_rank_bytes_per_s, latency_seconds = _link_numbers(
        fit, rows, ("all_reduce", "inter_node", mode), flags, "inter_node"
    )
    suffix = "" if mode == ALL_RANKS else f"_{ONE_RANK_PER_NODE}"
    per_rank_bytes_per_s = ring_link_rate(
        collective_rates(fits, "inter_node", suffix) if nccl else {},
        per_rank_bytes_per_s,
        "inter_node",
        flags,
    )
    if mode == ALL_RANKS:
        node_bytes_per_s = local_size * per_rank_bytes_per_s
        flags.append(
            f"inter_node bandwidth = sum over {local_size} local ranks running concurrent inter-node all-reduces"
        )
    else:
        node_bytes_per_s = per_rank_bytes_per_s
        flags.append(
            "inter_node bandwidth is a lower bound: only one rank per node crossed the network"
        )
    nic_gbit_per_s = node_bytes_per_s * units.BITS_PER_BYTE / units.BITS_PER_GBIT / num_nics
    return {
        "kind": kind,
        "num_nics_per_node": num_nics,
        "nic_bandwidth_gbit_per_s": rounded(nic_gbit_per_s),
        "latency_us": rounded(units.seconds_to_us(latency_seconds)),
        # every local rank sending at once (a pipeline boundary's TP ranks): measured so, else
        # the one rank's rate shared by the node's ranks
        **(p2p_fields(fits, "inter_node", "", "p2p_bandwidth_gb_per_s_per_gpu", rows=rows, flags=flags)
           or p2p_fields(fits, "inter_node", f"_{ONE_RANK_PER_NODE}", "p2p_bandwidth_gb_per_s_per_gpu",
                         local_size, rows=rows, flags=flags)),
    }


def declared_link_flags(rows: list[ResultRow], inter: dict | None, declared: dict) -> list[str]:
    """Flag measured bandwidth above the declared link (tree/NVLS/SHARP effects or a wrong spec).

    Intra-node: the best busbw of any intra-node all-reduce point; inter-node: the per-node figure.
    """
    flags = []
    declared_intra, declared_inter = declared.get("intra_node"), declared.get("inter_node")
    intra_busbw = [
        r.busbw_bytes_per_s for r in rows if (r.op, r.link) == ("all_reduce", "intra_node")
    ]
    if intra_busbw and declared_intra:
        best_gb_per_s = units.bytes_per_s_to_gb_per_s(max(intra_busbw))
        if exceeds_spec(best_gb_per_s, declared_intra["bandwidth_gb_per_s"]):
            flags.append(
                f"intra_node busbw {best_gb_per_s:.4g} GB/s exceeds the declared "
                f"{declared_intra['bandwidth_gb_per_s']} GB/s (tree/NVLS effects?): check before trusting it"
            )
    if inter and declared_inter:
        measured_gbit = inter["num_nics_per_node"] * inter["nic_bandwidth_gbit_per_s"]
        declared_gbit = (
            declared_inter["num_nics_per_node"] * declared_inter["nic_bandwidth_gbit_per_s"]
        )
        if exceeds_spec(measured_gbit, declared_gbit):
            flags.append(
                f"inter_node {measured_gbit:.4g} Gbit/s per node exceeds the declared {declared_gbit:.4g} "
                "Gbit/s (tree/SHARP effects?): check before trusting it"
            )
    return flags


def build_profile(
    raw: dict,
    rows: list[ResultRow],
    fits: dict,
    choices: ProfileChoices,
    declared: dict | None = None,
    extra_flags: tuple[str, ...] = (),
) -> dict:
    """The hardware profile document (schema of planner.specs.ClusterSpec)."""
    declared = declared or {}
    nodes, on_cuda = raw["nodes"], raw["device"] == "cuda"
    num_nodes, local_size = len(nodes), len(nodes[0])
    flags = list(extra_flags)
    if not on_cuda:
        flags.append(
            f"loopback/CPU measurement with {raw['backend']}: link figures describe host networking, not a GPU fabric"
        )
    if num_nodes > 1 and len(set(raw["hostnames"])) == 1:
        flags.append(
            f"all {num_nodes} nodes share hostname {raw['hostnames'][0]}: inter_node is loopback, not a network"
        )
    document = {
        "name": choices.name or f"measured-{num_nodes}x{local_size}-{raw['backend']}",
        "num_nodes": num_nodes,
        "gpus_per_node": local_size,
        "gpu": gpu_entry(raw, choices, flags),
    }
    # on CUDA the node's fabric is the catalog GPU's typical one (PCIe for the L40S and the GeForce
    # cards), NVLink for a GPU the catalog does not know; --intra-kind overrides either
    typical = document["gpu"].get("intra_node", {}).get("kind") if isinstance(document["gpu"], dict) else None
    # NVLS and tree are NCCL's: gloo's all-reduce simply uses other algorithms than its
    # all-gather and reduce-scatter, so only NCCL's all-reduce is held to the ring rate
    nccl = raw["backend"] == "nccl"
    intra_kind = choices.intra_kind or ((typical or "nvlink") if on_cuda else "pcie")
    intra = intra_link(fits, rows, intra_kind, flags, nccl)
    num_nics = (declared.get("inter_node") or {}).get("num_nics_per_node", 1)
    inter_kind = choices.inter_kind or ("infiniband" if on_cuda else "ethernet")
    inter = inter_link(fits, rows, inter_kind, num_nics, local_size, flags, nccl)
    flags += declared_link_flags(rows, inter, declared)
    outliers = find_outliers(rows, raw["hostnames"], nodes)
    flags += [o.describe() for o in outliers]
    if intra:
        document["intra_node"] = intra
    if inter:
        document["inter_node"] = inter
    document["measured"] = measured_section(raw, rows, fits, flags, inter)
    flag_every_poor_fit(fits, document["measured"]["flags"])
    document["measured"]["outliers"] = [
        asdict(o) | {"fraction_of_median": rounded(o.fraction_of_median, 3)} for o in outliers
    ]
    return document


def measured_section(
    raw: dict, rows: list[ResultRow], fits: dict, flags: list[str], inter: dict | None
) -> dict:
    section = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tool": "plan probe",
        "backend": raw["backend"],
        "torch_version": raw["torch_version"],
        "nccl_version": raw["nccl_version"],
        "cuda_version": raw.get("cuda_version"),
        "cuda_driver_version": raw.get("cuda_driver_version"),
        "nccl_env": raw.get("nccl_env", {}),
        "device": raw["device"],
        "hostnames": raw["hostnames"],
        "sizes_bytes": raw["sizes_bytes"],
        "timing": {
            "warmup": raw["warmup"],
            "iterations": raw["iterations"],
            "repeats": raw["repeats"],
            "statistic": "median over repeats of the slowest rank of the group",
        },
        "flags": flags,
        "collectives": raw.get("collectives", list(OPS)),
        "allreduce_curves": curves_section(rows, raw["nodes"], ALL_REDUCE),
        "alltoall_curves": curves_section(rows, raw["nodes"], ALL_TO_ALL),
        "allgather_curves": curves_section(rows, raw["nodes"], ALL_GATHER),
        "reduce_scatter_curves": curves_section(rows, raw["nodes"], REDUCE_SCATTER),
        "fits": fits_section(fits),
        "bandwidth_gb_per_s_by_op": bandwidths_section(fits, raw["backend"] == "nccl", flags),
    }
    if inter:
        section["inter_node_basis"] = (
            "all_local_ranks" if "inter_node_all_reduce" in fits else "one_rank_per_node"
        )
    if raw["compute"]:
        section["matmul_tflops"] = {
            dtype: rounded(
                units.flops_per_s_to_tflops(
                    min(c["matmul_flop_per_s"][dtype] for c in raw["compute"])
                )
            )
            for dtype in ("bf16", "fp16")
        }
        section["hbm_bandwidth_gb_per_s"] = rounded(
            units.bytes_per_s_to_gb_per_s(min(c["hbm_copy_bytes_per_s"] for c in raw["compute"]))
        )
        section["hbm_bandwidth_basis"] = (
            "hbm_bandwidth_gb_per_s here is the slowest rank's measured copy rate (read + write); "
            "a GPU the catalog lacks gets copy / DECODE_HBM_UTILIZATION as its datasheet-like "
            "figure, so the planner's derating yields the measured rate once"
        )
        section["per_rank_compute"] = raw["compute"]
    section["results"] = results_section(rows)
    return section


def merge_profile(existing: dict, measured: dict) -> tuple[dict, list[str]]:
    """Existing profile with measured link numbers and `measured` section; everything else kept.

    Link kinds and NIC counts of the existing profile are kept; the shape
    (num_nodes, gpus_per_node) and the gpu are kept, with a warning when the
    measured shape differs.
    """
    merged, warnings = dict(existing), []
    for key in ("num_nodes", "gpus_per_node"):
        if key in existing and existing[key] != measured[key]:
            warnings.append(
                f"{key}: profile says {existing[key]}, measured {measured[key]}; kept {existing[key]}"
            )
    for link in ("intra_node", "inter_node"):
        if link in measured:
            updated = dict(existing.get(link) or {})
            kept_kind = updated.get("kind")
            for key in P2P_KEYS:  # an earlier probe's send/recv figures are not this one's
                updated.pop(key, None)
            updated.update(measured[link])
            if kept_kind:
                updated["kind"] = kept_kind
            if link == "inter_node":
                warnings += _scaled_to_declared_ranks(updated, existing, measured)
            merged[link] = updated
    merged["measured"] = copy.deepcopy(measured["measured"])
    replaced = [link for link in ("intra_node", "inter_node") if link in measured]
    if existing.get("source") and replaced:
        # the profile's own source line still said "vendor datasheet ... run plan probe" over the
        # measured links (a critical read): it says which links the probe replaced, once (a review)
        probed = measured["measured"]
        own = re.sub(r" \((?:intra_node|inter_node)[^()]* replaced by plan probe measurements[^()]*\)$", "",
                     str(existing["source"]))
        merged["source"] = (f"{own} ({' and '.join(replaced)} replaced by plan probe measurements, "
                            f"{probed.get('date') or 'undated'}, {probed.get('backend') or 'unknown backend'}; "
                            f"see measured)")
    warnings += keep_unmeasured_curves(existing.get("measured") or {}, merged["measured"])
    merged["measured"]["flags"] = merged["measured"]["flags"] + warnings
    return merged, warnings


def _scaled_to_declared_ranks(inter: dict, existing: dict, measured: dict) -> list[str]:
    """A node's inter-node bandwidth measured with every local rank crossing at once is the sum
    of those ranks' rates; merged into a profile of more GPUs a node, each GPU keeps the rate
    its rank measured (rail-aligned NICs, one a GPU: assumption), so the node's total scales by
    declared / measured ranks. A 2x2 probe merged into 2x8 H100 had given each GPU a quarter of
    what its rank measured (0.31 for 1.245 GB/s: a read). One rank per node: kept (a lower bound
    already, flagged)."""
    declared, ran = existing.get("gpus_per_node"), measured.get("gpus_per_node")
    basis = (measured.get("measured") or {}).get("inter_node_basis")
    if not declared or not ran or declared == ran or basis != "all_local_ranks" or \
            "nic_bandwidth_gbit_per_s" not in inter:
        return []
    inter["nic_bandwidth_gbit_per_s"] = rounded(inter["nic_bandwidth_gbit_per_s"] * declared / ran)
    return [f"inter_node: measured with {ran} ranks a node, scaled to the profile's {declared} "
            f"(each GPU at its rank's measured rate, one NIC rail a GPU assumed)"]


CURVES_BY_OP = {ALL_REDUCE: "allreduce_curves", ALL_TO_ALL: "alltoall_curves", ALL_GATHER: "allgather_curves",
                REDUCE_SCATTER: "reduce_scatter_curves"}


def keep_unmeasured_curves(existing_measured: dict, new_measured: dict) -> list[str]:
    """Curves of a collective this run did not time (--collectives) stay as the profile had
    them, with a note; a timed collective's curves replace the old ones."""
    notes = []
    timed = new_measured.get("collectives", list(OPS))
    for op, key in CURVES_BY_OP.items():
        if op not in timed and existing_measured.get(key):
            new_measured[key] = copy.deepcopy(existing_measured[key])
            notes.append(f"{key}: {op} not timed in this run; kept the profile's earlier curves")
    return notes


def read_profile(path: Path) -> dict:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"{path}: cannot read profile: {error.__class__.__name__}") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a YAML mapping")
    return document


def dump_yaml(document: dict) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=120)


def atomic_write_text(path: Path, text: str) -> None:
    """Temp file in the target's directory, fsync, os.replace: never a half-written file.

    A symlink is followed (the file it points to is replaced). The file keeps the mode
    of the one it replaces, or gets the umask's default for a new file; the temp file
    alone would make it 0600.
    """
    target = path.resolve()
    mode = file_mode_for(target)
    handle = tempfile.NamedTemporaryFile(
        "w",
        dir=target.parent,
        prefix=f".{target.name}.",
        suffix=".tmp",
        delete=False,
        encoding="utf-8",
    )
    try:
        with handle:
            handle.write(text)
            handle.flush()
            os.chmod(handle.name, mode)
            os.fsync(handle.fileno())
        os.replace(handle.name, target)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def file_mode_for(target: Path) -> int:
    """The permission bits of target, or what open() gives a new file under the umask."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        return NEW_FILE_MODE & ~current_umask()


def current_umask() -> int:
    # os.umask only reads the mask by setting it; restored at once (no thread here makes files).
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
