"""`plan explain --workload train`: the sections of planner/explain.py for a training
configuration (Megatron-LM semantics, planner/train.py and cost/training_time.py).

Memory: the first stage (embedding, the most micro-batches in flight), with an uneven
split the second (the heaviest middle stage) and the last (LM head, logits), each with its
own layers: train.stage_memories, whose worst is train.memory_per_gpu. Collectives: per layer and
micro-batch, message 2*b*s*h bytes on the TP group, priced by the same group all-reduce
the training model uses; pipeline sends of 2*b*s*h/t bytes, 2*(v*m + p - 1) per step;
the data-parallel gradient reduction once per step (ZeRO-2/3: per micro-batch); with EP the
dispatch and combine all-to-alls of each MoE layer (forward, backward, recompute).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from planner import sensitivity
from planner.cost import activations as act
from planner.cost import comm
from planner.cost import efficiency as eff
from planner.cost.moe import deepep_training_buffer_bytes, moe_layers_of
from planner.cost.timeline import Timeline, drawable_micro_batches, training_timeline
from planner.cost.training_time import DpCollectives, dp_link
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
from planner.layout import (
    GroupTopology,
    Link,
    TrainConfig,
    cp_group_ranks,
    dp_group_topology,
    ep_group_topology,
    expert_dp_group_topology,
    place,
)
from planner.render.catalog import measured_links_words
from planner.render.common import ms
from planner.render.explain import seconds
from planner.render.train import HOST_WAIT_LABEL, faster_split_line, mtp_notes, schedule_name
from planner.requests import LayoutFilter, TrainRequest
from planner.specs import ClusterSpec, ModelSpec, SpecError
from planner.train import (
    TrainEstimate,
    estimate,
    exchange_name,
    moe_host_seconds_for,
    recomputed_layers,
    train_rates,
    training_caveats,
)
from planner.train_engines import CP_KV_ROTATION, cp_exchange_label
from planner.train_search import TrainPlan, search


def pick_training(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest,
                  plan: TrainPlan | None = None, overall: TrainPlan | None = None) -> tuple[TrainEstimate, bool]:
    """The best configuration matching --layout and the other fixed flags, and whether it
    is also the recommendation without --layout. `plan`: the search already run for this
    request; `overall`: unfiltered_search's, where it has run."""
    plan = plan if plan is not None else search(model, cluster, request)
    request = plan.request  # with dp resolved when --layout fixed tp and pp
    if not plan.layouts:
        why = "; ".join(f"{r.layout}: {', '.join(r.reasons[:2])}" for r in plan.rejected[:3])
        raise SpecError(f"plan explain: no feasible layout to explain ({why})")
    best = plan.layouts[0]
    if request.layout == LayoutFilter():
        return best, True
    overall = overall if overall is not None else unfiltered_search(model, cluster, request)
    return best, bool(overall.layouts) and overall.layouts[0].config == best.config


def unfiltered_search(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest) -> TrainPlan:
    """The recommendation without --layout (keep_top 1): whether the explained configuration is
    the overall best, and the space each sensitivity re-plan searches (replanned_configs)."""
    return search(model, cluster, replace(request, layout=LayoutFilter()), suggest=False, keep_top=1)


