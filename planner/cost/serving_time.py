"""Serving time of one pipeline stage under vLLM semantics (pure; SI units).

Legend: t/p tensor/pipeline degrees, L_s layers of stage s, h hidden size, a heads,
d head dim, V vocab, n sequences in one decode batch, s prompt tokens, W sliding window.
One engine step carries decoding sequences and prompt chunks: its linear layers are a weight
read bounded by HBM or a compute bound at the GEMM shape's rate, plus the attention's KV reads
and prompt attention, a fixed per-layer cost and the TP all-reduces. Derivations and
sources: docs/cost-model.md (Serving: one engine step; Serving: pipeline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from planner import units
from planner.cost import efficiency as eff
from planner.cost.comm import (
    allgather_seconds,
    allreduce_seconds,
    curve_seconds,
    p2p_seconds,
)
from planner.cost.flops import Gemm, layer_gemms_forward, linear_gemms
from planner.cost.moe import (
    deepep_transfers,
    ep_combine_bytes,
    ep_dispatch_bytes,
    expert_load_factor,
    moe_layers_of,
    routed_expert_flops,
    sequence_parallel_moe,
)
from planner.cost.params import (
    activation_bytes_per_element,
    expert_params,
    experts_per_gpu,
    linear_bytes_per_weight,
    lm_head_bytes_per_weight,
    matmul_precision_of_dtype,
    mlp_width_per_token,
    moe_layer_excess_active_params,
    multiply_adds_per_attention_pair,
    param_counts,
    rotary_elements_per_token,
    routed_expert_share_per_gpu,
    sublayers_per_layer,
)
from planner.cost.serving_memory import (
    StageMemory,
    embedding_bytes_per_gpu,
    lm_head_bytes_per_gpu,
    stage_memory,
    stage_moe_excess,
    stage_moe_layers,
)
from planner.cost.speculative import draft_extras, draft_model_of
from planner.errors import SpecError
from planner.layout import Layout, Placement
from planner.requests import DEFAULT_ALL2ALL_BACKEND, ServeRequest
from planner.specs import (
    ClusterSpec,
    EngineAllreduceCurve,
    FusedAllreduceCurve,
    ModelSpec,
    MoeKernel,
    computed_once,
)

LOW_PRECISION_GEMMS = {"fp8": "fp8", "nvfp4": "fp4", "int8": "int8"}
"""Checkpoint formats whose activations are quantized too, so the GEMMs run on the low-precision
tensor cores where the GPU has them: fp8 W8A8 (vLLM Fp8LinearMethod), NVFP4 W4A4 on
Blackwell (vLLM ModelOptNvFp4LinearMethod, cutlass_scaled_fp4_mm) and int8 W8A8 where the
checkpoint says so (ModelSpec.int8_activations; vLLM's CompressedTensorsW8A8Int8,
cutlass_scaled_mm). MXFP4, int4 and weight-only int8 (GPTQ) dequantise into the model dtype's
GEMMs."""


def matmul_precision(model: ModelSpec, cluster: ClusterSpec) -> str:
    """The precision the linear GEMMs run at: LOW_PRECISION_GEMMS where the GPU has that peak
    (NVFP4 only where it covers every block matmul: ModelOpt's mixed checkpoints store their
    MLP-only NVFP4 as W4A16, hf_mixed_precision.WEIGHT_ONLY_ALGOS; int8 only with int8 inputs),
    else the model dtype's."""
    low = LOW_PRECISION_GEMMS.get(model.quantization or "")
    if low == "fp4" and model.quantization_scope != "all":
        low = None
    if low == "int8" and not model.int8_activations:
        low = None
    if low is not None and cluster.gpu.peak_flops_per_s(low) is not None:
        return low
    return matmul_precision_of_dtype(model)


QUANTIZED_ACTIVATION_BYTES_PER_ELEMENT = {"fp8": 1.0, "fp4": 0.5 + 1 / 16, "int8": 1.0}
"""Bytes per element a quantized GEMM input is written in: fp8 and int8 one byte (int8's
per-token scale, one float per row, left out); NVFP4 half a byte plus one fp8 scale per 16
elements (NVIDIA's NVFP4 format)."""


def quantize_bytes_per_element(precision: str, activation_bytes: float = 2) -> float:
    """HBM traffic of quantizing one GEMM input element for `precision` GEMMs: read the 16-bit
    activation, write the quantized one (2 + 1 = 3 B for fp8); 0 for 16-bit GEMMs."""
    written = QUANTIZED_ACTIVATION_BYTES_PER_ELEMENT.get(precision)
    return 0.0 if written is None else activation_bytes + written


@computed_once
def activation_quant_bytes_per_token(model: ModelSpec, tp: int, precision: str) -> float:
    """HBM traffic of quantizing each linear GEMM's input on one GPU per token and layer
    (quantize_bytes_per_element each): QKV and MLP-up inputs (h each, replicated), the
    output projection's (a*d/t) and MLP-down's (MLP width/t). 0 for 16-bit GEMMs."""
    elements = 2 * model.hidden_size + (model.num_attention_heads * model.head_dim + mlp_width_per_token(model)) / tp
    return quantize_bytes_per_element(precision, activation_bytes_per_element(model)) * elements


def achievable_flops_per_s(model: ModelSpec, cluster: ClusterSpec) -> float:
    """The linear GEMMs' rate in their precision: the serving engine's measured kernels
    (catalog serving_matmul_tflops), else the GPU's achievable rate, else its share of the peak
    (efficiency.unmeasured_fraction_of_peak: 0.75, or the GPU's bf16 share where lower)."""
    gpu, precision = cluster.gpu, matmul_precision(model, cluster)
    measured = gpu.serving_flops_per_s(precision)
    if measured is not None:
        return measured
    if precision == "int8" and gpu.peak_flops_per_s("int8") == gpu.peak_flops_per_s("fp8") and (
            fp8 := gpu.serving_flops_per_s("fp8")) is not None:
        # int8 and fp8 GEMMs run at one tensor-core rate where the peaks are one (Hopper,
        # Blackwell): the measured fp8 kernels' rate, not 0.75 of the peak, which had priced an
        # int8 W8A8 checkpoint's prompts 45% faster than the same model's fp8 (a review)
        return fp8
    peak = gpu.peak_flops_per_s(precision) or gpu.peak_flops_per_s("bf16")
    if peak is not None:
        return eff.achievable_matmul_flops_per_s(peak, None, eff.unmeasured_fraction_of_peak(gpu))
    measured_16bit = gpu.serving_flops_per_s("bf16") or gpu.serving_flops_per_s("fp16")
    if measured_16bit is not None:
        return measured_16bit
    raise no_tensor_rate_error(gpu.name)


def no_tensor_rate_error(gpu_name: str) -> SpecError:
    """A GPU with neither a confirmed tensor peak nor a measured matmul rate: prompts and
    batched decode cannot be priced (treating compute as free would be a silent wrong answer)."""
    return SpecError(
        f"--cluster: GPU {gpu_name}: no bf16 tensor-core rate (peak_tflops.bf16 or achievable_matmul_tflops.bf16) "
        "in its hardware profile or the GPU catalog; cannot price prompt and batched decode compute: measure it "
        "with `plan probe` or give peak_tflops.bf16 in the hardware profile"
    )


def expected_experts_touched(model: ModelSpec, num_tokens: int) -> float:
    """E * (1 - (1 - e/E)^n): distinct experts a batch of n tokens routes to (uniform routing)."""
    if not model.is_moe:
        return 1.0
    experts, per_token = model.num_local_experts, model.num_experts_per_tok
    return experts * (1 - (1 - per_token / experts) ** num_tokens)


def expert_group_tokens(layout: Layout, num_tokens: float) -> float:
    """Tokens whose routing one GPU's experts see per step: the replica's own without EP,
    those of every data-parallel rank of the EP group with it (they step in lockstep)."""
    return num_tokens * layout.dp_per_ep_group


def decode_weight_bytes_read(model: ModelSpec, stage: StageMemory, layout: Layout, num_tokens: float) -> float:
    """A decode step reads every weight of the stage once, except MoE experts no token chose
    and the embedding table, of which it gathers only the batch's rows (unless the same
    matrix is the LM head on this stage: tied and p = 1). Each of a GPU's E_g experts is
    untouched with probability (1 - e/E)^N, N the tokens its experts see: E_g = E experts
    split t ways without EP; ceil(E/ep) whole experts seeing the EP group's tokens with it."""
    read = non_expert_weight_bytes_read(model, stage, layout)
    if not model.is_moe:
        return read
    return read + stage_moe_layers(model, stage) * routed_expert_bytes_read(model, layout, num_tokens)


def non_expert_weight_bytes_read(model: ModelSpec, stage: StageMemory, layout: Layout) -> float:
    """decode_weight_bytes_read without the routed experts: the stage's weights on one GPU less
    the embedding table (unless it is this stage's LM head), every routed expert (priced
    apart, per MoE layer, by moe_layer_kernel_time) and the drafter's (its own passes read
    them: draft_seconds)."""
    read = stage.weights_bytes - stage.draft_weights_bytes
    head_reads_embedding = model.tie_word_embeddings and layout.pp == 1
    if stage.stage == 0 and not head_reads_embedding:
        read -= embedding_bytes_per_gpu(model, layout.tp)
    if not model.is_moe:
        return read
    local, expert_bytes = local_expert_bytes(model, layout)
    return read - stage_moe_layers(model, stage) * local * expert_bytes


def lm_head_read_bytes(model: ModelSpec, layout: Layout) -> float:
    """The LM head a last stage's step reads on one GPU (the embedding table when it is the
    head: tied and p = 1), which vLLM runs as its own 16-bit GEMM whatever the layers' weight
    format."""
    tied_head = embedding_bytes_per_gpu(model, layout.tp) if model.tie_word_embeddings and layout.pp == 1 else 0.0
    return lm_head_bytes_per_gpu(model, layout.tp, layout.pp) + tied_head


def head_weight_bytes_read(model: ModelSpec, stage: StageMemory, layout: Layout,
                           head_bytes: float | None = None) -> float:
    """Of non_expert_weight_bytes_read, the LM head's: lm_head_read_bytes on the last stage
    (`head_bytes` when the caller has it), none on the others."""
    if stage.stage != layout.pp - 1:
        return 0.0
    return lm_head_read_bytes(model, layout) if head_bytes is None else head_bytes


def weight_read_seconds(model: ModelSpec, cluster: ClusterSpec, stage: StageMemory, layout: Layout,
                        linear_hbm_utilization: float, head_bytes: float | None = None) -> float:
    """The step's read of the stage's non-expert weights: the LM head at
    DECODE_HBM_UTILIZATION of the GPU's HBM bandwidth, the layers' linear weights at the share
    their format's kernels stream at (linear_hbm_utilization: the catalog's
    serving_decode_hbm_utilization where measured, else the same constant). `head_bytes`:
    lm_head_read_bytes, when the caller has it."""
    hbm = cluster.gpu.hbm_bytes_per_s
    head = head_weight_bytes_read(model, stage, layout, head_bytes)
    layers = non_expert_weight_bytes_read(model, stage, layout) - head
    return head / (hbm * eff.DECODE_HBM_UTILIZATION) + layers / (hbm * linear_hbm_utilization)


@computed_once
def local_expert_bytes(model: ModelSpec, layout: Layout) -> tuple[int, float]:
    """(E_g, bytes of one of them on the GPU): the GPU's routed experts, each split t ways
    without EP and whole with it."""
    local = experts_per_gpu(model, layout.ep)
    expert_bytes = expert_params(model) * linear_bytes_per_weight(model)
    return local, expert_bytes * routed_expert_share_per_gpu(model, layout.tp, layout.ep) * model.num_local_experts / local


