"""What `plan probe` takes (ProbeOptions) and its sweep defaults: plain values, apart from
the launcher, so the CLI can declare the command's flags without importing the launcher
(planner/probe/command.py imports that when the command runs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner import units


@dataclass(frozen=True)
class SweepDefaults:
    min_bytes: int
    max_bytes: int
    warmup: int
    iterations: int
    repeats: int


# CPU sweeps stop at 4 MiB so the default two-process gloo run takes seconds, not minutes.
CPU_SWEEP = SweepDefaults(8, 4 * units.BYTES_PER_MIB, 2, 5, 5)
GPU_SWEEP = SweepDefaults(8, 512 * units.BYTES_PER_MIB, 5, 20, 5)
CPU_NPROC_PER_NODE = 2


@dataclass(frozen=True)
class ProbeOptions:
    """Everything `plan probe` takes; None means "detect on this node"."""

    nproc_per_node: int | None = None
    """Ranks on this node; default: visible GPUs, or 2 on CPU."""
    nnodes: int = 1
    """Nodes; above 1 needs --rdzv-endpoint (c10d) or --master-addr (static)."""
    rdzv_endpoint: str | None = None
    """HOST:PORT of the c10d rendezvous (node order follows arrival)."""
    rdzv_id: str = "plan-probe"
    rdzv_conf: str | None = None
    """Passed to torchrun, e.g. join_timeout=900."""
    local_addr: str | None = None
    """This node's address as the others should reach it (torchrun --local-addr)."""
    master_addr: str | None = None
    """Static rendezvous instead of c10d: node 0's address (needs --node-rank)."""
    master_port: int = 29500
    node_rank: int | None = None
    """Static rendezvous only; c10d ignores it."""
    run: bool = False
    """With --nnodes > 1: run this node's command instead of printing every node's."""
    backend: str = "auto"
    """auto (nccl on CUDA, gloo on CPU), nccl or gloo."""
    min_bytes: int | None = None
    max_bytes: int | None = None
    step_factor: int = 4
    """Sizes grow by this factor from min to max bytes."""
    warmup: int | None = None
    iterations: int | None = None
    """Ops per timed repeat."""
    repeats: int | None = None
    """Timed repeats; the median is reported."""
    timeout_s: float = 600.0
    """Whole run, rendezvous included; a hung or dead rank ends it with an error."""
    node_id_from: str = "group-rank"
    """How ranks are grouped into nodes: torchrun's GROUP_RANK or the hostname."""
    out: Path | None = None
    merge_into: Path | None = None
    json_output: bool = False
    gpu: str | None = None
    """Catalog GPU name; default detected on CUDA, A100-SXM4-80GB on CPU (flagged)."""
    intra_kind: str | None = None
    inter_kind: str | None = None
    name: str | None = None
    skip_compute: bool = False
    verbose: bool = False
    collectives: str | None = None
    """Comma list of the collectives to time, names from planner.probe.sweep.OPS; None: all."""
