"""Training plan output: the ranked table, the reasoning, the Megatron command, JSON."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner import units
from planner.cost import efficiency
from planner.cost.params import training_dtype
from planner.emit.command import ALL_NODES, LaunchStep
from planner.layout import TrainConfig
from planner.model_summary import model_summary
from planner.render.catalog import describe_cluster, describe_model
from planner.render.common import (
    MAX_REJECTED_SHOWN,
    closest_misses,
    console,
    count,
    gib,
    ms,
    ms_or_s,
    per_node_lines,
    print_json_rows,
    share_text,
    step_json,
    to_jsonable,
)
from planner.specs import GPU, ModelSpec
from planner.train import (
    TrainEstimate,
    exchange_name,
    moe_comm_overlap_off_reason,
    moe_dispatcher_off_reason,
    tp_comm_overlap_off_reason,
    trained_model,
    training_caveats,
)
from planner.train_engines import CP_KV_ROTATION, cp_exchange_label
from planner.train_search import (
    MEMORY_TIE_FRACTION,
    TIGHT_MEMORY_FRACTION,
    TP_ACROSS_NODES_MARGIN,
    TrainPlan,
    headroom_bytes,
    short_of_memory,
)

if TYPE_CHECKING:  # rich is imported only to draw tables, never for --json
    from rich.table import Table

StepsFor = Callable[[TrainEstimate], tuple[LaunchStep, ...]]


@dataclass(frozen=True)
class Column:
    header: str
    get: Callable[[TrainEstimate, int], str]
    justify: str = "right"


def schedule_name(config: TrainConfig) -> str:
    """The schedule as the plan names it: "no PP" without pipelining (the schedule field keeps
    its default there, which runs nothing)."""
    return "no PP" if config.pp == 1 else config.schedule


def _schedule(e: TrainEstimate) -> str:
    c = e.config
    return f"interleaved/{c.virtual_stages}" if c.pp > 1 and c.schedule == "interleaved" else schedule_name(c)


def _memory_cell(e: TrainEstimate) -> str:
    """Worst stage's memory over the capacity, one unit: "66.9/79.1 GiB" (fits one line)."""
    return (f"{units.bytes_to_gib(e.memory_per_gpu_bytes):.1f}/"
            f"{units.bytes_to_gib(e.capacity_per_gpu_bytes):.1f} GiB")


def _step_cell(seconds: float) -> str:
    """A step in ms below 10 s, in s above (a 121.8 s step, not 121758.9 ms)."""
    return ms_or_s(seconds, STEP_SECONDS_SHOWN_IN_S)


HOST_WAIT_LABEL = "host waits (MoE syncs)"
"""The step's share the GPU waits on the host after MoE syncs, in the summary and plan explain."""
STEP_SECONDS_SHOWN_IN_S = 10.0
"""From this step time on the table shows seconds."""


COLUMNS = (
    Column("#", lambda e, i: str(i + 1)),
    Column("tp", lambda e, i: str(e.config.tp)),
    Column("cp", lambda e, i: str(e.config.cp)),
    Column("pp", lambda e, i: str(e.config.pp)),
    Column("dp", lambda e, i: str(e.config.dp)),
    Column("ep", lambda e, i: str(e.config.ep)),
    Column("b", lambda e, i: str(e.config.micro_batch_size)),
    Column("m", lambda e, i: str(e.num_micro_batches)),
    Column("schedule", lambda e, i: _schedule(e), "left"),
    Column("recompute", lambda e, i: e.config.recompute_label, "left"),
    Column("sp", lambda e, i: "on" if e.config.sequence_parallel else "off"),
    Column("zero", lambda e, i: str(e.config.zero_stage)),
    Column("mem/GPU", lambda e, i: _memory_cell(e)),
    Column("step", lambda e, i: _step_cell(e.step_time_seconds)),
    Column("tokens/s", lambda e, i: count(e.tokens_per_second)),
    Column("TFLOP/s", lambda e, i: f"{e.tflops_per_gpu:.1f}"),
    Column("MFU", lambda e, i: f"{e.mfu:.1%}"),
    Column("bubble", lambda e, i: f"{e.bubble_share_of_step:.1%}"),  # of the step, as the Why line's
    Column("TP link", lambda e, i: e.tp_link or "-", "left"),
)


def render_table(plan: TrainPlan, top: int) -> Table:
    from rich.table import Table

    total = len(plan.layouts)
    bounded = (f", {plan.num_configs_bounded:,} more not estimated: bounded below row {plan.bounded_below_row}"
               if plan.num_configs_bounded else "")
    table = Table(title=f"Training configurations on {plan.num_gpus} GPUs ({total:,} feasible, "
                        f"{len(plan.rejected):,} layouts rejected{bounded}; ranked by tokens/s"
                        f"{', TP inside a node first within a few percent' if plan.passed_over else ''}"
                        f"{f', room in memory first within {MEMORY_TIE_FRACTION:.0%}' if plan.tight_passed_over else ''})")
    fp8 = plan.request.precision == "fp8"  # MFU over the bf16 dense peak (FP8_MFU_BASIS)
    for column in COLUMNS:
        header = "MFU (bf16 peak)" if fp8 and column.header == "MFU" else column.header
        table.add_column(header, justify=column.justify)
    for index, estimate in enumerate(plan.layouts[:top]):
        table.add_row(*(column.get(estimate, index) for column in COLUMNS))
    if any(e.config.recompute == "full" for e in plan.layouts[:top]):
        # the column's count differs by row there (TrainEstimate.tflops_per_gpu): 602 TFLOP/s
        # beside MFU 45.8% on an H100 read as a contradiction (a CLI read)
        table.caption = ("TFLOP/s: rows with recompute full count the rerun layers' forward too (Narayanan et al. 2021, "
                         "eq. 3); MFU counts the model's FLOPs alone")
    return table