def train_memory_bars(model: ModelSpec, e: TrainEstimate) -> tuple[MemoryBar, ...]:
    """The estimate's candidate worst stages (first, heaviest middle, last), by component;
    `model` the trained one (train.trained_model: its MTP modules on the last stage)."""
    c, m = e.config, e.num_micro_batches
    bars = []
    # DeepEP's buffers (train._stage_states: in the fixed overhead) shown apart, as serving shows them
    deepep = deepep_training_buffer_bytes(model, c.ep) if c.moe_dispatcher == "deepep" else 0.0
    for mem in e.stage_memories:
        in_flight = act.micro_batches_in_flight(c.schedule, c.pp, m, c.virtual_stages, mem.stage,
                                                int(c.moe_comm_overlap))
        mtp = f" + {model.num_mtp_layers} MTP" if model.num_mtp_layers and mem.stage == c.pp - 1 else ""
        # interleaved: chunks in flight over v, a fraction where a stage's chunks are uneven
        held = (f"up to {in_flight:g} of {m} micro-batches" if float(in_flight).is_integer() else
                f"up to {in_flight:.1f} of {m} micro-batches' activations (its chunks hold different counts)")
        rerun = recomputed_layers(c, (mem.num_layers, 0, 0))[0]
        # block recompute: how many of the stage's layers keep only their input
        layers = (f"{mem.num_layers} layers ({rerun} recomputed, {mem.num_layers - rerun} keeping all)"
                  if c.recompute == "full" and rerun < mem.num_layers else f"{mem.num_layers} layers")
        note = f"{layers}{mtp}, {held} in flight ({schedule_name(c)})"
        segments = tuple(MemorySegment(name, value) for name, value in (
            ("weights", mem.weights_bytes), ("gradients", mem.gradient_bytes), ("optimizer", mem.optimizer_bytes),
            ("activations", mem.activation_bytes), ("overhead", mem.overhead_bytes - deepep),
            ("DeepEP buffers", deepep)) if name != "DeepEP buffers" or value)
        bars.append(MemoryBar((mem.stage,), stage_label(mem.stage, c.pp), segments, e.capacity_per_gpu_bytes,
                              e.capacity_per_gpu_bytes, note))
    return tuple(bars)


def tp_rows(cluster: ClusterSpec, e: TrainEstimate) -> list[CollectiveRow]:
    """Forward: 2 all-reduces (SP: 2 all-gathers + 2 reduce-scatters at half the time each);
    backward: 2 input-gradient all-reduces (SP: 4 all-gathers + 2 reduce-scatters), partly
    hidden under the weight-gradient GEMMs; full recompute repeats the forward's. Times are
    the estimate's (layer_terms.tp); the model's latency/bandwidth split is shown beside."""
    c = e.config
    if c.tp == 1:
        return []
    layout = c.layout
    modelled = without_curves(cluster)
    placement = place(modelled, layout)
    tp = e.layer_terms.tp

    def allreduce(num_bytes: float) -> float:
        return comm.allreduce_seconds(num_bytes, placement.tp_group, None, hierarchical=True)

    def half(num_bytes: float) -> float:
        return allreduce(num_bytes) / 2

    per_step = e.num_micro_batches * e.num_layers_per_stage[e.slowest_stage]  # the pacing stage's layers
    if c.sequence_parallel:
        plan = [("forward", "attention, MLP: AG in, RS out", "AG/RS", 4, half),
                ("backward", "grad AG x2, input AG x2, RS x2", "AG/RS", 6, half)]
    else:
        plan = [("forward", "after attention, after MLP", "all-reduce", 2, allreduce),
                ("backward", "input gradients (QKV, MLP up)", "all-reduce", 2, allreduce)]
    if c.recompute == "full":
        plan.append(("recompute", rerun_name(e, "the forward's again"), plan[0][2], plan[0][3], plan[0][4]))
    rerun = e.num_micro_batches * e.rerun_layers
    rows = []
    for phase, name, kind, count, seconds_at in plan:
        used = tp.allreduce_seconds * (0.5 if seconds_at is half else 1.0)
        rows.append(collective_row(phase, name, kind, c.tp, placement.tp_link.kind, tp.message_bytes, seconds_at,
                                   used, tp.measured, count * (rerun if phase == "recompute" else per_step),
                                   e.step_time_seconds))
    return rows


def rerun_name(e: TrainEstimate, name: str) -> str:
    """A recompute phase's name; under block recompute with how many of the pacing stage's
    layers rerun (TrainEstimate.rerun_layers)."""
    layers = e.num_layers_per_stage[e.slowest_stage] if e.num_layers_per_stage else 0
    if e.config.recompute != "full" or e.rerun_layers >= layers:
        return name
    return f"{name} ({e.rerun_layers} of {layers} layers)"


