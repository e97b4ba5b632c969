"""Pipeline schedules as timelines: per stage, the blocks of work in time order.

Legend: p stages (devices), m micro-batches (serving: k batches in flight), v model
chunks per device (interleaved), t_f / t_b forward / backward time of one micro-batch
on one stage (a chunk takes t_f/v, t_b/v), h the delay of one boundary send.
Every schedule is built the same way: each device runs its own ordered list of
operations, and an operation starts when its device is free and its input (the
previous stage's output, or the next stage's gradient) has arrived. Sources: Huang
et al. 2019 (GPipe: all forwards, then all backwards in reverse order); Narayanan et
al. 2021 sec. 2.2 (PipeDream-Flush 1F1B: p-s-1 warm-up forwards, then one forward one
backward; interleaved: groups of N micro-batches through every chunk, N = p where p divides m
(Megatron's --microbatch-group-size-per-virtual-pipeline-stage), warm-up (p-s-1)*2 + (v-1)*N);
vLLM's pipeline engine for serving (each stage runs the batches
in flight in turn; a batch's next token starts when its sampled token is back at
stage 0). Worked example (docs/cost-model.md#pipeline-bubble): 4 stages, 1 micro-batch -> 4 units, each device
busy 1; 4 micro-batches -> 7 units, each busy 4, device d starts at unit d.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.cost.pipeline import microbatch_group_size

Kind = Literal["forward", "backward", "decode"]
SCHEDULES = ("gpipe", "1f1b", "interleaved")
MAX_TIMELINE_BLOCKS = 32_768
"""Blocks one drawn schedule may have (2 p m v for training, p k rounds for decode): the
simulation and the chart cost ~10 us a block, and past this a 120-column chart shows
phases, not blocks."""
MAX_TIMELINE_STAGES = 128
"""Stages (rows) a chart draws."""


def num_blocks(p: int, m: int, v: int, backward: bool = True) -> int:
    """Blocks a training schedule draws: a forward (and a backward) per stage, micro-batch
    and chunk."""
    return p * m * v * (2 if backward else 1)


def drawable_micro_batches(schedule: str, p: int, m: int, v: int) -> int | None:
    """The most micro-batches (at most m) a chart of this schedule can draw within
    MAX_TIMELINE_BLOCKS, a multiple of p for interleaved (Megatron's rule); None when not
    even the fewest fit (too many stages)."""
    if p > MAX_TIMELINE_STAGES:
        return None
    most = min(m, MAX_TIMELINE_BLOCKS // num_blocks(p, 1, v))
    if schedule == "interleaved":
        most -= most % p
    return most if most >= 1 else None


@dataclass(frozen=True)
class Block:
    """One operation on one stage: [start, end) in the timeline's time unit."""

    start: float
    end: float
    kind: Kind
    micro_batch: int
    """0-based micro-batch (serving: batch in flight) index."""
    chunk: int = 0
    """Model chunk on this device (interleaved), else 0."""
    step: int = 0
    """Serving: the decode round (token) this block belongs to, else 0."""


@dataclass(frozen=True)
class Timeline:
    schedule: str
    """gpipe | 1f1b | interleaved | decode."""
    num_stages: int
    num_micro_batches: int
    num_virtual_stages: int
    time_unit: str
    """What 1.0 means: "unit" (one stage's forward of one micro-batch) or "s" (seconds)."""
    stages: tuple[tuple[Block, ...], ...]
    """stages[s]: the blocks of stage s, in start order."""

    @property
    def span(self) -> float:
        return max(b.end for row in self.stages for b in row)

    def busy(self, stage: int) -> float:
        return sum(b.end - b.start for b in self.stages[stage])

    @property
    def idle_fraction(self) -> float:
        """Share of device-time idle over the span: 1 - sum(busy) / (p * span)."""
        total = sum(self.busy(s) for s in range(self.num_stages))
        return 1 - total / (self.num_stages * self.span)


@dataclass(frozen=True)
class _Op:
    """An operation of the schedule: which block, and which block must finish first."""

    stage: int
    kind: Kind
    micro_batch: int
    chunk: int
    step: int
    seconds: float
    after: tuple | None
    """Key (stage, kind, micro_batch, chunk, step) of the op it waits for, or None."""
    delay: float
    """Transfer time between that op's end and this op's start."""

    @property
    def key(self) -> tuple:
        return (self.stage, self.kind, self.micro_batch, self.chunk, self.step)


def simulate(ops_per_stage: list[list[_Op]]) -> tuple[tuple[Block, ...], ...]:
    """List scheduling: each stage runs its ops in order; start = max(stage free, input
    ready + delay). Repeats passes until every op is placed (the schedules here are
    deadlock-free; a stall is our bug)."""
    ends: dict[tuple, float] = {}
    rows: list[list[Block]] = [[] for _ in ops_per_stage]
    cursor = [0] * len(ops_per_stage)
    free = [0.0] * len(ops_per_stage)
    remaining = sum(len(ops) for ops in ops_per_stage)
    while remaining:
        progressed = False
        for s, ops in enumerate(ops_per_stage):
            while cursor[s] < len(ops):
                op = ops[cursor[s]]
                if op.after is not None and op.after not in ends:
                    break
                ready = 0.0 if op.after is None else ends[op.after] + op.delay
                start = max(free[s], ready)
                free[s] = ends[op.key] = start + op.seconds
                rows[s].append(Block(start, free[s], op.kind, op.micro_batch, op.chunk, op.step))
                cursor[s] += 1
                remaining -= 1
                progressed = True
        assert progressed, "pipeline schedule deadlocked"
    return tuple(tuple(row) for row in rows)


def _forward_op(s: int, mb: int, chunk: int, p: int, seconds: float, hop: float) -> _Op:
    """Forward of (mb, chunk) on device s waits for the previous virtual stage."""
    if s > 0:
        after = (s - 1, "forward", mb, chunk, 0)
    elif chunk > 0:
        after = (p - 1, "forward", mb, chunk - 1, 0)
    else:
        return _Op(s, "forward", mb, chunk, 0, seconds, None, 0.0)
    return _Op(s, "forward", mb, chunk, 0, seconds, after, hop)


def _backward_op(s: int, mb: int, chunk: int, p: int, v: int, seconds: float, hop: float) -> _Op:
    """Backward of (mb, chunk) on device s waits for the next virtual stage's gradient,
    and the very last virtual stage waits for its own forward."""
    if s < p - 1:
        return _Op(s, "backward", mb, chunk, 0, seconds, (s + 1, "backward", mb, chunk, 0), hop)
    if chunk < v - 1:
        return _Op(s, "backward", mb, chunk, 0, seconds, (0, "backward", mb, chunk + 1, 0), hop)
    return _Op(s, "backward", mb, chunk, 0, seconds, (s, "forward", mb, chunk, 0), 0.0)


def _check(p: int, m: int, v: int, schedule: str) -> None:
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"stages, micro-batches and virtual stages must be >= 1 (got {p}, {m}, {v})")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: {schedule!r}: expected one of {', '.join(SCHEDULES)}")
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"{schedule}: virtual stages must be 1 (got {v})")
    if schedule == "interleaved" and m < p:
        raise ValueError(f"interleaved: needs at least as many micro-batches ({m}) as stages ({p}) (Megatron)")