def stages_text(e: TrainEstimate) -> str:
    """Layers per stage: "L/p each" or "7 | 8 x14 | 7" (first | middle x count | last)."""
    layers = e.num_layers_per_stage
    if len(layers) == 1:
        return f"{layers[0]} layers"
    counted = " (embedding and loss counted as layers)" if e.config.account_for_embedding_and_loss else ""
    if len(set(layers)) <= 1:
        return f"{layers[0]} layers per stage{counted}"
    return f"uneven stages {layers_text(layers)} layers{counted}"


WIDE_BUBBLE_FRACTION = 0.30
"""A recommended pipeline bubble above this share of the step gets a line saying the batch is
small for the GPUs (the best the GPU count allows can still idle a third of the time)."""


def mtp_notes(model: ModelSpec, pp: int) -> tuple[str, ...]:
    """The trained model's multi-token-prediction modules, where they run and what they cost
    (the summary and plan explain's notes); nothing without them."""
    return (mtp_line(model.num_mtp_layers, pp),) if model.num_mtp_layers else ()


def mtp_line(num_mtp_layers: int, pp: int) -> str:
    """The line mtp_notes gives."""
    where = "on the last pipeline stage, before the loss" if pp > 1 else "after the last layer, before the loss"
    each = "each one" if num_mtp_layers > 1 else "it"
    return (f"Multi-token prediction: {num_mtp_layers} MTP module{'s' if num_mtp_layers > 1 else ''} {where} "
            f"(--mtp-num-layers {num_mtp_layers}); per micro-batch {each} runs a transformer block and a second "
            f"pass of the output layer and loss. --mtp-layers 0 trains the main model only.")


