"""Serving entry for the CLI: plan, pick the launch commands, render. Exit 1 if nothing fits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from planner.cost.params import kv_cache_format
from planner.cost.serving_sim import ServeMetrics
from planner.emit import SERVE_EMITTERS
from planner.emit.accept import without_refused
from planner.emit.command import (
    MODEL_PLACEHOLDER,
    LaunchStep,
    ServeArgs,
    placement_reasons,
    serve_launch_args,
)
from planner.emit.sglang import sglang_pool_notes
from planner.errors import SpecError
from planner.layout import Layout
from planner.requests import (
    DEFAULT_TOP_ROWS,
    LayoutFilter,
    ServeRequest,
    check_tokenizer_workers,
    for_checkpoint,
)
from planner.serve import ServeEstimate, burst_metrics, seqs_flag, steady_metrics
from planner.serve_search import ServePlan, plan_serving
from planner.specs import ClusterSpec, ModelSpec


def engine_args(plan: ServePlan, result: ServeEstimate, model_arg: str) -> ServeArgs:
    return serve_args(plan.model, plan.cluster, plan.request, result, model_arg)


def serve_args(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, result: ServeEstimate,
               model_arg: str) -> ServeArgs:
    """The launch arguments of one estimate (engine_args without a plan: the search's refusals)."""
    return serve_launch_args(model, cluster, request, result.layout, result.stages, result.max_model_len,
                             result.max_num_seqs, model_arg)


def launch_notes(plan: ServePlan) -> list[str]:
    """What the command alone does not say about the checkpoint MODEL must be."""
    return dtype_notes(plan) + quantization_notes(plan) + checkpoint_kv_notes(plan)


def checkpoint_kv_notes(plan: ServePlan) -> list[str]:
    """Why an fp8 KV cache nobody asked for (requests.for_checkpoint), or why the checkpoint's is
    set aside (the V0 engine reads none)."""
    kv, request = plan.model.checkpoint_kv_cache_dtype, plan.request
    if kv is None:
        return []
    if request.kv_cache_from_checkpoint:
        engine = (f"SGLang {request.engine_versions.sglang}" if request.pool_engine == "sglang"
                  else f"vLLM {request.engine_versions.vllm}")
        return [f"KV cache in {kv}: MODEL's quantization config names it (kv_cache_scheme / kv_cache_quant_algo) and "
                f"{engine} takes it for --kv-cache-dtype auto, so the plan prices it and a printed command names it"]
    release = request.engine_versions.vllm_release
    if request.kv_cache_dtype == "auto" and request.pool_engine == "vllm" and not release.kv_cache_dtype_from_checkpoint:
        return [f"MODEL's quantization config names an {kv} KV cache, which vLLM {release.version} does not read for "
                f"--kv-cache-dtype auto: the cache is 16-bit, as planned (--kv-cache-dtype fp8 plans an fp8 one)"]
    return []


def dtype_notes(plan: ServePlan) -> list[str]:
    if plan.request.checkpoint_dtype is None:
        return []
    return [f"MODEL's {plan.request.checkpoint_dtype} weights load in {plan.model.dtype} (--dtype), as planned: "
            f"vLLM's --dtype auto downcasts a float32 checkpoint too (vllm/config/model.py at 0.33.0)"]


def quantization_notes(plan: ServePlan) -> list[str]:
    quant, override = plan.model.quantization, plan.request.quantization_override
    if override in ("int8", "int4"):
        kinds = ("AWQ or GPTQ" if override == "int4" else  # AWQ is 4-bit only
                 "GPTQ 8-bit, as priced: weight-only; a compressed-tensors W8A8 checkpoint runs its GEMMs "
                 "on the int8 tensor cores, faster for prompts, which planning its config.json prices")
        return [f"vLLM and SGLang cannot quantize to {override} on the fly: point MODEL at an "
                f"{override} checkpoint ({kinds}; its quantization_config is read automatically)"]
    if override == "fp8":
        return ["MODEL must be a 16-bit checkpoint: the engine quantizes it to fp8 as it loads (--quantization); "
                "it refuses the flag on a checkpoint already quantized by another method (AWQ, GPTQ, NVFP4)"]
    if quant is not None and override is None:
        modelopt = " (a ModelOpt checkpoint's: hf_quant_config.json)" if quant in ("fp8", "nvfp4") else ""
        return [f"MODEL must be the {quant} checkpoint: the engine reads its format from its "
                f"quantization_config{modelopt}; no flag is needed"]
    return []


def recommended_metrics(plan: ServePlan) -> ServeMetrics | None:
    """What vllm bench serve would report for the recommended layout: the simulated burst
    when --request-rate, --num-prompts or --dataset is given, else the steady state (every
    request alike: mean = median = p99)."""
    best = plan.recommended
    if best is None:
        return None
    if not plan.request.simulates_burst:
        return steady_metrics(best)
    try:
        return burst_metrics(plan.model, plan.cluster, best, plan.request)
    except SpecError:
        raise
    except ValueError as error:  # a request longer than the KV cache holds
        raise SpecError(f"--dataset/--input-len: {error}") from error


def launch_steps(plan: ServePlan, result: ServeEstimate, engine: str, model_arg: str) -> tuple[LaunchStep, ...]:
    """The engine's steps for this layout, one per role; none for --emit none."""
    emitter = SERVE_EMITTERS.get(engine)
    return () if emitter is None else emitter(engine_args(plan, result, model_arg))


def engine_version(plan: ServePlan, engine: str) -> str:
    """`vllm 0.33.0`: the engine and release the commands are for."""
    versions = plan.request.engine_versions
    return f"{engine} {versions.sglang if engine == 'sglang' else versions.vllm}"


def launch_refusals(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, engine: str = "vllm"
                    ) -> Callable[[ServeEstimate], list[str]]:
    """Why no serving engine starts an estimate as planned (planner/emit/command.py), or the
    chosen engine refuses it (SGLang: emit/sglang.refusal, and pool_refusal where its default
    memory reserve leaves no KV for one request); empty where it starts."""
    from planner.emit.sglang import pool_refusal, refusal

    gpus_per_node = cluster.gpus_per_node

    def reasons(r: ServeEstimate) -> list[str]:
        found = placement_reasons(r.layout.tp, r.layout.pp, r.layout.dp, gpus_per_node, r.layout.ep)
        if engine == "sglang":
            found += [reason for reason in (refusal(r.layout, request.speculation),
                                            pool_refusal(serve_args(model, cluster, request, r, MODEL_PLACEHOLDER)))
                      if reason]
        return found

    return reasons


def launchable(plan: ServePlan, engine: str = "vllm") -> ServePlan:
    """The plan less the layouts no serving engine starts as planned, and those the chosen
    engine refuses (launch_refusals)."""
    return without_refused(plan, lambda r: r.layout, launch_refusals(plan.model, plan.cluster, plan.request, engine))


def check_layout_mode(request: ServeRequest) -> None:
    """--layout with --mode disaggregated: a usage error (plan and --frontier alike)."""
    if request.layout != LayoutFilter() and request.mode == "disaggregated":
        raise SpecError("--layout: filters aggregated layouts; --mode disaggregated plans prefill and decode "
                        "workers of its own (drop --layout, or use --mode aggregated)")


def run_serve(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, *, json_output: bool,
              top: int | None, show_rejected: bool, emit: str, served_model: str = MODEL_PLACEHOLDER) -> int:
    """`top`: table rows (None: DEFAULT_TOP_ROWS) and JSON layouts (None: all)."""
    from planner.render.serve import print_plan_json

    filtered = request.layout != LayoutFilter()
    check_layout_mode(request)
    engine = "vllm" if emit == "megatron" else emit
    check_tokenizer_workers(request, engine)
    if engine == "sglang":  # SGLang's own pool caps what each layout runs (serve.sglang_pool_cap)
        request = replace(request, pool_engine="sglang")
    # the rows shown are all that is wanted unless every layout is (--json without --top)
    keep_top = None if show_rejected else (top if json_output else top or DEFAULT_TOP_ROWS)
    refusals = launch_refusals(model, cluster, request, engine) if engine != "none" else None
    plan = plan_serving(model, cluster, request, keep_top=keep_top,
                        counts=None if refusals is None else (lambda r: not refusals(r)))
    if engine != "none":
        plan = launchable(plan, engine)
    if request.mode != "aggregated" and not filtered:
        return run_with_disaggregated(plan, engine, json_output=json_output, top=top,
                                      show_rejected=show_rejected, served_model=served_model)
    metrics = recommended_metrics(plan)
    if json_output:
        print_plan_json(plan, lambda r: launch_steps(plan, r, engine, served_model),
                        lambda r: launch_steps(plan, r, "vllm-ray", served_model),
                        engine_version(plan, engine) if engine != "none" else None, top, metrics,
                        all_launch_notes(plan, engine))
    else:
        render_aggregated(plan, engine, top, show_rejected, served_model, metrics)
        if filtered and request.mode == "auto":
            from planner.render.common import console

            console().print("Disaggregated prefill/decode not compared: --layout fixes an aggregated layout "
                            "(plan without --layout to compare them, or without --layout and with --mode disaggregated to see "
                            "only the workers).")
    return 0 if plan.recommended is not None else 1


def run_frontier_serve(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, *, json_output: bool,
                       engine: str) -> int:
    """`plan --frontier`: output tok/s per GPU against tok/s per user (planner/frontier.py). When
    no layout fits at all, the plain plan's answer (why, and what would fit), exit 1."""
    from planner.frontier import trace_frontier
    from planner.render.frontier import print_frontier_json, render_frontier

    check_layout_mode(request)  # the sweep traced a table of bare TPOT limits under both
    check_tokenizer_workers(request, engine)
    if engine == "sglang":  # as run_serve: SGLang's pool caps what each layout runs
        request = replace(request, pool_engine="sglang")
    request = for_checkpoint(model, request)  # the header's KV format is the plan's

    frontier = trace_frontier(model, cluster, request, lambda plan: launchable(plan, engine), engine=engine)
    if frontier is None:
        return run_serve(model, cluster, request, json_output=json_output, top=None, show_rejected=False,
                         emit=engine)
    if json_output:
        print_frontier_json(model, cluster, request, frontier)
    else:
        render_frontier(model, cluster, request, frontier)
    return 0


def render_aggregated(plan: ServePlan, engine: str, top: int | None, show_rejected: bool, served_model: str,
                      metrics: ServeMetrics | None, superseded: bool = False) -> None:
    from planner.render.serve import render_plan

    best = plan.recommended
    steps = () if best is None else launch_steps(plan, best, engine, served_model)
    ray: tuple[LaunchStep, ...] = ()
    if (best is not None and engine == "vllm" and best.layout.tp * best.layout.pp > plan.cluster.gpus_per_node
            and plan.request.engine_versions.vllm_release.v1_engine):  # V0 launches such a replica on Ray alone
        ray = launch_steps(plan, best, "vllm-ray", served_model)
    notes = all_launch_notes(plan, engine)
    render_plan(plan, steps, engine_version(plan, engine), top or DEFAULT_TOP_ROWS, show_rejected, ray_steps=ray,
                notes=notes, metrics=metrics, superseded=superseded)


def all_launch_notes(plan: ServePlan, engine: str) -> list[str]:
    """What the printed commands need besides themselves (text "Note:" lines, JSON launch_notes)."""
    notes = launch_notes(plan)
    best = plan.recommended
    if (best is not None and plan.request.objective == "latency" and plan.request.batch is None
            and best.offered_rate_per_s is None and best.batch == 1):
        notes.append(f"--objective latency plans one sequence per replica and the command caps the engine at it "
                     f"({seqs_flag(plan.request)} 1): every other request waits for the running one; give --batch N, "
                     f"--max-tpot-ms or --request-rate to serve concurrent traffic")
    if best is not None and engine == "sglang" and plan.request.speculation is not None:
        notes.append("SGLang turns mixed chunked prefill off under speculative decoding (server_args: \"Mixed "
                     "chunked prefill is disabled because of using eagle speculative decoding\"): its prompts "
                     "run in prefill batches of their own between decode batches, where the plan prices them "
                     "riding in the decode steps (vLLM's schedule); expect longer TPOT gaps while prompts arrive")
    if best is not None and engine == "vllm-ray" and best.layout.tp * best.layout.pp <= plan.cluster.gpus_per_node:
        notes.append(f"--emit vllm-ray: each replica of {best.layout} fits in one node, so no Ray cluster is needed and "
                     f"the command is the plain one (vLLM runs a replica inside a node with its multiprocessing "
                     f"executor, and DP ranks across nodes with its own --data-parallel-address); Ray is used where "
                     f"a replica spans nodes")
    if plan.recommended is not None and engine == "sglang":
        notes += sglang_pool_notes(engine_args(plan, plan.recommended, MODEL_PLACEHOLDER))
    release = plan.request.engine_versions.vllm_release
    if plan.recommended is not None and engine in ("vllm", "vllm-ray"):
        notes += apart_notes(plan.model.is_moe, plan.recommended.layout, release.v1_engine)
    if not release.v1_engine:
        notes.append(V0_NOTE.format(version=release.version))
    return notes


V0_NOTE = ("vLLM {version} is the V0 engine: the KV cache, the batch defaults and the flags are that release's; "
           "step times are priced as current vLLM's (calibrated on V1, whose scheduler costs less per step), so "
           "TPOT and throughput are optimistic for it; the plan does not check that its model registry has this "
           "architecture")
"""What a V0 plan prices as V1 (docs/cost-model.md, Serving: memory (vLLM budget), "The V0 engine")."""


def apart_notes(is_moe: bool, layout: Layout, v1_engine: bool = True) -> list[str]:
    """vLLM deployments launched apart (each EP group, an MoE model's replicas without EP, or
    under the V0 engine every replica): each serves its own address."""
    deployments = layout.num_ep_groups if layout.ep > 1 else (layout.dp if is_moe or not v1_engine else 1)
    if deployments <= 1:
        return []
    what = ("EP group" if layout.ep > 1 else "replica (V0 has no data-parallel deployment)" if not v1_engine
            else "replica (one vLLM deployment would split the experts over all its DP ranks)")
    return [f"{deployments} independent vLLM servers, one per {what}: each serves its own address; put a load "
            f"balancer in front of them"]


def run_with_disaggregated(plan: ServePlan, engine: str, *, json_output: bool, top: int | None,
                           show_rejected: bool, served_model: str) -> int:
    """--mode auto: the aggregated plan as always, then the disaggregated one and the verdict;
    --mode disaggregated: the disaggregated one only."""
    from planner.disagg_cli import disagg_launch_notes, disagg_steps, plan_both, why_not_emitted
    from planner.disagg_search import check_disaggregated_gpus
    from planner.render.catalog import describe_cluster, describe_model
    from planner.render.common import console, print_json_rows
    from planner.render.disagg import disagg_json, render_disagg
    from planner.render.serve import plan_json

    model, cluster, request = plan.model, plan.cluster, plan.request
    # --max-concurrency is a closed loop the disaggregated search prices (disagg_search.client_bound), a
    # finite --request-rate an open one (rate_bound), a --dataset its means; --request-rate inf is only a burst
    priced = ("--max-concurrency", "--dataset") + (("--request-rate",) if request.offered_rate_per_s is not None else ())
    burst = [flag for flag in request.burst_flags if flag not in priced]
    if request.mode == "disaggregated" and burst:
        raise SpecError(f"{burst[0]}: the burst is simulated for aggregated replicas only; --mode disaggregated plans "
                        f"the steady state, closed-loop under --max-concurrency, at a finite --request-rate without "
                        f"--num-prompts (use --mode auto or aggregated for the burst's metrics)")
    if request.mode == "disaggregated":
        check_disaggregated_gpus(request, cluster)
    disagg, verdict = plan_both(model, cluster, request, plan.recommended, engine, top)
    best = disagg.recommended
    steps = None if best is None else disagg_steps(model, cluster, request, best, engine, served_model)
    why = None if steps is not None or best is None else why_not_emitted(model, cluster, request, best, engine)
    disagg_notes = () if not steps else tuple(disagg_launch_notes(model, cluster, request, best, engine))
    launcher = engine
    if engine == "vllm-ray" and steps:
        # --mode auto: the aggregated layout's command uses Ray; the disaggregated servers never do
        # (they were labelled "vllm-ray" over plain commands; found by a CLI sweep)
        launcher = "vllm"
        disagg_notes = (*disagg_notes, "--emit vllm-ray applies to the aggregated layout: the disaggregated "
                                       "servers are launched with vLLM's own multi-node flags, without Ray")
    auto = request.mode == "auto"
    metrics = recommended_metrics(plan) if auto else None
    if json_output:
        payload = plan_json(plan, lambda r: launch_steps(plan, r, engine, served_model),
                            lambda r: launch_steps(plan, r, "vllm-ray", served_model),
                            engine_version(plan, engine) if engine != "none" else None, top, metrics)
        payload["launch_notes"] = all_launch_notes(plan, engine)
        payload["mode"] = request.mode
        payload.update(disagg_json(disagg, verdict, steps, top, why, disagg_notes, request))
        won = verdict.winner == "disaggregated" and bool(payload["disaggregated"])
        if auto:
            # neither kind found: no mode is recommended (the comparison's winner is null too)
            payload["recommended_mode"] = ("disaggregated" if won else
                                           "aggregated" if plan.recommended is not None else None)
        else:  # the kind asked for, if a deployment of it was found
            payload["recommended_mode"] = "disaggregated" if payload["disaggregated"] else None
        if auto and won:  # what the text recommends; the aggregated best stays beside it
            payload["best_aggregated"] = payload["recommended"]
            payload["recommended"] = payload["disaggregated"][0]
        if not auto:  # the deployment the text recommends; the aggregated layouts stay for comparison
            payload["recommended"] = payload["disaggregated"][0] if payload["disaggregated"] else None
            # the aggregated plan's alternatives (drafts off, other backends) price its best layout,
            # not this deployment: left out rather than read as this one's
            for key in ("speculation_options", "moe_backend_options", "all2all_backend_options",
                        "token_budget_options"):
                if key in payload:
                    payload[key] = []
            if "speculation_break_even_factor" in payload:
                payload["speculation_break_even_factor"] = None
        print_json_rows(payload)
    else:
        if auto:
            render_aggregated(plan, engine, top, show_rejected, served_model, metrics,
                              superseded=verdict.winner == "disaggregated")
        else:
            console().print(describe_model(model, kv_cache_format(model, cluster.gpu, request.kv_cache_dtype)))
            console().print(describe_cluster(cluster))
            if request.speculation is not None:
                from planner.render.serve import speculation_words

                console().print(f"Speculative decoding on every worker: {speculation_words(request.speculation)}.")
        render_disagg(disagg, verdict, steps, launcher, top or DEFAULT_TOP_ROWS, compared=auto, why_not_emitted=why,
                      launch_notes=disagg_notes)
    found = best is not None or (auto and plan.recommended is not None)
    return 0 if found else 1