def ep_rows(model: ModelSpec, cluster: ClusterSpec, e: TrainEstimate) -> list[CollectiveRow]:
    """The estimate's EP all-to-alls (layer_terms.ep): dispatch + combine forward, their
    gradients backward, the forward's again with full recompute, on every MoE layer of the
    pacing stage for every micro-batch; the group in Megatron's rank order."""
    c, ep = e.config, e.layer_terms.ep
    if c.ep <= 1 or ep.num_alltoalls == 0:
        return []
    group = ep_group_topology(without_curves(cluster), c.layout, pp_outermost=True)
    moe_layers = moe_layers_of(model, e.num_layers_per_stage[e.slowest_stage])
    per_step = e.num_micro_batches * moe_layers

    def one(num_bytes: float) -> float:
        if ep.dispatcher == "deepep":  # its fixed cost, then linear in the bytes (comm.deepep_seconds)
            fixed = ep.fixed_seconds
            return fixed + (ep.alltoall_seconds - fixed) * num_bytes / ep.message_bytes if ep.message_bytes else fixed
        return comm.alltoall_seconds(num_bytes, group, None)

    phases = [("forward", "dispatch, combine", 2), ("backward", "their gradients", 2)]
    rerun = e.num_micro_batches * moe_layers_of(model, e.rerun_layers)
    if c.recompute == "full":
        phases.append(("recompute", rerun_name(e, "the forward's again"), 2))
    if c.moe_comm_overlap:  # the time breakdown's EP share is what the other micro-batch leaves exposed
        phases = [(phase, f"{name} (beside another micro-batch: combined 1F1B)", count)
                  for phase, name, count in phases]
    kind = exchange_name(ep.dispatcher)
    return [collective_row(phase, name, kind, c.ep, ep.link or "-", ep.message_bytes, one,
                           ep.alltoall_seconds, ep.measured, count * (rerun if phase == "recompute" else per_step),
                           e.step_time_seconds)
            for phase, name, count in phases]


def cp_rows(cluster: ClusterSpec, e: TrainEstimate, engine: str = "megatron") -> list[CollectiveRow]:
    """The estimate's context-parallel KV exchange (layer_terms.cp) on every layer of the pacing
    stage for every micro-batch; what the attention hides is in the estimate's cp_comm.
    Megatron (CP_KV_ROTATION "ring"): cp - 1 KV chunk sends forward, cp - 1 KV + dKV backward,
    the forward's again with recompute. torchtitan ("allgather"): one all-gather of the other
    cp - 1 chunks forward (again with recompute), one in the backward, and cp - 1 dKV sends."""
    c, cp = e.config, e.layer_terms.cp
    if c.cp <= 1 or cp.total == 0.0:
        return []
    link = place(without_curves(cluster), c.layout).cp_link
    layers = e.num_micro_batches * e.num_layers_per_stage[e.slowest_stage]
    per_step = layers * (c.cp - 1)
    if CP_KV_ROTATION[engine] == "allgather":
        gather_bytes, gather_seconds = (c.cp - 1) * cp.kv_chunk_bytes, (c.cp - 1) * cp.send_seconds
        rows = [("forward", "KV of the other chunks", "all-gather", gather_bytes,
                 gather_seconds, layers),
                ("backward", "KV of the other chunks again", "all-gather", gather_bytes, gather_seconds, layers),
                ("backward", "dKV to the next rank", "send", cp.kv_chunk_bytes, cp.send_seconds, per_step)]
        if act.reruns_attention(c.recompute):
            rows.append(("recompute", "the forward's all-gather again", "all-gather", gather_bytes, gather_seconds,
                         e.num_micro_batches * e.rerun_layers if c.recompute == "full" else layers))
        steps = c.cp - 1

        def priced(kind: str) -> Callable[[float], float]:
            """The estimate's alpha-beta reading: the gather as cp - 1 chunk sends back to back."""
            if kind == "send":
                return lambda n: comm.p2p_seconds(n, link)
            return lambda n: steps * comm.p2p_seconds(n / steps, link)

        return [collective_row(phase, name, kind, c.cp, cp.link or "-", num_bytes, priced(kind), seconds, False,
                               count, e.step_time_seconds)
                for phase, name, kind, num_bytes, seconds, count in rows]
    phases = [("forward", "ring: next KV chunk", cp.kv_chunk_bytes, cp.send_seconds),
              ("backward", "ring: KV and dKV", 2 * cp.kv_chunk_bytes, cp.total / (c.cp - 1)
               - (2 if act.reruns_attention(c.recompute) else 1) * cp.send_seconds)]
    if act.reruns_attention(c.recompute):
        phases.append(("recompute", rerun_name(e, "the forward's again"), cp.kv_chunk_bytes, cp.send_seconds))
    rerun = e.num_micro_batches * (e.rerun_layers if c.recompute == "full" else e.num_layers_per_stage[e.slowest_stage])
    return [collective_row(phase, name, "send", c.cp, cp.link or "-", num_bytes,
                           lambda n: comm.p2p_seconds(n, link), seconds, False,
                           (rerun * (c.cp - 1) if phase == "recompute" else per_step), e.step_time_seconds)
            for phase, name, num_bytes, seconds in phases]