def summary_lines(plan: TrainPlan) -> list[str]:
    best = plan.layouts[0]
    c, t = best.config, best.time_breakdown_seconds
    parts = {"compute": t.compute, "bubble": t.bubble, "TP comm": t.tp_comm,
             "PP comm": t.pp_comm, "DP comm (exposed)": t.dp_comm_exposed}
    if c.ep > 1:
        parts[f"EP {exchange_name(c.moe_dispatcher)}"] = t.ep_comm
    if c.cp > 1:
        parts[f"{cp_exchange_label(plan.request.engine)} (exposed)"] = t.cp_comm
    if t.host > 0:
        parts[HOST_WAIT_LABEL] = t.host
    shares = ", ".join(f"{name} {share_text(value / best.step_time_seconds)}" for name, value in parts.items())
    lines = [
        f"Recommended: tp={c.tp}{_cp(c)} pp={c.pp} dp={c.dp}{_ep(c)}, micro-batch {c.micro_batch_size} "
        f"({best.num_micro_batches} micro-batch{'es' if best.num_micro_batches != 1 else ''} per step), {_schedule(best)}, {stages_text(best)}, recompute {c.recompute_label}, "
        f"sequence parallel {'on' if c.sequence_parallel else 'off'}, ZeRO-{c.zero_stage}"
        + (f", {c.optimizer_states} optimizer states (Adam's moments)." if c.optimizer_states != "fp32" else "."),
        f"Why: highest tokens/s {'with TP inside a node ' if plan.passed_over else ''}that fits "
        f"{'with room to spare (the memory margin below) ' if plan.tight_passed_over else ''}"
        f"({gib(best.memory_per_gpu_bytes)} of "
        f"{gib(best.capacity_per_gpu_bytes)} on stage {best.memory.stage}); step {ms(best.step_time_seconds)} = {shares}.",
        f"TP group on {best.tp_link or 'no link (tp=1)'}; "
        f"{'pipeline boundaries on ' + best.pp_link if best.pp_link else 'no pipeline boundaries (pp=1)'}; "
        f"{_dp_link_text(best)}{_ep_link(best)}{_cp_link(best, plan.request.engine)}. "
        f"{best.tflops_per_gpu:.0f} TFLOP/s per GPU"
        # the 2021 paper's count with full recompute (TrainEstimate.tflops_per_gpu), where the MFU
        # counts the model's FLOPs alone: 624 TFLOP/s beside MFU 47.4% read as a contradiction, and
        # "Megatron's count" as the current log's, which has no recompute term (two CLI reads)
        + (f" (Narayanan et al. 2021's count, eq. 3: the recomputed forward included; "
           f"{best.model_tflops_per_gpu:.0f} without it, the model FLOPs the MFU counts)"
           if c.recompute == "full" else "")
        + f", MFU {best.mfu:.1%}{FP8_MFU_BASIS if c.precision == 'fp8' else ''}.",
    ]
    if best.faster_split is not None:
        lines.append(faster_split_line(best))
    if training_dtype(plan.model) == "float16" and c.precision != "fp8":
        grads = ("fp16 main gradients: --grad-reduce bf16 on a float16 checkpoint keeps and reduces them in the "
                 "parameters' dtype, Megatron having no bf16 gradients under --fp16 (2 bytes a parameter, as "
                 "priced)" if c.grad_reduce == "bf16" else
                 "fp32 main gradients: --accumulate-allreduce-grads-in-fp32")
        lines.append(f"Precision: fp16 mixed precision, the checkpoint's dtype (--fp16, {grads}); --precision "
                     f"bf16 trains in bfloat16 instead (a run from scratch has no checkpoint to follow).")
    lines += mtp_notes(plan.model, c.pp)
    lines += beyond_positions_lines(plan.model, plan.request.seq_len)
    if best.bubble_share_of_step > WIDE_BUBBLE_FRACTION:
        lines.append(f"Bubble: {share_text(best.bubble_share_of_step)} of the step the pipeline idles, with only "
                     f"{best.num_micro_batches} micro-batch{'es' if best.num_micro_batches != 1 else ''} over "
                     f"{c.pp} stages: the global batch of {plan.request.global_batch} is small for "
                     f"{plan.num_gpus:,} GPUs; a larger --global-batch, or fewer GPUs (--gpus), runs it more "
                     f"efficiently.")
    lines += attention_kernel_lines(plan.cluster.gpu, c)
    off = (tp_comm_overlap_off_reason(plan.model, plan.cluster, c)
           if plan.request.tp_comm_overlap and plan.request.engine == "megatron" else None)
    if off is not None:
        lines.append(f"TP comm overlap (--tp-comm-overlap) off: {off}.")
    if plan.request.engine != "megatron" and c.ep > 1:
        lines.append(f"EP all-to-all: {plan.request.engine}'s standard NCCL dispatch, exposed (no combined 1F1B; its "
                     f"DeepEP backend and DualPipeV overlap are not planned).")
    moe_off = moe_comm_overlap_off_reason(plan.model, plan.request, c)
    if moe_off is not None:
        lines.append(f"EP {exchange_name(c.moe_dispatcher)} overlap (--overlap-moe-expert-parallel-comm) off: {moe_off}.")
    if plan.request.moe_dispatcher == "deepep" and c.ep <= 1 and plan.model.is_moe:
        # asked for, but the recommendation has no expert parallelism to dispatch over (a CLI
        # read: Mixtral at ep=1 said nothing of it)
        lines.append("--moe-dispatcher deepep: not used: the recommended configuration has no expert parallelism "
                     "(ep=1: every GPU holds a TP share of every expert, so no tokens are dispatched); --layout "
                     "ep=... plans one that does.")
    no_deepep = moe_dispatcher_off_reason(plan.model, plan.cluster, plan.request, c)
    if no_deepep is not None:
        lines.append(f"Tokens move on NCCL all-to-alls (--moe-token-dispatcher-type alltoall), not DeepEP: {no_deepep}.")
    lines += bf16_faster_lines(plan)
    lines += bf16_states_faster_lines(plan)
    lines += passed_over_lines(plan)
    lines += tight_passed_over_lines(plan)
    lines += shortfall_lines(plan)
    # the runner-up: the next row that no line above already named as the faster one passed over
    named = {id(plan.passed_over), id(plan.tight_passed_over)}
    runners = [e for e in plan.layouts[1:] if id(e) not in named]
    if runners:
        runner = runners[0]
        gap = slower_fraction(runner, best)
        # a row ranked below for a policy (memory margin, TP in the node) may still price more
        # tokens/s: "-0.4% slower" read as a typo (a CLI read)
        than = (f"{gap:.1%} slower" if gap >= 0 else
                f"{-gap:.1%} faster, ranked below it for the same reason as the row named above")
        lines.append(f"Runner-up: {config_words(runner)}{_differences(runner, best)}, {than}.")
    return lines


def attention_kernel_lines(gpu: GPU, c: TrainConfig) -> list[str]:
    """What --attention-kernel fa2 prices against the engine's own kernel, where they differ."""
    if c.attention != "flash" or c.attention_kernel != "fa2":
        return []
    auto = efficiency.flash_attention_forward_fraction(gpu.flash_attention_forward_fraction, "auto",
                                                       gpu.compute_capability)
    fa2 = efficiency.flash_attention_forward_fraction(gpu.flash_attention_forward_fraction, "fa2",
                                                      gpu.compute_capability)
    auto = efficiency.flash_attention_fractions(auto)[0]
    fa2 = efficiency.flash_attention_fractions(fa2)[0]
    if fa2 >= auto:
        return [f"Attention: FlashAttention-2 (--attention-kernel fa2) is what this GPU's measured flash kernels "
                f"run at already ({auto:.0%} of the 16-bit peak forward)."]
    return [f"Attention: FlashAttention-2 forced (--attention-kernel fa2), {fa2:.0%} of the 16-bit peak forward "
            f"on {gpu.name}; the engine's own kernel (--attention-kernel auto: cuDNN's on Hopper and later) "
            f"runs {auto:.0%}."]


def faster_split_line(e: TrainEstimate) -> str:
    """Why the stages are not split the fastest way: that split did not fit."""
    faster = e.faster_split
    assert faster is not None
    return (f"Stage split {layers_text(e.num_layers_per_stage)}: the faster {layers_text(faster.num_layers_per_stage)} "
            f"does not fit (stage {faster.stage} over by {gib(faster.over_bytes)}).")


