"""The one search skeleton both workloads run: enumerate -> estimate -> reject with
reasons -> rank (-> suggest, for serving). What differs between serving and training is
only what one layout's evaluation tries (serving: one estimate; training: micro-batch,
schedule, recompute, ZeRO...) and the ranking key; both are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from planner.cost.params import tp_head_reasons
from planner.errors import SpecError
from planner.layout import Layout, Rejected, expert_parallel_degrees, factorizations
from planner.parallel import map_in_workers
from planner.requests import LayoutFilter
from planner.specs import ClusterSpec, ModelSpec

PARALLEL_MIN_LAYOUTS = 256
"""A search of at least this many candidate layouts spreads them over the usable cores
(`run_search(parallel=True)`, training): below it a worker's start and the results' transfer
cost more than the layouts (the 16,384-GPU training plans have 300-520, a node or two 5-30)."""

E = TypeVar("E")
"""An estimate type (ServeEstimate, TrainEstimate)."""
R = TypeVar("R")
"""A request type (ServeRequest, TrainRequest)."""


@dataclass(frozen=True)
class Plan(Generic[E, R]):
    """A search's result, the same shape for serving and training."""

    model: ModelSpec
    cluster: ClusterSpec
    request: R
    num_gpus: int
    layouts: tuple[E, ...]
    """Feasible estimates, best first."""
    rejected: tuple[Rejected, ...]
    """Layouts with nothing feasible, each with why (ordered by tp, pp, dp)."""
    num_configs_evaluated: int = 0
    num_configs_bounded: int = 0
    """A search with a row limit (train_search.search's and serve_search.evaluate's `keep_top`):
    configurations (serving: layouts) not estimated because even their bound
    (train_search.config_bound, serve.serving_bounds) ranks below the last row; neither
    feasible nor rejected."""
    bounded_below_row: int | None = None
    """The row limit that bound applied to (None: every configuration was estimated)."""
    pareto: frozenset[Layout] = frozenset()
    """Serving: layouts no other beats on both TPOT and throughput."""
    suggestions: tuple[str, ...] = field(default=())
    """When nothing fits: changes that were checked to make a layout feasible."""
    moe_backend_options: tuple[Any, ...] = field(default=())
    """Serving, MoE: the recommended layout under each other --moe-backend the GPU has a
    measured kernel for (serve_search.BackendOption)."""
    all2all_backend_options: tuple[Any, ...] = field(default=())
    """Serving, MoE with an EP group spanning DP ranks: the recommended layout under each other
    --all2all-backend (serve_search.BackendOption)."""
    token_budget_options: tuple[Any, ...] = field(default=())
    """Serving, a recommended layout with PP at a closed loop: the layout under each other
    --max-num-batched-tokens of serve_search.TOKEN_BUDGET_CHOICES (serve_search.BackendOption)."""
    speculation_options: tuple[Any, ...] = field(default=())
    speculation_break_even: float | None = None
    """Serving with speculative decoding: the factor on every acceptance rate below which the
    recommended layout does better without drafts (serve_search.speculation_break_even)."""
    """Serving with speculative decoding: the recommended layout without it
    (serve_search.BackendOption, value SPECULATION_OFF)."""
    shortfall: Any = None
    """Training: when the recommendation's TP group leaves the node, the in-node configuration
    that came closest to fitting and what it misses by (train_shortfall.InNodeShortfall)."""
    bf16_faster: Any = None
    """Training with --precision fp8: the best bf16 configuration where it runs more tokens/s than
    the fp8 recommendation (train_search.bf16_if_faster); None otherwise."""
    bf16_states_faster: Any = None
    """Training under Megatron with fp32 optimizer states, a recommendation that recomputes: the
    best configuration with bf16 ones (--optimizer-states bf16) where it runs
    train_search.BF16_STATES_NOTE_GAIN more tokens/s (train_search.bf16_states_if_faster)."""
    passed_over: Any = None
    """Training: the faster configuration whose TP group leaves the node that the recommendation,
    TP inside a node within train_search.TP_ACROSS_NODES_MARGIN of it, was ranked above."""
    tight_passed_over: Any = None
    """Training: the faster configuration at the edge of memory that the recommendation, within
    train_search.MEMORY_TIE_FRACTION of it with room to spare, was ranked above
    (train_search.prefer_headroom)."""

    @property
    def recommended(self) -> E | None:
        return self.layouts[0] if self.layouts else None


class LayoutResult(NamedTuple, Generic[E]):
    """What evaluating one layout gives."""

    found: list[E]
    """Its feasible estimates."""
    rejected: Rejected | None
    """Why it is rejected when there are none (None when it was bounded out entirely)."""
    num_configs: int
    """How many configurations were estimated."""
    num_bounded: int = 0
    """How many were not, their bound below a threshold (training, train_search.search)."""


