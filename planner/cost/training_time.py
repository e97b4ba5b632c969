"""Time of one training step for one configuration (pure; SI units).

Legend: b micro-batch, s sequence length, h hidden size, V vocab, t/p/d tensor, pipeline,
data-parallel degrees, m micro-batches per step, v virtual stages, L_f / L_m / L_l layers
on the first / each middle / the last stage (L/p each unless the split is uneven,
cost/stage_split.py), e = 2 bytes per 16-bit element.
Model (sources in each function): matmuls at the achievable rate (with --precision fp8
the block's linear GEMMs at the fp8 one: linear_rates) scaled per GEMM
dimension x by x/(x + 128); elementwise work memory-bound on HBM; TP collectives on the
link `place()` gives, not overlapped (Megatron-LM 2021 semantics); every stage at the
pace of the slowest, bubble (p-1)/v of its stage-times (Narayanan et al. 2021 sec. 2.2);
DP gradient reduction overlapped with the last micro-batch's backward (Megatron's
--overlap-grad-reduce). Expert parallelism (ep > 1, MoE): per MoE layer and micro-batch a
dispatch and a combine all-to-all forward and again backward (ep_seconds_per_layer), not
overlapped, the busiest GPU's extra routed-expert GEMMs, and the expert gradients reduced
over the expert-data-parallel group of t*d/ep ranks instead of d (dp_collectives).
Context parallelism (cp > 1): each rank runs every layer on its s/cp tokens (the caller
passes that chunk as s); its attention covers 1/cp of the sequence's causal pairs
(layer_seconds' cp); ring attention passes K and V chunks around the CP group, each step's
send under the current chunk's attention (cp_seconds_per_layer); gradients reduce over the
dp*cp ranks that hold the same weights (dp_collectives).
Every function here is pure and uncached; the training estimate (planner/train.py)
memoises the per-layer terms in the memo of its search.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import NamedTuple

from planner.cost import activations as act
from planner.cost import comm, efficiency, flops
from planner.cost.flops import (
    Gemm,
    attention_core_gemms,
    layer_gemms_forward,
    logits_gemm,
    moe_mlp_gemms_forward,
    window_pairs_fraction,
)
from planner.cost.moe import (
    DEEPEP_NUM_SMS,
    deepep_training_message_bytes,
    deepep_transfers,
    ep_alltoall_message_bytes,
    expert_load_factor,
    moe_layers_of,
    routed_expert_flops,
    training_permutation_bytes,
)
from planner.cost.params import (
    kv_heads_per_gpu,
    layer_linear_weights_per_gpu,
    layer_params_per_gpu,
    mlp_width_per_token,
    rotary_elements_per_token,
    training_attention_widths,
)
from planner.cost.pipeline import combined_1f1b_paired_share
from planner.cost.stage_split import StageSeconds
from planner.cost.training_memory import (
    StageParams,
    expert_data_parallel_size,
    gradient_bytes_per_param,
    optimizer_step_bytes,
    stage_params_per_gpu,
)
from planner.layout import (
    GroupTopology,
    Layout,
    Link,
    Placement,
    TrainConfig,
    dp_group_topology,
    ep_group_topology,
    expert_dp_group_topology,
)
from planner.specs import ClusterSpec, ModelSpec


@dataclass(frozen=True)
class TrainRates:
    peak_flops_per_s: float
    """Dense datasheet peak (the MFU denominator)."""
    matmul_flops_per_s: float
    """Measured maximum achievable matmul (large square GEMMs)."""
    elementwise_bytes_per_s: float
    """HBM bandwidth memory-bound kernels sustain."""
    fp8_matmul_flops_per_s: float | None = None
    """Achievable fp8 matmul rate (None: the GPU has no fp8 tensor cores, e.g. A100)."""
    gemm_half_rate_dimension: float = efficiency.GEMM_HALF_RATE_DIMENSION
    """x_half of the per-dimension shape rule x/(x + x_half) (catalog, else the default)."""
    flash_forward_flops_per_s: float | None = None
    """Flash-attention forward rate (None: FLASH_ATTENTION_FORWARD_FRACTION_OF_PEAK of the peak)."""
    flash_backward_flops_per_s: float | None = None
    """Flash-attention backward rate (None: FLASH_ATTENTION_BACKWARD_FRACTION_OF_PEAK of the peak)."""


def linear_rates(rates: TrainRates, precision: str, fp8_recipe: str = "delayed") -> TrainRates:
    """The rates a block's linear GEMMs (QKV, output projection, MLP; forward, dgrad, wgrad)
    run at: with --precision fp8 the fp8 matmul rate, Transformer Engine running all three
    GEMMs of each layer in fp8 (hybrid: e4m3 forward, e5m2 gradients; Megatron's
    fp8_wgrad defaults True, transformer_config.py core_v0.19.0), block-scaled ones
    (fp8_recipe blockwise) at TRAIN_FP8_BLOCKWISE_GEMM_RATE_RATIO of it. Attention, the LM
    head, norms and elementwise work keep `rates`."""
    if precision != "fp8":
        return rates
    assert rates.fp8_matmul_flops_per_s is not None, "train.check_precision refuses GPUs without fp8"
    ratio = efficiency.TRAIN_FP8_BLOCKWISE_GEMM_RATE_RATIO if fp8_recipe == "blockwise" else 1.0
    return replace(rates, matmul_flops_per_s=rates.fp8_matmul_flops_per_s * ratio)


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds per optimizer step; they add up to the step time."""

    compute: float
    bubble: float
    tp_comm: float
    pp_comm: float
    dp_comm_exposed: float
    ep_comm: float = 0.0
    """The EP all-to-alls of the pacing stage's MoE layers (0 without EP)."""
    cp_comm: float = 0.0
    """The ring-attention KV exchange of the pacing stage's layers not hidden under the
    attention (0 without CP)."""

    host: float = 0.0
    """The pacing stage's GPU idle time waiting on the host after each MoE layer's
    token-count sync (moe_host_exposed_seconds; 0 for a dense model)."""

    @property
    def total(self) -> float:
        return (self.compute + self.bubble + self.tp_comm + self.pp_comm + self.dp_comm_exposed + self.ep_comm
                + self.cp_comm + self.host)


@dataclass(frozen=True)
class LayerSeconds:
    """One layer, one micro-batch, one GPU: compute only (no communication)."""

    forward: float
    backward: float
    recompute: float

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


@dataclass(frozen=True)
class StepTimes:
    breakdown: TimeBreakdown
    tp_seconds_per_layer: float
    tp_link: str | None
    pp_link: str | None
    dp_link: str | None
    model_flops_per_step: float
    hardware_flops_per_step: float
    """Narayanan et al. 2021's count: with recomputation's extra forward (eq. 3 for GPT)."""
    slowest_stage: int
    """The stage that paces the pipeline (0 first, 1 a middle one, p-1 last)."""
    slowest_stage_num_layers: int
    stage_seconds_per_micro_batch: float
    """The pacing stage's compute + exposed TP per micro-batch."""
    pp_send_seconds: float
    """One pipeline boundary send (0 when pp = 1)."""
    pp_send_bytes: float
    dp: DpCollectives


def gemm_seconds(gemm: Gemm, rates: TrainRates) -> float:
    """2*M*N*K / (R * u(M)*u(N)*u(K)), u(x) = x/(x + x_half): tile and wave quantization
    (rates.gemm_half_rate_dimension: the GPU's fitted value or GEMM_HALF_RATE_DIMENSION in
    cost/efficiency.py) below the measured rate R."""
    half = rates.gemm_half_rate_dimension
    utilization = 1.0
    for dim in (gemm.m, gemm.n, gemm.k):
        utilization *= dim / (dim + half)
    return gemm.flops / (rates.matmul_flops_per_s * utilization)


def elementwise_bytes_per_layer(model: ModelSpec, s: int, b: int, tp: int,
                                sequence_parallel: bool, attention: str = "materialized") -> tuple[float, float]:
    """Forward HBM traffic of one layer's non-matmul kernels, per GPU: (all, attention scores).

    Counted kernel by kernel for Megatron's GPT block, e = 2 bytes, masks 1 byte, per token:
    two layernorms (read + write, 4e*h), two fused bias-dropout-adds (read 2, write 1,
    mask: 6e*h + 2h), all /t with sequence parallelism; Q/K/V split and context
    transposes (read + write: 2e*(2*a*d/t + 2*k_gpu*d)), with RoPE the fused rotary kernel on
    the query and key heads (read + write: 2e*(a/t + k_gpu)*d, params.rotary_elements_per_token;
    Megatron's apply_rope_fusion), the fused bias-GeLU or SwiGLU
    (2e*f/t or 3e*f/t); per attention score: written by the QK^T GEMM, read + written by the
    fused scale-mask-softmax, read + written by dropout with a 1-byte mask, read by the
    context GEMM ((6e + 1) bytes, a*s/t scores per token). GPT at t = 8: 52*h bytes per token.
    Flash attention keeps the scores on chip: no score traffic.
    """
    e, h = 2, model.hidden_size
    a, f = model.num_attention_heads, mlp_width_per_token(model)
    tokens = s * b
    replicated = (10 * e + 2) * h * tokens / (tp if sequence_parallel else 1)
    heads = training_attention_widths(model, tp).total  # (2a/t + 2k_gpu)d for GQA
    activation = (3 if model.gated_mlp else 2) * e * f / tp
    split = (2 * e * heads + 2 * e * rotary_elements_per_token(model, tp) + activation) * tokens
    scores = 0.0 if attention == "flash" else (6 * e + 1) * a * s * tokens / tp
    return replicated + split + scores, scores