def layers_text(layers: tuple[int, ...]) -> str:
    """Layers per stage as "7 | 8 x14 | 7" (first | middle x count | last; the middle stages of
    a split are alike; "11 | 12 | 9" with one middle stage)."""
    middle = "" if len(layers) < 3 else f" | {layers[1]}" + (f" x{len(layers) - 2}" if len(layers) > 3 else "")
    return f"{layers[0]}{middle} | {layers[-1]}"


def _differences(other: TrainEstimate, best: TrainEstimate) -> str:
    """What else sets another configuration apart from the recommendation (the runner-up can
    share its layout, micro-batch and schedule): ", recompute full, ZeRO-0"."""
    def shown(c: TrainConfig, experts: bool) -> tuple[str, ...]:
        on = {True: "on", False: "off"}
        common = (f"recompute {c.recompute_label}", f"sequence parallel {on[c.sequence_parallel]}", f"ZeRO-{c.zero_stage}",
                  f"TP comm overlap {on[c.tp_comm_overlap]}")
        # the EP settings only between two layouts with EP (the ep= of the layout says the rest)
        return common + ((f"EP {exchange_name(c.moe_dispatcher)} overlap {on[c.moe_comm_overlap]}",
                          f"{'DeepEP' if c.moe_dispatcher == 'deepep' else 'NCCL all-to-all'} dispatcher")
                         if experts else ())

    experts = other.config.ep > 1 and best.config.ep > 1
    return "".join(f", {mine}" for mine, theirs in zip(shown(other.config, experts), shown(best.config, experts),
                                                       strict=True) if mine != theirs)


def beyond_positions_lines(model, seq_len: int) -> list[str]:
    """A rotary model trained past its max_position_embeddings (learned positions are refused
    in cli.py): allowed, as long-context training extends a checkpoint, but said, since the
    launch keeps the rotary settings (Megatron's --max-position-embeddings raised to the
    sequence, emit/megatron.py)."""
    if seq_len <= model.max_position_embeddings:
        return []
    return [f"Positions: --seq-len {seq_len:,} is beyond {model.name}'s {model.max_position_embeddings:,} "
            f"(max_position_embeddings); the launch trains at that length with the model's rotary settings, so "
            f"positions past {model.max_position_embeddings:,} run outside its trained range (context extension "
            f"usually raises the rotary base or scaling with it)."]


FP8_MFU_BASIS = " (model FLOPs over the bf16 dense peak; the fp8 peak is twice that)"


def _cp(config) -> str:
    return f" cp={config.cp}" if config.cp > 1 else ""


def _dp_link_text(e: TrainEstimate) -> str:
    """Where the data-parallel collectives run: the dp * cp ranks that hold the same weights (the
    CP ranks among them: Megatron's distributed optimizer and FSDP shard over both), none at
    dp * cp = 1."""
    c = e.config
    if e.dp_link is None:
        return "no data-parallel group (dp=1)"
    if c.cp > 1:
        return f"data parallel over the {c.dp * c.cp} ranks of dp x cp (the same weights) on {e.dp_link}"
    return f"data parallel on {e.dp_link}"


def _cp_link(e: TrainEstimate, engine: str) -> str:
    """The CP exchange's link and its KV traffic per layer and micro-batch (how much the
    attention hides): Megatron's ring of sends, torchtitan's all-gather (cp_exchange_label)."""
    cp = e.layer_terms.cp if e.layer_terms is not None else None
    if e.config.cp <= 1 or cp is None:
        return ""
    how, what = ("all-gather", "gathers") if CP_KV_ROTATION[engine] == "allgather" else ("ring", "sends")
    return (f"; context parallel (cp={e.config.cp}) {how} on {cp.link}, {ms(cp.total)} of KV {what} per layer "
            f"and micro-batch, {ms(cp.exposed)} exposed")


def _ep(config) -> str:
    return f" ep={config.ep}" if config.ep > 1 else ""


def _ep_link(e: TrainEstimate) -> str:
    """The EP group's all-to-all link and its time per MoE layer and micro-batch."""
    if e.config.ep <= 1:
        return ""
    exchange = ("DeepEP dispatch and combine (Megatron's flex dispatcher; needs the deep_ep package)"
                if e.config.moe_dispatcher == "deepep" else "all-to-all")
    text = (f"; expert parallel (ep={e.config.ep}) {exchange} on {e.alltoall_link}, "
            f"{ms(e.alltoall_seconds_per_layer)} per MoE layer and micro-batch")
    ep = e.layer_terms.ep if e.layer_terms is not None else None
    if e.config.moe_comm_overlap and ep is not None and ep.exposed_seconds_per_moe_layer is not None:
        text += (f", {ms(ep.exposed_seconds_per_moe_layer)} of it exposed under the combined 1F1B "
                 f"(--overlap-moe-expert-parallel-comm)")
    return text


def shown_shortfall(plan: TrainPlan):
    """The plan's in-node shortfall when the recommendation shown still has TP across nodes."""
    short = plan.shortfall
    if short is None or not plan.layouts or plan.layouts[0].tp_link == short_link(plan):
        return None
    return short


def short_link(plan: TrainPlan) -> str | None:
    """The intra-node link kind (what an in-node TP group runs on)."""
    link = plan.cluster.intra_node
    return None if link is None else link.kind


