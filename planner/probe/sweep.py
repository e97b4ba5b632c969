"""Message-size sweeps, nccl-tests bus-bandwidth factors and repeat statistics.

Pure python, no torch. Conventions follow nccl-tests doc/PERFORMANCE.md:
``size_bytes`` is the full buffer of the collective (the all-reduce buffer,
the all-gather output, the reduce-scatter input); algbw = size / time;
busbw = algbw * factor with factor all-reduce 2(n-1)/n, all-gather and
reduce-scatter (n-1)/n, send/recv 1, all-to-all (n-1)/n.

All-to-all (``torch.distributed.all_to_all_single``): ``size_bytes`` is what EACH rank
sends in total, its whole input buffer, including the 1/n chunk that stays local
(nccl-tests alltoall: the size is the per-rank buffer); each rank moves (n-1)/n of it
over the link, so busbw = algbw * (n-1)/n.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from planner.cost.comm import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, SEND_RECV, ring_coefficients

ALL_TO_ALL = "all_to_all"
OPS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, SEND_RECV, ALL_TO_ALL)
"""Every collective the probe can time, in schedule order; `--collectives` picks among them."""

ELEMENT_BYTES = 4  # float32 buffers: every backend reduces them


def op_coefficients(op: str, num_ranks: int) -> tuple[float, float]:
    """(latency steps, volume factor) with T = steps * alpha + factor * S / beta.

    The ring collectives are the cost model's (planner.cost.comm.ring_coefficients).
    All-to-all as pairwise exchange: n-1 steps, each sending S/n to one peer, so
    T = (n-1) * alpha + (n-1)/n * S / beta, S the bytes each rank sends in total
    (nccl-tests doc/PERFORMANCE.md, alltoall: busbw factor (n-1)/n)."""
    if op == ALL_TO_ALL:
        return float(num_ranks - 1), (num_ranks - 1) / num_ranks
    return ring_coefficients(op, num_ranks)


def busbw_factor(op: str, num_ranks: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw * factor (doc/PERFORMANCE.md), the
    volume factor of op_coefficients."""
    return op_coefficients(op, num_ranks)[1]


def parse_collectives(text: str) -> tuple[str, ...]:
    """A comma list of OPS names -> those names in schedule order (ValueError naming an unknown one)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in OPS]
    if unknown or not names:
        what = f"unknown collective {unknown[0]!r}" if unknown else "no collective given"
        raise ValueError(f"{what}; choose from {', '.join(OPS)}")
    return tuple(op for op in OPS if op in names)


def size_sweep(min_bytes: int, max_bytes: int, step_factor: int) -> list[int]:
    """Geometric sweep min, min*f, ... and max itself, rounded down to whole elements."""
    if min_bytes < ELEMENT_BYTES or max_bytes < min_bytes or step_factor < 2:
        raise ValueError(
            f"bad sweep: need {ELEMENT_BYTES} <= min-bytes <= max-bytes and step factor >= 2 "
            f"(got {min_bytes}, {max_bytes}, {step_factor})"
        )
    sizes_bytes = []
    size_bytes = min_bytes
    while size_bytes <= max_bytes:
        sizes_bytes.append(size_bytes - size_bytes % ELEMENT_BYTES)
        size_bytes *= step_factor
    last_bytes = max_bytes - max_bytes % ELEMENT_BYTES
    if sizes_bytes[-1] != last_bytes:
        sizes_bytes.append(last_bytes)
    return sizes_bytes


def num_elements(size_bytes: int, num_ranks: int) -> int:
    """Elements in a buffer of about size_bytes that splits evenly over num_ranks (>= num_ranks)."""
    per_rank = max(1, size_bytes // (ELEMENT_BYTES * num_ranks))
    return per_rank * num_ranks


@dataclass(frozen=True)
class Summary:
    """One (op, group, size) point: per-repeat times are the slowest rank of the group."""

    median_seconds: float
    min_seconds: float
    max_seconds: float
    spread_fraction: float  # (max - min) / median over repeats
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


def summarize(op: str, num_ranks: int, size_bytes: int, repeat_seconds: list[float]) -> Summary:
    """Median over repeats, spread, and nccl-tests algbw / busbw at the median."""
    median_seconds = statistics.median(repeat_seconds)
    algbw_bytes_per_s = size_bytes / median_seconds
    return Summary(
        median_seconds=median_seconds,
        min_seconds=min(repeat_seconds),
        max_seconds=max(repeat_seconds),
        spread_fraction=(max(repeat_seconds) - min(repeat_seconds)) / median_seconds,
        algbw_bytes_per_s=algbw_bytes_per_s,
        busbw_bytes_per_s=algbw_bytes_per_s * busbw_factor(op, num_ranks),
    )
