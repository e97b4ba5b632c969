"""Disaggregated serving for the CLI: plan it, compare it with the best aggregated layout,
pick its launch commands. The numbers come from the estimates; nothing is recomputed here."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.disaggregated import MAX_PREFILL_UTILIZATION, RATE_RELATIVE_TOLERANCE
from planner.cost.serving_memory import (
    kv_bytes_per_sequence,
    max_num_batched_tokens,
    pre_load_free_bytes,
)
from planner.disagg_search import (
    E2E_BINDING,
    SHOWN_CANDIDATES,
    DisaggEstimate,
    DisaggPlan,
    plan_disaggregated,
    rejections_for_engine,
    role_request,
    same_node_groups,
)
from planner.emit.command import LaunchStep, ServeArgs, kv_window_fields
from planner.emit.disagg import DISAGG_EMITTERS, DisaggDeployment, not_emitted_reason
from planner.emit.sglang import sglang_pool_notes
from planner.layout import Layout
from planner.requests import DEFAULT_ALL2ALL_BACKEND, ServeRequest
from planner.serve import ServeEstimate
from planner.serve_search import NEAR_TIE_FRACTION, beats_beyond_a_tie, disaggregated_preferred
from planner.specs import ClusterSpec, ModelSpec
from planner.units import plain, seconds_to_ms, sequences


@dataclass(frozen=True)
class Verdict:
    winner: str | None
    """aggregated | disaggregated | None (neither meets the SLA)."""
    reason: str


def compare(aggregated: ServeEstimate | None, disaggregated: DisaggEstimate | None,
            why_no_disaggregated: str, has_sla: bool = True, objective: str = "throughput") -> Verdict:
    """The higher goodput per GPU wins; within NEAR_TIE_FRACTION aggregated is kept (one kind
    of server, no KV transfer, no proxy). With --objective latency the aggregated layout wins
    whenever one fits: the disaggregated deployments are priced at their rate-matched load,
    and splitting the phases cannot speed a lone request (its KV transfer adds to TTFT). Under a
    finite --request-rate both are priced at that load: compare_at_rate (by TPOT for the
    latency objective: there prompts no longer stalling decode rounds can speed every token)."""
    at_rate = aggregated is not None and (aggregated.offered_rate_per_s is not None or aggregated.overloaded)
    if aggregated is not None and objective == "latency" and not at_rate:
        lone = "" if disaggregated is None else (
            f"; the best disaggregated deployment, {disaggregated.label}, runs TPOT "
            f"{seconds_to_ms(disaggregated.tpot_seconds):.1f} ms at its load")
        return Verdict("aggregated", f"--objective latency: {aggregated.layout} serves a request at TPOT "
                                     f"{seconds_to_ms(aggregated.tpot_seconds):.1f} ms, TTFT "
                                     f"{seconds_to_ms(aggregated.ttft_seconds):.1f} ms; disaggregation adds the KV "
                                     f"transfer and pays off only in goodput under load{lone}")
    if aggregated is None and disaggregated is None:
        return Verdict(None, f"no aggregated layout fits (within the SLA, if one is set); no disaggregated deployment: "
                             f"{why_no_disaggregated}")
    if disaggregated is None:
        return Verdict("aggregated", f"no disaggregated deployment: {why_no_disaggregated}")
    if aggregated is None:
        return Verdict("disaggregated", f"no aggregated layout meets the SLA; {disaggregated.label} serves "
                                        f"{plain(disaggregated.plan_goodput_per_gpu)} output tok/s per GPU within it"
                                        f"{footprint_clause(disaggregated)}")
    if at_rate:
        return compare_at_rate(aggregated, disaggregated, objective)
    # per planned GPU, idle ones included: an aggregated layout's replicas may leave some idle
    # (7 GPUs: 3 x tp=2), a disaggregated deployment runs as many copies as fit
    a, d = aggregated.goodput_per_planned_gpu(disaggregated.plan_gpus), disaggregated.plan_goodput_per_gpu
    numbers = (f"disaggregated {disaggregated.label}: {plain(d)} vs aggregated {aggregated.layout}: {plain(a)} "
               f"output tok/s per GPU{' within the SLA' if has_sla else ''}")
    side = f"; {binding_reason(disaggregated)}"
    if beats_beyond_a_tie(d, a):
        return Verdict("disaggregated", f"{numbers} (+{(d / a - 1) * 100:.0f}%): prompts no longer stall "
                                        f"decode rounds, each phase gets its own parallelism{side}"
                                        f"{footprint_clause(disaggregated)}"
                                        f"{latency_clause(aggregated, disaggregated, has_sla)}")
    if d >= a * (1 - NEAR_TIE_FRACTION):
        if disaggregated_preferred(d, a, disaggregated.e2e_seconds, aggregated.e2e_seconds):
            return Verdict("disaggregated", f"{numbers}: a tie within {NEAR_TIE_FRACTION:.0%}, and E2E latency "
                                            f"{disaggregated.e2e_seconds:.2f} s against "
                                            f"{aggregated.e2e_seconds:.2f} s aggregated "
                                            f"({aggregated.e2e_seconds / disaggregated.e2e_seconds:.1f}x): the same "
                                            f"tokens/s per GPU at much shorter requests{side}"
                                            f"{footprint_clause(disaggregated)}")
        return Verdict("aggregated", f"{numbers}: a tie within {NEAR_TIE_FRACTION:.0%}, so the simpler "
                                     f"deployment (no KV transfer, no proxy){side}")
    return Verdict("aggregated", f"{numbers} ({(d / a - 1) * 100:.0f}%){side}")



def compare_at_rate(aggregated: ServeEstimate, disaggregated: DisaggEstimate,
                    objective: str = "throughput") -> Verdict:
    """Under a finite --request-rate (both within any SLA): the one that keeps up with it wins;
    when both do they serve the same tokens/s, so the lower mean E2E latency (TPOT for the
    latency objective) wins beyond NEAR_TIE_FRACTION (the simpler aggregated layout keeps
    ties); when neither does, the higher goodput per GPU (the shorter queue)."""
    rate = aggregated.offered_rate_per_s
    label, layout = disaggregated.label, aggregated.layout
    def tpot(seconds: float) -> str:  # one output token has none
        return f", TPOT {seconds_to_ms(seconds):.1f} ms" if disaggregated.output_len > 1 else ""

    times = (f"disaggregated {label}: TTFT {seconds_to_ms(disaggregated.ttft_seconds):,.0f} ms"
             f"{tpot(disaggregated.tpot_seconds)}, E2E {seconds_to_ms(disaggregated.e2e_seconds):,.0f} ms"
             f" vs aggregated {layout}: TTFT {seconds_to_ms(aggregated.ttft_seconds):,.0f} ms"
             f"{tpot(aggregated.tpot_seconds)}, E2E {seconds_to_ms(aggregated.e2e_seconds):,.0f} ms")
    # a deployment keeps up where rate_bound priced it at the rate; overloaded, or held below it
    # by --max-concurrency clients (binding "clients"), it does not
    behind = disaggregated.overloaded or disaggregated.binding != "request-rate"
    if aggregated.overloaded and behind:
        a = aggregated.goodput_per_planned_gpu(disaggregated.plan_gpus)
        d = disaggregated.plan_goodput_per_gpu
        if beats_beyond_a_tie(d, a):
            return Verdict("disaggregated", f"neither keeps up with the request rate; {label} serves the most: "
                                            f"{plain(d)} vs {plain(a)} output tok/s per GPU"
                                            f"{footprint_clause(disaggregated)}")
        # the winner's number first, as above (a review: "serves as much or more: 217 vs 250")
        return Verdict("aggregated", f"neither keeps up with the request rate; {layout} serves as much or more: "
                                     f"{plain(a)} vs {plain(d)} output tok/s per GPU")
    if aggregated.overloaded:
        return Verdict("disaggregated", f"{label} keeps up with the request rate and no aggregated layout does "
                                        f"({layout} at most {aggregated.throughput_tokens_per_second:,.0f} output "
                                        f"tok/s){footprint_clause(disaggregated)}")
    if behind:
        shortfall = disaggregated.rate_shortfall or (
            f"held to {disaggregated.requests_per_second:.2f} req/s per copy by its clients")
        return Verdict("aggregated", f"{layout} keeps up with --request-rate {rate:g}/s and no disaggregated "
                                     f"deployment does ({label} {shortfall})")
    measure, a, d = (("TPOT", aggregated.tpot_seconds, disaggregated.tpot_seconds) if objective == "latency" else
                     ("E2E", aggregated.e2e_seconds, disaggregated.e2e_seconds))
    both = f"both keep up with --request-rate {rate:g}/s: {times}"
    if d < a * (1 - NEAR_TIE_FRACTION):
        return Verdict("disaggregated", f"{both} ({(d / a - 1) * 100:.0f}% {measure}): prompts no longer stall decode "
                                        f"rounds{footprint_clause(disaggregated)}")
    if d <= a * (1 + NEAR_TIE_FRACTION):
        return Verdict("aggregated", f"{both}: a tie within {NEAR_TIE_FRACTION:.0%} on {measure}, so the simpler "
                                     f"deployment (no KV transfer, no proxy)")
    return Verdict("aggregated", f"{both} (+{(d / a - 1) * 100:.0f}% {measure} disaggregated)")


LATENCY_WORSE_FACTOR = 1.5
"""A winning disaggregated deployment whose TTFT exceeds the aggregated layout's by this factor
says so: its goodput is priced with the prefill workers near capacity, where they queue."""


def latency_clause(aggregated: ServeEstimate, disaggregated: DisaggEstimate, has_sla: bool) -> str:
    """Where the deployment wins on goodput at a much longer TTFT than the aggregated layout's
    (no limit set: its prefill workers run at MAX_PREFILL_UTILIZATION and prompts queue there,
    M/D/1; or, client-bound, below it on smaller workers), the trade and the flag that prices it."""
    if disaggregated.ttft_seconds <= LATENCY_WORSE_FACTOR * aggregated.ttft_seconds:
        return ""
    if has_sla:
        how = ""
    elif disaggregated.binding == "clients":  # the clients keep the prefill workers below capacity
        how = (f", its prompts on {disaggregated.prefill.shape_label} prefill workers "
               f"({disaggregated.prefill_load.utilization:.0%} busy); --max-ttft-ms prices the trade")
    else:
        how = ", its prefill workers near capacity with no limit set; --max-ttft-ms prices the trade"
    return (f"; at TTFT {seconds_to_ms(disaggregated.ttft_seconds):,.0f} ms against "
            f"{seconds_to_ms(aggregated.ttft_seconds):,.0f} ms aggregated{how}")


def footprint_clause(e: DisaggEstimate) -> str:
    """How the deployment covers the planned GPUs, when it is not exactly once: its copies and
    the GPUs none of them fits (they count in the per-GPU figures, idle)."""
    if e.copies == 1 and not e.idle_gpus:
        return ""
    copies = "one copy" if e.copies == 1 else f"{e.copies} copies"
    return (f"; {copies} of its {e.gpus_used} GPUs on the {e.planned_gpus}"
            + (f", {e.idle_gpus} idle" if e.idle_gpus else "")
            + f": {e.plan_goodput_tokens_per_second:,.0f} output tok/s in all")


def binding_reason(e: DisaggEstimate) -> str:
    """Which side limits the disaggregated rate, in its own numbers."""
    link = next((note for note in e.notes if note.startswith("the KV link binds")), None)
    if link is not None:
        return link
    if e.binding == "clients":
        return next(note for note in e.notes if note.startswith("Client-bound"))
    if e.binding == "request-rate":
        return next(note for note in e.notes if note.startswith("Rate-bound"))
    if e.binding == E2E_BINDING:
        return next(note for note in e.notes if note.startswith("E2E-bound"))
    if e.binding == "prefill":
        # a prompt cut into chunks takes S_p steps (a step of "1.0 prompts" read as a whole prompt's)
        # a round of k = pp micro-batches (each stage busy with one), on each of d lockstep DP
        # ranks: k d b prompts a round, the capacity k d n_max / T (PrefillWorker)
        p = e.prefill
        batches = f"{p.pp} micro-batches of " if p.pp > 1 else ""
        ranks = f" on each of {p.dp} DP ranks" if p.dp > 1 else ""
        step = (f"a prompt takes {e.steps_per_prompt} steps (its chunks) of "
                f"{seconds_to_ms(p.round_seconds):.0f} ms" if e.steps_per_prompt > 1 else
                f"a {'round' if p.pp > 1 else 'step'} of {batches}{p.concurrency:.1f} prompts{ranks} takes "
                f"{seconds_to_ms(p.round_seconds):.0f} ms")
        # at the ceiling the plan loads a prefill queue to, not held there by the TTFT limit
        ceiling = e.prefill_load.utilization >= MAX_PREFILL_UTILIZATION * (1 - RATE_RELATIVE_TOLERANCE)
        share = f", {MAX_PREFILL_UTILIZATION:.0%} of their capacity (the most the plan loads them to)" if ceiling else ""
        return (f"the prefill workers bind: {step}, so within TTFT "
                f"{seconds_to_ms(e.ttft_seconds):.0f} ms the {e.prefill.workers} prefill worker(s) take "
                f"{e.requests_per_second:.2f} req/s{share}")
    ranks = f" x {e.decode.dp} ranks" if e.decode.dp > 1 else ""
    return (f"the decode workers bind: {e.decode.workers}{ranks} x {sequences(e.decode.concurrency)} sequences at TPOT "
            f"{seconds_to_ms(e.tpot_seconds):.1f} ms finish {e.requests_per_second:.2f} req/s")


def role_args(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, est: DisaggEstimate,
              role: str, model_arg: str) -> ServeArgs:
    worker = est.prefill if role == "prefill" else est.decode
    fullest = max(worker.stages, key=lambda s: s.weights_bytes + s.kv_cache_bytes)
    return ServeArgs(
        model=model_arg, tp=worker.tp, pp=worker.pp, dp=worker.dp, ep=worker.ep, gpus_per_node=cluster.gpus_per_node,
        gpu_memory_utilization=request.gpu_memory_utilization, max_model_len=est.max_model_len,
        max_num_seqs=max(1, worker.max_num_seqs), quantization=request.quantization_override,
        kv_cache_dtype=request.kv_cache_dtype, moe_backend=request.moe_backend,
        all2all_backend=role_request(request, role).all2all_backend, enable_dbo=request.enable_dbo,
        async_scheduling=request.async_scheduling,
        tokenizer_workers=request.tokenizer_workers,
        speculation=request.speculation, dtype=model.dtype, trust_remote_code=model.trust_remote_code,
        engine_versions=request.engine_versions,
        max_num_batched_tokens=request.max_num_batched_tokens, gpu_memory_bytes=cluster.gpu.memory_bytes,
        load_free_bytes=pre_load_free_bytes(cluster.gpu.cuda_visible_memory_bytes,
                                            Layout(worker.tp, worker.pp, worker.dp, worker.ep)),
        weights_and_kv_bytes_per_gpu=worker.weights_and_kv_bytes_per_gpu, is_moe=model.is_moe,
        kv_cache_bytes_per_gpu=fullest.kv_cache_bytes, # a prefill worker's requests hold their KV only until it is sent: not sized by it
        kv_bytes_per_sequence=0.0 if role == "prefill" else kv_bytes_per_sequence(
            fullest, request.input_len, request.output_len, request.decode_context_tokens),
        # a decode server keeps running requests, its window layers pooled as SGLang pools them
        # (emit/sglang.pool_sequences; its radix cache off); a prefill server's only in flight
        **({} if role == "prefill" else {**kv_window_fields(model, fullest, request), "radix_cache": False}),
        priced_batched_tokens=max_num_batched_tokens(cluster, role_request(request, role),
                                                     Layout(worker.tp, worker.pp, worker.dp, worker.ep)))


def deployment_of(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, est: DisaggEstimate,
                  model_arg: str) -> DisaggDeployment:
    p, d = est.prefill, est.decode
    groups = same_node_groups(p.workers, p.gpus_per_worker, d.workers, d.gpus_per_worker, cluster) if est.same_node else 0
    return DisaggDeployment(role_args(model, cluster, request, est, "prefill", model_arg),
                            role_args(model, cluster, request, est, "decode", model_arg),
                            p.workers, d.workers, groups)


def disagg_steps(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, est: DisaggEstimate,
                 engine: str, model_arg: str) -> tuple[LaunchStep, ...] | None:
    """Per role; None when the deployment cannot be emitted (why_not_emitted says why)."""
    if engine not in DISAGG_EMITTERS:
        return ()
    return DISAGG_EMITTERS[engine](deployment_of(model, cluster, request, est, model_arg))


def disagg_launch_notes(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, est: DisaggEstimate,
                        engine: str) -> list[str]:
    """What the printed disaggregated commands run differently from the plan: SGLang's decode
    workers hold fewer running requests where its reserve caps their pool (sglang_pool_notes;
    a prefill worker's requests hold KV only until it is sent); a DeepEP --all2all-backend runs as
    each role's mode (disagg_search.role_request), which the commands show but no line said (a
    CLI read: deepep_high_throughput asked, deepep_low_latency on the decode workers)."""
    notes = []
    if request.all2all_backend != DEFAULT_ALL2ALL_BACKEND and (est.prefill.ep > 1 or est.decode.ep > 1):
        notes.append(f"--all2all-backend {request.all2all_backend}: the prefill workers run DeepEP's high-throughput "
                     f"kernels and the decode workers its low-latency ones, whichever was asked (vLLM's expert-"
                     f"parallel deployment guide pairs them so); the plan prices each role's")
    if engine == "sglang":
        notes += sglang_pool_notes(role_args(model, cluster, request, est, "decode", "MODEL"), "decode worker")
    return notes


def why_not_emitted(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, est: DisaggEstimate,
                    engine: str) -> str:
    """The clause the CLI prints where disagg_steps is None."""
    return not_emitted_reason(deployment_of(model, cluster, request, est, "MODEL"), engine)


def plan_both(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
              aggregated: ServeEstimate | None, engine: str = "vllm",
              top: int | None = None) -> tuple[DisaggPlan, Verdict]:
    """The disaggregated plan (its rejections worded for `engine`: rejections_for_engine; `top`
    rows wanted, None: the search's SHOWN_CANDIDATES) and its verdict against the aggregated layout."""
    plan = rejections_for_engine(plan_disaggregated(model, cluster, request, engine=engine,
                                                    shown=top or SHOWN_CANDIDATES), engine, request)
    return plan, compare(aggregated, plan.recommended, plan.why_none, request.has_sla, request.objective)