def pp_dp_rows(cluster: ClusterSpec, e: TrainEstimate) -> list[CollectiveRow]:
    """The estimate's pipeline sends and data-parallel collectives (one call each)."""
    c, m, step = e.config, e.num_micro_batches, e.step_time_seconds
    rows = []
    placement = place(cluster, c.layout, pp_outermost=True)
    if c.pp > 1:
        rows.append(collective_row("step", "activations / gradients", "send", 2,
                                   placement.pp_link.kind, e.pp_send_bytes,
                                   lambda n: comm.p2p_seconds(n, placement.pp_link), e.pp_send_seconds, False,
                                   2 * (c.virtual_stages * m + c.pp - 1), step))
    link = dp_link(cluster, c)
    dp = e.dp_collectives
    if link is not None and dp is not None:
        per = e.dp_reductions_per_step  # m under ZeRO-2/3, and torchtitan's DDP
        x = dp.experts
        group = comm.effective_group(dp_group_topology(cluster, c.layout))
        if x is None:
            rows += _dp_rows(c, link, dp, group, "", step, per, e.zero3_gathers_per_micro_batch)
        else:  # the dense parameters over d, the routed experts over d_x = t*d/ep
            dense = DpCollectives(dp.gradient_bytes - x.gradient_bytes, dp.gradient_seconds - x.gradient_seconds,
                                  dp.weight_bytes - x.weight_bytes, dp.gather_seconds - x.gather_seconds)
            expert_group = expert_dp_group_topology(cluster, c.layout, dp.expert_num_ranks)
            rows += _dp_rows(c, link, dense, group, " (dense)", step, per, e.zero3_gathers_per_micro_batch)
            rows += _dp_rows(c, link, x, comm.effective_group(expert_group), " (experts)", step, per,
                             e.zero3_gathers_per_micro_batch)
    return rows


def _dp_rows(c: TrainConfig, link: Link, dp: DpCollectives, group: GroupTopology | None, which: str,
             step: float, per: int, zero3_gathers: float = 2) -> list[CollectiveRow]:
    """The gradient reduction (and ZeRO's weight gather) of one parameter group over its
    placed ranks (two-level rings across nodes, comm.group_allgather_seconds); `per`:
    reductions per step (m with ZeRO-2/3)."""
    if group is None or group.num_ranks <= 1:
        return []
    n = group.num_ranks
    gradients = f"gradients ({c.grad_reduce}){which}"
    if c.zero_stage == 0:
        return [collective_row("step", gradients, "all-reduce", n, link.kind,
                               dp.gradient_bytes, lambda size: comm.group_allreduce_seconds(size, group),
                               dp.gradient_seconds, False, per, step)]
    # ZeRO-3 gathers the weights before each micro-batch's forward and again before its backward
    # (and its recompute): training_time.dp_exposed_seconds; ZeRO-1/2 once per step
    gathers = per * zero3_gathers if c.zero_stage == 3 else 1
    return [collective_row("step", gradients, "reduce-scatter", n, link.kind,
                           dp.gradient_bytes, lambda size: comm.group_allgather_seconds(size, group),
                           dp.gradient_seconds, False, per, step),
            collective_row("step", f"16-bit weights{which}", "all-gather", n, link.kind, dp.weight_bytes,
                           lambda size: comm.group_allgather_seconds(size, group),
                           dp.gather_seconds, False, gathers, step)]


