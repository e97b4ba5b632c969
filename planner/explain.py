"""`plan explain`: one layout in depth, as data (frozen dataclasses, SI units).

Sections: where every GPU's rank lands (placement map), memory per stage against
capacity, every collective one layer performs, the pipeline timeline, the step's
time breakdown, and how the recommendation moves when uncertain inputs move
(planner/sensitivity.py). Every number of the plan is read from the estimate
(ServeEstimate keeps its per-stage steps, prefill times and collectives), so explain and
`plan --json` cannot disagree; the only extra evaluation is the alpha-beta model's
split of a collective into its latency and bandwidth terms, shown beside what was used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from planner import sensitivity, units
from planner.cost import efficiency as eff
from planner.cost.comm import allgather_seconds, alltoall_seconds
from planner.cost.continuous_batching import prompt_service_seconds
from planner.cost.params import activation_bytes_per_element
from planner.cost.serving_memory import (
    deepep_buffer_bytes,
    kv_tokens_per_running_sequence,
    max_num_batched_tokens,
    overhead_bytes,
    stage_moe_layers,
)
from planner.cost.serving_time import (
    achievable_flops_per_s,
    linear_hbm_utilization,
    matmul_precision,
    moe_kernel,
    pipeline_hop_seconds,
    round_busy_seconds,
    tp_allreduce_seconds_per_layer,
)
from planner.cost.timeline import (
    MAX_TIMELINE_BLOCKS,
    MAX_TIMELINE_STAGES,
    Timeline,
    decode_timeline,
)
from planner.layout import Layout, ep_group_topology, intra_node_link, place
from planner.render.catalog import measured_links_words
from planner.requests import DEFAULT_ALL2ALL_BACKEND, LayoutFilter, ServeRequest
from planner.serve import ServeEstimate, footprint_basis, lockstep_ranks
from planner.serve_search import ServePlan, evaluate, plan_serving
from planner.specs import ClusterSpec, ModelSpec, SpecError

DECODE_ROUNDS_DRAWN = 2
"""Decode rounds (tokens per batch) the serving timeline draws: enough to see the steady state."""


@dataclass(frozen=True)
class GpuSlot:
    node: int
    local_index: int
    rank: int | None
    """Global rank, None when the plan leaves this GPU unused (--gpus)."""
    stage: int | None = None
    tp_rank: int | None = None
    dp_replica: int | None = None
    cp_rank: int = 0
    """The context-parallel rank (training with cp > 1; 0 otherwise)."""


@dataclass(frozen=True)
class Boundary:
    """One pipeline send: the last rank-group of `from_stage` to `to_stage` of one replica."""

    dp_replica: int
    from_stage: int
    from_node: int
    to_node: int
    link: str
    cp_rank: int = 0


MAX_NODES_MAPPED = 8
"""Nodes whose GPUs the map lists (rank order repeats the pattern on the rest; a 10**5-node
map of every GPU took seconds and 200 MB of JSON)."""
MAX_BOUNDARIES_LISTED = 64
"""Pipeline boundaries listed one by one (all are counted)."""


@dataclass(frozen=True)
class PlacementMap:
    num_nodes: int
    gpus_per_node: int
    layout: Layout
    slots: tuple[GpuSlot, ...]
    """Every GPU of the first MAX_NODES_MAPPED nodes."""
    tp_link: str | None
    tp_crosses_node: bool
    boundaries: tuple[Boundary, ...]
    """The first MAX_BOUNDARIES_LISTED pipeline boundaries, replica by replica."""
    num_boundaries: int = 0
    num_boundaries_crossing_nodes: int = 0
    ep_link: str | None = None
    """The slowest link an EP group's exchanges cross (None without EP)."""
    ep_exchange: str | None = None
    """How an MoE layer's tokens reach the experts: Megatron's dispatch and combine
    all-to-alls (training), vLLM's dispatch all-gather and combine reduce-scatter (serving, EP
    over several DP ranks), None when no exchange is needed (serving, EP inside one TP group)."""
    ep_ranks_per_node: int = 0
    ep_num_nodes: int = 0
    """Nodes one EP group spans, with ep_ranks_per_node of its GPUs on each."""
    pp_outermost: bool = False
    """Megatron's / torchtitan's rank order (stage outermost), else vLLM's (layout.py)."""
    training_engine: str = "megatron"
    """Whose rank order pp_outermost is (Megatron's RankGenerator or torchtitan's device mesh: the same order)."""
    host_staged: bool = False
    """The node's GPUs have no peer-to-peer access: transfers inside it go through host memory."""


@dataclass(frozen=True)
class MemorySegment:
    name: str
    bytes: float