def flash_attention_seconds(gemms: tuple[Gemm, ...], rates: TrainRates,
                            window_fraction: float = 1.0) -> tuple[float, float]:
    """(forward, backward) of the flash kernel for the layer's attention core: the two
    per-head GEMMs' FLOPs, halved by the causal mask, at the flash kernels' share of the
    dense peak (rates.flash_*_flops_per_s: the GPU's measured share, else the defaults); the
    backward does 2.5x the forward's FLOPs (efficiency.py, Dao 2023). `window_fraction`: the
    share of those pairs sliding-window layers leave (flops.window_pairs_fraction)."""
    core_flops = (sum(g.flops for g in attention_core_gemms(gemms)) * efficiency.CAUSAL_ATTENTION_FLOPS_FRACTION
                  * window_fraction)
    forward_rate, backward_rate = rates.flash_forward_flops_per_s, rates.flash_backward_flops_per_s
    if forward_rate is None or backward_rate is None:
        forward_share, backward_share = efficiency.flash_attention_fractions(None)
        forward_rate, backward_rate = rates.peak_flops_per_s * forward_share, rates.peak_flops_per_s * backward_share
    forward = core_flops / forward_rate
    backward = efficiency.FLASH_ATTENTION_BACKWARD_OVER_FORWARD_FLOPS * core_flops / backward_rate
    return forward, backward


class LinearGemmWidths(NamedTuple):
    """Elements per token, on one GPU, of a block's four linear GEMMs' 16-bit operands that fp8
    casts: the inputs that come out of a norm (QKV and MLP-up, the full h each: sequence-parallel
    all-gathers move the cast copy), the other inputs (the attention context a*d/t and the MLP
    activation f/t), and the four output gradients (QKV (a/t + 2*k_gpu)*d, projection h, MLP up
    (2 if gated) * f/t, down h)."""

    normed_inputs: float
    unnormed_inputs: float
    output_gradients: float


def linear_gemm_widths(model: ModelSpec, tp: int) -> LinearGemmWidths:
    """LinearGemmWidths of the model's mean block at TP t. Llama-3.1-8B at t = 1: 2 * 4096 = 8,192;
    4,096 + 14,336 = 18,432; 6,144 + 4,096 + 28,672 + 4,096 = 43,008."""
    h, f = model.hidden_size, mlp_width_per_token(model)
    widths = training_attention_widths(model, tp)
    return LinearGemmWidths(
        normed_inputs=2 * h,
        unnormed_inputs=widths.context + f / tp,
        output_gradients=(widths.query + widths.key + widths.value) + h + (2 if model.gated_mlp else 1) * f / tp + h)


def fp8_cast_bytes_per_layer(model: ModelSpec, s: int, b: int, tp: int,
                             recipe: str = "delayed", ep: int = 1) -> tuple[float, float]:
    """(forward, backward) HBM traffic of Transformer Engine's unfused fp8 casts in one layer, per
    GPU (TransformerEngine v2.18, module/linear.py and layernorm_linear.py).

    Forward, per token: the output-projection input (attention context, a*d/t) and the MLP-down
    input (activation output, f/t) arrive in 16-bit and are cast-transposed (4 B/element: the
    row-wise copy for fprop, the column-wise one the wgrad GEMM keeps); the QKV and MLP-up inputs
    are quantized inside the layernorm kernel (delayed scaling) and only transposed for wgrad
    (2 B/element on the full h of each token: sequence-parallel all-gathers move row-wise fp8).
    Backward: every linear layer's output gradient is cast-transposed for its dgrad and wgrad
    GEMMs (4 B/element): QKV (a/t + 2*k_gpu)*d, projection h, MLP up (2 if gated)*f/t, down h.
    recipe "tensorwise" (current scaling) adds the amax read of every 16-bit tensor before its
    cast (2 B/element), the layernorm outputs' included, and casts those from a 16-bit copy
    (+2 write, +2 read less the fused write). recipe "mxfp8" (MXFP8BlockScaling): every one of
    these tensors, the layernorm outputs included (the norm runs unfused and writes 16-bit),
    is quantized once into both MXFP8 copies, 4.0625 B/element
    (efficiency.TRAIN_MXFP8_CAST_BYTES_PER_ELEMENT); no amax pass. recipe "blockwise"
    (Float8BlockScaling): the same tensors into both 1x128-block copies with fp32 scales, also
    4.0625 B/element (TRAIN_FP8_BLOCKWISE_CAST_BYTES_PER_ELEMENT). Weights: cached per step,
    not counted here. Llama-3.1-8B at t = 1, per token: delayed forward 90,112 B, backward
    172,032 B; tensorwise 167,936 and 258,048 B; mxfp8 108,160 and 174,720 B.
    MoE (moe_routed_cast_bytes, `ep` the EP degree): the routed experts' grouped GEMMs take the
    permuted 16-bit copies, e per token, and give e output gradients back."""
    io = linear_gemm_widths(model, tp)
    cast_forward, norm_outputs = io.unnormed_inputs, io.normed_inputs
    cast_backward = io.output_gradients
    cast, norm, gradient = fp8_cast_bytes_per_element(recipe)
    forward = cast * cast_forward + norm * norm_outputs
    backward = gradient * cast_backward
    tokens = s * b
    routed_forward, routed_backward = moe_routed_cast_bytes(model, tp, ep, recipe)
    return (forward + routed_forward) * tokens, (backward + routed_backward) * tokens


def torchao_fp8_cast_bytes_per_element(recipe: str) -> tuple[float, float, float]:
    """HBM bytes per element of torchao's dynamic fp8 casts under torch.compile (torchtitan's
    float8 and MX converters; its fp8 job configs compile the blocks): (an activation cast once,
    an output gradient cast for both of its GEMMs, a weight cast). tensorwise: the amax
    reduction fuses into the kernel that produced the activation or gradient (assumption:
    inductor fuses a reduction into its producer), the cast reads the 16-bit tensor again and
    writes fp8: 2 + 1 = 3; the gradient, cast row-wise for dgrad and column-wise for wgrad,
    twice that, 6; a weight has no producer in the graph, so its amax reads it first: 2 + 3 = 5.
    mxfp8: no amax pass, read 2 + write 1 + a 1-byte scale per 32 = 3.03125 a cast (the weight's
    too), 6.0625 for the gradient's two."""
    if recipe == "mxfp8":
        cast = 2 + efficiency.TRAIN_MXFP8_COPY_BYTES_PER_ELEMENT
        return cast, 2 * cast, cast
    cast = 2 + 1
    return cast, 2 * cast, 2 + cast


def torchao_fp8_cast_bytes_per_layer(model: ModelSpec, s: int, b: int, tp: int,
                                     recipe: str = "tensorwise", ep: int = 1) -> tuple[float, float]:
    """(forward, backward) HBM traffic of torchao's fp8 linears in one layer, per GPU: torchao
    saves the 16-bit input and weight and quantizes both again in the backward
    (float8_linear.py matmul_with_hp_or_float8_args, mx_linear.py mx_mm: ctx.save_for_backward(
    input_hp, weight_hp...)), and keeps no fp8 weight between uses (train.saved_activation_precision,
    fp8_weight_cache_bytes: Transformer Engine's cache). Per token, with C the cast's bytes, G
    the gradient's and W the weight's (torchao_fp8_cast_bytes_per_element): forward C x the four
    GEMM inputs (the normed input h twice, the attention context a*d/t, the MLP activation f/t);
    backward G x the four output gradients (QKV, h, MLP up, h, as fp8_cast_bytes_per_layer) + C x
    the four inputs again for wgrad. Per micro-batch, the layer's linear weights on the GPU
    (params.layer_linear_weights_per_gpu) cast W forward and W again backward. The routed
    experts' token copies as Transformer Engine's (moe_routed_cast_bytes; assumption). Llama-3.1-8B
    at t = 1, tensorwise, per token: forward 3 * (2 * 4096 + 4096 + 14336) = 79,872 B; backward
    6 * (6144 + 4096 + 28672 + 4096) + 79,872 = 337,920 B; weights 5 * 218.1e6 B each way."""
    io = linear_gemm_widths(model, tp)
    inputs, gradients = io.normed_inputs + io.unnormed_inputs, io.output_gradients
    cast, gradient, weight = torchao_fp8_cast_bytes_per_element(recipe)
    weights = weight * layer_linear_weights_per_gpu(model, tp, ep)
    routed_forward, routed_backward = moe_routed_cast_bytes(model, tp, ep, recipe)
    tokens = s * b
    return ((cast * inputs + routed_forward) * tokens + weights,
            ((gradient * gradients + cast * inputs) + routed_backward) * tokens + weights)


def fp8_cast_bytes_per_element(recipe: str) -> tuple[float, float, float]:
    """HBM bytes per element of Transformer Engine's fp8 casts, (a 16-bit GEMM input cast,
    a layernorm output, an output gradient), by recipe (fp8_cast_bytes_per_layer's docstring):
    delayed (4, 2, 4): cast-transpose, the norm output only transposed; tensorwise (6, 7, 6):
    + 2 for the amax, the norm output from an unfused 16-bit copy (+2 write, +2 read, less
    the fused write); mxfp8 and blockwise 4.0625 each (both block-scaled copies)."""
    e = efficiency
    if recipe in ("mxfp8", "blockwise"):
        per_element = (e.TRAIN_MXFP8_CAST_BYTES_PER_ELEMENT if recipe == "mxfp8"
                       else e.TRAIN_FP8_BLOCKWISE_CAST_BYTES_PER_ELEMENT)
        return per_element, per_element, per_element
    cast = e.TRAIN_FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT
    norm = e.TRAIN_FP8_TRANSPOSE_BYTES_PER_ELEMENT
    if recipe == "tensorwise":
        unfused_norm = 2 + 2 + cast - 1 - norm
        amax = e.TRAIN_FP8_AMAX_BYTES_PER_ELEMENT
        return cast + amax, norm + unfused_norm, cast + amax
    return cast, norm, cast