def routed_expert_bytes_read(model: ModelSpec, layout: Layout, num_tokens: float,
                             touched_experts: float | None = None) -> float:
    """One MoE layer's routed-expert weight bytes a step reads on the busiest GPU: without EP
    its E_g = E experts' shards times the share of all E some token chose
    (expected_experts_touched of the tokens its experts see); with EP the most experts any
    of the ep GPUs must read (busiest_gpu_experts_touched: the step waits for it). With
    `touched_experts` of E given (the routing known, as the calibration's collectors route),
    every GPU reads its share of them."""
    local, expert_bytes = local_expert_bytes(model, layout)
    if touched_experts is not None:
        return local * touched_experts / model.num_local_experts * expert_bytes
    seen = expert_group_tokens(layout, num_tokens)
    if layout.ep > 1 and local < model.num_local_experts:
        return busiest_gpu_experts_touched(model, local, layout.ep, seen) * expert_bytes
    return local * expected_experts_touched(model, seen) / model.num_local_experts * expert_bytes


def busiest_gpu_experts_touched(model: ModelSpec, local: int, num_gpus: int, num_tokens: float) -> float:
    """E[the most experts some token chose on any of `num_gpus` GPUs holding `local` experts
    each]: each expert is chosen with p = 1 - (1 - e/E)^N (uniform routing), so a GPU's count
    is about Binomial(local, p) (the experts taken as independent), and the maximum of
    num_gpus of them has E = sum over x < local of 1 - F(x)^num_gpus. Mixtral-8x7B at ep 4
    (2 experts each), one token: p = 2/8; F(0) = 0.5625, F(1) = 0.9375; E = 0.8999 + 0.2275
    = 1.127 experts on the busiest GPU against 0.5 on the mean one. Large N: every GPU reads
    all of its experts (E -> local)."""
    p = 1 - (1 - model.num_experts_per_tok / model.num_local_experts) ** num_tokens
    if p >= 1.0:
        return float(local)
    total, pmf = 0.0, (1 - p) ** local
    cdf, odds = pmf, p / (1 - p)
    for x in range(local):
        if cdf >= 1.0:  # every further term is 1 - 1 = 0 exactly
            break
        total += 1 - cdf ** num_gpus
        pmf *= (local - x) / (x + 1) * odds  # P(X = x + 1) from P(X = x)
        cdf += pmf
    return total


def active_params_per_layer(model: ModelSpec) -> float:
    """The mean block's active parameters (dense and MoE layers averaged)."""
    return param_counts(model).active_per_layer


def stage_matmul_flops_per_token(model: ModelSpec, stage: StageMemory, num_stages: int) -> float:
    """2 * active parameters of the stage: the mean block's, corrected by what its MoE layers
    above their mean share touch beyond dense ones (stage_dense_layer_equivalents); the last
    stage adds the LM head 2*V*h."""
    excess = stage_moe_excess(model, stage)
    flops = 2 * (stage.num_layers * active_params_per_layer(model)
                 + excess * (moe_layer_excess_active_params(model)
                             + model.num_experts_per_tok * expert_params(model)))
    if stage.stage == num_stages - 1:
        flops += 2 * model.vocab_size * model.hidden_size
    return flops


@dataclass(frozen=True)
class StepLoad:
    """What one engine step (or one micro-batch of it) carries, per replica or per micro-batch.

    Fractional values are expectations (the steady state averages over steps)."""

    decode_seqs: float
    """Sequences generating one token each."""
    decode_context_tokens: float
    """Sum over those sequences of their context (the KV tokens each attention reads)."""
    prefill_tokens: float = 0.0
    """Prompt tokens in the step (every chunk)."""
    prefill_attention_pairs: float = 0.0
    """Causal (query, key) pairs of the prompt chunks: a chunk of c tokens at offset o has
    c*o + c*(c+1)/2."""
    prompts_completing: float = 0.0
    """Prompts whose last chunk is in the step: each is sampled once (its first token)."""
    expert_tokens: float | None = None
    """Tokens per rank the routed experts (and the EP exchange) see, when they differ from
    this rank's: in an EP group of DP ranks stepping in lockstep the step is this (busiest)
    rank's for attention and the dense layers, the group's mean for the experts, which run
    on every rank's tokens at once. None: num_tokens."""
    spec_tokens: float = 0.0
    """Speculative decoding: drafted tokens verified beside the decodes (k per decoding
    sequence). Each is a row of every linear layer and of the LM head and writes its KV; they
    read their sequence's context with its own token (one KV read per sequence)."""

    @property
    def num_tokens(self) -> float:
        return self.decode_seqs + self.spec_tokens + self.prefill_tokens

    @property
    def moe_tokens(self) -> float:
        """expert_tokens, or num_tokens when not given."""
        return self.num_tokens if self.expert_tokens is None else self.expert_tokens

    @property
    def sampled_rows(self) -> float:
        """Rows the LM head and sampler see: vLLM computes logits only for positions that
        emit a token (vllm/v1/worker/gpu_model_runner.py, logits_indices), and for every
        drafted token it verifies."""
        return self.decode_seqs + self.spec_tokens + self.prompts_completing

    def scaled(self, fraction: float) -> StepLoad:
        """The same mix, a fraction of it (one of k micro-batches)."""
        return StepLoad(self.decode_seqs * fraction, self.decode_context_tokens * fraction,
                        self.prefill_tokens * fraction, self.prefill_attention_pairs * fraction,
                        self.prompts_completing * fraction,
                        None if self.expert_tokens is None else self.expert_tokens * fraction,
                        self.spec_tokens * fraction)

    def plus(self, other: StepLoad) -> StepLoad:
        """Both loads in one step."""
        experts = (None if self.expert_tokens is None and other.expert_tokens is None
                   else self.moe_tokens + other.moe_tokens)
        return StepLoad(self.decode_seqs + other.decode_seqs, self.decode_context_tokens + other.decode_context_tokens,
                        self.prefill_tokens + other.prefill_tokens,
                        self.prefill_attention_pairs + other.prefill_attention_pairs,
                        self.prompts_completing + other.prompts_completing, experts,
                        self.spec_tokens + other.spec_tokens)


def window_capped_tokens(total_tokens: float, count: float, window: int | None) -> float:
    """count * min(total / count, W): what `count` sequences (or queries) of mean span
    total / count read on a sliding-window layer. Capping the mean rather than each one
    (the steady state knows only the sum) is an upper bound, E[min(x, W)] <= min(E[x], W),
    and never above the uncapped total."""
    if window is None or count <= 0:
        return total_tokens
    return min(total_tokens, count * window)


def causal_pairs(chunk_tokens: float, offset_tokens: float = 0.0) -> float:
    """(query, key) pairs of a causal chunk of c tokens after o earlier tokens: c*o + c*(c+1)/2."""
    c = chunk_tokens
    return c * offset_tokens + c * (c + 1) / 2


@dataclass(frozen=True)
class StepTime:
    """One stage's share of one step (one micro-batch), by part."""

    seconds: float
    gemm_seconds: float
    """The linear layers: max(weight read, GEMM compute at the step's shape)."""
    attention_seconds: float
    """KV reads of the decoding sequences and the prompt chunks' attention compute."""
    allreduce_seconds_per_layer: float
    """Both TP all-reduces of one layer at the step's message size (the mean block's: one for
    a hybrid's one-mixer block, sublayers_per_layer), and the query / key norms' where they
    span every head (qk_norm_allreduce_seconds)."""
    bound: str
    """memory | compute: what limits the linear layers."""
    overhead_seconds: float = 0.0
    """The fixed per-layer step cost over the stage's layers."""
    ep_exchange_seconds_per_moe_layer: float = 0.0
    """EP: dispatch + combine of one MoE layer at the step's size
    (ep_exchange_seconds_per_moe_layer; 0 without EP or when EP stays in one replica)."""
    elementwise_seconds: float = 0.0
    """Norms, rotary embedding and the gated activation over the stage's layers (HBM-bound)."""
    moe_seconds: float = 0.0
    """The routed experts' fused-MoE ops over the stage's MoE layers (part of gemm_seconds)."""
    draft_seconds: float = 0.0
    """Speculative decoding, last stage: the drafter's passes (draft_seconds)."""
    tiles_underfilled: bool = False
    """bound is compute only because a few rows fill the GEMM tiles in part: the FLOPs at the
    full matmul rate are below the weight read (an int4 model's batch-1 decode), so the work is
    the weights' (decode_work_bound), as the experts' bound is named (moe_kernel_seconds_of_terms)."""

    @property
    def decode_work_bound(self) -> str:
        """What the plan calls a decode-only step: bound, except "memory" where only underfilled
        tiles make it compute (an AWQ 70B's decode at one sequence was called compute-bound; a CLI
        sweep), or where the step's attention, the decoding sequences' KV reads (HBM-bound), takes
        longer than the linear layers' compute (Llama-3.1-8B at 256 sequences on one H100: 22.2 ms
        of KV reads beside 9.9 ms of GEMMs was called compute-bound; a CLI read)."""
        if self.tiles_underfilled or self.attention_seconds > self.gemm_seconds:
            return "memory"
        return self.bound

    @property
    def compute_or_memory_seconds(self) -> float:
        """The bytes- or FLOP-bound work: linear layers, attention and the elementwise kernels
        (seconds = this + the fixed cost + the collectives)."""
        return self.gemm_seconds + self.attention_seconds + self.elementwise_seconds


def tp_allreduce_seconds_per_layer(cluster: ClusterSpec, layout: Layout, placement: Placement,
                                   message_bytes: float, engine_kernel: bool = True) -> tuple[float, str]:
    """Two all-reduces per layer (after attention and after the MLP), forward only, and what
    priced them, first that applies: "fused" (vLLM's fused all-reduce + RMSNorm kernel,
    fused_allreduce_curve), "measured" (the probe's curve: this cluster's own links),
    "engine" (vLLM's unfused all-reduce measured on this GPU, unfused_allreduce_curve), "model"
    (the ring model). engine_kernel False: NCCL's (the alpha-beta split explain shows beside
    the time used)."""
    fused = fused_allreduce_curve(cluster, layout, placement, message_bytes) if engine_kernel else None
    if fused is not None:
        return 2 * curve_seconds(fused, message_bytes), "fused"
    link = placement.tp_link
    curve = None if link is None else cluster.allreduce_curve(link.scope, layout.tp)
    if curve is None and engine_kernel:
        unfused = unfused_allreduce_curve(cluster, layout, placement)
        if unfused is not None:
            return 2 * curve_seconds(unfused, message_bytes), "engine"
    source = "measured" if curve is not None else "model"
    return 2 * allreduce_seconds(message_bytes, placement.tp_group, curve), source


def fused_allreduce_curve(cluster: ClusterSpec, layout: Layout, placement: Placement,
                          message_bytes: float) -> FusedAllreduceCurve | None:
    """The curve vLLM's fused all-reduce + RMSNorm is priced at for this message, or None
    where vLLM sends it to NCCL instead. vLLM (0.22.0, 0.33.0: default optimization level
    O2, vllm/config/vllm.py enable_allreduce_rms_fusion) fuses each TP all-reduce with the
    next RMSNorm on Hopper and Blackwell when TP > 1 (FlashInfer's trtllm_allreduce_fusion,
    which reaches its peers' memory over NVLink, so the group must sit in one NVLink node),
    for messages up to a size per TP (FI_ALLREDUCE_FUSION_MAX_SIZE_MB,
    vllm/compilation/passes/fusion/allreduce_rms_fusion.py at 0.33.0): the catalog's
    serving_allreduce (GPU.fused_allreduce). The probe's NCCL curves do not time this
    kernel, so it is used even where they exist."""
    return (cluster.gpu.fused_allreduce(layout.tp, message_bytes)
            if tp_in_one_nvlink_node(placement) and on_catalog_fabric(cluster) else None)


