"""Why a training plan's TP group leaves the node: the closest in-node configuration.

When the best configuration that fits has a TP group spanning nodes (every all-reduce of
every layer then crosses the NICs, cost/comm.py), the plan says why: the in-node layout
(TP within one node) that came closest to fitting, at its least memory (full recompute,
sequence parallelism, the smallest micro-batch, the distributed optimizer where dp > 1),
its memory per GPU by component, how far it is over, and what would close the gap.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.training_memory import (
    MEGATRON_STATE_BYTES,
    master_remainders,
    megatron_state_bytes,
)
from planner.cost.training_time import TrainRates
from planner.layout import TrainConfig, groups_cross_nodes
from planner.memo import Memo
from planner.requests import TrainRequest
from planner.specs import ClusterSpec, ModelSpec
from planner.train import (
    TrainEstimate,
    TrainMemory,
    config_reasons,
    expert_imbalance,
    split_memory,
    stage_split_options,
    structural_reasons,
    with_split,
)
from planner.units import bytes_to_gib


@dataclass(frozen=True)
class InNodeShortfall:
    """The in-node configuration with the least memory per GPU, and why it does not fit."""

    config: TrainConfig
    memory: TrainMemory
    """Its worst stage, by component (bytes per GPU)."""
    capacity_per_gpu_bytes: int
    over_bytes: float
    """memory.total_bytes - capacity (> 0)."""
    fixes: tuple[str, ...]
    """What would close the gap, each checked against this configuration's figures."""


def bf16_states_possible(request: TrainRequest) -> bool:
    """Whether --optimizer-states bf16 is an alternative the plan may name: Megatron (torchtitan
    has none), fp32 states asked, and a ZeRO stage the precision-aware optimizer runs in (not a
    pinned --zero 0)."""
    return request.engine == "megatron" and request.optimizer_states == "fp32" and request.zero_stage != 0


def tp_leaves_node(cluster: ClusterSpec, tp: int) -> bool:
    return cluster.num_nodes > 1 and tp > 1 and groups_cross_nodes(tp, cluster.gpus_per_node)


def least_memory_configs(model: ModelSpec, request: TrainRequest, tp: int, pp: int, dp: int,
                         schedules: list[tuple[str, int]], micro_batches: list[int]) -> list[TrainConfig]:
    """The layout's least-memory settings, one per schedule: full recompute, SP when tp > 1,
    the smallest micro-batch, ZeRO-3 (Megatron-FSDP) when dp > 1 and pp = 1, else ZeRO-1 when
    dp > 1 (Megatron-FSDP is planned without PP: train.config_reasons)."""
    if not micro_batches:
        return []
    # one rank: no sharding, though bf16 optimizer states run in the distributed optimizer
    single = 0 if request.optimizer_states == "fp32" else 1
    zero = single if dp == 1 else (3 if pp == 1 else 1)
    configs = [TrainConfig(tp, pp, dp, micro_batches[0], schedule, v, "full", tp > 1, zero,
                           attention=request.attention, precision=request.precision,
                           fp8_recipe=request.resolved_fp8_recipe, grad_reduce=request.grad_reduce,
                           optimizer_states=request.optimizer_states, engine=request.engine)
               for schedule, v in schedules]
    return [c for c in configs if not config_reasons(model, c, request.global_batch)]


def closest_in_node(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, rates: TrainRates,
                    memo: Memo, candidates: list[TrainConfig]) -> InNodeShortfall | None:
    """Of the candidate configurations, the one with the least worst-stage memory."""
    best: tuple[TrainMemory, TrainConfig] | None = None
    imbalance = expert_imbalance(request)
    for given in candidates:
        # every stage split the estimate may run (the fastest that fits): the least memory of them
        splits = stage_split_options(model, cluster, given, request.seq_len, rates, memo, imbalance, request.engine,
                                     request.moe_host_seconds)
        for named in [named for named, _ in splits.ordered()] if splits is not None else [None]:
            config = given if named is None else with_split(given, named)
            m = request.global_batch // (config.micro_batch_size * config.dp)
            memory = split_memory(model, config, request.seq_len, m, memo, imbalance).worst
            if best is None or memory.total_bytes < best[0].total_bytes:
                best = (memory, config)
    if best is None:
        return None
    memory, config = best
    capacity = cluster.gpu.cuda_visible_memory_bytes
    over = memory.total_bytes - capacity
    if over <= 0:
        return None  # it fits: the search rejected it for another reason
    return InNodeShortfall(config, memory, capacity, over,
                           fixes(config, memory, capacity, model if bf16_states_possible(request) else None))