def moe_routed_cast_bytes(model: ModelSpec, tp: int, ep: int, recipe: str) -> tuple[float, float]:
    """(forward, backward) bytes per token of the mean layer that the routed experts add to
    fp8_cast_bytes_per_layer: their MLP-up input is the e permuted 16-bit copies of each token
    (e*h/t per token with EP over the sequence-parallel tokens, e*h without: the allgather
    dispatcher's whole group), cast like any 16-bit GEMM input, and their MLP-down output
    gradient is as wide; without shared experts the layernorm output's MLP cast (quantized
    inside the norm with delayed scaling) and the dense MLP-down gradient (h each) are no
    longer there. Per element: delayed 4 (cast-transpose; the norm output 2), tensorwise 6
    (+ 2 for the amax; the norm output 7), mxfp8 and blockwise 4.0625 (both copies); times the
    MoE layers' share. Qwen3-30B-A3B (h 2,048, e 8, 48 MoE layers of 48, no shared expert),
    mxfp8, ep 8, t 1: (8 - 1) * 2,048 * 4.0625 = 58,240 B forward, as many backward."""
    if not model.is_moe:
        return 0.0, 0.0
    cast, norm, gradient = fp8_cast_bytes_per_element(recipe)
    h = model.hidden_size
    routed = model.num_experts_per_tok * h / (tp if ep > 1 else 1)
    replaced = 0 if model.num_shared_experts else h
    share = moe_layers_of(model, 1)
    return share * (cast * routed - norm * replaced), share * gradient * (routed - replaced)


def linear_gemm_seconds(model: ModelSpec, gemms: tuple[Gemm, ...], b: int, s: int, tp: int, rates: TrainRates,
                        ep: int = 1, dp_per_ep_group: int = 1) -> float:
    """The block's linear GEMMs (QKV, output projection, MLP up and down, a hybrid's
    recurrent projections), forward, at `rates`. MoE: the mean block, phi MoE layers
    (moe_layers_of) whose MLP is the shared and routed experts' GEMMs
    (flops.moe_mlp_gemms_forward: EP changes their shapes), the rest of the MLP-bearing
    share (layer_gemms_forward's MLP count: 1 less a hybrid's mixer-only blocks) dense."""
    mixer = sum(gemm_seconds(gemms[i], rates) for i in (flops.QUERY_GEMM, flops.OUTPUT_GEMM))
    mixer += sum(gemm_seconds(g, rates) for g in gemms[flops.EXTRA_GEMMS])
    dense_mlp = sum(gemm_seconds(gemms[i], rates) for i in (flops.MLP_UP_GEMM, flops.MLP_DOWN_GEMM))
    if not model.is_moe:
        return mixer + dense_mlp
    share, mlp_share = moe_layers_of(model, 1), gemms[flops.MLP_UP_GEMM].count
    dense = dense_mlp * max(0.0, mlp_share - share) / mlp_share if mlp_share else 0.0
    moe_mlp = sum(gemm_seconds(g, rates) for g in moe_mlp_gemms_forward(model, b, s, tp, ep, dp_per_ep_group))
    return mixer + share * moe_mlp + dense


def layer_seconds(model: ModelSpec, s: int, b: int, tp: int, sequence_parallel: bool,
                  recompute: str, rates: TrainRates, attention: str = "materialized",
                  precision: str = "bf16", ep: int = 1, dp_per_ep_group: int = 1, cp: int = 1,
                  fp8_recipe: str = "delayed", engine: str = "megatron") -> LayerSeconds:
    """Forward: GEMMs + elementwise traffic at the HBM rate. Backward: 2x the GEMMs and
    ELEMENTWISE_BWD_OVER_FWD x the traffic. Recompute: full repeats the forward; selective
    repeats the attention core and its softmax/dropout traffic (Korthikanti et al. 2022);
    "outputs" what Megatron's output-discarding checkpoints rerun (outputs_recompute_seconds).
    Flash attention: the attention core is one fused kernel (flash_attention_seconds) with no
    score traffic; selective recompute reruns its forward. FP8: the four linear GEMMs at
    linear_rates' fp8 rate (same shape rule), the attention core and the traffic as bf16, plus
    Transformer Engine's unfused fp8 casts and transposes (fp8_cast_bytes_per_layer) at the
    HBM rate (fp8_recipe: delayed, tensorwise, mxfp8 or blockwise), or under torchtitan (`engine`)
    torchao's, which quantize the inputs and weights again in the backward
    (torchao_fp8_cast_bytes_per_layer); full recompute repeats the forward's.
    MoE: the MLP GEMMs of linear_gemm_seconds (ep, dp_per_ep_group: the EP layout), and the
    dispatcher's token permutation at the HBM rate forward and again backward
    (moe.training_permutation_bytes).
    CP: s is the rank's chunk s/cp; its flash attention does cp times the chunk's own causal
    pairs, (s/cp)^2/2 per ring step over cp steps = 1/cp of the sequence's s^2/2 (the
    load-balanced split, cp_seconds_per_layer); flash attention only."""
    gemms = layer_gemms_forward(model, b, s, tp)
    traffic, scores = elementwise_bytes_per_layer(model, s, b, tp, sequence_parallel, attention)
    hbm = rates.elementwise_bytes_per_s
    # MoE: the dispatcher's token permutation, as much again backward (the mean block's share)
    permute = moe_layers_of(model, 1) * training_permutation_bytes(model, s * b, tp, ep) / hbm
    linear = linear_rates(rates, precision, fp8_recipe)
    casts = torchao_fp8_cast_bytes_per_layer if engine == "torchtitan" else fp8_cast_bytes_per_layer
    casts_forward, casts_backward = (casts(model, s, b, tp, fp8_recipe, ep) if precision == "fp8" else (0.0, 0.0))
    if attention == "flash":
        dense = linear_gemm_seconds(model, gemms, b, s, tp, linear, ep, dp_per_ep_group)
        # sliding-window layers skip the pairs outside the window (of the whole sequence, s * cp)
        step_forward, step_backward = flash_attention_seconds(gemms, rates, window_pairs_fraction(model, s * cp))
        core_forward, core_backward = cp * step_forward, cp * step_backward
        forward = dense + core_forward + (traffic + casts_forward) / hbm + permute
        backward = (2 * dense + core_backward
                    + (efficiency.ELEMENTWISE_BWD_OVER_FWD * traffic + casts_backward) / hbm + permute)
        core_again = core_forward
    else:
        assert cp == 1, "config_reasons refuses CP without flash attention"
        gemm_forward = (linear_gemm_seconds(model, gemms, b, s, tp, linear, ep, dp_per_ep_group)
                        + sum(gemm_seconds(g, rates) for g in attention_core_gemms(gemms)))
        forward = gemm_forward + (traffic + casts_forward) / hbm + permute
        backward = (2 * gemm_forward + (efficiency.ELEMENTWISE_BWD_OVER_FWD * traffic + casts_backward) / hbm
                    + permute)
        core_again = sum(gemm_seconds(g, rates) for g in attention_core_gemms(gemms)) + scores / hbm
    if recompute == "full":
        extra = forward
    elif recompute == "selective":
        extra = core_again
    elif recompute == "outputs":
        extra = outputs_recompute_seconds(model, gemms, s, b, tp, sequence_parallel, linear,
                                          precision == "fp8" and fp8_recipe == "delayed")
    elif recompute == "op":
        extra = (sum(gemm_seconds(g, linear) for g in op_recomputed_gemms(model, gemms, tp))
                 + (traffic + casts_forward) / hbm)
    else:
        extra = 0.0
    return LayerSeconds(forward, backward, extra)


