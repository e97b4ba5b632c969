"""`plan explain --workload train`: the sections of planner/explain.py for a training
configuration (Megatron-LM semantics, planner/train.py and cost/training_time.py).

Memory: the first stage (embedding, the most micro-batches in flight), with an uneven
split the second (the heaviest middle stage) and the last (LM head, logits), each with its
own layers: train.stage_memories, whose worst is train.memory_per_gpu. Collectives: per layer and
micro-batch, message 2*b*s*h bytes on the TP group, priced by the same group all-reduce
the training model uses; pipeline sends of 2*b*s*h/t bytes, 2*(v*m + p - 1) per step;
the data-parallel gradient reduction once per step (ZeRO-2/3: per micro-batch).
"""

from __future__ import annotations

from dataclasses import replace

from planner import sensitivity
from planner.cost import activations as act
from planner.cost import comm
from planner.cost import efficiency as eff
from planner.cost.comm import curve_seconds
from planner.cost.timeline import training_timeline
from planner.cost.training_memory import stage_params_per_gpu
from planner.cost.training_time import dp_link, layer_seconds
from planner.explain import (
    BreakdownSegment,
    CollectiveRow,
    Explanation,
    MemoryBar,
    MemorySegment,
    Metric,
    TimeBreakdown,
    collective_row,
    placement_map,
    stage_label,
    without_curves,
)
from planner.layout import place
from planner.requests import LayoutFilter, TrainRequest
from planner.serve import tp_allreduce_seconds_per_layer
from planner.specs import ClusterSpec, ModelSpec, SpecError
from planner.train import TrainEstimate, TrainMemory, estimate, stage_layers, train_rates
from planner.train import stage_memories as train_stage_memories
from planner.train_search import check_fixed_batch, resolve_fixed_dp, search

BYTES_PER_ELEMENT = 2
"""16-bit activations and their gradients (what the training model sends)."""


def pick_training(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest) -> tuple[TrainEstimate, bool]:
    """The best configuration matching --layout and the other fixed flags, and whether it
    is also the recommendation without --layout."""
    request = resolve_fixed_dp(request, cluster)
    check_fixed_batch(request)
    plan = search(model, cluster, request)
    if not plan.layouts:
        why = "; ".join(f"tp={r.tp} pp={r.pp} dp={r.dp}: {', '.join(r.reasons[:2])}" for r in plan.rejected[:3])
        raise SpecError(f"plan explain: no feasible layout to explain ({why})")
    best = plan.layouts[0]
    if request.layout == LayoutFilter():
        return best, True
    overall = search(model, cluster, replace(request, layout=LayoutFilter()))
    return best, bool(overall.layouts) and overall.layouts[0].config == best.config


def stage_memories(model: ModelSpec, e: TrainEstimate, seq_len: int) -> tuple[TrainMemory, ...]:
    """First, (uneven split) second and last stage per GPU, one bar when pp = 1: the stages
    train.memory_per_gpu takes the worst of."""
    return train_stage_memories(model, e.config, seq_len, e.num_micro_batches)


def train_memory_bars(model: ModelSpec, e: TrainEstimate, seq_len: int) -> tuple[MemoryBar, ...]:
    c, m = e.config, e.num_micro_batches
    bars = []
    for mem in stage_memories(model, e, seq_len):
        in_flight = act.micro_batches_in_flight(c.schedule, c.pp, m, c.virtual_stages, mem.stage)
        note = f"{mem.num_layers} layers, up to {in_flight:g} of {m} micro-batches in flight ({c.schedule})"
        segments = tuple(MemorySegment(name, value) for name, value in (
            ("weights", mem.weights_bytes), ("gradients", mem.gradient_bytes), ("optimizer", mem.optimizer_bytes),
            ("activations", mem.activation_bytes), ("overhead", mem.overhead_bytes)))
        bars.append(MemoryBar((mem.stage,), stage_label(mem.stage, c.pp), segments, e.capacity_per_gpu_bytes,
                              e.capacity_per_gpu_bytes, note))
    return tuple(bars)