def in_node_alternative(plan: TrainPlan) -> tuple[int, TrainEstimate] | None:
    """(rank, estimate) of the fastest configuration listed whose TP stays inside a node (or
    has none), when the recommendation's TP group crosses nodes; None otherwise or when no
    such configuration is listed (a bounded plan lists only what can reach its rows)."""
    in_node = short_link(plan)
    if not plan.layouts or plan.layouts[0].config.tp == 1 or plan.layouts[0].tp_link == in_node:
        return None
    return next(((i + 1, e) for i, e in enumerate(plan.layouts) if e.config.tp == 1 or e.tp_link == in_node), None)


def slower_fraction(e: TrainEstimate, best: TrainEstimate) -> float:
    """How much fewer tokens/s `e` runs than `best`: 1 - e/best."""
    return 1 - e.tokens_per_second / best.tokens_per_second


def config_words(e: TrainEstimate) -> str:
    """`tp=8 cp=2 pp=16 dp=4 b=1 interleaved/2`: a configuration as the plan's lines name it."""
    c = e.config
    return f"tp={c.tp}{_cp(c)} pp={c.pp} dp={c.dp}{_ep(c)} b={c.micro_batch_size} {_schedule(e)}"


def faster_than_first(e: TrainEstimate, plan: TrainPlan) -> float:
    """How much more tokens/s `e` prices than the recommendation: e/first - 1."""
    return e.tokens_per_second / plan.layouts[0].tokens_per_second - 1


def passed_over_lines(plan: TrainPlan) -> list[str]:
    """Why the recommendation is not the fastest row: train_search.prefer_tp_inside_a_node."""
    over = plan.passed_over
    if over is None:
        return []
    c, faster = over.config, faster_than_first(over, plan)
    return [f"TP kept inside a node: {config_words(over)} prices {faster:.1%} more tokens/s with its TP all-reduces "
            f"on {over.tp_link}, under the {TP_ACROSS_NODES_MARGIN:.0%} that every layer's all-reduce across the NICs must win by to "
            f"be recommended (--layout tp={c.tp} takes it)."]


def tight_passed_over_lines(plan: TrainPlan) -> list[str]:
    """Why the recommendation is not the fastest row: train_search.prefer_headroom; or, where
    no row near it had room, that the recommendation itself is at the edge of memory (a CLI
    read: 79.1 of 79.1 GiB recommended without a word)."""
    over, best = plan.tight_passed_over, plan.layouts[0]
    if over is None and headroom_bytes(best) < TIGHT_MEMORY_FRACTION * best.capacity_per_gpu_bytes:
        c = best.config
        room = [option for option, open_ in ((f"--micro-batch {c.micro_batch_size // 2}", c.micro_batch_size > 1),
                                             ("more --recompute", c.recompute != "full"),
                                             (f"--recompute-num-layers above {c.recompute_num_layers}",
                                              c.recompute == "full" and c.recompute_num_layers is not None
                                              and best.rerun_layers + c.virtual_stages
                                              < best.num_layers_per_stage[best.slowest_stage]),
                                             ("--zero 3", c.zero_stage < 3 and plan.request.engine == "megatron"))
                if open_] or ["more GPUs (--gpus)"]
        return [f"Memory margin: this configuration leaves {gib(headroom_bytes(best))} of "
                f"{gib(best.capacity_per_gpu_bytes)} free, under the {TIGHT_MEMORY_FRACTION:.0%} that buffers the "
                f"estimate does not itemize may need, and nothing within {MEMORY_TIE_FRACTION:.0%} of its speed "
                f"leaves more; {' or '.join(room)} buys room at some speed."]
    if over is None:
        return []
    c, faster = over.config, faster_than_first(over, plan)
    return [f"Memory margin: {config_words(over)}, recompute {c.recompute_label}, prices {faster:.2%} more tokens/s but "
            f"uses {gib(over.memory_per_gpu_bytes)} of {gib(over.capacity_per_gpu_bytes)}, under the {TIGHT_MEMORY_FRACTION:.0%} free that buffers the estimate "
            f"does not itemize may need; this one leaves {gib(headroom_bytes(best))} (within "
            f"{MEMORY_TIE_FRACTION:.0%} of the fastest, that margin is taken)."]


BREAKDOWN_NAMES = {"compute": "compute", "bubble": "the bubble", "tp_comm": "TP communication",
                   "pp_comm": "PP communication", "dp_comm_exposed": "exposed DP communication",
                   "ep_comm": "the EP exchange", "cp_comm": "the CP exchange", "host": "host waits (MoE syncs)"}


def bf16_faster_lines(plan: TrainPlan) -> list[str]:
    """--precision fp8 where bf16 runs more tokens/s (train_search.bf16_if_faster): by how much,
    its configuration, and the step term fp8's plan spends the most more on."""
    bf16 = plan.bf16_faster
    if bf16 is None:
        return []
    fp8, c = plan.layouts[0], bf16.config
    faster = bf16.tokens_per_second / fp8.tokens_per_second - 1
    a, b = fp8.time_breakdown_seconds, bf16.time_breakdown_seconds
    grown = max(BREAKDOWN_NAMES, key=lambda name: getattr(a, name) - getattr(b, name))
    more = getattr(a, grown) - getattr(b, grown)
    why = (f"; the fp8 plan's step spends {ms(more)} more on {BREAKDOWN_NAMES[grown]} (micro-batch "
           f"{fp8.config.micro_batch_size}, recompute {fp8.config.recompute_label} against {c.micro_batch_size}, "
           f"{c.recompute_label})" if more > 0 else "")
    return [f"fp8 is slower here: bf16 runs {faster:.1%} more tokens/s ({bf16.tokens_per_second:,.0f}) at "
            f"tp={c.tp}{_cp(c)} pp={c.pp} dp={c.dp}{_ep(c)} b={c.micro_batch_size} {_schedule(bf16)}{why}; "
            f"plan without --precision fp8 to launch it."]