def op_recomputed_gemms(model: ModelSpec, gemms: tuple[Gemm, ...], tp: int) -> tuple[Gemm, Gemm, Gemm]:
    """The matmuls torchtitan's per-op selective checkpointing runs again (recompute "op",
    activations.op_checkpoint_saved_bytes_per_token): every second of a Llama block's wq, wk,
    wv, wo, w1, w3, w2, i.e. wk [bs, h] x [h, k_gpu*d], wo (the output projection) and w3 [bs, h] x
    [h, f/t] (half the gated MLP-up GEMM). Llama-3.1-8B at t = 1: 4,096*(1,024 + 4,096 +
    14,336) = 79.7M of the block's 218.1M multiply-adds per token, 36.5%."""
    up = gemms[flops.MLP_UP_GEMM]
    query = gemms[flops.QUERY_GEMM]
    key = Gemm(query.m, kv_heads_per_gpu(model, tp) * model.head_dim, query.k, query.count)
    return key, gemms[flops.OUTPUT_GEMM], Gemm(up.m, up.n // 2, up.k, up.count)


def outputs_recompute_seconds(model: ModelSpec, gemms: tuple[Gemm, ...], s: int, b: int, tp: int,
                              sequence_parallel: bool, linear: TrainRates, fp8_delayed: bool = False) -> float:
    """What recompute "outputs" (activations.outputs_recompute_modules) runs again before the
    backward, per layer and micro-batch: moe_act the routed experts' activation (read the gate
    and up outputs, write the product: (3 if gated else 2) * e * phi*k*f_x/t bytes per token);
    layernorm each discarded norm (read and write e*h, /t with SP: phi of them, plus MLA's input
    norm); mla_up_proj the query and KV up-projection GEMMs (flops.QUERY_GEMM and MLA_KV_UP_GEMM
    for MLA, at the linear rate and the shape rule) and RoPE's rewrite of their rotary
    parts (2e per element, rotary_elements_per_token). The HBM traffic at the elementwise rate.
    Qwen3-30B-A3B, t = 1, 4,096 tokens, bf16: (3 * 2 * 8 * 768 + 2 * 2 * 2,048) * 4,096 =
    184.5 MB. `fp8_delayed`: mla_up_proj only (activations.outputs_recompute_modules)."""
    e, discarded = 2, act.discarded_outputs(model, tp, sequence_parallel, fp8_delayed)
    per_token = (3 if model.gated_mlp else 2) * e * discarded.moe_act + 2 * e * discarded.norm
    seconds = 0.0
    if model.is_mla:
        per_token += 2 * e * rotary_elements_per_token(model, tp)
        seconds += gemm_seconds(gemms[flops.QUERY_GEMM], linear) + gemm_seconds(gemms[flops.MLA_KV_UP_GEMM], linear)
    return seconds + per_token * s * b / linear.elementwise_bytes_per_s


@dataclass(frozen=True)
class TpSeconds:
    """TP collectives of one layer, one micro-batch."""

    total: float
    """Every collective: 2 forward, 2 backward, 2 more with full recompute."""
    exposed: float
    """What the compute does not hide: the backward ones overlap the weight-gradient GEMMs."""
    allreduce_seconds: float = 0.0
    """One all-reduce of the layer's b*s*h*e bytes (an all-gather or reduce-scatter with
    sequence parallelism takes half)."""
    message_bytes: float = 0.0
    """b*s*h*e: what one all-reduce carries."""
    measured: bool = False
    """True when allreduce_seconds is the probe's curve at this size."""


def tp_seconds_per_layer(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig,
                         s: int, placement: Placement, rates: TrainRates) -> TpSeconds:
    """TP collectives of one layer, each on b*s*h*e bytes (Shoeybi et al. 2019; Narayanan
    et al. 2021 sec. 3.2: 8*b*s*h*(t-1)/t elements per device per layer, no recompute).

    Forward: 2 all-reduces (with sequence parallelism 2 all-gathers + 2 reduce-scatters, the
    same ring time); full recompute repeats them, torchtitan's per-op checkpoint ("op", always
    with SP) its all-gathers. Backward, Megatron's
    LinearWithGradAccumulationAndAsyncCommunication: without SP the 2 input-gradient
    all-reduces of the column-parallel GEMMs (QKV, MLP up) run under their weight-gradient
    GEMMs; with SP the 2 all-gathers of the output gradient before the row-parallel GEMMs
    are exposed, the re-gather of the column-parallel input hides under its data-gradient
    GEMM and the input-gradient reduce-scatter under its weight-gradient GEMM
    (Korthikanti et al. 2022 sec. 4.2.2). Only what exceeds the GEMM is exposed.
    With --tp-comm-overlap (SP only) every forward all-gather and reduce-scatter, and the
    backward all-gathers before the row-parallel data-gradient GEMMs, are pipelined with
    their GEMM (overlapped_exposed_seconds)."""
    link = placement.tp_link
    if config.tp == 1 or link is None:
        return TpSeconds(0.0, 0.0)
    message_bytes = 2 * config.micro_batch_size * s * model.hidden_size
    curve = cluster.allreduce_curve(link.scope, config.tp)
    allreduce = comm.allreduce_seconds(message_bytes, placement.tp_group, curve, hierarchical=True)
    # the recomputed forward's collectives: full reruns all four; torchtitan's per-op checkpoint
    # its two all-gathers (the inputs of wk and w3, sequence-sharded; the reduce-scatters' outputs are kept)
    forward = {"full": 4, "op": 3}.get(config.recompute, 2) * allreduce
    gemms = layer_gemms_forward(model, config.micro_batch_size, s, config.tp)
    linear = linear_rates(rates, config.precision, config.priced_fp8_recipe)
    column_parallel = [gemm_seconds(g, linear) for g in (gemms[flops.QUERY_GEMM], gemms[flops.MLP_UP_GEMM])]
    measured = curve is not None
    if config.sequence_parallel:
        half = allreduce / 2
        hidden = sum(2 * max(0.0, half - gemm) for gemm in column_parallel)
        if config.tp_comm_overlap:
            row_parallel = [gemm_seconds(g, linear) for g in (gemms[flops.OUTPUT_GEMM], gemms[flops.MLP_DOWN_GEMM])]
            forward_exposed = sum(overlapped_exposed_seconds(half, gemm, config.tp)
                                  for gemm in column_parallel + row_parallel)
            backward_exposed = sum(overlapped_exposed_seconds(half, gemm, config.tp) for gemm in row_parallel)
            passes = 2 if config.recompute == "full" else 1
            return TpSeconds(forward + 3 * allreduce, passes * forward_exposed + backward_exposed + hidden,
                             allreduce, message_bytes, measured)
        return TpSeconds(forward + 3 * allreduce, forward + allreduce + hidden, allreduce, message_bytes, measured)
    hidden = sum(max(0.0, allreduce - gemm) for gemm in column_parallel)
    return TpSeconds(forward + 2 * allreduce, forward + hidden, allreduce, message_bytes, measured)


def overlapped_exposed_seconds(comm_seconds: float, gemm_seconds_: float, tp: int) -> float:
    """One collective pipelined with its GEMM in t chunks (Transformer Engine userbuffers:
    ring-exchange all-gathers and pipelined reduce-scatters, transformer_engine/pytorch/
    module/base.py initialize_ub at v2.18): the longer of the two runs end to end, and the
    first (or last) chunk of the shorter cannot overlap: max(c, g) - g + min(c, g)/t.
    c = 2 ms, g = 3 ms, t = 8: 0 + 0.25 ms; c = 3 ms, g = 2 ms: 1 + 0.25 ms."""
    return max(0.0, comm_seconds - gemm_seconds_) + min(comm_seconds, gemm_seconds_) / tp


@dataclass(frozen=True)
class EpSeconds:
    """Expert parallelism of one MoE layer, one micro-batch, one GPU (all 0 without EP)."""

    alltoall_seconds: float = 0.0
    """One dispatch or combine all-to-all of message_bytes over the EP group (DeepEP: the mean
    of its dispatch and its combine)."""
    message_bytes: float = 0.0
    """S = b*s/t * k * h * e: what one GPU sends in one all-to-all (DeepEP: its NVLink and RDMA
    bytes, the mean of dispatch and combine)."""
    num_alltoalls: int = 0
    """Per MoE layer: dispatch + combine forward and backward (4), 6 with full recompute."""
    imbalance_seconds: float = 0.0
    """The busiest GPU's routed-expert GEMMs beyond the mean (forward, backward, recompute)."""
    moe_layer_share: float = 0.0
    """phi: MoE layers per layer (the mean block's share, moe_layers_of)."""
    link: str | None = None
    """The slowest link the all-to-all crosses (the NICs once the group spans nodes)."""
    measured: bool = False
    """True when alltoall_seconds is the probe's all-to-all curve at this link and size."""
    exposed_seconds_per_moe_layer: float | None = None
    """With --overlap-moe-expert-parallel-comm, what one MoE layer's all-to-alls leave exposed
    (moe_overlap_exposed_seconds); None without it: all of them."""
    dispatcher: str = "alltoall"
    """The token dispatcher priced: alltoall (NCCL all-to-alls) or deepep (Megatron's flex
    dispatcher on DeepEP's normal kernels)."""
    fixed_seconds: float = 0.0
    """DeepEP's fixed cost inside alltoall_seconds (EpTransfer.fixed_seconds)."""

    @property
    def alltoall_seconds_per_moe_layer(self) -> float:
        return self.num_alltoalls * self.alltoall_seconds

    @property
    def comm_seconds_per_layer(self) -> float:
        """The mean block's exposed all-to-all time: phi * n_a2a * T_a2a, or phi times what the
        overlap leaves."""
        exposed = self.exposed_seconds_per_moe_layer
        return self.moe_layer_share * (self.alltoall_seconds_per_moe_layer if exposed is None else exposed)

    def comm_seconds_per_layer_paired(self, paired_share: float) -> float:
        """comm_seconds_per_layer where only `paired_share` of the micro-batches' passes run
        paired under the combined 1F1B (pipeline.combined_1f1b_paired_share): the rest leave all
        of their all-to-alls exposed, phi * (f*E + (1-f)*n_a2a*T_a2a). Without the overlap: all."""
        exposed = self.exposed_seconds_per_moe_layer
        if exposed is None:
            return self.comm_seconds_per_layer
        full = self.alltoall_seconds_per_moe_layer
        return self.moe_layer_share * (paired_share * exposed + (1.0 - paired_share) * full)

    @property
    def compute_seconds_per_layer(self) -> float:
        """The mean block's extra routed GEMM time on the busiest GPU."""
        return self.moe_layer_share * self.imbalance_seconds


def ep_seconds_per_layer(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, s: int,
                         rates: TrainRates, imbalance: float = efficiency.EXPERT_LOAD_IMBALANCE) -> EpSeconds:
    """Per MoE layer and micro-batch: n_a2a all-to-alls of S = b*s/t * k * h * e bytes over the
    EP group placed in Megatron's rank order (ep consecutive ranks, ep_group_topology with
    pp outermost), comm.alltoall_seconds; n_a2a = 4 (dispatch and combine forward, their
    gradients backward; Megatron's alltoall token dispatcher, token_dispatcher.py
    core_v0.19.0), 6 with full recompute (the forward pair again). S: each GPU dispatches
    its s*b/t sequence-parallel tokens, each to k experts. Routed GEMMs: (u - 1) * n_pass *
    2*k*P_x*b*s/t / R on the busiest GPU, u = `imbalance` (--expert-imbalance), n_pass = 3 (4 with full
    recompute), R the linear GEMM rate. The probe's all-to-all curve replaces the model where
    it measured this link at ep ranks. All exposed here; layer_terms prices Megatron's
    combined 1F1B (--overlap-moe-expert-parallel-comm) where the configuration runs it.
    config.moe_dispatcher deepep: the same count of transfers on DeepEP instead
    (deepep_alltoall_seconds)."""
    layout, b = config.layout, config.micro_batch_size
    if config.ep <= 1 or not model.is_moe:
        return EpSeconds()
    group = ep_group_topology(cluster, layout, pp_outermost=True)
    assert group is not None, "ep > 1 has a group"
    full = config.recompute == "full"
    link = group.inter or group.intra
    transfer = ep_transfer_seconds(model, cluster, config, b * s)
    return EpSeconds(transfer.seconds, transfer.sent_bytes, 6 if full else 4,
                     ep_imbalance_seconds(model, config, s, rates, imbalance), moe_layers_of(model, 1),
                     None if link is None else link.kind, transfer.measured, dispatcher=config.moe_dispatcher,
                     fixed_seconds=transfer.fixed_seconds)


def ep_imbalance_seconds(model: ModelSpec, config: TrainConfig, s: int, rates: TrainRates,
                         imbalance: float = efficiency.EXPERT_LOAD_IMBALANCE) -> float:
    """EpSeconds.imbalance_seconds: the busiest EP GPU's routed GEMMs beyond the mean GPU's,
    (u - 1) * n_pass * 2*k*P_x*b*s/t / R per MoE layer (ep_seconds_per_layer)."""
    share = moe_layers_of(model, 1)
    routed_flops = routed_expert_flops(model, 1, config.micro_batch_size * s / config.tp) / share
    load = expert_load_factor(config.layout, imbalance, model)
    return (load - 1) * (4 if config.recompute == "full" else 3) * routed_flops / linear_rates(
        rates, config.precision, config.priced_fp8_recipe).matmul_flops_per_s


class EpTransfer(NamedTuple):
    """One of an MoE layer's EP transfers (ep_transfer_seconds)."""

    seconds: float
    sent_bytes: float
    """What one GPU sends (DeepEP: NVLink + RDMA, the mean of dispatch and combine)."""
    fixed_seconds: float
    """DeepEP's fixed cost inside `seconds` (efficiency.deepep_fixed_seconds); 0 for NCCL, whose
    latency is inside the ring model or the probe's curve."""
    measured: bool
    """Whether the probe's all-to-all curve priced it."""


def ep_transfer_seconds(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig,
                        tokens: float) -> EpTransfer:
    """One of an MoE layer's EP transfers for a micro-batch of `tokens` (b*s), on config.moe_dispatcher: NCCL's all-to-all
    of ep_alltoall_message_bytes (comm.alltoall_seconds, the probe's curve where it measured this
    link at ep ranks) or DeepEP's (deepep_alltoall_seconds). ep > 1."""
    layout = config.layout
    group = ep_group_topology(cluster, layout, pp_outermost=True)
    assert group is not None, "ep > 1 has a group"
    if config.moe_dispatcher == "deepep":
        seconds, sent = deepep_alltoall_seconds(model, layout, group, tokens / config.tp)
        return EpTransfer(seconds, sent, efficiency.deepep_fixed_seconds("deepep_high_throughput", group.num_nodes),
                          False)
    link = group.inter or group.intra
    message_bytes = ep_alltoall_message_bytes(model, layout, tokens)
    curve = None if link is None else cluster.alltoall_curve(link.scope, config.ep)
    return EpTransfer(comm.alltoall_seconds(message_bytes, group, curve), message_bytes, 0.0, curve is not None)


def deepep_alltoall_seconds(model: ModelSpec, layout: Layout, group: GroupTopology,
                            tokens_per_rank: float) -> tuple[float, float]:
    """(seconds, bytes sent) of one DeepEP transfer in Megatron's flex dispatcher, the mean of the
    dispatch and the combine (the backward runs each one's mirror: the combine's gradient is a
    dispatch, the dispatch's a combine). Each is DeepEP's normal (high-throughput) kernel
    (moe.deepep_traffic: a token crosses to another node once per node holding one of its
    experts, and to another GPU of its node once per GPU hit) with Megatron's messages
    (moe.deepep_training_message_bytes: 16-bit hidden states), priced by comm.deepep_seconds
    with DeepEP's measured fixed cost over the group's nodes
    (efficiency.deepep_fixed_seconds("deepep_high_throughput", nodes)). tokens_per_rank: the
    GPU's b*s/t sequence-parallel tokens. Megatron's token_dispatcher.py (MoEFlexTokenDispatcher)
    and fused_a2a.py, core_v0.19.0; docs/cost-model.md (Expert parallelism: DeepEP in training)."""
    transfers = deepep_transfers(model, layout, group, tokens_per_rank, "deepep_high_throughput",
                                 lambda phase: deepep_training_message_bytes(model, phase))
    return (sum(seconds for _, _, seconds in transfers) / 2,
            sum(nvlink + rdma for nvlink, rdma, _ in transfers) / 2)


@dataclass(frozen=True)
class CpSeconds:
    """Ring attention of one layer, one micro-batch, one GPU (all 0 without CP)."""

    kv_chunk_bytes: float = 0.0
    """One K and V chunk: 2 * b * (s/cp) * k_gpu * d * e."""
    send_seconds: float = 0.0
    """One forward ring step's send of kv_chunk_bytes (the backward's sends twice that)."""
    step_forward_seconds: float = 0.0
    """The attention one forward ring step computes (1/cp of the rank's)."""
    step_backward_seconds: float = 0.0
    total: float = 0.0
    """Every send of the layer: (cp-1) forward, (cp-1) backward of KV and dKV, again with
    recompute."""
    exposed: float = 0.0
    """What the attention does not hide: sum over ring steps of max(0, send - step compute)."""
    link: str | None = None
    """The slowest hop of the ring (NVLink inside a node, the NICs across)."""


def cp_seconds_per_layer(model: ModelSpec, config: TrainConfig, chunk_tokens: int, placement: Placement,
                         rates: TrainRates, rotation: str = "ring") -> CpSeconds:
    """Ring attention's KV exchange of one layer: cp - 1 steps forward, each sending one KV
    chunk S = 2*b*(s/cp)*k_gpu*d*e bytes (k_gpu = kv_heads_per_gpu: GQA shrinks it; MLA sends
    a/t heads of keys and values, d_nope + d_rope and d_v: training_attention_widths) to the
    next rank while the current chunk's attention runs; backward the same cp - 1 steps, each
    sending KV and dKV (2S). Exposed per step: max(0, alpha + S/beta - step compute).

    Source: Megatron-Core's context-parallel guide (docs/user-guide/features/context_parallel.md,
    core_v0.19.0: all-gather of KV forward, reduce-scatter of dKV backward, "implemented as
    point-to-point communications in a ring topology", load-balanced causal split) and
    Transformer Engine's AttnFuncWithCPAndKVP2P (transformer_engine/pytorch/attention/
    dot_product_attention/context_parallel.py: "overlap current-step compute with next-step
    communication"; backward passes kv and dkv). With the zig-zag split every step computes
    (s/cp)^2/2 causal pairs (the diagonal step the two half-chunks' lower triangles and one
    full quarter, every other step half of the queries or half of the keys: TE's
    "lower-triangle" / "upper-triangle" sections): flash_attention_seconds at the chunk.
    Assumptions: the link is the ring's slowest hop (placement.cp_link: the NICs once the
    ring spans nodes, each GPU its share); full and selective recompute rerun the forward
    ring (selective recomputes the attention core); the first step's compute and the last
    step's have no send to hide.

    rotation "allgather" (torchtitan: torch's _AllGatherRotater, the default rotate method,
    torch/distributed/tensor/experimental/_context_parallel/_attention.py at torch 2.13): the
    forward gathers every chunk at once, cp - 1 ring steps of S back to back, behind only the
    first (local) step's attention; the backward gathers KV the same way behind its first
    step, and passes dKV around the ring one chunk (S) per step (its dkv rotater is
    all-to-all), each hidden under a step as above."""
    cp, b = config.cp, config.micro_batch_size
    link = placement.cp_link
    if cp <= 1 or link is None:
        return CpSeconds()
    e = 2  # 16-bit K and V
    widths = training_attention_widths(model, config.tp)
    kv_bytes = b * chunk_tokens * (widths.key + widths.value) * e
    step_forward, step_backward = flash_attention_seconds(layer_gemms_forward(model, b, chunk_tokens, config.tp),
                                                          rates, window_pairs_fraction(model, chunk_tokens * cp))
    send_forward = comm.p2p_seconds(kv_bytes, link)
    send_backward = comm.p2p_seconds(2 * kv_bytes, link)
    forward_passes = 2 if act.reruns_attention(config.recompute) else 1
    steps = cp - 1
    if rotation == "allgather":
        gather = steps * send_forward  # cp - 1 chunks of S; the backward's dKV ring moves as many
        total = (forward_passes + 2) * gather
        exposed = (forward_passes * max(0.0, gather - step_forward) + max(0.0, gather - step_backward)
                   + steps * max(0.0, send_forward - step_backward))
        return CpSeconds(kv_bytes, send_forward, step_forward, step_backward, total, exposed, link.kind)
    total = steps * (forward_passes * send_forward + send_backward)
    exposed = steps * (forward_passes * max(0.0, send_forward - step_forward)
                       + max(0.0, send_backward - step_backward))
    return CpSeconds(kv_bytes, send_forward, step_forward, step_backward, total, exposed, link.kind)


def dp_link(cluster: ClusterSpec, config: TrainConfig) -> Link | None:
    """The slowest hop of the data-parallel ring (with CP: the dp*cp ranks holding the same
    weights), placed as dp_collectives prices it (dp_group_topology): the NICs once the group
    leaves the node, else the node's links; None without data parallelism."""
    if config.dp_cp == 1:
        return None
    group = dp_group_topology(cluster, config.layout)
    return group.inter or group.intra


@dataclass(frozen=True)
class DpCollectives:
    """One GPU's data-parallel collectives of one step (each one call)."""

    gradient_bytes: float
    """fp32 gradients of the worst stage's parameters (4 B/param)."""
    gradient_seconds: float
    """Their all-reduce (ZeRO-0) or reduce-scatter (ZeRO >= 1; once per micro-batch at 2-3)."""
    weight_bytes: float
    """16-bit weights (2 B/param)."""
    gather_seconds: float
    """Their all-gather (ZeRO >= 1; 0 without)."""
    experts: DpCollectives | None = None
    """With EP: the routed experts' share of the above (bytes and seconds included in the
    totals), reduced over the expert-data-parallel group of expert_num_ranks ranks."""
    expert_num_ranks: int = 0
    """d_x = t*d/ep (0 without EP)."""


def dp_collectives(params_per_gpu: float, config: TrainConfig, cluster: ClusterSpec,
                   routed_expert_params: float = 0.0, num_units: int = 1) -> DpCollectives:
    """Ring times of the data-parallel group with CP (the dp*cp ranks over which Megatron
    reduces gradients and shards the optimizer), placed as Megatron places it
    (dp_group_topology) and priced two-level where it spans nodes: NVLink inside a node, each
    GPU's share across the nodes on its own NICs (comm.group_allreduce_seconds,
    comm.group_allgather_seconds), at NCCL's achieved bus bandwidth. With EP the
    routed_expert_params among params_per_gpu reduce (and gather) over the
    expert-data-parallel group of d_x = t*cp*d/ep ranks at stride ep instead (a second ring,
    after the dense one). With ZeRO-2/3 (Megatron-FSDP, torch FSDP2) every collective runs per
    FSDP unit, one transformer layer each: `num_units` calls of 1/num_units of the bytes, each
    paying the ring's latency (_dp_ring_collectives)."""
    group = dp_group_topology(cluster, config.layout)
    calls = num_units if config.zero_stage >= 2 else 1
    if config.ep > 1 and routed_expert_params > 0:
        num_expert_ranks = expert_data_parallel_size(config.tp, config.dp, config.ep, config.cp)
        dense = _dp_ring_collectives(params_per_gpu - routed_expert_params, config.zero_stage, group,
                                     gradient_bytes_per_param(config), calls)
        experts = _dp_ring_collectives(routed_expert_params, config.zero_stage,
                                       expert_dp_group_topology(cluster, config.layout, num_expert_ranks),
                                       gradient_bytes_per_param(config), calls)
        return DpCollectives(dense.gradient_bytes + experts.gradient_bytes,
                             dense.gradient_seconds + experts.gradient_seconds,
                             dense.weight_bytes + experts.weight_bytes,
                             dense.gather_seconds + experts.gather_seconds,
                             experts, num_expert_ranks)
    return _dp_ring_collectives(params_per_gpu, config.zero_stage, group, gradient_bytes_per_param(config), calls)


def _dp_ring_collectives(params_per_gpu: float, zero_stage: int, group: GroupTopology | None,
                         grad_bytes_per_param: float = efficiency.TRAIN_BYTES_PER_PARAM_GRADIENTS,
                         num_calls: int = 1) -> DpCollectives:
    """z = 0: an all-reduce of the gradients (fp32 unless --grad-reduce bf16); z >= 1: their
    reduce-scatter and an all-gather of the 16-bit weights, over one placed group (None:
    nothing to combine); each as `num_calls` collectives of 1/num_calls of the bytes (the
    seconds of all of them: the latency paid num_calls times)."""
    grad_bytes = params_per_gpu * grad_bytes_per_param
    weight_bytes = params_per_gpu * efficiency.TRAIN_BYTES_PER_PARAM_WEIGHTS
    group = comm.effective_group(group)
    if group is None or group.num_ranks <= 1:
        return DpCollectives(grad_bytes, 0.0, weight_bytes, 0.0)
    if zero_stage == 0:
        return DpCollectives(grad_bytes, comm.group_allreduce_seconds(grad_bytes, group), weight_bytes, 0.0)
    n = max(1, num_calls)
    return DpCollectives(grad_bytes, n * comm.group_allgather_seconds(grad_bytes / n, group),
                         weight_bytes, n * comm.group_allgather_seconds(weight_bytes / n, group))


@dataclass(frozen=True)
class DpWindows:
    """The compute a stage's data-parallel traffic can hide under, per step."""

    backward_seconds: float
    """The last micro-batch's backward (and recompute) on the first stage: where the
    gradient buckets reduce as they are produced (--overlap-grad-reduce)."""
    forward_seconds: float
    """The first micro-batch's forward on the stage: where the weight buckets gathered after
    the optimizer step are waited for, layer by layer (--overlap-param-gather)."""
    micro_batch_seconds: float
    """One micro-batch's forward + backward on the stage (ZeRO-3 gathers under it)."""
    num_units: int
    """Layers on the stage: the granularity of the gathers (Megatron-FSDP's fsdp_unit_modules
    are the transformer layers; the distributed optimizer's buckets about as fine)."""


def dp_exposed_seconds(config: TrainConfig, collectives: DpCollectives, windows: DpWindows, m: int,
                       reductions: int = 1, gathers: float | None = None) -> float:
    """Data-parallel traffic left on the critical path.

    z = 0: all-reduce of fp32 grads (4 B/param) under the backward window. z = 1
    (distributed optimizer): reduce-scatter of the grads under the backward window, then the
    all-gather of the 16-bit weights (2 B/param) under the next step's first forward
    (--overlap-param-gather, megatron/core/distributed/param_and_grad_buffer.py: each
    bucket's gather is waited for by the forward pre-hook of its first layer), of which the
    first layer's share can never hide. z = 2 (Megatron-FSDP optim_grads): a reduce-scatter
    per micro-batch under that micro-batch's backward, the gather as z = 1. z = 3
    (optim_grads_params): per micro-batch the weights are gathered before forward and again
    before backward (and the recompute) and the gradients reduce-scattered, each layer's
    prefetched under the previous layer's compute: the micro-batch hides
    what it can, and the first layer's gather waits with nothing to hide under (ZeRO,
    Rajbhandari et al. 2020; PyTorch FSDP, Zhao et al. 2023 sec. 3.3, backward/forward
    prefetch). `reductions`: the z = 0 all-reduces a step makes (gradient_reductions_per_step:
    Megatron's one, accumulating under no_sync; torchtitan's DDP one per micro-batch).
    """
    if config.dp_cp == 1:
        return 0.0
    scatter, gather = collectives.gradient_seconds, collectives.gather_seconds
    first_unit_gather = gather / max(1, windows.num_units)
    if config.zero_stage == 0:  # `reductions`: torchtitan's DDP all-reduces after every micro-batch
        return reductions * max(0.0, scatter - windows.backward_seconds)
    gather_exposed = max(first_unit_gather, gather - windows.forward_seconds)
    if config.zero_stage == 1:
        return max(0.0, scatter - windows.backward_seconds) + gather_exposed
    if config.zero_stage == 2:
        return m * max(0.0, scatter - windows.backward_seconds) + gather_exposed
    gathers = zero3_gathers_per_micro_batch("megatron", config) if gathers is None else gathers
    return m * max(first_unit_gather, scatter + gathers * gather - windows.micro_batch_seconds)


def zero3_gathers_per_micro_batch(engine: str, config: TrainConfig, rerun_share: float = 1.0) -> float:
    """ZeRO-3's weight all-gathers per micro-batch: before the forward and again before the
    backward; Megatron-FSDP once more for full recompute's rerun forward (under block recompute
    only for the rerun layers: `rerun_share` of them, train.recomputed_share); torchtitan's FSDP2
    not (it applies activation checkpointing inside each fully_shard unit, whose pre-backward
    unshard already holds the weights when the checkpoint reruns the forward: v0.2.2
    parallelize.py applies AC before fully_shard; a CLI read)."""
    return 2 + rerun_share if config.recompute == "full" and engine != "torchtitan" else 2


def pp_send_bytes(model: ModelSpec, config: TrainConfig, s: int) -> float:
    """b*s*h*e/t: Megatron scatters a boundary's activations over the TP ranks."""
    return 2 * config.micro_batch_size * s * model.hidden_size / config.tp


def pp_send_seconds(model: ModelSpec, config: TrainConfig, s: int, link: Link | None) -> float:
    """One boundary send, alpha + S/beta (0 when pp = 1)."""
    if config.pp == 1:
        return 0.0
    return comm.p2p_seconds(pp_send_bytes(model, config, s), link)


def pp_seconds(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, s: int, m: int,
               link: Link | None, send_seconds: float | None = None) -> float:
    """2*(v*m + p - 1) boundary sends on the critical path, each b*s*h*e/t bytes per GPU
    (Megatron's scatter/gather across the TP ranks, or sequence-parallel shards), alpha + S/beta;
    tied embeddings, or the MTP modules' shared one, add a 4*V*h/t-byte gradient all-reduce
    between first and last stage (finalize_model_grads.py core_v0.14.0).
    `send_seconds`: pp_send_seconds(model, config, s, link) when the caller has it."""
    if config.pp == 1:
        return 0.0
    sends = 2 * (config.virtual_stages * m + config.pp - 1)
    if send_seconds is None:
        send_seconds = pp_send_seconds(model, config, s, link)
    total = sends * send_seconds
    if model.tie_word_embeddings or model.num_mtp_layers:  # the MTP modules share the embedding too
        embedding_grad_bytes = 4 * model.vocab_size * model.hidden_size / config.tp
        total += comm.ring_allreduce_seconds(embedding_grad_bytes, 2, comm.collective_link(link))
    return total


@dataclass(frozen=True)
class LayerTerms:
    """What one layer costs one GPU for one micro-batch of a configuration: every stage's
    time is built from these (they depend on tp, b, s, SP and recompute, not on pp or dp)."""

    layer: LayerSeconds
    tp: TpSeconds
    logits_seconds: float
    """The last stage's output layer and loss, per micro-batch."""
    mtp_head_seconds: float = 0.0
    """The last stage's multi-token-prediction modules, per micro-batch, besides their blocks
    (which cost a layer each: mtp_stage_seconds): each one's eh_proj forward and backward and
    its own pass of the output layer and loss (mtp_head_seconds)."""
    ep: EpSeconds = EpSeconds()
    """Expert parallelism per MoE layer (all 0 without EP)."""
    cp: CpSeconds = CpSeconds()
    """Ring attention's KV exchange per layer (all 0 without CP)."""
    host_seconds_per_layer: float = 0.0
    """The mean block's GPU idle time waiting on the host after its MoE layers' token-count
    syncs (moe_host_exposed_seconds times the MoE layers' share; 0 for a dense model)."""
    moe_host_seconds: float = 0.0
    """H priced: the host's time to issue one MoE block's forward (0: not priced)."""
    moe_gpu_seconds: float = 0.0
    """W: the GPU's work between two of an MoE block's syncs (moe_forward_gpu_seconds; 0 for a
    dense model or where H is not priced)."""


def config_layer_seconds(model: ModelSpec, config: TrainConfig, chunk: int, rates: TrainRates) -> LayerSeconds:
    """layer_seconds of the configuration's block on `chunk` tokens per sequence (s/cp)."""
    c = config
    return layer_seconds(model, chunk, c.micro_batch_size, c.tp, c.sequence_parallel, c.recompute, rates,
                         c.attention, c.precision, c.ep, c.layout.dp_per_ep_group, c.cp, c.priced_fp8_recipe,
                         c.engine)


def layer_terms(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, s: int,
                placement: Placement, rates: TrainRates,
                imbalance: float = efficiency.EXPERT_LOAD_IMBALANCE, cp_rotation: str = "ring",
                moe_forward_host_seconds: float = 0.0) -> LayerTerms:
    """`s` the sequence length; with CP every term runs on the rank's s/cp tokens;
    `cp_rotation` the engine's KV exchange (cp_seconds_per_layer); with
    --overlap-moe-expert-parallel-comm the all-to-alls hide under the layer's compute
    (moe_overlap_exposed_seconds); `moe_forward_host_seconds` the engine's host time per MoE
    block forward after its sync (moe_host_exposed_seconds; 0: not priced)."""
    c, b = config, config.micro_batch_size
    chunk = act.context_parallel_chunk_tokens(s, c.cp)
    layer = config_layer_seconds(model, c, chunk, rates)
    ep = ep_seconds_per_layer(model, cluster, c, chunk, rates, imbalance)
    if c.moe_comm_overlap and ep.num_alltoalls:
        ep = replace(ep, exposed_seconds_per_moe_layer=moe_overlap_exposed_seconds(
            ep.alltoall_seconds_per_moe_layer, layer.total + ep.imbalance_seconds,
            exchange_sm_share(cluster, c.moe_dispatcher)))
    tp = tp_seconds_per_layer(model, cluster, c, chunk, placement, rates)
    priced = model.is_moe and moe_forward_host_seconds > 0
    host = window = 0.0
    if priced:
        window = moe_forward_gpu_seconds(layer, tp, ep, c.recompute == "full")
        host = moe_layers_of(model, 1) * moe_host_exposed_seconds(moe_forward_host_seconds, window,
                                                                  2 if c.recompute == "full" else 1)
    return LayerTerms(
        layer=layer,
        tp=tp,
        logits_seconds=logits_seconds(model, chunk, b, c.tp, rates),
        mtp_head_seconds=mtp_head_seconds(model, chunk, b, c.tp, rates),
        ep=ep,
        cp=cp_seconds_per_layer(model, c, chunk, placement, rates, cp_rotation),
        host_seconds_per_layer=host,
        moe_host_seconds=moe_forward_host_seconds if priced else 0.0,
        moe_gpu_seconds=window,
    )


def blend_terms(kept: object, recomputed: object, share: float) -> object:
    """Per-layer terms of a stage where `share` of its layers rerun their forward (block recompute,
    docs/cost-model.md#training-partial-recompute): every number field (1 - share) * kept + share *
    recomputed, recursing into the nested term records (LayerSeconds, TpSeconds, EpSeconds,
    CpSeconds); a stage's time is its layers times the blend, so each time term is exact (every
    one is a layer count times a per-layer figure). A non-number field (a link, a dispatcher,
    whether measured) is the recomputed layer's. share 0 gives `kept`, 1 `recomputed`."""
    if share <= 0.0:
        return kept
    if share >= 1.0:
        return recomputed
    changes = {}
    for f in fields(kept):  # type: ignore[arg-type]
        a, b = getattr(kept, f.name), getattr(recomputed, f.name)
        if is_dataclass(a) and not isinstance(a, type):
            changes[f.name] = blend_terms(a, b, share)
        elif isinstance(a, (int, float)) and not isinstance(a, bool) and isinstance(b, (int, float)):
            changes[f.name] = (1.0 - share) * a + share * b
        else:
            changes[f.name] = b
    return replace(kept, **changes)  # type: ignore[type-var]


def moe_forward_gpu_seconds(layer: LayerSeconds, tp: TpSeconds, ep: EpSeconds, full_recompute: bool = False) -> float:
    """W: the GPU's work from one MoE block's token-count sync to the next. Megatron's 1F1B:
    the block's forward, its two forward TP collectives, its two forward all-to-alls (dispatch
    and combine) and the busiest GPU's extra expert work of the forward (one of the 3 passes
    of EpSeconds.imbalance_seconds, 4 with full recompute). Under the combined 1F1B
    (--overlap-moe-expert-parallel-comm) the host issues one micro-batch's backward of the
    block between two syncs of the next one's forward, so W is the pair: the block's compute
    forward and backward (with recompute), the extra expert work, and what the TP and EP
    exchanges leave exposed. The backward's own issue is not priced, in either schedule
    (autograd issues it from C++ between the syncs)."""
    if ep.exposed_seconds_per_moe_layer is not None:
        return layer.total + tp.exposed + ep.exposed_seconds_per_moe_layer + ep.imbalance_seconds
    passes = 4 if full_recompute else 3
    return layer.forward + 2 * tp.allreduce_seconds + 2 * ep.alltoall_seconds + ep.imbalance_seconds / passes


def moe_host_exposed_seconds(host_seconds: float, gpu_seconds: float, num_forwards: int = 1) -> float:
    """What one MoE block leaves the GPU idle per micro-batch waiting on the host:
    n * max(0, H - W). A dropless MoE layer in Megatron copies its per-expert token counts
    to the host every forward, for the all-to-all's split sizes and for the grouped GEMM's
    (token_dispatcher.py core_v0.19.0, "A synchronization is needed before expert parallel
    AlltoAll"; experts.py, tokens_per_expert.tolist(); DeepEP's dispatch waits on the CPU
    for its received counts, fused_a2a.py): the host cannot queue work ahead of the sync, so
    after it the GPU runs each kernel as the host issues it, and a block whose forward takes
    the GPU W seconds and the host H to issue takes max(W, H). H is
    efficiency.MOE_LAYER_FORWARD_HOST_SECONDS; n the forwards per micro-batch (2 with full
    recompute, whose rerun syncs again). The backward has no sync: autograd queues it ahead.
    H = 6 ms, W = 2 ms: 4 ms; W = 7 ms: 0."""
    return num_forwards * max(0.0, host_seconds - gpu_seconds)


def moe_overlap_exposed_seconds(alltoall_seconds: float, compute_seconds: float, sm_share: float = 0.0) -> float:
    """What one MoE layer's all-to-alls (dispatch and combine, forward and backward) leave
    exposed under Megatron's combined 1F1B (--overlap-moe-expert-parallel-comm,
    pipeline_parallel/combined_1f1b.py core_v0.19.0): micro-batch i+1's forward of the layer
    runs beside micro-batch i's backward of it, each one's all-to-alls on a communication
    stream under the other's attention and expert GEMMs, so per micro-batch max(A - C, f A),
    A the layer's all-to-all time, C its forward and backward compute, f the share of the SMs
    the exchange's kernels hold while they run (exchange_sm_share): the compute beside them
    runs at 1 - f, so a hidden exchange still costs f A, and one longer than C / (1 - f) costs
    A - C. Assumption: the split is perfect (no sub-layer is left waiting for its own
    exchange). This is a paired pass's; the passes that run unpaired (the pipeline's fill and
    drain, the warm-up) expose all of A (EpSeconds.comm_seconds_per_layer_paired). A = 4 ms, C = 6 ms: 0 (f = 0), 0.61 ms (DeepEP's 20 of an H100's
    132 SMs); A = 10 ms, C = 6 ms: 4 ms either way."""
    return max(alltoall_seconds - compute_seconds, sm_share * alltoall_seconds, 0.0)


def exchange_sm_share(cluster: ClusterSpec, dispatcher: str) -> float:
    """The share of the GPU's SMs the EP exchange's kernels hold while they run: DeepEP's
    moe.DEEPEP_NUM_SMS (20) over the GPU's sm_count; 0 for NCCL's all-to-alls (its channel
    count is NCCL's choice, not priced) or a GPU without an SM count in the catalog."""
    sm_count = cluster.gpu.sm_count
    return DEEPEP_NUM_SMS / sm_count if dispatcher == "deepep" and sm_count else 0.0


def stage_seconds(model: ModelSpec, config: TrainConfig, terms: LayerTerms,
                  rates: TrainRates, layer_params: float | None = None,
                  ends: StageParams | None = None) -> StageSeconds:
    """One stage's time per micro-batch as layers * w + its extra (what step_times adds up):
    w = layer compute + exposed TP + EP (all-to-alls, busiest GPU's experts) + the layer's
    gradient accumulation; the first stage adds
    the embedding's accumulation, the last the LM head's and the logits (cost/stage_split.py
    picks the uneven split from these)."""
    c = config
    per_byte = (efficiency.MAIN_GRAD_ACCESSES_PER_MICRO_BATCH * gradient_bytes_per_param(c)
                / rates.elementwise_bytes_per_s)
    # layer_params, ends: layer_params_per_gpu and the stages' extra parameters when the caller has them
    ends = ends or stage_params_per_gpu(model, c.tp, c.pp, (0, 0, 0), c.ep)
    if layer_params is None:
        layer_params = layer_params_per_gpu(model, c.tp, c.ep)
    block = block_seconds(terms)
    return StageSeconds(
        seconds_per_layer=block + layer_params * per_byte,
        first_extra_seconds=ends.first_stage * per_byte,
        last_extra_seconds=(ends.last_stage * per_byte + terms.logits_seconds
                            + mtp_stage_seconds(model, terms, block)),
    )


def exchange_free_block_seconds(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, s: int,
                                placement: Placement, rates: TrainRates,
                                imbalance: float = efficiency.EXPERT_LOAD_IMBALANCE,
                                cp_rotation: str = "ring") -> float:
    """block_seconds of layer_terms less the EP exchange and the MoE syncs' host waits, which
    are never negative: a floor under the block time of every way the configuration's
    all-to-alls can run (token dispatcher, combined 1F1B), whose other terms do not depend on
    them. Priced without ep_seconds_per_layer's transfers (DeepEP's traffic model is the
    costly part), for the bounded training search (train.block_seconds_floor)."""
    chunk = act.context_parallel_chunk_tokens(s, config.cp)
    layer = config_layer_seconds(model, config, chunk, rates)
    extra = (moe_layers_of(model, 1) * ep_imbalance_seconds(model, config, chunk, rates, imbalance)
             if config.ep > 1 and model.is_moe else 0.0)
    tp = tp_seconds_per_layer(model, cluster, config, chunk, placement, rates)
    cp = cp_seconds_per_layer(model, config, chunk, placement, rates, cp_rotation)
    return layer.total + tp.exposed + extra + cp.exposed


def block_seconds(terms: LayerTerms) -> float:
    """One block's time per micro-batch on its stage, gradient accumulation aside: its compute
    (the busiest EP GPU's extra expert work included), the TP, EP and CP exchanges as far as
    they are exposed, and the MoE syncs' host waits."""
    ep = terms.ep.comm_seconds_per_layer + terms.ep.compute_seconds_per_layer
    return terms.layer.total + terms.tp.exposed + ep + terms.cp.exposed + terms.host_seconds_per_layer


def mtp_stage_seconds(model: ModelSpec, terms: LayerTerms, block_seconds: float) -> float:
    """What the model's multi-token-prediction modules add to the last stage per micro-batch
    (Megatron's --mtp-num-layers builds them there, multi_token_prediction.py core_v0.14.0
    get_mtp_num_layers_to_build): each runs one block, priced as the mean decoder block
    (`block_seconds`: its compute and exposed communication; DeepSeek-V3's MTP block is an MoE
    block, whose active FFN width, 8 x 2,048 routed + 2,048 shared, is the dense layers'
    18,432), and its head (LayerTerms.mtp_head_seconds). Their gradient accumulation is the
    stage's (their parameters are in stage_params_per_gpu)."""
    return model.num_mtp_layers * block_seconds + terms.mtp_head_seconds


def mtp_head_seconds(model: ModelSpec, s: int, b: int, tp: int, rates: TrainRates) -> float:
    """Per micro-batch, the multi-token-prediction modules besides their blocks: each one's
    eh_proj, [b*s, 2h] x [2h, h/t] forward and backward (3 GEMMs), and its own pass of the
    output layer and loss (logits_seconds; each module predicts one more token with the shared
    head). 0 without MTP."""
    if not model.num_mtp_layers:
        return 0.0
    h = model.hidden_size
    eh_proj = 3 * gemm_seconds(Gemm(b * s, -(-h // tp), 2 * h), rates)
    return model.num_mtp_layers * (eh_proj + logits_seconds(model, s, b, tp, rates))


def step_times(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, global_batch: int,
               s: int, rates: TrainRates, layers: tuple[int, int, int], placement: Placement,
               terms: LayerTerms, params: StageParams,
               model_flops_per_sequence: float, hardware_flops_per_sequence: float,
               dp: DpCollectives, link: Link | None, dp_reductions: int = 1,
               zero3_gathers: float | None = None, kept: LayerTerms | None = None,
               recomputed_layers: tuple[int, int, int] | None = None) -> StepTimes:
    """Compose the step: see the module docstring and planner/train.py. `layers` = (first,
    middle, last) stage layer counts (middle 0 when pp <= 2), `params` their parameters per
    GPU. Every stage runs at the pace of the slowest: compute, TP and bubble are that
    stage's; DP and optimizer the worst stage's parameters, the DP overlap window the first
    stage's last backward. `s` the sequence length (pipeline sends carry the rank's s/cp).
    `dp`, `link`: dp_collectives' and dp_link's results for this configuration (a search
    memoises them). Block recompute (docs/cost-model.md#training-partial-recompute): `terms` are a
    recomputed layer's, `kept` a layer's that is not, `recomputed_layers` how many of each stage
    kind's layers rerun; each stage runs the blend of the two (blend_terms)."""
    c, b = config, config.micro_batch_size
    m = global_batch // (b * c.dp)
    chunk = act.context_parallel_chunk_tokens(s, c.cp)
    first, middle, last = layers
    by_kind = (terms, terms, terms)
    if kept is not None and recomputed_layers is not None:
        # the last stage's MTP blocks are not recomputed under the block method (train.stage_memories)
        counted = (first, middle, last + model.num_mtp_layers)
        by_kind = tuple(blend_terms(kept, terms, r / n if n else 0.0)  # type: ignore[assignment]
                        for r, n in zip(recomputed_layers, counted, strict=True))
    paired = combined_1f1b_paired_share(c.pp, m, c.virtual_stages)

    def per_layer(t: LayerTerms) -> tuple[float, float]:
        """(compute, exposed) of one layer: its compute with the busiest EP GPU's extra experts;
        its communication and the MoE syncs' host waits (the combined 1F1B hides the all-to-alls
        only of the passes it pairs: the fill, drain and warm-up run alone)."""
        ep_comm_ = t.ep.comm_seconds_per_layer_paired(paired)
        return (t.layer.total + t.ep.compute_seconds_per_layer,
                t.tp.exposed + ep_comm_ + t.cp.exposed + t.host_seconds_per_layer)

    terms = by_kind[2]
    logits = terms.logits_seconds
    layer_compute, layer_exposed = per_layer(terms)
    hbm = rates.elementwise_bytes_per_s
    accumulate = efficiency.MAIN_GRAD_ACCESSES_PER_MICRO_BATCH * gradient_bytes_per_param(c) / hbm
    # the pacing stage: the last unless the first (then a middle one) is strictly slower
    # the last stage's MTP modules (if any) run a block each and their heads (mtp_stage_seconds)
    slowest, slowest_layers = c.pp - 1, last + model.num_mtp_layers
    compute_per_micro_batch = (slowest_layers * layer_compute + params.last_stage * accumulate + logits
                               + terms.mtp_head_seconds)
    stage_per_micro_batch = compute_per_micro_batch + slowest_layers * layer_exposed
    slowest_terms = terms
    for stage, layers_here, params_here in ((0, first, params.first_stage), (1, middle, params.middle_stage)):
        if stage >= c.pp - 1:
            break
        compute_here, exposed_here = per_layer(by_kind[stage])
        compute = layers_here * compute_here + params_here * accumulate
        if compute + layers_here * exposed_here > stage_per_micro_batch:
            slowest, slowest_layers, compute_per_micro_batch = stage, layers_here, compute
            stage_per_micro_batch = compute + layers_here * exposed_here
            slowest_terms = by_kind[stage]
    experts = params.worst_routed_experts
    if c.zero_stage >= 1:
        optimizer_params = ((params.worst - experts) / c.dp_cp
                            + experts / expert_data_parallel_size(c.tp, c.dp, c.ep, c.cp))
    else:
        optimizer_params = params.worst
    optimizer = optimizer_params * optimizer_step_bytes(c, model) / hbm
    first_layer = by_kind[0].layer
    windows = DpWindows(backward_seconds=first / c.virtual_stages * (first_layer.backward + first_layer.recompute),
                        forward_seconds=first / c.virtual_stages * first_layer.forward,
                        micro_batch_seconds=compute_per_micro_batch, num_units=slowest_layers)
    ep_comm = slowest_terms.ep.comm_seconds_per_layer_paired(paired)
    send_seconds = pp_send_seconds(model, config, chunk, placement.pp_link)
    breakdown = TimeBreakdown(
        compute=m * compute_per_micro_batch + optimizer,
        bubble=(c.pp - 1) / c.virtual_stages * stage_per_micro_batch,
        tp_comm=m * slowest_layers * slowest_terms.tp.exposed,
        pp_comm=pp_seconds(model, cluster, c, chunk, m, placement.pp_link, send_seconds),
        dp_comm_exposed=dp_exposed_seconds(c, dp, windows, m, dp_reductions, zero3_gathers),
        ep_comm=m * slowest_layers * ep_comm,
        cp_comm=m * slowest_layers * slowest_terms.cp.exposed,
        host=m * slowest_layers * slowest_terms.host_seconds_per_layer,
    )
    return StepTimes(
        breakdown=breakdown,
        tp_seconds_per_layer=slowest_terms.tp.total,
        tp_link=None if placement.tp_link is None else placement.tp_link.kind,
        pp_link=None if placement.pp_link is None else placement.pp_link.kind,
        dp_link=None if link is None else link.kind,
        model_flops_per_step=global_batch * model_flops_per_sequence,
        hardware_flops_per_step=global_batch * hardware_flops_per_sequence,
        slowest_stage=slowest,
        slowest_stage_num_layers=slowest_layers,
        stage_seconds_per_micro_batch=stage_per_micro_batch,
        pp_send_seconds=send_seconds,
        pp_send_bytes=pp_send_bytes(model, config, chunk),
        dp=dp,
    )


def logits_seconds(model: ModelSpec, s: int, b: int, tp: int, rates: TrainRates) -> float:
    """Last stage, per micro-batch: the output GEMM forward + backward (3x, 16-bit at every
    --precision: Megatron's output layer is a plain ColumnParallelLinear, TE's fp8 LM head
    only with the MXFP8 recipe and --fp8-output-proj, gpt_model.py core_v0.19.0) and the
    vocab-parallel cross-entropy's traffic: the (2+4)*s*b*V/t bytes of 16-bit logits and fp32
    softmax written once forward, read and written back in backward. Every stage runs at the pace of the slowest, so this lands on all of them."""
    gemm = 3 * gemm_seconds(logits_gemm(model, b, s, tp), rates)
    traffic = act.last_stage_logits_bytes(model, s, b, tp) * (1 + efficiency.ELEMENTWISE_BWD_OVER_FWD)
    return gemm + traffic / rates.elementwise_bytes_per_s