def unfused_allreduce_curve(cluster: ClusterSpec, layout: Layout, placement: Placement) -> EngineAllreduceCurve | None:
    """The curve vLLM's TP all-reduce is priced at where it does not fuse it: vLLM's
    communicator (vllm/distributed/device_communicators/cuda_communicator.py) sends a TP
    all-reduce inside one NVLink node to its custom one-shot / two-shot kernels, symmetric
    memory or NCCL by size; the catalog's serving_allreduce_unfused (GPU.unfused_allreduce) is
    that dispatch measured under vLLM 0.24.0 (AIConfigurator, CUDA-graph timed). None across
    nodes, off NVLink, or where not measured."""
    return (cluster.gpu.unfused_allreduce(layout.tp)
            if tp_in_one_nvlink_node(placement) and on_catalog_fabric(cluster) else None)


def on_catalog_fabric(cluster: ClusterSpec) -> bool:
    """Whether the node's intra-node link is the one the GPU's engine curves were measured on:
    the catalog's kind at a bandwidth within ENGINE_CURVE_FABRIC_FACTOR of its (a real node's
    NCCL-measured NVLink lands inside; a profile's slower NVLink, or the host path a CPU probe
    merged into a GPU profile, does not, and is priced on its own link)."""
    mine, catalog = cluster.intra_node, cluster.gpu.intra_node
    if mine is None or catalog is None or mine.kind != catalog.kind:
        return False
    ratio = mine.bandwidth_bytes_per_s / catalog.bandwidth_bytes_per_s
    return 1 / ENGINE_CURVE_FABRIC_FACTOR <= ratio <= ENGINE_CURVE_FABRIC_FACTOR


ENGINE_CURVE_FABRIC_FACTOR = 2.0
"""How far a node's intra-node bandwidth may sit from the catalog's and still be priced with the
catalog's engine all-reduce curves (a real 8-GPU H100 node measures 360-480 GB/s of NCCL bus
bandwidth against the catalog's 450; H800's NVLink is 200)."""


def tp_in_one_nvlink_node(placement: Placement) -> bool:
    """Whether the TP group sits inside one node on NVLink, where vLLM's custom and fused
    all-reduce kernels reach the peers' memory (and where their curves were measured)."""
    link = placement.tp_link
    return link is not None and not placement.tp_crosses_node and link.kind == "nvlink"


def dense_gemm_shape_utilization(model: ModelSpec, layout: Layout, num_tokens: float,
                                 m_half: float = eff.GEMM_HALF_RATE_DIMENSION) -> float:
    """Share of the achievable matmul rate the GEMMs outside the fused-MoE op reach at M = tokens
    rows: u(M)*u(N)*u(K) per GEMM, u(x) = x/(x + GEMM_HALF_RATE_DIMENSION) as for training
    (cost/training_time.gemm_seconds), u(M) at `m_half` rows (efficiency.gemm_row_half),
    FLOP-weighted over them: for MoE the mixer's (QKV, output, a hybrid's projections), which
    also stands for the shared experts and any dense-FFN layers; a dense model's whole layer
    (QKV, output, MLP up and down). The routed experts' GEMMs are the fused op's (mlp_gemms).
    A fractional M (a mean load: Little's law's concurrency at a rate) is taken as it is, so the
    GEMMs' time, F(M) / u(M) = c (M + M_half), runs linearly between whole rows, the mean of steps
    of floor(M) and ceil(M) rows; rounding M had made a round shorter at 1.5 sequences than at
    1.4 (round(1.5) = 2, round(1.4) = 1; Python rounds 2.5 to 2) and the decode round dip as the
    load rose, which E2E-limited searches bisect over (a review: Qwen3-235B fp8 on 2x8 H200 at E2E
    3 s lost 10% to a dip)."""
    m = max(1.0, num_tokens)
    return m / (m + m_half) * dense_gemm_width_utilization(model, layout.tp)


@computed_once
def dense_gemm_width_utilization(model: ModelSpec, tp: int) -> float:
    """What the widths leave of dense_gemm_shape_utilization: every GEMM outside the fused-MoE
    op has the step's M rows, so sum F / sum (F / (u(M) u(N) u(K))) = u(M) * W with
    W = sum N K c / sum N K c / (u(N) u(K)), a function of the model and t alone (counted once
    per spec: computed_once). At M = 1 the GEMMs' own FLOPs weigh them as at any M."""
    gemms = mixer_gemms(model, tp, 1) + ([] if model.is_moe else mlp_gemms(model, Layout(tp, 1, 1), 1))
    return flop_weighted_utilization(gemms, 0.0)


def mixer_gemms(model: ModelSpec, tp: int, num_tokens: int) -> list[Gemm]:
    """One layer's linear GEMMs before the MLP on one GPU at num_tokens rows: QKV, output and
    a hybrid's recurrent projections (not the attention core)."""
    mixer = linear_gemms(layer_gemms_forward(model, 1, num_tokens, tp))
    return [*mixer[:2], *mixer[4:]]


def flop_weighted_utilization(gemms: list[Gemm], m_half: float = eff.GEMM_HALF_RATE_DIMENSION) -> float:
    """sum F_g / sum (F_g / u_g): the share of the matmul rate the GEMMs reach together."""
    return sum(g.flops for g in gemms) / sum(g.flops / gemm_utilization(g, m_half) for g in gemms)


def gemm_utilization(gemm: Gemm, m_half: float = eff.GEMM_HALF_RATE_DIMENSION) -> float:
    """u(M) u(N) u(K), u(x) = x/(x + GEMM_HALF_RATE_DIMENSION): one GEMM's share of the
    achievable matmul rate at its shape (u(M) at `m_half` rows instead where a kernel has its
    own, the fused-MoE op's half_rows). The 128 holds for serving on every GPU: B200's
    fitted training value (gpus.yaml gemm_half_rate_dimension 384, from M >= 4096) would make
    its small-M decode GEMMs compute-bound, and its TPOT then misses by +25% (llama fp8)
    to +212% (gpt-oss) on the calibration set."""
    half = eff.GEMM_HALF_RATE_DIMENSION
    return (gemm.m / (gemm.m + m_half)) * (gemm.n / (gemm.n + half)) * (gemm.k / (gemm.k + half))