def train_timeline_seconds(e: TrainEstimate, num_micro_batches: int | None = None) -> Timeline:
    """The schedule at the estimate's stage time per micro-batch, split into forward and
    backward (recompute counted with backward) as one layer's compute splits, the MoE host
    wait with the forward it stalls (with full recompute half of it with the rerun, counted
    with backward); drawn with `num_micro_batches` (default: the step's)."""
    c = e.config
    terms = e.layer_terms
    layer = terms.layer
    stage = e.stage_seconds_per_micro_batch
    host_forward = terms.host_seconds_per_layer / (2 if c.recompute == "full" else 1)
    forward_share = (layer.forward + host_forward) / (layer.total + terms.host_seconds_per_layer)
    return training_timeline(c.schedule, c.pp, num_micro_batches or e.num_micro_batches, c.virtual_stages,
                             forward_units=stage * forward_share,
                             backward_units=stage * (1 - forward_share), time_unit="s")


def train_timeline_drawn(e: TrainEstimate) -> tuple[Timeline | None, str]:
    """The step's schedule and its caption; with fewer micro-batches when the step has more
    than a chart can draw (only the steady one-forward-one-backward phase is longer in the
    real step), none when the stages alone are too many."""
    c = e.config
    m = e.num_micro_batches
    chunks = f", {c.virtual_stages} chunks per device" if c.virtual_stages > 1 else ""
    caption = (f"{schedule_name(c)}, {c.pp} stage(s), {m} micro-batches of {c.micro_batch_size}{chunks}; "
               f"forward and backward at the model's stage time")
    drawn = drawable_micro_batches(c.schedule, c.pp, m, c.virtual_stages)
    if drawn is None:
        return None, caption + f"; not drawn ({c.pp} stages are more than a chart shows)"
    if drawn < m:
        caption += f"; drawn with {drawn} micro-batches (the real step's steady phase is longer)"
    timeline = train_timeline_seconds(e, drawn)
    outside = e.step_time_seconds - timeline.span
    shown = TIMELINE_GAP_SHOWN_FRACTION_OF_STEP * e.step_time_seconds
    if drawn == m and outside > shown:
        b = e.time_breakdown_seconds
        # the step beyond its micro-batches: the sends between stages, the data-parallel
        # exchange the backward pass leaves exposed, and the optimizer step (in `compute`)
        parts = (("pipeline sends", b.pp_comm), ("exposed data-parallel communication", b.dp_comm_exposed),
                 ("the optimizer step", outside - b.pp_comm - b.dp_comm_exposed))
        named = ", ".join(f"{name} {ms(seconds)}" for name, seconds in parts
                          if seconds > TIMELINE_GAP_PART_SHOWN_FRACTION * outside)
        caption += f"; the step's other {ms(outside)} ({named or 'outside the schedule'}) are not drawn"
    return timeline, caption


TIMELINE_GAP_SHOWN_FRACTION_OF_STEP = 1 / 1000
"""A drawn step shorter than the step time by more than this share says what is left out: the
step and the chart's span are printed to four figures, so a gap of a thousandth shows (Llama-3.1
405B on 16x8 H100: step 169.60 s, the chart 168.85 s, a gap of 0.44% that 0.5% left unsaid)."""
TIMELINE_GAP_PART_SHOWN_FRACTION = 0.01
"""Of what is left out, the parts named: those over this share of it."""


