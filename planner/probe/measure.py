"""Timed loops around collectives, point-to-point transfers, matmul and HBM copies.

Runs inside torchrun (imports torch). Protocol for every point: warm up, then
per repeat: synchronize the participants, start the clock, run the op
``iterations`` times, wait for the device (cuda synchronize), stop the clock.
On CUDA each repeat is also timed with events behind a device-side wait
(``time_repeats_events``); the arithmetic lives in planner/probe/timing.py.
Each repeat yields seconds per op on this rank; the worker later takes the
slowest rank of the group per repeat and the median over repeats.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from planner import units
from planner.probe import timing
from planner.probe.sweep import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    REDUCE_SCATTER,
    SEND_RECV,
    num_elements,
)

FLOP_PER_MULTIPLY_ADD = 2


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def group_sync(group: dist.ProcessGroup | None, device: torch.device) -> Callable[[], None]:
    """A barrier made of a one-element all-reduce: works on gloo and nccl subgroups alike."""
    token = torch.zeros(1, device=device)

    def sync() -> None:
        dist.all_reduce(token, group=group)
        synchronize(device)

    return sync


def collective_step(
    op: str,
    group: dist.ProcessGroup | None,
    ranks: list[int],
    size_bytes: int,
    device: torch.device,
) -> tuple[Callable[[], None], float]:
    """(callable doing one op on this rank, factor turning per-call seconds into per-op seconds).

    Buffers hold zeros so repeated sums never overflow. send/recv is a
    ping-pong between ranks[0] and ranks[1]; one call is a round trip, so
    the one-way time is half of it. all-to-all is ``all_to_all_single`` with even splits:
    size_bytes is each rank's whole input buffer (the 1/n chunk it keeps included) and
    as much output; gloo (CPU) supports it as NCCL does (checked on torch 2.13).
    """
    num_ranks = len(ranks)
    count = num_elements(size_bytes, num_ranks)
    if op == ALL_REDUCE:
        buffer = torch.zeros(count, device=device)
        return lambda: dist.all_reduce(buffer, group=group), 1.0
    if op == ALL_GATHER:
        shard = torch.zeros(count // num_ranks, device=device)
        output = torch.empty(count, device=device)
        return lambda: dist.all_gather_into_tensor(output, shard, group=group), 1.0
    if op == REDUCE_SCATTER:
        full = torch.zeros(count, device=device)
        output = torch.empty(count // num_ranks, device=device)
        return lambda: dist.reduce_scatter_tensor(output, full, group=group), 1.0
    if op == ALL_TO_ALL:
        sent = torch.zeros(count, device=device)
        received = torch.empty(count, device=device)
        return lambda: dist.all_to_all_single(received, sent, group=group), 1.0
    if op == SEND_RECV:
        return _ping_pong(ranks, count, device), 0.5
    raise ValueError(f"unknown op {op!r}")


def _ping_pong(ranks: list[int], count: int, device: torch.device) -> Callable[[], None]:
    buffer = torch.zeros(count, device=device)
    first, second = ranks
    if dist.get_rank() == first:

        def step() -> None:
            dist.send(buffer, second)
            dist.recv(buffer, second)
    else:

        def step() -> None:
            dist.recv(buffer, first)
            dist.send(buffer, first)

    return step


def warm_up(step: Callable[[], None], device: torch.device, warmup: int) -> None:
    for _ in range(warmup):
        step()
    synchronize(device)


def time_repeats(
    step: Callable[[], None],
    sync: Callable[[], None],
    device: torch.device,
    warmup: int,
    iterations: int,
    repeats: int,
) -> list[float]:
    """Seconds per call for each repeat on the host clock (warm-up excluded)."""
    warm_up(step, device, warmup)
    return timing.host_repeats(
        step, sync, lambda: synchronize(device), time.perf_counter, iterations, repeats
    )


def time_repeats_events(
    step: Callable[[], None],
    sync: Callable[[], None],
    device: torch.device,
    iterations: int,
    repeats: int,
) -> list[float]:
    """Seconds per call for each repeat from CUDA events behind a device-side busy-wait
    (planner/probe/timing.py): the host enqueues every op while the stream spins, so the
    events see the device's work without launch overhead. Warm-up is the caller's."""
    clock_rate_hz = units.khz_to_hz(torch.cuda.get_device_properties(device).clock_rate)
    cycles = timing.busy_wait_cycles(iterations, clock_rate_hz)
    seconds_per_repeat = []
    for _ in range(repeats):
        sync()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        start.record()
        for _ in range(iterations):
            step()
        end.record()
        end.synchronize()
        seconds_per_repeat.append(
            timing.seconds_per_op_from_event_ms(start.elapsed_time(end), iterations)
        )
    return seconds_per_repeat


def matmul_flop_per_s(device: torch.device, dtype: torch.dtype, dim: int, iterations: int) -> float:
    """Achieved dense matmul rate: 2 * dim^3 FLOP per (dim x dim) @ (dim x dim), median of 3 repeats."""
    a = torch.randn(dim, dim, device=device, dtype=dtype)
    b = torch.randn(dim, dim, device=device, dtype=dtype)
    seconds = time_repeats(
        lambda: torch.mm(a, b), lambda: synchronize(device), device, 3, iterations, 3
    )
    return FLOP_PER_MULTIPLY_ADD * dim**3 / sorted(seconds)[1]


def copy_bandwidth_bytes_per_s(device: torch.device, size_bytes: int, iterations: int) -> float:
    """Device-to-device copy rate counting read + write (2 * size per copy), median of 3 repeats."""
    source = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = time_repeats(
        lambda: target.copy_(source), lambda: synchronize(device), device, 2, iterations, 3
    )
    return 2 * size_bytes / sorted(seconds)[1]
