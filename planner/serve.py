"""Serving estimate for one layout under vLLM semantics: time, batch, and the verdict
(memory per stage lives in planner/serve_memory.py).

Legend: t/p/d tensor/pipeline/data degrees, B concurrent sequences per replica,
k batches in flight (vLLM runs p virtual engines), L_s layers of stage s,
T max_num_batched_tokens of the profile run. Everything in SI units.
Sources: ../shared/reference/physics.md (Serving; Collectives); vLLM's
get_pp_indices for uneven stage splits; engines.md for the checks vLLM enforces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.cost import efficiency as eff
from planner.cost.comm import allreduce_seconds, p2p_seconds
from planner.cost.params import (
    activation_bytes_per_element,
    linear_bytes_per_weight,
    mlp_params,
    param_counts,
)
from planner.cost.pipeline import serving_stage_utilization
from planner.layout import Layout, Placement, place
from planner.requests import ServeRequest
from planner.serve_memory import (
    StageMemory,
    default_max_num_seqs,
    embedding_bytes_per_gpu,
    memory_reasons,
    stage_memory,
    structural_reasons,
)
from planner.specs import ClusterSpec, ModelSpec


@dataclass(frozen=True)
class Rejected:
    layout: Layout
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class ServeEstimate:
    layout: Layout
    placement: Placement
    stages: tuple[StageMemory, ...]
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


def matmul_precision(model: ModelSpec, cluster: ClusterSpec) -> str:
    """fp8 checkpoints run fp8 GEMMs where the GPU has them (W8A8); weight-only int4/int8
    dequantise into the model dtype's GEMMs."""
    if model.quantization == "fp8" and cluster.gpu.peak_tflops.fp8 is not None:
        return "fp8"
    return {"float32": "tf32", "float16": "fp16", "bfloat16": "bf16"}[model.dtype]


def achievable_flops_per_s(model: ModelSpec, cluster: ClusterSpec) -> float:
    precision = matmul_precision(model, cluster)
    peak = cluster.gpu.peak_flops_per_s(precision) or cluster.gpu.peak_flops_per_s("bf16")
    if peak is None:
        # no confirmed compute figure at all (e.g. A10G): fall back to fp16 via fp32 x 4 is a guess,
        # so we refuse to guess and treat compute as free; memory-bound decode still applies.
        return math.inf
    return eff.achievable_matmul_flops_per_s(peak, cluster.gpu.achievable_flops_per_s(precision))


def expected_experts_touched(model: ModelSpec, num_tokens: int) -> float:
    """E * (1 - (1 - e/E)^n): distinct experts a batch of n tokens routes to (uniform routing)."""
    if not model.is_moe:
        return 1.0
    experts, per_token = model.num_local_experts, model.num_experts_per_tok
    return experts * (1 - (1 - per_token / experts) ** num_tokens)


def decode_weight_bytes_read(model: ModelSpec, stage: StageMemory, tp: int, num_tokens: int,
                             num_stages: int) -> float:
    """A decode step reads every weight of the stage once, except MoE experts no token chose
    and the embedding table, of which it gathers only the batch's rows (unless the same
    matrix is the LM head on this stage: tied and p = 1)."""
    read = stage.weights_bytes
    head_reads_embedding = model.tie_word_embeddings and num_stages == 1
    if stage.stage == 0 and not head_reads_embedding:
        read -= embedding_bytes_per_gpu(model, tp)
    if not model.is_moe:
        return read
    expert_bytes = mlp_params(model, model.expert_intermediate_size) * linear_bytes_per_weight(model) / tp
    untouched = model.num_local_experts - expected_experts_touched(model, num_tokens)
    return read - stage.num_layers * untouched * expert_bytes


def active_params_per_layer(model: ModelSpec) -> int:
    counts = param_counts(model)
    return counts.attention_per_layer + counts.mlp_active_per_layer + counts.norms_per_layer


def stage_matmul_flops_per_token(model: ModelSpec, stage: StageMemory, num_stages: int) -> float:
    """2 * active parameters of the stage (the last stage adds the LM head 2*V*h)."""
    flops = 2 * stage.num_layers * active_params_per_layer(model)
    if stage.stage == num_stages - 1:
        flops += 2 * model.vocab_size * model.hidden_size
    return flops


@dataclass(frozen=True)
class StepTime:
    seconds: float
    compute_or_memory_seconds: float
    allreduce_seconds_per_layer: float
    bound: str


def tp_allreduce_seconds_per_layer(cluster: ClusterSpec, layout: Layout, placement: Placement,
                                   message_bytes: float) -> tuple[float, str]:
    """Two all-reduces per layer (after attention and after the MLP), forward only."""
    link = placement.tp_link
    curve = None if link is None else cluster.allreduce_curve(link.scope, layout.tp)
    source = "measured" if curve is not None else "model"
    return 2 * allreduce_seconds(message_bytes, placement.tp_group, curve), source