def train_breakdown(e: TrainEstimate, engine: str = "megatron") -> TimeBreakdown:
    b = e.time_breakdown_seconds
    segments = (BreakdownSegment("compute", b.compute), BreakdownSegment("TP comm", b.tp_comm),
                BreakdownSegment("PP comm", b.pp_comm), BreakdownSegment("DP comm exposed", b.dp_comm_exposed))
    if e.config.ep > 1:
        segments += (BreakdownSegment(f"EP {exchange_name(e.config.moe_dispatcher)}", b.ep_comm),)
    if e.config.cp > 1:
        segments += (BreakdownSegment(f"{cp_exchange_label(engine)} exposed", b.cp_comm),)
    if b.host > 0:
        segments += (BreakdownSegment(HOST_WAIT_LABEL, b.host),)
    segments += (BreakdownSegment("bubble", b.bubble),)
    return TimeBreakdown("one optimizer step", b.total, segments)


def train_metrics(e: TrainEstimate) -> tuple[Metric, ...]:
    return (
        Metric("step time", e.step_time_seconds, "s"),
        Metric("throughput", e.tokens_per_second, "tok/s"),
        # (a fraction: the unit had read "percent" beside 0.553 in the JSON, a review)
        Metric("MFU", e.mfu, "fraction", percent_digits=1),
        Metric("micro-batches per step", e.num_micro_batches, "count"),
        Metric("bubble", e.bubble_share_of_step, "fraction"),  # of the step, as the table's
    )


def train_notes(e: TrainEstimate, engine: str = "megatron") -> tuple[str, ...]:
    c = e.config
    chunks = f", v={c.virtual_stages}" if c.virtual_stages > 1 else ""
    dispatcher = ("Megatron's flex dispatcher on DeepEP, its buffers in the overhead" if c.moe_dispatcher == "deepep"
                  else "NCCL all-to-alls")
    experts = f", EP {c.ep} (experts sharded over {c.ep} GPUs; tokens on {dispatcher})" if c.ep > 1 else ""
    notes = (f"micro-batch {c.micro_batch_size}, {schedule_name(c)}{chunks}, recompute {c.recompute_label}, "
             f"sequence parallel {'on' if c.sequence_parallel else 'off'}, ZeRO-{c.zero_stage}{experts}"
             + (f", {c.optimizer_states} optimizer states" if c.optimizer_states != "fp32" else ""),)
    if c.cp > 1:
        ranks = cp_group_ranks(c.layout)
        shown = ", ".join(str(r) for r in ranks[:4]) + (", ..." if len(ranks) > 4 else "")
        order = ("Megatron's tp-cp-ep-dp-pp order" if engine == "megatron"
                 else "torchtitan's device mesh pp, dp_replicate, dp_shard, cp, tp")
        exchange = ("the ring runs" if CP_KV_ROTATION[engine] == "ring"
                    else "the KV all-gather (torch's default rotate method) runs")
        notes += (f"CP {c.cp}: each sequence split over {c.cp} ranks at stride tp={c.tp} ({order}; the first "
                  f"group is ranks {shown}), {e.config.cp}x fewer tokens per rank; {exchange} on "
                  f"{e.layer_terms.cp.link}",)
    if e.time_breakdown_seconds.host > 0 and e.layer_terms is not None:
        notes += (host_wait_line(e),)
    if e.faster_split is not None:
        notes += (faster_split_line(e),)
    kernel = ("FlashAttention-2 forced (--attention-kernel fa2)" if c.attention_kernel == "fa2"
              else "the engine's own kernel (--attention-kernel auto)") if c.attention == "flash" else "materialized"
    notes += (f"kernels at {eff.TRAIN_SUSTAINED_RATE_FRACTION:.0%} of their measured rates, the share a "
              f"training step sustains (docs/cost-model.md, Training: sustained rates); attention: {kernel}",)
    return notes