def bf16_states_faster_lines(plan: TrainPlan) -> list[str]:
    """Where bf16 optimizer states run the best configuration faster (train_search.
    bf16_states_if_faster): by how much, its configuration, and the memory the states give back."""
    bf16 = plan.bf16_states_faster
    if bf16 is None:
        return []
    fp32, c = plan.layouts[0], bf16.config
    faster = bf16.tokens_per_second / fp32.tokens_per_second - 1
    return [f"Optimizer states: with bf16 Adam moments (--optimizer-states bf16, Megatron's precision-aware "
            f"optimizer; a numerics choice, not searched) the best runs {faster:.1%} more tokens/s "
            f"({bf16.tokens_per_second:,.0f}) at tp={c.tp}{_cp(c)} pp={c.pp} dp={c.dp}{_ep(c)} b={c.micro_batch_size} "
            f"{_schedule(bf16)}, recompute {c.recompute_label}: its optimizer takes "
            f"{gib(bf16.memory.optimizer_bytes)} a GPU, this plan's {gib(fp32.memory.optimizer_bytes)} "
            f"(recompute {fp32.config.recompute_label})."]


def other_config_json(e: TrainEstimate | None, **extra: Any) -> dict | None:
    """A configuration the plan names beside its rows (passed over, bf16, in-node): its
    degrees and tokens/s, and what else the caller says of it; None for none."""
    if e is None:
        return None
    c = e.config
    return {"tp": c.tp, "cp": c.cp, "pp": c.pp, "dp": c.dp, "ep": c.ep, "tokens_per_second": e.tokens_per_second,
            **extra}


def bf16_faster_json(plan: TrainPlan) -> dict | None:
    bf16 = plan.bf16_faster
    return other_config_json(bf16, micro_batch_size=bf16.config.micro_batch_size,
                             recompute=bf16.config.recompute) if bf16 else None


def bf16_states_faster_json(plan: TrainPlan) -> dict | None:
    bf16 = plan.bf16_states_faster
    return other_config_json(bf16, micro_batch_size=bf16.config.micro_batch_size, recompute=bf16.config.recompute,
                             recompute_num_layers=bf16.config.recompute_num_layers,
                             optimizer_bytes=bf16.memory.optimizer_bytes) if bf16 else None


def passed_over_json(plan: TrainPlan) -> dict | None:
    over = plan.passed_over
    return other_config_json(over, tp_link=over.tp_link) if over else None


def tight_passed_over_json(plan: TrainPlan) -> dict | None:
    over = plan.tight_passed_over
    return other_config_json(over, memory_per_gpu_bytes=over.memory_per_gpu_bytes,
                             capacity_per_gpu_bytes=over.capacity_per_gpu_bytes) if over else None


def in_node_alternative_json(plan: TrainPlan) -> dict | None:
    found = in_node_alternative(plan)
    if found is None:
        return None
    rank, e = found
    return {"rank": rank, **other_config_json(e, slower_fraction=slower_fraction(e, plan.layouts[0]))}


def shortfall_lines(plan: TrainPlan) -> list[str]:
    short = shown_shortfall(plan)
    found = in_node_alternative(plan) if short is None else None
    if found is not None:
        rank, e = found
        best = plan.layouts[0]
        tp_share = best.time_breakdown_seconds.tp_comm / best.step_time_seconds
        c = e.config
        return [f"TP crosses nodes: every TP all-reduce runs over the NICs ({tp_share:.0%} of the step); the "
                f"fastest with TP inside a node is row {rank}: tp={c.tp}{_cp(c)} pp={c.pp} "
                f"dp={c.dp}{_ep(c)} b={c.micro_batch_size} {_schedule(e)}, "
                f"{slower_fraction(e, best):.1%} slower (--layout tp={c.tp} keeps it)."]
    if short is None:
        return []
    c, mem = short.config, short.memory
    best = plan.layouts[0]
    tp_share = best.time_breakdown_seconds.tp_comm / best.step_time_seconds
    return [
        f"TP crosses nodes: every TP all-reduce runs over the NICs ({tp_share:.0%} of the step), because no "
        f"layout with TP inside a node fits. Closest: tp={c.tp} pp={c.pp} dp={c.dp} b={c.micro_batch_size} "
        f"{c.schedule}, recompute {c.recompute_label}, ZeRO-{c.zero_stage}: {gib(mem.total_bytes)} of "
        f"{gib(short.capacity_per_gpu_bytes)} on stage {mem.stage}, over by {gib(short.over_bytes)} "
        f"(weights {gib(mem.weights_bytes)}, gradients {gib(mem.gradient_bytes)}, optimizer "
        f"{gib(mem.optimizer_bytes)}, activations {gib(mem.activation_bytes)}, overhead {gib(mem.overhead_bytes)}).",
        *(f"  To keep TP inside the node: {fix}." for fix in short.fixes),
    ]