def tp_rows(model: ModelSpec, cluster: ClusterSpec, e: TrainEstimate, seq_len: int) -> list[CollectiveRow]:
    """Forward: 2 all-reduces (SP: 2 all-gathers + 2 reduce-scatters at half the time each);
    backward: 2 input-gradient all-reduces (SP: 4 all-gathers + 2 reduce-scatters), partly
    hidden under the weight-gradient GEMMs; full recompute repeats the forward's."""
    c = e.config
    if c.tp == 1:
        return []
    layout = c.layout
    modelled = without_curves(cluster)
    placement = place(cluster, layout)
    link = placement.tp_link
    curve = cluster.allreduce_curve(link.scope, c.tp)
    message = BYTES_PER_ELEMENT * c.micro_batch_size * seq_len * model.hidden_size

    def allreduce(num_bytes: float) -> float:
        return tp_allreduce_seconds_per_layer(modelled, layout, place(modelled, layout), num_bytes)[0] / 2

    def half(num_bytes: float) -> float:
        return allreduce(num_bytes) / 2

    measured = None if curve is None else curve_seconds(curve, message)
    per_step = e.num_micro_batches * e.num_layers_per_stage[e.slowest_stage]  # the pacing stage's layers
    if c.sequence_parallel:
        plan = [("forward", "attention, MLP: AG in, RS out", "AG/RS", 4, half),
                ("backward", "grad AG x2, input AG x2, RS x2", "AG/RS", 6, half)]
    else:
        plan = [("forward", "after attention, after MLP", "all-reduce", 2, allreduce),
                ("backward", "input gradients (QKV, MLP up)", "all-reduce", 2, allreduce)]
    if c.recompute == "full":
        plan.append(("recompute", "the forward's again", plan[0][2], plan[0][3], plan[0][4]))
    step = e.step_time_seconds
    rows = []
    for phase, name, kind, count, seconds_at in plan:
        this_measured = None if measured is None else measured * (0.5 if seconds_at is half else 1.0)
        rows.append(collective_row(phase, name, kind, c.tp, link.kind, message, seconds_at, this_measured,
                                   count * per_step, step))
    return rows


def pp_dp_rows(model: ModelSpec, cluster: ClusterSpec, e: TrainEstimate, seq_len: int) -> list[CollectiveRow]:
    c, m, step = e.config, e.num_micro_batches, e.step_time_seconds
    rows = []
    placement = place(cluster, c.layout)
    if c.pp > 1:
        send = BYTES_PER_ELEMENT * c.micro_batch_size * seq_len * model.hidden_size / c.tp
        rows.append(collective_row("step", "activations / gradients", "send", 2,
                                   placement.pp_link.kind, send,
                                   lambda n: comm.p2p_seconds(n, placement.pp_link), None,
                                   2 * (c.virtual_stages * m + c.pp - 1), step))
    link = dp_link(cluster, c)
    if link is not None:
        params = stage_params_per_gpu(model, c.tp, c.pp, stage_layers(model, c)).worst
        derated = comm.collective_link(link)
        grads = params * eff.TRAIN_BYTES_PER_PARAM_GRADIENTS
        weights = params * eff.TRAIN_BYTES_PER_PARAM_WEIGHTS
        per = m if c.zero_stage >= 2 else 1
        if c.zero_stage == 0:
            rows.append(collective_row("step", "gradients (fp32)", "all-reduce", c.dp, link.kind, grads,
                                       lambda n: comm.ring_allreduce_seconds(n, c.dp, derated), None, 1, step))
        else:
            rows.append(collective_row("step", "gradients (fp32)", "reduce-scatter", c.dp, link.kind, grads,
                                       lambda n: comm.ring_allgather_seconds(n, c.dp, derated), None, per, step))
            rows.append(collective_row("step", "16-bit weights", "all-gather", c.dp, link.kind, weights,
                                       lambda n: comm.ring_allgather_seconds(n, c.dp, derated), None, 1, step))
    return rows


def stage_seconds_per_micro_batch(e: TrainEstimate) -> float:
    """The model's stage time for one micro-batch (compute + exposed TP). With p > 1 it is
    read back from the bubble, (p-1)/v stage-times; with p = 1 from compute + TP over m
    (the one optimizer step then spread over the micro-batches, a small overestimate)."""
    b, c = e.time_breakdown_seconds, e.config
    if c.pp > 1:
        return b.bubble * c.virtual_stages / (c.pp - 1)
    return (b.compute + b.tp_comm) / e.num_micro_batches