def host_wait_line(e: TrainEstimate) -> str:
    """Why the step waits on the host: the MoE syncs (training_time.moe_host_exposed_seconds),
    with the numbers that multiply to the step's wait."""
    terms, c = e.layer_terms, e.config
    host, gpu = terms.moe_host_seconds, terms.moe_gpu_seconds
    paired = terms.ep.exposed_seconds_per_moe_layer is not None
    window = ("the block's forward paired with another micro-batch's backward (combined 1F1B)" if paired
              else "the block's forward")
    twice = ""
    if c.recompute == "full":
        layers = e.num_layers_per_stage[e.slowest_stage] if e.num_layers_per_stage else 0
        twice = (", twice with full recompute (its rerun forward syncs again)" if e.rerun_layers >= layers else
                 f", twice on the {e.rerun_layers} of {layers} layers recomputed (their rerun forward syncs again)")
    total = e.time_breakdown_seconds.host
    return (f"Each MoE layer's forward syncs the host on its token counts (Megatron's dropless dispatch): the host "
            f"takes {ms(host)} to issue a block's forward and the GPU {ms(gpu)} for {window}, so the GPU waits "
            f"{ms(host - gpu)} per MoE layer and micro-batch{twice}: {seconds(total)} per step "
            f"({total / e.step_time_seconds:.0%}). A larger micro-batch, where memory allows, hides more of it; "
            f"--moe-host-ms sets the host's time (lower under CUDA graphs)")


def train_knob_base(model: ModelSpec, cluster: ClusterSpec, e: TrainEstimate,
                    request: TrainRequest) -> sensitivity.KnobBase:
    rates = train_rates(model, cluster, request.attention_kernel)
    # the elementwise kernels' share of HBM the estimate prices (the GPU's fitted one where the catalog has it)
    hbm = cluster.gpu.elementwise_hbm_utilization or eff.ELEMENTWISE_HBM_UTILIZATION
    return sensitivity.KnobBase(hbm, rates.matmul_flops_per_s / rates.peak_flops_per_s,
                                e.memory.overhead_bytes, 1.0, moe_host_seconds=priced_moe_host_seconds(model, request))


def priced_moe_host_seconds(model: ModelSpec, request: TrainRequest) -> float | None:
    """The host's time per MoE block forward the plan prices (the MoE host-time knob's value);
    None where none is asked (a dense model, or 0); a torchtitan configuration without EP prices
    none either (train_engines.moe_forward_syncs), though its knob is still moved."""
    if not model.is_moe:
        return None
    return moe_host_seconds_for(request.engine, request.moe_host_seconds) or None


def train_replan(model: ModelSpec, request: TrainRequest, explained: TrainEstimate) -> sensitivity.Replan:
    """Re-search every configuration (no --layout filter); the explained configuration
    re-estimated for the metric ranges. The MoE host-time knob moves --moe-host-ms."""
    host = priced_moe_host_seconds(model, request)

    def replan(cluster: ClusterSpec, knobs: sensitivity.Knobs) -> sensitivity.Outcome:
        moved = request
        if host is not None and knobs.moe_host != 1.0:
            moved = replace(request, moe_host_seconds=host * knobs.moe_host)
        # the recommendation only: the search may bound out what ranks below it
        plan = search(model, cluster, replace(moved, layout=LayoutFilter()), suggest=False, keep_top=1)
        mine = estimate(model, cluster, explained.config, moved)
        # MFU against the datasheet peak, which the matmul-efficiency knob moves with the
        # achievable rates: at a fixed model and GPU count it scales with the tokens/s
        metrics = None if not isinstance(mine, TrainEstimate) else (
            ("step_time_seconds", mine.step_time_seconds), ("tokens_per_second", mine.tokens_per_second),
            ("mfu", explained.mfu * mine.tokens_per_second / explained.tokens_per_second))
        return sensitivity.Outcome(plan.layouts[0].config.layout if plan.layouts else None, metrics)

    return replan