def mlp_gemms(model: ModelSpec, layout: Layout, num_tokens: int,
              touched_experts: float | None = None) -> list[Gemm]:
    """The MLP's up and down GEMMs on one GPU at num_tokens rows: the dense FFN split t
    ways; for MoE the touched experts on the GPU, each with N e / E_touched(N) rows, N the
    tokens its experts see (expert_group_tokens), an expert's FFN split t ways without EP
    and whole with it (dense_gemm_shape_utilization's shape rule); E_touched = `touched_experts` of E when the
    routing is known, else expected_experts_touched."""
    f, rows, count, split = model.intermediate_size, num_tokens, 1, layout.tp
    if model.is_moe:
        seen = expert_group_tokens(layout, num_tokens)
        touched = max(1.0, expected_experts_touched(model, seen) if touched_experts is None else touched_experts)
        f = model.expert_intermediate_size
        rows = max(1, round(seen * model.num_experts_per_tok / touched))
        count = max(1, round(touched * experts_per_gpu(model, layout.ep) / model.num_local_experts))
        split = layout.tp if layout.ep == 1 else 1
    up = (2 if model.gated_mlp else 1) * f // split
    return [Gemm(rows, max(1, up), model.hidden_size, count), Gemm(rows, model.hidden_size, max(1, f // split), count)]


@dataclass(frozen=True)
class MoeKernelRates:
    """What the fused-MoE op's time is priced from (catalog MoeKernel, or the dense fallback)."""

    floor_seconds: float
    hbm_bytes_per_s: float
    """The rate it streams the touched experts' weights at."""
    flops_per_s: float
    """Its asymptotic matmul rate."""
    half_rows: float
    """Rows per expert at half that rate."""
    source: str
    """"measured" (the catalog's kernel) or "model" (the dense GEMMs' rates)."""
    pair_passes: float = 0.0
    """Hidden-width passes over each routed pair's row outside the GEMMs (MoeKernel.pair_passes)."""
    pair_bytes_per_s: float = math.inf
    """The rate of those passes: the GPU's elementwise HBM rate (inf: no passes priced)."""


MOE_WEIGHT_FORMATS = ("bf16", "fp8", "mxfp4", "nvfp4")
"""The routed experts' weight formats ServingMoeKernels keys its default kernels by."""


def expert_weight_format(model: ModelSpec) -> str | None:
    """The routed experts' format as the catalog keys MoE kernels: bf16 (a 16-bit model
    unquantized) or a quantization the catalog has kernels for (ServingMoeKernels' fields: fp8,
    mxfp4, nvfp4; `quantization` covers the experts in every quantization_scope); None for the
    others (integer weight-only formats)."""
    if model.quantization is None:
        return "bf16" if model.dtype in ("bfloat16", "float16") else None
    return model.quantization if model.quantization in MOE_WEIGHT_FORMATS else None


MARLIN_MIN_COMPUTE_CAPABILITY = 8.0
"""Marlin's kernels need Ampere or later (vLLM's marlin_utils: capability 80 and up)."""


def int4_marlin_experts(model: ModelSpec, cluster: ClusterSpec) -> bool:
    """Whether vLLM runs this model's routed experts on its Marlin MoE kernel for INT4 weights with
    16-bit activations (compressed-tensors WNA16, AWQ, GPTQ): vLLM 0.33.0's WNA16 MoE oracle
    (model_executor/layers/fused_moe/oracle/int_wna16.py, _get_priority_backends) tries
    FlashInfer's TRT-LLM kernel first, which runs only with VLLM_USE_FLASHINFER_MOE_INT4=1 (default
    0, vllm/envs.py) on a Blackwell SM100 (quantization/utils/flashinfer_mxint4_moe.py), then
    Marlin, so by default Marlin on every GPU from Ampere on."""
    if model.quantization != "int4" or not model.is_moe:
        return False
    capability = cluster.gpu.compute_capability
    return capability is None or capability >= MARLIN_MIN_COMPUTE_CAPABILITY


def moe_kernel(model: ModelSpec, cluster: ClusterSpec, ep: int = 1) -> MoeKernelRates:
    """The GPU's measured fused-MoE kernel for the experts' format at this EP degree (catalog
    serving_moe_kernels, ServingMoeKernels.for_ep); INT4 experts where vLLM runs them on Marlin
    (int4_marlin_experts) at the GPU's measured Marlin MoE kernel (marlin_mxfp4: one op,
    moe_wna16_marlin_gemm, whose b_q_type is uint4b8 for symmetric INT4 and float4_e2m1f for
    MXFP4; vllm/model_executor/layers/fused_moe/experts/marlin_moe.py at 0.33.0); else the dense step's rates: no floor, DECODE_HBM_UTILIZATION, the
    linear GEMMs' rate and GEMM_HALF_RATE_DIMENSION."""
    weight_format = expert_weight_format(model)
    measured = cluster.gpu.serving_moe_kernels.for_ep(weight_format, ep) if weight_format else None
    if measured is None and int4_marlin_experts(model, cluster):
        measured = cluster.gpu.serving_moe_kernels.marlin_mxfp4
    if measured is None:
        return MoeKernelRates(0.0, cluster.gpu.hbm_bytes_per_s * eff.DECODE_HBM_UTILIZATION,
                              achievable_flops_per_s(model, cluster), eff.GEMM_HALF_RATE_DIMENSION, "model")
    return measured_moe_kernel_rates(measured, cluster)


def measured_moe_kernel_rates(measured: MoeKernel, cluster: ClusterSpec) -> MoeKernelRates:
    """A catalog MoE kernel's constants in SI units on this cluster's GPU."""
    gpu = cluster.gpu
    return MoeKernelRates(units.us_to_seconds(measured.floor_us), gpu.hbm_bytes_per_s * measured.hbm_utilization,
                          units.tflops_to_flops_per_s(measured.tflops), measured.half_rows, "measured",
                          measured.pair_passes, eff.elementwise_bytes_per_s(gpu.hbm_bytes_per_s, gpu.elementwise_hbm_utilization))


def with_moe_backend(cluster: ClusterSpec, backend: str) -> ClusterSpec:
    """The cluster as a deployment launched with vLLM's `--moe-backend backend` prices it: every
    expert format's kernel is that backend's measured one (ServingMoeKernels.kernel), None (the
    dense fallback) where it has none; the cluster itself for auto (the engine's default pick,
    the catalog's plain fields). check_request refuses a backend the model's format lacks."""
    if backend == "auto":
        return cluster
    kernels = cluster.gpu.serving_moe_kernels
    chosen = kernels.model_copy(update={
        **{name: kernels.kernel(name, backend) for name in MOE_WEIGHT_FORMATS},
        **{f"{name}_ep": None for name in MOE_WEIGHT_FORMATS if f"{name}_ep" in type(kernels).model_fields}})
    return cluster.model_copy(update={"gpu": cluster.gpu.model_copy(update={"serving_moe_kernels": chosen})})


def moe_kernel_seconds(kernel: MoeKernelRates, weight_bytes: float, gemms: list[Gemm],
                       load_factor: float = 1.0, pair_pass_bytes: float = 0.0) -> tuple[float, bool]:
    """One fused-MoE op on one GPU and whether its weight read bounds it:
    floor + max(W / B_k, x * sum(F_g / (R_k u_k(M) u(N) u(K)))) + x * passes * P / B_e, W the
    touched experts' bytes, F_g the FLOPs of each expert GEMM at M rows per expert,
    u_k(M) = M / (M + half_rows), u(x) = x / (x + GEMM_HALF_RATE_DIMENSION), x the busiest
    GPU's share of the routed work (expert_load_factor), P one hidden-width pass over the GPU's
    routed pairs (routed_pair_pass_bytes) and B_e the elementwise HBM rate: the gather, per-pair
    output and top-k sum traffic, which TP does not split. docs/cost-model.md (Serving: the MoE
    kernels)."""
    return moe_kernel_seconds_of_terms(kernel, weight_bytes, expert_gemm_terms(gemms), load_factor, pair_pass_bytes)


def expert_gemm_terms(gemms: list[Gemm]) -> tuple[float, float]:
    """(a, b) with sum F_g / (u_k(M) u(N) u(K)) = a + half_rows * b for any half_rows, since
    1 / u_k(M) = 1 + half_rows / M: a = sum F_g / (u(N) u(K)), b = sum F_g / (M u(N) u(K)). A
    fit that varies the kernel's constants over fixed GEMMs computes them once
    (bench/moe_kernel_calibration.py)."""
    a = b = 0.0
    for g in gemms:
        scaled = g.flops / gemm_utilization(g, 0.0)  # u(M) = 1 at a zero half-rate dimension
        a += scaled
        b += scaled / g.m
    return a, b


def moe_kernel_seconds_of_terms(kernel: MoeKernelRates, weight_bytes: float, terms: tuple[float, float],
                                load_factor: float = 1.0, pair_pass_bytes: float = 0.0) -> tuple[float, bool]:
    """moe_kernel_seconds with the expert GEMMs given as their expert_gemm_terms."""
    weight_seconds = weight_bytes / kernel.hbm_bytes_per_s
    shape_seconds = load_factor * terms[0] / kernel.flops_per_s  # the FLOPs at full tiles
    compute_seconds = shape_seconds + load_factor * kernel.half_rows * terms[1] / kernel.flops_per_s
    pair_seconds = load_factor * kernel.pair_passes * pair_pass_bytes / kernel.pair_bytes_per_s
    # the bound named: the weight read against the FLOPs themselves; the half-filled tiles of a
    # few rows per expert (half_rows) slow the kernel without making its work compute (batch 1
    # decode was called compute-bound)
    return kernel.floor_seconds + max(weight_seconds, compute_seconds) + pair_seconds, weight_seconds >= shape_seconds


def routed_pair_pass_bytes(model: ModelSpec, gemms: list[Gemm]) -> float:
    """One pass over the hidden-width rows of every routed (token, expert) pair on the GPU:
    the up GEMM's rows per expert x touched experts (mlp_gemms) pairs of h activations of b
    bytes (the experts' input width h and the activations' dtype; not split by TP)."""
    up = gemms[0]
    return up.m * up.count * up.k * activation_bytes_per_element(model)


def moe_layer_gemm_seconds(model: ModelSpec, cluster: ClusterSpec, layout: Layout, num_tokens: float,
                           imbalance: float = 1.0, touched_experts: float | None = None) -> float:
    """One MoE layer's routed-expert op on the busiest GPU (router and all-to-all excluded):
    moe_kernel_seconds at the GPU's kernel (moe_kernel), the touched experts' bytes
    (routed_expert_bytes_read) and the expert GEMMs (mlp_gemms); num_tokens the replica's
    (as in stage_step_time), `touched_experts` of E when the routing is known. Scored
    against AIConfigurator's measured MoE kernels by bench/moe_calibration.py."""
    return moe_layer_kernel_time(model, cluster, layout, num_tokens, imbalance, touched_experts)[0]


def moe_layer_kernel_time(model: ModelSpec, cluster: ClusterSpec, layout: Layout, num_tokens: float,
                          imbalance: float = 1.0, touched_experts: float | None = None,
                          kernel: MoeKernelRates | None = None,
                          whole: dict[tuple, tuple[float, bool]] | None = None) -> tuple[float, bool]:
    """moe_layer_gemm_seconds and whether the weight read bounds it (with EP, plus
    ep_foreign_pair_seconds); `kernel` the moe_kernel already looked up, if any. A fractional
    token count (a mean load: an open loop below one sequence per micro-batch) is the mix of the
    whole counts either side, as steps carry one or the other: the experts it touches grow in
    whole tokens, and rounding them made a pipelined MoE replica's TPOT jump up at a mean of
    1.5 tokens a step and back down at 2 micro-batches in flight (1.6 tokens: 8 experts or 16,
    not one of them at 1.6x). `whole`: the caller's memo of the whole counts already priced at
    these arguments (stage_step_times': the steady states of one estimate price the same whole
    counts over and over, 7 times in 10 at 16,384 GPUs); None: none kept."""
    low = max(1, math.floor(num_tokens))
    share = num_tokens - low

    def at(m: int) -> tuple[float, bool]:
        if whole is None:
            return _moe_layer_kernel_time(model, cluster, layout, m, imbalance, touched_experts, kernel)
        key = ("moe_kernel", m)
        if key not in whole:
            whole[key] = _moe_layer_kernel_time(model, cluster, layout, m, imbalance, touched_experts, kernel)
        return whole[key]

    below = at(low)
    if share <= 0:
        return below
    above = at(low + 1)
    return (1 - share) * below[0] + share * above[0], above[1] if share >= 0.5 else below[1]


def _moe_layer_kernel_time(model: ModelSpec, cluster: ClusterSpec, layout: Layout, m: int, imbalance: float,
                           touched_experts: float | None, kernel: MoeKernelRates | None) -> tuple[float, bool]:
    """moe_layer_kernel_time at a whole number of tokens."""
    gemms = mlp_gemms(model, layout, m, touched_experts)
    seconds, weight_bound = moe_kernel_seconds(kernel or moe_kernel(model, cluster, layout.ep),
                                               routed_expert_bytes_read(model, layout, m, touched_experts),
                                               gemms, expert_load_factor(layout, imbalance, model),
                                               routed_pair_pass_bytes(model, gemms))
    foreign = 0.0 if has_ep_kernel(model, cluster, layout.ep) else ep_foreign_pair_seconds(model, cluster, layout, m)
    return seconds + foreign, weight_bound


def has_ep_kernel(model: ModelSpec, cluster: ClusterSpec, ep: int) -> bool:
    """Whether the engine runs its own EP kernel for these experts at this EP degree (catalog
    <format>_ep: vLLM's FlashInfer CUTLASS block-fp8 MoE on Hopper), which permutes the GPU's
    own pairs only: no foreign-pair traffic (bench/moe_kernel_calibration.py: with the term
    its fit scores 13% median |error| against 10% without)."""
    weight_format = expert_weight_format(model)
    return weight_format is not None and cluster.gpu.serving_moe_kernels.ep_kernel(weight_format, ep) is not None


def ep_foreign_pair_bytes(model: ModelSpec, layout: Layout, num_tokens: float) -> float:
    """HBM traffic one GPU's fused-MoE op spends on routed pairs whose expert another GPU holds,
    under vLLM's default EP path (all2all_backend allgather_reducescatter, vllm/config/parallel.py
    at 0.33.0): every rank all-gathers the EP group's tokens and runs the fused op on all of
    them with an expert map, and the op's per-pair buffers (vllm/model_executor/layers/fused_moe/
    fused_moe.py: the up output [N e, 2F] and the activation [N e, F], written and read; the
    down output [N e, h], written and summed) cover every pair, its own or not:
    N_g e (1 - E_g/E) pairs x b (6F + 2h) bytes, N_g the EP group's tokens
    (expert_group_tokens), b the activation bytes, h the experts' input width. 0 without EP."""
    if layout.ep <= 1 or not model.is_moe:
        return 0.0
    foreign_share = 1 - experts_per_gpu(model, layout.ep) / model.num_local_experts
    pairs = expert_group_tokens(layout, num_tokens) * model.num_experts_per_tok * foreign_share
    width = model.moe_latent_size or model.hidden_size
    return pairs * activation_bytes_per_element(model) * (6 * model.expert_intermediate_size + 2 * width)


def ep_foreign_pair_seconds(model: ModelSpec, cluster: ClusterSpec, layout: Layout, num_tokens: float) -> float:
    """ep_foreign_pair_bytes at EP_FOREIGN_PAIR_HBM_UTILIZATION of the GPU's HBM bandwidth
    (docs/cost-model.md, Serving: the MoE kernels)."""
    return ep_foreign_pair_bytes(model, layout, num_tokens) / (
        cluster.gpu.hbm_bytes_per_s * eff.EP_FOREIGN_PAIR_HBM_UTILIZATION)


def head_shape_utilization(model: ModelSpec, tp: int, rows: float,
                           m_half: float = eff.GEMM_HALF_RATE_DIMENSION) -> float:
    """The LM head's GEMM [rows, h] x [h, V/t] at u(rows) u(V/t) u(h), u(rows) at `m_half`."""
    half = eff.GEMM_HALF_RATE_DIMENSION
    m, n, k = max(1.0, rows), model.vocab_size / tp, model.hidden_size
    return (m / (m + m_half)) * (n / (n + half)) * (k / (k + half))


def attention_flops_per_s(cluster: ClusterSpec, kv_cache_dtype: str = "auto") -> float:
    """Flash attention runs in 16 bits (an fp8 checkpoint's attention is not fp8 unless the
    KV cache is): the forward kernel's share of the dense 16-bit peak, the GPU's measured
    share where the catalog has one (flash_attention_forward_fraction), as training prices it.
    With an fp8 KV cache on a GPU with fp8 tensor cores the kernel runs in fp8 at the same
    share of the fp8 peak: vLLM's FlashAttention-3 path quantizes the queries and passes
    q/k/v descales (vllm/v1/attention/backends/flash_attn.py, FlashAttentionImpl.forward;
    FlashAttention-3, Shah et al. 2024, sec. 4: FP8 forward near 1.2 PFLOP/s on H100)."""
    gpu = cluster.gpu
    precision = "fp8" if kv_cache_dtype == "fp8" and gpu.peak_flops_per_s("fp8") is not None else "bf16"
    peak = eff.dense_peak_flops_per_s(gpu, precision) or eff.dense_peak_flops_per_s(gpu, "fp16")
    if peak is None:
        raise no_tensor_rate_error(gpu.name)
    forward_share, _ = eff.flash_attention_fractions(gpu.flash_attention_forward_fraction)
    return peak * forward_share


@computed_once
def elementwise_bytes_per_token(model: ModelSpec, tp: int) -> float:
    """HBM traffic of one layer's non-matmul kernels per token on one GPU in vLLM's forward
    (vllm/model_executor/models/llama.py; layernorm.py fused_add_rms_norm, activation.py
    SiluAndMul, rotary_embedding.py), e the activation bytes: two fused residual-add + RMSNorms
    on the whole hidden state, replicated on every TP rank (read input and residual, write
    both: 2 x 4e*h); rotary embedding in place on the GPU's query and key heads (read + write:
    2e*(a/t + k_gpu)*d, params.rotary_elements_per_token: MLA's rope parts, none with learned
    positions); the gated activation (read 2f/t, write f/t: 3e*f/t; 2e*f/t ungated).
    The KV-cache write is counted with the attention's KV bytes. Llama-3.1-70B at t = 8:
    16*8192 + 4*(8 + 1)*128 + 6*28672/8 = 131,072 + 4,608 + 21,504 = 157,184 B per token per layer.
    docs/cost-model.md (Serving: one engine step)."""
    e = activation_bytes_per_element(model)
    replicated = 2 * 4 * e * model.hidden_size
    rotary = 2 * e * rotary_elements_per_token(model, tp)
    return replicated + rotary + (3 if model.gated_mlp else 2) * e * mlp_width_per_token(model) / tp


@dataclass(frozen=True)
class StepConstants:
    """What stage_step_time reads that depends on the model, the cluster and the layout only:
    looked up once per estimate (step_constants) rather than on every step it prices."""

    active_params_per_layer: float
    matmul_flops_per_s: float
    """achievable_flops_per_s"""
    moe_kernel: MoeKernelRates | None
    """moe_kernel at the layout's EP degree; None for a dense model."""
    linear_hbm_utilization: float
    """linear_hbm_utilization"""
    layer_seconds: float
    """The fixed cost per layer per step: vLLM's ENGINE_STEP_SECONDS_PER_LAYER (another stack's
    in its anchor test)."""
    head_bytes: float
    """lm_head_read_bytes"""
    all2all_backend: str
    """vLLM's --all2all-backend (requests.ALL2ALL_BACKENDS): how an EP exchange is priced."""
    enable_dbo: bool = False
    """vLLM's --enable-dbo: dual-batch overlap of the EP exchange (dbo_step_time)."""
    draft: DraftStep | None = None
    """Speculative decoding with a drafter on the GPU (draft_step); None = none."""


@dataclass(frozen=True)
class DraftStep:
    """What a step's drafter passes are priced from: the draft model, its weights and KV on one
    GPU as a one-stage StageMemory, its StepConstants, and k (planner/cost/speculative.py)."""

    model: ModelSpec
    layout: Layout
    """The target's TP, DP and EP, one pipeline stage."""
    stage: StageMemory
    constants: StepConstants
    num_tokens: int
    fc_bytes: float = 0.0
    """EAGLE-3's fc on one GPU (replicated): read, and run on every token, in the first pass only."""


def draft_seconds(draft: DraftStep, cluster: ClusterSpec, placement: Placement, load: StepLoad,
                  imbalance: float) -> float:
    """The drafter after the step's verification (vLLM's propose, v1/spec_decode/
    llm_base_proposer.py at 0.33.0): a first pass over every token of the step, then k - 1
    passes over one token per request, each with the draft's LM head on one row per request;
    each pass priced as a step of the draft model (stage_step_time: its weights read, its KV,
    its TP collectives, its per-layer fixed cost)."""
    requests = load.decode_seqs + load.prompts_completing
    if requests <= 0:
        return 0.0
    first = replace(load, prefill_tokens=load.prefill_tokens + load.spec_tokens, spec_tokens=0.0)
    seconds = stage_step_time(draft.model, cluster, draft.layout, placement, draft.stage, first, imbalance,
                              draft.constants).seconds
    if draft.fc_bytes:  # EAGLE-3's fc over the step's tokens: its weight read or its FLOPs
        fc_flops = 2 * first.num_tokens * draft.fc_bytes / activation_bytes_per_element(draft.model)
        seconds += max(draft.fc_bytes / (cluster.gpu.hbm_bytes_per_s * draft.constants.linear_hbm_utilization),
                       fc_flops / draft.constants.matmul_flops_per_s)
    if draft.num_tokens > 1:
        more = StepLoad(requests, load.decode_context_tokens + load.prefill_tokens)
        seconds += (draft.num_tokens - 1) * stage_step_time(draft.model, cluster, draft.layout, placement,
                                                            draft.stage, more, imbalance, draft.constants).seconds
    return seconds


def linear_hbm_utilization(model: ModelSpec, cluster: ClusterSpec) -> float:
    """The share of HBM bandwidth the layers' linear kernels stream their weights at: the GPU's
    measured value for the step's matmul precision (serving_decode_hbm_utilization), else
    DECODE_HBM_UTILIZATION."""
    measured = cluster.gpu.decode_hbm_utilization(matmul_precision(model, cluster))
    return eff.DECODE_HBM_UTILIZATION if measured is None else measured


def step_constants(model: ModelSpec, cluster: ClusterSpec, layout: Layout,
                   all2all_backend: str = DEFAULT_ALL2ALL_BACKEND, enable_dbo: bool = False,
                   request: ServeRequest | None = None) -> StepConstants:
    """The StepConstants of this model on this cluster (after with_moe_backend) and layout;
    with `request`, its drafter when it asks for speculative decoding (draft_step)."""
    return StepConstants(active_params_per_layer(model), achievable_flops_per_s(model, cluster),
                         moe_kernel(model, cluster, layout.ep) if model.is_moe else None,
                         linear_hbm_utilization(model, cluster), eff.ENGINE_STEP_SECONDS_PER_LAYER,
                         lm_head_read_bytes(model, layout), all2all_backend, enable_dbo,
                         None if request is None else draft_step(model, cluster, layout, request))


def draft_step(model: ModelSpec, cluster: ClusterSpec, layout: Layout, request: ServeRequest) -> DraftStep | None:
    """The request's drafter as a DraftStep: its model (speculative.draft_model_of) on one GPU of
    the layout's TP (and EP) group, its weights as a one-stage model's (the embedding is
    gathered, not read; the head read on every pass); None without speculative decoding or
    with a host-side drafter (ngram)."""
    speculation = request.speculation
    draft = None if speculation is None else draft_model_of(model, speculation)
    if draft is None:
        return None
    plain = replace(request, speculation=None)
    one_stage = Layout(layout.tp, 1, layout.dp, layout.ep)
    (stage,) = stage_memory(draft, cluster, one_stage, plain, 1)
    extras = draft_extras(draft, speculation.method, layout.tp)
    stage = replace(stage, weights_bytes=stage.weights_bytes + extras.every_pass_bytes)
    constants = step_constants(draft, cluster, one_stage, request.all2all_backend)
    return DraftStep(draft, one_stage, stage, constants, speculation.num_tokens, extras.first_pass_bytes)


DBO_DECODE_TOKEN_THRESHOLD = 32
DBO_PREFILL_TOKEN_THRESHOLD = 512
"""vLLM splits a step into two micro-batches under --enable-dbo when its tokens reach
dbo_decode_token_threshold (a decode-only step) or dbo_prefill_token_threshold (a step with
prompt chunks): ParallelConfig defaults, vllm/config/parallel.py at 0.33.0
(v1/worker/ubatch_utils.check_ubatch_thresholds)."""


def dbo_applies(constants: StepConstants, load: StepLoad, exchange_seconds: float) -> bool:
    """Dual-batch overlap runs on this step: enabled over DeepEP (vLLM micro-batches over
    DeepEP or NIXL EP only on CUDA, vllm/config/vllm.py at 0.33.0; the request check refuses the
    rest), an EP exchange to hide, and the step's tokens at the threshold for its kind."""
    if not constants.enable_dbo or constants.all2all_backend == DEFAULT_ALL2ALL_BACKEND or exchange_seconds <= 0:
        return False
    threshold = DBO_DECODE_TOKEN_THRESHOLD if load.prefill_tokens == 0 else DBO_PREFILL_TOKEN_THRESHOLD
    return load.num_tokens >= threshold


def dbo_step_time(half: StepTime, moe_layers: float) -> StepTime:
    """A step split into two micro-batches of half the load each (vLLM's dual-batch overlap,
    v1/worker/ubatching.py): while one runs its kernels the other's EP dispatch or combine is
    in flight, so the step takes 2 max(C, X) for a half step's work C (its weights read again,
    its fixed per-layer cost paid again) and exchange X; the exchange shows only where it
    outlasts the other half's work. Perfect overlap: no SMs are set aside for the exchange
    (vLLM reserves VLLM_DBO_COMM_SMS for DeepEP's high-throughput kernels) and the first and
    last layer's exchange are not exposed. docs/cost-model.md (Expert parallelism: dual-batch
    overlap)."""
    exchange = moe_layers * half.ep_exchange_seconds_per_moe_layer
    work = half.seconds - exchange
    exposed = max(0.0, exchange - work)
    return StepTime(2 * (work + exposed), 2 * half.gemm_seconds, 2 * half.attention_seconds,
                    2 * half.allreduce_seconds_per_layer, half.bound, 2 * half.overhead_seconds,
                    2 * exposed / moe_layers if moe_layers else 0.0, 2 * half.elementwise_seconds,
                    2 * half.moe_seconds, 2 * half.draft_seconds, half.tiles_underfilled)


@dataclass(frozen=True)
class LayerLoadTerms:
    """What a step's load costs one layer of the layout, whatever stage the layer is on:
    stage_step_time multiplies these by the stage's layers. layer_load_terms prices them once
    per (layout, load); a replica's stages share them (stage_step_times)."""

    moe_seconds: float
    """One MoE layer's fused-MoE op on the busiest GPU (moe_layer_kernel_time); 0 if dense."""
    moe_weight_bound: bool
    dense_flops_per_layer: float
    """2 * active params * tokens less the routed experts' FLOPs, the mean layer's, all of the
    replica's TP ranks together."""
    dense_utilization: float
    """dense_gemm_shape_utilization at the step's tokens."""
    allreduce_seconds: float
    """tp_allreduce_seconds_per_layer at the step's message size (two sublayers' worth)."""
    exchange_seconds: float
    """One MoE layer's EP exchange (ep_exchange_parts)."""
    replaced_seconds: float
    """The output all-reduce that sequence-parallel MoE's all-gather replaces (ep_exchange_parts)."""
    qk_norm_seconds: float = 0.0
    """qk_norm_allreduce_seconds at the step's tokens: one layer's all-reduce of the query and
    key norms' partial sums (MiniMax-M2 under TP); 0 for every other model."""


def layer_load_terms(model: ModelSpec, cluster: ClusterSpec, layout: Layout, placement: Placement,
                     load: StepLoad, imbalance: float, constants: StepConstants,
                     priced: dict | None = None) -> LayerLoadTerms:
    """The LayerLoadTerms of `load` (see stage_step_time for the formulas); `priced`:
    stage_step_times' memo, which also keeps the MoE op's whole token counts."""
    tokens = max(load.num_tokens, 1.0)
    expert_tokens = max(load.moe_tokens, 1.0)
    moe_seconds, moe_weight_bound = (moe_layer_kernel_time(model, cluster, layout, expert_tokens, imbalance,
                                                           kernel=constants.moe_kernel, whole=priced)
                                     if model.is_moe else (0.0, False))
    dense_flops = 2 * constants.active_params_per_layer * tokens - routed_expert_flops(model, 1, tokens)
    m_half = eff.gemm_row_half(constants.matmul_flops_per_s, linear_bytes_per_weight(model),
                               cluster.gpu.hbm_bytes_per_s * constants.linear_hbm_utilization)
    message_bytes = tokens * model.hidden_size * activation_bytes_per_element(model)
    allreduce, _ = tp_allreduce_seconds_per_layer(cluster, layout, placement, message_bytes)
    exchange, replaced = ep_exchange_parts(model, cluster, layout, placement, expert_tokens, constants.all2all_backend)
    return LayerLoadTerms(moe_seconds, moe_weight_bound, dense_flops,
                          dense_gemm_shape_utilization(model, layout, tokens, m_half), allreduce, exchange, replaced,
                          qk_norm_allreduce_seconds(model, cluster, layout, placement, tokens))


QK_NORM_PARTIAL_SUM_BYTES_PER_TOKEN = 8
"""Two fp32 sums of squares per token, the query's and the key's (vLLM 0.33.0
minimax_rms_norm/rms_norm_tp.py: _all_reduce_variance on a [tokens, 2] float32 tensor)."""


def qk_norm_allreduce_seconds(model: ModelSpec, cluster: ClusterSpec, layout: Layout, placement: Placement,
                              tokens: float) -> float:
    """One layer's all-reduce of the query and key norms' partial sums where the norms span
    every head (ModelSpec.qk_norm_across_heads) and TP splits the heads: 8 bytes a token, priced
    as one of the layer's own all-reduces at that size (at these sizes, the kernel's latency).
    0 without such norms or at TP 1. docs/cost-model.md (Serving: one engine step)."""
    if not model.qk_norm_across_heads or layout.tp <= 1:
        return 0.0
    both, _ = tp_allreduce_seconds_per_layer(cluster, layout, placement,
                                             tokens * QK_NORM_PARTIAL_SUM_BYTES_PER_TOKEN)
    return both / 2


@dataclass(frozen=True)
class StageRates:
    """What stage_step_time reads that depends on the stage and the layout but not on the
    step's load: priced once per stage (stage_rates) rather than on every step."""

    weight_seconds: float
    """weight_read_seconds of the stage."""
    head_m_half: float
    """The LM head GEMM's half-rate rows (efficiency.gemm_row_half)."""
    attention_flops_per_s: float
    """attention_flops_per_s at the stage's KV-cache dtype."""
    full_pair_dims: float
    """multiply_adds_per_attention_pair of a full-attention layer over its head-dim factor."""
    window_pair_dims: float
    """The same for a sliding-window layer."""
    elementwise_seconds_per_token: float
    """One sublayer's non-matmul HBM traffic per token (elementwise_bytes_per_token plus the
    activation quantization's) at the elementwise HBM rate."""
    overhead_seconds: float
    """The stage's fixed per-layer cost per step (layer_seconds per sublayer, MoE layers' share)."""
    dense_layer_equivalents: float
    """stage_dense_layer_equivalents: the stage's non-routed matmul work in mean blocks."""


def stage_rates(model: ModelSpec, cluster: ClusterSpec, layout: Layout, stage: StageMemory,
                constants: StepConstants) -> StageRates:
    """The StageRates of one stage (see stage_step_time for the formulas)."""
    gpu = cluster.gpu
    hbm = gpu.hbm_bytes_per_s * eff.DECODE_HBM_UTILIZATION
    full_dims, window_dims = multiply_adds_per_attention_pair(model)
    elementwise_hbm = eff.elementwise_bytes_per_s(gpu.hbm_bytes_per_s, gpu.elementwise_hbm_utilization)
    per_token = (elementwise_bytes_per_token(model, layout.tp)
                 + activation_quant_bytes_per_token(model, layout.tp, matmul_precision(model, cluster)))
    moe_layers = stage_moe_layers(model, stage)
    # an MoE layer's fused op carries its own measured floor in moe_seconds: the dense MLP's
    # kernels it replaces leave the per-layer fixed cost, the router GEMM joins it
    moe_factor = eff.moe_layer_overhead_factor(
        bool(moe_layers) and model.num_shared_experts == 0 and constants.moe_kernel is not None
        and constants.moe_kernel.floor_seconds > 0)
    # A hybrid's one-mixer blocks (Nemotron-H) have one residual all-reduce and about half a
    # layer's kernels: the mean block's share of the two sublayers (sublayers_per_layer).
    overhead = (stage.num_layers * sublayers_per_layer(model) + moe_layers * (moe_factor - 1)) * constants.layer_seconds
    return StageRates(
        weight_read_seconds(model, cluster, stage, layout, constants.linear_hbm_utilization, constants.head_bytes),
        eff.gemm_row_half(constants.matmul_flops_per_s, lm_head_bytes_per_weight(model), hbm),
        attention_flops_per_s(cluster, stage.kv_cache_dtype),
        full_dims / eff.attention_head_dim_factor(model, gpu, full_dims),
        window_dims / eff.attention_head_dim_factor(model, gpu, window_dims),
        per_token / elementwise_hbm, overhead, stage_dense_layer_equivalents(model, stage))


def stage_dense_layer_equivalents(model: ModelSpec, stage: StageMemory) -> float:
    """The stage's matmul work outside the routed experts, in mean blocks: L_s, plus
    Delta * x / a where the stage holds Delta = its MoE layers - their mean share,
    x = moe_layer_excess_active_params and a = the mean block's non-routed active parameters.
    L_s exactly where the stage holds the mean share. DeepSeek-V3's stage 1 of 4 (layers
    15-29, all MoE): Delta = 15 - 15 * 58/61 = 0.738; x = -350,486,528; a = attention
    187,107,328 + norms 14,336 + (58 * 45,875,200 + 3 * 396,361,728) / 61 = 250,233,906;
    15 - 0.738 * 350,486,528 / 250,233,906 = 13.967 mean blocks."""
    excess = stage_moe_excess(model, stage)
    if not excess:
        return float(stage.num_layers)
    non_routed = active_params_per_layer(model) - moe_layers_of(model, 1) * model.num_experts_per_tok * expert_params(model)
    return stage.num_layers + excess * moe_layer_excess_active_params(model) / non_routed


def stage_step_time(model: ModelSpec, cluster: ClusterSpec, layout: Layout, placement: Placement,
                    stage: StageMemory, load: StepLoad,
                    imbalance: float = eff.EXPERT_LOAD_IMBALANCE,
                    constants: StepConstants | None = None,
                    terms: LayerLoadTerms | None = None, rates: StageRates | None = None) -> StepTime:
    """One stage, one step of `load`:
    linear layers  max(weights read / HBM, 2 * active params * tokens / t at the GEMM shape's rate);
                   for MoE the routed experts apart, one fused-MoE op per MoE layer at the
                   GPU's measured kernel (moe_layer_kernel_time), the rest as above
    attention      (KV read of the decoding sequences + KV written) / HBM
                   + 2 * pairs * a * (d + d_v) * L_s / t at flash attention's rate
                   (a sliding-window layer reads and pairs each query with at most W keys:
                   window_capped_tokens on the mean context and the mean pairs per query)
    per layer      the fixed step cost and 2 all-reduces of tokens * h * bytes (times the
                   mean block's share of two sublayers: 1/2 for Nemotron-H's one-mixer blocks),
                   and one of tokens * 8 B where the query / key norms span every head;
                   with EP across DP ranks, per MoE layer vLLM's dispatch all-gather and
                   combine reduce-scatter (ep_exchange_seconds_per_moe_layer), and the
                   busiest GPU's extra routed work (expert_load_factor).
    The last stage adds the LM head for the sampled rows only (vLLM computes logits for
    positions that emit a token). `constants`: step_constants, `terms`: layer_load_terms of
    this load, `rates`: stage_rates of this stage, when the caller has them.
    docs/cost-model.md (Serving: one engine step)."""
    constants = constants or step_constants(model, cluster, layout)
    terms = terms or layer_load_terms(model, cluster, layout, placement, load, imbalance, constants)
    rates = rates or stage_rates(model, cluster, layout, stage, constants)
    t = layout.tp
    tokens = max(load.num_tokens, 1.0)
    hbm = cluster.gpu.hbm_bytes_per_s * eff.DECODE_HBM_UTILIZATION
    moe_layers = stage_moe_layers(model, stage)
    moe_seconds = terms.moe_seconds  # 0 for a dense model
    weight_seconds = rates.weight_seconds
    head_flops = 2 * model.vocab_size * model.hidden_size * load.sampled_rows if stage.stage == layout.pp - 1 else 0.0
    compute_seconds = (rates.dense_layer_equivalents * terms.dense_flops_per_layer / terms.dense_utilization
                       + head_flops / head_shape_utilization(model, t, load.sampled_rows, rates.head_m_half)
                       ) / t / constants.matmul_flops_per_s
    gemm = max(weight_seconds, compute_seconds) + moe_layers * moe_seconds
    kv_bytes = stage_kv_bytes_read(stage, load)
    full_pairs, window_pairs = stage_attention_pairs_by_kind(stage, load)
    pair_dims = full_pairs * rates.full_pair_dims + window_pairs * rates.window_pair_dims
    attention = kv_bytes / hbm + 2 * pair_dims / t / rates.attention_flops_per_s
    sublayers = sublayers_per_layer(model)
    elementwise = stage.num_layers * sublayers * tokens * rates.elementwise_seconds_per_token
    # the mean layer's all-reduces: every sublayer's, less the MoE layers' output all-reduce
    # that sequence-parallel MoE replaces by an all-gather (in the exchange)
    allreduce = (terms.allreduce_seconds * sublayers - terms.replaced_seconds * moe_layers / stage.num_layers
                 + terms.qk_norm_seconds)
    exchange = terms.exchange_seconds
    exchanges = moe_layers * exchange
    overhead = rates.overhead_seconds
    experts_dominate = moe_layers * moe_seconds > max(weight_seconds, compute_seconds)
    weight_bound = terms.moe_weight_bound if experts_dominate else weight_seconds >= compute_seconds
    # the GEMMs' time is their compute at the step's shape, yet their FLOPs at the full rate are
    # below the weight read: a few rows in half-filled tiles (an int4 model's batch-1 decode)
    flop_seconds = (rates.dense_layer_equivalents * terms.dense_flops_per_layer + head_flops) / t \
        / constants.matmul_flops_per_s
    underfilled = not experts_dominate and not weight_bound and weight_seconds >= flop_seconds
    bound = "memory" if weight_bound else "compute"
    drafting = 0.0
    if constants.draft is not None and stage.stage == layout.pp - 1:
        drafting = draft_seconds(constants.draft, cluster, placement, load, imbalance)
    if dbo_applies(constants, load, exchanges):
        # the two micro-batches are the model's forward; the drafter runs once, after it
        half = stage_step_time(model, cluster, layout, placement, stage, load.scaled(0.5), imbalance,
                               replace(constants, enable_dbo=False, draft=None))
        both = dbo_step_time(half, moe_layers)
        return replace(both, seconds=both.seconds + drafting, draft_seconds=drafting)
    return StepTime(gemm + attention + elementwise + stage.num_layers * allreduce + exchanges + overhead + drafting,
                    gemm, attention, allreduce, bound, overhead, exchange, elementwise, moe_layers * moe_seconds,
                    drafting, underfilled)


def ep_exchange_ops(model: ModelSpec, cluster: ClusterSpec, layout: Layout, placement: Placement,
                    num_tokens: float, phase: str = "decode", count_per_step: int = 1,
                    backend: str = DEFAULT_ALL2ALL_BACKEND) -> tuple[Collective, ...]:
    """One MoE layer's expert-parallel exchange, forward only, as vLLM runs it (at 0.33.0).
    allgather_reducescatter (the default: AgRsAll2AllManager in
    vllm/distributed/device_communicators/all2all.py, FusedMoE's naive dispatch/combine in
    fused_moe/runner/moe_runner.py):
    dispatch  an all-gather over the EP group of ep_dispatch_bytes (hidden states and router
              logits of the group's ep * N/t tokens),
    combine   a reduce-scatter of ep_combine_bytes (their partial outputs),
    each comm.allgather_seconds: the probe's all-gather / reduce-scatter curve for that link
    and group size where the profile has one, else the ring on the group's links at NCCL's
    bus bandwidth (NVLink inside a node, the NICs once per node across).
    deepep_low_latency / deepep_high_throughput (DeepEPLLAll2AllManager, DeepEPHTAll2AllManager):
    dispatch and combine are DeepEP all-to-alls (moe.deepep_traffic), one call per step (vLLM
    sizes DeepEP for the step's token budget), each token going only where its experts are
    (low latency: one message per expert; high throughput: once per rank inside the node,
    once per node across), fp8 for 128-block fp8 experts; each comm.deepep_seconds on the
    group's links with efficiency.deepep_fixed_seconds (DeepEP's kernels, not NCCL: no probe
    curve); message_bytes is what one rank sends (NVLink + RDMA).
    output    under sequence-parallel MoE (moe.sequence_parallel_moe, every backend here) the
              layer's output, N * h * bytes, all-gathered over TP in place of its all-reduce.
    None without EP and when the EP group is one replica's TP group (d = 1: every TP rank
    already holds the step's tokens, runs its E/ep experts on them, and the MLP's TP
    all-reduce sums them). Each is a Collective of `phase`, `count_per_step` times per step;
    message_bytes is the gathered (or reduced) buffer, what nccl-tests calls the size, or the
    bytes one rank sends in one all-to-all call."""
    group, link = placement.ep_group, placement.ep_link
    if group is None or link is None or layout.dp_per_ep_group <= 1 or not model.is_moe:
        return ()
    ops = []
    if backend == DEFAULT_ALL2ALL_BACKEND:
        for name, kind, size, curve in (
                ("MoE dispatch", "all-gather", ep_dispatch_bytes(model, layout, num_tokens),
                 cluster.allgather_curve(link.scope, layout.ep)),
                ("MoE combine", "reduce-scatter", ep_combine_bytes(model, layout, num_tokens),
                 cluster.reduce_scatter_curve(link.scope, layout.ep))):
            ops.append(Collective(phase, name, kind, layout.ep, link.kind, size, allgather_seconds(size, group, curve),
                                  "measured" if curve is not None else "model", count_per_step))
    else:
        transfers = deepep_transfers(model, layout, group, num_tokens / layout.tp, backend)
        for name, (nvlink, rdma, seconds) in zip(("MoE dispatch", "MoE combine"), transfers, strict=True):
            ops.append(Collective(phase, name, "all-to-all", layout.ep, link.kind, nvlink + rdma, seconds, "model",
                                  count_per_step))
    if sequence_parallel_moe(layout) and placement.tp_link is not None:
        size = num_tokens * model.hidden_size * activation_bytes_per_element(model)
        curve = cluster.allgather_curve(placement.tp_link.scope, layout.tp)
        ops.append(Collective(phase, "MoE output", "all-gather", layout.tp, placement.tp_link.kind, size,
                              allgather_seconds(size, placement.tp_group, curve),
                              "measured" if curve is not None else "model", count_per_step))
    return tuple(ops)


def ep_exchange_parts(model: ModelSpec, cluster: ClusterSpec, layout: Layout, placement: Placement,
                      num_tokens: float, backend: str = DEFAULT_ALL2ALL_BACKEND) -> tuple[float, float]:
    """(the ep_exchange_ops of one MoE layer, the TP all-reduce of its output that the output
    all-gather replaces under sequence-parallel MoE): stage_step_time counts an all-reduce
    after every layer's MLP and takes the second off per MoE layer. (0, 0) without an exchange."""
    ops = ep_exchange_ops(model, cluster, layout, placement, num_tokens, backend=backend)
    replaced = sum(tp_allreduce_seconds_per_layer(cluster, layout, placement, op.message_bytes)[0] / 2
                   for op in ops if op.name == "MoE output")
    return sum(op.seconds for op in ops), replaced


def ep_exchange_seconds_per_moe_layer(model: ModelSpec, cluster: ClusterSpec, layout: Layout,
                                      placement: Placement, num_tokens: float,
                                      backend: str = DEFAULT_ALL2ALL_BACKEND) -> float:
    """The ep_exchange_ops of one MoE layer (dispatch, combine, the output all-gather under
    sequence-parallel MoE); 0 without an exchange."""
    return ep_exchange_parts(model, cluster, layout, placement, num_tokens, backend)[0]


def stage_kv_bytes_read(stage: StageMemory, load: StepLoad) -> float:
    """KV bytes one step moves on one GPU of the stage: every attention layer writes the step's
    tokens; full layers read each decoding sequence's context, window layers at most W of it;
    recurrent layers read and write back each decoding sequence's state once, whatever its
    context: (ctx + tokens) * kv_full + (min(ctx, n * W) + tokens) * kv_window + 2 * n * state
    (Mamba2's selective_state_update and Gated DeltaNet's recurrent kernel update the state in
    place; a prompt chunk's state traffic is left out, one state per chunk)."""
    window_bytes = stage.window_kv_bytes_per_token
    window_context = window_capped_tokens(load.decode_context_tokens, load.decode_seqs,
                                          stage.sliding_window_tokens)
    return ((load.decode_context_tokens + load.num_tokens) * (stage.kv_bytes_per_token - window_bytes)
            + (window_context + load.num_tokens) * window_bytes
            + 2 * load.decode_seqs * stage.state_bytes_per_sequence)


def stage_attention_pairs(stage: StageMemory, load: StepLoad) -> float:
    """Prompt (query, key) pairs over the stage's attention layers: pairs * L_full +
    min(pairs, s * W) * L_window (recurrent layers have none: linear in the prompt, their
    projections are in the linear layers' FLOPs)."""
    return sum(stage_attention_pairs_by_kind(stage, load))


def stage_attention_pairs_by_kind(stage: StageMemory, load: StepLoad) -> tuple[float, float]:
    """stage_attention_pairs as (full layers' pairs * L_full, window layers' min(pairs, s * W) * L_window)."""
    window_layers = stage.num_window_layers
    window_pairs = window_capped_tokens(load.prefill_attention_pairs, load.prefill_tokens,
                                        stage.sliding_window_tokens)
    return (load.prefill_attention_pairs * (stage.num_attention_layers - window_layers),
            window_pairs * window_layers)


def pipeline_hop_seconds(model: ModelSpec, placement: Placement, num_tokens: int) -> float:
    """One boundary: send the hidden states (tokens * h * bytes) plus vLLM's per-hop overhead."""
    if placement.pp_link is None:
        return 0.0
    message_bytes = num_tokens * model.hidden_size * activation_bytes_per_element(model)
    return p2p_seconds(message_bytes, placement.pp_link) + eff.PIPELINE_HOP_EXTRA_SECONDS


IDLE_POLL_SECONDS = 1 * units.SECONDS_PER_MS
"""vLLM 0.33.0's engine core sleeps 1 ms after a step that ran nothing while its scheduler
still holds requests (vllm/v1/engine/core.py, EngineCore._process_engine_step)."""


def engine_step_seconds(load: StepLoad) -> float:
    """The engine's own cost of one scheduled step, outside the model's kernels: scheduling,
    input preparation, sampling, output processing (a fixed part and a part per sequence
    in the step). docs/cost-model.md (Serving: the engine's per-step cost)."""
    sequences = load.decode_seqs + load.prompts_completing
    return eff.ENGINE_STEP_SECONDS + eff.ENGINE_STEP_SECONDS_PER_SEQUENCE * sequences


@dataclass(frozen=True)
class RoundTime:
    """One round of a replica: each of its k micro-batches through every stage once (k = 1
    without pipeline parallelism: one engine step)."""

    seconds: float
    stage_steps: tuple[StepTime, ...]
    """Each stage's time for one micro-batch."""
    slowest_stage: int
    hop_seconds: float
    """One pipeline boundary for one micro-batch."""
    engine_seconds: float
    """The engine's per-step cost of one micro-batch's step."""
    in_flight: int
    chunk_steps: tuple[StepTime, ...] | None = None
    """Each stage's time for the micro-batch that carries the prompt chunk (None: no chunk);
    with p = 1 stage_steps already are."""
    unpolled_seconds: float = 0.0
    """The round without the engine's sleeps after empty phases (IDLE_POLL_SECONDS): what no
    load can take below (`seconds` where it has none)."""


def stage_step_times(model: ModelSpec, cluster: ClusterSpec, layout: Layout, placement: Placement,
                     stages: tuple[StageMemory, ...] | list[StageMemory], load: StepLoad,
                     imbalance: float = eff.EXPERT_LOAD_IMBALANCE,
                     constants: StepConstants | None = None,
                     priced: dict[tuple, StepTime | StageRates] | None = None) -> tuple[StepTime, ...]:
    """stage_step_time of every stage; stages alike (same memory and layers, neither first
    nor last) are priced once: with p stages most of them are the same middle stage.
    `priced`: the caller's memo of stage steps already priced for this layout, imbalance and
    constants (an estimate prices the same load many times over: the steady state's search
    over concurrency, a chunk's carrier beside its plain micro-batch), which also keeps each
    stage's StageRates and, under ("stages", load), the whole tuple: a load priced before is
    one lookup, not one per stage (a DeepSeek-V3 rate plan over 104 layouts asks 360,000 times,
    each load once per stage on up to 32 stages); None: none kept."""
    alike: dict[tuple, StepTime | StageRates | tuple[StepTime, ...]] = {} if priced is None else priced
    whole = alike.get(("stages", load))  # every stage at this load, priced before
    if whole is not None:
        return whole
    last = layout.pp - 1
    constants = constants or step_constants(model, cluster, layout)
    out = []
    terms = None
    this_load: dict[tuple, StepTime] = {}  # by shape: the load is hashed once per distinct stage
    for s in stages:
        shape = (s.num_layers, s.weights_bytes, s.kv_bytes_per_token, s.stage == 0, s.stage == last)
        step = this_load.get(shape)
        if step is None:
            key = (*shape, load)
            step = alike.get(key)
            if step is None:
                terms = terms or layer_load_terms(model, cluster, layout, placement, load, imbalance, constants,
                                                  alike)
                rates = alike.get(("rates", shape))
                if rates is None:
                    rates = alike["rates", shape] = stage_rates(model, cluster, layout, s, constants)
                step = alike[key] = stage_step_time(model, cluster, layout, placement, s, load, imbalance, constants,
                                                    terms, rates)
            this_load[shape] = step
        out.append(step)
    whole = alike["stages", load] = tuple(out)
    return whole


SPREAD_SEQUENCE_FLOOR = 2.0**-30
"""round_time holds a decoding sequence's own micro-batch at one sequence only where the mean
share is at least this (about a billionth of a sequence): below it the share is no sequence,
and the scaling up to one (by its reciprocal) would overflow the rest of the load."""


def round_time(model: ModelSpec, cluster: ClusterSpec, layout: Layout, placement: Placement,
               stages: tuple[StageMemory, ...] | list[StageMemory], load: StepLoad, in_flight: int,
               chunk: StepLoad | None = None, imbalance: float = eff.EXPERT_LOAD_IMBALANCE,
               constants: StepConstants | None = None,
               priced: dict[tuple, StepTime | StageRates] | None = None, num_chunks: int = 1,
               longest: StepLoad | None = None) -> RoundTime:
    """vLLM runs p virtual engines: k = min(p, sequences) micro-batches, each its own scheduled
    step, in flight through the stages at once. `load` is spread evenly over the k; `chunk`
    (one prompt chunk) rides in `num_chunks` n of them, each filled to its token budget (a
    prompt's chunks go into consecutive micro-batches: vLLM's scheduler advances a request's
    computed tokens when it schedules them, so with p > 1 the next step takes the prompt's next
    chunk while the last is still in flight, vllm/v1/core/sched/scheduler.py 0.33.0).
    A round (the cadence at which every sequence advances a token) lasts the longest of
    - a micro-batch's path: its engine step + every stage + p hops (its sampled tokens go back
      to the scheduler before its next step), a carrier's with chunks,
    - the busiest stage working all k micro-batches (n of them carriers),
    - the engine scheduling k steps (one scheduler, serial).
    The n carriers enter one after another, so the last one's tokens come (n - 1) carrier
    steps after the first's; that lag is not added to the cadence: vLLM keeps p steps in
    flight and schedules the next as the oldest returns, so consecutive rounds overlap and the
    stages stay busy (a prompt's latency over its chunks is continuous_batching.
    prompt_service_seconds).
    `longest` (p > 1): the chunk on the carriers' path where it is not `chunk`: vLLM cuts a
    prompt greedily, each chunk as large as its step's room allows, so a carrier's micro-batch
    holds a room-sized chunk while the round's work is that of n mean chunks (a 8,192-token
    prompt in a 8,190-token room is 8,190 + 2 tokens, not two of 4,096; priced as two of 4,096
    the round's path ran 41% faster than the step simulation's, Llama-3.1-70B tp=2 pp=4 on
    H100 at 32 clients, 8,192/256 tokens). None: `chunk`.
    With p = 1 that is engine step + the stage (n = 1). `constants`: step_constants, when the
    caller has them; `priced`: stage_step_times' memo, when the caller keeps one.
    docs/cost-model.md (Serving: pipeline)."""
    if num_chunks > 1 and (chunk is None or num_chunks > in_flight):
        raise ValueError(f"{num_chunks} chunk carriers need a chunk and as many micro-batches (got {in_flight})")
    constants = constants or step_constants(model, cluster, layout)
    per_batch = load.scaled(1 / in_flight)
    steps = stage_step_times(model, cluster, layout, placement, stages, per_batch, imbalance, constants, priced)
    slowest = max(range(len(steps)), key=lambda i: steps[i].seconds)
    hop = pipeline_hop_seconds(model, placement, max(per_batch.num_tokens, 1.0))
    engine = engine_step_seconds(per_batch)
    # the path a decoding sequence takes holds at least that sequence where a mean load is
    # spread over more micro-batches than it fills (an open loop below one sequence per virtual
    # engine: serve.price_steady gives a decoding request C others, each in its own engine); a
    # share below SPREAD_SEQUENCE_FLOOR is none (scaling the micro-batch up to one sequence then
    # overflowed its prompt tokens to infinity: 4.8e-307 decodes beside 11 prompt tokens)
    spread = in_flight > 1 and SPREAD_SEQUENCE_FLOOR <= per_batch.decode_seqs < 1
    own = per_batch
    if spread:  # the rest of the one sequence, beside the micro-batch's share of the prompt tokens
        # (scaling the whole micro-batch up scaled the prompt chunks with it: at 0.16 decodes a
        # micro-batch, Llama-3.1-8B tp=2 pp=4 with 25,245-token prompts, E2E fell from 122.7 s
        # to 44.7 s as the output grew from 2 to 4 tokens; found by a property sweep)
        missing = 1 - per_batch.decode_seqs
        up = missing / per_batch.decode_seqs
        own = per_batch.plus(StepLoad(missing, per_batch.decode_context_tokens * up,
                                      spec_tokens=per_batch.spec_tokens * up))
    own_steps = steps if own is per_batch else stage_step_times(model, cluster, layout, placement, stages, own,
                                                               imbalance, constants, priced)
    path = engine_step_seconds(own) + sum(step.seconds for step in own_steps) + layout.pp * hop
    busiest = in_flight * steps[slowest].seconds
    # the engine schedules a step for every one of the p phases (V2 + PP + async: a request
    # decodes every p-th step, scheduler.py next_decode_eligible_step, 0.33.0); a phase with
    # nothing to run is an empty step, after which the engine core sleeps IDLE_POLL_SECONDS. A
    # lone decoder on 8 stages waits out 7 of them a token: 7 ms where its path is 2.7 ms
    # (Mistral-7B tp=8 pp=8 on B200; the step simulation, serving_sim._Clock: 6.8 ms). A round
    # that carries a prompt's chunk is that prompt's own first pass (its TTFT), which waits for
    # no other phase: no polls there
    idle = max(layout.pp - in_flight, 0) * IDLE_POLL_SECONDS if chunk is None else 0.0
    engines = in_flight * engine + idle
    chunk_steps = None
    if chunk is not None:
        carrier = per_batch.plus(chunk)
        big = chunk_steps = stage_step_times(model, cluster, layout, placement, stages, carrier, imbalance, constants,
                                             priced)
        big_engine = engine_step_seconds(carrier)
        on_path, path_steps, path_engine = carrier, big, big_engine
        if longest is not None and layout.pp > 1:
            on_path = per_batch.plus(longest)
            path_steps = stage_step_times(model, cluster, layout, placement, stages, on_path, imbalance, constants,
                                          priced)
            path_engine = engine_step_seconds(on_path)
        big_hop = pipeline_hop_seconds(model, placement, max(on_path.num_tokens, 1.0))
        path = max(path, path_engine + sum(step.seconds for step in path_steps) + layout.pp * big_hop)
        busiest = busiest_stage_seconds(big, steps, in_flight, num_chunks)
        engines += num_chunks * (big_engine - engine)
        if layout.pp == 1:
            steps, slowest = big, 0
            engine = big_engine
            path = engine + big[0].seconds
    seconds = max(path, busiest, engines)
    return RoundTime(seconds, steps, slowest, hop, engine, in_flight, chunk_steps, max(path, busiest, engines - idle))


def busiest_stage_seconds(carrier_steps: tuple[StepTime, ...], other_steps: tuple[StepTime, ...], in_flight: int,
                          num_chunks: int) -> float:
    """The busiest stage's work in a round of k micro-batch steps, n of them carrying a chunk:
    max over stages of n * carrier + (k - n) * other."""
    return max(num_chunks * big.seconds + (in_flight - num_chunks) * small.seconds
               for big, small in zip(carrier_steps, other_steps, strict=True))


def round_busy_seconds(round_: RoundTime, num_chunks: int = 1) -> float:
    """The busiest stage's work in a round (busiest_stage_seconds, as round_time prices it)."""
    if round_.chunk_steps is None:
        return round_.in_flight * round_.stage_steps[round_.slowest_stage].seconds
    if len(round_.stage_steps) == 1:  # p = 1: stage_steps already carry the chunk
        return round_.stage_steps[0].seconds
    return busiest_stage_seconds(round_.chunk_steps, round_.stage_steps, round_.in_flight, num_chunks)


def mean_bubble_fraction(pp: int, decode_round: RoundTime, prompt_round: RoundTime, prompt_share: float,
                         num_chunks: int = 1) -> float:
    """Idle share of the busiest stage over the mean round, a fraction `prompt_share` (at most
    1) of the rounds carrying a prompt's n chunks: 1 - mean busy / mean round (each round's
    busiest stage, round_busy_seconds). Under long prompts the chunk carriers' path paces the
    round while the stages wait on it; a decode-only round is serving_bubble_fraction's."""
    if pp == 1:
        return 0.0
    q = min(max(prompt_share, 0.0), 1.0)
    busy = (1 - q) * round_busy_seconds(decode_round) + q * round_busy_seconds(prompt_round, num_chunks)
    seconds = (1 - q) * decode_round.seconds + q * prompt_round.seconds
    return max(0.0, 1 - busy / seconds)


def serving_bubble_fraction(in_flight: int, pp: int, stage_seconds: float, round_seconds: float) -> float:
    """Idle share of the busiest stage: it works k * t_stage of every round; the rest it waits
    for the other stages, the hops and the engine (with k < p batches in flight it idles at
    least while the others work)."""
    if pp == 1:
        return 0.0
    return max(0.0, 1 - in_flight * stage_seconds / round_seconds)


@dataclass(frozen=True)
class Collective:
    """One collective of a serving step, as the estimate priced it."""

    phase: str
    """decode (one round, = TPOT) | prefill (one prompt, in TTFT)."""
    name: str
    """after attention | after MLP | query / key norms | MoE dispatch | MoE combine | MoE output |
    to next stage."""
    kind: str
    """all-reduce | all-gather | reduce-scatter | send."""
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
                        prompt_tokens: int, all2all_backend: str = DEFAULT_ALL2ALL_BACKEND,
                        prompt_expert_tokens: float | None = None, prompt_chunks: float = 1.0,
                        slowest_stage_moe_layers: float | None = None) -> tuple[Collective, ...]:
    """Per layer two TP all-reduces (after attention, after the MLP) of tokens * h * bytes (and
    one of tokens * 8 B where the query / key norms span every head, qk_norm_allreduce_seconds):
    k * L_s of each per decode round on the slowest stage (one in-flight batch's rows each),
    L of each per prefill (the prompt); per decode round p pipeline sends, per prefill p - 1;
    with EP across DP ranks vLLM's dispatch all-gather and combine reduce-scatter per MoE layer
    (ep_exchange_seconds_per_moe_layer), counted the same way; under sequence-parallel MoE
    each MoE layer's output is all-gathered over TP in place of its after-MLP all-reduce.
    `prompt_expert_tokens`: the prompt tokens per rank the EP exchange carries when they differ
    from this rank's (DP ranks in lockstep: StepLoad.expert_tokens); None: prompt_tokens.
    `prompt_chunks` N: the prompt runs as N chunks of prompt_tokens / N (chunked prefill, the
    step budget), each its own collectives: N times as many, each 1/N the size.
    `slowest_stage_moe_layers`: that stage's MoE layers (stage_moe_layers); None: its mean share."""
    width = model.hidden_size * activation_bytes_per_element(model)
    out = []
    chunks = max(prompt_chunks, 1.0)
    phases = (("decode", decode_tokens, batches_in_flight * slowest_stage_layers, layout.pp),
              ("prefill", prompt_tokens / chunks, round(model.num_hidden_layers * chunks),
               round((layout.pp - 1) * chunks)))
    for phase, tokens, allreduces, sends in phases:
        stage_moe = (moe_layers_of(model, slowest_stage_layers) if slowest_stage_moe_layers is None
                     else slowest_stage_moe_layers)
        moe_count = (batches_in_flight * round(stage_moe)
                     if phase == "decode" else round(model.num_moe_layers * chunks))
        routed = (prompt_expert_tokens / chunks if phase == "prefill" and prompt_expert_tokens is not None
                  else tokens)
        exchange = ep_exchange_ops(model, cluster, layout, placement, routed, phase, moe_count, all2all_backend)
        sp_moe_count = moe_count if any(op.name == "MoE output" for op in exchange) else 0
        if placement.tp_link is not None:
            both, source = tp_allreduce_seconds_per_layer(cluster, layout, placement, tokens * width)
            out += [Collective(phase, f"after {where}", "all-reduce", layout.tp, placement.tp_link.kind,
                               tokens * width, both / 2, source, count)
                    for where, count in (("attention", allreduces), ("MLP", allreduces - sp_moe_count))]
            if model.qk_norm_across_heads:
                norm_bytes = tokens * QK_NORM_PARTIAL_SUM_BYTES_PER_TOKEN
                norm, norm_source = tp_allreduce_seconds_per_layer(cluster, layout, placement, norm_bytes)
                out.append(Collective(phase, "query / key norms", "all-reduce", layout.tp, placement.tp_link.kind,
                                      norm_bytes, norm / 2, norm_source, allreduces))
        out += exchange
        if placement.pp_link is not None:
            out.append(Collective(phase, "to next stage", "send", 2, placement.pp_link.kind, tokens * width,
                                  pipeline_hop_seconds(model, placement, tokens), "model", sends))
    return tuple(out)