def gpipe_order(s: int, p: int, m: int, forward: float, backward: float, hop: float) -> list[_Op]:
    """All m forwards, then (if backward > 0) the m backwards, last micro-batch first."""
    ops = [_forward_op(s, mb, 0, p, forward, hop) for mb in range(m)]
    if backward > 0:
        ops += [_backward_op(s, mb, 0, p, 1, backward, hop) for mb in reversed(range(m))]
    return ops


def one_f_one_b_order(s: int, p: int, m: int, forward: float, backward: float, hop: float) -> list[_Op]:
    """PipeDream-Flush: min(p-s-1, m) warm-up forwards, then F/B pairs, then the rest of B."""
    warmup = min(p - s - 1, m)
    forwards = [_forward_op(s, mb, 0, p, forward, hop) for mb in range(m)]
    backwards = [_backward_op(s, mb, 0, p, 1, backward, hop) for mb in range(m)]
    ops = forwards[:warmup]
    for i in range(m - warmup):
        ops += [forwards[warmup + i], backwards[i]]
    return ops + backwards[m - warmup:]


def interleaved_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """Megatron's order of (micro-batch, chunk) for the interleaved schedule: groups of `group`
    micro-batches (--microbatch-group-size-per-virtual-pipeline-stage, N), each group through
    every chunk in turn, the last group whatever is left (get_schedule_table,
    megatron/core/pipeline_parallel/schedules.py core_v0.19.0). N = p: micro-batch k // (p*v) *
    p + k % p on chunk (k // p) % v. The backward runs the same table with the chunks counted
    from the last."""
    table = []
    for first in range(0, m, group):
        members = range(first, min(first + group, m))
        table += [(mb, chunk) for chunk in range(v) for mb in members]
    return table