@dataclass(frozen=True)
class MemoryBar:
    """One GPU of the stages listed (identical stages share a bar)."""

    stages: tuple[int, ...]
    label: str
    segments: tuple[MemorySegment, ...]
    capacity_bytes: float
    budget_bytes: float
    """What the workload may use (vLLM: capacity * gpu_memory_utilization)."""
    note: str = ""

    @property
    def used_bytes(self) -> float:
        return sum(s.bytes for s in self.segments)

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.used_bytes


@dataclass(frozen=True)
class CollectiveRow:
    phase: str
    """decode | prefill (serving); forward | backward | step (training)."""
    name: str
    kind: str
    """all-reduce | send | reduce-scatter | all-gather."""
    group_size: int
    message_bytes: float
    link: str
    latency_seconds: float
    """The model's time for an empty message (the alpha terms)."""
    bandwidth_seconds: float
    """The model's time at this size less the latency term (the S/beta terms)."""
    total_seconds: float
    """As the model uses it: the measured curve when there is one, else latency + bandwidth."""
    measured_seconds: float | None
    count_per_step: float
    """How many lie on the step's critical path: a decode round on the slowest stage
    (k batches x L_s layers; p sends, the loop back included), a prefill (all L layers;
    p - 1 sends)."""
    share_of_step: float
    """count_per_step * total_seconds over the step time."""


@dataclass(frozen=True)
class BreakdownSegment:
    name: str
    seconds: float


@dataclass(frozen=True)
class TimeBreakdown:
    what: str
    total_seconds: float
    segments: tuple[BreakdownSegment, ...]


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    unit: str
    """s | tok/s | count | fraction (a share: written as `plan` writes one, 0.4%, <0.1%, or to
    `percent_digits`)."""
    percent_digits: int | None = None
    """A fraction's decimals as a percent in the text (MFU: one, as `plan`'s table); None: as a share."""


@dataclass(frozen=True)
class Explanation:
    workload: str
    model: str
    cluster: str
    layout: Layout
    objective: str
    is_recommended: bool
    metrics: tuple[Metric, ...]
    notes: tuple[str, ...]
    placement: PlacementMap
    memory: tuple[MemoryBar, ...]
    collectives: tuple[CollectiveRow, ...]
    timeline: Timeline | None
    """None when the schedule has more stages or blocks than a chart draws (the caption says)."""
    timeline_caption: str
    breakdown: TimeBreakdown
    sensitivity: sensitivity.SensitivityReport | None
    ttft_breakdown: TimeBreakdown | None = None
    """Serving: what the mean time to first token is made of (serve_ttft_breakdown)."""


def placement_map(cluster: ClusterSpec, layout: Layout, pp_outermost: bool = False,
                  all2all_backend: str = DEFAULT_ALL2ALL_BACKEND, training_engine: str = "megatron") -> PlacementMap:
    """Every GPU's (stage, CP rank, TP rank, DP replica) in the engine's rank order
    (layout.py): vLLM's r = (dp * pp + stage) * tp + tp_rank, or with `pp_outermost`
    Megatron's and torchtitan's r = ((stage * dp + dp) * cp + cp_rank) * tp + tp_rank, which
    also places the EP group as Megatron does (ep consecutive ranks, layout.ep_group_ranks),
    as the training estimate prices it; node = r // gpus_per_node."""
    gpn = cluster.gpus_per_node
    slots = []
    for index in range(min(cluster.num_nodes, MAX_NODES_MAPPED) * gpn):
        node, local = divmod(index, gpn)
        if index >= layout.num_gpus:
            slots.append(GpuSlot(node, local, None))
            continue
        group, tp_rank = divmod(index, layout.tp)
        if pp_outermost:
            rest, cp_rank = divmod(group, layout.cp)
            stage, dp_replica = divmod(rest, layout.dp)
        else:
            dp_replica, stage = divmod(group, layout.pp)
            cp_rank = 0
        slots.append(GpuSlot(node, local, index, stage, tp_rank, dp_replica, cp_rank))
    kinds = _link_kinds(cluster)
    boundaries = tuple(_listed_boundaries(layout, gpn, kinds, pp_outermost))
    num_groups = layout.dp * layout.pp
    period = math.lcm(layout.tp, gpn) // layout.tp
    crosses = any((g * layout.tp) // gpn != (g * layout.tp + layout.tp - 1) // gpn
                  for g in range(min(num_groups, period)))
    tp_link = None if layout.tp == 1 else kinds["inter" if crosses else "intra"]
    ep = ep_group_topology(cluster, layout, pp_outermost)
    ep_link = None if ep is None else kinds["inter" if ep.inter is not None else "intra"]
    if ep is None or not (pp_outermost or layout.dp_per_ep_group > 1):
        exchange = None
    else:
        exchange = ("dispatch and combine all-to-alls" if pp_outermost
                    else "dispatch all-gather and combine reduce-scatter" if all2all_backend == DEFAULT_ALL2ALL_BACKEND
                    else f"DeepEP dispatch and combine all-to-alls ({all2all_backend})")
    return PlacementMap(cluster.num_nodes, gpn, layout, tuple(slots), tp_link, crosses, boundaries,
                        layout.dp * layout.cp * (layout.pp - 1),
                        boundaries_crossing_nodes(layout, gpn, pp_outermost), ep_link, exchange,
                        0 if ep is None else ep.ranks_per_node, 0 if ep is None else ep.num_nodes, pp_outermost,
                        training_engine, gpn > 1 and intra_node_link(cluster).host_staged)


