"""Serving search: enumerate every TP x PP x DP split, estimate, rank, explain.

Ranking keys are explicit and deterministic. When nothing fits, the planner
re-runs itself on changed inputs (fp8 / int4 weights, fp8 KV cache, a shorter
max-model-len, more GPUs) and reports only the changes that actually make a
layout feasible.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.catalog import cluster_from_shorthand
from planner.cost import efficiency as eff
from planner.cost.moe import deepep_serving_refusal
from planner.cost.serving_memory import max_model_len_of, max_num_batched_tokens
from planner.cost.serving_time import MOE_WEIGHT_FORMATS, expert_weight_format, int4_marlin_experts
from planner.engines import EngineVersions, arch_words, runs_kernels_for
from planner.errors import SpecError
from planner.layout import Layout, Rejected
from planner.memo import Memo
from planner.requests import (
    ALL2ALL_BACKENDS,
    DEFAULT_ALL2ALL_BACKEND,
    MOE_BACKENDS,
    ServeRequest,
    for_checkpoint,
    for_vllm_release,
)
from planner.search import (
    LayoutResult,
    Plan,
    candidate_layouts,
    expert_search,
    non_dominated,
    run_search,
)
from planner.serve import (
    LONE_TTFT_FLOOR_MARGIN,
    LayoutBounds,
    ServeEstimate,
    estimate,
    lone_ttft_floor,
    prompt_bound_tokens_per_second,
    serving_bounds,
)
from planner.specs import MAX_NUM_GPUS, ClusterSpec, ModelSpec
from planner.units import (
    BYTES_PER_GIB,
    BYTES_PER_MIB,
    ceil_ms,
    ms_to_seconds,
    plural,
    seconds_to_ms,
)

ServePlan = Plan[ServeEstimate, ServeRequest]


NEAR_TIE_FRACTION = 0.03
"""Layouts within 3% of the best on the objective are a tie: the cost model is not more
precise than that, so among them the one better on the other axis (TPOT for throughput,
throughput for latency) is ranked first. A demanding user would not trade 30% worse
latency for 0.3% more tokens/s."""


def beats_beyond_a_tie(challenger: float, incumbent: float) -> bool:
    """challenger > incumbent by more than NEAR_TIE_FRACTION: what a disaggregated deployment
    must serve per GPU over the aggregated layout to be preferred (the simpler one keeps ties)."""
    return challenger > incumbent * (1 + NEAR_TIE_FRACTION)


TIE_LATENCY_FACTOR = 1.5
"""Where a disaggregated deployment and the aggregated layout serve the same output tok/s per
GPU (within NEAR_TIE_FRACTION), the disaggregated one is preferred only if the aggregated
layout's mean E2E latency is at least this many times its own: equal throughput at a much
shorter request is worth a proxy and a KV transfer, a few per cent is not (the serving search
breaks its own ties on the other axis likewise). A policy, not a fit."""


def disaggregated_preferred(disaggregated_per_gpu: float, aggregated_per_gpu: float,
                            disaggregated_e2e_seconds: float, aggregated_e2e_seconds: float) -> bool:
    """Without a sent rate: the disaggregated deployment beats the aggregated layout beyond a tie
    on goodput per GPU, or ties it (within NEAR_TIE_FRACTION) at an E2E TIE_LATENCY_FACTOR times
    shorter (disagg_cli.compare and the frontier's points decide alike)."""
    if beats_beyond_a_tie(disaggregated_per_gpu, aggregated_per_gpu):
        return True
    return (disaggregated_per_gpu >= aggregated_per_gpu * (1 - NEAR_TIE_FRACTION)
            and aggregated_e2e_seconds >= TIE_LATENCY_FACTOR * disaggregated_e2e_seconds)


def rank_key(result: ServeEstimate, objective: str) -> tuple:
    layout = result.layout
    tie = (layout.tp, layout.pp, layout.dp)
    if objective == "latency":
        return (result.tpot_seconds, result.ttft_seconds, -result.throughput_tokens_per_second, tie)
    return (-result.throughput_tokens_per_second, result.tpot_seconds, tie)


def rank(results: list[ServeEstimate], objective: str) -> list[ServeEstimate]:
    """Best first: the near-tie band around the best on the objective, ordered by the other
    axis where its best there beats the objective's best by more than the tie (else the
    objective's best leads and the rest of the band follows in that order), then everything
    else by the objective (rank_key). Under a finite --request-rate the
    layouts that keep up with it come first, then the others (overloaded, whose queue grows however
    close they come, or held below it by --max-concurrency); those that keep up serve the same tokens/s, so for throughput they are
    ordered by mean E2E latency (TTFT + (O - 1) TPOT: the trade of the two at this workload)."""
    keeping = [r for r in results if r.offered_rate_per_s is not None]
    if 0 < len(keeping) < len(results):
        return rank(keeping, objective) + rank([r for r in results if r.offered_rate_per_s is None], objective)
    if objective == "throughput" and results and all(r.offered_rate_per_s is not None for r in results):
        # the same tokens/s from each: the workload's mean E2E latency decides
        return sorted(results, key=lambda r: (r.request_latency_seconds, *rank_key(r, "latency")))
    ordered = sorted(results, key=lambda r: rank_key(r, objective))
    if not ordered:
        return ordered
    best = ordered[0]
    if objective == "latency":
        band = [r for r in ordered if r.tpot_seconds <= best.tpot_seconds * (1 + NEAR_TIE_FRACTION)]
        band.sort(key=lambda r: rank_key(r, "throughput"))
        # the band's best on the other axis leads only where it is better by more than the tie
        gains = band[0].throughput_tokens_per_second > best.throughput_tokens_per_second * (1 + NEAR_TIE_FRACTION)
    else:
        floor = best.throughput_tokens_per_second * (1 - NEAR_TIE_FRACTION)
        band = [r for r in ordered if r.throughput_tokens_per_second >= floor]
        band.sort(key=lambda r: rank_key(r, "latency"))
        gains = band[0].tpot_seconds < best.tpot_seconds * (1 - NEAR_TIE_FRACTION)
    if not gains:
        # nothing in the band is better on the other axis by more than the tie: the objective's
        # best stays first (DeepSeek-V3 on 16x8 B200 had traded 3% of tokens/s and 69 ms of TTFT
        # for a TPOT 0.01 ms lower, both at the --max-tpot-ms limit; found by a CLI sweep)
        band = [best] + [r for r in band if r is not best]
    chosen = {r.layout for r in band}
    return band + [r for r in ordered if r.layout not in chosen]


def pareto_front(results: list[ServeEstimate]) -> frozenset[Layout]:
    """Non-dominated in (lower TPOT, higher throughput)."""
    return frozenset(r.layout for r in non_dominated(results, lambda r: (-r.tpot_seconds,
                                                                         r.throughput_tokens_per_second)))


def check_request(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest) -> None:
    max_len = max_model_len_of(model, request)
    if request.max_model_len and request.max_model_len > model.max_position_embeddings:
        raise SpecError(
            f"--max-model-len: {request.max_model_len:,} exceeds the model's "
            f"max_position_embeddings {model.max_position_embeddings:,}"
        )
    lines = request.dataset_line_numbers or range(1, len(request.dataset_lengths) + 1)
    for line, (input_len, output_len) in zip(lines, request.dataset_lengths, strict=True):
        if input_len + output_len > max_len:  # vLLM refuses such a request (HTTP 400)
            raise SpecError(
                f"{request.dataset}: line {line}: input {input_len:,} + output {output_len:,} tokens exceed the "
                f"max model length {max_len:,}"
            )
    if request.random_range_ratio is not None:
        longest = sum(math.ceil(length * (1 + request.random_range_ratio))
                      for length in (request.input_len, request.output_len))
        if longest > max_len:  # vllm bench serve would draw requests vLLM refuses
            raise SpecError(
                f"--random-range-ratio {request.random_range_ratio:g}: draws requests of up to {longest:,} tokens "
                f"(input and output up to {1 + request.random_range_ratio:g} x their means), above the max model "
                f"length {max_len:,}"
            )
    if request.input_len + request.output_len > max_len:
        raise SpecError(
            f"--input-len + --output-len: {request.input_len + request.output_len:,} tokens exceed "
            f"the max model length {max_len:,}"
        )
    refusal = v0_model_refusal(model, request)
    if refusal is not None:
        raise SpecError(refusal)
    release, capability = request.engine_versions.vllm_release, cluster.gpu.compute_capability
    if capability is not None and not runs_kernels_for(release.kernel_archs, capability):
        raise SpecError(f"--engine-version vllm={release.version}: its wheel's CUDA kernels are built for "
                        f"compute capability {arch_words(release.kernel_archs)}, and the {cluster.gpu.name} is "
                        f"{capability:.1f} (no kernel image runs there); plan for a release that has it, e.g. "
                        f"--engine-version vllm={EngineVersions().vllm}")
    startup = utilization_refusal(cluster, request)
    if startup is not None:
        raise SpecError(startup)
    check_moe_backend(model, cluster, request.moe_backend)
    if request.all2all_backend != DEFAULT_ALL2ALL_BACKEND and not model.is_moe:
        raise SpecError(f"--all2all-backend {request.all2all_backend}: {model.name} has no routed experts "
                        f"(the all-to-all carries tokens to experts)")
    if request.enable_dbo and not model.is_moe:
        raise SpecError(f"--enable-dbo: {model.name} has no routed experts (dual-batch overlap hides the "
                        f"expert-parallel exchange)")
    if request.all2all_backend != DEFAULT_ALL2ALL_BACKEND and (
            refusal := deepep_serving_refusal(cluster, request.all2all_backend)):
        raise SpecError(f"--all2all-backend {request.all2all_backend}: {refusal}")
    if request.enable_dbo and request.all2all_backend == DEFAULT_ALL2ALL_BACKEND:
        raise SpecError("--enable-dbo: vLLM micro-batches only over DeepEP (or NIXL EP) on CUDA and refuses "
                        "allgather_reducescatter (vllm/config/vllm.py at 0.33.0); add --all2all-backend "
                        "deepep_low_latency or deepep_high_throughput")


def utilization_refusal(cluster: ClusterSpec, request: ServeRequest) -> str | None:
    """Why vLLM's V1 engine would refuse --gpu-memory-utilization at startup (None: it starts).
    Each worker snapshots the free memory once its CUDA context (and communicators) exist and
    raises when that is below utilization x total (request_memory in vllm/v1/worker/utils.py at
    0.22.0 and 0.33.0; gpu_worker.py at 0.10.2): the context alone (CUDA_CONTEXT_BYTES) is
    never free, so a fraction above 1 - context / total cannot start. V0 (0.6.6.post1) has no
    such check, and SGLang's --mem-fraction-static is its own (emit/sglang.py)."""
    if request.pool_engine != "vllm" or not request.engine_versions.vllm_release.v1_engine:
        return None
    total = cluster.gpu.cuda_visible_memory_bytes
    free = total - eff.CUDA_CONTEXT_BYTES
    if request.gpu_memory_utilization * total <= free:
        return None
    return (f"--gpu-memory-utilization {request.gpu_memory_utilization:g}: asks for "
            f"{request.gpu_memory_utilization * total / BYTES_PER_GIB:.2f} GiB of the {cluster.gpu.name}'s "
            f"{total / BYTES_PER_GIB:.2f} GiB, but its CUDA context holds about "
            f"{eff.CUDA_CONTEXT_BYTES / BYTES_PER_MIB:.0f} MiB before vLLM "
            f"{request.engine_versions.vllm_release.version} checks the free memory, and the engine refuses "
            f"to start below the fraction asked for; at most {math.floor(free / total * 100) / 100:.2f}")


V0_QUANTIZATIONS = (None, "fp8", "int8", "int4")
"""Weight formats the V0 engine (0.6.6.post1) loads: 16-bit, fp8 checkpoints and on-the-fly
fp8, AWQ/GPTQ int4 and int8 (vllm/model_executor/layers/quantization/__init__.py
QUANTIZATION_METHODS there has no mxfp4 and no NVFP4 ModelOpt checkpoints)."""


def v0_model_refusal(model: ModelSpec, request: ServeRequest) -> str | None:
    """Why the V0 engine (`--engine-version vllm=0.6.6.post1`) cannot serve this model as the
    planner would price it (None: it can), from that release's own source: no multi-head latent
    attention (its DeepSeek-V2/V3 ran MLA as full multi-head attention and cached the
    decompressed heads: vllm/attention/backends/mla was added in 0.7.1), no hybrid recurrent
    layers, no second attention shape, no vision-language wrapper, none of the 4-bit float weight
    formats (V0_QUANTIZATIONS), no per-head query/key norm (Qwen3's: qk_norm), no norm over every
    head (MiniMax-M2's: qk_norm_across_heads), no chunked local attention (Llama 4's) --
    vllm/model_executor/models/registry.py at 0.6.6.post1 lists none of those families (gpt-oss's MXFP4 weights are refused above). Planning these for V0 would price a KV cache
    and kernels that release does not have. The specs name no architecture, so a model that the
    registry lacks but that shares its fields with one it has is not caught."""
    release = request.engine_versions.vllm_release
    if release.v1_engine:
        return None
    lacks = []
    if model.is_mla:
        lacks.append("multi-head latent attention (it caches the decompressed heads)")
    if model.index_n_heads:
        lacks.append("sparse attention's indexer")
    if model.num_recurrent_layers:
        lacks.append(f"{model.recurrent_kind} recurrent layers")
    if model.global_head_dim is not None or model.attention_k_eq_v:
        lacks.append("two attention shapes")
    if model.text_model_of is not None:
        lacks.append(f"{model.text_model_of}'s vision-language wrapper")
    if model.qk_norm:
        lacks.append("per-head query/key RMSNorm (Qwen3's and later families'; no Qwen3ForCausalLM or "
                     "Qwen3MoeForCausalLM in its model registry)")
    if model.attention_chunk_size:
        lacks.append("chunked local attention (Llama 4's; no Llama4ForConditionalGeneration in its model registry)")
    if model.qk_norm_across_heads:
        lacks.append("query/key RMSNorm over every head (MiniMax-M2's; no MiniMaxM2ForCausalLM in its model registry)")
    if model.quantization not in V0_QUANTIZATIONS:
        lacks.append(f"{model.quantization} weights")
    if not lacks:
        return None
    return (f"--engine-version vllm={release.version}: the V0 engine has no {' and no '.join(lacks)}, which "
            f"{model.name} needs; plan it for vllm=0.22.0 or later")


def check_moe_backend(model: ModelSpec, cluster: ClusterSpec, backend: str) -> None:
    """A non-default --moe-backend needs routed experts and the GPU's measured kernel for their
    format under it (ServingMoeKernels.kernel): without one the planner cannot price it."""
    if backend == "auto":
        return
    if not model.is_moe:
        raise SpecError(f"--moe-backend {backend}: {model.name} has no routed experts")
    weight_format = expert_weight_format(model)
    kernels = cluster.gpu.serving_moe_kernels
    if model.quantization == "int4":  # vLLM runs INT4 experts on Marlin by default (int4_marlin_experts)
        if backend == "marlin" and int4_marlin_experts(model, cluster) and kernels.marlin_mxfp4 is not None:
            return
        raise SpecError(f"--moe-backend {backend}: INT4 experts are planned on Marlin, vLLM's default for them"
                        + ("" if kernels.marlin_mxfp4 is not None else
                           f" (not measured on {cluster.gpu.name}: priced as dense GEMMs)")
                        + "; another backend is not planned")
    if weight_format is None or kernels.kernel(weight_format, backend) is None:
        measured = [name for name in MOE_WEIGHT_FORMATS if kernels.kernel(name, backend) is not None]
        raise SpecError(f"--moe-backend {backend}: no measured {backend} MoE kernel for "
                        f"{weight_format or model.quantization} experts on {cluster.gpu.name} "
                        f"(measured there: {', '.join(measured) or 'none'})")


def evaluate(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, memo: Memo | None = None,
             keep_top: int | None = None, counts: Callable[[ServeEstimate], bool] | None = None,
             always: frozenset[Layout] = frozenset(), summary: bool = True) -> ServePlan:
    """Every layout estimated (rejected with reasons, including an SLA no concurrency meets), ranked.
    `memo`: shared with other searches that differ only in the SLA limits (serve.estimate).
    `keep_top`: only the best this many layouts are wanted (the table's rows, a --top), of
    those `counts` keeps (default all: the launch's refusals drop the others afterwards); the
    rest may be bounded out (bounded_evaluation), except the layouts in `always` (plan
    explain's re-plans read the explained layout's figures); `summary`: the plan's summary is
    shown, so the figures it names beyond the rows are kept exact.
    The request as the vLLM release can serve it (for_vllm_release: V0 plans ep = 1) and with the
    checkpoint's own KV cache format where the engine takes it (for_checkpoint)."""
    request = for_checkpoint(model, for_vllm_release(request))
    check_request(model, cluster, request)
    memo = memo if memo is not None else Memo()

    def evaluate_layout(layout: Layout) -> LayoutResult[ServeEstimate]:
        result = estimate(model, cluster, layout, request, memo)
        if isinstance(result, Rejected):
            return [], result, 1
        return [result], None, 1

    bounded = None
    if keep_top is not None and request.offered_rate_per_s is None:
        bounded = bounded_evaluation(model, cluster, request, memo, evaluate_layout, keep_top,
                                     counts or (lambda e: True), always, summary)
    elif keep_top is not None and not summary:  # at a rate, the summary counts every layout that keeps up
        bounded = bounded_at_rate(model, cluster, request, memo, evaluate_layout, keep_top,
                                  counts or (lambda e: True), always)
    num_gpus = request.num_gpus or cluster.num_gpus
    plan = run_search(model, cluster, request, num_gpus, request.layout, evaluate_layout,
                      lambda found: rank(found, request.objective), leave_idle=True, evaluate_all=bounded)
    if plan.num_configs_bounded:
        plan = replace(plan, bounded_below_row=keep_top)
    # at a rate, a layout that cannot keep up is no trade-off worth naming beside those that do
    keeping = [r for r in plan.layouts if not r.overloaded]
    return replace(plan, pareto=pareto_front(keeping or list(plan.layouts)))


BOUNDED_MIN_LAYOUTS = 32
"""The fewest candidate layouts bounded_evaluation bounds (fewer: every one is estimated, the
bounds would cost about what they save: a node has 5-30; 4 nodes 40-60, where bounding saves
10-15%; 16,384 GPUs 120-273)."""


def bounded_evaluation(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, memo: Memo,
                       evaluate_layout: Callable[[Layout], LayoutResult[ServeEstimate]], keep_top: int,
                       counts: Callable[[ServeEstimate], bool], always: frozenset[Layout] = frozenset(),
                       summary: bool = True) -> Callable[[list[Layout]], list[LayoutResult[ServeEstimate]]]:
    """run_search's evaluate_all for a plan that shows only its best `keep_top` layouts and its
    summary (no offered rate: rank orders by the objective alone). Each layout's bounds
    (serve.serving_bounds: what its tokens/s cannot exceed, its TPOT go below; its rejection for
    structure or memory, found the same way) come first; the layouts are then estimated from
    the most promising on the objective, and one is skipped (counted as bounded) where its bound
    cannot reach the rows: for throughput, below T = min(the keep_top-th best tokens/s, the
    best's less NEAR_TIE_FRACTION) among the estimates `counts` keeps; for latency, TPOT above
    max(the keep_top-th lowest, the lowest's plus NEAR_TIE_FRACTION). A skipped layout would
    rank below every row (rank: the near-tie band, then the objective), and it beats none of
    them on that axis, so the rows and their pareto marks are the plain search's. On tokens/s the
    layouts go best first: one whose first bound reaches the rows also gets the prompts' bound
    (serve.prompt_bound_tokens_per_second, a round and a step more) and goes back in line by the
    smaller. The summary's other figures are also kept exact: the layout with the most tokens/s
    (latency objective) and the lowest one-sequence TPOT (both) are estimated wherever a bound
    could beat the best found (unless `summary` is False: no summary is shown). The layouts in
    `always` are estimated whatever their bounds. Below BOUNDED_MIN_LAYOUTS candidates every
    layout is estimated."""
    def evaluate_all(candidates: list[Layout]) -> list[LayoutResult[ServeEstimate]]:
        if len(candidates) < BOUNDED_MIN_LAYOUTS:
            return [LayoutResult(*evaluate_layout(layout)) for layout in candidates]
        bounds = [serving_bounds(model, cluster, layout, request, memo) for layout in candidates]
        results: dict[int, LayoutResult[ServeEstimate]] = {
            i: LayoutResult([], bound, 1) for i, bound in enumerate(bounds) if isinstance(bound, Rejected)}
        kept: list[ServeEstimate] = []

        def run(i: int) -> None:
            results[i] = LayoutResult(*evaluate_layout(candidates[i]))
            kept.extend(e for e in results[i].found if counts(e))

        def reaches_rows(bound: LayoutBounds) -> bool:
            if len(kept) < keep_top:
                return True
            if request.objective == "latency":
                tpots = sorted(e.tpot_seconds for e in kept)
                return bound.min_tpot_seconds <= max(tpots[keep_top - 1], tpots[0] * (1 + NEAR_TIE_FRACTION))
            rates = sorted((e.throughput_tokens_per_second for e in kept), reverse=True)
            return bound.max_tokens_per_second >= min(rates[keep_top - 1], rates[0] * (1 - NEAR_TIE_FRACTION))

        def most_rate(bound: LayoutBounds) -> bool:
            return not kept or bound.max_tokens_per_second >= max(e.throughput_tokens_per_second for e in kept)

        def least_tpot1(bound: LayoutBounds) -> bool:
            return not kept or bound.min_tpot_seconds <= min(e.tpot_batch1_seconds for e in kept)

        priced = [i for i in range(len(candidates)) if i not in results]
        for i in priced:
            if candidates[i] in always:
                run(i)
        tightened: dict[int, LayoutBounds] = {}

        def by_rate(wanted: Callable[[LayoutBounds], bool]) -> None:
            """Best first on tokens/s: a layout whose first bound passes gets the prompts' bound
            too (prompt_bound_tokens_per_second, priced once) and goes back in line by the
            smaller; it is estimated when it comes first again and still passes."""
            line = [(-bounds[i].max_tokens_per_second, i) for i in priced]
            heapq.heapify(line)
            while line:
                _, i = heapq.heappop(line)
                if i in results or not wanted(tightened.get(i, bounds[i])):
                    continue
                if i in tightened:
                    run(i)
                    continue
                prompts = prompt_bound_tokens_per_second(model, cluster, candidates[i], request, memo)
                tightened[i] = replace(bounds[i], max_tokens_per_second=min(bounds[i].max_tokens_per_second, prompts))
                heapq.heappush(line, (-tightened[i].max_tokens_per_second, i))

        def by_tpot(wanted: Callable[[LayoutBounds], bool]) -> None:
            for i in sorted(priced, key=lambda i: bounds[i].min_tpot_seconds):
                if i not in results and wanted(bounds[i]):
                    run(i)

        (by_tpot if request.objective == "latency" else by_rate)(reaches_rows)
        if summary:
            by_tpot(least_tpot1)
            if request.objective == "latency":
                by_rate(most_rate)
        return [results.get(i, LayoutResult([], None, 1, 1)) for i in range(len(candidates))]

    return evaluate_all


def bounded_at_rate(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, memo: Memo,
                    evaluate_layout: Callable[[Layout], LayoutResult[ServeEstimate]], keep_top: int,
                    counts: Callable[[ServeEstimate], bool],
                    always: frozenset[Layout] = frozenset()) -> Callable[[list[Layout]], list[LayoutResult[ServeEstimate]]]:
    """bounded_evaluation at a finite --request-rate, for a search with no summary (plan
    explain's re-plans: each had solved every layout's open loop, some 100 on Qwen3-235B fp8 over
    16x8 H100, 25 s of explain). rank puts the layouts that keep up first, ordered by mean E2E
    (throughput) or as the latency objective orders them (TPOT first), then the rest. A layout's
    bounds (serving_bounds, at its capacity: they hold at any load) say: one whose tokens/s bound
    is below the rate's O R tokens/s cannot keep up, and ranks below `keep_top` layouts that do;
    every output token after the first takes at least a lone round, so E2E >= (O - 1) x its TPOT
    bound, and TPOT >= that bound; one whose E2E bound (throughput) or TPOT bound (latency, with
    the near-tie band rank draws) is past the keep_top-th of those that keep up is no row either.
    Estimated in order of the TPOT bound (both bounds grow with it); `always` whatever their
    bounds. Below BOUNDED_MIN_LAYOUTS candidates every layout is estimated."""
    # the engine's cap at a rate (wanted_batch: the latency objective's one sequence is for no rate)
    capacity_request = replace(request, request_rate_per_s=None, objective="throughput")
    wanted_tokens_per_s = request.offered_rate_per_s * request.output_len

    def evaluate_all(candidates: list[Layout]) -> list[LayoutResult[ServeEstimate]]:
        if len(candidates) < BOUNDED_MIN_LAYOUTS:
            return [LayoutResult(*evaluate_layout(layout)) for layout in candidates]
        # a memo of their own: the search's is keyed for its request, the rate's (an estimate at
        # a rate read the capacity's entries: Qwen3-30B-A3B at 100 req/s priced one sequence)
        bounds_memo = Memo()
        bounds = [serving_bounds(model, cluster, layout, capacity_request, bounds_memo) for layout in candidates]
        results: dict[int, LayoutResult[ServeEstimate]] = {}
        keeping: list[ServeEstimate] = []

        def run(i: int) -> None:
            results[i] = LayoutResult(*evaluate_layout(candidates[i]))
            keeping.extend(e for e in results[i].found if counts(e) and e.offered_rate_per_s is not None)

        def reaches_rows(bound: LayoutBounds) -> bool:
            if len(keeping) < keep_top:
                return True
            if bound.max_tokens_per_second < wanted_tokens_per_s:
                return False
            if request.objective == "latency":
                tpots = sorted(e.tpot_seconds for e in keeping)
                return bound.min_tpot_seconds <= max(tpots[keep_top - 1], tpots[0] * (1 + NEAR_TIE_FRACTION))
            latencies = sorted(e.request_latency_seconds for e in keeping)
            return (request.output_len - 1) * bound.min_tpot_seconds <= latencies[keep_top - 1]

        # a layout rejected for its structure or memory is priced as the plain search prices it
        # (estimate's own reason, also at a rate)
        priced = sorted((i for i, bound in enumerate(bounds) if not isinstance(bound, Rejected)),
                        key=lambda i: bounds[i].min_tpot_seconds)
        for i, bound in enumerate(bounds):
            if isinstance(bound, Rejected) or candidates[i] in always:
                run(i)
        for i in priced:
            if i not in results and reaches_rows(bounds[i]):
                run(i)
        return [results.get(i, LayoutResult([], None, 1, 1)) for i in range(len(candidates))]

    return evaluate_all


def plan_serving(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, memo: Memo | None = None,
                 keep_top: int | None = None, counts: Callable[[ServeEstimate], bool] | None = None) -> ServePlan:
    """The plan and, where a layout fits, the recommended layout's alternatives (MoE and
    all-to-all backends, speculative decoding); else what would fit. `keep_top`, `counts`: evaluate's."""
    plan = evaluate(model, cluster, request, memo, keep_top, counts)
    if plan.layouts:
        best = plan.layouts[0]
        return replace(plan, moe_backend_options=moe_backend_options(model, cluster, request, best),
                       all2all_backend_options=all2all_backend_options(model, cluster, request, best),
                       token_budget_options=token_budget_options(model, cluster, request, best),
                       speculation_options=speculation_options(model, cluster, request, best),
                       speculation_break_even=speculation_break_even(model, cluster, request, best))
    return replace(plan, suggestions=tuple(suggest(model, cluster, request)))


DBO_ON, DBO_OFF = "--enable-dbo", "without --enable-dbo"
"""all2all_backend_options' values for the recommended layout with dual-batch overlap toggled."""


@dataclass(frozen=True)
class BackendOption:
    """The recommended layout re-estimated with one engine choice changed: `value` for the
    request's --moe-backend (moe_backend_options) or --all2all-backend (all2all_backend_options)."""

    value: str
    estimate: ServeEstimate | Rejected
    """Rejected only among speculation_options (the layout misses the SLA without the drafts)."""


def moe_backend_options(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
                        best: ServeEstimate) -> tuple[BackendOption, ...]:
    """For a mixture of experts: the recommended layout under every other --moe-backend whose
    kernel the GPU has measured for the experts' format (check_moe_backend), so that the plan
    can say what choosing it would change (the choice stays the user's: marlin trades prompt
    speed for nothing at decode, flashinfer_mxfp8 quantizes the experts' inputs)."""
    if not model.is_moe or not request.engine_versions.vllm_release.v1_engine:  # V0: no --moe-backend
        return ()
    if int4_marlin_experts(model, cluster):  # INT4: marlin is the default kernel, no other is planned
        return ()
    options = []
    for backend in MOE_BACKENDS:
        if backend == request.moe_backend:
            continue
        try:
            check_moe_backend(model, cluster, backend)
        except SpecError:
            continue
        result = estimate(model, cluster, best.layout, replace(request, moe_backend=backend))
        if isinstance(result, ServeEstimate):
            options.append(BackendOption(backend, result))
    return tuple(options)


def all2all_backend_options(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
                            best: ServeEstimate) -> tuple[BackendOption, ...]:
    """When the recommended layout's EP group spans DP ranks (it exchanges tokens): the layout
    under each other --all2all-backend and, on DeepEP, with --enable-dbo toggled (DBO_ON / DBO_OFF),
    so that the plan can say what DeepEP, dual-batch overlap (or the defaults) would change;
    the choice stays the user's (DeepEP is installed apart from the engine)."""
    layout = best.layout
    if not model.is_moe or layout.ep <= 1 or layout.dp_per_ep_group <= 1:
        return ()
    options = []
    for backend in ALL2ALL_BACKENDS:
        if backend == request.all2all_backend or (backend != DEFAULT_ALL2ALL_BACKEND
                                                  and deepep_serving_refusal(cluster, backend) is not None):
            continue
        result = estimate(model, cluster, layout, replace(request, all2all_backend=backend))
        if isinstance(result, ServeEstimate):
            options.append(BackendOption(backend, result))
    if request.all2all_backend != DEFAULT_ALL2ALL_BACKEND:  # vLLM micro-batches over DeepEP only
        toggled = estimate(model, cluster, layout, replace(request, enable_dbo=not request.enable_dbo))
        if isinstance(toggled, ServeEstimate):
            options.append(BackendOption(DBO_OFF if request.enable_dbo else DBO_ON, toggled))
    return tuple(options)


TOKEN_BUDGET_CHOICES = (256, 512, 1024, 2048, 4096, 8192, 16384)
"""The --max-num-batched-tokens token_budget_options tries: powers of two around vLLM's defaults
(2,048 on the A100 and smaller GPUs, 8,192 on H100-class ones, 256 under DeepEP's low-latency
kernels)."""


def token_budget_options(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
                         best: ServeEstimate) -> tuple[BackendOption, ...]:
    """Where the recommended layout has pipeline stages and the load is a closed loop (no
    --request-rate; not the latency objective's lone sequence): the layout at each other token
    budget of TOKEN_BUDGET_CHOICES, each at the concurrency it then allows. A step that carries a
    prompt chunk is longer at every stage, and the micro-batches behind it cannot pass it there
    (each stage takes vLLM's steps in order), so the budget that sizes the chunks sets the
    pipeline's bubble (docs/cost-model.md, Serving: pipeline): Llama-3.1-70B tp=1 pp=4 on H100
    at 390 sequences per replica, 1,024/256 tokens, priced 5,600 tok/s at 2,048 (bubble 55%) and
    11,555 at 512 (11%), dp = 4; the step simulation of 6,000 requests of lengths spread +/-50%
    over the same 4 replicas, 6,435 and 9,897. The choice stays the user's: smaller chunks also
    lengthen a prompt's own prefill (TTFT)."""
    if best.layout.pp <= 1 or request.objective == "latency" or request.offered_rate_per_s is not None:
        return ()
    current = max_num_batched_tokens(cluster, request, best.layout, model)
    options = []
    for budget in TOKEN_BUDGET_CHOICES:
        if budget == current:
            continue
        result = estimate(model, cluster, best.layout, replace(request, max_num_batched_tokens=budget))
        if isinstance(result, ServeEstimate):
            options.append(BackendOption(str(budget), result))
    return tuple(options)


SPECULATION_OFF = "without speculative decoding"
"""speculation_options' value: the recommended layout re-estimated with it off."""
SPECULATION_OFF_BEST = "without speculative decoding, the best layout"
"""speculation_options' value: the plan's recommendation without it, where that is another layout."""


def speculation_options(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
                        best: ServeEstimate) -> tuple[BackendOption, ...]:
    """With speculative decoding asked for: the recommended layout without it and with each
    shorter draft (k' < k tokens at the first k' acceptance rates; value "k'"), each at its own
    concurrency, as the SLA or the KV cache then allow, so that the plan can say what the drafts
    buy or cost at this load and whether fewer would do better."""
    speculation = request.speculation
    if speculation is None:
        return ()
    variants = [(SPECULATION_OFF, None)] + [
        (str(k), replace(speculation, num_tokens=k, acceptance=speculation.acceptance[:k]))
        for k in range(1, speculation.num_tokens)]
    options = [BackendOption(value, estimate(model, cluster, best.layout, replace(request, speculation=variant)))
               for value, variant in variants]
    # without the drafter's memory and rows the best layout may be another
    plain = evaluate(model, cluster, replace(request, speculation=None)).recommended
    if plain is not None and plain.layout != best.layout:
        options.insert(1, BackendOption(SPECULATION_OFF_BEST, plain))
    return tuple(options)


BREAK_EVEN_BISECTIONS = 8
"""Halvings of the acceptance factor's bracket (to 1/256 of it)."""


def speculation_break_even(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
                           best: ServeEstimate) -> float | None:
    """The factor f on every --draft-acceptance rate (each capped at 1) at which the drafts stop
    paying on the recommended layout: below it the layout without them does better on the plan's
    objective (goodput for throughput, TPOT for latency). None without speculation, or when the
    drafts lose even at full acceptance (f = 1 / the highest rate); 0 when they win even if never
    accepted (they cannot: a rejected draft costs its row)."""
    speculation = request.speculation
    if speculation is None:
        return None
    plain = estimate(model, cluster, best.layout, replace(request, speculation=None))

    def score(result: ServeEstimate | Rejected) -> float:
        if isinstance(result, Rejected):
            return -math.inf
        return -result.tpot_seconds if request.objective == "latency" else result.goodput_tokens_per_second

    baseline = score(plain)

    def wins(factor: float) -> bool:
        rates = tuple(min(1.0, rate * factor) for rate in speculation.acceptance)
        moved = replace(request, speculation=replace(speculation, acceptance=rates))
        return score(estimate(model, cluster, best.layout, moved)) > baseline

    highest = max(speculation.acceptance)
    if highest <= 0:  # no draft is ever accepted: they cannot pay
        return None
    # the given rates (f = 1) decide the side, as the plan's own comparison shows it: the
    # score need not be monotone in f (the chosen concurrency moves between throughput peaks),
    # and a bracket over [0, 1 / highest] could end above 1 while the given rates win
    if wins(1.0):
        if wins(0.0):
            return 0.0
        low, high = 0.0, 1.0
    else:
        high = 1 / highest
        if high <= 1 or not wins(high):
            return None
        low = 1.0
    for _ in range(BREAK_EVEN_BISECTIONS):
        middle = (low + high) / 2
        low, high = (low, middle) if wins(middle) else (middle, high)
    return high


def _feasible(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest) -> ServeEstimate | None:
    """The recommended layout of a re-plan (suggest's), None where nothing fits or meets the SLA.
    Under a TTFT or E2E limit (fixed lengths, no --dataset mix, no rate) a re-plan whose every
    layout's lone_ttft_floor, times LONE_TTFT_FLOOR_MARGIN, stands above it is not run: no concurrency meets a limit a lone
    request misses (the infeasible Qwen3-30B-A3B question, 20,000/16 tokens at --max-ttft-ms 50
    on 8 H100, spent 4 s of 4.6 re-planning nine larger clusters, each layout a steady state)."""
    try:
        resolved = for_checkpoint(model, for_vllm_release(request))
        check_request(model, cluster, resolved)
        limits = [limit for limit in (resolved.max_ttft_seconds, resolved.max_e2e_seconds) if limit is not None]
        # a --dataset mix's pairs are its lengths' mean, above its mean length's, which the lone
        # steady state prices: the floor reached 1.96 times that on pp = 32 (a review), so no skip
        if limits and resolved.offered_rate_per_s is None and not resolved.dataset_lengths and all(
                LONE_TTFT_FLOOR_MARGIN * lone_ttft_floor(model, cluster, layout, resolved) > min(limits)
                for layout in candidate_layouts(resolved.num_gpus or cluster.num_gpus, resolved.layout,
                                                *expert_search(model, cluster), None, True)):
            return None
        return evaluate(model, cluster, request).recommended
    except SpecError:
        return None


def suggest(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest) -> list[str]:
    """What would make a layout feasible, each checked by re-planning: lighter weights,
    an fp8 KV cache, the default token budget where --max-num-batched-tokens raised it, a
    shorter context (with the longest --max-model-len that then fits), the SLA search's own
    concurrency where --batch fixes one that misses the limits, more GPUs, a looser SLA
    (sla_reach)."""
    order = {None: 0, "int8": 1, "fp8": 1, "int4": 2, "nvfp4": 2, "mxfp4": 2}
    options = [
        (f"{quant} weights (--quantization {quant})", model.model_copy(update={"quantization": quant}), request)
        for quant in ("fp8", "int4")
        if order[quant] > order[model.quantization]
    ]
    if request.kv_cache_dtype != "fp8":
        options.append(("an fp8 KV cache (--kv-cache-dtype fp8)", model, replace(request, kv_cache_dtype="fp8")))
    if request.max_num_batched_tokens is not None:  # the step's activations grow with the budget asked
        options.append(("the engine's default token budget (without --max-num-batched-tokens)", model,
                        replace(request, max_num_batched_tokens=None)))
    options.append(("a shorter context", model, request))
    wanted_len = max_model_len_of(model, request)
    out = []
    for label, option_model, option_request in options:
        found = longest_fitting_len(option_model, cluster, option_request)
        if found is None:
            continue
        length, layout = found
        if length >= wanted_len:
            best = _feasible(option_model, cluster, option_request)
            out.append(f"{label}: fits, e.g. {best.layout if best else layout}")
        elif label == "a shorter context":
            out.append(f"--max-model-len {length:,} or less: fits, e.g. {layout}")
        else:
            out.append(f"{label} with --max-model-len {length:,} or less: fits, e.g. {layout}")
    if request.batch is not None and request.has_sla:  # the fixed concurrency may be what misses the SLA
        unfixed = _feasible(model, cluster, replace(request, batch=None))
        if unfixed is not None:
            out.append(f"without --batch (the SLA search picks the concurrency): fits, e.g. {unfixed.layout} at "
                       f"{unfixed.batch:,} concurrent sequence(s) per replica")
    unreachable = below_any_cluster(request)
    more = None if unreachable else more_gpus_needed(model, cluster, request)
    if more is not None:
        out.append(more)
    out.extend(sla_reach(model, cluster, request))
    if unreachable:
        out.append(f"no number of GPUs brings TTFT or E2E latency under {seconds_to_ms(eff.FIRST_TOKEN_SECONDS):g} ms: the "
                   f"first token's fixed client-side cost (HTTP, hand-off, streaming) is priced at that")
    if not out:
        out.append("nothing tried fits: use more or larger GPUs")
    return out


SLA_LIMITS = (("--max-ttft-ms", "max_ttft_seconds", "ttft_seconds", "TTFT"),
              ("--max-tpot-ms", "max_tpot_seconds", "tpot_seconds", "TPOT"),
              ("--max-e2e-ms", "max_e2e_seconds", "request_latency_seconds", "E2E latency"))
"""Each serving SLA: its flag, the ServeRequest field, the ServeEstimate field it bounds, its name."""


def sla_reach(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest) -> list[str]:
    """For each SLA limit no layout can meet even alone: the least it can be on these GPUs,
    the best layout's value at concurrency 1 (every layout re-planned without the limits at
    --batch 1; with --max-concurrency, at its clients' load), rounded up to 0.1 ms, and that layout. Where each limit alone is reachable
    but not all at once: the layout closest to meeting them all (the least worst ratio of value
    to limit) and its values. Empty without limits or where no layout fits memory anyway."""
    set_limits = [(flag, getattr(request, request_field), estimate_field, name)
                  for flag, request_field, estimate_field, name in SLA_LIMITS if getattr(request, request_field) is not None]
    if not set_limits:
        return []
    # fixed clients (--max-concurrency) set the load: fewer running would only queue the rest
    clients = request.max_concurrency is not None
    # a lone request, as the rejections' "at concurrency 1" (at a rate, one slot would queue the
    # arrivals: 1,159.7 ms for the least TTFT where the table's tp=8 showed 717.9 at concurrency
    # 1; found by a CLI sweep)
    # a fixed --batch is the concurrency asked about: the reach at it (at concurrency 1 a limit
    # the --batch still misses was offered; found by a CLI read)
    fixed = request.batch is not None and not clients and request.offered_rate_per_s is None
    # a finite rate without clients sets the load too where a TTFT or E2E limit is set: the
    # reach at it, among the layouts that keep up (behind it a queue grows in both, which then no
    # limit meets: a review found "--max-ttft-ms 20.8 or more ... at concurrency 1" at 200 req/s,
    # where 20.8 found nothing); a TPOT limit alone caps a layout behind the rate, so its reach
    # is a lone request's (at the rate it had named 26.3 ms where 17 fits)
    rated = request.offered_rate_per_s is not None and not clients and bool(request.queue_limit_flags)
    free = replace(request, max_ttft_seconds=None, max_tpot_seconds=None, max_e2e_seconds=None,
                   batch=None if clients else request.batch if fixed or rated else 1,
                   request_rate_per_s=request.request_rate_per_s if clients or rated else None)
    where = (f"with the {request.max_concurrency:,} clients of --max-concurrency" if clients
             else f"at --request-rate {request.offered_rate_per_s:g}/s" if rated
             else f"at --batch {request.batch:,}" if fixed else "at concurrency 1")
    try:
        layouts = evaluate(model, cluster, free).layouts
    except SpecError:
        return []
    if rated:
        layouts = [found for found in layouts if not found.overloaded]
        if not layouts:
            return [f"no layout keeps up with --request-rate {request.offered_rate_per_s:g}/s here, so no "
                    f"{' or '.join(request.queue_limit_flags)} holds at it (its queue grows)"]
    if not layouts:
        return []
    out = []
    relaxed = []  # each limit, raised to the least any layout reaches where none meets it
    for flag, limit_seconds, field, name in set_limits:
        best = min(layouts, key=lambda found: getattr(found, field))
        reach_seconds = getattr(best, field)
        if reach_seconds > limit_seconds:
            out.append(f"{flag} {ceil_ms(reach_seconds):g} or more: the lowest {name} any layout reaches here, "
                       f"{best.layout} {where}")
            limit_seconds = ms_to_seconds(ceil_ms(reach_seconds))
        relaxed.append((flag, limit_seconds, field, name))
    if len(set_limits) == 1:
        return out

    def worst_ratio(found: ServeEstimate) -> float:
        """Against the limits, each raised to the least any layout reaches where none meets it."""
        return max(getattr(found, field) / limit_seconds for _, limit_seconds, field, _ in relaxed)

    closest = min(layouts, key=worst_ratio)
    if worst_ratio(closest) <= 1:
        return out
    if out:
        # each raised limit alone is reachable; together with the others they may not be: name
        # the values one layout reaches (following the first line alone failed again on the
        # limit it left out; found by a CLI sweep)
        flags = " and ".join(f"{flag} {ceil_ms(max(limit_seconds, getattr(closest, field))):g}"
                             for flag, limit_seconds, field, _ in set_limits)
        return [*out, f"{flags} together: some layout reaches each limit above, none all of them; "
                      f"{closest.layout} {where} reaches these"]
    flags = " and ".join(flag for flag, _, _, _ in set_limits)
    values = ", ".join(f"{name} {seconds_to_ms(getattr(closest, field)):.1f} ms" for _, _, field, name in set_limits)
    return [f"{flags} together: each alone is reachable, not all at once; the closest, "
            f"{closest.layout}, reaches {values} {where}"]


def longest_fitting_len(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest) -> tuple[int, Layout] | None:
    """The longest max-model-len some layout accepts (the KV cache it holds once one
    in+out request fits), capped at the model's own limit; None if no layout fits at all."""
    num_gpus = request.num_gpus or cluster.num_gpus
    need = request.input_len + request.output_len
    best: tuple[int, Layout] | None = None
    for layout in candidate_layouts(num_gpus, request.layout, *expert_search(model, cluster), leave_idle=True):
        result = estimate(model, cluster, layout, replace(request, max_model_len=need))
        if isinstance(result, ServeEstimate):
            length = min(result.kv_cache_tokens, model.max_position_embeddings)
            if model.num_kv_window_layers:
                length = longest_window_len(model, cluster, layout, request, length)
                if request.pool_engine == "sglang":  # SGLang admits no request past its full layers' pool
                    from planner.emit.sglang import pool_running_sequences

                    length = min(length, int(pool_running_sequences(model, cluster, request, result)[1]) - 1)
            if best is None or length > best[0]:
                best = (length, layout)
    return best


def longest_window_len(model: ModelSpec, cluster: ClusterSpec, layout: Layout, request: ServeRequest,
                       length: int) -> int:
    """With window layers the KV cache's count at max-model-len M grows with M (each request's
    window blocks are a fixed part of it: kv_cache_capacity), so the count at a short M
    understates the longest that fits (Llama 4 Scout on 8 H100: 1,781,026 at 1,280 tokens where
    7.1M fit). From M_0 = the count at the request's own length, M_k+1 = the count at M_k rises
    to the largest M the cache holds (count(M) >= M); a few steps reach it."""
    for _ in range(LONGEST_WINDOW_LEN_STEPS):
        result = estimate(model, cluster, layout, replace(request, max_model_len=length))
        if not isinstance(result, ServeEstimate):
            break
        longer = min(result.kv_cache_tokens, model.max_position_embeddings)
        if longer <= length:
            break
        length = longer
    return length


LONGEST_WINDOW_LEN_STEPS = 8
"""longest_window_len's re-estimates at most (each a layout's whole setup)."""


def below_any_cluster(request: ServeRequest) -> bool:
    """A TTFT or E2E limit under the fixed client-side cost of the first token
    (efficiency.FIRST_TOKEN_SECONDS), which no number of GPUs shortens: more_gpus_needed would
    re-plan up to MAX_CLUSTERS_TRIED clusters to find none (26 s for a 1 ms TTFT on 8 H100)."""
    return any(limit is not None and limit < eff.FIRST_TOKEN_SECONDS
               for limit in (request.max_ttft_seconds, request.max_e2e_seconds))


def more_gpus_needed(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest) -> str | None:
    """The smallest cluster of the same nodes (whole nodes, or more GPUs in one node up to 8)
    on which some layout fits, among the node counts node_counts_to_try gives (every count
    up to 8 more nodes, then steps of a quarter)."""
    gpn = cluster.gpus_per_node
    planned = request.num_gpus or cluster.num_gpus
    if planned < cluster.num_gpus:
        best = _feasible(model, cluster, replace(request, num_gpus=None))
        if best is not None:
            return f"all {cluster.num_gpus} GPUs of the cluster: fits, e.g. {best.layout}"
    if cluster.num_nodes == 1:
        for size in (2, 4, 8):
            if size > max(planned, gpn):
                intra = cluster.intra_node or cluster.gpu.intra_node
                bigger = cluster.model_copy(update={"gpus_per_node": size, "intra_node": intra,
                                                    "name": f"1x{size}x{cluster.gpu.name}"})
                best = _feasible(model, bigger, replace(request, num_gpus=None))
                if best is not None:
                    return f"{plural(size - planned, 'more GPU')} ({size} in one node): fits, e.g. {best.layout}"
                if size == 8 and gpn < size:  # a full node does not hold it: count nodes of 8 from there
                    cluster, gpn = bigger, size
    for num_nodes in node_counts_to_try(math.ceil(planned / gpn), planned, gpn):
        bigger = _scaled(cluster, num_nodes)
        if bigger is None:
            return None
        best = _feasible(model, bigger, replace(request, num_gpus=None))
        if best is not None:
            extra = num_nodes * gpn - planned
            return f"{plural(extra, 'more GPU')} ({num_nodes} nodes of {gpn}): fits, e.g. {best.layout}"
    return None


MAX_CLUSTERS_TRIED = 16
"""Re-plans "more GPUs" may run: the next 8 node counts, then counts growing by a quarter up
to four times the cluster (each re-plan costs a whole search, so trying every count up to
4x took hours on 10**5 nodes)."""
NEXT_NODE_COUNTS = 8
NODE_COUNT_GROWTH = 1.25


def node_counts_to_try(first: int, planned: int, gpus_per_node: int) -> list[int]:
    """Node counts above the planned GPUs, ascending: first+0..7, then x1.25 steps up to
    4*first + 8, never beyond MAX_NUM_GPUS; at most MAX_CLUSTERS_TRIED of them."""
    last = min(4 * first + 8, MAX_NUM_GPUS // gpus_per_node)
    counts = [n for n in range(first, first + NEXT_NODE_COUNTS) if n * gpus_per_node > planned]
    n = first + NEXT_NODE_COUNTS - 1
    while n < last:
        n = min(last, max(n + 1, math.ceil(n * NODE_COUNT_GROWTH)))
        counts.append(n)
    return [n for n in counts if n <= last][:MAX_CLUSTERS_TRIED]


def _scaled(cluster: ClusterSpec, num_nodes: int) -> ClusterSpec | None:
    if num_nodes == cluster.num_nodes:
        return cluster
    if cluster.inter_node is not None:
        return cluster.model_copy(update={"num_nodes": num_nodes, "name": f"{num_nodes}x{cluster.gpus_per_node}x{cluster.gpu.name}"})
    if cluster.gpu.inter_node is None:
        return None
    return cluster_from_shorthand(num_nodes, cluster.gpus_per_node, cluster.gpu.name, cluster.name)
