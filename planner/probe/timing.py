"""Timing arithmetic of the probe, pure python (no torch) so a fake clock can test it.

Two ways to time one repeat of `iterations` ops:

- host: synchronize, read a host clock, launch the ops, synchronize, read it again. Includes
  the host's launch overhead and the synchronize round trip: an upper bound on small messages.
- events (CUDA): the stream first runs a device-side busy-wait long enough for the host to
  enqueue every op behind it, then a start event, the ops, an end event. The events measure
  only the device's work, as nccl-tests does with its CUDA graph / event timing
  (nccl-tests src/common.cu).

Either way a repeat yields seconds per op on one rank; a collective is as slow as its slowest
rank, so per repeat the group's time is the maximum over ranks, and a point is the median
over repeats.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from planner import units

LAUNCH_SECONDS_PER_OP = units.us_to_seconds(20)
"""A generous host-side launch cost per op: the busy-wait covers iterations of them."""
MIN_WAIT_SECONDS = units.ms_to_seconds(1)
FALLBACK_CLOCK_HZ = 2.5 * units.HZ_PER_GHZ
"""Used when the driver reports no SM clock (CUDA 13 dropped cudaDeviceProp.clockRate): above
current datacenter boost clocks, so the wait only grows."""


def seconds_per_op_from_event_ms(elapsed_ms: float, iterations: int) -> float:
    """CUDA's Event.elapsed_time is in milliseconds for the whole repeat."""
    return units.ms_to_seconds(elapsed_ms) / iterations


def busy_wait_cycles(iterations: int, clock_rate_hz: float) -> int:
    """GPU clock cycles of the device-side wait that lets the host enqueue every op of a
    repeat before the first one starts: max(1 ms, iterations x 20 us) at the SM clock."""
    wait_seconds = max(MIN_WAIT_SECONDS, iterations * LAUNCH_SECONDS_PER_OP)
    return math.ceil(wait_seconds * (clock_rate_hz if clock_rate_hz > 0 else FALLBACK_CLOCK_HZ))


def host_repeats(
    step: Callable[[], None],
    sync: Callable[[], None],
    wait_for_device: Callable[[], None],
    clock: Callable[[], float],
    iterations: int,
    repeats: int,
) -> list[float]:
    """Seconds per op of each repeat timed on the host clock (warm-up done by the caller)."""
    seconds_per_repeat = []
    for _ in range(repeats):
        sync()
        start_seconds = clock()
        for _ in range(iterations):
            step()
        wait_for_device()
        seconds_per_repeat.append((clock() - start_seconds) / iterations)
    return seconds_per_repeat


def slowest_rank_per_repeat(seconds_by_rank: list[list[float]]) -> list[float]:
    """Per repeat, the slowest rank of the group: a collective ends when its last rank does."""
    return [max(repeat) for repeat in zip(*seconds_by_rank, strict=True)]


def median_of_slowest(seconds_by_rank: list[list[float]]) -> float:
    return statistics.median(slowest_rank_per_repeat(seconds_by_rank))


def host_overhead_fraction(host_seconds: float, event_seconds: float) -> float:
    """How much longer the host clock saw a point than the device did: host / events - 1."""
    return host_seconds / event_seconds - 1.0


MIN_COLLECTIVE_TIMEOUT_SECONDS = 10.0


def collective_timeout_seconds(run_timeout_seconds: float) -> float:
    """NCCL's per-collective timeout: half the run's (at least 10 s, never more than the run's),
    so a hung collective fails inside the worker, whose error names it, before the launcher's
    deadline ends the run with no cause."""
    return min(run_timeout_seconds, max(MIN_COLLECTIVE_TIMEOUT_SECONDS, run_timeout_seconds / 2))