LIGHT_SENSITIVITY_ABOVE_CONFIGS = 600
"""Where each of the sensitivity's re-plans (train_replan: the whole space, without --layout's
filter) evaluates more configurations than this, it is the light analysis (sensitivity.LIGHT:
the +/-20% runs, flips not searched beyond them, some 18 re-plans): the full one re-plans some
45-80 times. A configuration costs 220-310 us to estimate on 2 cores today (warm searches:
Llama-3.1-8B at 4K on 8 H100, 414 configurations, 90 ms; 70B at 8K on 32 H200, 1,619, 0.50 s),
so the full analysis over two workers takes about 7.5 ms a configuration: 3.1 s for that 8B
plan, which keeps it, and 9-17 s for 70B at 131,072 tokens on 32 H200 (833 configurations, a
CLI sweep), which now gets the light one (the bound had been 1,500, set when a configuration
cost 45 us). DeepSeek-V3 on 2,048 H100 (1,970 a re-plan) took 42 s full, 18 s light."""


MOE_REPLAN_COST = 3
"""An MoE configuration costs about 3 dense ones to estimate (the expert exchange and its
variants, the host sync, per-kind stage memory): warm searches, DeepSeek-V3 on 256 H100 162 us
a configuration, Qwen3-235B 96, Mixtral 8x7B 80, against Llama-3.1-70B's 45 and 8B's 50. So an
MoE plan's configurations count 3 times against LIGHT_SENSITIVITY_ABOVE_CONFIGS (DeepSeek-V3 on
256 H100, 1,008 a re-plan, took 10 s with the full analysis: found by a CLI sweep)."""


def replanned_configs(plan: TrainPlan, overall: TrainPlan | None) -> int:
    """The configurations each sensitivity re-plan evaluates: the plan's own where no --layout
    filters it (`overall` None), else those of the unfiltered search the re-plans run
    (train_replan, unfiltered_search)."""
    return (plan if overall is None else overall).num_configs_evaluated


def explain_training(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest,
                     settings: sensitivity.Settings | None = sensitivity.Settings(),
                     plan: TrainPlan | None = None) -> Explanation:
    plan = plan if plan is not None else search(model, cluster, request)
    overall = None if plan.request.layout == LayoutFilter() else unfiltered_search(model, cluster, plan.request)
    e, is_recommended = pick_training(model, cluster, request, plan, overall)
    c = e.config
    report = None
    light = ()
    replanned = replanned_configs(plan, overall) if settings == sensitivity.Settings() else 0
    if replanned * (MOE_REPLAN_COST if model.is_moe else 1) > LIGHT_SENSITIVITY_ABOVE_CONFIGS:
        settings = sensitivity.LIGHT
        light = (f"sensitivity: the +/-20% runs only, flips not searched beyond them (each re-plan evaluates "
                 f"{replanned:,} configurations; --no-sensitivity skips them)",)
    if settings is not None:
        report = sensitivity.analyze(cluster, c.layout, train_knob_base(model, cluster, e, request),
                                     train_replan(model, request, e), settings)
    timeline, caption = train_timeline_drawn(e)
    return Explanation(
        workload="train",
        model=model.name,
        cluster=cluster.name,
        layout=c.layout,
        objective="throughput",
        is_recommended=is_recommended,
        metrics=train_metrics(e),
        notes=(*train_notes(e, request.engine), *mtp_notes(plan.model, c.pp), *training_caveats(model, request, c.recompute),
               *measured_links_words(cluster), *light),
        placement=placement_map(cluster, c.layout, pp_outermost=True, training_engine=request.engine),
        memory=train_memory_bars(plan.model, e),
        collectives=tuple(tp_rows(cluster, e) + ep_rows(model, cluster, e) + cp_rows(cluster, e, request.engine)
                          + pp_dp_rows(cluster, e)),
        timeline=timeline,
        timeline_caption=caption,
        breakdown=train_breakdown(e, request.engine),
        sensitivity=report,
    )