def render_rejected(plan: TrainPlan, show_all: bool = True) -> Table:
    """Every rejected layout, or (show_all False) the closest misses."""
    from rich.table import Table

    rows, more = (list(plan.rejected), 0) if show_all else closest_misses(plan.rejected, MAX_REJECTED_SHOWN)
    title = f"Rejected layouts ({len(plan.rejected):,})" + (
        f": the {len(rows)} closest; {more:,} more with --show-rejected" if more else "")
    table = Table(title=title)
    for header in ("tp", "cp", "pp", "dp", "ep", "configs", "why not"):
        table.add_column(header, justify="left" if header == "why not" else "right")
    for r in rows:
        table.add_row(str(r.layout.tp), str(r.layout.cp), str(r.layout.pp), str(r.layout.dp), str(r.layout.ep),
                      str(r.num_configs_rejected), "; ".join(r.reasons))
    return table


def render_plan(model, cluster, plan: TrainPlan, steps: tuple[LaunchStep, ...], top: int,
                show_rejected: bool, launcher: str | None = None) -> None:
    """`launcher`: the launch's title (default Megatron-LM and its release)."""
    out = console()
    out.print(describe_model(trained_model(model, plan.request)))  # with the MTP modules it trains
    out.print(describe_cluster(cluster))
    if plan.layouts:
        out.print(render_table(plan, top))
        for line in summary_lines(plan):
            out.print(line)
        launcher = launcher or f"Megatron-LM {plan.request.engine_versions.megatron}"
        for step in steps:
            for file in step.files:
                out.print(f"\n{launcher} config, write to {file.path} on {_where(step)}:")
                out.print(file.text, markup=False, soft_wrap=True, end="")
            out.print(f"\n{launcher} launch (run on {_where(step)}):")
            out.print(step.shell(), markup=False, soft_wrap=True)
        for line in per_node_lines(steps):
            out.print(line, markup=False)
    else:
        out.print("No configuration fits: see the reasons below"
                  + (" (or add GPUs, recompute, ZeRO)." if short_of_memory(plan) else "."))
        for suggestion in plan.suggestions:
            out.print(f"What would fit: {suggestion}.", markup=False)
    if show_rejected or not plan.layouts:
        out.print(render_rejected(plan, show_all=show_rejected))
    elif plan.rejected:
        out.print(f"{units.plural(len(plan.rejected), 'layout')} rejected (--show-rejected lists why).")


def _where(step: LaunchStep) -> str:
    if step.nodes.count == 1:
        return "this node"
    return f"each of the {step.nodes.count} nodes" if step.role == ALL_NODES else step.where


def pipeline_split(config) -> str:
    """even | first_last (--decoder-first/last-pipeline-num-layers) | account (the embedding
    and loss counted as layers, --account-for-embedding/loss-in-pipeline-split)."""
    if config.account_for_embedding_and_loss:
        return "account"
    return "even" if config.first_last_layers is None else "first_last"


def estimate_json(e: TrainEstimate, rank: int, steps: tuple[LaunchStep, ...],
                  shared_jsonable: Callable[[Any], Any] = to_jsonable) -> dict[str, Any]:
    """`shared_jsonable`: to_jsonable for the sub-results a search shares between
    configurations (layer terms, DP collectives), remembered by a caller that writes many."""
    c, mem, t = e.config, e.memory, e.time_breakdown_seconds
    return {
        "tp": c.tp, "cp": c.cp, "pp": c.pp, "dp": c.dp, "ep": c.ep, "rank": rank,
        "micro_batch_size": c.micro_batch_size, "num_micro_batches": e.num_micro_batches,
        # no pipeline schedule without PP (the table's "no PP"; Megatron runs forward_backward_no_pipelining)
        "schedule": None if c.pp == 1 else c.schedule, "virtual_stages": c.virtual_stages, "recompute": c.recompute,
        "recompute_num_layers": c.recompute_num_layers, "recompute_every": c.recompute_every,
        "num_layers_per_stage": list(e.num_layers_per_stage), "slowest_stage": e.slowest_stage,
        "pipeline_split": pipeline_split(c),
        "sequence_parallel": c.sequence_parallel, "zero_stage": c.zero_stage, "attention": c.attention,
        "attention_kernel": c.attention_kernel,
        "precision": c.precision, "fp8_recipe": c.fp8_recipe, "grad_reduce": c.grad_reduce,
        "optimizer_states": c.optimizer_states,
        "tp_comm_overlap": c.tp_comm_overlap, "moe_comm_overlap": c.moe_comm_overlap,
        "moe_dispatcher": c.moe_dispatcher if c.ep > 1 else None,
        "faster_split": None if e.faster_split is None else {
            "num_layers_per_stage": list(e.faster_split.num_layers_per_stage),
            "over_bytes": e.faster_split.over_bytes, "stage": e.faster_split.stage},
        "memory_per_gpu_bytes": e.memory_per_gpu_bytes, "capacity_per_gpu_bytes": e.capacity_per_gpu_bytes,
        "memory": {"weights_bytes": mem.weights_bytes, "gradient_bytes": mem.gradient_bytes,
                   "optimizer_bytes": mem.optimizer_bytes, "activation_bytes": mem.activation_bytes,
                   "overhead_bytes": mem.overhead_bytes, "worst_stage": mem.stage,
                   "worst_stage_num_layers": mem.num_layers},
        "step_time_seconds": e.step_time_seconds, "tokens_per_second": e.tokens_per_second,
        "tflops_per_gpu": e.tflops_per_gpu, "model_tflops_per_gpu": e.model_tflops_per_gpu, "mfu": e.mfu,
        # the peak MFU divides by, whatever the precision (an fp8 plan's 0.85 read as fp8's: a read)
        "mfu_peak_basis": "16-bit dense",
        "bubble_fraction": e.bubble_fraction, "bubble_over_compute_ratio": e.bubble_over_compute_ratio,
        "bubble_share_of_step": e.bubble_share_of_step,
        "tp_allreduce_seconds_per_layer": e.tp_allreduce_seconds_per_layer,
        "tp_link": e.tp_link, "pp_link": e.pp_link, "dp_link": e.dp_link,
        "alltoall_seconds_per_layer": e.alltoall_seconds_per_layer, "alltoall_link": e.alltoall_link,
        "cp_comm_seconds_per_layer": e.layer_terms.cp.total if e.layer_terms else 0.0,
        "cp_link": e.layer_terms.cp.link if e.layer_terms else None,
        "time_breakdown_seconds": {"compute": t.compute, "bubble": t.bubble, "tp_comm": t.tp_comm,
                                   "pp_comm": t.pp_comm, "dp_comm_exposed": t.dp_comm_exposed,
                                   "ep_comm": t.ep_comm, "cp_comm": t.cp_comm, "host": t.host},
        "stage_memories": to_jsonable(e.stage_memories),
        "layer_terms": shared_jsonable(e.layer_terms),
        "stage_seconds_per_micro_batch": e.stage_seconds_per_micro_batch,
        "pp_send_seconds": e.pp_send_seconds, "pp_send_bytes": e.pp_send_bytes,
        "dp_collectives": shared_jsonable(e.dp_collectives),
        "command": [step_json(s) for s in steps],
    }