T = TypeVar("T")


def non_dominated(items: list[T], scores: Callable[[T], tuple[float, ...]], drop_equal: bool = False) -> list[T]:
    """The items no other one beats: at least as good on every score (higher is better) and
    better on one. `drop_equal`: of items with equal scores only the first is kept."""
    scored = [scores(item) for item in items]
    kept = []
    for i, a in enumerate(scored):
        beaten = any(all(x >= y for x, y in zip(b, a, strict=True)) and (b != a or (drop_equal and j < i))
                     for j, b in enumerate(scored) if j != i)
        if not beaten:
            kept.append(items[i])
    return kept


MAX_IDLE_REPLICA_GPUS = 64
"""candidate_layouts(leave_idle): replicas of at most this many GPUs (8 nodes of 8) may leave
GPUs idle; wider ones are planned only on divisors of the GPUs."""


def pinned_degrees(wanted: LayoutFilter) -> str:
    """--layout's fixed degrees as typed back: `tp=2,pp=2,dp=3`."""
    return ",".join(f"{k}={v}" for k, v in vars(wanted).items() if v is not None)


def candidate_layouts(num_gpus: int, wanted: LayoutFilter, gpus_per_node: int | None = None,
                      max_ep: int | None = None,
                      cp_degrees: Callable[[Layout], list[int]] | None = None,
                      leave_idle: bool = False, widest_ep: bool = False) -> list[Layout]:
    """Every (tp, pp, dp) with tp*pp*dp = num_gpus that `--layout` keeps; with gpus_per_node
    (an MoE model) also each one's expert-parallel variants (expert_parallel_degrees); with
    cp_degrees (training) also the context-parallel variants (tp, pp, dp/cp, cp) of each,
    cp_degrees(layout) naming the degrees above 1 to try. `leave_idle` (serving: replicas are
    independent): also power-of-two tp and pp whose product does not divide the GPUs, with
    as many replicas as fit (7 GPUs: tp=2 x 3 replicas, one GPU idle), where the divisors alone
    would force tp=1 or tp=7; and its EP groups "over one node" count the DP ranks a node holds
    in vLLM's rank order, a replica's stages together (expert_parallel_degrees' pp_in_node).
    `widest_ep` (training): the widest EP group the experts allow
    too (expert_parallel_degrees). The CP variants (training) get EP variants too, their groups
    over the CP and DP ranks (Layout.ep)."""
    layouts = factorizations(num_gpus)
    if leave_idle:
        powers = [2**k for k in range(num_gpus.bit_length()) if 2**k <= min(num_gpus, MAX_IDLE_REPLICA_GPUS)]
        layouts += [Layout(tp, pp, num_gpus // (tp * pp)) for tp in powers for pp in powers
                    if tp * pp <= min(num_gpus, MAX_IDLE_REPLICA_GPUS) and num_gpus % (tp * pp)]
    if cp_degrees is not None:
        layouts += [Layout(lay.tp, lay.pp, lay.dp // cp, cp=cp) for lay in layouts for cp in cp_degrees(lay)]
    if gpus_per_node is not None:
        layouts += [Layout(lay.tp, lay.pp, lay.dp, ep, lay.cp) for lay in layouts
                    for ep in _ep_degrees(lay, wanted.ep, gpus_per_node, max_ep, widest_ep, leave_idle)]
    layouts = [lay for lay in layouts if wanted.matches(lay.tp, lay.pp, lay.dp, lay.ep, lay.cp)]
    if not layouts:
        degrees = pinned_degrees(wanted)
        if wanted.ep not in (None, 1):
            ranks = "cp*dp (whole TP groups of context- and data-parallel ranks)" if wanted.cp not in (None, 1) \
                else "dp (whole TP groups of data-parallel ranks)"
            folding = "" if leave_idle else ", which Megatron's MoE parallel folding also runs,"  # serving: no Megatron
            raise SpecError(f"--layout: {degrees}: the planner's expert groups span whole TP groups, so ep must be "
                            f"tp times a divisor of {ranks} on the {num_gpus} GPUs planned for (an ep below tp"
                            f"{folding} is not planned)")
        pinned = [d for d in (wanted.tp, wanted.pp, wanted.dp, wanted.cp) if d is not None]
        needed = math.prod(pinned)
        if needed > num_gpus:  # tp=16 on 8 GPUs: more GPUs than there are, whatever else
            raise SpecError(f"--layout: {degrees} needs at least {needed} GPUs; {num_gpus} are planned for")
        idle = (f"; only power-of-two tp and pp (up to {MAX_IDLE_REPLICA_GPUS} GPUs a replica) may leave GPUs "
                f"idle, and --gpus N plans for fewer GPUs") if leave_idle else ""
        raise SpecError(f"--layout: {degrees} cannot multiply to the {num_gpus} GPUs planned for{idle}")
    return layouts


def expert_search(model: ModelSpec, cluster: ClusterSpec) -> tuple[int | None, int | None]:
    """candidate_layouts' (gpus_per_node, max_ep): EP for MoE models, up to their experts."""
    return (cluster.gpus_per_node, model.num_local_experts) if model.is_moe else (None, None)


def _ep_degrees(layout: Layout, wanted_ep: int | None, gpus_per_node: int, max_ep: int | None,
                widest: bool = False, stages_in_node: bool = False) -> list[int]:
    """The searched EP degrees, or the one `--layout ep=N` fixes when it is tp times any
    divisor of dp (with CP: of cp*dp, the ranks an EP group folds over). `stages_in_node`:
    a replica's pipeline stages share its node (vLLM's rank order: expert_parallel_degrees)."""
    ranks = layout.cp * layout.dp
    if wanted_ep is None:
        return expert_parallel_degrees(layout.tp, ranks, gpus_per_node, max_ep, widest,
                                       layout.pp if stages_in_node else 1)
    fits = wanted_ep > 1 and wanted_ep % layout.tp == 0 and ranks % (wanted_ep // layout.tp) == 0
    return [wanted_ep] if fits else []


def check_fixed_degrees(model: ModelSpec, wanted: LayoutFilter) -> None:
    """A degree --layout fixes that the model itself rules out is a usage error (exit 2),
    not a table of rejections: tp must split the heads, pp cannot exceed the layers."""
    if wanted.tp is not None:
        for reason in tp_head_reasons(model, wanted.tp):
            raise SpecError(f"--layout: tp={wanted.tp}: {reason} ({model.name})")
    if wanted.pp is not None and wanted.pp > model.num_hidden_layers:
        raise SpecError(f"--layout: pp={wanted.pp} exceeds the {model.num_hidden_layers} layers of {model.name}")
    if wanted.ep is not None and model.is_moe and wanted.ep > model.num_local_experts:
        # ranks without an expert: Megatron needs E divisible by ep; vLLM's expert map would
        # leave GPUs holding none of the routed experts (the searched degrees stop at E)
        raise SpecError(f"--layout: ep={wanted.ep} exceeds the {model.num_local_experts} routed experts of "
                        f"{model.name}")


def run_search(model: ModelSpec, cluster: ClusterSpec, request: R, num_gpus: int, wanted: LayoutFilter,
           evaluate_layout: Callable[[Layout], LayoutResult[E]],
           rank: Callable[[list[E]], list[E]],
           cp_degrees: Callable[[Layout], list[int]] | None = None, leave_idle: bool = False,
           parallel: bool = False, widest_ep: bool = False,
           evaluate_all: Callable[[list[Layout]], Iterable[LayoutResult[E]]] | None = None) -> Plan[E, R]:
    """Evaluate every candidate layout, tally the rejections, rank what runs (`cp_degrees`:
    training's context-parallel degrees, `leave_idle` serving's layouts that leave GPUs idle,
    `widest_ep` training's widest EP group: candidate_layouts). `parallel`: with PARALLEL_MIN_LAYOUTS candidates or more, the layouts
    are evaluated on every usable core (parallel.map_in_workers; each worker with its own
    copy of what evaluate_layout remembers), their results taken in the candidates' order,
    so the plan is the one a single core gives. `evaluate_all`: evaluates the candidates instead
    (training's bounded search), results in the candidates' order."""
    if wanted.ep is not None and wanted.ep > 1 and not model.is_moe:
        raise SpecError(f"--layout: ep={wanted.ep}: {model.name} has no experts (expert parallelism is for MoE models)")
    candidates = candidate_layouts(num_gpus, wanted, *expert_search(model, cluster), cp_degrees, leave_idle,
                                   widest_ep)
    check_fixed_degrees(model, wanted)
    feasible: list[E] = []
    rejected: list[Rejected] = []
    evaluated = bounded = 0
    if evaluate_all is not None:
        results = evaluate_all(candidates)
    elif parallel and len(candidates) >= PARALLEL_MIN_LAYOUTS:
        results = map_in_workers(evaluate_layout, candidates)
    else:
        results = map(evaluate_layout, candidates)
    for result in map(lambda r: LayoutResult(*r), results):
        evaluated += result.num_configs
        bounded += result.num_bounded
        feasible.extend(result.found)
        if result.rejected is not None:
            rejected.append(result.rejected)
    rejected.sort(key=lambda r: (r.layout.tp, r.layout.pp, r.layout.dp, r.layout.ep, r.layout.cp))
    return Plan(model, cluster, request, num_gpus, tuple(rank(feasible)), tuple(rejected), evaluated,
                num_configs_bounded=bounded)
