"""torchrun entry point: ``python -m torch.distributed.run ... -m planner.probe.worker``.

Every rank discovers which node it is on, builds the same process groups in
the same order, then walks the same schedule of phases. Rank 0 prints
progress lines (``PROGRESS_PREFIX done total label``) that the launcher
parses, gathers every rank's timings and writes the raw results as JSON. Every
rank prints a marker before and after each timed point (planner.probe.hang), so
the launcher can name the collective a hung rank was in.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time
import warnings
from dataclasses import dataclass, field

from planner.probe import lifeline

TORCHRUN_PID = os.getppid()  # read before the slow torch import: torchrun may die during it

warnings.filterwarnings(
    "ignore", message="Failed to initialize NumPy"
)  # torch without numpy is fine here

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

from planner.probe import hang, measure, timing  # noqa: E402
from planner.probe.sweep import (  # noqa: E402
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    OPS,
    REDUCE_SCATTER,
    SEND_RECV,
    parse_collectives,
    size_sweep,
)

PROGRESS_PREFIX = "@@plan-probe-progress"
INTRA_NODE, INTER_NODE, WORLD = "intra_node", "inter_node", "world"
ALL_RANKS, ONE_RANK_PER_NODE, TP_GROUPS = "all_local_ranks", "one_rank_per_node", "tp_groups"
GROUP_CURVE_OPS = (ALL_REDUCE, ALL_TO_ALL, ALL_GATHER, REDUCE_SCATTER)
"""What the TP-, EP-shaped groups (consecutive ranks) are timed with: the curves the planner reads
for TP all-reduces, Megatron's EP all-to-alls and vLLM's EP all-gather and reduce-scatter."""
TEST_HANG_ENV = "_PLAN_PROBE_TEST_HANG"
"""Tests only: "RANK:OP:SIZE_BYTES" makes that rank sleep TEST_HANG_SECONDS before that point
(every group it is in), a synthetic hang the launcher must name."""
TEST_HANG_SECONDS = 3600.0


@dataclass
class Group:
    ranks: list[int]
    handle: dist.ProcessGroup | None  # None: the default (world) group


@dataclass
class Phase:
    """One op over one link class; its groups are disjoint and run concurrently."""

    op: str
    link: str
    mode: str
    groups: list[Group]
    participants: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.participants = {rank for group in self.groups for rank in group.ranks}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="planner.probe.worker")
    parser.add_argument("--result-path", required=True)
    parser.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    parser.add_argument("--min-bytes", type=int, required=True)
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--step-factor", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--node-id-from", choices=["group-rank", "hostname"], default="group-rank")
    parser.add_argument(
        "--collectives", type=parse_collectives, default=OPS, help="comma list of ops to time"
    )
    parser.add_argument(
        "--skip-compute", action="store_true", help="skip the CUDA matmul/HBM measurements"
    )
    return parser.parse_args(argv)


def all_gather_json(value, device: torch.device) -> list:
    """all_gather of a JSON-able value as bytes (the *_object collectives need numpy, which we do not)."""
    data = json.dumps(value).encode()
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(dist.get_world_size())]
    dist.all_gather(lengths, length)
    max_length = max(int(n.item()) for n in lengths)
    padded = torch.zeros(max_length, dtype=torch.uint8, device=device)
    padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    everyone = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(everyone, padded)
    return [
        json.loads(bytes(t[: int(n.item())].tolist()))
        for t, n in zip(everyone, lengths, strict=True)
    ]


def node_identity(node_id_from: str) -> str:
    """GROUP_RANK (torchrun's node index; lets loopback agents count as nodes) or the hostname."""
    if node_id_from == "hostname":
        return socket.gethostname()
    return os.environ["GROUP_RANK"]


def discover_nodes(node_id_from: str, device: torch.device) -> tuple[list[list[int]], list[str]]:
    """Global ranks per node (nodes ordered by their lowest rank, ranks by local rank) and hostnames."""
    mine = (
        node_identity(node_id_from),
        int(os.environ["LOCAL_RANK"]),
        dist.get_rank(),
        socket.gethostname(),
    )
    everyone = all_gather_json(mine, device)
    by_node: dict[str, list[tuple[int, int]]] = {}
    hostname_by_node: dict[str, str] = {}
    for node_id, local_rank, rank, hostname in everyone:
        by_node.setdefault(node_id, []).append((local_rank, rank))
        hostname_by_node[node_id] = hostname
    ordered = sorted(by_node, key=lambda node_id: min(rank for _, rank in by_node[node_id]))
    nodes = [[rank for _, rank in sorted(by_node[node_id])] for node_id in ordered]
    if len({len(node) for node in nodes}) != 1:
        raise ValueError(f"nodes have different numbers of ranks: {[len(n) for n in nodes]}")
    return nodes, [hostname_by_node[node_id] for node_id in ordered]


def divisors_from_2(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def tp_groups(nodes: list[list[int]], size: int) -> list[list[int]]:
    """Every group of `size` consecutive ranks in node order: the TP groups of tp=size."""
    order = [rank for node in nodes for rank in node]
    return [order[k : k + size] for k in range(0, len(order), size)]


def build_phases(nodes: list[list[int]], collectives: tuple[str, ...] = OPS) -> list[Phase]:
    """Create every group (all ranks, same order) and the schedule that uses them.

    Besides the link measurements, every TP size the planner can pick gets an all-reduce
    phase with all its groups at once, as TP runs: inside a node the divisors of the node's
    ranks below it (the whole node is the intra-node phase), across nodes whole-node
    multiples (the whole world is the world phase). All-to-all runs right after every
    all-reduce phase, over the same groups. Only the ops in collectives are scheduled, and
    a group no scheduled op uses is never created.
    """
    num_nodes, local_size = len(nodes), len(nodes[0])
    phases: list[Phase] = []

    def add(ops, link: str, mode: str, groups) -> list[Group]:
        """Phases of the chosen ops over groups (rank lists are made into new groups)."""
        chosen = [op for op in ops if op in collectives]
        if chosen and groups and not isinstance(groups[0], Group):
            groups = [Group(ranks, dist.new_group(ranks)) for ranks in groups]
        phases.extend(Phase(op, link, mode, groups) for op in chosen)
        return groups

    if local_size >= 2:
        add((ALL_REDUCE, ALL_TO_ALL, ALL_GATHER, REDUCE_SCATTER), INTRA_NODE, ALL_RANKS, nodes)
        pairs = [node[k : k + 2] for node in nodes for k in range(0, local_size - 1, 2)]
        add((SEND_RECV,), INTRA_NODE, ALL_RANKS, pairs)
        for size in divisors_from_2(local_size)[:-1]:
            add(GROUP_CURVE_OPS, INTRA_NODE, TP_GROUPS, tp_groups(nodes, size))
    if num_nodes >= 2:
        mode = ALL_RANKS if local_size > 1 else ONE_RANK_PER_NODE
        inter = [[node[j] for node in nodes] for j in range(local_size)]
        inter = add((ALL_REDUCE, ALL_TO_ALL), INTER_NODE, mode, inter)
        if local_size > 1:
            add((ALL_REDUCE, ALL_TO_ALL), INTER_NODE, ONE_RANK_PER_NODE, inter[:1])
        add((ALL_GATHER, REDUCE_SCATTER), INTER_NODE, mode, inter)
        pairs = [[nodes[i][0], nodes[i + 1][0]] for i in range(0, num_nodes - 1, 2)]
        add((SEND_RECV,), INTER_NODE, ONE_RANK_PER_NODE, pairs)
        if local_size > 1:  # every local rank's NIC (rail) at once: a slow NIC shows as its pair
            rails = [
                [nodes[i][j], nodes[i + 1][j]]
                for i in range(0, num_nodes - 1, 2)
                for j in range(local_size)
            ]
            add((SEND_RECV,), INTER_NODE, ALL_RANKS, rails)
        for num_nodes_per_group in divisors_from_2(num_nodes)[:-1]:
            groups = tp_groups(nodes, num_nodes_per_group * local_size)
            add(GROUP_CURVE_OPS, INTER_NODE, TP_GROUPS, groups)
    if num_nodes >= 2 and local_size >= 2:
        world = [Group(list(range(dist.get_world_size())), None)]
        add(GROUP_CURVE_OPS, WORLD, ALL_RANKS, world)
    return phases


class Progress:
    def __init__(self, total_steps: int) -> None:
        self.total_steps, self.done_steps = total_steps, 0

    def step(self, label: str) -> None:
        self.done_steps += 1
        if dist.get_rank() == 0:
            emit_line(f"{PROGRESS_PREFIX} {self.done_steps} {self.total_steps} {label}")


def run_phase(
    phase: Phase, phase_index: int, sizes_bytes: list[int], args, device, progress
) -> list[dict]:
    """This rank's timings for every size of one phase (empty if it is not a participant)."""
    rows = []
    world_sync = measure.group_sync(None, device)
    mine = [(i, g) for i, g in enumerate(phase.groups) if dist.get_rank() in g.ranks]
    everyone_in = len(phase.participants) == dist.get_world_size()
    for size_bytes in sizes_bytes:
        try:
            rows += time_point(
                phase, phase_index, mine, everyone_in, world_sync, size_bytes, args, device
            )
        except torch.cuda.OutOfMemoryError:
            raise RuntimeError(
                f"CUDA out of memory in {phase.link} {phase.op} at {size_bytes} B: lower --max-bytes"
            ) from None
        progress.step(f"{phase.link} {phase.op} {size_bytes} B")
    world_sync()
    return rows


def time_point(phase, phase_index, mine, everyone_in, world_sync, size_bytes, args, device):
    """This rank's timings of one size of one phase, in each of its groups."""
    rows = []
    for group_index, group in mine:
        point = hang.Point(phase.op, phase.link, tuple(group.ranks), size_bytes)
        emit_line(hang.start_line(point, dist.get_rank(), socket.gethostname()))
        hang_if_asked(point)
        step, seconds_factor = measure.collective_step(
            phase.op, group.handle, group.ranks, size_bytes, device
        )
        sync = world_sync if everyone_in else measure.group_sync(group.handle, device)
        host_seconds = measure.time_repeats(
            step, sync, device, args.warmup, args.iterations, args.repeats
        )
        row = dict(
            phase=phase_index,
            group=group_index,
            size_bytes=size_bytes,
            rank=dist.get_rank(),
            repeat_seconds=[s * seconds_factor for s in host_seconds],
        )
        if device.type == "cuda":  # events are the figure; the host clock the cross-check
            event_seconds = measure.time_repeats_events(
                step, sync, device, args.iterations, args.repeats
            )
            row["repeat_seconds"] = [s * seconds_factor for s in event_seconds]
            row["host_repeat_seconds"] = [s * seconds_factor for s in host_seconds]
        rows.append(row)
        emit_line(hang.end_line(dist.get_rank()))
    return rows


def emit_line(text: str) -> None:
    """One line to the launcher in a single write(2) on stdout. The ranks of a node share
    torchrun's pipe, and print(..., flush=True) was seen to let two ranks' lines interleave
    ("...}@@plan-probe-point start ..." on one line, so neither marker parsed: about half the
    runs of the synthetic-hang test). A write of at most PIPE_BUF (4,096) bytes to a pipe is
    atomic (POSIX write(2)); these lines are a few hundred bytes."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (text + "\n").encode())


def hang_if_asked(point: hang.Point) -> None:
    """The synthetic hang of TEST_HANG_ENV, when it names this rank and point."""
    asked = os.environ.get(TEST_HANG_ENV)
    if asked and asked == f"{dist.get_rank()}:{point.op}:{point.size_bytes}":
        time.sleep(TEST_HANG_SECONDS)


def measure_compute(device: torch.device) -> dict:
    """Achievable bf16/fp16 matmul (FLOP/s) and HBM copy bandwidth (bytes/s) on this rank's GPU."""
    return dict(
        rank=dist.get_rank(),
        device_name=torch.cuda.get_device_name(device),
        memory_bytes=torch.cuda.get_device_properties(device).total_memory,
        matmul_flop_per_s={
            "bf16": measure.matmul_flop_per_s(device, torch.bfloat16, 8192, 20),
            "fp16": measure.matmul_flop_per_s(device, torch.float16, 8192, 20),
        },
        hbm_copy_bytes_per_s=measure.copy_bandwidth_bytes_per_s(device, 1 << 30, 20),
    )


def setup(args) -> tuple[str, torch.device, bool]:
    """Backend, device for communication buffers, and whether a GPU is present for compute figures."""
    has_cuda = torch.cuda.is_available()
    backend = args.backend if args.backend != "auto" else ("nccl" if has_cuda else "gloo")
    if has_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    comm_device = (
        torch.device("cuda", torch.cuda.current_device())
        if backend == "nccl"
        else torch.device("cpu")
    )
    # gloo keeps the run's timeout (the launcher's deadline reports a hung CPU rank); NCCL's
    # is well inside it so the hung collective's own error ends the run
    timeout_s = (
        timing.collective_timeout_seconds(args.timeout_s) if backend == "nccl" else args.timeout_s
    )
    dist.init_process_group(
        backend,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=comm_device if backend == "nccl" else None,
    )
    return backend, comm_device, has_cuda


def write_json_atomically(path: str, payload: dict) -> None:
    temporary_path = f"{path}.tmp{os.getpid()}"
    with open(temporary_path, "w") as handle:
        json.dump(payload, handle)
    os.replace(temporary_path, path)


def run_all(args, backend: str, comm_device: torch.device, has_cuda: bool) -> None:
    nodes, hostnames = discover_nodes(args.node_id_from, comm_device)
    phases = build_phases(nodes, args.collectives)
    sizes_bytes = size_sweep(args.min_bytes, args.max_bytes, args.step_factor)
    do_compute = has_cuda and not args.skip_compute
    progress = Progress(len(phases) * len(sizes_bytes) + int(do_compute))
    compute = []
    if do_compute:
        compute = [measure_compute(torch.device("cuda", torch.cuda.current_device()))]
        progress.step("matmul and HBM")
    rows = []
    for phase_index, phase in enumerate(phases):
        rows += run_phase(phase, phase_index, sizes_bytes, args, comm_device, progress)
    gathered = all_gather_json((rows, compute), comm_device)
    if dist.get_rank() == 0:
        write_json_atomically(
            args.result_path,
            dict(
                backend=backend,
                device=comm_device.type,
                **versions(backend),
                world_size=dist.get_world_size(),
                nodes=nodes,
                hostnames=hostnames,
                node_id_from=args.node_id_from,
                collectives=list(args.collectives),
                sizes_bytes=sizes_bytes,
                warmup=args.warmup,
                iterations=args.iterations,
                repeats=args.repeats,
                phases=[
                    dict(op=p.op, link=p.link, mode=p.mode, groups=[g.ranks for g in p.groups])
                    for p in phases
                ],
                rows=[row for rank_rows, _ in gathered for row in rank_rows],
                compute=[c for _, rank_compute in gathered for c in rank_compute],
            ),
        )


def versions(backend: str) -> dict:
    """torch, NCCL, CUDA runtime and driver versions and the NCCL_* environment of rank 0."""
    nccl = backend == "nccl"
    return dict(
        torch_version=torch.__version__.split("+")[0],
        nccl_version=".".join(map(str, torch.cuda.nccl.version())) if nccl else None,
        cuda_version=torch.version.cuda if nccl else None,
        cuda_driver_version=cuda_driver_version() if nccl else None,
        nccl_env={k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
    )


def cuda_driver_version() -> str | None:
    """cuDriverGetVersion through the driver library torch already loaded, e.g. 12080 -> '12.8'."""
    try:
        import ctypes

        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except OSError:
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun sets for each worker (torch.distributed.run); without it init_process_group
raised a traceback at a user who ran the worker line by hand (a critical read)."""


def missing_torchrun_env() -> list[str]:
    return [name for name in TORCHRUN_ENV if not os.environ.get(name)]


@record
def main(argv: list[str] | None = None) -> None:
    missing = missing_torchrun_env()
    if missing:
        print(f"plan probe: the worker runs under torchrun (missing {', '.join(missing)}): run `plan probe` (with --nnodes > 1 "
              f"it prints each node's command, or runs this node's part with --run)", file=sys.stderr)
        raise SystemExit(2)
    lifeline.watch_parent(TORCHRUN_PID)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    backend, comm_device, has_cuda = setup(args)
    try:
        run_all(args, backend, comm_device, has_cuda)
    finally:  # every process group, the subgroups included, even when a phase failed
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
