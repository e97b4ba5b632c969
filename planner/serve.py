"""Serving estimate for one layout under vLLM semantics: composes the cost terms of
planner/cost/serving_memory.py (memory per stage, vLLM's checks), planner/cost/serving_time.py
(one engine step, pipeline rounds) and planner/cost/continuous_batching.py (the steady state
under load) into TPOT, TTFT, E2E, throughput, the SLA verdict and the verdict; a burst of
requests goes through planner/cost/serving_sim.py.

Legend: t/p/d tensor/pipeline/data degrees, B concurrent sequences per replica,
k batches in flight (vLLM runs p virtual engines). Everything in SI units.
Derivations: docs/cost-model.md (Serving).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from planner.cost import efficiency as eff
from planner.cost.continuous_batching import (
    SLOT_WAIT_NOTE_FRACTION,
    SteadyState,
    arrivals,
    clients_at_rate,
    convoy_capacity_per_s,
    in_flight_weights,
    least_loaded,
    lockstep_peaks,
    mixed_at_rate,
    on_geometric_grid,
    solve_open_loop,
    steady_state,
    with_slot_queue,
    with_waiting_clients,
)
from planner.cost.ingress import TOKENIZER_NOTE_UTILIZATION, PromptTokenizer
from planner.cost.moe import deepep_ampere_refusal
from planner.cost.params import activation_bytes_per_element
from planner.cost.serving_memory import (
    StageMemory,
    default_max_num_seqs,
    kv_limited_sequences,
    kv_tokens_per_running_sequence,
    max_model_len_of,
    max_num_batched_tokens,
    memory_overshoot_bytes,
    memory_reasons,
    stage_memory,
    stage_moe_layers,
    structural_reasons,
    v0_chunked_prefill,
)
from planner.cost.serving_sim import (
    Distribution,
    EngineLimits,
    PipelineStep,
    ServeMetrics,
    backlog_growth,
    bench_metrics,
    first_wave,
    simulate_replicas,
)
from planner.cost.serving_time import (
    Collective,
    RoundTime,
    StageRates,
    StepConstants,
    StepLoad,
    StepTime,
    engine_step_seconds,
    ep_exchange_seconds_per_moe_layer,
    mean_bubble_fraction,
    pipeline_hop_seconds,
    qk_norm_allreduce_seconds,
    round_time,
    serving_collectives,
    stage_step_times,
    step_constants,
    tp_allreduce_seconds_per_layer,
    with_moe_backend,
)
from planner.cost.speculative import speculation_shape
from planner.errors import SpecError
from planner.layout import Layout, Placement, Rejected, place
from planner.memo import Memo
from planner.requests import (
    DEFAULT_ALL2ALL_BACKEND,
    DEFAULT_NUM_PROMPTS,
    MAX_SIMULATED_STEPS,
    MAX_TOKENIZER_WORKERS,
    ServeRequest,
    for_checkpoint,
)
from planner.specs import ClusterSpec, ModelSpec
from planner.units import ms_above, plain, seconds_to_ms
from planner.workload import random_dataset_lengths, sampled_dataset_lengths, workload_requests


@dataclass(frozen=True)
class SlaCheck:
    """The estimate against --max-ttft-ms, --max-tpot-ms, --max-e2e-ms (True when not given)."""

    ttft_ok: bool
    tpot_ok: bool
    e2e_ok: bool
    binding: str | None
    """The limit that stops a higher concurrency (ttft | tpot | e2e), or what caps it
    otherwise (kv-cache | max-num-seqs | batch | saturation: more would add no tokens/s,
    peak_throughput_concurrency; clients: --max-concurrency's clients, fewer than the engine
    takes); request-rate: a finite --request-rate the layout keeps up with sets the load; None
    otherwise without limits."""


@dataclass(frozen=True)
class ServeEstimate:
    layout: Layout
    placement: Placement
    stages: tuple[StageMemory, ...]
    """Memory per GPU of every pipeline stage, by component."""
    worst_stage: int
    kv_cache_tokens: int
    max_model_len: int
    max_concurrency: float
    """Sequences of max_model_len tokens the KV cache holds on its tightest stage (vLLM logs it
    as the maximum concurrency for that many tokens per request); not what the plan runs."""
    batch: int
    """Concurrent requests per replica the estimate runs at (the closed loop's concurrency)."""
    max_num_seqs: int
    """The --max-num-seqs its command sets: batch, except where --max-concurrency's clients run
    fewer than the engine would take (then the engine's cap: --batch or what fits, the memory
    priced for it; the clients, not the engine, hold the load down)."""
    batches_in_flight: int
    stage_step_seconds: float
    """Slowest stage's time for one micro-batch of the mean decode-only round."""
    tp_allreduce_seconds_per_layer: float
    """Every TP all-reduce of one layer at one decode micro-batch: both of the layer's outputs
    at its message size, and where the query / key norms span every head their partial sums'
    (qk_norm_allreduce_seconds)."""
    allreduce_message_bytes: float
    allreduce_source: str
    """"model" (alpha-beta ring) or "measured" (probe curve at this size)."""
    ep_exchange_seconds_per_moe_layer: float
    """EP: vLLM's dispatch all-gather + combine reduce-scatter of one MoE layer at one decode
    micro-batch's size (0 without EP and when the EP group is one replica's TP group)."""
    pp_hop_seconds: float
    bubble_fraction: float
    decode_bound: str
    """"memory" or "compute": what limits the slowest stage's linear layers in a decode round."""
    ttft_seconds: float
    """Mean time to first token under load (queueing, prompt chunks, first-token cost)."""
    tpot_seconds: float
    """Mean time per output token under load (= mean inter-token latency)."""
    request_latency_seconds: float
    """Mean end-to-end latency of one request under load."""
    throughput_tokens_per_second: float
    """Output tokens per second for the whole layout (all DP replicas)."""
    notes: tuple[str, ...] = field(default=())
    decode_steps: tuple[StepTime, ...] = ()
    """Each stage's share of one decode-only micro-batch step, by part."""
    slowest_stage: int = 0
    """The stage whose decode step paces every round."""
    prefill_stage_seconds: tuple[float, ...] = ()
    """Each stage's time for the round that carries a prompt's chunk."""
    collectives: tuple[Collective, ...] = ()
    """Every collective of a decode round and a prefill, as priced."""
    steady: SteadyState | None = None
    """The replica's continuous-batching steady state the times come from."""
    tpot_batch1_seconds: float = 0.0
    """TPOT of a lone request (no load)."""
    sla: SlaCheck = SlaCheck(True, True, True, None)
    decode_round: RoundTime | None = None
    """A round of decodes only (no prompt chunk), by stage: what TPOT is without prompts."""
    prompt_round: RoundTime | None = None
    """A round that carries a prompt's chunk beside the decodes, by stage (its carriers'
    steps in chunk_steps): what a prompt's service is made of."""
    offered_rate_per_s: float | None = None
    """The finite --request-rate the layout keeps up with: its times are those of requests
    arriving at that rate (the steady state's concurrency is their mean number per replica);
    None: a concurrency sets the load (and `batch` is it)."""
    overloaded: bool = False
    """A finite --request-rate above what the layout completes: it runs at capacity and the
    queue grows for as long as the requests keep coming."""
    convoy_rate_per_s: float = math.inf
    """Under a finite --request-rate, PP with whole prompts that share a step: the most requests
    a second one replica keeps up with, its micro-batches in a convoy (continuous_batching.
    convoy_capacity_per_s); inf without a rate or where no convoy forms (no PP, prompts that take
    turns, DP ranks in lockstep). A rate past it (per replica) is overloaded."""

    @property
    def concurrency(self) -> float:
        """Requests in flight per replica: the batch the estimate runs, or under a request rate
        their mean number (Little's law: rate x E2E)."""
        return self.batch if self.offered_rate_per_s is None else self.steady.concurrency

    @property
    def step_seconds(self) -> float:
        """The engine's mean step under load (every prompt chunk counted; TPOT leaves out a
        request's own prompt, continuous_batching.steady_state)."""
        return self.tpot_seconds if self.steady is None else self.steady.step_seconds

    @property
    def prefill_tokens_per_step(self) -> float:
        return 0.0 if self.steady is None else self.steady.prefill_tokens_per_step

    @property
    def e2e_seconds(self) -> float:
        return self.request_latency_seconds

    @property
    def goodput_tokens_per_second(self) -> float:
        """Output tokens/s of requests within every SLA (all of them in the steady state the
        concurrency was chosen for, else none)."""
        ok = self.sla.ttft_ok and self.sla.tpot_ok and self.sla.e2e_ok
        return self.throughput_tokens_per_second if ok else 0.0

    @property
    def goodput_per_gpu(self) -> float:
        return self.goodput_tokens_per_second / self.layout.num_gpus

    def goodput_per_planned_gpu(self, plan_gpus: int) -> float:
        """Over every planned GPU, those the layout's replicas leave idle included (7 GPUs,
        3 x tp=2: over 7), as disaggregated deployments are compared."""
        return self.goodput_tokens_per_second / max(plan_gpus, self.layout.num_gpus)


def wanted_batch(request: ServeRequest, cluster: ClusterSpec) -> int:
    """--batch if given, else vLLM's max_num_seqs default (1 for the latency objective, unless a
    finite --request-rate or --max-concurrency clients set the load: one sequence a replica then
    queued the clients, Llama-3.1-70B tp=8 with 16 clients at a 42.5 s TTFT, a CLI read)."""
    if request.batch:
        return request.batch
    if request.objective == "latency" and request.offered_rate_per_s is None and request.max_concurrency is None:
        return 1
    return default_max_num_seqs(cluster, request.engine_versions.vllm_release)



def footprint_basis(request: ServeRequest) -> str:
    """How a running sequence's mean KV footprint is counted, as the notes say it: prompt +
    half the output, over a --dataset weighted by each request's decode steps."""
    if request.dataset_lengths:
        return "prompt + half the output, weighted by each --dataset request's decode steps"
    return "prompt + half the output"

def seqs_flag(request: ServeRequest) -> str:
    """The flag that caps an engine's running sequences, as the notes name it: vLLM's
    --max-num-seqs, SGLang's --max-running-requests (the command the plan prints)."""
    return "--max-running-requests" if request.pool_engine == "sglang" else "--max-num-seqs"


CAP_NOTES = ("KV-starved", "Token-budget-bound")
"""Notes naming what caps a replica's sequences (choose_batch, replica_setup): dropped where the
concurrency run is below that cap, which then does not bind (without_notes)."""


def without_notes(notes: list[str], prefixes: tuple[str, ...] = CAP_NOTES) -> list[str]:
    """`notes` less those starting with any of `prefixes`."""
    return [note for note in notes if not note.startswith(prefixes)]


def choose_batch(request: ServeRequest, running_tokens: int, wanted: int, windowed: bool = False
                 ) -> tuple[int, list[str]]:
    """Concurrent sequences per replica: the wanted batch capped by how many running
    sequences the KV cache holds at their mean footprint (kv_limited_sequences of the stages'
    StageMemory.running_tokens; `windowed`: sliding-window layers keep only the window of each)."""
    fit = kv_limited_sequences(running_tokens, request.input_len, request.output_len, request.decode_context_tokens)
    notes = []
    if fit < wanted:
        footprint = kv_tokens_per_running_sequence(request.input_len, request.output_len,
                                                   request.decode_context_tokens)
        held = " (the window layers keep each one's last window only)" if windowed else ""
        notes.append(
            f"KV-starved: the cache holds {running_tokens:,} tokens{held} = {fit} running sequences of "
            f"{footprint:,.0f} tokens on average ({footprint_basis(request)}), so concurrency is {fit} "
            f"(wanted {wanted})"
        )
    return max(1, min(wanted, fit)), notes


def binding_tpot_limit(request: ServeRequest) -> float | None:
    """--max-tpot-ms where it binds: a request of one output token has no decode step to time."""
    return request.max_tpot_seconds if request.output_len > 1 else None


def sla_check(request: ServeRequest, steady: SteadyState) -> tuple[bool, bool, bool]:
    def ok(limit: float | None, value: float) -> bool:
        return limit is None or value <= limit
    # one output token has no TPOT (vllm bench serve reports none): no TPOT limit can bind
    return (ok(request.max_ttft_seconds, steady.ttft_seconds), ok(binding_tpot_limit(request), steady.tpot_seconds),
            ok(request.max_e2e_seconds, steady.e2e_seconds))


def first_failing(request: ServeRequest, steady: SteadyState) -> str | None:
    names = ("ttft", "tpot", "e2e")
    return next((name for name, ok in zip(names, sla_check(request, steady), strict=True) if not ok), None)


def sla_rejection(layout: Layout, request: ServeRequest, steady: SteadyState,
                  rate_per_s: float | None = None) -> Rejected:
    """A layout that fits but misses the limits (sla_reason), with its worst miss ratio."""
    values = ((steady.ttft_seconds, request.max_ttft_seconds), (steady.tpot_seconds, binding_tpot_limit(request)),
              (steady.e2e_seconds, request.max_e2e_seconds))
    worst = max((value / limit for value, limit in values if limit is not None and limit > 0), default=0.0)
    return Rejected(layout, (sla_reason(request, steady, rate_per_s),), sla_miss_ratio=worst)


def overload_rejection(layout: Layout, request: ServeRequest, capacity_per_s: float, rate_per_s: float) -> Rejected:
    """A layout that falls behind --request-rate under a TTFT or E2E limit, each replica
    completing at most `capacity_per_s`: its queue grows without bound, in both (vllm bench serve
    counts them from the send), so no concurrency meets the limit at that rate; ranked among the
    misses by the rate over what it completes."""
    per_replica = rate_per_s / layout.dp
    limits = " or ".join(request.queue_limit_flags)
    return Rejected(layout, (f"falls behind --request-rate {rate_per_s:g}/s: each of the {layout.dp} replica(s) "
                             f"completes at most {plain(capacity_per_s)} req/s of the {plain(per_replica)} asked, so "
                             f"requests queue without bound and no {limits} holds",),
                    sla_miss_ratio=max(1.0, per_replica / max(capacity_per_s, per_replica * 2.0**-30)))


def sla_reason(request: ServeRequest, steady: SteadyState, rate_per_s: float | None = None) -> str:
    """Why even concurrency 1 misses the limits, every limit it misses."""
    values = (("TTFT", "--max-ttft-ms", steady.ttft_seconds, request.max_ttft_seconds),
              ("TPOT", "--max-tpot-ms", steady.tpot_seconds, request.max_tpot_seconds),
              ("E2E latency", "--max-e2e-ms", steady.e2e_seconds, request.max_e2e_seconds))
    missed = [f"{name} {ms_above(value, limit)} ms exceeds {flag} {seconds_to_ms(limit):g}"
              for name, flag, value, limit in values if limit is not None and value > limit]
    where = f"at concurrency {steady.concurrency:g}" if rate_per_s is None else (
        f"at --request-rate {rate_per_s:g}/s, {steady.concurrency:.1f} requests in flight per replica")
    if steady.waiting_clients > 0 and steady.slot_wait_seconds >= SLOT_WAIT_NOTE_FRACTION * steady.ttft_seconds:
        who = "client(s)" if rate_per_s is None else "request(s)"
        where += (f", {plain(steady.waiting_clients)} more {who} per replica waiting "
                  f"{seconds_to_ms(steady.slot_wait_seconds):,.0f} ms for a slot")
    return f"{'; '.join(missed)} ({where})"


@dataclass(frozen=True)
class ReplicaSetup:
    """What an estimate settles before pricing any step: where the replica's GPUs sit, its
    stages' memory, and the most sequences it may run (replica_setup)."""

    placement: Placement
    stages: tuple[StageMemory, ...]
    max_model_len: int
    kv_tokens: int
    """KV-cache tokens per replica (the least of its stages')."""
    wanted: int
    """wanted_batch."""
    fit: int
    """Running sequences the KV cache holds at their mean footprint."""
    cap: int
    """The most concurrent sequences per replica: wanted, the KV cache, the token budget and the
    benchmark's clients (--max-concurrency) allowing."""
    budget_tokens: int
    """max_num_batched_tokens."""
    constants: StepConstants
    clients_bound: bool
    clients: int | None
    """clients_per_replica: what waits for a slot when fewer run (None: nothing fixed)."""
    engine_cap: int
    """cap before the clients bound it: the sequences the engine would take (--max-num-seqs)."""
    notes: tuple[str, ...]
    """Why cap is below what was wanted."""


def replica_setup(model: ModelSpec, cluster: ClusterSpec, layout: Layout, request: ServeRequest
                  ) -> ReplicaSetup | Rejected:
    """estimate's first part (`cluster` with the request's MoE backend): the layout rejected for
    its structure or memory (as vLLM would refuse it), else its ReplicaSetup."""
    reasons = structural_reasons(model, layout)
    if reasons:
        return Rejected(layout, tuple(reasons))
    placement = place(cluster, layout)
    if request.all2all_backend != DEFAULT_ALL2ALL_BACKEND and layout.ep > 1 and layout.dp_per_ep_group > 1:
        # the EP group: tp ranks of each of d DP ranks, each DP rank owning pp * tp GPUs in order
        spans = placement.ep_group is not None and placement.ep_group.num_nodes > 1
        refusal = deepep_ampere_refusal(cluster, request.all2all_backend, spans)
        if refusal is not None:
            return Rejected(layout, (f"--all2all-backend {request.all2all_backend}: {refusal}",))
    max_model_len = max_model_len_of(model, request)
    wanted = wanted_batch(request, cluster)
    stages = stage_memory(model, cluster, layout, request, wanted)
    fit = kv_limited_sequences(min(s.running_tokens for s in stages), request.input_len, request.output_len,
                               request.decode_context_tokens)
    if fit < wanted:
        # The emitted --max-num-seqs is the batch that fits (also when --batch asks for more),
        # and vLLM's profile run (whose sampler pass scales with max_num_seqs) is sized by it:
        # recompute memory with it.
        stages = stage_memory(model, cluster, layout, request, max(1, fit))
    reasons = memory_reasons(stages, max_model_len)
    if reasons and placement.tp_crosses_node:
        reasons.append(f"tp={layout.tp} crosses a node: its all-reduces would run over "
                       f"{placement.tp_link.kind} (allowed, but slow)")
    if reasons:
        return Rejected(layout, tuple(reasons), memory_overshoot_bytes(stages, max_model_len))
    kv_tokens = min(s.kv_cache_tokens for s in stages)
    cap, notes = choose_batch(request, min(s.running_tokens for s in stages), wanted,
                              windowed=any(s.kv_running_tokens is not None for s in stages))
    budget = max_num_batched_tokens(cluster, request, layout, model)
    if cap > budget:  # vLLM refuses max_num_seqs above the step's token budget (config/scheduler.py, 0.33.0)
        notes.append(f"Token-budget-bound: a step holds at most {budget:,} tokens (--max-num-batched-tokens), one per "
                     f"decoding sequence, so concurrency per replica is {budget:,} (wanted {cap:,}; vLLM refuses "
                     f"--max-num-seqs above the budget)")
        cap = budget
    if request.pool_engine == "sglang":
        cap = sglang_pool_cap(model, cluster, request, layout, stages, max_model_len, cap, notes)
    engine_cap, clients_bound, clients = cap, False, clients_per_replica(request, layout)
    if request.max_concurrency is not None and clients < cap:
        # the benchmark's clients (vllm bench serve --max-concurrency) spread over the replicas
        # by the least-loaded front end: the steady state this layout runs is theirs (also
        # under a larger --batch: the engine may run more than the clients send)
        engine = (f"{seqs_flag(request)} is set to it" if request.batch is None
                  else f"{seqs_flag(request)} is --batch {request.batch:,}")
        # the KV cache's and the budget's caps do not bind below the clients: their notes would
        # call every layout KV-starved at 8 clients a replica where the cache holds 124 (a CLI check)
        notes = without_notes(notes)
        notes.append(f"Client-bound: --max-concurrency {request.max_concurrency:,} keeps at most {clients:,} "
                     f"request(s) in flight on each of the {layout.dp} replica(s), so the steady state runs "
                     f"{clients:,} per replica (the engine would take {cap:,}; {engine})")
        cap, clients_bound = clients, True
    constants = step_constants(model, cluster, layout, request.all2all_backend, request.enable_dbo, request)
    return ReplicaSetup(placement, tuple(stages), max_model_len, kv_tokens, wanted, fit, cap, budget, constants,
                        clients_bound, clients, engine_cap, tuple(notes))


def clients_capacity_per_s(request: ServeRequest, layout: Layout, steady_at: Callable[[int], SteadyState],
                           most_running: int) -> float:
    """The requests/s --max-concurrency's C clients complete over the dp replicas, each holding
    its share in a closed loop (`steady_at`) of at most `most_running` running (the engine's
    cap; the rest wait in its queue): C = q dp + r, r replicas hold q + 1, the rest q (none
    where C < dp). 3 clients over 8 replicas completing 0.72 req/s alone: 3 x 0.72 = 2.16
    req/s, whatever the rate asked."""
    q, r = divmod(request.max_concurrency, layout.dp)
    fuller = r * steady_at(min(q + 1, most_running)).requests_per_second if r else 0.0
    return fuller + ((layout.dp - r) * steady_at(min(q, most_running)).requests_per_second if q else 0.0)


def clients_spread(clients: int, replicas: int) -> str:
    """How `clients` closed-loop clients spread over `replicas` (least-loaded routing), in words."""
    q, r = divmod(clients, replicas)
    if r == 0:
        return f"{q:,} in flight on each of the {replicas} replica(s)"
    if q == 0:
        return f"1 in flight on {r} of the {replicas} replicas (the rest idle)"
    return f"{q + 1:,} in flight on {r} of the {replicas} replicas and {q:,} on the rest"


def clients_per_replica(request: ServeRequest, layout: Layout) -> int | None:
    """The closed-loop clients one replica serves: --max-concurrency spread over the dp
    replicas (the busiest gets the ceiling), else --batch (clients, one per sequence, when no
    --request-rate sets the load); None: no fixed clients (the engine runs what fits, or
    requests arrive at the rate without bound)."""
    if request.max_concurrency is not None:
        return math.ceil(request.max_concurrency / layout.dp)
    if request.batch is not None and request.offered_rate_per_s is None:
        return request.batch
    return None


def sglang_pool_cap(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, layout: Layout,
                    stages: list[StageMemory], max_model_len: int, cap: int, notes: list[str]) -> int:
    """The sequences per replica SGLang runs where its pool is smaller than vLLM's (its default
    reserve out of --mem-fraction-static: emit/sglang.running_per_replica), at least 1 (a pool
    that holds less is refused at launch, emit/sglang.pool_refusal); a note says why."""
    from planner.emit.sglang import planned_running

    running = planned_running(model, cluster, request, layout, stages, max_model_len, cap)
    if running < cap:
        # vLLM's cache and its count do not bind: SGLang's smaller pool does (a CLI read found
        # both notes, 573 and 484 sequences, under one --emit sglang plan)
        notes[:] = without_notes(notes, ("KV-starved",))
        windows = (", and pools its window layers' KV its own way (emit/sglang.pool_sequences)"
                   if model.num_kv_window_layers else "")
        notes.append(f"SGLang-pool-bound: SGLang keeps its default reserve (activations, CUDA graphs) out of "
                     f"--mem-fraction-static{windows}, so its KV pool runs {running:,} sequences per replica "
                     f"(vLLM's at --gpu-memory-utilization: {cap:,}); the plan prices what SGLang runs")
    return min(cap, running)


def api_server_tokenizer(request: ServeRequest, layout: Layout, gpus_per_node: int) -> PromptTokenizer | None:
    """The API servers' prompt tokenizer (cost/ingress.py) in front of a layout's replicas:
    vLLM's one per DP replica (api_server_count = data_parallel_size, its default), SGLang's
    one TokenizerManager per server (sglang_servers); None when the clients send token ids."""
    tokenizer = request.tokenizer
    if tokenizer is None:
        return None
    servers = layout.dp if request.pool_engine == "vllm" else sglang_servers(layout, gpus_per_node)
    return replace(tokenizer, api_servers=servers)


def sglang_servers(layout: Layout, gpus_per_node: int) -> int:
    """The SGLang servers a layout is launched as (planner/emit/sglang.py): one per EP group of
    several DP ranks (DP attention); else one per node for replicas within a node (`--dp-size`
    the replicas on it), one per replica wider than a node."""
    if layout.ep > 1 and layout.dp_per_ep_group > 1:
        return layout.num_ep_groups
    per_node = gpus_per_node // (layout.tp * layout.pp)
    return layout.dp if per_node <= 1 else math.ceil(layout.dp / per_node)


def api_server_tokenizer_note(request: ServeRequest, layout: Layout, gpus_per_node: int,
                              at_rate: bool = True) -> str | None:
    """A note where the offered rate keeps a serial tokenizer thread busy
    TOKENIZER_NOTE_UTILIZATION of the time or more, with the threads per API server that would
    bring it under that (--renderer-num-workers). `at_rate`: the layout is priced at the rate
    (its TTFT holds the queued tokenization the note gives); else at its capacity."""
    tokenizer = api_server_tokenizer(request, layout, gpus_per_node)
    offered = request.offered_rate_per_s
    if tokenizer is None or offered is None:
        return None
    busy = tokenizer.utilization(request.input_len, offered)
    if busy < TOKENIZER_NOTE_UTILIZATION:
        return None
    servers = "the API server" if tokenizer.api_servers == 1 else f"each of the {tokenizer.api_servers} API servers"
    threads = f"{tokenizer.threads} threads" if tokenizer.threads > 1 else "one thread"
    enough = min(MAX_TOKENIZER_WORKERS, math.floor(tokenizer.threads * busy / TOKENIZER_NOTE_UTILIZATION) + 1)
    waits = ""
    if busy >= 1:
        waits = "; past 100% the queue grows as long as requests come, and TTFT with it"
    elif at_rate:
        waits = (f", so a prompt has its tokens {seconds_to_ms(tokenize_seconds(tokenizer, request, True)):,.1f} ms "
                 f"after it arrives on average (its wait for a thread included)")
    return (f"Tokenizer-bound: {servers} tokenizes {plain(offered / tokenizer.api_servers)} prompts/s of "
            f"{request.input_len:,} tokens on {threads} "
            f"({seconds_to_ms(tokenizer.service_seconds(request.input_len)):,.1f} ms a prompt), each thread busy "
            f"{busy:.0%} of the time{waits}: "
            + (f"--renderer-num-workers {enough} (emitted as "
               + ("SGLang's --tokenizer-worker-num" if request.pool_engine == "sglang" else "vLLM's --renderer-num-workers")
               + f") brings it under {TOKENIZER_NOTE_UTILIZATION:.0%}, as would prompts sent as token ids"
               if busy * tokenizer.threads / enough < TOKENIZER_NOTE_UTILIZATION else
               # even the most threads the flag takes leave them busier than that (a review)
               f"even --renderer-num-workers {MAX_TOKENIZER_WORKERS:,} would leave each thread "
               f"{busy * tokenizer.threads / MAX_TOKENIZER_WORKERS:.0%} busy; send prompts as token ids or "
               f"spread the rate over more API servers"))


def tokenize_seconds(tokenizer: PromptTokenizer | None, request: ServeRequest, open_loop: bool = False) -> float:
    """A mean prompt's tokenization in TTFT on the layout's API servers (api_server_tokenizer;
    None: token ids, 0), PromptTokenizer.steady_seconds: at the offered rate in an open loop,
    else one at a time (a closed loop's clients send each request after the last one's E2E:
    the tokenizer is rarely busy)."""
    if tokenizer is None:
        return 0.0
    return tokenizer.steady_seconds(request.input_len, request.offered_rate_per_s if open_loop else None)


def estimate(model: ModelSpec, cluster: ClusterSpec, layout: Layout, request: ServeRequest,
             memo: Memo | None = None) -> ServeEstimate | Rejected:
    """Everything about one (tp, pp, dp) layout, or why vLLM would refuse it (or why it
    cannot meet the SLA). The concurrency per replica: --batch, else the largest that meets
    every SLA up to what the KV cache and max_num_seqs allow.
    `memo`: the steady states and stage steps already priced for this layout, shared by
    estimates whose model, cluster and request differ at most in the SLA limits (a sweep of
    them: planner/frontier.py); None: this estimate's own."""
    base_cluster = cluster
    cluster = with_moe_backend(cluster, request.moe_backend)
    request = for_checkpoint(model, request)  # plan_serving's requests come resolved: a no-op
    memo = memo if memo is not None else Memo()
    setup = memo.get(("setup", layout), replica_setup, model, cluster, layout, request)
    if isinstance(setup, Rejected):
        return setup
    placement, stages, max_model_len, kv_tokens = setup.placement, setup.stages, setup.max_model_len, setup.kv_tokens
    wanted, fit, cap, budget, constants = setup.wanted, setup.fit, setup.cap, setup.budget_tokens, setup.constants
    clients_bound, clients, notes = setup.clients_bound, setup.clients, list(setup.notes)
    priced: dict[tuple, StepTime | StageRates] = memo.get(("priced", layout), dict)
    tokens_per_round, spec_tokens = speculation_shape(request.speculation, request.output_len)

    def rounds(concurrency: float, in_flight: int | None = None) -> Callable[[StepLoad, StepLoad | None], RoundTime]:
        in_flight = in_flight or micro_batches_in_flight(layout, concurrency)
        return lambda load, chunk=None, carriers=1, longest=None: round_time(
            model, cluster, layout, placement, stages, load, max(in_flight, carriers), chunk,
            expert_imbalance(request), constants, priced, carriers, longest)

    # the replicas vLLM's DP front end spreads arrivals over, each to the least loaded (in
    # lockstep EP groups steady_state's busiest-rank terms take that part)
    router = layout.dp if lockstep_ranks(model, layout) == 1 else 1

    # everything in TTFT outside the engine's steps: the fixed first-token cost and the prompt's
    # tokenization (one at a time in a closed loop, queued at the rate in an open one)
    tokenizer = api_server_tokenizer(request, layout, cluster.gpus_per_node)
    first_token = {loop: eff.FIRST_TOKEN_SECONDS + tokenize_seconds(tokenizer, request, loop) for loop in (False, True)}

    def price_steady(concurrency: float, open_loop: bool = False) -> SteadyState:
        # at a rate the mean C is a time average: a decoding request finds C others beside it
        # (steady_state prices n_d + 1 decodes), Poisson in number, each in its own virtual
        # engine up to p and the cap the engine (--max-num-seqs) and the clients allow
        # (in_flight_weights: with k engines busy the round's load is the mean's scaled to
        # the 1 + E[N | k] requests there, so the mix keeps the mean load; round_time's path
        # keeps at least the request's own sequence in its micro-batch); behind a least-loaded
        # router (DP replicas not in lockstep) the others it sits with are fewer (least_loaded's
        # seen, less itself); a closed loop's C are whole and always there
        if open_loop and layout.pp > 1:
            beside = concurrency if router == 1 else least_loaded(concurrency, router).seen - 1
            mixed = [(w, (1 + others) / (1 + beside), rounds(concurrency, k))
                     for k, w, others in in_flight_weights(beside, min(layout.pp, cap))]

            def seconds(load, chunk=None, carriers=1, longest=None) -> float:
                return sum(w * timed(load.scaled(share), chunk, carriers, longest).seconds
                           for w, share, timed in mixed)
        else:
            timed = rounds(min(concurrency + 1, cap) if open_loop else concurrency)

            def seconds(*load_chunk, **path) -> float:
                return timed(*load_chunk, **path).seconds
        return steady_state(concurrency, request.input_len, request.output_len, budget,
                            micro_batches_in_flight(layout, concurrency), seconds,
                            first_token[open_loop], lockstep_ranks(model, layout), tokens_per_round, spec_tokens,
                            request.decode_context_tokens, request.prompt_pairs, open_loop, cap, router, layout.pp,
                            request.schedules_ahead and layout.pp == 1)

    def steady_at(concurrency: int) -> SteadyState:
        return memo.get(("steady", layout, concurrency), price_steady, concurrency)

    def chunks_per_round(concurrency: float) -> float:
        # steady_state's q = lambda S_p from its arrival solution alone, no step priced: the same
        # micro-batches in flight and chunk lanes (up to p) as price_steady passes it
        rate, prefill_rounds, _, _ = arrivals(concurrency, request.input_len, request.output_len, budget,
                                              micro_batches_in_flight(layout, concurrency), tokens_per_round,
                                              spec_tokens, chunk_lanes=layout.pp)
        return rate * prefill_rounds

    def open_at(concurrency: float) -> SteadyState:
        return memo.get(("open", layout, concurrency), price_steady, concurrency, True)

    def rate_bound(concurrency: int) -> float:
        # what the knee search skips by, built once per layout
        return memo.get(("rate bound", layout), knee_rate_bound, model, base_cluster, layout, request,
                        memo)(concurrency)

    has_sla = request.has_sla
    lockstep = lockstep_ranks(model, layout)
    # neither --batch nor the clients fix the concurrency (a knee below the clients would only queue them)
    free = request.batch is None and not clients_bound
    if has_sla and request.batch is None and request.offered_rate_per_s is None \
            and first_failing(request, steady_at(1)) is not None:
        # the SLA search's answer before any knee is sought: even a lone request misses a limit
        # (largest_meeting_sla's 0), so no concurrency meets them (a plan whose every layout
        # missed a TTFT limit alone spent 40 s of 43 on knees, most of it re-planning bigger
        # clusters for serve_search.suggest: Qwen3-30B-A3B, 20,000/16 tokens, --max-ttft-ms 50)
        return sla_rejection(layout, request, steady_at(1))

    def saturation_knee() -> tuple[int | None, str | None]:
        """The fewest sequences within PROMPT_BOUND_TIE_FRACTION of the most tokens/s where
        more would only queue, and its note; (None, None) where tokens/s keep rising to the cap.
        Sought only where the concurrency is the plan's to choose (no rate taken: a layout that
        keeps up with a --request-rate runs what Little's law says, and the search over
        concurrency was 8 s of a 28 s DeepSeek-V3 rate plan)."""
        if free and steady_at(cap).budget_bound:
            # past the token budget more sequences add no tokens/s, only prompt queueing
            knee = peak_throughput_concurrency(steady_at, cap, PROMPT_BOUND_TIE_FRACTION, rate_bound)
            return knee, (f"Prompt-bound: {knee} concurrent sequences per replica give the most output "
                          f"tokens/s (within {PROMPT_BOUND_TIE_FRACTION:.0%}); more (up to {cap}) would only queue "
                          f"for the {budget:,}-token step budget")
        if free and lockstep > 1:
            # ranks in lockstep wait on the busiest one's prompt chunks: tokens/s fall past
            # each whole number of chunks per rank and step
            knee = lockstep_peak_concurrency(steady_at, chunks_per_round, cap, PROMPT_BOUND_TIE_FRACTION)
            return knee, (f"Lockstep-bound: {knee} concurrent sequences per replica give the most output "
                          f"tokens/s (within {PROMPT_BOUND_TIE_FRACTION:.0%}); at more (up to {cap}) the {lockstep} "
                          f"DP ranks stepping together wait on whichever carries the most prompt chunks "
                          f"(at {cap}: {steady_at(cap).busiest_rank_chunks_per_round:.2f} per step against "
                          f"{mean_prompt_chunks(steady_at(cap), request):.2f} on average)")
        return None, None

    binding = None
    offered = request.offered_rate_per_s
    arriving = None  # the open-loop steady state at the offered rate, where the layout keeps up
    missed_at_rate = None  # that steady state, where it misses a limit
    overloaded = False
    convoy_per_s = math.inf  # PP whole prompts at a rate: the most a replica's convoy keeps up with
    convoyed = False  # the rate a replica gets is past it
    if offered is not None:
        if layout.pp > 1 and lockstep == 1:
            # whole prompts that share a step fall into a convoy under arrivals at a rate: each
            # round's ride one micro-batch through every stage (convoy_capacity_per_s). Priced at
            # a rate only (without one no convoy forms, and the search over 16,384 GPUs keeps its time)
            convoy_round = rounds(cap, layout.pp)
            convoy_per_s = convoy_capacity_per_s(lambda load, convoy: convoy_round(load, convoy).seconds,
                                                 request.input_len, request.output_len, budget, tokens_per_round,
                                                 spec_tokens, request.decode_context_tokens, request.prompt_pairs)
        # the rate sets the load: each replica gets R / d (vLLM's DP front end balances them)
        # and holds what Little's law says, up to what it can run (the clients, --batch as its
        # --max-num-seqs, the KV cache). Not up to a budget-bound knee: vLLM admits arrivals past
        # it, and a closed loop's budget-bound state completes the capacity however many queue,
        # so a rate near it had landed at the knee with the closed loop's TTFT (Llama-3.1-70B
        # nvfp4 tp=8, 16,000/8 tokens at 1.25 req/s: 0.84 s at 3 in flight, simulated 2.04 s)
        top = cap
        peaks = ()
        if lockstep > 1:  # the busiest rank's chunks jump where the mean's pass a whole number
            peaks = lockstep_peaks(chunks_per_round, top)
        convoyed = offered / layout.dp >= convoy_per_s
        # a serial tokenizer past its capacity queues prompts without bound before the engines
        tokenized = tokenizer is not None and offered >= tokenizer.capacity_per_s(request.input_len)
        arriving = None if convoyed or tokenized else solve_open_loop(offered / layout.dp, open_at, top, peaks)
        if arriving is None and not (convoyed or tokenized) and steady_at(top).requests_per_second >= offered / layout.dp:
            # past what random arrivals complete at its full count and below it (solve_open_loop's
            # probes), but a full replica admits a waiting request as each one finishes, a closed
            # loop of its slots, which completes more: it keeps up, between the two, with a queue
            # for its slots (with_slot_queue). It had been called overloaded and credited with the
            # closed loop's rate, above the one sent (a review: "complete at most 2.54 req/s" of the
            # 2.5 asked). A fallback: the probes found every such case of a 90-estimate sweep below
            # the cap (Llama-3.1-70B tp=2 pp=2 dp=4 on 2x8 A100 at 10 req/s: 116 in flight)
            mixed = mixed_at_rate(open_at(top), steady_at(top), offered / layout.dp)
            # both states hold the cap; their time-weighted E2E can put Little's law a hair above it
            arriving = replace(mixed, concurrency=min(mixed.concurrency, top))
        if arriving is not None and not clients_bound:
            # Poisson arrivals find every one of the engine's `cap` slots taken now and then
            # (--batch, --max-num-seqs, the KV cache), and wait for one in its queue, in TTFT and
            # E2E; the engine with n in it runs as a closed loop of n does (where --max-concurrency
            # caps them the client holds the excess, before its clock)
            arriving = with_slot_queue(arriving, cap, request.output_len_cv2, layout.dp,
                                       on_geometric_grid(lambda n: steady_at(n).e2e_seconds, cap))
            if math.isinf(arriving.slot_wait_seconds):
                arriving = None  # its slots, once full, complete fewer than the rate: overloaded
        if request.max_concurrency is not None:
            # the clients hold at most --max-concurrency in flight over all replicas (the busiest
            # replica holds `clients`, the ceiling): an open queue that would hold more than that
            # is theirs to bound, and beyond what they complete the rate is held back
            if arriving is not None and arriving.concurrency * layout.dp > request.max_concurrency:
                arriving = None
            # (not past the convoy: the closed loop that keeps up is the spread one, which the
            # convoy's open queue never settles into before the clients hold it)
            if arriving is None and not (convoyed or tokenized) and clients_capacity_per_s(
                    request, layout, steady_at, top) >= offered:
                arriving = clients_at_rate(offered / layout.dp, steady_at, top)
        elif arriving is None and clients is not None and not (convoyed or tokenized):
            # the clients may keep up where the open queue would not
            arriving = clients_at_rate(offered / layout.dp, steady_at, top)
        if arriving is not None and has_sla and not all(sla_check(request, arriving)):
            # it takes the rate only past a limit: within the limits it runs fewer requests at
            # once than the rate brings (capped below, as an overloaded layout is), so it falls
            # behind the rate; fewer sequences complete fewer a second, so no cap keeps up
            missed_at_rate, arriving = arriving, None
        overloaded = arriving is None and clients is None  # clients would hold the excess back
        if overloaded and request.queue_limit_flags:
            # behind the rate, requests queue for as long as they keep coming, in TTFT and E2E
            # alike (both count from the send), so no cap on the running sequences meets either
            # there; one that takes the rate past the limit, capped, falls behind it and its queue
            # misses the limit by more (a review: Llama-3.1-8B tp=8 at 30 req/s took the rate at
            # TTFT 30.1 ms, over 30, and was launched at --max-num-seqs 32, its burst 332 ms).
            # Rejected before the limits' search, with the plainest reason: a lone request's miss,
            # the miss at the rate, or the rate past what a full replica completes
            lone = steady_at(1)
            if not all(sla_check(request, lone)):
                return sla_rejection(layout, request, lone)
            if missed_at_rate is not None:
                return sla_rejection(layout, request, missed_at_rate, offered)
            capacity = min(steady_at(top).requests_per_second, convoy_per_s)
            if tokenized:
                capacity = min(capacity, tokenizer.capacity_per_s(request.input_len) / layout.dp)
            return overload_rejection(layout, request, capacity, offered)
    if arriving is not None:
        batch, steady, binding = cap, arriving, "request-rate"
        # what caps the engine's sequences does not bind below it
        notes = without_notes(notes, (*CAP_NOTES, "Client-bound"))
        capacity = steady_at(top).requests_per_second
        within = (f"takes up to {plain(capacity)} req/s ({top:,} in flight)" if capacity <= convoy_per_s else
                  f"takes up to {plain(convoy_per_s)} req/s before its micro-batches' convoy falls behind (the "
                  f"spread steady state's {plain(capacity)} at {top:,} in flight is out of its reach)")
        running_e2e = arriving.e2e_seconds - arriving.slot_wait_seconds
        waits = arriving.slot_wait_seconds >= SLOT_WAIT_NOTE_FRACTION * arriving.ttft_seconds
        notes.append(f"Rate-bound: --request-rate {offered:g}/s gives each of the {layout.dp} replica(s) "
                     f"{plain(offered / layout.dp)} req/s, which hold {arriving.concurrency:.1f} requests in flight on "
                     f"average (Little's law: rate x E2E {seconds_to_ms(running_e2e):,.0f} ms"
                     f"{' once running' if waits else ''}); a replica {within}")
        if waits:
            limit = (f"--batch, the engine's {seqs_flag(request)}" if request.batch is not None else
                     "what the KV cache holds" if fit < wanted else f"the engine's default {seqs_flag(request)}")
            notes.append(f"Slot-bound: with at most {cap:,} sequence(s) running per replica ({limit}), arrivals at "
                         f"{plain(offered / layout.dp)}/s a replica find every slot busy at times and wait "
                         f"{seconds_to_ms(arriving.slot_wait_seconds):,.0f} ms for one on average "
                         f"({plain(arriving.waiting_clients)} waiting per "
                         f"replica; a queue in front of an engine that slows as it fills), in TTFT and E2E latency")
    elif has_sla and request.batch is None:
        largest, binding = largest_meeting_sla(request, steady_at, cap)
        if largest == 0:
            return sla_rejection(layout, request, steady_at(1))
        knee, knee_note = saturation_knee()
        if knee is not None and knee < cap and largest >= knee:
            # the limits allow the knee: every sequence past it only queues (as without limits).
            # Goodput stays monotone in the limits: below the knee every rate is under the bar
            # the knee clears
            batch, binding = knee, "saturation"
            notes.append(knee_note)
        else:
            # tokens/s still rising at the top, below the token budget's knee: the top is the peak
            rising = (largest == 1 or steady_at(largest).throughput_tokens_per_second
                      >= steady_at(largest - 1).throughput_tokens_per_second)
            batch = largest if rising and not steady_at(largest).budget_bound else peak_throughput_concurrency(
                steady_at, largest, bound=rate_bound)
            if batch < largest:
                binding = "saturation"
                why = ("would only queue for the prompt budget" if lockstep == 1 else
                       f"would lengthen the {lockstep} lockstep DP ranks' steps (the busiest rank's prompt chunks) "
                       f"more than they add")
                notes = [f"Saturated: {batch} concurrent sequences per replica give the most output tokens/s "
                         f"within the limits (they allow {largest}); more {why}"]
            elif binding is None:
                binding = "kv-cache" if fit < wanted else "max-num-seqs"
            else:
                names = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E latency"}
                notes = [f"SLA-bound: {batch} concurrent sequences per replica, the most whose mean "
                         f"{names[binding]} under load meets the limit (the KV cache and {seqs_flag(request)} allow {cap})"]
    else:
        knee, knee_note = saturation_knee()
        batch = cap if knee is None else knee
        if batch < cap:
            notes.append(knee_note)
    if arriving is None:
        steady = steady_at(batch)
        if batch < cap:  # the cache's and the budget's caps do not bind below the cap (a CLI read:
            # "KV-starved ... so concurrency is 123" beside a batch of 97 the prompt budget chose)
            notes = without_notes(notes)
    if missed_at_rate is not None and steady.requests_per_second >= offered / layout.dp:
        # capped at the limit it would still take the rate: the open loop at the rate and the
        # capped steady state disagree at the limit, so the miss at the rate stands (rejected)
        return sla_rejection(layout, request, missed_at_rate, offered)
    convoy_why = (f"vLLM puts every prompt that arrived during a round into the next micro-batch, which carries "
                  f"them through all {layout.pp} stages in turn while the others wait behind it") if convoyed else ""
    if overloaded and missed_at_rate is not None:
        notes.append(f"Overloaded within the limits: {sla_reason(request, missed_at_rate, offered)}; within them "
                     f"each of the {layout.dp} "
                     f"replica(s) completes at most {plain(steady.requests_per_second)} req/s (at {steady.concurrency:g} "
                     f"in flight) of the {plain(offered / layout.dp)} asked: requests queue for as long as they keep "
                     f"coming, so the times shown are at that concurrency, before that queue")
    elif overloaded and convoyed:
        notes.append(f"Overloaded (convoy): --request-rate {offered:g}/s asks {plain(offered / layout.dp)} req/s of each "
                     f"of the {layout.dp} replica(s); {convoy_why}, and past {plain(convoy_per_s)} req/s a replica "
                     f"that round outlasts the arrivals it carries: requests queue for as long as they keep coming "
                     f"(the times shown are at the spread "
                     f"steady state's capacity, {plain(steady.requests_per_second)} req/s at {steady.concurrency:g} in "
                     f"flight, which the convoy does not reach)")
    elif overloaded and tokenized:
        notes.append(f"Overloaded (tokenizer): --request-rate {offered:g}/s of {request.input_len:,}-token prompts is "
                     f"past the {plain(tokenizer.capacity_per_s(request.input_len))} prompts/s the API servers' "
                     f"tokenizer threads take, one prompt at a time each: the prompts queue before the engines for "
                     f"as long as they keep coming (the times shown are the engines' at capacity, "
                     f"{plain(steady.requests_per_second)} req/s a replica, before that queue)")
    elif overloaded:
        notes.append(f"Overloaded: --request-rate {offered:g}/s asks {plain(offered / layout.dp)} req/s of each of the "
                     f"{layout.dp} replica(s), which complete at most {plain(steady.requests_per_second)} req/s (at "
                     f"{steady.concurrency:g} in flight): requests queue for as long as they keep coming, so the "
                     f"times shown are at capacity, before that queue")
    elif offered is not None and arriving is None and convoyed:
        notes.append(f"Client-held (convoy): --request-rate {offered:g}/s asks {plain(offered / layout.dp)} req/s of "
                     f"each of the {layout.dp} replica(s), past the {plain(convoy_per_s)} req/s its micro-batches carry "
                     f"in a convoy ({convoy_why}); the open queue grows until the clients hold it, so the benchmark "
                     f"runs below the rate (the times shown are those of the clients' closed loop, "
                     f"{clients_spread(request.max_concurrency, layout.dp)}, which the convoy may not reach)")
    elif offered is not None and arriving is None and tokenized:
        notes.append(f"Client-held (tokenizer): --request-rate {offered:g}/s of {request.input_len:,}-token prompts is "
                     f"past the {plain(tokenizer.capacity_per_s(request.input_len))} prompts/s the API servers' "
                     f"tokenizer threads take; the queue before the engines grows until the clients hold it, so the "
                     f"benchmark runs below the rate (the times shown are those of the clients' closed loop, "
                     f"{clients_spread(request.max_concurrency, layout.dp)})")
    elif offered is not None and arriving is None:
        notes.append(f"Client-held: --request-rate {offered:g}/s, but --max-concurrency {request.max_concurrency:,} "
                     f"keeps {clients_spread(request.max_concurrency, layout.dp)}, which complete "
                     f"{plain(clients_capacity_per_s(request, layout, steady_at, batch))} req/s in all: the benchmark runs "
                     f"below the rate (its requests wait for a slot on the client)")
    tokenizer_note = api_server_tokenizer_note(request, layout, cluster.gpus_per_node,
                                               at_rate=arriving is not None)
    if tokenizer_note:
        notes.append(tokenizer_note)
    if arriving is None and clients is not None and clients > batch:
        # closed loop (no rate, or one the clients cannot keep up with): the clients the
        # engine does not run wait in its queue for a slot, in TTFT and E2E as the benchmark
        # times them (it starts a request's clock when the client sends it)
        steady = with_waiting_clients(steady, clients)
        wait = steady.slot_wait_seconds
        waited = f"{wait:,.1f} s" if wait >= 1 else f"{seconds_to_ms(wait):,.0f} ms"
        notes.append(f"The other {clients - batch:,} clients per replica wait {waited} in the engine's queue "
                     f"for a running request to finish (in TTFT and E2E latency)")
    decode_only = steady.decode_round_seconds / steady.tokens_per_round
    if request.output_len > 1 and steady.tpot_seconds > 0 and 1 - decode_only / steady.tpot_seconds >= PROMPT_SHARE_NOTE_FRACTION:
        # V0 without chunked prefill runs each prompt in a step of its own, which the decodes wait
        # behind (the note spoke of chunks riding along and of disaggregation, which V0 lacks; a CLI read)
        whole = (not request.engine_versions.vllm_release.v1_engine and request.pool_engine == "vllm"
                 and not v0_chunked_prefill(model, request))
        per = "round" if layout.pp > 1 else "step"  # with PP a round spans p steps (a CLI read)
        shared = ("the rest is the other requests' prompts, each in steps of their own that the decodes wait "
                  "behind (V0 without chunked prefill)" if whole else
                  "the rest is the other requests' prompt chunks riding in the same steps")
        notes.append(f"Prompts share the steps: TPOT {seconds_to_ms(steady.tpot_seconds):,.1f} ms under load, of which "
                     f"the decode work is {seconds_to_ms(decode_only):,.1f} ms; {shared} "
                     f"({steady.prefill_tokens_per_step:,.0f} prompt tokens per {per} on average)"
                     # with PP part of it is the other stages idling while a chunk's micro-batch paces the
                     # round (explain splits the two; the note had called it all prompt work: a CLI read)
                     + (", and the other stages idling while a chunk's micro-batch paces the round (plan explain "
                        "splits the two)" if layout.pp > 1 else "")
                     + (": fewer concurrent sequences (--batch, --max-tpot-ms) lower it" if whole else
                        ": fewer concurrent sequences (--batch, --max-tpot-ms) or disaggregated prefill lower it"))
    if (request.batch is None and request.objective == "throughput" and not has_sla and batch == wanted < fit
            and arriving is None):
        notes.append(f"Concurrency {wanted:,} per replica is vLLM's default --max-num-seqs on {cluster.gpu.name}; the "
                     f"KV cache would run {fit:,} at once (--batch raises it)")
    ttft_ok, tpot_ok, e2e_ok = sla_check(request, steady)
    if has_sla and not (ttft_ok and tpot_ok and e2e_ok):
        if steady.waiting_clients > 0 and batch < cap:
            # capped below the clients by the limits, the rest queue for a slot: running every
            # slot comes closest (at the rate where it takes it, else all clients or slots busy)
            missed, rate = ((missed_at_rate, offered) if missed_at_rate is not None
                            else (with_waiting_clients(steady_at(cap), clients), None))
            return sla_rejection(layout, request, missed, rate)
        return sla_rejection(layout, request, steady, None if arriving is None else offered)
    if has_sla and request.batch is not None and arriving is None:
        binding = "batch"
    if clients_bound and arriving is None and batch == cap and binding in (None, "kv-cache", "max-num-seqs"):
        binding = "clients"  # --max-concurrency's clients hold the load, as the Client-bound note says
    # at a rate: the mean in flight, and at least the micro-batches a prompt round fills (a
    # mix of two states keeps the busier one's carriers)
    running = batch if arriving is None else max(steady.concurrency, steady.prompt_carriers)
    in_flight = micro_batches_in_flight(layout, running)
    decode_load = StepLoad(steady.decode_seqs, steady.decode_seqs * request.decode_context_tokens,
                           spec_tokens=steady.decode_seqs * spec_tokens)
    decode_round = rounds(running)(decode_load)
    steps = decode_round.stage_steps
    slowest = decode_round.slowest_stage
    stage_seconds = steps[slowest].seconds
    chunks = steady.prompt_chunks
    chunk = request.input_len / chunks
    prompt_chunk = StepLoad(0, 0, chunk, request.prompt_pairs / chunks, 1 / chunks)
    ranks = lockstep_ranks(model, layout)
    if ranks > 1:  # the experts and their exchange see the group's mean, as the steady state prices TTFT
        q = steady.prefill_tokens_per_step * steady.prefill_rounds / request.input_len
        prompt_chunk = replace(prompt_chunk, expert_tokens=chunk * ((1 + (ranks - 1) * q) / ranks if q <= 1 else q))
    prompt_round = rounds(running)(decode_load, prompt_chunk, steady.prompt_carriers, steady.path_chunk)
    lone = steady_at(1)
    # a decoding sequence's rows: its token and its drafts
    tokens_per_batch = max(1, math.ceil(steady.decode_seqs * (1 + spec_tokens) / in_flight))
    message_bytes = tokens_per_batch * model.hidden_size * activation_bytes_per_element(model)
    allreduce, source = tp_allreduce_seconds_per_layer(cluster, layout, placement, message_bytes)
    allreduce += qk_norm_allreduce_seconds(model, cluster, layout, placement, tokens_per_batch)
    exchange = ep_exchange_seconds_per_moe_layer(model, cluster, layout, placement, tokens_per_batch,
                                                 request.all2all_backend)
    collectives = serving_collectives(model, cluster, layout, placement, tokens_per_batch, in_flight,
                                      stages[slowest].num_layers, request.input_len, request.all2all_backend,
                                      None if ranks == 1 else prompt_chunk.moe_tokens * chunks, chunks,
                                      stage_moe_layers(model, stages[slowest]))
    if placement.tp_crosses_node:
        notes.append(
            f"tp={layout.tp} crosses a node: every layer's all-reduces run over "
            f"{placement.tp_link.kind} (allowed, but slow)"
        )
    if not model.is_mla and layout.tp > model.num_key_value_heads:
        copies = layout.tp // model.num_key_value_heads
        notes.append(f"tp={layout.tp} is more than the {model.num_key_value_heads} KV heads: vLLM and SGLang give "
                     f"every GPU one KV head, each held by {copies} GPUs, so the KV cache per token stops shrinking "
                     f"beyond tp={model.num_key_value_heads}")
    if request.all2all_backend == "deepep_high_throughput" and layout.ep > 1 and layout.dp_per_ep_group > 1:
        notes.append("vLLM turns CUDA graphs off under deepep_high_throughput with data parallelism "
                     "(vllm/config/compilation.py at 0.33.0): decode steps launch eagerly, a host cost the plan "
                     "does not price (deepep_low_latency keeps the graphs)")
    if steady.budget_bound:
        notes.append(
            f"prompt-bound: prompts and decodes need more than {budget:,} tokens per step "
            f"(--max-num-batched-tokens), so requests queue {steady.queue_rounds:.1f} steps for their prefill"
        )
    if steady.lockstep_ranks > 1:
        mean_chunks = mean_prompt_chunks(steady, request)
        notes.append(
            f"{steady.lockstep_ranks} DP ranks step in lockstep (EP across them): a step lasts as long as "
            f"its busiest rank, which carries {steady.busiest_rank_chunks_per_round:.2f} prompt chunks per "
            f"step against {mean_chunks:.2f} on average"
        )
    worst = max(range(len(stages)), key=lambda i: stages[i].weights_bytes + stages[i].activation_bytes)
    replicas_tokens_per_second = layout.dp * steady.throughput_tokens_per_second
    if overloaded and convoyed:
        # the convoy completes at most convoy_per_s a replica, below the spread steady state's
        # capacity its times are shown at: the tokens/s it serves are the convoy's (a CLI read:
        # 376 tok/s where it keeps up with 0.912 req/s of 256 tokens, 233)
        replicas_tokens_per_second = min(replicas_tokens_per_second,
                                         layout.dp * convoy_per_s * request.output_len)
    if clients_bound and arriving is None and batch == cap and request.max_concurrency % layout.dp:
        # C = q dp + r clients: r replicas run ceil(C / dp) = batch of them, the rest one fewer
        replicas_tokens_per_second = request.output_len * clients_capacity_per_s(request, layout, steady_at, batch)
    return ServeEstimate(
        layout=layout,
        placement=placement,
        stages=tuple(stages),
        worst_stage=worst,
        kv_cache_tokens=kv_tokens,
        max_model_len=max_model_len,
        max_concurrency=min(s.sequences_that_fit(max_model_len) for s in stages),
        batch=batch,
        max_num_seqs=max(batch, setup.engine_cap) if clients_bound else batch,
        batches_in_flight=in_flight,
        stage_step_seconds=stage_seconds,
        tp_allreduce_seconds_per_layer=allreduce,
        allreduce_message_bytes=message_bytes,
        allreduce_source=source,
        ep_exchange_seconds_per_moe_layer=exchange,
        pp_hop_seconds=decode_round.hop_seconds,
        bubble_fraction=mean_bubble_fraction(layout.pp, decode_round, prompt_round, mean_prompt_chunks(steady, request),
                                             steady.prompt_carriers),
        decode_bound=steps[slowest].decode_work_bound,
        ttft_seconds=steady.ttft_seconds,
        tpot_seconds=steady.tpot_seconds,
        request_latency_seconds=steady.e2e_seconds,
        throughput_tokens_per_second=replicas_tokens_per_second,
        notes=tuple(notes),
        decode_steps=steps,
        slowest_stage=slowest,
        prefill_stage_seconds=tuple(step.seconds for step in prompt_round.chunk_steps or prompt_round.stage_steps),
        collectives=collectives,
        steady=steady,
        # no load at all: the pure decode round (in lockstep the other ranks idle too)
        tpot_batch1_seconds=lone.decode_round_seconds / lone.tokens_per_round,
        sla=SlaCheck(ttft_ok, tpot_ok, e2e_ok, binding),
        decode_round=decode_round,
        prompt_round=prompt_round,
        offered_rate_per_s=None if arriving is None else offered,
        overloaded=overloaded,
        convoy_rate_per_s=convoy_per_s,
    )


WHOLE_SHAPES_MARGIN = 0.04
"""How far above B / R(B) a MoE replica's n / R(n) may stand at some n below B (the decode
round R of n sequences; serving_bounds' argument). A MoE step's expert GEMMs run whole rows
per expert on a whole count of experts per GPU (serving_time.mlp_gemms rounds both), so R(n)
steps where a count rounds up and n / R(n) can dip below its rising trend: by up to 12% from one
n to the next on Llama 4 Scout at ep 4, where 4 experts a GPU round; those dips sit far below
the cap's value. Near the cap the largest excess of max_{n <= B} n / R(n) over B / R(B) was
0.27% over every n of every layout of 7 MoE pairs under three default-length requests
(DeepSeek-V3 tp=8 ep=8 on 4x8 H200; dense models: none), and 1.06% where long prompts leave a
small cap (a review's sweep of 8,000 to 96,000-token prompts: Kimi-K2.5 tp=2 dp=8 ep=8 on 2x8
H200, 8,000/1,024 tokens, B = 78; DeepSeek-V3 tp=8 ep=8 at 16,000 tokens, B = 39: 0.44%). A
policy, not a fit: about four times the largest, checked by tests/perf/test_bounded_serving.py
on the worst layouts."""


@dataclass(frozen=True)
class LayoutBounds:
    """What estimate() cannot go past on one layout, whatever concurrency it settles on
    (serving_bounds): what the bounded search (serve_search.bounded_evaluation) skips by."""

    max_tokens_per_second: float
    """Output tokens/s of all the replicas, at most."""
    min_tpot_seconds: float
    """TPOT under load and at one sequence (tpot_batch1_seconds), at least."""


def serving_bounds(model: ModelSpec, cluster: ClusterSpec, layout: Layout, request: ServeRequest,
                   memo: Memo | None = None) -> LayoutBounds | Rejected:
    """The layout's LayoutBounds for a request without an offered rate, from two decode rounds
    (or the Rejected estimate() returns for its structure or memory, found the same way).
    A steady state of C clients (continuous_batching.steady_state) runs lambda requests a round
    and n_d = lambda D decoding sequences (D = (O - 1) / e rounds a request decodes, e tokens
    a round), and a request spends C / lambda rounds from arrival to its last token: D + S_p
    below the budget (its S_p prompt rounds take at least S_p rounds, prompt_service_seconds),
    the whole cycle at it; every round at least the decode round R(n_d), as a chunk or more
    tokens only add time. So E2E >= (C / lambda) R(n_d) and the tokens/s C O / E2E are at most
    (O / D) n_d / R(n_d), with n_d <= C <= B (ReplicaSetup.cap). Two facts of the step's
    terms make the rest: each grows with the load, and none grows faster than the tokens it
    prices (weight reads and fixed costs stay, GEMMs at u(M) = M / (M + M_half) cost
    (M + M_half) in rows, the touched experts grow at most like the tokens, transfers are
    latency plus bytes), so n / R(n) never falls as n grows, up to a MoE step's whole rows
    and experts (WHOLE_SHAPES_MARGIN, which multiplies the c / R(c) term). From C >= p (k = p micro-batches
    in flight) that gives n_d / R(n_d) <= B / R(B); below p (k = ceil(C)) every round is at
    least the lone micro-batch's path at no load, R_0 (round_time's path only grows with
    the load), and n_d < p. Tokens/s <= d (O / D) max(B / R(B), min(p, B) / R_0). TPOT (the
    mean round a decoding request sees over e, and the one-sequence TPOT) >= R_0 / e. Under
    dual-batch overlap no tokens/s bound (inf): its two-halves step breaks the monotone n / R(n).
    tests/perf/test_bounded_serving.py checks both against every layout of the shipped pairs."""
    inputs = bound_inputs(model, cluster, layout, request, memo)
    if isinstance(inputs, Rejected):
        return inputs
    lone_path, replica_bound = replica_rate_bound(model, layout, request, inputs)
    return LayoutBounds(layout.dp * replica_bound(inputs.setup.cap), lone_path / inputs.tokens_per_round)


LONE_TTFT_FLOOR_MARGIN = 0.8
"""lone_ttft_floor is not a strict bound: over 580 layouts (Qwen3-30B-A3B, Llama-3.1-8B/70B/405B,
DeepSeek-V3, gpt-oss-120b; 1,024 to 64,000-token prompts, a 1,024-token budget) it stood at most
5.9% above the lone request's TTFT that estimate() prices (DeepSeek-V3 tp=1 pp=8 ep=4, 4,096
tokens in 1,024-token chunks: the pipelined chunks' rounds, which the steady state prices at the
mean chunk's), and down to 0.66 of it. Its users take 0.8 of it, a margin of 3.4 times that, for
fixed lengths only: a --dataset mix's mean pairs (its lengths' squares) put it up to 1.96 times
the lone TTFT (a review; serve_search._feasible skips no re-plan for a mix)."""


def lone_ttft_floor(model: ModelSpec, cluster: ClusterSpec, layout: Layout, request: ServeRequest) -> float:
    """About the least TTFT the layout gives even a lone request, from one pass of its prompt's
    chunks through the stages at no other load (inf where the layout does not fit): the fixed
    first-token cost and the prompt's tokenization, then N = ceil(I / budget) chunks of I / N
    tokens (and 1 / N of its causal pairs), the first through every stage and the other N - 1
    behind it at the slowest stage's pace. Some stage steps where estimate() prices a steady
    state (serve_search._feasible skips a re-plan whose every layout stands above an SLA limit by
    LONE_TTFT_FLOOR_MARGIN)."""
    cluster = with_moe_backend(cluster, request.moe_backend)
    setup = replica_setup(model, cluster, layout, request)
    if isinstance(setup, Rejected):
        return math.inf
    first_token_seconds = eff.FIRST_TOKEN_SECONDS + tokenize_seconds(
        api_server_tokenizer(request, layout, cluster.gpus_per_node), request)
    num_chunks = math.ceil(request.input_len / setup.budget_tokens)
    chunk_tokens = request.input_len / num_chunks
    chunk = StepLoad(0, 0, chunk_tokens, request.prompt_pairs / num_chunks, 1 / num_chunks,
                     chunk_tokens / lockstep_ranks(model, layout))
    stage_seconds = [step.seconds for step in stage_step_times(model, cluster, layout, setup.placement, setup.stages,
                                                               chunk, expert_imbalance(request), setup.constants)]
    return first_token_seconds + sum(stage_seconds) + (num_chunks - 1) * max(stage_seconds)


def knee_rate_bound(model: ModelSpec, cluster: ClusterSpec, layout: Layout, request: ServeRequest,
                    memo: Memo) -> Callable[[int], float]:
    """replica_rate_bound's c -> tokens/s from the layout's BoundInputs (`cluster` before the
    request's MoE backend, as serving_bounds takes it); a layout estimate() rejects is never
    searched, so its setup is there."""
    inputs = bound_inputs(model, cluster, layout, request, memo)
    assert not isinstance(inputs, Rejected)
    return replica_rate_bound(model, layout, request, inputs)[1]


def replica_rate_bound(model: ModelSpec, layout: Layout, request: ServeRequest,
                       inputs: BoundInputs) -> tuple[float, Callable[[int], float]]:
    """(R_0, the lone micro-batch's path at no load; c -> the output tokens/s one replica cannot
    pass at concurrency c): serving_bounds' argument with the cap B replaced by c (n_d <= C <= c),
    (O / D) max(m c / R(c), min(p, c) / R_0), m = 1 + WHOLE_SHAPES_MARGIN for MoE (else 1);
    infinite for one output token and under dual-batch overlap. It holds at every concurrency of
    the knee searches it serves (tests/perf/test_bounded_serving.py; a review's 4,100 searches
    over 228 plans of 7 models: none passed it), but need not grow with c: a MoE step's whole
    expert counts make it fall by up to 12% from one c to the next (Llama 4 Scout at ep 4), so
    its users check each c on its own. The
    knee search (peak_throughput_concurrency) skips the concurrencies it puts below its bar."""
    cluster, setup, priced, tokens_per_round, spec_tokens, decode_rounds = inputs

    def decode_round_seconds(seqs: int, polled: bool = True) -> float:
        load = StepLoad(seqs, seqs * request.decode_context_tokens, spec_tokens=seqs * spec_tokens)
        timed = round_time(model, cluster, layout, setup.placement, setup.stages, load,
                           micro_batches_in_flight(layout, seqs), None, expert_imbalance(request), setup.constants,
                           priced)
        return timed.seconds if polled else timed.unpolled_seconds

    # R_0: k = 1, nothing to decode, one row priced; without the engine's sleeps after the
    # empty phases of a lone micro-batch, which a fuller pipeline does not wait out
    lone_path = decode_round_seconds(0, polled=False)
    if decode_rounds == 0 or request.enable_dbo:
        # one output token: nothing bounds the prompt-only cycle here; dual-batch overlap prices a
        # step as two halves, 2 max(work, exchange): n / R(n) need not grow with n there
        # (DeepSeek-V3 tp=1 pp=4 ep=2 on H200 over DeepEP's low-latency kernels ran 8,604 tok/s
        # against a bound of 8,559 from the cap), so no tokens/s bound (as the prompts')
        return lone_path, lambda concurrency: math.inf

    # whole rows per expert and whole experts per GPU (mlp_gemms) let n / R(n) dip below its
    # trend; the margin covers those dips below the cap
    margin = 1 + WHOLE_SHAPES_MARGIN if model.is_moe else 1.0

    def bound(concurrency: int) -> float:
        per_round = margin * concurrency / decode_round_seconds(concurrency)
        if layout.pp > 1:
            per_round = max(per_round, min(layout.pp, concurrency) / lone_path)
        return request.output_len / decode_rounds * per_round

    return lone_path, bound


def prompt_bound_tokens_per_second(model: ModelSpec, cluster: ClusterSpec, layout: Layout, request: ServeRequest,
                                   memo: Memo | None = None) -> float:
    """A second bound on the output tokens/s of all the replicas, from the prompts' chunks (the
    bounded search takes the smaller of it and LayoutBounds.max_tokens_per_second, pricing it only
    where that one passes); math.inf where it does not apply: one output token, dual-batch
    overlap, or a concurrency up to the cap B (ReplicaSetup.cap) that reaches the token budget.
    Below the budget C <= B clients run lambda = C / (D + S_p) requests a round, S_p <= N prompt
    rounds, N = ceil(I / (budget - w max(1, B / p))) the most chunks a prompt is cut into (a
    micro-batch's decodes take at most w max(1, C / p) of its budget, w tokens each).
    P: every round that carries a chunk lasts at least the path of one micro-batch carrying the
    smallest chunk, I / N tokens (their causal pairs over N, the experts seeing 1 / d of them in
    lockstep), and nothing else (round_time at no other load). A request's TTFT holds its own
    prompt round, and its D decode rounds carry the other requests' chunks, a share at least
    g = (1 - 1 / C) min(1, lambda) of them (q = lambda S_p chunks a round, its own 1 / C left
    out; every round once q > 1), so E2E >= P (1 + D g) and tokens/s = C O / E2E <= (O / P)
    C / (1 + D g): C / (1 + D (1 - 1 / C)) grows with C (lambda >= 1, C >= 2), at most
    B^2 / (B + D (B - 1)); C (D + S_p) / (S_p + D C) grows with C and S_p (lambda < 1), at
    most B (D + N) / (N + D B).
    S: with one chunk a prompt (N = 1) and lambda >= 1 (C >= D + 1) a round carries lambda I
    prompt tokens on its busiest rank (q - 1 spread over the k micro-batches, one in the
    carrier; the experts see them all, less 1 / C of a chunk in lockstep), and the busiest
    stage works them all: k steps of a share cost at least one step of the sum (a step's cost
    per token never grows with its tokens, as serving_bounds'), so a decode round lasts at
    least S(lambda I), the slowest stage's step of those tokens alone (the experts seeing
    D / (D + 1) of them). Tokens/s <= C O / (D (1 - 1 / C) S(lambda I)) <= ((D + 1) / D)^2 O
    lambda / S(lambda I), and lambda / S(lambda I) grows with lambda up to B / (D + 1).
    Per replica: max(the lambda < 1 bound, min of the two lambda >= 1 bounds), times d.
    docs/cost-model.md (The bounded serving search)."""
    inputs = bound_inputs(model, cluster, layout, request, memo)
    if isinstance(inputs, Rejected) or inputs.decode_rounds == 0 or request.enable_dbo:
        return math.inf
    cluster, setup, priced, _, spec_tokens, decode_rounds = inputs
    cap, budget_tokens, prompt_tokens = setup.cap, setup.budget_tokens, request.input_len
    decodes_per_micro_batch = max(1.0, cap / layout.pp)  # C / k at most, for C <= B
    width = 1 + spec_tokens  # a decoding sequence's tokens a step
    if (prompt_tokens + decode_rounds * width) * decodes_per_micro_batch > budget_tokens * (decode_rounds + 1):
        return math.inf  # some concurrency up to the cap fills the budget: its requests queue for it
    num_chunks = math.ceil(prompt_tokens / max(budget_tokens - width * decodes_per_micro_batch, 1.0))
    chunk_tokens = prompt_tokens / num_chunks
    chunk = StepLoad(0, 0, chunk_tokens, request.prompt_pairs / num_chunks, 0.0,
                     chunk_tokens / lockstep_ranks(model, layout))
    path_seconds = round_time(model, cluster, layout, setup.placement, setup.stages, StepLoad(0, 0), 1, chunk,
                              expert_imbalance(request), setup.constants, priced).seconds
    # requests/s of one replica (C / E2E) at most, below and above one request a round
    below_per_s = cap * (decode_rounds + num_chunks) / (num_chunks + decode_rounds * cap) / path_seconds
    above_per_s = cap * cap / (cap + decode_rounds * (cap - 1)) / path_seconds
    requests_per_round = cap / (decode_rounds + 1)  # lambda at the cap
    if num_chunks == 1 and requests_per_round >= 1:
        share = decode_rounds / (decode_rounds + 1)
        decodes = requests_per_round * decode_rounds
        tokens = StepLoad(decodes, decodes * request.decode_context_tokens, requests_per_round * prompt_tokens,
                          requests_per_round * request.prompt_pairs, requests_per_round,
                          (decodes * width + requests_per_round * prompt_tokens) * share, decodes * spec_tokens)
        steps = stage_step_times(model, cluster, layout, setup.placement, setup.stages, tokens,
                                 expert_imbalance(request), setup.constants, priced)
        above_per_s = min(above_per_s, requests_per_round / (share * share * max(step.seconds for step in steps)))
    return layout.dp * request.output_len * max(below_per_s, above_per_s)


class BoundInputs(NamedTuple):
    """What serving_bounds and prompt_bound_tokens_per_second both start from."""

    cluster: ClusterSpec
    """With the request's MoE backend (with_moe_backend)."""
    setup: ReplicaSetup
    priced: dict
    """The layout's stage steps already priced (the memo's, shared with estimate)."""
    tokens_per_round: float
    spec_tokens: int
    decode_rounds: float
    """D = (O - 1) / e: rounds a request decodes."""


def bound_inputs(model: ModelSpec, cluster: ClusterSpec, layout: Layout, request: ServeRequest,
                 memo: Memo | None) -> BoundInputs | Rejected:
    """The layout's setup (memoised as estimate memoises it) and the request's decode shape, or
    the Rejected estimate() returns for the layout's structure or memory."""
    cluster = with_moe_backend(cluster, request.moe_backend)
    request = for_checkpoint(model, request)  # plan_serving's requests come resolved: a no-op
    memo = memo if memo is not None else Memo()
    setup = memo.get(("setup", layout), replica_setup, model, cluster, layout, request)
    if isinstance(setup, Rejected):
        return setup
    tokens_per_round, spec_tokens = speculation_shape(request.speculation)
    return BoundInputs(cluster, setup, memo.get(("priced", layout), dict), tokens_per_round, spec_tokens,
                       max(request.output_len - 1, 0) / tokens_per_round)


def micro_batches_in_flight(layout: Layout, concurrency: float) -> int:
    """vLLM's virtual engines busy at once: one per pipeline stage, at most one per running
    request (at a request rate the mean number in flight, fractional: rounded up)."""
    return max(1, min(layout.pp, math.ceil(concurrency)))


def largest_meeting_sla(request: ServeRequest, steady_at: Callable[[int], SteadyState],
                        cap: int) -> tuple[int, str | None]:
    """The largest concurrency in [1, cap] whose steady state meets every limit, by bisection
    (TTFT, TPOT and E2E grow with concurrency), and the limit that stops the next one
    (None when cap itself meets them). 0 when even a lone request misses."""
    if first_failing(request, steady_at(cap)) is None:
        return cap, None
    if first_failing(request, steady_at(1)) is not None:
        return 0, None
    good, bad = 1, cap
    while bad - good > 1:
        middle = (good + bad) // 2
        if first_failing(request, steady_at(middle)) is None:
            good = middle
        else:
            bad = middle
    return good, first_failing(request, steady_at(bad))


PROMPT_SHARE_NOTE_FRACTION = 0.5
"""The plan says that prompts set TPOT when other requests' prompt chunks take half of it or
more (presentation only: no number depends on it)."""
PROMPT_BOUND_TIE_FRACTION = 0.03
"""A budget-bound layout without --batch or an SLA runs the fewest sequences within 3% of its
most output tokens/s: past the budget's knee tokens/s stay flat (or creep by parts per thousand
as the step mix shifts) while each added sequence queues its prompt behind the others (Llama-3.1-8B on one H100 at a
128-token budget: 128 sequences 23,017 tok/s at 9.1 s TTFT, 26 sequences 2% fewer at 0.1 s).
The cost model is not more precise than that (serve_search.NEAR_TIE_FRACTION, the same 3%)."""


PEAK_FLAT_FRACTION = PROMPT_BOUND_TIE_FRACTION / 30
"""With a tie (the knee sought: a bar below the best), peak_throughput_concurrency refines a
sampled peak only where a neighbouring sample is more than 0.1% below it (a thirtieth of the 3%
tie: the bar it sets moves by no more), and stops where its two probes and the sample are within
0.1% of each other (a plateau). Past a token budget's knee tokens/s stay flat to parts per ten
thousand (DeepSeek-V3 tp=1 pp=2 ep=8 on H100 at a 1,024-token budget: 1,483 tok/s a rank at
every concurrency from 419 to 535), and refining such samples had chased that noise with 20-30
steady states per peak: 3,045 steady states for the 51 knees of 14 plans, now 1,326. The knee
found is every concurrency's in 48 of the 51 (before: 49), one sequence fewer in the others
(tests/serve/test_plan_notes.py). A sample that stands above a neighbour by more (a peak before
a dip, such as a lockstep rank's extra prompt chunk) is still refined; without a tie (the peak
itself sought) every peak is."""


def peak_throughput_concurrency(steady_at: Callable[[int], SteadyState], upper: int, tie: float = 0.0,
                                bound: Callable[[int], float] | None = None) -> int:
    """The fewest sequences in [1, upper] within `tie` of the most steady-state output tokens/s.
    Tokens/s rise with concurrency until the prompt budget saturates, then wander (more than
    one local peak: DeepSeek-V3 at ep 32 and a 2,048-token budget, 256 -> 14,823 tok/s, 300 ->
    14,145, 1,024 -> 14,735), so the rate is sampled at powers of sqrt(2) and the upper end,
    each local peak of the samples refined between its neighbours (ternary search; not a
    plateau's, PEAK_FLAT_FRACTION), and the best of them kept; with a tie, the fewest sequences
    whose rate reaches (1 - tie) of that best, found between the first sample over the bar and
    the one before it (bisection on the rising side). `bound` (replica_rate_bound: tokens/s a
    concurrency cannot pass): the samples are priced from the top down, and one whose bound is
    under (1 - tie) of the best priced so far is not (below the bar, and below any priced
    neighbour in the search for peaks, so that the neighbour is refined as without the bound).
    Each sample is checked on its own bound: it does not grow with the concurrency everywhere (a
    MoE step's whole expert counts: falls of up to 12% from one concurrency to the next, Llama 4
    Scout at ep 4). The 51 knees of 14 plans priced 801 steady states with it, 1,326 without
    (the bound's own decode rounds aside), every knee the same."""
    def rate(concurrency: int) -> float:
        return steady_at(concurrency).throughput_tokens_per_second

    grid = sorted({upper, *(c for c in (round(2 ** (i / 2)) for i in range(2 * upper.bit_length() + 1))
                            if c < upper)})
    # a sample not priced (its bound under the bar) stands at -inf: below the bar and below any
    # priced neighbour, which is then refined as the plain search would refine it (a review: a
    # spike between a skipped sample and the next had been missed)
    rates = [-math.inf] * len(grid)
    priced = [False] * len(grid)
    seen = -math.inf
    for i in reversed(range(len(grid))):
        if bound is not None and seen > 0 and bound(grid[i]) < seen * (1 - tie):
            continue
        rates[i], priced[i] = rate(grid[i]), True
        seen = max(seen, rates[i])
    peaks = [i for i in range(len(grid)) if priced[i]
             and (i == 0 or rates[i] >= rates[i - 1]) and (i == len(grid) - 1 or rates[i] >= rates[i + 1])]
    best_c, best = grid[-1], rates[-1]
    for i in peaks:
        lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
        if tie > 0 and all(rates[j] >= rates[i] * (1 - PEAK_FLAT_FRACTION)
                           for j in (i - 1, i + 1) if 0 <= j < len(grid)):
            lo = hi = grid[i]  # a plateau's sample: nothing between its neighbours to find
        tried = {grid[i]}
        while hi - lo > 2:
            third = (hi - lo) // 3
            left, right = rate(lo + third), rate(hi - third)
            tried.update((lo + third, hi - third))
            if tie > 0 and max(left, right, rates[i]) <= min(left, right, rates[i]) * (1 + PEAK_FLAT_FRACTION):
                break  # both probes on the sample's plateau
            if left < right:
                lo = lo + third + 1
            else:
                hi = hi - third
        else:
            tried.update(range(lo, hi + 1))
        c = max(tried, key=lambda n: (rate(n), -n))
        if rate(c) > best or (rate(c) == best and c < best_c):
            best_c, best = c, rate(c)
    if tie <= 0:
        return best_c
    bar = best * (1 - tie)
    first = next(i for i in range(len(grid)) if rates[i] >= bar or grid[i] >= best_c)
    if first == 0:
        return grid[0]
    low, high = grid[first - 1], min(grid[first], best_c)  # rate(low) under the bar, rate(high) over it
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if rate(middle) >= bar else (middle, high)
    return high


LOCKSTEP_PEAKS = 8
"""Whole numbers of prompt chunks per rank and step that lockstep_peak_concurrency tries. Just
past k chunks the busiest of d ranks soon carries k + 1 (a round as long as (k + 1) / k of the
mean's prompt work), so the dips shrink as 1 / k; past 8 they are within the 3% tie."""


def lockstep_peak_concurrency(steady_at: Callable[[int], SteadyState], chunks_at: Callable[[int], float],
                              upper: int, tie: float) -> int:
    """The fewest sequences in [1, upper] at a local peak of output tokens/s within `tie` of the
    best, for DP ranks in lockstep below the token budget. Tokens/s rise with concurrency
    except just past each whole number k of prompt chunks per rank and step, where the
    busiest rank starts to carry k + 1 (continuous_batching.busiest_rank_chunks): so the peaks
    are the largest concurrency at each k (found by bisection on the arrival solution alone,
    no step priced) and `upper`. DeepSeek-V3 on 2x8xH200 at dp=16 ep=8 (1,024/256 tokens):
    256 sequences (1.00 chunk) 15,042 tok/s, 300 14,219, 371 (the KV cache's limit) 14,841."""
    peaks = {upper}
    for k in range(1, min(math.floor(chunks_at(upper)), LOCKSTEP_PEAKS) + 1):
        if chunks_at(1) > k or chunks_at(upper) <= k:  # no crossing below the cap (at it: the cap)
            continue
        low, high = 1, upper  # chunks_at(low) <= k < chunks_at(high)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if chunks_at(middle) <= k else (low, middle)
        peaks.add(low)
    rates = {c: steady_at(c).throughput_tokens_per_second for c in sorted(peaks)}
    bar = max(rates.values()) * (1 - tie)
    return next(c for c, rate in rates.items() if rate >= bar)


def mean_prompt_chunks(steady: SteadyState, request: ServeRequest) -> float:
    """Prompt chunks a rank carries per step on average."""
    return steady.prefill_tokens_per_step * steady.prefill_rounds / max(request.input_len, 1)


def lockstep_ranks(model: ModelSpec, layout: Layout) -> int:
    """DP ranks that step together: an EP group's d (vLLM syncs its DP ranks every step and
    each MoE layer gathers all their tokens); 1 without EP across DP ranks."""
    return layout.dp_per_ep_group if model.is_moe and layout.ep > 1 else 1


def vllm_balances_dp(model: ModelSpec, layout: Layout, request: ServeRequest) -> bool:
    """Whether vLLM's own DP load balancer (cost/dp_router.py) picks the rank of each request:
    V1 deployments of several DP ranks, as planner/emit/vllm.py launches them (an EP group's d
    ranks; a dense model's replicas, one `--data-parallel-size dp` deployment). An MoE model's
    replicas without EP across them are independent deployments behind a load balancer, and
    SGLang's servers route their own way. Only for the releases whose balancer was read
    (VllmRelease.dp_balancer_read: 0.33.0); the others' bursts keep the exact count."""
    release = request.engine_versions.vllm_release
    if request.pool_engine != "vllm" or not release.dp_balancer_read or layout.dp == 1:
        return False
    return lockstep_ranks(model, layout) > 1 or not model.is_moe


def expert_imbalance(request: ServeRequest) -> float:
    """The busiest EP GPU's routed load over the mean: --expert-imbalance, else the default."""
    return request.expert_imbalance if request.expert_imbalance is not None else eff.EXPERT_LOAD_IMBALANCE


def burst_metrics(model: ModelSpec, cluster: ClusterSpec, result: ServeEstimate, request: ServeRequest) -> ServeMetrics:
    """What `vllm bench serve` would report for this layout: the burst (--num-prompts requests
    of the dataset's or the mean lengths, arriving at --request-rate, all at once for inf, at
    most --max-concurrency in flight) simulated step by step on every replica (cost/serving_sim.py), each step priced like the
    steady state's (cost/serving_time.round_time); with PP each step is one micro-batch of vLLM's
    batch queue, priced stage by stage (stage_step_times) and timed through the pipeline
    (serving_sim._Clock); the DP ranks of an EP group step together (lockstep_ranks), each step
    as long as the slowest busy rank's."""
    layout, placement, stages = result.layout, result.placement, result.stages
    cluster = with_moe_backend(cluster, request.moe_backend)
    num_prompts = request.num_prompts or DEFAULT_NUM_PROMPTS
    lengths = request.dataset_lengths or ((request.input_len, request.output_len),)
    if request.dataset_lengths:
        lengths = sampled_dataset_lengths(request.dataset_lengths, num_prompts)
    if request.random_range_ratio is not None:
        lengths = random_dataset_lengths(request.input_len, request.output_len, request.random_range_ratio,
                                         num_prompts)
    rate = request.request_rate_per_s if request.request_rate_per_s is not None else math.inf
    requests = workload_requests(lengths, num_prompts, rate, burstiness=request.burstiness or 1.0)
    # every output token is one step of some replica (PP: of one of its p micro-batch steps in
    # turn), which runs at most this many sequences at once
    lanes = min(layout.dp * result.batch, request.max_concurrency or layout.dp * result.batch)
    steps = sum(r.output_len for r in requests) / lanes * layout.pp
    shortened_from = None
    if steps > MAX_SIMULATED_STEPS and request.num_prompts is None:
        # the default count was not asked for: simulate as many of its prompts as fit the budget
        shortened_from = num_prompts
        num_prompts = max(1, math.floor(num_prompts * MAX_SIMULATED_STEPS / steps))
        requests = requests[:num_prompts]
        steps = sum(r.output_len for r in requests) / lanes * layout.pp
    if steps > MAX_SIMULATED_STEPS:
        raise SpecError(f"--num-prompts {num_prompts:,}: the burst needs some {steps:,.0f} engine steps "
                        f"(at most {lanes:,} sequences at a time), more than the simulation's {MAX_SIMULATED_STEPS:,}; "
                        f"give fewer prompts, shorter outputs or more sequences at a time ("
                        + ("--max-concurrency" if lanes == request.max_concurrency else
                           f"--batch, the engine's {seqs_flag(request)}" if request.batch is not None else
                           f"--batch: the plan chose {result.batch:,} a replica") + ")")
    budget = max_num_batched_tokens(cluster, request, layout, model)
    # PP: each step is one micro-batch with its own budget, vLLM's batch queue (serving_sim._Clock);
    # the engines' cap is the launched --max-num-seqs: under --max-concurrency the clients' share
    # of a replica is not one (vLLM's DP balancer can send an engine more than its share)
    limits = EngineLimits(min(s.running_tokens for s in result.stages), result.max_num_seqs, budget,
                          draft_acceptance=() if request.speculation is None else request.speculation.acceptance,
                          pipeline_stages=layout.pp, schedules_ahead=request.schedules_ahead)

    priced: dict[tuple[float, ...], float | PipelineStep] = {}
    stage_memo: dict[tuple, StepTime | StageRates] = {}
    constants = step_constants(model, cluster, layout, request.all2all_backend, request.enable_dbo, request)

    def step_seconds(load: StepLoad, expert_tokens: float | None = None) -> float | PipelineStep:
        """The step's time (PP: the micro-batch's engine work, stages and hop), its decode
        context (and any expert tokens: `expert_tokens` in place of the load's) bucketed
        (context_bucket_tokens) and each bucket priced once."""
        context = context_bucket_tokens(load.decode_context_tokens)
        experts = expert_tokens if expert_tokens is not None else load.expert_tokens
        experts = None if experts is None else context_bucket_tokens(experts)
        key = (load.decode_seqs, context, load.prefill_tokens, load.prefill_attention_pairs, load.prompts_completing,
               experts, load.spec_tokens)
        seconds = priced.get(key)
        if seconds is None:
            bucketed = StepLoad(load.decode_seqs, context, load.prefill_tokens, load.prefill_attention_pairs,
                                load.prompts_completing, experts, load.spec_tokens)
            if layout.pp == 1:
                seconds = round_time(model, cluster, layout, placement, stages, bucketed, 1,
                                     imbalance=expert_imbalance(request), constants=constants).seconds
            else:
                stage_steps = stage_step_times(model, cluster, layout, placement, stages, bucketed,
                                               expert_imbalance(request), constants, stage_memo)
                seconds = PipelineStep(engine_step_seconds(bucketed), tuple(step.seconds for step in stage_steps),
                                       pipeline_hop_seconds(model, placement, max(bucketed.num_tokens, 1.0)))
            priced[key] = seconds
        return seconds

    ranks = lockstep_ranks(model, layout)

    def group_step_seconds(loads: list[StepLoad]) -> float | PipelineStep:
        """The ranks step together: the slowest busy rank's step (PP: stage by stage), the
        experts at the group's mean tokens per rank (idle ranks add none)."""
        mean = sum(load.num_tokens for load in loads) / ranks
        steps = [step_seconds(load, mean) for load in loads]
        if layout.pp == 1:
            return max(steps)
        return PipelineStep(max(step.engine_seconds for step in steps),
                            tuple(map(max, *(step.stage_seconds for step in steps))) if len(steps) > 1
                            else steps[0].stage_seconds, max(step.hop_seconds for step in steps))

    simulated = simulate_replicas(requests, layout.dp, limits, step_seconds, eff.FIRST_TOKEN_SECONDS,
                                  request.max_concurrency, ranks, group_step_seconds,
                                  tokenizer=api_server_tokenizer(request, layout, cluster.gpus_per_node),
                                  dp_router="vllm" if vllm_balances_dp(model, layout, request) else "exact")
    # the client's clock starts at the workload's time 0 (its arrivals are from there), which is
    # FIRST_TOKEN_SECONDS before the engine would see a request sent then
    metrics = replace(bench_metrics(simulated, -eff.FIRST_TOKEN_SECONDS), num_prompts=num_prompts,
                      shortened_from=shortened_from)
    if not math.isfinite(rate) and request.max_concurrency is not None:  # a closed loop of clients
        metrics = replace(metrics, first_wave=first_wave(simulated, request.max_concurrency))
    if math.isfinite(rate) and request.max_concurrency is None:  # the clients would bound the backlog
        steady = result.steady
        planned = None if steady is None else (rate * steady.e2e_seconds, rate * steady.ttft_seconds)
        metrics = replace(metrics, backlog=backlog_growth(requests, simulated, *(planned or ())))
    return metrics


CONTEXT_BUCKET_BITS = 7
"""A burst's steps are priced at their decode context rounded to 1/2^7 of its power of two
(under 0.4% of the KV read, which is one term of the step): consecutive decode steps differ
only by one token per sequence, so most steps of a burst reuse a priced one."""


def context_bucket_tokens(tokens: float) -> float:
    """tokens rounded to a multiple of 2^(floor(log2 tokens) - CONTEXT_BUCKET_BITS); exact below
    2^(CONTEXT_BUCKET_BITS + 1). 100,003 lies in [2^16, 2^17): multiples of 2^(16 - 7) = 512;
    100,003 / 512 = 195.3 -> 195 * 512 = 99,840."""
    if tokens < 2 ** (CONTEXT_BUCKET_BITS + 1):
        return tokens
    step = 2.0 ** (math.floor(math.log2(tokens)) - CONTEXT_BUCKET_BITS)
    return round(tokens / step) * step


def steady_metrics(result: ServeEstimate) -> ServeMetrics:
    """The steady state as vllm bench serve would report it: every request alike (mean =
    median = p99), no finite duration."""
    steady = result.steady

    def alike(seconds: float) -> Distribution:
        return Distribution(seconds, seconds, seconds)

    requests_per_s = result.layout.dp * steady.requests_per_second
    # ITL: one streamed chunk per step, several tokens each under speculative decoding
    return ServeMetrics(alike(steady.ttft_seconds), alike(steady.tpot_seconds), alike(steady.decoding_round_seconds),
                        alike(steady.e2e_seconds), math.inf, requests_per_s, result.throughput_tokens_per_second)
