"""Serving time of one pipeline stage under vLLM semantics (pure; SI units).

Legend: t/p tensor/pipeline degrees, L_s layers of stage s, h hidden size, a heads,
d head dim, V vocab, n sequences in one decode batch, s prompt tokens.
Decode is a weight (and KV) read bounded by HBM, or a compute bound, plus a fixed
per-layer step cost and the TP all-reduces; prefill is compute-bound. Derivations and
sources: docs/cost-model.md (Serving: decode step; Serving: prefill and TTFT).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost import efficiency as eff
from planner.cost.comm import allreduce_seconds, p2p_seconds
from planner.cost.params import (
    activation_bytes_per_element,
    linear_bytes_per_weight,
    matmul_precision_of_dtype,
    mlp_params,
    param_counts,
)
from planner.cost.pipeline import serving_stage_utilization
from planner.cost.serving_memory import StageMemory, embedding_bytes_per_gpu
from planner.layout import Layout, Placement
from planner.specs import ClusterSpec, ModelSpec


def matmul_precision(model: ModelSpec, cluster: ClusterSpec) -> str:
    """fp8 checkpoints run fp8 GEMMs where the GPU has them (W8A8); weight-only int4/int8
    dequantise into the model dtype's GEMMs."""
    if model.quantization == "fp8" and cluster.gpu.peak_tflops.fp8 is not None:
        return "fp8"
    return matmul_precision_of_dtype(model)


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
    moe_layers = stage.num_layers * model.num_moe_layers / model.num_hidden_layers  # mean block
    return read - moe_layers * untouched * expert_bytes


def active_params_per_layer(model: ModelSpec) -> float:
    """The mean block's active parameters (dense and MoE layers averaged)."""
    return param_counts(model).active_per_layer


def stage_matmul_flops_per_token(model: ModelSpec, stage: StageMemory, num_stages: int) -> float:
    """2 * active parameters of the stage (the last stage adds the LM head 2*V*h)."""
    flops = 2 * stage.num_layers * active_params_per_layer(model)
    if stage.stage == num_stages - 1:
        flops += 2 * model.vocab_size * model.hidden_size
    return flops


@dataclass(frozen=True)
class StepTime:
    """One stage's decode step for one in-flight batch, by part."""

    seconds: float
    compute_or_memory_seconds: float
    """max(weight + KV read time, matmul time)."""
    allreduce_seconds_per_layer: float
    """Both TP all-reduces of one layer."""
    bound: str
    """memory | compute: which of the two was larger."""
    overhead_seconds: float = 0.0
    """The fixed per-layer step cost over the stage's layers."""


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
    overhead = stage.num_layers * eff.DECODE_STEP_OVERHEAD_SECONDS_PER_LAYER
    return StepTime(busy + stage.num_layers * allreduce + overhead, busy, allreduce, bound, overhead)


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


@dataclass(frozen=True)
class Collective:
    """One collective of a serving step, as the estimate priced it."""

    phase: str
    """decode (one round, = TPOT) | prefill (one prompt, in TTFT)."""
    name: str
    """after attention | after MLP | to next stage."""
    kind: str
    """all-reduce | send."""
    num_ranks: int
    link_kind: str
    message_bytes: float
    seconds: float
    """One call: the probe's curve at this size where the profile has one, else the model."""
    source: str
    """measured | model."""
    count_per_step: int
    """Calls on the critical path of one decode round or one prefill."""


def serving_collectives(model: ModelSpec, cluster: ClusterSpec, layout: Layout, placement: Placement,
                        decode_tokens: int, batches_in_flight: int, slowest_stage_layers: int,
                        prompt_tokens: int) -> tuple[Collective, ...]:
    """Per layer two TP all-reduces (after attention, after the MLP) of tokens * h * bytes:
    k * L_s of each per decode round on the slowest stage (one in-flight batch's rows each),
    L of each per prefill (the prompt); per decode round p pipeline sends, per prefill p - 1."""
    width = model.hidden_size * activation_bytes_per_element(model)
    out = []
    phases = (("decode", decode_tokens, batches_in_flight * slowest_stage_layers, layout.pp),
              ("prefill", prompt_tokens, model.num_hidden_layers, layout.pp - 1))
    for phase, tokens, allreduces, sends in phases:
        if placement.tp_link is not None:
            both, source = tp_allreduce_seconds_per_layer(cluster, layout, placement, tokens * width)
            out += [Collective(phase, f"after {where}", "all-reduce", layout.tp, placement.tp_link.kind,
                               tokens * width, both / 2, source, allreduces)
                    for where in ("attention", "MLP")]
        if placement.pp_link is not None:
            out.append(Collective(phase, "to next stage", "send", 2, placement.pp_link.kind, tokens * width,
                                  pipeline_hop_seconds(model, placement, tokens), "model", sends))
    return tuple(out)
