"""Serving estimate for one layout under vLLM semantics: composes the cost terms of
planner/cost/serving_memory.py (memory per stage, vLLM's checks) and
planner/cost/serving_time.py (decode, prefill, pipeline hops) into TPOT, TTFT,
throughput and the verdict.

Legend: t/p/d tensor/pipeline/data degrees, B concurrent sequences per replica,
k batches in flight (vLLM runs p virtual engines). Everything in SI units.
Derivations: docs/cost-model.md (Serving).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.cost.params import activation_bytes_per_element
from planner.cost.serving_memory import (
    StageMemory,
    default_max_num_seqs,
    memory_overshoot_bytes,
    memory_reasons,
    stage_memory,
    structural_reasons,
)
from planner.cost.serving_time import (
    Collective,
    StepTime,
    decode_stage_time,
    pipeline_hop_seconds,
    prefill_stage_seconds,
    serving_bubble_fraction,
    serving_collectives,
    tp_allreduce_seconds_per_layer,
)
from planner.layout import Layout, Placement, Rejected, place
from planner.requests import ServeRequest
from planner.specs import ClusterSpec, ModelSpec


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
    batch: int
    """Concurrent sequences per replica the estimate runs at."""
    batches_in_flight: int
    stage_step_seconds: float
    """Slowest stage's time for one in-flight batch (compute/memory + TP all-reduces)."""
    tp_allreduce_seconds_per_layer: float
    """Both all-reduces of one layer at one in-flight batch's message size."""
    allreduce_message_bytes: float
    allreduce_source: str
    """"model" (alpha-beta ring) or "measured" (probe curve at this size)."""
    pp_hop_seconds: float
    bubble_fraction: float
    decode_bound: str
    """"memory" or "compute": what limits the slowest stage's decode step."""
    ttft_seconds: float
    tpot_seconds: float
    request_latency_seconds: float
    throughput_tokens_per_second: float
    """Output tokens per second for the whole layout (all DP replicas)."""
    notes: tuple[str, ...] = field(default=())
    decode_steps: tuple[StepTime, ...] = ()
    """Each stage's decode step for one in-flight batch, by part."""
    slowest_stage: int = 0
    """The stage whose decode step paces every round."""
    prefill_stage_seconds: tuple[float, ...] = ()
    """Each stage's prefill of one prompt (TTFT adds them and the hops)."""
    collectives: tuple[Collective, ...] = ()
    """Every collective of a decode round and a prefill, as priced."""


def wanted_batch(request: ServeRequest, cluster: ClusterSpec) -> int:
    """--batch if given, else vLLM's max_num_seqs default (1 for the latency objective)."""
    if request.batch:
        return request.batch
    if request.objective == "latency":
        return 1
    return default_max_num_seqs(cluster, request.engine_versions.vllm_release)


def choose_batch(request: ServeRequest, kv_cache_tokens: int, wanted: int) -> tuple[int, list[str]]:
    """Concurrent sequences per replica: the wanted batch capped by how many in+out
    sequences the KV cache holds."""
    seq_tokens = request.input_len + request.output_len
    fit = kv_cache_tokens // seq_tokens
    notes = []
    if fit < wanted:
        notes.append(
            f"KV-starved: the cache holds {kv_cache_tokens:,} tokens = {fit} sequences of "
            f"{seq_tokens:,} tokens, so concurrency is {fit} (wanted {wanted})"
        )
    return max(1, min(wanted, fit)), notes


def estimate(model: ModelSpec, cluster: ClusterSpec, layout: Layout, request: ServeRequest) -> ServeEstimate | Rejected:
    """Everything about one (tp, pp, dp) layout, or why vLLM would refuse it."""
    reasons = structural_reasons(model, layout)
    if reasons:
        return Rejected(layout, tuple(reasons))
    placement = place(cluster, layout)
    max_model_len = request.max_model_len or model.max_position_embeddings
    wanted = wanted_batch(request, cluster)
    stages = stage_memory(model, cluster, layout, request, wanted)
    fit = min(s.kv_cache_tokens for s in stages) // (request.input_len + request.output_len)
    if request.batch is None and fit < wanted:
        # The emitted --max-num-seqs is the batch that fits, and vLLM's profile run (whose
        # sampler pass scales with max_num_seqs) is sized by it: recompute memory with it.
        stages = stage_memory(model, cluster, layout, request, max(1, fit))
    reasons = memory_reasons(stages, max_model_len)
    if reasons and placement.tp_crosses_node:
        reasons.append(f"tp={layout.tp} crosses a node: its all-reduces would run over "
                       f"{placement.tp_link.kind} (allowed, but slow)")
    if reasons:
        return Rejected(layout, tuple(reasons), memory_overshoot_bytes(stages, max_model_len))
    kv_tokens = min(s.kv_cache_tokens for s in stages)
    batch, notes = choose_batch(request, kv_tokens, wanted)
    in_flight = min(layout.pp, batch)
    seqs_per_batch = math.ceil(batch / in_flight)
    context_len = request.input_len + request.output_len / 2
    steps = [decode_stage_time(model, cluster, layout, placement, s, seqs_per_batch, context_len) for s in stages]
    slowest = max(range(len(steps)), key=lambda i: steps[i].seconds)
    stage_seconds = steps[slowest].seconds
    hop = pipeline_hop_seconds(model, placement, seqs_per_batch)
    round_seconds = max(in_flight * stage_seconds, layout.pp * (stage_seconds + hop))
    prefill = [prefill_stage_seconds(model, cluster, layout, placement, s, request.input_len) for s in stages]
    ttft = sum(prefill) + (layout.pp - 1) * pipeline_hop_seconds(model, placement, request.input_len)
    cycle = request.output_len * round_seconds + batch * max(prefill)
    throughput = layout.dp * batch * request.output_len / cycle
    message_bytes = seqs_per_batch * model.hidden_size * activation_bytes_per_element(model)
    allreduce, source = tp_allreduce_seconds_per_layer(cluster, layout, placement, message_bytes)
    collectives = serving_collectives(model, cluster, layout, placement, seqs_per_batch, in_flight,
                                      stages[slowest].num_layers, request.input_len)
    if placement.tp_crosses_node:
        notes.append(
            f"tp={layout.tp} crosses a node: every layer's all-reduces run over "
            f"{placement.tp_link.kind} (allowed, but slow)"
        )
    worst = max(range(len(stages)), key=lambda i: stages[i].weights_bytes + stages[i].activation_bytes)
    return ServeEstimate(
        layout=layout,
        placement=placement,
        stages=tuple(stages),
        worst_stage=worst,
        kv_cache_tokens=kv_tokens,
        max_model_len=max_model_len,
        max_concurrency=kv_tokens / max_model_len,
        batch=batch,
        batches_in_flight=in_flight,
        stage_step_seconds=stage_seconds,
        tp_allreduce_seconds_per_layer=allreduce,
        allreduce_message_bytes=message_bytes,
        allreduce_source=source,
        pp_hop_seconds=hop,
        bubble_fraction=serving_bubble_fraction(in_flight, layout.pp, stage_seconds, round_seconds),
        decode_bound=steps[slowest].bound,
        ttft_seconds=ttft,
        tpot_seconds=round_seconds,
        request_latency_seconds=ttft + request.output_len * round_seconds,
        throughput_tokens_per_second=throughput,
        notes=tuple(notes),
        decode_steps=tuple(steps),
        slowest_stage=slowest,
        prefill_stage_seconds=tuple(prefill),
        collectives=collectives,
    )
