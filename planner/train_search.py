"""Enumerate training configurations, prune, rank by throughput, tally rejections.

Space: every (tp, pp, dp) with tp*pp*dp = GPUs, and context parallelism splitting dp
(tp*cp*pp*dp = GPUs, cp_options); every micro-batch b up to
MAX_MICRO_BATCH_SIZE with B divisible by b*dp (not only powers of two: MosaicML ran 6, 14, 18); schedule 1f1b | interleaved (v dividing the
layers per stage, or (L+2)/p with the embedding and loss counted as layers) | gpipe; when
pp does not divide the layers (or v the layers per stage), the split estimate() picks for
each configuration (cost/stage_split.py, not a search dimension); recompute none | outputs (MoE, MLA) | selective | full
(torchtitan, dense bf16: none | op | full); sequence parallelism;
ZeRO 0/1 (0-3 without pipeline parallelism). A flag fixes any of them.

Pruning, each justified by the cost model (planner/cost/training_time.py):
- recompute: with everything else equal more recomputation only adds time, so the first
  of none, outputs, selective, full that fits is kept;
- GPipe: the bubble of 1F1B with m instead of p micro-batches in flight, so only when asked;
- micro-batch: memory grows with b, so once full recomputation does not fit, larger b stop,
  and a larger b starts at the least recomputation that fitted the smaller one (the levels
  below it are out of memory already). tests/perf checks all this against an exhaustive
  enumeration.
Ranking: tokens/s descending, then less memory, then the smaller degrees (deterministic).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import replace

from planner import train_engines as engines
from planner.cost import efficiency
from planner.cost.params import param_counts
from planner.cost.stage_split import account_split
from planner.cost.training_memory import least_total_model_state_bytes
from planner.cost.training_time import TrainRates
from planner.errors import SpecError
from planner.layout import Layout, Rejected, TrainConfig, divisors
from planner.memo import Memo
from planner.parallel import map_in_workers
from planner.requests import LayoutFilter, TrainRequest
from planner.search import PARALLEL_MIN_LAYOUTS, LayoutResult, Plan, pinned_degrees, run_search
from planner.specs import ClusterSpec, ModelSpec
from planner.train import (
    TrainEstimate,
    block_seconds_floor,
    check_moe_dispatcher,
    estimate,
    has_layout_split,
    has_split,
    interleaving_batch_reasons,
    interleaving_batch_summary,
    least_state_bytes_per_param,
    op_recompute_refusal,
    outputs_recompute_refusal,
    stage_memories,
    structural_reasons,
    tp_comm_overlap_for,
    train_rates,
    trained_model,
    worst_stage_memory,
)
from planner.train_shortfall import bf16_states_possible, in_node_shortfall, tp_leaves_node

MIN_CP_CHUNK_TOKENS = 4096
"""Least tokens per rank the search gives a CP degree (a fixed `--layout cp=N` is tried as
given), so CP is searched from 8K-token sequences on. Published CP runs keep at least 4K
per rank: Megatron-Core's guide shows 8K over cp = 2 (docs/user-guide/features/
context_parallel.md, core_v0.19.0); Llama 3's long-context stage ran 131,072 tokens over
cp = 16, 8K per rank (Llama Team 2024, Table 4). Below it a ring step's attention,
(s/cp)^2/2 causal pairs, shrinks quadratically under the KV send it must hide and the
rank's GEMMs run b*s/cp rows; and it keeps the search at 16,384 GPUs within its budget
(bench/bench_plan.py)."""
MIN_CP_CHUNK_TOKENS_BATCH_BOUND = 1024
"""The floor instead where the global batch gives each pipeline fewer sequences than it has
stages (global batch < dp * pp; without PP, fewer than one per dp rank): each CP degree turns dp
ranks into more sequences per pipeline, where the other ways to use the GPUs are a bubble-bound
pipeline or TP beyond the node (Llama-3.1-70B on 128 H100 at 8 sequences of 4,096 tokens:
tp=16 pp=8 over InfiniBand was recommended, tp=8 cp=2 pp=8 priced 18% faster). The estimate
prices the ring's exposed KV sends at that chunk, so CP is chosen only where it pays."""
MAX_MICRO_BATCH_SIZE = 16
"""Upper bound of the micro-batch search (Megatron runs use 1-8 for large models)."""
RECOMPUTE_ORDER = ("none", "outputs", "op", "selective", "full")
"""Recompute levels from the least added time: "outputs" (Megatron's output-discarding
checkpoints, MoE and MLA models: train.outputs_recompute_refusal) reruns elementwise kernels
and MLA's up-projections; "op" (torchtitan's per-op selective checkpointing, dense bf16 models:
train.op_recompute_refusal) three of a block's seven matmuls and its elementwise ops, in
place of selective; selective the attention core; full the whole forward."""
MAX_REASONS_PER_LAYOUT = 4


TrainPlan = Plan[TrainEstimate, TrainRequest]


def rank_key(e: TrainEstimate) -> tuple:
    c = e.config
    return (-round(e.tokens_per_second, 6), e.memory_per_gpu_bytes, c.tp, c.cp, c.pp, c.dp, c.ep,
            c.micro_batch_size, c.schedule, c.virtual_stages, RECOMPUTE_ORDER.index(c.recompute),
            c.recompute_num_layers or 0, -(c.recompute_every or 0),
            not c.sequence_parallel, c.zero_stage)


def cp_options(request: TrainRequest, dp: int, pp: int = 1) -> list[int]:
    """Context-parallel degrees above 1 that split the dp ranks of a (tp, pp, dp) layout:
    powers of two (Megatron's CP groups ride NVLink in pairs, fours and eights) with
    s divisible by 2*cp (Megatron's load-balanced split) and at least MIN_CP_CHUNK_TOKENS
    per rank (MIN_CP_CHUNK_TOKENS_BATCH_BOUND where the global batch has fewer sequences than
    the layout's dp * pp); `--layout cp=N` tries N alone (the estimate refuses what Megatron would)."""
    wanted, s = request.layout.cp, request.seq_len
    if wanted is not None:
        return [wanted] if wanted > 1 and dp % wanted == 0 else []
    floor = MIN_CP_CHUNK_TOKENS_BATCH_BOUND if request.global_batch < dp * pp else MIN_CP_CHUNK_TOKENS
    degrees, cp = [], 2
    while dp % cp == 0 and s % (2 * cp) == 0 and s // cp >= floor:
        degrees.append(cp)
        cp *= 2
    return degrees


def micro_batch_options(request: TrainRequest, dp: int) -> list[int]:
    if request.micro_batch is not None:
        return [request.micro_batch]
    per_replica = request.global_batch // dp
    return [b for b in range(1, min(MAX_MICRO_BATCH_SIZE, per_replica) + 1) if per_replica % b == 0]


LAYOUT_SPLIT_MIN_CHUNKS = 4
"""Interleaved chunk counts 2..4 are tried through a per-chunk split (Megatron's layout string,
torchtitan's module lists) wherever the layers do not split evenly, besides the divisors of the
stages' typical size: a search bound, not a fit."""


