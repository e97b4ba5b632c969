"""Activation memory of training, per GPU (Korthikanti et al. 2022, Table 2).

Legend: s sequence length, b micro-batch, h hidden size, a heads, k KV heads, d head
dim, f FFN size, t tensor-parallel degree, p pipeline stages, m micro-batches, v
virtual stages. Bytes are 16-bit activations (2 B) and 1-byte dropout masks.
Table 2, bytes per layer:
  no parallelism              s*b*h*(34 + 5*a*s/h)
  tensor parallel             s*b*h*(10 + 24/t + 5*a*s/(h*t))
  tensor + sequence parallel  s*b*h*(34/t + 5*a*s/(h*t))
  TP + selective recompute    s*b*h*(10 + 24/t);  TP + SP + selective: s*b*h*34/t
  full recompute              2*s*b*h (the layer input only)
The general form below counts the same tensors for any head/FFN shape and reduces to
Table 2 for a GPT block (f = 4h, k = a, a*d = h). That table is for materialized
attention; with flash attention (Dao et al. 2022, sec. 3.1) no s x s tensor is kept:
the 5*a*s/h term is replaced by the fp32 softmax statistics (one logsumexp per query
row and head, 4*a*s*b/t bytes), and with SP a fully recomputed layer keeps its input
sharded (2*s*b*h/t). See docs/cost-model.md#training-attention.
FP8 (--precision fp8): Transformer Engine saves each linear layer's input quantized, 1 byte
instead of 2: the QKV and MLP-up inputs (2h of the replicated 10h), the output-projection
input (a*d/t) and the MLP-down input (f/t) (fp8_saved_input_savings_per_token;
docs/cost-model.md#training-fp8).
Context parallelism (cp > 1): every rank holds s/cp tokens of each sequence and every
per-token term above applies to them (context_parallel_chunk_tokens): activations per GPU
divide by cp (flash attention only, whose kept state is linear in s; Megatron-Core runs CP
only through TE's attention).
MoE: each MoE layer also keeps the tokens dispatched to the GPU's experts
(moe_dispatch_bytes_per_layer): k copies of each token of the TP group without EP, of its
1/t share with it.
Recompute "outputs" (MoE and MLA models): Megatron's output-discarding checkpoints
(--recompute-modules moe_act layernorm mla_up_proj, outputs_recompute_modules) drop what
discarded_output_bytes_per_token gives and recompute it for the backward.
Recompute "op" (torchtitan's per-op selective checkpointing, dense GQA models in bf16): the
block keeps what op_checkpoint_saved_bytes_per_token gives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost import efficiency
from planner.cost.moe import busiest_gpu_load_factor, moe_layers_of
from planner.cost.params import mlp_width_per_token, training_attention_widths
from planner.cost.pipeline import microbatch_group_size
from planner.specs import ModelSpec

SOFTMAX_STATS_BYTES_PER_ROW = 4
"""Flash attention keeps one fp32 logsumexp per query row and head for its backward."""
MASK_BYTES_PER_ELEMENT = 1
"""Dropout masks are stored as bytes (Korthikanti et al. 2022, sec. 4, before 4.1)."""


def context_parallel_chunk_tokens(seq_len: int, cp: int) -> int:
    """s/cp: the tokens of each sequence one CP rank holds (Megatron splits the sequence into
    2*cp chunks and gives rank i chunks i and 2*cp-1-i, get_batch_on_this_cp_rank in
    megatron/core/utils.py core_v0.19.0; arguments.py asserts s divisible by 2*cp)."""
    assert seq_len % cp == 0, "config_reasons rejects s not divisible by 2*cp"
    return seq_len // cp


def replicated_bytes_per_token(model: ModelSpec, act_bytes: int) -> float:
    """Per token, what TP alone does not split: two layernorm inputs (2*e*h), the QKV and
    MLP inputs (2*e*h) and two dropout masks (2*h): 10h bytes for e = 2."""
    h = model.hidden_size
    return 4 * act_bytes * h + 2 * MASK_BYTES_PER_ELEMENT * h


def split_bytes_per_token(model: ModelSpec, act_bytes: int, tp: int) -> float:
    """Per token per GPU, what TP splits: Q, K, V, the output-projection input and the MLP
    activations (GeLU input and output; gated: gate, up and product): 24h/t for GPT. MoE:
    the MLP width is every expert a token visits (params.mlp_width_per_token: top-k x the
    expert's, plus the shared experts), split over the TP group or held whole by each token's
    EP ranks: s*b*k*f_x/t per GPU on the mean either way."""
    attention = training_attention_widths(model, tp).total  # (2a/t + 2k_gpu)d for GQA
    if model.is_mla:  # the latents the up-projections' weight gradients read, whole on every rank
        attention += (model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_rope_head_dim
    mlp = (3 if model.gated_mlp else 2) * mlp_width_per_token(model) / tp
    return act_bytes * (attention + mlp)


def fp8_saved_input_savings_per_token(model: ModelSpec, act_bytes: int, tp: int,
                                      sequence_parallel: bool) -> float:
    """Bytes per token per GPU fp8 saves: (e - 1) * (2h (/t with SP) + a*d/t + f/t).

    TE's Linear / LayerNormLinear / LayerNormMLP keep the quantized fp8 input of each GEMM
    for its wgrad (TransformerEngine v2.9 module/linear.py `saved_inputmat = inputmat`,
    row-wise data dropped); the QKV and MLP-up inputs are the layernorm outputs (replicated,
    sharded along s with SP), the output-projection input the attention context, the
    MLP-down input the activation's output (gated: the product). Everything else stays
    16-bit: layernorm inputs, Q, K, V and the context kept by the attention kernel, the
    MLP-up output the activation's backward reads, masks."""
    fp8 = efficiency.TRAIN_FP8_SAVED_INPUT_BYTES_PER_ELEMENT
    h, f = model.hidden_size, mlp_width_per_token(model)
    replicated = 2 * h / (tp if sequence_parallel else 1)
    return (act_bytes - fp8) * (replicated + training_attention_widths(model, tp).context + f / tp)


def op_checkpoint_saved_bytes_per_token(model: ModelSpec, tp: int, sequence_parallel: bool) -> float:
    """Bytes per token per GPU one dense GQA block keeps under torchtitan's per-op selective
    checkpointing (recompute "op"; `_apply_op_sac`, distributed/activation_checkpoint.py and
    llama3's `_op_sac_save_list`, models/llama3/infra/parallelize.py, v0.2.2). The policy saves
    the outputs of the ops in the list (aten.mm, the SDPA kernels, reduce_scatter) except every
    second mm, and recomputes the rest. A Llama block runs its mms in the order wq, wk, wv, wo,
    w1, w3, w2 (models/llama3/model/model.py), so it keeps wq's and wv's outputs (every token
    of the TP group, a/t*d and k_gpu*d_v wide), the attention output (a/t*d_v, with its fp32
    logsumexp, softmax_stats_bytes), w1's (f/t) and w2's (h: the row-parallel GEMM's partial
    sums, before their reduce-scatter), and with TP the reduce-scatter outputs after wo and w2
    (h/t each, sequence-sharded); wk, wo and w3 and every elementwise op (norms, RoPE, SiLU,
    the gating product, the residual adds) run again. Besides those, the checkpoint keeps its
    input, the residual stream (h/t with SP). 16-bit. Llama-3.1-8B (h 4,096, 8 KV heads of 128,
    f 14,336) at t = 1: 2 * (4,096 + 4,096 + 1,024 + 4,096 + 14,336 + 4,096) = 63,488 B."""
    act_bytes = 2
    h, f = model.hidden_size, model.intermediate_size
    widths = training_attention_widths(model, tp)
    sharded = h / (tp if sequence_parallel else 1)
    reduce_scatters = 2 * h / tp if tp > 1 else 0.0
    return act_bytes * (sharded + widths.query + widths.value + widths.context + f / tp + h + reduce_scatters)


def reruns_attention(recompute: str) -> bool:
    """Whether a recompute level runs the attention forward again in the backward (and with
    it CP's ring and the scores a materialized attention would otherwise keep): selective and
    full do (Korthikanti et al. 2022 sec. 5); none and Megatron's output-discarding "outputs"
    (moe_act, layernorm, mla_up_proj) do not."""
    return recompute in ("selective", "full")


def outputs_recompute_modules(model: ModelSpec, fp8_delayed: bool = False) -> tuple[str, ...]:
    """Megatron's output-discarding checkpoints (TransformerConfig.recompute_modules,
    core_v0.14.0 and core_v0.19.0) that free something in this model: moe_act (the routed
    experts' activation output) and layernorm (the pre-MLP norm of MoE layers, which no fused
    LayerNormMLP owns; MLA's input norm) for MoE models, layernorm and mla_up_proj (the
    queries, keys and values the up-projections and RoPE make) for MLA models. Empty for a
    dense GQA model, whose norms TE fuses into the following linear layer. `fp8_delayed` (fp8
    with delayed scaling): TransformerConfig.__post_init__ refuses moe_act and layernorm there
    ("Delayed scaling does not support moe_act and layernorm recompute for fp8"), so only MLA's
    mla_up_proj is left."""
    modules = []
    if model.is_moe and not fp8_delayed:
        modules.append("moe_act")
    if (model.is_moe or model.is_mla) and not fp8_delayed:
        modules.append("layernorm")
    if model.is_mla:
        modules.append("mla_up_proj")
    return tuple(modules)


@dataclass(frozen=True)
class DiscardedOutputs:
    """Elements per token per GPU of the mean layer that recompute "outputs" discards, each where
    the no-recompute count keeps it (h' = h/t with SP, else h; phi the MoE layers' share,
    moe_layers_of):
    moe_act     phi * k * f_x / t: the routed experts' MLP-down input (gated: the product);
    norm        phi * h' of the pre-MLP norm output, plus h' of MLA's input norm output;
    mla_heads   the a/t query, key and value heads the up-projections make (mla_up_proj).
    The memory it frees (discarded_output_bytes_per_token) and the time its rerun takes
    (training_time.outputs_recompute_seconds) both read these."""

    moe_act: float
    norm: float
    mla_heads: float


def discarded_outputs(model: ModelSpec, tp: int, sequence_parallel: bool, fp8_delayed: bool = False
                      ) -> DiscardedOutputs:
    """DiscardedOutputs of this model at this TP degree (zeros for a dense GQA model); with
    `fp8_delayed` only what mla_up_proj discards (outputs_recompute_modules)."""
    h = model.hidden_size / (tp if sequence_parallel else 1)
    share = moe_layers_of(model, 1)
    moe_act = norm = mla_heads = 0.0
    if model.is_moe:
        moe_act = share * model.num_experts_per_tok * model.expert_intermediate_size / tp
        norm += share * h
    if model.is_mla:
        widths = training_attention_widths(model, tp)
        norm += h
        mla_heads = widths.query + widths.key + widths.value
    if fp8_delayed:  # moe_act and layernorm are not recomputed
        return DiscardedOutputs(0.0, 0.0, mla_heads)
    return DiscardedOutputs(moe_act, norm, mla_heads)


def discarded_output_bytes_per_token(model: ModelSpec, tp: int, sequence_parallel: bool,
                                     precision: str = "bf16", fp8_delayed: bool = False) -> float:
    """Bytes per token per GPU of the mean layer that recompute "outputs" frees: the
    DiscardedOutputs' MoE activation and norm outputs at e_s bytes each (2, or 1 with fp8:
    fp8_saved_input_savings_per_token), MLA's heads at 2 bytes (the attention kernel's 16-bit
    inputs). Qwen3-30B-A3B (h 2,048, k 8, f_x 768, all 48 layers MoE), t = 1, bf16:
    2 * (8 * 768 + 2,048) = 16,384 B per token."""
    stored = efficiency.TRAIN_FP8_SAVED_INPUT_BYTES_PER_ELEMENT if precision == "fp8" else 2
    discarded = discarded_outputs(model, tp, sequence_parallel, fp8_delayed)
    return stored * (discarded.moe_act + discarded.norm) + 2 * discarded.mla_heads


def attention_scores_bytes(model: ModelSpec, s: int, b: int, act_bytes: int, tp: int) -> float:
    """Softmax output (e), dropout mask (1) and dropout output (e) per score:
    (2e+1)*a*s^2*b/t = 5*a*s^2*b/t bytes for e = 2."""
    return (2 * act_bytes + MASK_BYTES_PER_ELEMENT) * model.num_attention_heads * s * s * b / tp


def softmax_stats_bytes(model: ModelSpec, s: int, b: int, tp: int) -> float:
    """Flash attention's saved logsumexp: 4 bytes per query row per head, a*s*b/t rows."""
    return SOFTMAX_STATS_BYTES_PER_ROW * model.num_attention_heads * s * b / tp


def activation_bytes_per_layer(
    model: ModelSpec, s: int, b: int, tp: int, sequence_parallel: bool, recompute: str,
    attention: str = "materialized", precision: str = "bf16", fp8_delayed: bool = False,
) -> float:
    """Stored activations of one layer for one micro-batch on one GPU (Table 2 rows;
    attention flash | materialized; precision bf16 | fp8, fp8 saving what
    fp8_saved_input_savings_per_token gives; `fp8_delayed`: outputs_recompute_modules')."""
    act_bytes = 2
    tokens = s * b
    if recompute == "full":  # the layer input only, sharded along s with SP
        return act_bytes * tokens * model.hidden_size / (tp if sequence_parallel else 1)
    if recompute == "op":  # torchtitan's per-op checkpointing, dense GQA blocks, flash attention
        return op_checkpoint_saved_bytes_per_token(model, tp, sequence_parallel) * tokens + softmax_stats_bytes(
            model, s, b, tp)
    replicated = replicated_bytes_per_token(model, act_bytes) * tokens
    if sequence_parallel:
        replicated /= tp
    stored = replicated + split_bytes_per_token(model, act_bytes, tp) * tokens
    if precision == "fp8":
        stored -= fp8_saved_input_savings_per_token(model, act_bytes, tp, sequence_parallel) * tokens
    if attention == "flash":
        stored += softmax_stats_bytes(model, s, b, tp)
    elif not reruns_attention(recompute):
        stored += attention_scores_bytes(model, s, b, act_bytes, tp)
    if recompute == "outputs":
        stored -= discarded_output_bytes_per_token(model, tp, sequence_parallel, precision, fp8_delayed) * tokens
    return stored


def moe_dispatch_bytes_per_layer(model: ModelSpec, s: int, b: int, tp: int, ep: int, recompute: str,
                                 imbalance: float = efficiency.EXPERT_LOAD_IMBALANCE) -> float:
    """The MoE layer's dispatched tokens, mean block, one micro-batch, one GPU:
    phi * n * e * (u*h + (u - 1)*c*f_x); phi the share of MoE layers (moe_layers_of), f_x the
    expert FFN size, c = 3 gated (gate, up, product) else 2.

    n: the (token, expert) pairs the GPU's experts process. With EP (expert TP 1) n = s*b/t * k
    (its s*b/t sequence-parallel tokens each to k experts, as many arriving as leaving on the
    mean) and u = `imbalance` (busiest GPU over the mean; EXPERT_LOAD_IMBALANCE unless
    --expert-imbalance); without EP (experts
    TP-split, expert TP = t) n = s*b*k and u = 1: every rank of the TP group gathers the
    group's tokens and runs its 1/t of every expert on all of them. The u*n*h*e bytes are the
    permuted input the grouped GEMM keeps for its weight gradient (Megatron-Core's token
    dispatchers, megatron/core/transformer/moe/token_dispatcher.py core_v0.19.0); the expert
    FFN's own intermediates, n*c*f_x/t_x*e on the mean (t_x = t without EP, 1 with), equal
    s*b*k*c*f_x/t either way and are the routed share split_bytes_per_token counts
    (params.mlp_width_per_token), so only the busiest GPU's excess (u - 1) is added. Full recompute keeps the layer input only: 0."""
    if not model.is_moe or recompute == "full":
        return 0.0
    u = busiest_gpu_load_factor(ep, imbalance, model)
    act_bytes, h = 2, model.hidden_size
    gated = 3 if model.gated_mlp else 2
    pairs = s * b * model.num_experts_per_tok / (tp if ep > 1 else 1)
    per_moe_layer = pairs * act_bytes * (u * h + (u - 1) * gated * model.expert_intermediate_size)
    return moe_layers_of(model, 1) * per_moe_layer


def recompute_working_bytes(
    model: ModelSpec, s: int, b: int, tp: int, sequence_parallel: bool, recompute: str,
    attention: str = "materialized", precision: str = "bf16", fp8_delayed: bool = False,
) -> float:
    """Transient peak while one layer is recomputed for its backward: full recompute
    materialises that layer's whole no-recompute activations less its input, which the
    checkpoint already holds and the rerun starts from (Megatron's CheckpointFunction reruns on
    its saved tensors, tensor_parallel/random.py core_v0.19.0); selective its attention
    scores (nothing with flash, which never materialises them); "outputs" the layer's
    discarded outputs (discarded_output_bytes_per_token); "op" what the layer keeps without
    recompute beyond what the per-op checkpoint kept. One layer, one micro-batch."""
    if recompute == "full":
        return (activation_bytes_per_layer(model, s, b, tp, sequence_parallel, "none", attention, precision)
                - activation_bytes_per_layer(model, s, b, tp, sequence_parallel, "full", attention, precision))
    if recompute == "selective" and attention == "materialized":
        return attention_scores_bytes(model, s, b, 2, tp)
    if recompute == "outputs":
        return discarded_output_bytes_per_token(model, tp, sequence_parallel, precision, fp8_delayed) * s * b
    if recompute == "op":  # what the block's rerun makes beyond what it kept
        return max(0.0, activation_bytes_per_layer(model, s, b, tp, sequence_parallel, "none", attention, precision)
                   - activation_bytes_per_layer(model, s, b, tp, sequence_parallel, "op", attention, precision))
    return 0.0


def micro_batches_in_flight(schedule: str, p: int, m: int, v: int = 1, stage: int = 0,
                            extra_forwards: int = 0) -> float:
    """Micro-batches whose activations stage `stage` (0 = first) holds at its peak.

    GPipe: all m on every stage (every forward before any backward). 1F1B: min(p - i, m)
    on stage i (Narayanan et al. 2021 sec. 2.2: the first stage p). Interleaved: Megatron
    warms stage i up with 2*(p-i-1) + (v-1)*p chunk forwards, plus the one in progress, so
    (2*(p-i-1) + (v-1)*p + 1)/v = p + (p-2i-1)/v stage-micro-batches; on the first stage
    p * (1 + (p-1)/(p*v)) (Korthikanti et al. 2022 sec. 4.2.3); at most m. Where p does not
    divide m, Megatron runs micro-batch groups of N > p per chunk
    (pipeline.microbatch_group_size), warming up with (v-1)*N chunk forwards instead of (v-1)*p:
    N + (2*(p-i-1) - N + 1)/v.
    `extra_forwards`: chunk forwards added to the warm-up (one with
    --overlap-moe-expert-parallel-comm, schedules.py core_v0.19.0: + 1/v of a micro-batch
    interleaved; without pipelining its combined 1F1B runs a forward beside each backward, 2
    micro-batches in flight). Without pipelining (p = 1) the schedule names nothing: each
    micro-batch runs its forward and backward before the next (Megatron's
    forward_backward_no_pipelining), so one is in flight whatever the schedule asked.
    """
    if schedule == "gpipe" and p > 1:
        return float(m)
    if schedule == "1f1b":
        return float(min(p - stage + extra_forwards, m))
    group = microbatch_group_size(p, m) or p
    return min(group + (2 * (p - stage - 1) - group + 1 + extra_forwards) / v, float(m))


def first_stage_extra_bytes(model: ModelSpec, s: int, b: int, tp: int, sequence_parallel: bool) -> float:
    """Embedding dropout mask per micro-batch in flight: s*b*h bytes (/t with SP)."""
    mask = MASK_BYTES_PER_ELEMENT * s * b * model.hidden_size
    return mask / tp if sequence_parallel else mask


def last_stage_logits_bytes(model: ModelSpec, s: int, b: int, tp: int) -> float:
    """Output layer working set for one micro-batch: 16-bit logits plus the fp32 copy
    the vocab-parallel cross-entropy keeps, (2 + 4)*s*b*V/t bytes."""
    return 6 * s * b * math.ceil(model.vocab_size / tp)


def mtp_extra_bytes(model: ModelSpec, s: int, b: int, tp: int, sequence_parallel: bool) -> float:
    """What each multi-token-prediction module keeps for one micro-batch besides its block's
    activations: its logits and loss (last_stage_logits_bytes) and the 16-bit inputs of enorm
    and hnorm (h each) and of eh_proj (their concatenation, 2h), 8*s*b*h bytes (/t with SP,
    whose shards they are: multi_token_prediction.py core_v0.14.0). 0 without MTP."""
    if not model.num_mtp_layers:
        return 0.0
    act_bytes = 2
    inputs = act_bytes * 4 * model.hidden_size * s * b  # enorm's h, hnorm's h, eh_proj's 2h per token
    return model.num_mtp_layers * (last_stage_logits_bytes(model, s, b, tp)
                                   + (inputs / tp if sequence_parallel else inputs))
