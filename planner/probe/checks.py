"""What `plan probe` checks before it measures: a sweep takes minutes, and a mistake
found after it would lose every result.

Torch-free. Every failure is a ProbeError, one line naming the flag, file and problem.
Three stages, each as early as what it needs allows: the flags alone (`validate`,
also before printing a multi-node command), the files this node writes
(`check_targets`), and the sweep once the device is known (`check_sweep`).
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from planner import units
from planner.probe.runner import ProbeError

if TYPE_CHECKING:
    from planner.probe.launcher import ProbeOptions, SweepDefaults

# Kernel pseudo-filesystems: their files look regular but are not a place for a profile.
PSEUDO_FILESYSTEM_ROOTS = (Path("/proc"), Path("/sys"))
# Buffers of up to --max-bytes a rank holds at once: a reduce-scatter's or an all-to-all's
# input and output, and the previous point's buffers until they are replaced
# (planner.probe.measure).
PEAK_BUFFERS_PER_RANK = 3
MAX_TIMEOUT_S = datetime.timedelta.max.total_seconds()  # what init_process_group accepts
MAX_TCP_PORT = 65535


def validate(options: ProbeOptions) -> None:
    """The flags on their own."""
    _check_topology(options)
    _check_sweep_flags(options)
    _check_collectives(options)
    timeout_s = options.timeout_s
    if not 0 < timeout_s <= MAX_TIMEOUT_S:  # also false for nan
        raise ProbeError(
            f"--timeout must be a positive, finite number of seconds (got {timeout_s})"
        )
    if options.gpu is not None:
        check_gpu_name(options.gpu)


def _check_topology(options: ProbeOptions) -> None:
    if options.nnodes < 1 or (options.nproc_per_node is not None and options.nproc_per_node < 1):
        raise ProbeError("--nnodes and --nproc-per-node must be at least 1")
    if options.nnodes > 1 and not (options.rdzv_endpoint or options.master_addr):
        raise ProbeError(
            "--nnodes > 1 needs --rdzv-endpoint HOST:PORT (or --master-addr for a static rendezvous)"
        )
    if options.rdzv_endpoint and options.master_addr:
        raise ProbeError("give either --rdzv-endpoint or --master-addr, not both")
    if options.master_addr and options.run and options.node_rank is None:
        raise ProbeError("a static rendezvous (--master-addr) needs --node-rank on every node")
    if options.node_rank is not None and not 0 <= options.node_rank < options.nnodes:
        raise ProbeError(f"--node-rank must be in 0..{options.nnodes - 1} (--nnodes {options.nnodes}), "
                         f"got {options.node_rank}")
    if not 1 <= options.master_port <= MAX_TCP_PORT:
        raise ProbeError(f"--master-port must be a TCP port, 1..{MAX_TCP_PORT}, got {options.master_port}")
    if options.rdzv_endpoint:  # HOST or HOST:PORT (torchrun's default port without one); [v6]:PORT
        endpoint = options.rdzv_endpoint
        host, port = split_endpoint(endpoint)
        valid_port = port is None or (re.fullmatch(r"[0-9]{1,5}", port) is not None and 1 <= int(port) <= MAX_TCP_PORT)
        if not host or not valid_port:
            raise ProbeError(f"--rdzv-endpoint must be HOST or HOST:PORT with a port in 1..{MAX_TCP_PORT}, "
                             f"got {endpoint!r}")


def _check_sweep_flags(options: ProbeOptions) -> None:
    from planner.probe.sweep import ELEMENT_BYTES  # deferred: it loads the cost model and the specs

    for flag, value in (("--min-bytes", options.min_bytes), ("--max-bytes", options.max_bytes)):
        if value is not None and value < ELEMENT_BYTES:
            raise ProbeError(f"{flag} must be at least {ELEMENT_BYTES} (one float32), got {value}")
    if (
        options.min_bytes is not None
        and options.max_bytes is not None
        and options.min_bytes > options.max_bytes
    ):
        raise ProbeError("--min-bytes must not exceed --max-bytes")
    if options.step_factor < 2:
        raise ProbeError(f"--step-factor must be at least 2, got {options.step_factor}")
    for flag, value, least in (
        ("--warmup", options.warmup, 0),
        ("--iterations", options.iterations, 1),
        ("--repeats", options.repeats, 1),
    ):
        if value is not None and value < least:
            raise ProbeError(f"{flag} is too small: {value}")


def _check_collectives(options: ProbeOptions) -> None:
    """Known names only; a profile written by --out needs all-reduce, whose fits give its
    link figures (--merge-into keeps the links it does not measure), and so at least two
    processes: one alone measures no link."""
    from planner.probe.sweep import ALL_REDUCE, parse_collectives  # deferred, as above

    writes = "--out" if options.out is not None else "--merge-into" if options.merge_into is not None else None
    if (writes is not None and options.nnodes == 1 and options.nproc_per_node is not None
            and options.nproc_per_node < 2):
        # --merge-into too: it would stamp the profile "measured" (dropping the datasheet links'
        # NCCL derating) with no link measured (a read)
        raise ProbeError(f"--nproc-per-node {options.nproc_per_node}: one process measures no link, so {writes} "
                         "would write a profile without measurements; run at least 2 (or several --nnodes)")
    if options.collectives is None:
        return
    try:
        chosen = parse_collectives(options.collectives)
    except ValueError as error:
        raise ProbeError(f"--collectives {options.collectives}: {error}") from None
    if options.out is not None and ALL_REDUCE not in chosen:
        raise ProbeError(
            f"--collectives {options.collectives}: --out needs {ALL_REDUCE} (the profile's link "
            "figures come from its fit); add it, or use --merge-into on an existing profile"
        )


def check_gpu_name(name: str) -> None:
    """--gpu must be a catalog name: the profile says `gpu: NAME` and `plan` resolves it."""
    from planner.catalog import resolve_gpu
    from planner.errors import SpecError

    try:
        resolve_gpu(name)
    except SpecError as error:
        raise ProbeError(f"--gpu: {error}") from None


def check_rendezvous_host(options: ProbeOptions) -> None:
    """A multi-node run's rendezvous host resolves on this node: torchrun would otherwise
    wait for it until --timeout and say only that a node never joined."""
    flag, endpoint = (("--rdzv-endpoint", options.rdzv_endpoint) if options.rdzv_endpoint
                      else ("--master-addr", options.master_addr))
    if options.nnodes <= 1 or not endpoint:
        return
    host = endpoint if flag == "--master-addr" else split_endpoint(endpoint)[0].removeprefix("[").removesuffix("]")
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as error:  # socket.gaierror is an OSError
        raise ProbeError(f"{flag} {endpoint}: host {host!r} does not resolve on this node "
                         f"({getattr(error, 'strerror', None) or error})") from None


def split_endpoint(endpoint: str) -> tuple[str, str | None]:
    """(HOST, PORT) of HOST:PORT or [v6]:PORT; (HOST, None) of HOST or [v6]."""
    host, colon, port = endpoint.rpartition(":")
    if not colon or endpoint.endswith("]"):
        return endpoint, None
    return host, port


def check_targets(options: ProbeOptions) -> None:
    """--out and --merge-into can be written, and --merge-into loads as `plan --cluster` would."""
    merge_into = options.merge_into
    if merge_into is not None and not merge_into.exists():
        raise ProbeError(f"--merge-into {merge_into}: no such file")
    if merge_into is not None and options.out is not None and \
            os.path.realpath(options.out) == os.path.realpath(merge_into):
        # both would be written to one file, the second over the first (a critical read)
        raise ProbeError(f"--out {options.out}: the same file as --merge-into; give one of them, or another "
                         f"--out for the measured-only profile")
    for flag, path in (("--out", options.out), ("--merge-into", merge_into)):
        if path is not None:
            check_writable_target(flag, path)
    if merge_into is not None:
        check_merge_profile(merge_into)


def check_writable_target(flag: str, path: Path) -> None:
    """What the atomic write at the end needs (planner.probe.profile.atomic_write_text):
    a regular file or none, in a directory where a file can be created and removed."""
    target = path.resolve()  # a symlink is followed: the file it points to is replaced
    if any(target == root or root in target.parents for root in PSEUDO_FILESYSTEM_ROOTS):
        raise ProbeError(
            f"{flag} {path}: {target} is on a kernel pseudo-filesystem; give a file path"
        )
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:
        raise ProbeError(f"{flag} {path}: cannot check it: {error.strerror}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise ProbeError(f"{flag} {path}: is a directory; give a file path")
    if mode is not None and not stat.S_ISREG(mode):
        raise ProbeError(f"{flag} {path}: not a regular file")
    if not target.parent.is_dir():
        raise ProbeError(f"{flag} {path}: directory {target.parent} does not exist")
    try:
        with tempfile.NamedTemporaryFile(
            dir=target.parent, prefix=f".{target.name}.", suffix=".check"
        ):
            pass
    except OSError as error:
        raise ProbeError(
            f"{flag} {path}: cannot create a file in {target.parent}: {error.strerror}"
        ) from None


def check_merge_profile(path: Path) -> None:
    """The profile to merge into must load as `plan --cluster` loads it (wrong link types,
    unknown GPU names, ...): the merge keeps what the measurement does not replace."""
    from planner.catalog import load_cluster
    from planner.errors import SpecError

    try:
        load_cluster(path)
    except SpecError as error:
        raise ProbeError(f"--merge-into {error}") from None


def check_sweep(
    options: ProbeOptions, sweep: SweepDefaults, on_gpu: bool, nproc_per_node: int
) -> None:
    """The sweep with this device's defaults filled in: sizes in order, buffers that fit in
    host memory on CPU runs (a GPU's memory is not known without starting CUDA here)."""
    default = " (the GPU default)" if on_gpu else " (the CPU default)"
    if sweep.min_bytes > sweep.max_bytes:
        max_note = default if options.max_bytes is None else ""
        min_note = default if options.min_bytes is None else ""
        raise ProbeError(
            f"--min-bytes {sweep.min_bytes}{min_note} exceeds --max-bytes {sweep.max_bytes}{max_note}"
        )
    from planner.probe.sweep import size_sweep  # deferred, as above

    writes = "--out" if options.out is not None else "--merge-into" if options.merge_into is not None else None
    if writes and len(size_sweep(sweep.min_bytes, sweep.max_bytes, options.step_factor)) < 2:
        raise ProbeError(
            f"--min-bytes {sweep.min_bytes} .. --max-bytes {sweep.max_bytes} is one message size: {writes} "
            f"fits latency and bandwidth, which one size cannot separate; widen the range"
        )
    memory_bytes = physical_memory_bytes()
    needed_bytes = PEAK_BUFFERS_PER_RANK * sweep.max_bytes * nproc_per_node
    if not on_gpu and memory_bytes is not None and needed_bytes > memory_bytes:
        raise ProbeError(
            f"--max-bytes {sweep.max_bytes}: {nproc_per_node} ranks x {PEAK_BUFFERS_PER_RANK} "
            f"buffers need {units.bytes_to_gib(needed_bytes):.3g} GiB, more than this node's "
            f"{units.bytes_to_gib(memory_bytes):.3g} GiB of memory"
        )


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_gpu_count(nproc_per_node: int | None, num_gpus: int, on_gpu: bool) -> None:
    """One rank per GPU: more ranks than visible GPUs would share devices (NCCL refuses two
    ranks on one GPU, after the launch), so it is refused before torchrun starts."""
    if on_gpu and nproc_per_node is not None and nproc_per_node > num_gpus:
        raise ProbeError(
            f"--nproc-per-node {nproc_per_node} exceeds the {num_gpus} visible GPUs "
            "(CUDA_VISIBLE_DEVICES): one rank per GPU"
        )