def fixes(config: TrainConfig, memory: TrainMemory, capacity_bytes: int,
          model: ModelSpec | None = None) -> tuple[str, ...]:
    """What would close the gap, from this configuration's own figures (`model`: the bf16
    optimizer states' saving is named for Megatron when given, where the request can run them:
    bf16_states_possible)."""
    c, out = config, []
    states = memory.weights_bytes + memory.gradient_bytes + memory.optimizer_bytes
    rest = memory.activation_bytes + memory.overhead_bytes
    out.append(f"full recompute with sequence parallelism is already on (activations "
               f"{bytes_to_gib(memory.activation_bytes):.1f} GiB); context parallelism (searched from "
               f"8K-token sequences) would split them further")
    if c.dp == 1:
        out.append(f"the distributed optimizer (ZeRO-1) has nothing to shard at dp=1: the optimizer's "
                   f"{bytes_to_gib(memory.optimizer_bytes):.1f} GiB stay whole; sharding it needs dp > 1, "
                   f"i.e. more GPUs")
    elif c.zero_stage >= 3:
        out.append(f"ZeRO-3 (Megatron-FSDP) already shards weights, gradients and optimizer over dp={c.dp}")
    else:
        out.append(f"ZeRO-1 already shards the optimizer over dp={c.dp}; ZeRO-2/3 (Megatron-FSDP) "
                   f"would shard gradients and weights too, but is planned without pipeline parallelism "
                   f"(pp={c.pp})")
    if model is not None and c.optimizer_states == "fp32" and (c.zero_stage >= 1 or c.dp_cp == 1):
        bf16 = c.with_(optimizer_states="bf16", zero_stage=max(1, c.zero_stage))  # the distributed optimizer's
        lean = megatron_state_bytes("bf16", master_remainders(bf16, model)).optimizer
        saved = memory.optimizer_bytes * (1 - lean / MEGATRON_STATE_BYTES.optimizer)
        out.append(f"bf16 optimizer states (--optimizer-states bf16, Megatron's precision-aware optimizer) would "
                   f"free {bytes_to_gib(saved):.1f} GiB of the optimizer's {bytes_to_gib(memory.optimizer_bytes):.1f}")
    if capacity_bytes > rest:
        factor = states / (capacity_bytes - rest)
        out.append(f"more GPUs: the model state ({bytes_to_gib(states):.1f} GiB) shrinks with tp*pp; "
                   f"about {factor:.2f}x the model-parallel GPUs (tp*pp = {c.tp * c.pp}) would fit it")
    return tuple(out)


def in_node_shortfall(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest,
                      best: TrainEstimate | None, rates: TrainRates, memo: Memo,
                      schedules_for, micro_batches_for) -> InNodeShortfall | None:
    """None unless the recommendation's TP leaves the node; else the closest in-node miss.
    `schedules_for(pp)`, `micro_batches_for(dp)`: the search's own option generators."""
    if best is None or not tp_leaves_node(cluster, best.config.tp):
        return None
    num_gpus = best.config.layout.num_gpus
    candidates: list[TrainConfig] = []
    for tp in range(1, num_gpus + 1):
        if num_gpus % tp or tp_leaves_node(cluster, tp):
            continue
        for pp in range(1, num_gpus // tp + 1):
            if (num_gpus // tp) % pp:
                continue
            dp = num_gpus // (tp * pp)
            if request.layout.matches(tp, pp, dp) and not structural_reasons(
                    model, tp, pp, dp, request.global_batch):
                candidates += least_memory_configs(model, request, tp, pp, dp, schedules_for(pp),
                                                   micro_batches_for(dp))
    return closest_in_node(model, cluster, request, rates, memo, candidates)