def print_plan_json(model, cluster, plan: TrainPlan, request, steps_for: StepsFor,
                    top: int | None = None, launch_not_emitted: str | None = None,
                    extra_notes: tuple[str, ...] = ()) -> None:
    """`top`: the best configurations to list (None: every feasible one); `launch_not_emitted`:
    why no configuration has a command (the engine cannot build this model); `extra_notes`: the
    CLI's notes beside the caveats (train_cli.pinned_zero_note)."""
    converted: dict[Any, Any] = {}  # equal sub-results (frozen dataclasses) convert alike

    def shared_jsonable(value: Any) -> Any:
        try:
            return converted[value]
        except KeyError:
            out = converted[value] = to_jsonable(value)
            return out

    layouts = [estimate_json(e, i + 1, steps_for(e), shared_jsonable) for i, e in enumerate(plan.layouts[:top])]
    print_json_rows({
        "workload": "train",
        "model": model.name,
        # counting the MTP modules the run trains (--mtp-layers), as the plan prices them
        "model_summary": to_jsonable(model_summary(trained_model(model, request))),
        "cluster": cluster.name,
        "num_gpus": plan.num_gpus,
        "global_batch": request.global_batch,
        "seq_len": request.seq_len,
        "engine": request.engine,
        "mtp_layers": plan.model.num_mtp_layers,
        # the 16-bit type of the mixed precision (--fp16 or --bf16; a layout's "precision" says bf16 or fp8)
        "training_dtype": training_dtype(plan.model),
        # the request's main-gradient and Adam-moment dtypes (each layout repeats them)
        "grad_reduce": request.grad_reduce,
        "optimizer_states": request.optimizer_states,
        "engine_versions": to_jsonable(request.engine_versions),
        "launch_not_emitted": launch_not_emitted,
        "recommended": layouts[0] if layouts else None,
        "layouts": layouts,
        "rejected": [{"tp": r.layout.tp, "cp": r.layout.cp, "pp": r.layout.pp, "dp": r.layout.dp, "ep": r.layout.ep,
                      "reasons": list(r.reasons),
                      "num_configs_rejected": r.num_configs_rejected} for r in plan.rejected],
        "num_configs_evaluated": plan.num_configs_evaluated,
        "num_configs_bounded": plan.num_configs_bounded,
        "in_node_shortfall": to_jsonable(shown_shortfall(plan)),
        "in_node_alternative": in_node_alternative_json(plan),
        # the faster configuration with TP across nodes ranked below the recommendation (None: none)
        "tp_across_nodes_passed_over": passed_over_json(plan),
        "tight_memory_passed_over": tight_passed_over_json(plan),
        # --precision fp8: the best bf16 configuration where it runs more tokens/s (None: fp8 is as fast)
        "bf16_faster": bf16_faster_json(plan),
        # fp32 optimizer states, a recommendation that recomputes: the best with bf16 ones where faster (else None)
        "bf16_optimizer_states_faster": bf16_states_faster_json(plan),
        "suggestions": list(plan.suggestions),
        "notes": [*extra_notes,
                  *training_caveats(model, request, plan.layouts[0].config.recompute if plan.layouts else None)],
    })