def _send_ranks(layout: Layout, replica: int, cp_rank: int, stage: int, pp_outermost: bool) -> tuple[int, int]:
    """(first rank of the sending TP group, first rank of the receiving one) for the send
    from `stage` to `stage + 1` of one replica's CP rank, in the engine's rank order."""
    if pp_outermost:
        block = layout.tp * layout.cp * layout.dp
        first = (replica * layout.cp + cp_rank) * layout.tp + stage * block
        return first, first + block
    first = (replica * layout.pp + stage) * layout.tp
    return first, first + layout.tp


def _listed_boundaries(layout: Layout, gpn: int, kinds: dict[str, str], pp_outermost: bool) -> Iterator[Boundary]:
    """The first MAX_BOUNDARIES_LISTED pipeline sends, replica by replica (and CP rank by CP
    rank), each from the sending TP group's first rank to the receiving one's."""
    listed = 0
    for replica in range(layout.dp):
        for cp_rank in range(layout.cp):
            for stage in range(layout.pp - 1):
                if listed == MAX_BOUNDARIES_LISTED:
                    return
                a, b = (r // gpn for r in _send_ranks(layout, replica, cp_rank, stage, pp_outermost))
                yield Boundary(replica, stage, a, b, kinds["inter" if a != b else "intra"], cp_rank)
                listed += 1


def boundaries_crossing_nodes(layout: Layout, gpus_per_node: int, pp_outermost: bool = False) -> int:
    """Pipeline sends of every replica (and CP rank) that leave the node, counted, not
    enumerated. vLLM's order: the k-th stage group (k = replica * pp + stage) starts at rank
    k * tp, so the boundary before it crosses when k * tp is a multiple of the node size, i.e.
    k a multiple of q = gpn / gcd(tp, gpn); the boundaries are the k in [1, dp*pp - 1] that
    are not multiples of pp (those start a replica). With `pp_outermost` a send jumps one
    stage block B = tp*cp*dp: every one leaves the node once B >= gpn, and below that the
    cp*dp < gpn / tp senders per stage are few enough to check one by one."""
    if pp_outermost:
        block = layout.tp * layout.cp * layout.dp
        senders = layout.cp * layout.dp
        if block >= gpus_per_node:
            return senders * (layout.pp - 1)
        return sum((j * layout.tp + s * block) // gpus_per_node != (j * layout.tp + (s + 1) * block) // gpus_per_node
                   for j in range(senders) for s in range(layout.pp - 1))
    last = layout.dp * layout.pp - 1
    q = gpus_per_node // math.gcd(layout.tp, gpus_per_node)
    return last // q - last // math.lcm(q, layout.pp)


def _link_kinds(cluster: ClusterSpec) -> dict[str, str]:
    return {
        "intra": cluster.intra_node.kind if cluster.intra_node else "-",
        "inter": cluster.inter_node.kind if cluster.inter_node else "-",
    }


def stage_label(stage: int, pp: int) -> str:
    if pp == 1:
        return "stage 0 (embedding + LM head)"
    return {0: "stage 0 (embedding)", pp - 1: f"stage {pp - 1} (LM head)"}.get(stage, f"stage {stage}")


def group_label(stages: list[int], pp: int) -> str:
    if len(stages) == 1:
        return stage_label(stages[0], pp)
    return f"stages {stages[0]}-{stages[-1]}"


def grouped_bars(bars: list[tuple[int, tuple, MemoryBar]], pp: int) -> tuple[MemoryBar, ...]:
    """Merge consecutive stages whose figures are identical (the middle of a deep pipeline)."""
    out: list[tuple[list[int], tuple, MemoryBar]] = []
    for stage, key, bar in bars:
        if out and out[-1][1] == key and 0 < stage < pp - 1 and 0 < out[-1][0][-1]:
            out[-1][0].append(stage)
        else:
            out.append(([stage], key, bar))
    return tuple(replace(bar, stages=tuple(stages), label=group_label(stages, pp)) for stages, _, bar in out)


def serve_memory(model: ModelSpec, cluster: ClusterSpec, result: ServeEstimate,
                 request: ServeRequest) -> tuple[MemoryBar, ...]:
    """Each stage's GPU: weights (the drafter's apart under speculative decoding), the profile
    run's activations, the overhead (DeepEP's buffers apart when the exchange runs on DeepEP),
    the KV cache (the drafter's KV in it)."""
    footprint = kv_tokens_per_running_sequence(request.input_len, request.output_len, request.decode_context_tokens)
    kv_tokens_used = result.concurrency * footprint  # under a request rate: the mean in flight
    layout = result.layout
    deepep = deepep_buffer_bytes(model, layout, request.all2all_backend, cluster.gpus_per_node,
                                 max_num_batched_tokens(cluster, request, layout, model))
    bars = []
    # under --emit sglang the KV cache is SGLang's pool, within --mem-fraction-static of the
    # memory free before load (emit/sglang.pool_figures), as the plan's table shows it: explain
    # had drawn vLLM's (a review)
    sglang = request.pool_engine == "sglang"
    share, static, sglang_running, sglang_tokens = 1.0, None, None, None
    if sglang:
        from planner.emit.sglang import pool_figures, pool_running_sequences

        _, pool, static = pool_figures(model, cluster, request, result)
        fullest = max(result.stages, key=lambda st: st.weights_bytes + st.kv_cache_bytes)
        share = pool / fullest.kv_cache_bytes if fullest.kv_cache_bytes > 0 else 1.0
        if model.num_kv_window_layers:
            # SGLang pools window layers its own way (emit/sglang.pool_sequences): what its pool runs
            sequences, sglang_tokens = pool_running_sequences(model, cluster, request, result)
            sglang_running = sequences * footprint
    for s in result.stages:
        segments = (
            MemorySegment("weights", s.weights_bytes - s.draft_weights_bytes),
            *((MemorySegment("drafter weights", s.draft_weights_bytes),) if s.draft_weights_bytes else ()),
            MemorySegment("activations", s.activation_bytes),
            MemorySegment("overhead", s.overhead_bytes - deepep),
            *((MemorySegment("DeepEP buffers", deepep),) if deepep else ()),
            MemorySegment("SGLang's KV pool" if sglang else "KV cache", s.kv_cache_bytes * share),
        )
        # where the dense layers sit (DeepSeek-V3's first three), each stage's share of MoE layers
        placed = model.is_moe and model.dense_layer_indices is not None and layout.pp > 1
        layers = f"{s.num_layers} layers, {stage_moe_layers(model, s):.0f} of them MoE; " if placed else ""
        running = f"{result.batch}" if result.offered_rate_per_s is None else f"{result.concurrency:.1f} (mean at the rate)"
        # with sliding-window layers the pool holds running_tokens of running sequences, not
        # kv_cache_tokens (vLLM's count at max_model_len): say both where they differ (171 x 1,160
        # "used 100%" of 213,025 tokens; a CLI read)
        running_tokens = s.running_tokens * share if sglang_running is None else sglang_running
        held = ("" if s.running_tokens == s.kv_cache_tokens else
                f" ({running_tokens:,.0f} as running sequences of this footprint: "
                + ("SGLang's window layers keep each one's locked prompt chunks and last window)"
                   if sglang_running is not None else "the window layers keep each one's last window only)"))
        pool_words = ("SGLang's KV pool (--mem-fraction-static of the memory free before load) "
                      if sglang else "KV cache ")
        # SGLang's own count where it pools window layers apart: what a full layer's pool holds
        pool_tokens = int(s.kv_cache_tokens * share if sglang_tokens is None else sglang_tokens)
        note = (f"{layers}{pool_words}{pool_tokens:,} tokens{held}; batch {running} x "
                f"{footprint:,.0f} tokens (mean: {footprint_basis(request)}) uses "
                f"{min(1.0, kv_tokens_used / max(running_tokens, 1)):.0%}")
        key = (s.num_layers, s.num_moe_layers, s.weights_bytes, s.activation_bytes, s.kv_cache_bytes)
        bars.append((s.stage, key, MemoryBar((s.stage,), "", segments, cluster.gpu.memory_bytes,
                                             s.budget_bytes if static is None else static, note)))
    return grouped_bars(bars, result.layout.pp)


def without_curves(cluster: ClusterSpec) -> ClusterSpec:
    """The same cluster with its measured all-reduce curves set aside (links keep whatever
    else the probe gave them), so the alpha-beta model can be shown beside the curve."""
    if cluster.measured is None or not cluster.measured.allreduce_curves:
        return cluster
    return cluster.model_copy(update={"measured": cluster.measured.model_copy(update={"allreduce_curves": []})})


def collective_row(phase: str, name: str, kind: str, n: int, link: str, message_bytes: float,
                   model_seconds_at: Callable[[float], float], used_seconds: float, measured: bool,
                   count: float, step_seconds: float) -> CollectiveRow:
    """The estimate's time for this collective (used_seconds), with the alpha-beta model's
    split into a latency term (its time for an empty message) and a bandwidth term (the rest)."""
    total, latency = model_seconds_at(message_bytes), model_seconds_at(0.0)
    share = count * used_seconds / step_seconds if step_seconds > 0 else 0.0
    return CollectiveRow(phase, name, kind, n, message_bytes, link, latency, total - latency, used_seconds,
                         used_seconds if measured else None, count, share)


def serve_collectives(model: ModelSpec, cluster: ClusterSpec, result: ServeEstimate) -> tuple[CollectiveRow, ...]:
    """The estimate's collectives (serving_time.serving_collectives), each beside the
    alpha-beta model's latency and bandwidth terms."""
    layout = result.layout
    modelled = without_curves(cluster)
    placement = place(modelled, layout)
    width = model.hidden_size * activation_bytes_per_element(model)

    def one_allreduce(message_bytes: float) -> float:
        return tp_allreduce_seconds_per_layer(modelled, layout, placement, message_bytes, engine_kernel=False)[0] / 2

    def one_send(message_bytes: float) -> float:
        return pipeline_hop_seconds(model, placement, message_bytes / width)

    def one_ep_gather(message_bytes: float) -> float:
        return allgather_seconds(message_bytes, placement.ep_group, None)

    def one_ep_alltoall(message_bytes: float) -> float:
        return alltoall_seconds(message_bytes, placement.ep_group, None)

    def one_tp_gather(message_bytes: float) -> float:
        return allgather_seconds(message_bytes, placement.tp_group, None)

    timed = {"to next stage": one_send, "MoE dispatch": one_ep_gather, "MoE combine": one_ep_gather,
             "MoE output": one_tp_gather}
    decode_step = result.tpot_seconds if result.steady is None else result.steady.decoding_round_seconds
    # a prefill collective's share is of the step that carries the prompt's chunk (TTFT holds the
    # queue and every chunk's step besides: a CLI read found the prefill share understated 3x)
    prefill_step = result.ttft_seconds if result.steady is None else result.steady.prompt_round_seconds
    step = {"decode": decode_step, "prefill": prefill_step}
    return tuple(
        collective_row(c.phase, c.name, c.kind, c.num_ranks, c.link_kind, c.message_bytes,
                       one_ep_alltoall if c.kind == "all-to-all" else timed.get(c.name, one_allreduce),
                       c.seconds, c.source != "model",
                       c.count_per_step, step[c.phase])
        for c in result.collectives)


def prompt_work_and_wait(result: ServeEstimate, decode_round_seconds: float, added_seconds: float) -> tuple[float, float]:
    """What the prompt rounds add to the mean step, split into the busiest stage's work on
    the chunks and the rest, which it spends waiting (with PP the chunk carriers' path paces a
    prompt round while the other stages idle: the same idle share the bubble fraction counts,
    mean_bubble_fraction). Without PP every added second is work (a round is engine + stage)."""
    steady, decode = result.steady, result.decode_round
    if result.layout.pp == 1 or steady is None or decode is None or steady.step_seconds <= decode.seconds:
        return added_seconds, 0.0
    busy_mean = (1 - result.bubble_fraction) * steady.step_seconds
    share = (busy_mean - round_busy_seconds(decode)) / (steady.step_seconds - decode.seconds)
    work = added_seconds * min(max(share, 0.0), 1.0)
    return work, added_seconds - work


def serve_breakdown(model: ModelSpec, cluster: ClusterSpec, result: ServeEstimate) -> TimeBreakdown:
    """The mean step under load (= TPOT) on the slowest stage: a decode-only round's k
    micro-batches of work (the memory- or compute-bound part; for MoE the routed experts' fused
    op apart, at the GPU's measured kernel or the dense rates), the fixed per-layer cost and
    L_s TP all-reduces, the EP dispatch and combine of its MoE layers, the engine's per-step cost; then what prompt chunks add to the mean
    step, as the busiest stage's work (prompt_work_and_wait); the rest of the decode round is
    waiting, first for the p pipeline sends (exposed), then for other stages (bubble), and so
    is what the prompt rounds add beyond that work: the segments' idle is the header's bubble."""
    k, p = result.batches_in_flight, result.layout.pp
    step = result.decode_steps[result.slowest_stage]
    num_layers = result.stages[result.slowest_stage].num_layers
    decode_round = result.decode_round.seconds if result.decode_round is not None else result.tpot_seconds
    engine = result.decode_round.engine_seconds if result.decode_round is not None else 0.0
    experts = k * step.moe_seconds
    work = k * step.compute_or_memory_seconds - experts
    fixed = k * step.overhead_seconds
    tp = k * num_layers * step.allreduce_seconds_per_layer
    ep = k * stage_moe_layers(model, result.stages[result.slowest_stage]) * step.ep_exchange_seconds_per_moe_layer
    drafter = k * step.draft_seconds
    engine = min(engine, max(0.0, decode_round - work - experts - fixed - tp - ep - drafter))
    idle = max(0.0, decode_round - work - experts - fixed - tp - ep - drafter - engine)
    pp = min(idle, p * result.pp_hop_seconds)
    # under speculative decoding a round emits e tokens per sequence: the step is TPOT x e
    tokens_per_round = 1.0 if result.steady is None else result.steady.tokens_per_round
    mean_step = result.tpot_seconds * tokens_per_round
    prompts, waiting = prompt_work_and_wait(result, decode_round, max(0.0, mean_step - decode_round))
    bound = "memory-bound work" if result.decode_bound == "memory" else "compute"
    other = "compute" if bound == "memory-bound work" else "memory-bound work"
    segments = (
        BreakdownSegment(bound, work),
        BreakdownSegment(other, 0.0),
        BreakdownSegment(f"routed experts (fused MoE op, {moe_kernel(model, cluster, result.layout.ep).source} kernel)", experts),
        BreakdownSegment("per-layer launch overhead", fixed),
        BreakdownSegment("TP comm", tp),
        BreakdownSegment("EP gather/scatter", ep),
        BreakdownSegment("drafter (speculative decoding)", drafter),
        BreakdownSegment("engine step (scheduler, sampler)", engine),
        BreakdownSegment("prompt chunks in the step" if lockstep_ranks(model, result.layout) == 1
                         else "prompt chunks in the step (its busiest DP rank's)", prompts),
        BreakdownSegment("PP comm", pp),
        BreakdownSegment("DP comm exposed", 0.0),
        BreakdownSegment("bubble", idle - pp + waiting),
    )
    if tokens_per_round == 1.0:
        return TimeBreakdown("the mean step under load (TPOT) on the slowest stage", result.tpot_seconds, segments)
    return TimeBreakdown(f"the mean step under load on the slowest stage (TPOT x {tokens_per_round:.2f} tokens "
                         f"per step, speculative decoding)", mean_step, segments)


def serve_ttft_breakdown(model: ModelSpec, result: ServeEstimate) -> TimeBreakdown | None:
    """The mean TTFT under load, as continuous_batching.steady_state builds it: the fixed
    first-token cost (client, API server, detokenizing), the prompt's tokenization on the API
    server (its wait for the tokenizer included), the wait of clients beyond the engine's
    slots, the queue for the step's token budget, the prompt's own service over its chunks
    (prompt_service_seconds), split by what the chunk-carrying round spends it on (the carrier
    micro-batch's steps over every stage, the engine's step and the pipeline sends; the rest of
    the round is the other micro-batches'), and what is left: waiting out the step in progress
    when the request arrives and, under async scheduling, the step already scheduled after it
    (SteadyState.ahead_seconds). None without a steady state or a prompt round."""
    steady, rnd = result.steady, result.prompt_round
    if steady is None or rnd is None:
        return None
    fixed = min(eff.FIRST_TOKEN_SECONDS, result.ttft_seconds)
    tokenize = min(max(0.0, steady.first_token_seconds - eff.FIRST_TOKEN_SECONDS), result.ttft_seconds - fixed)
    fixed += tokenize
    slots = min(steady.slot_wait_seconds, result.ttft_seconds - fixed)
    budget = min(steady.queue_rounds * steady.step_seconds, result.ttft_seconds - fixed - slots)
    lanes = result.layout.pp  # the micro-batches a prompt's chunks may fill (steady_state's lanes)
    service = min(prompt_service_seconds(steady.prompt_chunks, steady.prompt_round_seconds, lanes,
                                         steady.last_chunk_extra_seconds),
                  result.ttft_seconds - fixed - slots - budget)
    steps = rnd.chunk_steps or rnd.stage_steps
    parts = {"linear layers": 0.0, "routed experts": 0.0, "attention": 0.0, "elementwise and launch overhead": 0.0,
             "TP comm": 0.0, "EP comm": 0.0}
    for stage, step in zip(result.stages, steps, strict=True):
        tp = stage.num_layers * step.allreduce_seconds_per_layer
        ep = stage_moe_layers(model, stage) * step.ep_exchange_seconds_per_moe_layer
        parts["linear layers"] += step.gemm_seconds - step.moe_seconds
        parts["routed experts"] += step.moe_seconds
        parts["attention"] += step.attention_seconds
        parts["TP comm"] += tp
        parts["EP comm"] += ep
        parts["elementwise and launch overhead"] += max(0.0, step.seconds - step.gemm_seconds - step.attention_seconds
                                                        - tp - ep)
    parts["engine step"] = rnd.engine_seconds
    path = sum(parts.values())
    if result.layout.pp > 1:
        parts["PP sends"] = min(result.layout.pp * rnd.hop_seconds, max(0.0, rnd.seconds - path))
    parts["other micro-batches' steps"] = max(0.0, rnd.seconds - sum(parts.values()))
    scale = service / max(rnd.seconds, sum(parts.values()))
    segments = [BreakdownSegment("first-token cost (client, API server, detokenize)", fixed - tokenize),
                BreakdownSegment("tokenizing the prompt (API server)", tokenize),
                BreakdownSegment("waiting for an engine slot (" + ("clients beyond it" if result.offered_rate_per_s is None
                                                                   else "arrivals finding every one busy") + ")",
                                 slots),
                BreakdownSegment("queued for the token budget", budget)]
    segments += [BreakdownSegment(f"prompt: {name}", seconds * scale) for name, seconds in parts.items()]
    left = max(0.0, result.ttft_seconds - fixed - slots - budget - service)
    ahead = min(steady.ahead_seconds, left)
    segments.append(BreakdownSegment("waiting out the step in progress on arrival", left - ahead))
    if ahead > 0:
        segments.append(BreakdownSegment("waiting out the step scheduled ahead (async scheduling)", ahead))
    what = f"the mean time to first token under load (its prompt in {steady.prompt_chunks:g} chunk(s))"
    return TimeBreakdown(what, result.ttft_seconds, tuple(segments))


def serve_knob_base(model: ModelSpec, cluster: ClusterSpec, layout: Layout,
                    request: ServeRequest) -> sensitivity.KnobBase:
    peak = cluster.gpu.peak_flops_per_s(matmul_precision(model, cluster)) or cluster.gpu.peak_flops_per_s("bf16")
    fraction = eff.DEFAULT_MATMUL_FRACTION_OF_PEAK if peak is None else achievable_flops_per_s(model, cluster) / peak
    # the share the layers' weights stream at (the step's largest read; the KV cache and the LM
    # head read at DECODE_HBM_UTILIZATION): the knob scales the bandwidth under every read alike
    return sensitivity.KnobBase(linear_hbm_utilization(model, cluster), fraction,
                                overhead_bytes(layout, deepep_buffer_bytes(
                                    model, layout, request.all2all_backend, cluster.gpus_per_node,
                                    max_num_batched_tokens(cluster, request, layout, model)),
                                    request.engine_versions.vllm_release.v1_engine),
                                request.gpu_memory_utilization,
                                None if request.speculation is None else max(request.speculation.acceptance))


def serve_replan(model: ModelSpec, request: ServeRequest, explained: Layout) -> sensitivity.Replan:
    """Re-rank every layout (no --layout filter) on a perturbed cluster."""
    unfiltered = replace(request, layout=LayoutFilter())

    def replan(cluster: ClusterSpec, knobs: sensitivity.Knobs) -> sensitivity.Outcome:
        moved = unfiltered
        if unfiltered.speculation is not None and knobs.draft_acceptance != 1.0:
            rates = tuple(min(1.0, rate * knobs.draft_acceptance) for rate in unfiltered.speculation.acceptance)
            moved = replace(unfiltered, speculation=replace(unfiltered.speculation, acceptance=rates))
        # the recommendation and the explained layout are all a re-plan reads: the other layouts
        # are bounded out where they cannot be first (serve_search.bounded_evaluation)
        plan = evaluate(model, cluster, moved, keep_top=1, always=frozenset({explained}), summary=False)
        mine = next((r for r in plan.layouts if r.layout == explained), None)
        metrics = None if mine is None else (
            ("tpot_seconds", mine.tpot_seconds), ("ttft_seconds", mine.ttft_seconds),
            ("throughput_tokens_per_second", mine.throughput_tokens_per_second))
        return sensitivity.Outcome(None if plan.recommended is None else plan.recommended.layout, metrics)

    return replan


def pick_serving(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
                 plan: ServePlan | None = None) -> tuple[ServeEstimate, bool]:
    """The best layout matching --layout (the recommendation without it), and whether it is
    also the overall recommendation. `plan`: the search already run for this request (the
    CLI runs it first, to answer "nothing fits" as `plan` does). A user error when nothing
    matching fits."""
    plan = plan if plan is not None else plan_serving(model, cluster, request)
    if plan.recommended is None:
        why = "; ".join(f"{r.layout}: {', '.join(r.reasons)}" for r in plan.rejected[:3])
        raise SpecError(f"plan explain: no feasible layout to explain ({why})")
    overall = plan if request.layout == LayoutFilter() else evaluate(model, cluster, replace(request, layout=LayoutFilter()))
    best = overall.recommended
    return plan.recommended, best is not None and best.layout == plan.recommended.layout


LIGHT_SENSITIVITY_ABOVE_GPUS = 1024
"""Serving explanations of MoE models, at a finite --request-rate (each re-plan solves every
layout's open loop: Llama-3.1-8B on 8 B200 at 14 req/s of 16,000-token prompts, 29 re-plans and
6.8 s of explain), or on more GPUs than this, run the light sensitivity
analysis (sensitivity.LIGHT: the +/-20% runs, ~2 re-plans a knob instead of ~4): a serving
re-plan of an MoE model prices each layout's expert exchange and lockstep knee, some 5 ms a
layout against ~1 ms dense (DeepSeek-V3 on 2x8 H200: 38 layouts, 0.17-0.23 s a re-plan, 37
re-plans, 14 s for `plan explain`, found by a CLI sweep); dense at 16,384 GPUs 120 layouts,
~0.13 s a re-plan. Dense models on fewer GPUs keep the full analysis (Llama-3.1-70B on 16 H100:
15 layouts, 19 ms a re-plan)."""


TIMELINE_TPOT_TOLERANCE = 1.01
"""The decode timeline's caption names the TPOT when it exceeds the drawn rounds by more than this."""


def explain_serving(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
                    settings: sensitivity.Settings | None = sensitivity.Settings(),
                    plan: ServePlan | None = None) -> Explanation:
    """Every section for the serving layout; settings=None skips the sensitivity runs."""
    result, is_recommended = pick_serving(model, cluster, request, plan)
    layout = result.layout
    k = result.batches_in_flight
    seqs = math.ceil(result.concurrency / k)
    caption = (f"decode, {k} batch(es) of {seqs} sequences in flight over {layout.pp} stage(s), "
               f"{DECODE_ROUNDS_DRAWN} tokens each; every stage drawn at the slowest stage's decode step")
    if result.tpot_seconds > TIMELINE_TPOT_TOLERANCE * result.stage_step_seconds * k:
        caption += (f" ({units.seconds_to_ms(result.stage_step_seconds):.1f} ms; under load each step also "
                    f"carries prompt chunks and the engine's own cost: TPOT "
                    f"{units.seconds_to_ms(result.tpot_seconds):.1f} ms, see Time breakdown)")
    timeline = None
    if layout.pp <= MAX_TIMELINE_STAGES and layout.pp * k * DECODE_ROUNDS_DRAWN <= MAX_TIMELINE_BLOCKS:
        timeline = decode_timeline((result.stage_step_seconds,) * layout.pp, k,
                                   result.pp_hop_seconds, DECODE_ROUNDS_DRAWN)
    else:
        caption += f"; not drawn ({layout.pp} stages x {k} batches are more than a chart shows)"
    report = None
    light = ()
    at_rate = request.offered_rate_per_s is not None
    if settings == sensitivity.Settings() and (model.is_moe or at_rate or cluster.num_gpus > LIGHT_SENSITIVITY_ABOVE_GPUS):
        settings = sensitivity.LIGHT
        what = ("every MoE layout" if model.is_moe else "every layout's open loop at the rate" if at_rate
                else f"{cluster.num_gpus:,} GPUs")
        light = (f"sensitivity: the +/-20% runs only, flips not searched beyond them (each re-plan prices {what}; "
                 "--no-sensitivity skips them)",)
    if settings is not None:
        report = sensitivity.analyze(cluster, layout, serve_knob_base(model, cluster, layout, request),
                                     serve_replan(model, request, layout), settings)
    return Explanation(
        workload="serve",
        model=model.name,
        cluster=cluster.name,
        layout=layout,
        objective=request.objective,
        is_recommended=is_recommended,
        metrics=serve_metrics(result),
        notes=(f"decode is {result.decode_bound}-bound", *result.notes, *measured_links_words(cluster), *light),
        placement=placement_map(cluster, layout, all2all_backend=request.all2all_backend),
        memory=serve_memory(model, cluster, result, request),
        collectives=serve_collectives(model, cluster, result),
        timeline=timeline,
        timeline_caption=caption,
        breakdown=serve_breakdown(model, cluster, result),
        ttft_breakdown=serve_ttft_breakdown(model, result),
        sensitivity=report,
    )


def serve_metrics(r: ServeEstimate) -> tuple[Metric, ...]:
    return (
        Metric("TPOT", r.tpot_seconds, "s"),
        Metric("TTFT", r.ttft_seconds, "s"),
        Metric("throughput", r.throughput_tokens_per_second, "tok/s"),
        Metric("concurrent sequences per replica", r.concurrency, "count"),
        Metric("batches in flight", r.batches_in_flight, "count"),
        Metric("bubble", r.bubble_fraction, "fraction"),
    )