def train_timeline_seconds(model: ModelSpec, cluster: ClusterSpec, e: TrainEstimate, seq_len: int):
    """The schedule at the model's stage time per micro-batch, split into forward and
    backward (recompute counted with backward) as one layer's compute splits."""
    c = e.config
    layer = layer_seconds(model, seq_len, c.micro_batch_size, c.tp, c.sequence_parallel, c.recompute,
                          train_rates(model, cluster))
    stage = stage_seconds_per_micro_batch(e)
    forward_share = layer.forward / layer.total
    return training_timeline(c.schedule, c.pp, e.num_micro_batches, c.virtual_stages,
                             forward_units=stage * forward_share,
                             backward_units=stage * (1 - forward_share), time_unit="s")


def train_breakdown(e: TrainEstimate) -> TimeBreakdown:
    b = e.time_breakdown_seconds
    segments = (BreakdownSegment("compute", b.compute), BreakdownSegment("TP comm", b.tp_comm),
                BreakdownSegment("PP comm", b.pp_comm), BreakdownSegment("DP comm exposed", b.dp_comm_exposed),
                BreakdownSegment("bubble", b.bubble))
    return TimeBreakdown("one optimizer step", b.total, segments)


def train_metrics(e: TrainEstimate) -> tuple[Metric, ...]:
    return (
        Metric("step time", e.step_time_seconds, "s"),
        Metric("throughput", e.tokens_per_second, "tok/s"),
        Metric("MFU", e.mfu, "fraction"),
        Metric("micro-batches per step", e.num_micro_batches, "count"),
        Metric("bubble", e.bubble_fraction, "fraction"),
    )


def train_notes(e: TrainEstimate) -> tuple[str, ...]:
    c = e.config
    chunks = f", v={c.virtual_stages}" if c.virtual_stages > 1 else ""
    return (f"micro-batch {c.micro_batch_size}, {c.schedule}{chunks}, recompute {c.recompute}, "
            f"sequence parallel {'on' if c.sequence_parallel else 'off'}, ZeRO-{c.zero_stage}",)


def train_knob_base(model: ModelSpec, cluster: ClusterSpec, e: TrainEstimate) -> sensitivity.KnobBase:
    rates = train_rates(model, cluster)
    return sensitivity.KnobBase(eff.ELEMENTWISE_HBM_UTILIZATION, rates.matmul_flops_per_s / rates.peak_flops_per_s,
                                e.memory.overhead_bytes, 1.0)


def train_replan(model: ModelSpec, request: TrainRequest, explained: TrainEstimate) -> sensitivity.Replan:
    """Re-search every configuration (no --layout filter); the explained configuration
    re-estimated for the metric ranges."""
    unfiltered = replace(request, layout=LayoutFilter())

    def replan(cluster: ClusterSpec) -> sensitivity.Outcome:
        plan = search(model, cluster, unfiltered)
        mine = estimate(model, cluster, explained.config, request)
        metrics = None if not isinstance(mine, TrainEstimate) else (
            ("step_time_seconds", mine.step_time_seconds), ("tokens_per_second", mine.tokens_per_second),
            ("mfu", mine.mfu))
        return sensitivity.Outcome(plan.layouts[0].config.layout if plan.layouts else None, metrics)

    return replan


def explain_training(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest,
                     settings: sensitivity.Settings | None = sensitivity.Settings()) -> Explanation:
    e, is_recommended = pick_training(model, cluster, request)
    c = e.config
    report = None
    if settings is not None:
        report = sensitivity.analyze(cluster, c.layout, train_knob_base(model, cluster, e),
                                     train_replan(model, request, e), settings)
    chunks = f", {c.virtual_stages} chunks per device" if c.virtual_stages > 1 else ""
    return Explanation(
        workload="train",
        model=model.name,
        cluster=cluster.name,
        layout=c.layout,
        objective="throughput",
        is_recommended=is_recommended,
        metrics=train_metrics(e),
        notes=train_notes(e),
        placement=placement_map(cluster, c.layout),
        memory=train_memory_bars(model, e, request.seq_len),
        collectives=tuple(tp_rows(model, cluster, e, request.seq_len) + pp_dp_rows(model, cluster, e, request.seq_len)),
        timeline=train_timeline_seconds(model, cluster, e, request.seq_len),
        timeline_caption=(f"{c.schedule}, {c.pp} stage(s), {e.num_micro_batches} micro-batches of "
                          f"{c.micro_batch_size}{chunks}; forward and backward at the model's stage time"),
        breakdown=train_breakdown(e),
        sensitivity=report,
    )