def interleaved_order(s: int, p: int, m: int, v: int, forward: float, backward: float,
                      hop: float) -> list[_Op]:
    """Megatron interleaved 1F1B: warm-up (p-s-1)*2 + (v-1)*N chunk forwards (capped at m*v;
    N the micro-batch group, pipeline.microbatch_group_size: p when p divides m), then one chunk
    forward and one chunk backward, then the remaining backwards."""
    total = m * v
    group = microbatch_group_size(p, m)
    warmup = min((p - s - 1) * 2 + (v - 1) * group, total)
    table = interleaved_table(m, v, group)
    fw = [_forward_op(s, mb, chunk, p, forward / v, hop) for mb, chunk in table]
    bw = [_backward_op(s, mb, v - 1 - chunk, p, v, backward / v, hop) for mb, chunk in table]
    ops = fw[:warmup]
    for i in range(total - warmup):
        ops += [fw[warmup + i], bw[i]]
    return ops + bw[total - warmup:]


def training_timeline(schedule: str, num_stages: int, num_micro_batches: int,
                      num_virtual_stages: int = 1, forward_units: float = 1.0,
                      backward_units: float = 2.0, hop_units: float = 0.0,
                      time_unit: str = "unit") -> Timeline:
    """The step of a training pipeline schedule. backward_units = 0 draws forwards only
    (gpipe only: 1F1B needs backwards to interleave). Defaults: t_b = 2 t_f (the backward
    does twice the forward's matmul FLOPs), sends free."""
    p, m, v = num_stages, num_micro_batches, num_virtual_stages
    _check(p, m, v, schedule)
    if backward_units <= 0 and schedule != "gpipe":
        raise ValueError(f"{schedule}: needs backward passes (backward_units > 0)")
    if schedule == "gpipe":
        ops = [gpipe_order(s, p, m, forward_units, backward_units, hop_units) for s in range(p)]
    elif schedule == "1f1b":
        ops = [one_f_one_b_order(s, p, m, forward_units, backward_units, hop_units) for s in range(p)]
    else:
        ops = [interleaved_order(s, p, m, v, forward_units, backward_units, hop_units) for s in range(p)]
    return Timeline(schedule, p, m, v, time_unit, simulate(ops))


def decode_timeline(stage_seconds: tuple[float, ...], num_in_flight: int, hop_seconds: float,
                    num_rounds: int = 2) -> Timeline:
    """Serving decode with k batches in flight over p stages, num_rounds tokens each.
    Stage s runs batches 0..k-1 in turn; batch b's token r enters stage s after stage s-1
    (+h), and stage 0 after the last stage finished token r-1 (+h: the sampled token goes
    back). Steady round = max(k * t_slowest, sum_s (t_s + h)): the serving model's TPOT."""
    p, k = len(stage_seconds), num_in_flight
    if p < 1 or k < 1 or num_rounds < 1:
        raise ValueError(f"stages, batches in flight and rounds must be >= 1 (got {p}, {k}, {num_rounds})")
    ops: list[list[_Op]] = [[] for _ in range(p)]
    for r in range(num_rounds):
        for b in range(k):
            for s in range(p):
                if s > 0:
                    after, delay = (s - 1, "decode", b, 0, r), hop_seconds
                elif r > 0:
                    after, delay = (p - 1, "decode", b, 0, r - 1), hop_seconds if p > 1 else 0.0
                else:
                    after, delay = None, 0.0
                ops[s].append(_Op(s, "decode", b, 0, r, stage_seconds[s], after, delay))
    return Timeline("decode", p, k, 1, "s", simulate(ops))