def decode_stage_time(model: ModelSpec, cluster: ClusterSpec, layout: Layout, placement: Placement,
                      stage: StageMemory, num_seqs: int, context_len: float) -> StepTime:
    """max(bytes read / (HBM * utilisation), FLOPs / (achievable * decode utilisation))
    + per layer: the fixed step overhead and 2 all-reduces of num_seqs * h * bytes."""
    t = layout.tp
    bytes_read = decode_weight_bytes_read(model, stage, t, num_seqs, layout.pp)
    bytes_read += num_seqs * context_len * stage.kv_bytes_per_token
    memory_seconds = bytes_read / (cluster.gpu.hbm_bytes_per_s * eff.DECODE_HBM_UTILIZATION)
    attention_flops = 4 * stage.num_layers * context_len * model.num_attention_heads * model.head_dim
    flops = num_seqs * (stage_matmul_flops_per_token(model, stage, layout.pp) + attention_flops) / t
    compute_seconds = flops / (achievable_flops_per_s(model, cluster) * eff.DECODE_MATMUL_UTILIZATION)
    message_bytes = num_seqs * model.hidden_size * activation_bytes_per_element(model)
    allreduce, _ = tp_allreduce_seconds_per_layer(cluster, layout, placement, message_bytes)
    busy = max(memory_seconds, compute_seconds)
    bound = "memory" if memory_seconds >= compute_seconds else "compute"
    per_layer = allreduce + eff.DECODE_STEP_OVERHEAD_SECONDS_PER_LAYER
    return StepTime(busy + stage.num_layers * per_layer, busy, allreduce, bound)


def prefill_stage_seconds(model: ModelSpec, cluster: ClusterSpec, layout: Layout, placement: Placement,
                          stage: StageMemory, num_tokens: int) -> float:
    """Compute-bound: (2 * active layer params * s + causal attention 2 * L_s * s^2 * a * d
    + on the last stage the LM head 2 * V * h once: vLLM computes logits only for the
    sampled, last position of a prompt) / t at the achievable matmul rate * prefill
    utilisation, never faster than reading the weights once; plus per layer the fixed
    step overhead and 2 all-reduces of s * h * bytes."""
    s = num_tokens
    attention = 2 * stage.num_layers * s * s * model.num_attention_heads * model.head_dim
    layers = 2 * stage.num_layers * active_params_per_layer(model) * s
    head = 2 * model.vocab_size * model.hidden_size if stage.stage == layout.pp - 1 else 0
    flops = (layers + head + attention) / layout.tp
    compute = flops / (achievable_flops_per_s(model, cluster) * eff.PREFILL_MATMUL_UTILIZATION)
    memory = stage.weights_bytes / (cluster.gpu.hbm_bytes_per_s * eff.DECODE_HBM_UTILIZATION)
    message_bytes = s * model.hidden_size * activation_bytes_per_element(model)
    allreduce, _ = tp_allreduce_seconds_per_layer(cluster, layout, placement, message_bytes)
    return max(compute, memory) + stage.num_layers * (allreduce + eff.DECODE_STEP_OVERHEAD_SECONDS_PER_LAYER)


def pipeline_hop_seconds(model: ModelSpec, placement: Placement, num_tokens: int) -> float:
    """One boundary: send the hidden states (tokens * h * bytes) plus vLLM's per-hop overhead."""
    if placement.pp_link is None:
        return 0.0
    message_bytes = num_tokens * model.hidden_size * activation_bytes_per_element(model)
    return p2p_seconds(message_bytes, placement.pp_link) + eff.PIPELINE_HOP_EXTRA_SECONDS


def serving_bubble_fraction(in_flight: int, pp: int, stage_seconds: float, round_seconds: float) -> float:
    """Idle share of each stage: it is busy k * t_stage of every round. With k < p batches in
    flight that is at most k/p (serving_stage_utilization), less the hops' share."""
    if pp == 1:
        return 0.0
    busy_share = in_flight * stage_seconds / round_seconds
    assert busy_share <= serving_stage_utilization(in_flight, pp) + 1e-9
    return 1 - busy_share


def wanted_batch(request: ServeRequest, cluster: ClusterSpec) -> int:
    """--batch if given, else vLLM's max_num_seqs default (1 for the latency objective)."""
    if request.batch:
        return request.batch
    return 1 if request.objective == "latency" else default_max_num_seqs(cluster)


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
        return Rejected(layout, tuple(reasons))
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
    )