def schedule_options(model: ModelSpec, request: TrainRequest, pp: int) -> list[tuple[str, int]]:
    """(schedule, v) pairs; v = 1 except interleaved, whose v divides the layers per stage
    (uneven split: the first, middle and last stage's layers, Megatron's rule) or, with
    Megatron, the layer units per stage when the embedding and loss count as layers
    ((L+2)/p: stage_split.account_split); with p not dividing L, for the v dividing ceil(L/p)
    that neither flag splits, Megatron's layout string (train.has_layout_split)."""
    L = model.num_hidden_layers
    if L % pp == 0:
        chunks = {v for v in divisors(L // pp) if v > 1}
    else:
        chunks = {v for v in divisors(L) if v > 1 and has_split(L, pp, v)}
    if request.engine == "megatron" and (L + 2) % pp == 0:
        chunks |= {v for v in divisors((L + 2) // pp) if v > 1 and account_split(L, pp, v)}
    if L % pp:
        # where neither flag splits the layers for a v dividing the stages' typical size,
        # Megatron's layout string (DeepSeek-V3's 61 layers on 8 stages: v = 2 or 4)
        # and the few chunks a stage may hold where that size is prime (61 layers on 2 stages: 31,
        # whose only divisor is itself; Megatron's layout string takes v = 2 as 16+16 | 15+14)
        tried = set(divisors(-(-L // pp))) | set(range(2, LAYOUT_SPLIT_MIN_CHUNKS + 1))
        chunks |= {v for v in tried if v > 1 and v not in chunks and has_layout_split(L, pp, v, request.engine)}
    chunk_options = sorted(chunks)
    if request.schedule:
        schedules = [request.schedule]
    elif request.virtual_stages is not None:  # --virtual-stages alone means interleaved
        schedules = ["interleaved"]
    else:
        schedules = ["1f1b", "interleaved"] if pp > 1 else ["1f1b"]
    pairs = []
    for schedule in schedules:
        if schedule != "interleaved":
            pairs.append((schedule, request.virtual_stages or 1))
        elif request.virtual_stages is not None:
            pairs.append((schedule, request.virtual_stages))
        else:
            pairs.extend((schedule, v) for v in chunk_options)
    return pairs


def zero_options(request: TrainRequest, tp: int, pp: int, dp: int, ep: int = 1, cp: int = 1) -> list[int]:
    """ZeRO-1 (the distributed optimizer) and ZeRO-2/3 (Megatron-FSDP, with TP, CP and EP but
    no PP: train.config_reasons) shard over dp*cp."""
    if request.zero_stage is not None:
        return [request.zero_stage]
    # bf16 optimizer states need the distributed optimizer (train.optimizer_state_reasons), also
    # at dp*cp = 1, where it shards over one rank (the memory of ZeRO-0)
    lowest = 0 if request.optimizer_states == "fp32" else 1
    if dp * cp == 1:
        return [lowest]
    return [z for z in ([0, 1, 2, 3] if pp == 1 else [0, 1]) if z >= lowest]


def engine_zero_options(request: TrainRequest, tp: int, pp: int, dp: int, ep: int = 1,
                        cp: int = 1) -> list[int]:
    """The engine's ZeRO stages: Megatron's zero_options or torchtitan's (train_engines)."""
    if request.engine == "torchtitan":
        return engines.zero_options(request, tp, pp, dp, cp)
    return zero_options(request, tp, pp, dp, ep, cp)


def engine_sp_options(model: ModelSpec, request: TrainRequest, tp: int) -> list[bool]:
    if request.engine == "torchtitan":
        return engines.sp_options(request, tp)
    return sp_options(model, request, tp)


def sp_options(model: ModelSpec, request: TrainRequest, tp: int) -> list[bool]:
    """Off and on with tp > 1; MoE only on (Megatron-Core's MoE layer refuses TP without
    it: train.ep_reasons)."""
    if request.sequence_parallel is not None:
        return [request.sequence_parallel]
    if tp == 1:
        return [False]
    return [True] if model.is_moe else [False, True]



class _Tally:
    """Rejections of one (tp, pp, dp): reason counts and the smallest memory overshoot."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.best_oom: tuple[float, str] | None = None
        self.total = 0
        self.interleaving_micro_batches: list[int] = []
        self.interleaving_stages = (0, "")

    def add_interleaving(self, m: int, pp: int, engine: str) -> None:
        """An interleaved configuration config_reasons would refuse for its m alone: one line for
        all of the layout's (train.interleaving_batch_summary), not one per micro-batch size."""
        self.total += 1
        self.interleaving_micro_batches.append(m)
        self.interleaving_stages = (pp, engine)

    def add(self, result: Rejected) -> None:
        self.total += 1
        if result.over_bytes > 0:
            if self.best_oom is None or result.over_bytes < self.best_oom[0]:
                self.best_oom = (result.over_bytes, result.reasons[0])
            return
        for reason in result.reasons:
            self.counts[reason] = self.counts.get(reason, 0) + 1

    def reasons(self) -> tuple[str, ...]:
        counts = dict(self.counts)
        if self.interleaving_micro_batches:
            line = interleaving_batch_summary(self.interleaving_micro_batches, *self.interleaving_stages)
            counts[line] = len(self.interleaving_micro_batches)
        ordered = sorted(counts, key=lambda r: (-counts[r], r))
        if self.best_oom is not None:
            ordered.insert(0, self.best_oom[1])
        return tuple(ordered[:MAX_REASONS_PER_LAYOUT])


def search_layout(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, layout: Layout,
                  rates: TrainRates, memo: Memo, threshold_tokens_per_s: float = 0.0) -> LayoutResult[TrainEstimate]:
    """Every configuration of one (tp, cp, pp, dp) that the pruning rules leave, or why none runs.
    `threshold_tokens_per_s` (bounded search): a configuration whose bound (config_bound) falls
    below it is counted as bounded, not estimated; a layout with nothing feasible and something
    bounded is not rejected (it may run, below the rows kept)."""
    tp, pp, dp, cp = layout.tp, layout.pp, layout.dp, layout.cp
    reasons = structural_reasons(model, tp, pp, dp, request.global_batch, layout.ep)
    if reasons:
        return LayoutResult([], Rejected(layout, tuple(reasons)), 1)
    found: list[TrainEstimate] = []
    tally = _Tally()
    bounded = 0
    recomputes = searched_recomputes(model, request)
    micro_batches = micro_batch_options(request, dp)
    zeros = engine_zero_options(request, tp, pp, dp, layout.ep, cp)
    sps = engine_sp_options(model, request, tp)
    # leaner first: ZeRO-1 before ZeRO-0 (then 2, 3), SP on before off
    zero_order = sorted(zeros, key=lambda z: (z == 0, z))
    sp_order = sorted(sps, reverse=True)
    schedules = schedule_options(model, request, pp)
    v_max = largest_v(schedules)
    bounds_tokens_per_s: dict[tuple[int, bool, int], float] = {}

    def bound_at(b: int, sp: bool, level: int) -> float:
        if (b, sp, level) not in bounds_tokens_per_s:
            bounds_tokens_per_s[b, sp, level] = config_bound(model, cluster, request, layout, b, sp, recomputes[level],
                                                             v_max, rates, memo)
        return bounds_tokens_per_s[b, sp, level]

    def reaches(b: int, sp: bool) -> Callable[[int], bool]:
        """Whether recompute level `index` or one after it may reach the threshold: config_bound
        (whatever the schedule and ZeRO stage, which do not enter it), from that level on until
        one does (the bounds_tokens_per_s of the levels after it are computed only where needed).
        No recompute is the fastest level (every other reruns something: block_seconds_floor
        never falls as recompute grows, tests/perf/test_bounded_search.py), so where its
        bound misses, every level's does and none other is priced."""
        def from_level(index: int) -> bool:
            if recomputes[0] == "none" and bound_at(b, sp, 0) < threshold_tokens_per_s:
                return False
            return any(bound_at(b, sp, level) >= threshold_tokens_per_s for level in range(index, len(recomputes)))
        return from_level

    if threshold_tokens_per_s and not any(reaches(b, sp)(0) for b in micro_batches for sp in sps):
        # nothing of it reaches the rows kept: every (schedule, ZeRO, SP, b) combination is bounded
        return LayoutResult([], None, 0, len(schedules) * len(zeros) * len(sps) * len(micro_batches))
    for schedule, v in schedules:
        # Memory dominance the model guarantees, used to skip what cannot fit: ZeRO-1 never
        # needs more than ZeRO-0 (the same states, the optimizer's sharded, nothing added) and
        # sequence parallelism never more than none (its activations are split, nothing
        # added). A configuration starts at the recompute level its leaner sibling needed for
        # each b and stops at the b where that sibling was out of memory at every level.
        floor: dict[tuple[int, bool, int], int] = {}
        oom_at: dict[tuple[int, bool], int] = {}
        for zero in zero_order:
            for sp in sp_order:
                leaner = ([(1, sp)] if zero == 0 and 1 in zeros else []) + ([(zero, True)] if not sp and True in sps else [])
                first = 0  # recompute levels below this ran out of memory at a smaller b
                # every b's configuration is this one's copy; what the estimate would fill
                # in (TP overlap reads neither b nor ZeRO) is set here, not copied per estimate
                proto = TrainConfig(tp, pp, dp, 1, schedule, v, "none", sp, zero,
                                    attention=request.attention, precision=request.precision,
                                    fp8_recipe=request.resolved_fp8_recipe, ep=layout.ep, cp=cp,
                                    grad_reduce=request.grad_reduce, optimizer_states=request.optimizer_states,
                       engine=request.engine)
                if tp_comm_overlap_for(model, cluster, request, proto):
                    proto = proto.with_(tp_comm_overlap=True)
                for b in micro_batches:
                    m = request.global_batch // (b * dp)
                    if schedule == "interleaved" and pp > 1 and interleaving_batch_reasons(m, pp, request.engine):
                        tally.add_interleaving(m, pp, request.engine)  # config_reasons' verdict, without the estimate
                        continue
                    if leaner and any(b >= oom_at.get(key, b + 1) for key in leaner):
                        break  # a leaner sibling was out of memory here at every recompute level
                    for key in leaner:
                        first = max(first, floor.get((*key, b), 0))
                    if threshold_tokens_per_s and not reaches(b, sp)(first):
                        bounded += 1  # no recompute level left to it can reach the rows kept
                        continue
                    base = proto if b == 1 else proto.with_(micro_batch_size=b)
                    result, first = _first_fitting(model, cluster, request, recomputes[first:], rates,
                                                   base, first, memo, reaches(b, sp) if threshold_tokens_per_s else None)
                    if result is None:  # out of memory up to where the bound leaves the rows kept
                        bounded += 1
                        floor[(zero, sp, b)] = first  # the levels below ran out of memory: a fatter sibling's too
                        continue
                    if isinstance(result, TrainEstimate):
                        found.append(result)
                        floor[(zero, sp, b)] = first
                        continue
                    tally.add(result)
                    if result.over_bytes > 0:
                        oom_at[(zero, sp)] = b
                        break  # memory grows with b
    num_configs = len(found) + tally.total
    if found:
        return LayoutResult(found, None, num_configs, bounded)
    if bounded:  # what was estimated did not run, the rest ranks below the rows kept: not a rejection
        return LayoutResult([], None, num_configs, bounded)
    # the smallest overshoot of its configurations: how close the layout comes (closest_misses)
    over = tally.best_oom[0] if tally.best_oom is not None else 0.0
    return LayoutResult([], Rejected(layout, tally.reasons() or ("no configuration to try",), over, tally.total),
                        num_configs, bounded)


def step_seconds_floor(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, layout: Layout, b: int,
                       sp: bool, recompute: str, v_max: int, rates: TrainRates, memo: Memo) -> float:
    """A step time no configuration of this layout, micro-batch b, SP setting and recompute level
    goes below in estimate(), whatever its schedule (v up to v_max), ZeRO stage and stage split
    (training_time.step_times): every stage runs at the pace of the slowest, whose micro-batch
    takes at least its decoder blocks' time; the p stages' blocks sum to the model's L, so the
    most loaded stage has at least ceil(L/p) of them, each at least block_seconds_floor; the
    step runs m = B/(b*dp) such micro-batches plus a bubble of (p-1)/v of one, and its other
    terms (pipeline sends, exposed DP traffic, the optimizer, gradient accumulation, the
    output layer) are not negative. So step >= ceil(L/p) * block * (m + (p-1)/v_max).
    tests/perf/test_bounded_search.py checks it against every configuration of the search space."""
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    config = TrainConfig(tp, pp, dp, b, "1f1b", 1, recompute, sp, 0, attention=request.attention,
                         ep=layout.ep, cp=layout.cp, grad_reduce=request.grad_reduce,
                         optimizer_states=request.optimizer_states, engine=request.engine)
    # a block's floor reads neither pp nor dp (under EP only ep/tp): block_seconds_floor
    block = memo.get(("block_floor", tp, layout.cp, layout.ep, b, sp, recompute),
                     block_seconds_floor, model, cluster, config, request, rates, memo)
    most = -(-model.num_hidden_layers // pp)
    if recompute == "full" and block_recompute_runs(request):
        # block recompute: the most loaded stage's n >= most layers rerun r >= 1 of them, so its
        # blocks take (n - r) * none + r * full >= most * none + (full - none) (full >= none)
        kept = memo.get(("block_floor", tp, layout.cp, layout.ep, b, sp, "none"),
                        block_seconds_floor, model, cluster, config.with_(recompute="none"), request, rates, memo)
        block = kept + (block - kept) / most
    m = request.global_batch // (b * dp)
    return most * block * (m + (pp - 1) / v_max)


def block_recompute_runs(request: TrainRequest) -> bool:
    """Whether the search's full-recompute configurations may rerun only some layers (Megatron's
    --recompute-method block, torchtitan's every N-th block): --recompute-num-layers fixes how many
    (Megatron), and without --recompute the search takes the least that fits
    (least_block_recompute); --recompute full recomputes all."""
    return request.recompute_num_layers is not None or request.recompute is None


def config_bound(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, layout: Layout, b: int, sp: bool,
                 recompute: str, v_max: int, rates: TrainRates, memo: Memo) -> float:
    """Tokens/s no configuration of (layout, b, SP, recompute) reaches: B*s over step_seconds_floor."""
    floor = memo.get(("step_floor", layout, b, sp, recompute, v_max), step_seconds_floor, model, cluster, request,
                     layout, b, sp, recompute, v_max, rates, memo)
    return request.global_batch * request.seq_len / floor


def layout_promise(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, layout: Layout,
                   rates: TrainRates, memo: Memo) -> float:
    """The order in which bounded_evaluation tries layouts: the most of config_bound over the
    layout's micro-batches and SP settings at the least recompute level at which its leanest
    configuration (b = 1, SP on where it can be, its highest ZeRO stage, 1F1B) fits in memory
    (the last level where none does). An ordering only, nothing is skipped by it (the sooner
    the best layouts come, the higher the threshold the others meet); infinite where the layout
    cannot run at all (found cheaply)."""
    if structural_reasons(model, layout.tp, layout.pp, layout.dp, request.global_batch, layout.ep):
        return float("inf")
    if layout.cp > 1 and request.attention != "flash":  # cp_reasons: refused at every b (no block to bound)
        return float("inf")
    levels = searched_recomputes(model, request)
    sps = engine_sp_options(model, request, layout.tp)
    zero = max(engine_zero_options(request, layout.tp, layout.pp, layout.dp, layout.ep, layout.cp))
    capacity = cluster.gpu.cuda_visible_memory_bytes
    lean = TrainConfig(layout.tp, layout.pp, layout.dp, 1, "1f1b", 1, levels[0], max(sps), zero,
                       attention=request.attention, precision=request.precision,
                       fp8_recipe=request.resolved_fp8_recipe, ep=layout.ep, cp=layout.cp,
                       grad_reduce=request.grad_reduce, optimizer_states=request.optimizer_states,
                       engine=request.engine)
    m = request.global_batch // layout.dp
    # every stage given the most loaded one's layers (stages need not be even here)
    most = -(-model.num_hidden_layers // layout.pp)
    layers = (model.num_hidden_layers, 0, model.num_hidden_layers) if layout.pp == 1 else (
        most, most if layout.pp > 2 else 0, most)
    level = next((level for level in levels
                  if worst_stage_memory(stage_memories(model, lean.with_(recompute=level), request.seq_len, m,
                                                       memo=memo, layers=layers)).total_bytes <= capacity),
                 levels[-1])
    v_max = largest_v(schedule_options(model, request, layout.pp))
    return max((config_bound(model, cluster, request, layout, b, sp, level, v_max, rates, memo)
                for b in micro_batch_options(request, layout.dp) for sp in sps),
               default=float("inf"))


LEAD_LAYOUTS = 16
"""The bounded search's most promising layouts, searched one after another in this process
before the rest are spread over the cores with the threshold they set."""

BOUNDED_MIN_LAYOUTS = PARALLEL_MIN_LAYOUTS
"""The fewest candidate layouts bounded_evaluation bounds (fewer: the plain search, cheaper than
the bounds; the 16,384-GPU plans have 300-520, a node or two 5-30)."""


def bounded_evaluation(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, rates: TrainRates, memo: Memo,
                       keep_top: int, counts: Callable[[TrainEstimate], bool]
                       ) -> Callable[[list[Layout]], list[LayoutResult[TrainEstimate]]]:
    """run_search's evaluate_all for a plan that shows only its best `keep_top` configurations
    (the table's rows, a --top, plan explain's recommendation). The layouts that cannot run at
    all (cheap to find) and then the LEAD_LAYOUTS most promising (layout_promise) are searched
    one after another in this process, each with the threshold T the ones before it set: the
    keep_top-th best tokens/s so far among the estimates `counts` keeps (those the launch would
    start) less MEMORY_TIE_FRACTION of it (tie_threshold), 0 until there are keep_top of them; the rest are spread over the cores
    (parallel.map_in_workers) with the T the lead left. A configuration is skipped only where
    config_bound, hence its tokens/s, is below T, and T never exceeds the keep_top-th best of
    the whole space, so the first keep_top rows are the plain search's. Deterministic: T
    depends on a fixed order, not on which core finishes first. Below BOUNDED_MIN_LAYOUTS
    candidates the plain search runs: the bounds would cost what they save."""
    def evaluate_all(candidates: list[Layout]) -> list[LayoutResult[TrainEstimate]]:
        if len(candidates) < BOUNDED_MIN_LAYOUTS:  # a search this small costs less than its bounds
            return [search_layout(model, cluster, request, layout, rates, memo) for layout in candidates]
        promise = [layout_promise(model, cluster, request, layout, rates, memo) for layout in candidates]
        # the cheap rejections (infinite promise) first, then the most promising
        order = sorted(range(len(candidates)), key=lambda i: -promise[i])
        results: dict[int, LayoutResult[TrainEstimate]] = {}
        best: list[float] = []  # a min-heap of the keep_top best tokens/s that count
        finite = sum(p != float("inf") for p in promise)
        lead = len(candidates) - finite + LEAD_LAYOUTS  # the cheap rejections, then the most promising
        for i in order[:lead]:
            threshold_tokens_per_s = tie_threshold(best, keep_top)
            results[i] = search_layout(model, cluster, request, candidates[i], rates, memo, threshold_tokens_per_s)
            for e in results[i].found:
                if counts(e):
                    (heapq.heappush if len(best) < keep_top else heapq.heappushpop)(best, e.tokens_per_second)
        threshold_tokens_per_s = tie_threshold(best, keep_top)
        rest = order[lead:]

        def evaluate(i: int) -> LayoutResult[TrainEstimate]:
            return search_layout(model, cluster, request, candidates[i], rates, memo, threshold_tokens_per_s)

        results.update(zip(rest, map_in_workers(evaluate, rest), strict=True))
        return [results[i] for i in range(len(candidates))]

    return evaluate_all


def tie_threshold(best: list[float], keep_top: int) -> float:
    """bounded_evaluation's T from the keep_top best tokens/s so far (a min-heap): the
    keep_top-th, less MEMORY_TIE_FRACTION of it (a row within that of the first may go first
    for room in memory, prefer_headroom), 0 until there are keep_top."""
    return (1 - MEMORY_TIE_FRACTION) * best[0] if len(best) == keep_top else 0.0


def searched_recomputes(model: ModelSpec, request: TrainRequest) -> list[str]:
    """The recompute levels a search tries: the one --recompute fixes, else recompute_levels."""
    if request.recompute_num_layers is not None:
        return ["full"]
    return [request.recompute] if request.recompute else recompute_levels(model, request)


def largest_v(schedules: list[tuple[str, int]]) -> int:
    """The most virtual stages among schedule_options' pairs (1 where there is none)."""
    return max((v for _, v in schedules), default=1)


def recompute_levels(model: ModelSpec, request: TrainRequest) -> list[str]:
    """RECOMPUTE_ORDER less "outputs" where it is not a level (outputs_recompute_refusal), and
    "op" where it is not (op_recompute_refusal) or "selective" where it is (torchtitan's
    selective level is its per-op checkpoint)."""
    dropped = {"outputs"} if outputs_recompute_refusal(model, request) is not None else set()
    dropped.add("op" if op_recompute_refusal(model, request) is not None else "selective")
    return [level for level in RECOMPUTE_ORDER if level not in dropped]


def _first_fitting(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, recomputes: list[str],
                   rates: TrainRates, base: TrainConfig, first: int, memo: Memo,
                   reaches: Callable[[int], bool] | None = None) -> tuple[TrainEstimate | Rejected | None, int]:
    """The least recomputation that fits (more only adds time); else the last failure.

    Where it fits only by running something slower for memory (TrainEstimate.memory_fallback: a
    slower stage split, no combined 1F1B, NCCL instead of DeepEP), the next levels may fit without
    that and run faster: they are tried up to the first that needs no fallback, and the fastest
    kept (a tie to the lesser recompute). With flash attention selective recompute drops nothing
    (activations.py: no scores are kept), so after a lesser level ran out of memory it is
    skipped: it keeps no recompute's bytes, at least as many as "outputs" keeps.
    Also the index (counted from `first`) of the least recompute level that fits: the levels
    before it ran out of memory, and memory never shrinks as b grows (activations scale
    with b, micro-batches in flight times b never falls), so a larger b can start there.
    `reaches` (bounded search): whether a recompute level (indexed from 0, not from `first`) or
    one after it may reach the rows kept; once none can, the levels left are not estimated: the
    best so far, or None when none fitted (nothing to report: it ranks below the rows kept
    whatever it is) with the index of that level (those before it ran out of memory)."""
    result: TrainEstimate | Rejected | None = None
    best: TrainEstimate | None = None
    fits_at = first
    for offset, recompute in enumerate(recomputes):
        if reaches is not None and not reaches(first + offset):
            # none fitted yet: the levels before this one ran out of memory, so does a larger b
            return best, (fits_at if best is not None else first + offset)
        if recompute == "selective" and base.attention == "flash" and isinstance(result, Rejected):
            continue  # with flash, selective keeps exactly no recompute's bytes: out of memory too
        config = base if recompute == base.recompute else base.with_(recompute=recompute)
        if recompute == "full" and request.recompute_num_layers is not None:
            # at most the layers a chunk holds: Megatron's block method reruns the first N of a
            # chunk, every one where N is more (a review: --recompute-num-layers 20 on 405B chunks
            # of 4 layers was emitted and shown as "full (block 20)")
            config = config.with_(recompute_num_layers=min(request.recompute_num_layers,
                                                           block_range(model, config, None)))
        result = estimate(model, cluster, config, request, rates, memo)
        if recompute == "full":
            result = least_block_recompute(model, cluster, request, rates, memo, config, result)
        if isinstance(result, TrainEstimate):
            if best is None:
                best, fits_at = result, first + offset
            elif result.tokens_per_second > best.tokens_per_second:
                best = result
            if not result.memory_fallback:
                return best, fits_at
            continue
        if best is None and result.over_bytes == 0:
            return result, first
    if best is not None:
        return best, fits_at
    assert result is not None
    return result, first


def least_block_recompute(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, rates: TrainRates,
                          memo: Memo, config: TrainConfig, full: TrainEstimate | Rejected) -> TrainEstimate | Rejected:
    """Full recompute of the fewest layers that fits (docs/cost-model.md#training-partial-recompute):
    Megatron's --recompute-method block --recompute-num-layers k (the first k layers of each
    model chunk rerun, the others keep every activation) or torchtitan's layer-level selective
    checkpointing (every N-th block), given `full`, the configuration with every layer
    recomputed. A stage's memory never grows and its time never falls as more layers rerun
    (each keeps its input only and reruns its forward), so the least that fits is the fastest:
    found by bisection over partial_recompute_configs (least recompute first). Where `full` is
    out of memory, the most recompute short of every layer may still fit (a kept last layer frees
    its activations before the reruns rematerialise: activations.py's working set), so it is
    tried first; where it does not, nothing less does. `full` itself where nothing short of it
    fits, or where the request fixes the level (--recompute full: every layer, as the 2021 runs
    recomputed) or the count (--recompute-num-layers). `config` is `full`'s as searched (the
    estimate picks each one's stage split). Where the least fits only by a slower split
    (memory_fallback), the next are tried up to the first that needs none (`full` last), the
    fastest kept, as _first_fitting does with the levels; then roomier_block."""
    if (not block_recompute_runs(request) or request.recompute_num_layers is not None
            or config.recompute_num_layers is not None or config.recompute_every is not None
            or (isinstance(full, Rejected) and full.over_bytes <= 0)):
        return full
    candidates = partial_recompute_configs(model, config, full)
    if not candidates:
        return full
    def fits(candidate: TrainConfig) -> TrainEstimate | None:
        result = estimate(model, cluster, candidate, request, rates, memo)
        return result if isinstance(result, TrainEstimate) else None

    high, top = len(candidates) - 1, None
    if isinstance(full, Rejected):  # the most recompute short of every layer: else nothing fits
        top = fits(candidates[high])
        if top is None:
            return full
        high -= 1
    least, at = _least_passing(candidates, 0, high, fits)
    if least is None:
        if top is None:
            return full
        least, at = top, high + 1
    best: TrainEstimate = least
    following: TrainEstimate | None = least
    while following is not None and following.memory_fallback and at < len(candidates):
        at += 1
        following = (full if isinstance(full, TrainEstimate) else None) if at == len(candidates) else fits(
            candidates[at])
        if following is not None and following.tokens_per_second > best.tokens_per_second:
            best = following
    return roomier_block(model, cluster, request, rates, memo, candidates, best)


def _least_passing(candidates: list[TrainConfig], low: int, high: int,
                   passes: Callable[[TrainConfig], TrainEstimate | None]) -> tuple[TrainEstimate | None, int]:
    """Bisection over candidates[low..high], along which `passes` never turns false once true
    (memory only falls as more layers rerun): the first that passes and its index, else (None, -1)."""
    found, at = None, -1
    while low <= high:
        mid = (low + high) // 2
        result = passes(candidates[mid])
        if result is not None:
            found, at, high = result, mid, mid - 1
        else:
            low = mid + 1
    return found, at


def partial_recompute_configs(model: ModelSpec, config: TrainConfig, full: TrainEstimate | Rejected
                              ) -> list[TrainConfig]:
    """The configurations between none and every layer recomputed, least recompute first.
    Megatron: block counts k = 1..K-1 (K = block_range, the most layers a chunk holds).
    torchtitan: every N-th block from N = n down to 2 (n the most blocks a stage holds; floor(n/N)
    of them rerun), one N for each count (the largest: the fewest on the other stages)."""
    if config.engine == "torchtitan":
        most = block_range(model, config.with_(virtual_stages=1), full)
        by_count: dict[int, int] = {}
        for every in range(most, 1, -1):
            by_count.setdefault(most // every, every)
        return [config.with_(recompute_every=every) for _, every in sorted(by_count.items())
                if most // every < most]
    return [config.with_(recompute_num_layers=k) for k in range(1, block_range(model, config, full))]


def roomier_block(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, rates: TrainRates, memo: Memo,
                  candidates: list[TrainConfig], fitted: TrainEstimate) -> TrainEstimate:
    """The least recompute beyond `fitted`'s (partial_recompute_configs) that leaves
    TIGHT_MEMORY_FRACTION of the GPU free, where `fitted` (the least that fits) leaves less and
    the roomier one prices within MEMORY_TIE_FRACTION of it (prefer_headroom's policy, applied to
    the one knob that trades memory for time a layer at a time); else `fitted`. Bisection:
    memory falls as more layers rerun."""
    if headroom_bytes(fitted) >= TIGHT_MEMORY_FRACTION * fitted.capacity_per_gpu_bytes:
        return fitted
    start = next((i for i, c in enumerate(candidates)
                  if (c.recompute_num_layers, c.recompute_every)
                  == (fitted.config.recompute_num_layers, fitted.config.recompute_every)), None)
    if start is None:  # every layer: nothing beyond it
        return fitted
    def leaves_room(candidate: TrainConfig) -> TrainEstimate | None:
        result = estimate(model, cluster, candidate, request, rates, memo)
        roomy_ = (isinstance(result, TrainEstimate)
                  and headroom_bytes(result) >= TIGHT_MEMORY_FRACTION * result.capacity_per_gpu_bytes)
        return result if roomy_ else None  # type: ignore[return-value]

    roomy, _ = _least_passing(candidates, start + 1, len(candidates) - 1, leaves_room)
    if roomy is not None and roomy.tokens_per_second >= (1 - MEMORY_TIE_FRACTION) * fitted.tokens_per_second:
        return roomy
    return fitted


def block_range(model: ModelSpec, config: TrainConfig, full: TrainEstimate | Rejected | None) -> int:
    """K, the most layers a chunk of the configuration holds: block counts 1..K-1 keep some layers
    (least_block_recompute). From `full`'s stage split where it ran, else ceil(ceil(L/p)/v)."""
    if isinstance(full, TrainEstimate) and full.num_layers_per_stage:
        most = max(full.num_layers_per_stage)
    else:
        most = -(-model.num_hidden_layers // config.pp)
    return -(-most // config.virtual_stages)


def check_fixed_batch(request: TrainRequest, given: LayoutFilter | None = None) -> None:
    """A fixed degree the batch cannot divide is a usage error, not a search result.
    `given`: --layout as typed (dp may have been resolved from tp, pp and the GPU count)."""
    f = request.layout
    if request.micro_batch is not None and request.micro_batch > request.global_batch:
        # first: "64 not divisible by --micro-batch 128" said less (a CLI read)
        raise SpecError(f"--micro-batch: {request.micro_batch} exceeds --global-batch {request.global_batch}")
    if f.dp is not None and request.global_batch % f.dp:
        how = "--layout" if given is None or given.dp is not None else "--layout tp, pp and the GPU count"
        raise SpecError(f"--global-batch: {request.global_batch} not divisible by dp={f.dp} (fixed by {how})")
    if f.dp is not None and request.micro_batch is not None:
        step = request.micro_batch * f.dp
        if request.global_batch % step:
            raise SpecError(f"--global-batch: {request.global_batch} not divisible by "
                            f"micro-batch * dp = {request.micro_batch}*{f.dp} = {step}")
    if request.micro_batch is not None and request.global_batch % request.micro_batch:
        raise SpecError(f"--global-batch: {request.global_batch} not divisible by "
                        f"--micro-batch {request.micro_batch}")


def resolve_fixed_dp(request: TrainRequest, cluster: ClusterSpec) -> TrainRequest:
    """`--layout tp=..,pp=..` with the GPU count fixes dp too where no context parallelism could
    split the other ranks (cp_options; with cp= given, dp = N / (tp cp pp)): check the batch
    against it. Where some CP degree could, dp is left to the search, as cp is."""
    f = request.layout
    num_gpus = request.num_gpus or cluster.num_gpus
    if None not in (f.tp, f.pp, f.dp) and f.tp * f.pp * f.dp * (f.cp or 1) != num_gpus:
        # before the batch is checked against dp (a fuzz sweep: tp=2,pp=2,dp=3 on 8 GPUs read
        # "--global-batch: 64 not divisible by dp=3"); candidate_layouts' words
        raise SpecError(f"--layout: {pinned_degrees(f)} cannot multiply to the {num_gpus} GPUs planned for")
    if f.tp is None or f.pp is None or f.dp is not None:
        return request
    cp = f.cp or 1
    if num_gpus % (f.tp * f.pp * cp):
        product = f"tp*pp = {f.tp * f.pp}" if cp == 1 else f"tp*cp*pp = {f.tp * cp * f.pp}"
        raise SpecError(f"--layout: {product} does not divide the {num_gpus} GPUs")
    ranks = num_gpus // (f.tp * f.pp)
    degrees = cp_options(request, ranks, f.pp) if f.cp is None else []
    if degrees:
        # cp not given and some CP degree could split the other ranks: dp stays free, as under
        # --layout tp=8 alone (pinning cp = 1 here had kept tp=4,pp=4 from its faster cp=2
        # variant, which the filter matches; found by a CLI read)
        if all(request.global_batch % (ranks // cp) for cp in (1, *degrees)):
            raise SpecError(f"--global-batch: {request.global_batch} not divisible by dp={ranks} (fixed by --layout tp, "
                            f"pp and the GPU count), nor by "
                            + " or ".join(f"dp={ranks // cp} (cp={cp})" for cp in degrees))
        return request
    return replace(request, layout=replace(f, dp=num_gpus // (f.tp * f.pp * cp)))


MAX_SUGGESTED_GPUS = 4096
"""The largest cluster more_gpus_suggestion tries (512 nodes of 8)."""


def short_of_memory(plan: TrainPlan) -> bool:
    """Nothing fits and some configuration failed for want of memory: more GPUs, recompute or
    ZeRO could help (what would fit is suggested; train_cli.contradictory_flags' exit 2 is the
    complement: nothing fits and none was out of memory)."""
    return not plan.layouts and any(r.over_bytes > 0 for r in plan.rejected)


def more_gpus_suggestion(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest) -> str | None:
    """What would fit when nothing does for want of memory: the first of 2, 4, ... GPUs of this
    kind in one node (up to the GPU's typical node), then 2, 4, ... such nodes (up to
    MAX_SUGGESTED_GPUS), with the catalog's typical networking, on which the same request finds
    a configuration, with that configuration. None where none does, or the catalog cannot
    build such a cluster. Doubling: the true fewest may lie between two sizes. A size whose
    GPUs together cannot hold the model's states once (least_total_model_state_bytes) is
    skipped without a search: nothing there could fit."""
    from planner.catalog import cluster_from_shorthand

    grad_bytes = efficiency.GRADIENT_BYTES_PER_PARAM[request.grad_reduce]
    states_bytes = least_total_model_state_bytes(param_counts(trained_model(model, request)).total, grad_bytes,
                                                 least_state_bytes_per_param(request.engine, request.optimizer_states))

    per_node = max(cluster.gpus_per_node, cluster.gpu.typical_gpus_per_node)
    planned = request.num_gpus or cluster.num_gpus  # --gpus: what was planned on
    sizes = [(1, g) for g in (2 ** i for i in range(1, 11)) if planned < g <= per_node]
    sizes += [(n, per_node) for n in (2 ** i for i in range(1, 20))
              if n * per_node > planned and n * per_node <= MAX_SUGGESTED_GPUS]
    if planned < cluster.num_gpus:  # --gpus left some of this cluster out: try more of it first
        for g in (2 ** i for i in range(1, 20)):
            if planned < g <= cluster.num_gpus and g * cluster.gpu.cuda_visible_memory_bytes >= states_bytes:
                try:
                    plan = search(model, cluster, replace(request, num_gpus=g), suggest=False)
                except SpecError:  # not a shape --gpus takes here, or the request's flags do not hold
                    continue
                if plan.layouts:
                    return f"{_config_words(plan.layouts[0].config)} on {g} GPUs of this cluster: plan with --gpus {g}"
    wider = replace(request, num_gpus=None)
    for nodes, gpus in sizes:
        if nodes * gpus * cluster.gpu.cuda_visible_memory_bytes < states_bytes:
            continue  # cannot hold the model states once: no configuration fits
        shorthand = f"{nodes}x{gpus}x{cluster.gpu.name}"
        try:
            bigger = cluster_from_shorthand(nodes, gpus, cluster.gpu.name, shorthand)
        except SpecError:
            return (f"the catalog cannot build a larger cluster of {cluster.gpu.name} to try (no typical node "
                    f"of it): describe one in a hardware profile and plan again")
        try:
            plan = search(model, bigger, wider, suggest=False)
        except SpecError:  # the request's own flags do not hold on that cluster (a fixed batch split)
            continue
        if plan.layouts:
            return (f"{nodes * gpus} GPUs ({shorthand}, the catalog's networking) run "
                    f"{_config_words(plan.layouts[0].config)}: plan with --cluster {shorthand} to see it (sizes "
                    f"tried by doubling)")
    return None


def _config_words(c: TrainConfig) -> str:
    return (f"tp={c.tp} cp={c.cp} pp={c.pp} dp={c.dp}{f' ep={c.ep}' if c.ep > 1 else ''}, recompute {c.recompute_label}, "
            f"ZeRO-{c.zero_stage}")


def search(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, suggest: bool = True,
           keep_top: int | None = None, counts: Callable[[TrainEstimate], bool] | None = None) -> TrainPlan:
    """The training plan: every configuration the pruning leaves, ranked by tokens/s.
    A request that cannot be met by any layout (a fixed batch that does not divide) is a
    SpecError, not a plan. `suggest`: where nothing fits for want of memory, say what would
    (more_gpus_suggestion, which searches without it). `keep_top`: only the best this many
    configurations are wanted (the rest may be bounded out: bounded_evaluation), of those
    `counts` keeps (default all: the launch's refusals drop the others afterwards)."""
    model = trained_model(model, request)  # with the MTP modules it trains (the estimates price them)
    engines.check_request(model, request)
    check_moe_dispatcher(model, cluster, request)
    if request.recompute == "outputs":
        refusal = outputs_recompute_refusal(model, request)
        if refusal is not None:
            raise SpecError(f"--recompute outputs: {refusal}")
    if request.recompute == "op" and (refusal := op_recompute_refusal(model, request)) is not None:
        raise SpecError(f"--recompute op: {refusal}")
    if request.recompute_num_layers is not None and request.recompute_num_layers > model.num_hidden_layers:
        # Megatron's "between 1 and num_layers_per_pipeline_rank" (TransformerConfig.__post_init__,
        # core_v0.19.0) is not enforced above it: a larger count reruns every layer of the stage,
        # and one past the whole model is a mistake
        raise SpecError(f"--recompute-num-layers: {request.recompute_num_layers} is more than {model.name}'s "
                        f"{model.num_hidden_layers} layers (it counts the layers of one model chunk to rerun)")
    if request.recompute == "selective" and op_recompute_refusal(model, request) is None:
        request = replace(request, recompute="op")  # torchtitan's selective level, as it runs it
    given, asked = request.layout, request
    request = resolve_fixed_dp(request, cluster)
    check_fixed_batch(request, given)
    if given.tp is not None and model.intermediate_size % given.tp:
        raise SpecError(f"--layout: tp={given.tp}: FFN size {model.intermediate_size} not divisible "
                        f"by tp (Megatron-LM splits it evenly; {model.name})")
    num_gpus = request.num_gpus or cluster.num_gpus
    rates = train_rates(model, cluster, request.attention_kernel)
    memo = Memo()
    bounded = (None if keep_top is None else
               bounded_evaluation(model, cluster, request, rates, memo, keep_top, counts or (lambda e: True)))
    plan = run_search(model, cluster, request, num_gpus, request.layout,
                      lambda layout: search_layout(model, cluster, request, layout, rates, memo),
                      lambda found: sorted(found, key=rank_key),
                      lambda layout: cp_options(request, layout.dp, layout.pp), parallel=True, widest_ep=True,
                      evaluate_all=bounded)
    if plan.num_configs_bounded:
        plan = replace(plan, bounded_below_row=keep_top)
    plan = prefer_headroom(prefer_tp_inside_a_node(plan, cluster), cluster)
    shortfall = in_node_shortfall(model, cluster, request, plan.recommended, rates, memo,
                                  lambda pp: schedule_options(model, request, pp),
                                  lambda dp: micro_batch_options(request, dp))
    if shortfall:
        plan = replace(plan, shortfall=shortfall)
    if suggest and request.precision == "fp8" and plan.recommended is not None:
        plan = replace(plan, bf16_faster=bf16_if_faster(model, cluster, asked, plan.recommended))
    if suggest and plan.recommended is not None and plan.recommended.config.recompute != "none":
        plan = replace(plan, bf16_states_faster=bf16_states_if_faster(model, cluster, asked, plan.recommended))
    if suggest and short_of_memory(plan):
        found = more_gpus_suggestion(model, cluster, asked)  # as asked: dp not fixed to this cluster's
        searched = searched_flags_suggestion(model, cluster, asked)
        nothing = f"nothing up to {MAX_SUGGESTED_GPUS:,} GPUs of this kind fits" + (" with these flags" if searched else "")
        plan = replace(plan, suggestions=searched + without_mtp_suggestion(model, cluster, asked)
                       + bf16_states_suggestion(model, cluster, asked) + ((found,) if found else (nothing,)))
    return plan


BF16_STATES_NOTE_GAIN = 0.02
"""How much more tokens/s the best configuration with bf16 optimizer states must price than the
recommendation for the plan to name it: below the training model's own error (3% median over its
calibration) the difference is not worth a numerics change. A policy, not a fit."""


def bf16_states_if_faster(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest,
                          fp32: TrainEstimate) -> TrainEstimate | None:
    """The best configuration with bf16 optimizer states (Megatron's precision-aware optimizer)
    where it runs BF16_STATES_NOTE_GAIN more tokens/s than `fp32`, the recommendation, which
    recomputes: the memory the moments and master weights give back can go to less recompute or
    larger micro-batches. None otherwise (and for what cannot run them: bf16_states_possible).
    Llama-3.1-405B on 16x8 H100, global batch 512 at 8,192 tokens: block recompute of 6 layers a
    chunk with fp32 states, 4 with bf16 ones, 6.9% faster."""
    if not bf16_states_possible(request):
        return None
    bf16 = search(model, cluster, replace(request, optimizer_states="bf16"), suggest=False, keep_top=1)
    best = bf16.recommended
    return best if best is not None and best.tokens_per_second > (1 + BF16_STATES_NOTE_GAIN) * fp32.tokens_per_second \
        else None


def bf16_states_suggestion(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest) -> tuple[str, ...]:
    """Where nothing fits for want of memory: the configuration these GPUs run with bf16 optimizer
    states (--optimizer-states bf16), or nothing."""
    runs = bf16_states_possible(request) and these_gpus_run(model, cluster, replace(request, optimizer_states="bf16"))
    return (f"{runs} with bf16 optimizer states (--optimizer-states bf16: Adam's moments in bf16, Megatron's "
            f"precision-aware optimizer)",) if runs else ()


def these_gpus_run(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest) -> str | None:
    """"these GPUs run <the best configuration of `request`>, micro-batch b" (a suggestion's
    start), or None where nothing fits or the request does not hold by itself."""
    try:
        plan = search(model, cluster, request, suggest=False, keep_top=1)
    except SpecError:
        return None
    if not plan.layouts:
        return None
    c = plan.layouts[0].config
    return f"these GPUs run {_config_words(c)}, micro-batch {c.micro_batch_size}"


def bf16_if_faster(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest,
                   fp8: TrainEstimate) -> TrainEstimate | None:
    """The best bf16 configuration of the same request where it runs more tokens/s than `fp8`,
    the fp8 plan's recommendation: fp8 halves the GEMMs' time but not the rest (attention,
    elementwise work, communication, the MoE layers' host waits), adds its casts and a weight
    cache, and where that memory pushes the search to smaller micro-batches or more recompute,
    or the host already paces the step, the fp8 plan can be the slower one. None where fp8 is
    at least as fast."""
    bf16 = search(model, cluster, replace(request, precision="bf16", fp8_recipe=None), suggest=False, keep_top=1)
    best = bf16.recommended
    return best if best is not None and best.tokens_per_second > fp8.tokens_per_second else None


TP_ACROSS_NODES_MARGIN = 0.03
"""How much more tokens/s a configuration whose TP group leaves the node must price than the
best one whose TP stays inside a node to be recommended over it. A policy, not a fit: its TP
all-reduces run over the NICs in every layer of every micro-batch, where the priced collective
(NCCL's achieved bus bandwidth across nodes, comm.py) is the model's least certain term and
Megatron's own layouts keep TP in the NVLink domain; a few percent of estimate is not worth it."""


def prefer_tp_inside_a_node(plan: TrainPlan, cluster: ClusterSpec) -> TrainPlan:
    """The plan with the best listed configuration whose TP stays inside a node moved first when
    the fastest has TP across nodes and is not TP_ACROSS_NODES_MARGIN faster (plan.passed_over
    the one it moved above). Found on Qwen3-30B-A3B, 4x8 H100, global batch 8: tp=16 over
    InfiniBand 47,815 tokens/s against tp=8 in the node 46,712 (2.3%)."""
    if not plan.layouts or not tp_leaves_node(cluster, plan.layouts[0].config.tp):
        return plan
    best = plan.layouts[0]
    for i, e in enumerate(plan.layouts):
        if e.tokens_per_second < (1 - TP_ACROSS_NODES_MARGIN) * best.tokens_per_second:
            break
        if not tp_leaves_node(cluster, e.config.tp):
            return replace(plan, layouts=(e, *plan.layouts[:i], *plan.layouts[i + 1:]), passed_over=best)
    return plan


TIGHT_MEMORY_FRACTION = 0.03
"""Free memory per GPU, as a share of its capacity, below which a configuration is at the edge
of memory: about what the estimate does not itemize (NCCL buffers of the CP and EP groups, 0.5-0.7
GB each as vLLM logs them, efficiency.NCCL_BUFFER_BYTES_*; Transformer Engine's TP-overlap user
buffers) and its allocator allowance may not cover. 2.4 GiB of an H100's 79.1. A policy, not a
fit."""

MEMORY_TIE_FRACTION = 0.01
"""How much more tokens/s a configuration at the edge of memory must price than the fastest one
with room (TIGHT_MEMORY_FRACTION free) to be recommended over it: below the training model's own
error (3% median over its calibration, bench/training_calibration.py), a difference the estimate
cannot resolve is not worth an out-of-memory risk. A policy, not a fit."""


def headroom_bytes(e: TrainEstimate) -> float:
    """Memory per GPU the configuration leaves free on its fullest stage."""
    return e.capacity_per_gpu_bytes - e.memory_per_gpu_bytes


def prefer_headroom(plan: TrainPlan, cluster: ClusterSpec) -> TrainPlan:
    """The plan with the fastest listed configuration that leaves TIGHT_MEMORY_FRACTION of the
    GPU free moved first, where the first leaves less and is not MEMORY_TIE_FRACTION faster
    (plan.tight_passed_over the one it moved above); only among configurations whose TP group is
    where the first's is (prefer_tp_inside_a_node's choice stands). Found on Llama-3.1-405B, 128x8
    H100, 2,048 x 8,192: interleaved/2 at 78.6 of 79.1 GiB was 0.04% faster than interleaved/3
    at 73.5 GiB (a CLI read)."""
    if not plan.layouts:
        return plan
    best = plan.layouts[0]
    if headroom_bytes(best) >= TIGHT_MEMORY_FRACTION * best.capacity_per_gpu_bytes:
        return plan
    across = tp_leaves_node(cluster, best.config.tp)
    for i, e in enumerate(plan.layouts[1:], start=1):
        if e.tokens_per_second < (1 - MEMORY_TIE_FRACTION) * best.tokens_per_second:
            break
        if (headroom_bytes(e) >= TIGHT_MEMORY_FRACTION * e.capacity_per_gpu_bytes
                and tp_leaves_node(cluster, e.config.tp) == across):
            return replace(plan, layouts=(e, *plan.layouts[:i], *plan.layouts[i + 1:]), tight_passed_over=best)
    return plan


def constraint_flags(request: TrainRequest) -> list[str]:
    """The flags that narrowed the search, as given (--layout's degrees, micro-batch, schedule,
    virtual stages, recompute, sequence parallelism, ZeRO)."""
    given = request.layout
    degrees = [f"{name}={value}" for name, value in (("tp", given.tp), ("pp", given.pp), ("dp", given.dp),
                                                       ("ep", given.ep), ("cp", given.cp)) if value is not None]
    flags = [f"--layout {','.join(degrees)}"] if degrees else []
    for flag, value in (("--micro-batch", request.micro_batch), ("--schedule", request.schedule),
                        ("--virtual-stages", request.virtual_stages), ("--recompute", request.recompute),
                        ("--zero", request.zero_stage)):
        if value is not None:
            flags.append(f"{flag} {value}")
    if request.sequence_parallel is not None:
        flags.append("--sequence-parallel" if request.sequence_parallel else "--no-sequence-parallel")
    return flags


def searched_flags_suggestion(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest) -> tuple[str, ...]:
    """Where the request's own flags (constraint_flags: --micro-batch, --zero, --recompute,
    --layout, ...) narrowed a search in which nothing fits: the configuration the same GPUs run
    with all of them searched instead, or nothing. `--micro-batch 64` on Llama-3.1-8B at 8,192
    tokens: 8 H100 run micro-batch 1 (before, the plan only offered 16 GPUs)."""
    flags = constraint_flags(request)
    if not flags:
        return ()
    free = replace(request, layout=LayoutFilter(), micro_batch=None, schedule=None, virtual_stages=None,
                   recompute=None, sequence_parallel=None, zero_stage=None)
    runs = these_gpus_run(model, cluster, free)
    return (f"{runs} with {' '.join(flags)} searched instead",) if runs else ()


def without_mtp_suggestion(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest) -> tuple[str, ...]:
    """Where the trained MTP modules are what does not fit: the configuration the same GPUs run
    without them (--mtp-layers 0), or nothing."""
    if not model.num_mtp_layers:
        return ()
    plan = search(model, cluster, replace(request, mtp_layers=0), suggest=False)
    if not plan.layouts:
        return ()
    c = plan.layouts[0].config
    modules = "MTP module" if model.num_mtp_layers == 1 else f"{model.num_mtp_layers} MTP modules"
    return (f"these GPUs run tp={c.tp} cp={c.cp} pp={c.pp} dp={c.dp}{f' ep={c.ep}' if c.ep > 1 else ''} without the "
            f"{modules} (--mtp-layers 0)",)
