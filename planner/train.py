"""Estimate of one training configuration: memory per GPU, time per step, throughput.

Megatron-LM semantics (Narayanan et al. 2021; Korthikanti et al. 2022): rank order
DP x PP x TP, 1F1B or interleaved pipeline, fp32 main grads, the distributed optimizer
as ZeRO-1. Formulas live in planner/cost/; this module composes them. Time per step:
  compute  = m * (slowest stage's compute per micro-batch) + optimizer step
  tp_comm  = m * (its layers) * (TP collectives per layer per micro-batch)
  bubble   = (p-1)/v * (its stage time per micro-batch)  [= ratio * ideal time]
  pp_comm  = 2 * (v*m + p - 1) * (one boundary send)
  dp_comm_exposed = gradient reduction not hidden under the last backward (+ gathers)
Context parallelism (cp > 1, Megatron's --context-parallel-size): every rank runs its
s/cp tokens of each sequence (activations and per-layer terms at that chunk), ring
attention's exposed KV exchange adds cp_comm, and weights are replicated over cp as over
dp (gradients reduce and the distributed optimizer shards over dp*cp).
Stages hold L/p layers each when p divides L (and v divides L/p); otherwise Megatron's
uneven first/last split or the split that counts the embedding and the loss as layers
(cost/stage_split.py; with_stage_split picks from the stage times; memory is the worst of
first, second and last stage, each with its own layers and micro-batches in flight).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import NamedTuple

from planner.cost import activations as act
from planner.cost import efficiency, pipeline
from planner.cost import flops as flops_model
from planner.cost import stage_split as split
from planner.cost.moe import (
    deepep_ampere_refusal,
    deepep_training_buffer_bytes,
    deepep_training_refusal,
)
from planner.cost.params import (
    MATMUL_PRECISION_OF_DTYPE,
    layer_params_per_gpu,
    multiply_adds_per_attention_pair,
    tp_head_reasons,
    training_dtype,
)
from planner.cost.training_memory import (
    AUTOCAST_STATE_BYTES,
    FSDP2_STATE_BYTES,
    MEGATRON_STATE_BYTES,
    StageParams,
    StateBytesPerParam,
    expert_data_parallel_size,
    expert_sharded_model_state_bytes,
    fp8_weight_cache_bytes,
    fsdp_unit_buffers,
    gradient_bytes_per_param,
    master_remainders,
    megatron_state_bytes,
    stage_params_per_gpu,
)
from planner.cost.training_time import (
    DpCollectives,
    LayerTerms,
    TimeBreakdown,
    TrainRates,
    block_seconds,
    dp_collectives,
    dp_link,
    ep_transfer_seconds,
    exchange_free_block_seconds,
    layer_terms,
    stage_seconds,
    step_times,
    zero3_gathers_per_micro_batch,
)
from planner.layout import (
    Placement,
    Rejected,
    TrainConfig,
    ep_group_topology,
    groups_cross_nodes,
    place,
)
from planner.memo import Memo
from planner.requests import TrainRequest
from planner.specs import ClusterSpec, ModelSpec, SpecError
from planner.train_engines import (
    CP_KV_ROTATION,
    MOE_FORWARD_HOST_SECONDS,
    PER_CHUNK_SPLIT_ENGINES,
    moe_forward_syncs,
    torchtitan_reasons,
)
from planner.units import BYTES_PER_MIB, bytes_to_gib, flops_per_s_to_tflops


@dataclass(frozen=True)
class TrainMemory:
    """Per GPU on the worst pipeline stage, bytes."""

    weights_bytes: float
    """16-bit weights; with --precision fp8 also TE's fp8 copies and scaling state."""
    gradient_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    overhead_bytes: float
    stage: int
    """The stage these figures describe (0 = first)."""
    num_layers: int = 0
    """Decoder layers on that stage."""

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.gradient_bytes + self.optimizer_bytes
                + self.activation_bytes + self.overhead_bytes)


@dataclass(frozen=True)
class FasterSplit:
    """A stage split faster than the one the estimate runs, which did not fit in memory."""

    num_layers_per_stage: tuple[int, ...]
    over_bytes: float
    """Its worst stage's memory over the capacity (> 0)."""
    stage: int
    """That stage (0 first)."""


@dataclass(frozen=True)
class TrainEstimate:
    config: TrainConfig
    num_micro_batches: int
    memory: TrainMemory
    capacity_per_gpu_bytes: int
    step_time_seconds: float
    tokens_per_second: float
    tflops_per_gpu: float
    """Narayanan et al. 2021's count (eq. 3, the recomputed forward included) with full recompute,
    else model FLOPs (model_tflops_per_gpu)."""
    mfu: float
    """Model FLOPs (Korthikanti eq. 7) per second over the GPUs' dense peak."""
    bubble_fraction: float
    """The schedule's idle share of compute + bubble, (p-1)/(v*m + p-1) (pipeline.bubble_fraction);
    exposed communication also fills the step, so the bubble's share of it is smaller
    (bubble_share_of_step)."""
    bubble_over_compute_ratio: float
    tp_allreduce_seconds_per_layer: float
    """All TP collectives of one layer for one micro-batch (forward, backward, recompute)."""
    tp_link: str | None
    pp_link: str | None
    dp_link: str | None
    time_breakdown_seconds: TimeBreakdown
    num_layers_per_stage: tuple[int, ...] = ()
    """Decoder layers on each pipeline stage, first to last."""
    slowest_stage: int = 0
    """The stage whose time per micro-batch paces the pipeline (a middle one reads 1)."""
    stage_memories: tuple[TrainMemory, ...] = ()
    """Every stage that can be the worst (first, heaviest middle, last), by component."""
    layer_terms: LayerTerms | None = None
    """One layer, one micro-batch: compute (forward, backward, recompute) and TP collectives."""
    stage_seconds_per_micro_batch: float = 0.0
    """The pacing stage's compute + exposed TP per micro-batch (the bubble's unit)."""
    pp_send_seconds: float = 0.0
    """One pipeline boundary send of pp_send_bytes (0 when pp = 1)."""
    pp_send_bytes: float = 0.0
    dp_collectives: DpCollectives | None = None
    """The data-parallel collectives' sizes and times, one call each."""
    alltoall_seconds_per_layer: float = 0.0
    """All EP all-to-alls of one MoE layer for one micro-batch (dispatch and combine, forward,
    backward, recompute); 0 without EP."""
    alltoall_link: str | None = None
    """The slowest link the EP all-to-all crosses (None without EP)."""
    memory_fallback: bool = False
    """Memory made this estimate run something slower than its first choice: a slower stage split
    (_fitting_split), no combined 1F1B, or NCCL all-to-alls instead of DeepEP. More recompute can
    then run faster (train_search._first_fitting tries the next levels)."""
    faster_split: FasterSplit | None = None
    """The fastest stage split, where it did not fit and a slower one runs (_fitting_split)."""
    dp_reductions_per_step: int = 1
    """The gradient reductions a step makes (gradient_reductions_per_step): what plan explain
    counts."""
    zero3_gathers_per_micro_batch: float = 2
    """ZeRO-3's weight all-gathers per micro-batch (training_time.zero3_gathers_per_micro_batch; a
    fraction more under block recompute, whose rerun gathers only the rerun layers)."""
    model_tflops_per_gpu: float = 0.0
    """Model FLOPs (the MFU's, no recompute) per second per GPU, in TFLOP/s. Megatron-LM's log
    has no recompute term either (num_floating_point_operations: forward + backward, 3x, at
    core_v0.19.0), though it halves causal attention."""

    @property
    def memory_per_gpu_bytes(self) -> float:
        return self.memory.total_bytes

    @property
    def bubble_share_of_step(self) -> float:
        """The bubble's seconds over the step's (the Why line's and the table's "bubble")."""
        return self.time_breakdown_seconds.bubble / self.step_time_seconds if self.step_time_seconds else 0.0

    @property
    def rerun_layers(self) -> int:
        """The pacing stage's layers that rerun their forward each micro-batch (recomputed_layers):
        all of them under full recompute of every layer, the first recompute_num_layers of each
        chunk under block recompute, none under the other levels."""
        n = self.num_layers_per_stage[self.slowest_stage] if self.num_layers_per_stage else 0
        return recomputed_layers(self.config, (n, 0, 0))[0]


def train_rates(model: ModelSpec, cluster: ClusterSpec, attention_kernel: str = "auto") -> TrainRates:
    """Peak, achievable matmul and elementwise HBM rates of the cluster's GPU, and its flash
    attention rates with that kernel (TrainRequest.attention_kernel)."""
    gpu, precision = cluster.gpu, MATMUL_PRECISION_OF_DTYPE[training_dtype(model)]
    peak = efficiency.dense_peak_flops_per_s(gpu, precision)
    if peak is None and precision == "fp16":  # same tensor-core rate as bf16
        peak = efficiency.dense_peak_flops_per_s(gpu, "bf16")
    if peak is None:
        raise SpecError(
            f"{gpu.name}: no dense {precision} peak (peak_tflops.{precision}) or measured matmul rate in the GPU "
            "catalog; cannot plan training: measure it with `plan probe` or give peak_tflops in a hardware profile"
        )
    measured = gpu.achievable_flops_per_s(precision)
    if measured is None and precision == "fp16":  # same tensor-core rate as bf16
        measured = gpu.achievable_flops_per_s("bf16")
    fp8_peak = gpu.peak_flops_per_s("fp8")
    unmeasured = efficiency.unmeasured_fraction_of_peak(gpu)
    fp8 = None if fp8_peak is None else efficiency.achievable_matmul_flops_per_s(
        fp8_peak, gpu.achievable_flops_per_s("fp8"), unmeasured)
    bf16_peak = gpu.peak_flops_per_s("bf16") or peak
    flash_forward, flash_backward = efficiency.flash_attention_fractions(efficiency.flash_attention_forward_fraction(
        gpu.flash_attention_forward_fraction, attention_kernel, gpu.compute_capability))
    # at the full-attention layers' head dim (training prices one attention shape)
    head_dim_factor = efficiency.attention_head_dim_factor(model, gpu, multiply_adds_per_attention_pair(model)[0])
    flash_forward, flash_backward = flash_forward * head_dim_factor, flash_backward * head_dim_factor
    sustained = efficiency.TRAIN_SUSTAINED_RATE_FRACTION  # what a step keeps of its kernels' rates
    return TrainRates(
        peak_flops_per_s=peak,
        matmul_flops_per_s=sustained * efficiency.achievable_matmul_flops_per_s(peak, measured, unmeasured),
        elementwise_bytes_per_s=sustained * efficiency.elementwise_bytes_per_s(gpu.hbm_bytes_per_s,
                                                                               gpu.elementwise_hbm_utilization),
        fp8_matmul_flops_per_s=None if fp8 is None else sustained * fp8,
        gemm_half_rate_dimension=gpu.gemm_half_rate_dimension or efficiency.GEMM_HALF_RATE_DIMENSION,
        flash_forward_flops_per_s=sustained * bf16_peak * flash_forward,
        flash_backward_flops_per_s=sustained * bf16_peak * flash_backward,
    )


def check_precision(cluster: ClusterSpec, precision: str, fp8_recipe: str | None = None,
                    engine: str = "megatron") -> None:
    """--precision fp8 needs fp8 tensor cores (Hopper, Ada, Blackwell) and --fp8-recipe mxfp8
    block-scaled (MX) tensor cores: spec errors otherwise. The catalog has no compute
    capability; MX GEMMs came with Blackwell (SM100) together with fp4, so the rule is "the
    GPU's catalog entry has an fp4 peak" (B200, GB200). TE refuses MXFP8 below SM100
    (check_mxfp8_support, pytorch/quantization.py at v2.18) and torchtitan's MX converter
    asserts SM100 (components/quantization/mx.py at v0.2.2). --fp8-recipe blockwise needs
    compute capability 9.0 (GPU.compute_capability; a profile without one is not refused)."""
    gpu = cluster.gpu
    if precision == "fp8" and gpu.peak_flops_per_s("fp8") is None:
        raise SpecError(f"--precision fp8: {gpu.name} has no fp8 tensor cores "
                        f"(Ada, Hopper or later); use --precision bf16")
    if fp8_recipe == "mxfp8" and gpu.peak_flops_per_s("fp4") is None:
        others = "tensorwise" if engine == "torchtitan" else "tensorwise or delayed"  # torchtitan has no delayed
        raise SpecError(f"--fp8-recipe mxfp8: {gpu.name} has no MX block-scaled tensor cores "
                        f"(Blackwell: B200, GB200); use --fp8-recipe {others}")
    if (fp8_recipe == "blockwise" and gpu.compute_capability is not None
            and gpu.compute_capability < BLOCKWISE_MIN_COMPUTE_CAPABILITY):
        raise SpecError(f"--fp8-recipe blockwise: {gpu.name} (compute capability {gpu.compute_capability:g}) "
                        f"has no block-scaled fp8 GEMMs (Transformer Engine needs 9.0, Hopper, or later); "
                        f"use --fp8-recipe tensorwise or delayed")


BLOCKWISE_MIN_COMPUTE_CAPABILITY = 9.0
"""Transformer Engine v2.18's _compute_fp8_block_scaling_support: compute capability >= 9.0 and
CUDA >= 12.9 (pytorch/quantization.py)."""


def structural_reasons(model: ModelSpec, tp: int, pp: int, dp: int, global_batch: int,
                       ep: int = 1) -> list[str]:
    """Why no configuration of this (tp, pp, dp, ep) can run, independent of b and schedule."""
    reasons = tp_head_reasons(model, tp)
    if ep > 1 and model.num_local_experts % ep:
        reasons.append(f"experts {model.num_local_experts} not divisible by ep={ep} (Megatron-Core)")
    L = model.num_hidden_layers
    if model.intermediate_size % tp:
        reasons.append(f"FFN size {model.intermediate_size} not divisible by tp={tp}")
    if L % pp and not has_split(L, pp, 1) and split.account_split(L, pp) is None:
        reasons.append(no_split_reason(L, pp, 1))
    if global_batch % dp:
        reasons.append(f"global batch {global_batch} not divisible by dp={dp}")
    return reasons


def no_split_reason(num_layers: int, pp: int, v: int, layout: bool = False) -> str:
    """`layout`: a per-chunk split (Megatron's layout string, torchtitan's module lists) was tried
    too (v > 1)."""
    bound = split.max_units_per_stage(num_layers // v, pp) * v
    chunks = f", every stage a multiple of v={v}" if v > 1 else ""
    laid_out = ("" if not layout or v <= 1 else
                f", nor a per-chunk split (Megatron's --pipeline-model-parallel-layout, torchtitan's module "
                f"lists) with at least one layer in each of the {pp * v} chunks and none above "
                f"{split.max_units_per_stage(num_layers, pp)} per stage")
    return (f"layers {num_layers} not divisible by pp={pp} and no uneven first/last split keeps "
            f"every stage within {bound} layers{chunks}, nor does pp*v={pp * v} divide layers + 2 "
            f"(embedding and loss counted as layers){laid_out}")


def ep_reasons(model: ModelSpec, config: TrainConfig) -> list[str]:
    """Megatron-Core's expert-parallel rules (core_v0.19.0): EP needs experts
    (arguments.py: "num_experts must be non None"), E divisible by ep ("Number of experts
    should be a multiple of expert model parallel_size"), ep*etp*pp dividing the world
    (parallel_state.py; ep = t*d_ep with etp = 1 and d_ep dividing cp*d, Layout.ep); MoE with
    t > 1 trains only with sequence parallelism (moe_layer.py raises "performance may degrade
    if MoE and tensor parallelism are enabled without also enabling sequence parallelism").
    Megatron-FSDP (ZeRO-2/3 here) shards expert parameters over the expert-data-parallel group
    (its expt_device_mesh; examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh runs it with EP)."""
    c, reasons = config, []
    if c.ep > 1 and not model.is_moe:
        return [f"ep={c.ep} needs an MoE model"]
    if c.ep > 1:  # E divisible by ep: structural_reasons
        if c.ep % c.tp or (c.cp * c.dp) % (c.ep // c.tp):
            ranks = f"cp*dp (tp={c.tp}, cp={c.cp}, dp={c.dp})" if c.cp > 1 else f"dp (tp={c.tp}, dp={c.dp})"
            reasons.append(f"ep={c.ep} not tp x a divisor of {ranks}")
    if model.is_moe and c.tp > 1 and not c.sequence_parallel:
        reasons.append("MoE with tp > 1 needs sequence parallelism (Megatron-Core's MoE layer)")
    return reasons


def cp_reasons(config: TrainConfig, seq_len: int) -> list[str]:
    """Megatron-Core's context-parallel rules (core_v0.19.0): s divisible by 2*cp
    (arguments.py: "seq-length should be a multiple of 2 * context-parallel-size"), CP only
    through Transformer Engine's attention (dot_product_attention.py: "Context parallelism is
    only supported by TEDotProductAttention!": flash here, not the unfused kernel). With EP the
    expert grid folds the CP ranks in (Layout.ep). Megatron-FSDP shards over dp*cp (docs/user-guide/features/megatron_fsdp.md:
    "both data-parallel and context-parallel ranks are used for sharding")."""
    c = config
    if c.cp <= 1:
        return []
    reasons = []
    if seq_len % (2 * c.cp):
        reasons.append(f"seq-len {seq_len} not divisible by 2*cp = {2 * c.cp} (Megatron's load-balanced split)")
    if c.attention != "flash":
        reasons.append(f"cp={c.cp} needs flash attention (Megatron runs CP only in TE's attention)")
    return reasons


def sequence_parallel_reasons(config: TrainConfig, seq_len: int) -> list[str]:
    """Megatron's sequence parallelism splits each CP rank's s/cp tokens over the t ranks of its
    TP group: reduce_scatter_to_sequence_parallel_region asserts that the first dimension is
    divisible by the TP size (core/tensor_parallel/mappings.py, core_v0.19.0)."""
    c = config
    if not c.sequence_parallel or c.tp <= 1:
        return []
    tokens = seq_len // c.cp if seq_len % c.cp == 0 else seq_len
    if tokens % c.tp:
        where = f"seq-len {seq_len}" if c.cp == 1 else f"seq-len / cp = {seq_len} / {c.cp} = {seq_len / c.cp:g}"
        return [f"sequence parallelism: {where} not divisible by tp={c.tp} (Megatron splits each sequence over "
                f"the TP group)"]
    return []


def engine_reasons(model: ModelSpec, config: TrainConfig, request: TrainRequest) -> list[str]:
    """The engine's own rules: Megatron's context-parallel and sequence-parallel ones, or
    torchtitan's (planner/train_engines.py)."""
    if request.engine == "torchtitan":
        return torchtitan_reasons(model, config, request.seq_len)
    return (cp_reasons(config, request.seq_len) + sequence_parallel_reasons(config, request.seq_len)
            + optimizer_state_reasons(config.zero_stage, request.optimizer_states))


def optimizer_state_reasons(zero_stage: int, optimizer_states: str) -> list[str]:
    """Megatron's precision-aware optimizer (--optimizer-states bf16) runs only inside the
    distributed optimizer ("--use-precision-aware-optimizer only supported with distributed
    optimizer", OptimizerConfig.__post_init__, core_v0.14.0 and core_v0.19.0): not at ZeRO-0."""
    if optimizer_states != "fp32" and zero_stage == 0:
        return [f"--optimizer-states {optimizer_states} needs the distributed optimizer (ZeRO >= 1), not ZeRO-0"]
    return []


def config_reasons(model: ModelSpec, config: TrainConfig, global_batch: int,
                   engine: str = "megatron") -> list[str]:
    """Why this configuration is invalid (assumes the structural checks passed)."""
    c = config
    wrong_ep = ep_reasons(model, c)
    if wrong_ep:
        return wrong_ep
    if global_batch % (c.micro_batch_size * c.dp):
        return [f"global batch {global_batch} not divisible by b*dp = "
                f"{c.micro_batch_size}*{c.dp} = {c.micro_batch_size * c.dp}"]
    m = global_batch // (c.micro_batch_size * c.dp)
    reasons = split_reasons(model, c, engine)
    L, v = model.num_hidden_layers, c.virtual_stages
    # the estimate fills in a split where L/p or v do not divide: does one exist?
    open_split = (c.first_last_layers is None and not c.account_for_embedding_and_loss
                  and (engine != "megatron" or split.account_split(L, c.pp, v) is None))
    if c.schedule == "interleaved":
        if c.pp == 1:
            reasons.append("interleaving needs pp > 1")
        else:
            reasons += interleaving_batch_reasons(m, c.pp, engine)
        if open_split and L % c.pp == 0 and (L // c.pp) % v and not has_layout_split(L, c.pp, v, engine):
            reasons.append(f"layers per stage {L // c.pp} not divisible by v={v}"
                           + (f", nor spread over {v} chunks of at least one layer (a per-chunk split)"
                              if engine in PER_CHUNK_SPLIT_ENGINES else ""))
        elif open_split and L % c.pp and not has_split(L, c.pp, v) and not has_layout_split(L, c.pp, v, engine):
            reasons.append(no_split_reason(L, c.pp, v, layout=engine in PER_CHUNK_SPLIT_ENGINES))
    elif c.virtual_stages != 1:
        reasons.append(f"v={c.virtual_stages} needs the interleaved schedule")
    elif c.schedule == "1f1b" and c.pp > 1 and engine == "torchtitan" and m < c.pp:
        # torch.distributed.pipelining's Schedule1F1B raises "Number of microbatches ... must be
        # greater than or equal to the number of stages" (schedules.py, torch 2.13)
        reasons.append(f"m={m} below p={c.pp}: torch's Schedule1F1B needs at least p micro-batches (torchtitan)")
    if c.sequence_parallel and c.tp == 1:
        reasons.append("sequence parallelism needs tp > 1")
    if c.zero_stage >= 2 and c.pp > 1 and engine == "megatron":
        reasons.append(f"ZeRO-{c.zero_stage} (Megatron-FSDP) is planned without pipeline parallelism "
                       f"(its examples and guide at core_v0.19.0 pair it with TP, CP and EP only)")
    return reasons


def interleaving_batch_reasons(m: int, pp: int, engine: str) -> list[str]:
    """Why m micro-batches cannot run interleaved over pp stages: Megatron needs m >= p (its
    micro-batch groups, pipeline.microbatch_group_size, take p to m of them); torchtitan's
    ScheduleInterleaved1F1B (torch.distributed.pipelining) runs max(1, m // p) rounds of m /
    rounds micro-batches and raises unless the rounds divide m (schedules.py, torch 2.13), and
    is planned with at least p as Megatron is: m = 6 at p = 4 runs one round of 6 (Megatron's
    group for it too), m = 9 is refused (2 rounds). Where torch takes m, its rounds' size is
    microbatch_group_size(p, m), which the activations and the timeline price."""
    if m < pp:
        return [f"m={m} below p={pp}: interleaving needs at least p micro-batches "
                f"({'Megatron' if engine == 'megatron' else engine})"]
    if engine == "megatron":
        return []
    rounds = m // pp
    return [f"m={m} not a multiple of its {rounds} rounds of about p={pp} (torch's ScheduleInterleaved1F1B, "
            f"{engine})"] if m % rounds else []


def interleaving_batch_summary(micro_batches: list[int], pp: int, engine: str) -> str:
    """interleaving_batch_reasons for the several m of one layout's micro-batch sizes, one line:
    "interleaving needs at least p=16 micro-batches (Megatron): m = 1, 2, 4 here"."""
    ms = ", ".join(str(m) for m in sorted(set(micro_batches)))
    if engine == "megatron":
        return f"interleaving needs at least p={pp} micro-batches (Megatron): m = {ms} here"
    return f"interleaving needs at least p={pp} micro-batches, in m // p rounds that divide m ({engine}): m = {ms} here"


def split_reasons(model: ModelSpec, config: TrainConfig, engine: str = "megatron") -> list[str]:
    """Why Megatron would refuse the configuration's explicit stage split (first/last layers,
    or the embedding and loss counted as layers)."""
    c, L = config, model.num_hidden_layers
    if c.first_last_layers is not None:
        wrong = split.split_reason(L, c.pp, c.first_last_layers, c.virtual_stages,
                                   layout=engine in PER_CHUNK_SPLIT_ENGINES)
        if wrong:
            return [wrong]
    if not c.account_for_embedding_and_loss:
        return []
    if engine != "megatron":
        return [f"{engine}: the embedding and loss counted as layers is Megatron's split"]
    if c.first_last_layers is not None:
        return ["first/last stage layers cannot be combined with the embedding and loss counted as "
                "layers (TransformerConfig.__post_init__)"]
    if split.account_split(L, c.pp, c.virtual_stages) is None:
        return [f"layers {L} + 2 (embedding, loss) not divisible by pp*v = {c.pp * c.virtual_stages} "
                f"into stages of at least one layer"]
    return []


def first_last_layers(model: ModelSpec, config: TrainConfig) -> tuple[int, int] | None:
    """Layers on the first and last stage when the split is not even: Megatron's first/last
    split as given, or the embedding and loss counted as layers (stage_split.account_split)."""
    if config.account_for_embedding_and_loss:
        return split.account_split(model.num_hidden_layers, config.pp, config.virtual_stages)
    return config.first_last_layers


def activation_terms(model: ModelSpec, s: int, b: int, tp: int, sequence_parallel: bool,
                     recompute: str, attention: str = "materialized",
                     precision: str = "bf16", ep: int = 1,
                     imbalance: float = efficiency.EXPERT_LOAD_IMBALANCE,
                     fp8_delayed: bool = False) -> tuple[float, float, float, float]:
    """Bytes per GPU for one micro-batch: (per layer, recompute working set, first-stage extra
    per micro-batch in flight, last-stage extra: the logits, and each multi-token-prediction
    module's block, logits and inputs); MoE adds the dispatched tokens to the layer (to the
    working set under full recompute, which dispatches them again). The last stage's extra is
    held for one micro-batch: its loss and MTP modules run at the end of the last chunk, whose
    backward follows its forward at once."""
    dispatched = act.moe_dispatch_bytes_per_layer(model, s, b, tp, ep, "none", imbalance)
    stored = 0.0 if recompute == "full" else dispatched
    again = dispatched if recompute == "full" else 0.0
    per_layer = (act.activation_bytes_per_layer(model, s, b, tp, sequence_parallel, recompute, attention, precision,
                                                fp8_delayed) + stored)
    return (per_layer,
            act.recompute_working_bytes(model, s, b, tp, sequence_parallel, recompute, attention, precision,
                                        fp8_delayed) + again,
            act.first_stage_extra_bytes(model, s, b, tp, sequence_parallel),
            act.last_stage_logits_bytes(model, s, b, tp) + model.num_mtp_layers * per_layer
            + act.mtp_extra_bytes(model, s, b, tp, sequence_parallel))


def stage_layers(model: ModelSpec, config: TrainConfig) -> tuple[int, int, int]:
    """(first, middle, last) stage layer counts; middle 0 when pp <= 2, all L when pp = 1."""
    L, pp = model.num_hidden_layers, config.pp
    if pp == 1:
        return L, 0, L
    ends = first_last_layers(model, config)
    if ends is None:
        assert L % pp == 0, "uneven layers need a first/last split"
        return L // pp, L // pp if pp > 2 else 0, L // pp
    first, last = ends
    return first, (L - first - last) // (pp - 2) if pp > 2 else 0, last


def candidate_worst_stages(config: TrainConfig) -> tuple[int, ...]:
    """The stages that can be the worst: the first (most micro-batches in flight, the
    embedding), the second when the split is uneven (the heaviest middle stage: more layers
    than the first and, under every schedule, at least as many micro-batches as any later
    middle one) and the last (LM head, logits). One entry when pp = 1."""
    pp = config.pp
    if pp > 2 and (config.first_last_layers is not None or config.account_for_embedding_and_loss):
        return (0, 1, pp - 1)
    return (0, pp - 1) if pp > 1 else (0,)


def recomputed_layers(config: TrainConfig, layers: tuple[int, int, int]) -> tuple[int, int, int]:
    """The layers of the first, a middle and the last stage (`layers`) that rerun their forward:
    every one under full recompute, the first recompute_num_layers of each of a stage's v chunks
    under Megatron's block method (recompute.py core_v0.19.0 `_checkpointed_forward`: the first
    k layers of the chunk's TransformerBlock are checkpointed, the rest run without), none under
    the other levels (docs/cost-model.md#training-partial-recompute)."""
    if config.recompute != "full":
        return (0, 0, 0)
    every = config.recompute_every
    if every is not None:  # torchtitan's layer-level checkpointing: every N-th block of the rank
        return tuple(n // every for n in layers)  # type: ignore[return-value]
    k = config.recompute_num_layers
    if k is None:
        return layers
    return tuple(min(n, k * config.virtual_stages) for n in layers)  # type: ignore[return-value]


def partial_recompute(config: TrainConfig) -> bool:
    """Full recompute by Megatron's block method or torchtitan's every N-th block: some layers
    (Megatron: at least the MTP blocks, which its block method never reruns) keep all."""
    return config.recompute == "full" and (config.recompute_num_layers is not None
                                           or config.recompute_every is not None)


def kept_after_last_rerun(config: TrainConfig, layers: int, rerun: int) -> float:
    """The kept layers whose backward runs, freeing their activations, before the first rerun
    of a micro-batch's chunk: Megatron's block method reruns the first k of each chunk, so the
    chunk's (n - r)/v others; torchtitan's every N-th block leaves n mod N after the last one."""
    if config.recompute_every is not None:
        return float(layers % config.recompute_every)
    return (layers - rerun) / config.virtual_stages


def recomputed_share(model: ModelSpec, config: TrainConfig, layers: tuple[int, int, int]) -> float:
    """The share of the model's layers that rerun their forward (recomputed_layers summed over
    the stages): 1 under full recompute of every layer, 0 without full recompute."""
    if config.recompute != "full":
        return 0.0
    first, middle, last = recomputed_layers(config, layers)
    if config.pp == 1:
        return first / model.num_hidden_layers
    return min(1.0, (first + middle * max(config.pp - 2, 0) + last) / model.num_hidden_layers)


def stage_memories(model: ModelSpec, config: TrainConfig, seq_len: int, m: int,
                   stages: tuple[int, ...] | None = None, memo: Memo | None = None,
                   imbalance: float = efficiency.EXPERT_LOAD_IMBALANCE,
                   layers: tuple[int, int, int] | None = None) -> tuple[TrainMemory, ...]:
    """Memory per GPU of each stage asked for (default: candidate_worst_stages): its blocks
    (and embedding or LM head), its layers' activations times the micro-batches it holds in
    flight (activations.py), the recompute working set; the first stage adds the embedding's
    dropout masks, the last the logits. With CP every activation term is the rank's s/cp
    tokens' (activations.context_parallel_chunk_tokens). `layers`: stage_layers(model, config)
    when the caller has it."""
    memo = memo or Memo()
    c, pp = config, config.pp
    chunk = act.context_parallel_chunk_tokens(seq_len, c.cp)
    layers = layers or stage_layers(model, c)
    delayed = c.recompute == "outputs" and c.fp8_delayed  # what "outputs" discards depends on it
    saved = saved_activation_precision(c)
    per_layer, working, extra, logits = memo.get(
        ("activations", chunk, c.micro_batch_size, c.tp, c.sequence_parallel, c.recompute, c.attention,
         saved, c.ep, imbalance, delayed),
        activation_terms, model, chunk, c.micro_batch_size, c.tp, c.sequence_parallel, c.recompute,
        c.attention, saved, c.ep, imbalance, delayed)
    recomputed = recomputed_layers(c, layers)
    kept_per_layer = per_layer  # a layer that is not recomputed under block recompute keeps all
    working_by_kind = (working, working, working)
    if partial_recompute(c):
        kept_per_layer, kept_working, _, _ = memo.get(
            ("activations", chunk, c.micro_batch_size, c.tp, c.sequence_parallel, "none", c.attention,
             saved, c.ep, imbalance, False),
            activation_terms, model, chunk, c.micro_batch_size, c.tp, c.sequence_parallel, "none",
            c.attention, saved, c.ep, imbalance, False)
        # a recomputed layer rematerialises after the backward has freed the kept layers that
        # follow it in its chunk, so its working set stands only above what they held
        working_by_kind = tuple(max(kept_working, working - kept_after_last_rerun(c, n, r) * kept_per_layer)
                                for n, r in zip(layers, recomputed, strict=True))
        # Megatron does not recompute the MTP modules' blocks under the block method ("recompute_method
        # == 'block' is not supported for MTP yet. Skipping recompute.", multi_token_prediction.py
        # core_v0.14.0 and core_v0.19.0): they keep every activation
        logits += model.num_mtp_layers * (kept_per_layer - per_layer)
    # the states (and fixed overhead) of the first, a middle and the last stage, and each
    # asked-for stage's micro-batches in flight: shared by many configurations of a search
    fixed_overhead, *states = memo.get(
        ("stage_states", layers, c.account_for_embedding_and_loss, c.tp, pp, c.dp, c.cp, c.ep, c.zero_stage,
         c.grad_reduce, c.optimizer_states, c.precision, c.fp8_recipe, c.moe_dispatcher, c.engine), _stage_states, model,
        c, layers, memo)
    stages = stages or candidate_worst_stages(c)
    extra_forwards = int(c.moe_comm_overlap)  # the combined 1F1B's one more forward
    in_flight = memo.get(("in_flight", c.schedule, pp, m, c.virtual_stages, stages, extra_forwards),
                         _stages_in_flight, c.schedule, pp, m, c.virtual_stages, stages, extra_forwards)
    fragmentation = efficiency.TRAIN_ALLOCATOR_FRAGMENTATION_FRACTION
    out = []
    for stage, kind, num_in_flight in in_flight:
        activations = working_by_kind[kind] + (per_layer * recomputed[kind]
                                               + kept_per_layer * (layers[kind] - recomputed[kind])) * num_in_flight
        if stage == 0:
            activations += extra * num_in_flight
        if stage == pp - 1:
            activations += logits
        weights, gradients, optimizer = states[kind]
        out.append(TrainMemory(weights, gradients, optimizer, activations,
                               fixed_overhead + fragmentation * activations, stage, layers[kind]))
    return tuple(out)


def stage_kind(stage: int, pp: int) -> int:
    """0 the first stage, 2 the last, 1 a middle one (the index into stage_layers' triple)."""
    return 0 if stage == 0 else 2 if stage == pp - 1 else 1


def _stages_in_flight(schedule: str, pp: int, m: int, v: int, stages: tuple[int, ...],
                      extra_forwards: int = 0) -> tuple[tuple[int, int, float], ...]:
    """(stage, kind: 0 first, 1 middle, 2 last, micro-batches in flight) of each stage."""
    return tuple((stage, stage_kind(stage, pp),
                  act.micro_batches_in_flight(schedule, pp, m, v, stage, extra_forwards)) for stage in stages)


def _stage_states(model: ModelSpec, c: TrainConfig, layers: tuple[int, int, int],
                  memo: Memo) -> tuple:
    """(fixed overhead, then _stage_state_bytes of the first, a middle and the last stage):
    what a stage's memory holds besides activations. The overhead is the CUDA context, the
    workspace and one NCCL communicator for each parallel group the layout uses (EP and CP
    included), and DeepEP's buffers when the experts' tokens move on it
    (moe.deepep_training_buffer_bytes); the allocator's fragmentation of the activations comes
    on top."""
    params = memo.get(("stage_params", c.tp, c.pp, layers, c.ep, c.virtual_stages), stage_params_per_gpu, model,
                      c.tp, c.pp, layers, c.ep, c.virtual_stages)
    experts = params.routed_experts
    expert_params = ((0.0, 0.0, 0.0) if experts is None
                     else (experts.first_stage, experts.middle_stage, experts.last_stage))
    num_groups = (c.tp > 1) + (c.pp > 1) + (c.dp_cp > 1) + (c.ep > 1) + (c.cp > 1)
    fixed_overhead = (efficiency.CUDA_CONTEXT_BYTES + efficiency.TRAIN_WORKSPACE_BYTES
                      + num_groups * efficiency.NCCL_BUFFER_BYTES_LARGER)
    if c.moe_dispatcher == "deepep":
        fixed_overhead += deepep_training_buffer_bytes(model, c.ep)
    return (fixed_overhead, *(
        _stage_state_bytes(model, stage_params, c, num_layers, stage_experts)
        for stage_params, num_layers, stage_experts in zip(
            (params.first_stage, params.middle_stage, params.last_stage), layers, expert_params, strict=True)))


def worst_stage_memory(memories: tuple[TrainMemory, ...]) -> TrainMemory:
    """The stage with the most bytes; on a tie the lower index."""
    return max(memories, key=lambda mem: (mem.total_bytes, -mem.stage))


def memory_per_gpu(model: ModelSpec, config: TrainConfig, seq_len: int, m: int) -> TrainMemory:
    """The worst stage's memory per GPU (what must fit)."""
    return worst_stage_memory(stage_memories(model, config, seq_len, m))


def _stage_state_bytes(model: ModelSpec, params: float, c: TrainConfig, num_layers: int,
                       routed_expert_params: float = 0.0) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU of a stage: model states with the routed
    experts' sharded over the expert-data-parallel group
    (training_memory.expert_sharded_model_state_bytes), TE's fp8 weight copies, and the FSDP
    unit buffers (training_memory.fsdp_unit_buffers: the gathered weights counted with the
    weights, the unreduced gradients with the gradients). With CP the weights are replicated over cp as over dp and
    ZeRO shards over dp*cp (Megatron's distributed optimizer uses the data-parallel group with CP)."""
    grad_bytes = gradient_bytes_per_param(c)
    states = expert_sharded_model_state_bytes(params, routed_expert_params, c.dp_cp,
                                              expert_data_parallel_size(c.tp, c.dp, c.ep, c.cp), c.zero_stage,
                                              grad_bytes, state_bytes_per_param(c, model))
    # torchao's fp8 linears (torchtitan) cast the weights at each use and keep no copy
    fp8_cache = (fp8_weight_cache_bytes(model, c.tp, num_layers, c.dp_cp, c.zero_stage, c.ep,
                                        c.priced_fp8_recipe) if c.precision == "fp8" and c.engine == "megatron"
                 else 0.0)
    units = fsdp_unit_buffers(params, num_layers, c.zero_stage, grad_bytes)  # gathered weights, unreduced grads
    return (states.weights_bytes + fp8_cache + units.weights_bytes, states.gradient_bytes + units.gradient_bytes,
            states.optimizer_bytes)


def state_bytes_per_param(config: TrainConfig, model: ModelSpec) -> StateBytesPerParam:
    """The weights' and optimizer states' bytes per parameter the configuration's engine keeps:
    Megatron's (2, 12), with --optimizer-states bf16 (2, 6) or (2, 8) (megatron_state_bytes,
    master_remainders); torchtitan's FSDP2 (ZeRO-3) fp32 sharded parameters and Adam's moments
    (4, 8); its DDP (ZeRO-0) fp32 parameters with autocast's saved bf16 copies (6, 8). torchtitan's
    FSDP under PP (ZeRO-1) keeps the stage's bf16 weights and fp32 gradients whole and its fp32
    parameters and moments sharded, 2 + 4 + (4 + 8)/d: Megatron's distributed optimizer's
    bytes, priced as them (docs/cost-model.md#training-torchtitan)."""
    if config.engine != "torchtitan":
        return megatron_state_bytes(config.optimizer_states, master_remainders(config, model))
    if config.zero_stage == 1:
        return MEGATRON_STATE_BYTES
    return FSDP2_STATE_BYTES if config.zero_stage >= 3 else AUTOCAST_STATE_BYTES


def least_state_bytes_per_param(engine: str, optimizer_states: str = "fp32") -> StateBytesPerParam:
    """The fewest weight and optimizer bytes per parameter any of the engine's configurations
    keeps (state_bytes_per_param's least): torchtitan's FSDP2 (4, 8), else Megatron's (2, 12), or
    with bf16 optimizer states (2, 6)."""
    if engine == "torchtitan":
        return FSDP2_STATE_BYTES
    return megatron_state_bytes(optimizer_states, master_remainders=True)


def saved_activation_precision(config: TrainConfig) -> str:
    """The precision the activation memory is priced at: fp8 where Transformer Engine saves
    each linear's quantized input (Megatron), bf16 under torchao's fp8 linears (torchtitan),
    which save the high-precision input and weight and quantize again in the backward
    (torchao/float8/float8_linear.py matmul_with_hp_or_float8_args, torchao/prototype/mx_formats
    mx_linear.py mx_mm: ctx.save_for_backward(input_hp, ...))."""
    return config.precision if config.engine == "megatron" else "bf16"


def oom_reason(memory: TrainMemory, capacity_bytes: int, mtp_layers_here: int = 0, every_split: bool = False) -> str:
    """`mtp_layers_here`: the multi-token-prediction modules the overflowing stage holds (the
    last stage's), named with the flag that leaves them out. `every_split`: `memory` is
    least_memory's of uneven stages, the stage at the fewest layers any split gives it: it
    overflows under every split, by at least that much."""
    excess = memory.total_bytes - capacity_bytes
    # a shortfall under 0.05 GiB in MiB, so that the reason never reads "by 0.0 GiB"
    over = (f"{bytes_to_gib(excess):.1f} GiB" if bytes_to_gib(excess) >= 0.05
            else f"{max(1, math.ceil(excess / BYTES_PER_MIB))} MiB")
    mtp = (f", with the {mtp_layers_here} MTP module{'s' if mtp_layers_here > 1 else ''} there (--mtp-layers 0 "
           f"leaves {'them' if mtp_layers_here > 1 else 'it'} out)") if mtp_layers_here else ""
    if every_split:
        return (f"out of memory on stage {memory.stage} under every stage split, by at least {over} "
                f"({bytes_to_gib(memory.total_bytes):.1f} of {bytes_to_gib(capacity_bytes):.1f} GiB with its fewest "
                f"layers, {memory.num_layers}){mtp}")
    return (f"out of memory on stage {memory.stage} by {over} "
            f"({bytes_to_gib(memory.total_bytes):.1f} of {bytes_to_gib(capacity_bytes):.1f} GiB){mtp}")


def gradient_reductions_per_step(engine: str, config: TrainConfig, m: int) -> int:
    """The data-parallel gradient reductions of one step: m with ZeRO-2/3 (a reduce-scatter per
    micro-batch); with ZeRO-0 Megatron's DDP accumulates the micro-batches' gradients and
    all-reduces once, while torchtitan's (v0.2.2: train.py's train_step runs every micro-batch's
    backward with gradient sync on, no no_sync) all-reduces after each: m (a CLI read); else 1."""
    if config.zero_stage >= 2 or (config.zero_stage == 0 and engine == "torchtitan"):
        return m
    return 1


def expert_imbalance(request: TrainRequest | None) -> float:
    """The busiest EP GPU's routed load over the mean: --expert-imbalance, else the default."""
    if request is None or request.expert_imbalance is None:
        return efficiency.EXPERT_LOAD_IMBALANCE
    return request.expert_imbalance


def tp_comm_overlap_for(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, config: TrainConfig) -> bool:
    """Whether the plan runs --tp-comm-overlap: Megatron, asked for (the default), possible."""
    return (request.engine == "megatron" and request.tp_comm_overlap
            and tp_comm_overlap_possible(model, cluster, config))


def tp_comm_overlap_possible(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig) -> bool:
    """Where Megatron runs --tp-comm-overlap: tp_comm_overlap_refusal says nothing."""
    return tp_comm_overlap_refusal(model, cluster, config) is None


def tp_comm_overlap_refusal(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig) -> str | None:
    """Why Megatron cannot run --tp-comm-overlap for this configuration, in words (None: it
    can): TP > 1, sequence parallelism on (arguments.py core_v0.19.0 asserts it), the TP group
    inside one node (Transformer Engine's userbuffers span one NVLink domain: initialize_ub
    builds them per TP domain), through Transformer Engine's layers (flash attention here; the
    unfused path is the 2021 code). Planned for dense attention + MLP blocks only: an MoE
    layer's experts and a hybrid's recurrent mixers are not the QKV/proj/fc1/fc2 GEMMs the
    userbuffers pair with."""
    if config.tp == 1:
        return "there is no TP group"
    if not config.sequence_parallel:
        return "it needs sequence parallelism"
    if groups_cross_nodes(config.tp, cluster.gpus_per_node):
        return "its userbuffers span one NVLink domain and the TP group leaves the node"
    if config.attention != "flash":
        return "it runs through Transformer Engine's layers, not the unfused attention"
    if model.is_moe or model.num_recurrent_layers:
        return "its userbuffers pair with dense attention and MLP GEMMs, not MoE experts or recurrent mixers"
    return None


def tp_comm_overlap_off_reason(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig) -> str | None:
    """Why --tp-comm-overlap is off for this configuration, where there is a TP group to
    overlap (None with tp = 1, or where it runs)."""
    return None if config.tp == 1 else tp_comm_overlap_refusal(model, cluster, config)


def moe_comm_overlap_for(model: ModelSpec, request: TrainRequest, config: TrainConfig) -> bool:
    """Whether the plan runs --overlap-moe-expert-parallel-comm: Megatron, asked for (the
    default), and neither the configuration nor the release refuses it."""
    return (request.engine == "megatron" and request.moe_comm_overlap
            and moe_comm_overlap_refusal(model, config) is None and _moe_overlap_fsdp_refusal(request, config) is None
            and _moe_overlap_pairing_refusal(request, config) is None)


def moe_comm_overlap_possible(model: ModelSpec, config: TrainConfig) -> bool:
    """Where Megatron runs its combined 1F1B: moe_comm_overlap_refusal says nothing."""
    return moe_comm_overlap_refusal(model, config) is None


def moe_comm_overlap_refusal(model: ModelSpec, config: TrainConfig) -> str | None:
    """Why Megatron cannot run its combined 1F1B for this configuration, in words (None: it
    can; TransformerConfig.__post_init__, core_v0.14.0 and core_v0.19.0): expert parallelism,
    the alltoall or flex dispatcher (the emitted ones), no full recompute (nor a recompute method), with
    pp > 1 an interleaved schedule, bf16 or fp16 parameters (every plan's: --bf16 or --fp16,
    params.training_dtype), at most one MTP layer and torch 2.6 or later (asserted; the
    launch's environment)."""
    if not model.is_moe or config.ep <= 1:
        return "there is no expert parallelism"
    if model.num_mtp_layers > 1:
        return f"Megatron takes at most one MTP layer with it ({model.num_mtp_layers} trained)"
    if config.recompute == "full":
        return "Megatron refuses it with full recompute"
    if config.pp > 1 and not (config.schedule == "interleaved" and config.virtual_stages > 1):
        return "with pp > 1 Megatron needs an interleaved (virtual) pipeline for it"
    return None  # the parameters are 16-bit: every plan trains in bf16 or fp16 (params.training_dtype)


def _moe_overlap_fsdp_refusal(request: TrainRequest, config: TrainConfig) -> str | None:
    """With Megatron-FSDP (ZeRO-2/3) only on a release that runs the two together
    (MegatronRelease.moe_overlap_with_fsdp)."""
    if config.zero_stage < 2 or request.engine_versions.megatron_release.moe_overlap_with_fsdp:
        return None
    return f"Megatron {request.engine_versions.megatron} does not run it with Megatron-FSDP"


def _moe_overlap_pairing_refusal(request: TrainRequest, config: TrainConfig) -> str | None:
    """Where the combined 1F1B pairs no forward with a backward (pipeline.combined_1f1b_paired_share
    0: one micro-batch per step), it hides nothing and its one more forward in flight costs
    memory: the plan leaves it off."""
    m = request.global_batch // (config.micro_batch_size * config.dp)
    if pipeline.combined_1f1b_paired_share(config.pp, m, config.virtual_stages) > 0:
        return None
    return (f"{m} micro-batch per step leaves it no forward to pair with a backward (it would hide "
            f"nothing and hold one more forward in memory)")


def moe_comm_overlap_off_reason(model: ModelSpec, request: TrainRequest, config: TrainConfig) -> str | None:
    """Why an EP configuration runs without --overlap-moe-expert-parallel-comm although the
    request asks for it, in words (None: it runs, or there is no EP, or the request turned it
    off). The last reason is memory: the estimate drops the overlap where only its extra
    forward does not fit. None for another engine, which has no such overlap."""
    if not (model.is_moe and config.ep > 1 and request.moe_comm_overlap) or config.moe_comm_overlap:
        return None
    if request.engine != "megatron":  # the plan says what other engines run (render/train.summary_lines)
        return None
    return (moe_comm_overlap_refusal(model, config) or _moe_overlap_fsdp_refusal(request, config)
            or _moe_overlap_pairing_refusal(request, config)
            or "its one more forward in flight does not fit in memory")


def outputs_recompute_refusal(model: ModelSpec, request: TrainRequest) -> str | None:
    """Why recompute "outputs" (Megatron's --recompute-modules moe_act layernorm mla_up_proj,
    activations.outputs_recompute_modules) is not a level for this model and request, in words
    (None: it is): Megatron only; a model with MoE or MLA layers (a dense GQA model's norms are
    fused into TE's LayerNormLinear / LayerNormMLP, which keep their own outputs); not with fp8
    delayed scaling (TransformerConfig.__post_init__ core_v0.14.0 and core_v0.19.0: "Delayed
    scaling does not support moe_act and layernorm recompute for fp8") unless the model has MLA
    layers, whose mla_up_proj recompute stays (the level then discards only that)."""
    if request.engine != "megatron":
        return f"{request.engine} has no output-discarding recompute (Megatron's --recompute-modules)"
    if not act.outputs_recompute_modules(model):
        return (f"{model.name} has neither MoE nor MLA layers, whose norm, activation and up-projection "
                f"outputs it discards (Transformer Engine keeps a dense layer's inside its fused modules)")
    if request.precision == "fp8" and request.resolved_fp8_recipe == "delayed" and not model.is_mla:
        how = "--fp8-recipe delayed" if request.fp8_recipe else "delayed is Megatron's default --fp8-recipe"
        return (f"Megatron refuses moe_act and layernorm recompute with fp8 delayed scaling ({how}; "
                f"--fp8-recipe tensorwise, blockwise or, on Blackwell, mxfp8 allow it)")
    return None  # an MLA model under delayed scaling: mla_up_proj alone (act.outputs_recompute_modules)


def op_recompute_refusal(model: ModelSpec, request: TrainRequest) -> str | None:
    """Why recompute "op" (torchtitan's per-op selective checkpointing, its `mode = "selective"`
    with `selective_ac_option = "op"`: activations.op_checkpoint_saved_bytes_per_token,
    training_time.op_recomputed_gemms) is not a level for this model and request, in words
    (None: it is): torchtitan only; dense GQA blocks (an MoE layer's grouped GEMMs, MLA's
    projections and a hybrid's mixers run other ops, in another order); bf16 (with fp8
    torchtitan compiles the blocks and float8's scaled matmuls are not in the save list), where
    its selective level is priced as Megatron's."""
    if request.engine != "torchtitan":
        return (f"{request.engine} has no per-op selective checkpointing (torchtitan's selective_ac_option "
                f"op); its levels are none, selective and full")
    if model.is_moe or model.is_mla or model.num_recurrent_layers:
        return (f"{model.name}'s blocks are not dense attention + MLP ones, whose per-op checkpoint is priced; "
                f"--recompute selective prices torchtitan's selective level as Megatron's")
    if request.precision != "bf16":
        return (f"with --precision {request.precision} torchtitan compiles the blocks and its scaled matmuls "
                f"are not in the save list; --recompute selective prices the level as Megatron's")
    return None


DEEPEP_BLACKWELL_GPUS = ("B200", "B300")
"""Blackwell parts DeepEP runs on (Megatron-Bridge's apply_flex_dispatcher_backend,
src/megatron/bridge/training/flex_dispatcher_backend.py: compute capability 8.x or 9.x, or a
device named NVIDIA B200 / B300; GB200 and GB300 racks run HybridEP instead)."""


def deepep_refusal(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig) -> str | None:
    """Why Megatron's flex dispatcher cannot run on DeepEP for this configuration, in words (None:
    it can): expert parallelism; an NVIDIA Ampere or Hopper GPU, or a B200 / B300 (DEEPEP_BLACKWELL_GPUS);
    NVLink inside the node (DeepEP's intranode kernels); an RDMA network (InfiniBand or RoCE)
    when the EP group spans nodes; an EP group size DeepEP has a configuration for, whole 8-GPU
    nodes beyond 8 ranks (moe.deepep_training_refusal). Megatron's flex dispatcher needs TP x EP
    > 1 (token_dispatcher.py core_v0.19.0), which EP > 1 gives."""
    if not model.is_moe or config.ep <= 1:
        return "there is no expert parallelism"
    refusal = deepep_cluster_refusal(cluster)
    if refusal is not None:
        return refusal
    group = ep_group_topology(cluster, config.layout, pp_outermost=True)
    assert group is not None, "ep > 1 has a group"
    if group.num_nodes > 1 and (cluster.inter_node is None or cluster.inter_node.kind == "ethernet"):
        return "DeepEP crosses nodes over RDMA (InfiniBand or RoCE), which this cluster's network is not"
    return (deepep_ampere_refusal(cluster, "normal", group.num_nodes > 1)
            or deepep_training_refusal(config.ep, group.ranks_per_node, group.num_nodes))


def exchange_name(dispatcher: str) -> str:
    """What a plan calls the EP exchange: DeepEP's dispatch and combine, or NCCL's all-to-alls."""
    return "DeepEP" if dispatcher == "deepep" else "all-to-all"


def deepep_cluster_refusal(cluster: ClusterSpec) -> str | None:
    """Why DeepEP runs on no layout of this cluster, in words (None: on some): an NVIDIA Ampere or
    Hopper GPU, or a B200 / B300 (DEEPEP_BLACKWELL_GPUS), with NVLink inside the node."""
    gpu = cluster.gpu
    major = None if gpu.compute_capability is None else int(gpu.compute_capability)
    if not (major in (8, 9) or (major == 10 and gpu.name.startswith(DEEPEP_BLACKWELL_GPUS))):
        return f"DeepEP runs on NVIDIA Ampere, Hopper, B200 and B300 GPUs, not {gpu.name}"
    if cluster.intra_node is None or cluster.intra_node.kind != "nvlink":
        kind = "no GPU-to-GPU link" if cluster.intra_node is None else cluster.intra_node.kind
        return f"DeepEP moves tokens inside a node over NVLink (this node has {kind})"
    return None


def check_moe_dispatcher(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest) -> None:
    """--moe-dispatcher deepep where no layout can run it is a usage error (exit 2), not a plan
    that quietly runs without it: a model without experts, --layout ep=1, or a cluster DeepEP does
    not run on (deepep_cluster_refusal)."""
    if request.moe_dispatcher != "deepep":
        return
    if not model.is_moe:
        raise SpecError(f"--moe-dispatcher deepep: {model.name} has no experts")
    if request.layout.ep == 1:
        raise SpecError("--moe-dispatcher deepep: --layout ep=1 has no expert parallelism to run on DeepEP")
    refusal = deepep_cluster_refusal(cluster)
    if refusal is not None:
        raise SpecError(f"--moe-dispatcher deepep: {refusal}")


def moe_dispatcher_for(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, config: TrainConfig,
                       rates: TrainRates) -> str:
    """The token dispatcher the plan runs: alltoall without EP, on another engine or when asked;
    deepep when asked (the estimate rejects configurations DeepEP cannot run: deepep_refusal);
    auto: deepep where it can run and one of its transfers prices below one NCCL all-to-all at
    this layout and micro-batch (ep_transfer_seconds both ways), else alltoall. The transfers,
    not the block: under the combined 1F1B both may hide under the block's compute, where the
    plan prices DeepEP's 20 SMs beside it (training_time.exchange_sm_share) but not the SMs
    NCCL's channels hold, so a block-time rule would lean to NCCL on that unpriced gap (by
    0.06% on DeepSeek-V3 at EP 64 over 32 H100 nodes, where NVIDIA's recipe runs DeepEP)."""
    if not model.is_moe or config.ep <= 1 or request.engine != "megatron" or request.moe_dispatcher == "alltoall":
        return "alltoall"
    if request.moe_dispatcher == "deepep":
        return "deepep"
    if deepep_refusal(model, cluster, config) is not None:
        return "alltoall"
    tokens = config.micro_batch_size * act.context_parallel_chunk_tokens(request.seq_len, config.cp)
    nccl = ep_transfer_seconds(model, cluster, config.with_(moe_dispatcher="alltoall"), tokens).seconds
    deepep = ep_transfer_seconds(model, cluster, config.with_(moe_dispatcher="deepep"), tokens).seconds
    return "deepep" if deepep < nccl else "alltoall"


def moe_dispatcher_off_reason(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest,
                              config: TrainConfig) -> str | None:
    """Why an EP configuration runs Megatron's NCCL all-to-all dispatcher rather than DeepEP, in
    words (None: it runs DeepEP, there is no EP, the request asked for alltoall, or another engine
    plans it)."""
    if not (model.is_moe and config.ep > 1) or config.moe_dispatcher == "deepep" or request.moe_dispatcher == "alltoall":
        return None
    if request.engine != "megatron":  # as moe_comm_overlap_off_reason
        return None
    refusal = deepep_refusal(model, cluster, config)
    if refusal is not None:
        return refusal
    if moe_dispatcher_for(model, cluster, request, config,
                          train_rates(model, cluster, request.attention_kernel)) == "deepep":
        return "DeepEP's buffers do not fit in memory"
    return "its transfers price no faster here"


def moe_host_seconds_for(engine: str, asked: float | None = None) -> float:
    """The host's time per MoE block forward the plan prices: `asked` (--moe-host-ms) where
    given, else the engine's (train_engines.MOE_FORWARD_HOST_SECONDS)."""
    return MOE_FORWARD_HOST_SECONDS[engine] if asked is None else asked


def _layer_terms(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, seq_len: int,
                 rates: TrainRates, memo: Memo,
                 imbalance: float = efficiency.EXPERT_LOAD_IMBALANCE,
                 engine: str = "megatron", moe_host_seconds: float | None = None) -> tuple[Placement, LayerTerms]:
    c = config
    placement = _placement(cluster, c, memo)
    rotation = CP_KV_ROTATION[engine]
    host = moe_host_seconds_for(engine, moe_host_seconds) if moe_forward_syncs(engine, model, c.ep,
                                                                                  cluster.gpu.compute_capability) else 0.0
    terms = memo.get(("layer_terms", c.tp, c.micro_batch_size, c.sequence_parallel, c.recompute, seq_len,
                      c.attention, c.precision, c.fp8_recipe, c.ep, c.dp if c.ep > 1 else 0, imbalance,
                      c.cp, c.tp_comm_overlap, c.moe_comm_overlap, c.moe_dispatcher, rotation, host, c.engine),
                     layer_terms, model, cluster, c, seq_len, placement, rates, imbalance, rotation, host)
    return placement, terms


def _placement(cluster: ClusterSpec, config: TrainConfig, memo: Memo) -> Placement:
    """place() in Megatron's rank order (pp outermost), memoised on the layout's degrees."""
    return memo.get(("place", config.tp, config.pp, config.cp, config.dp), place, cluster, config.layout, True)


def _priced_tp_comm_overlap(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, config: TrainConfig,
                            memo: Memo) -> bool:
    """tp_comm_overlap_for, memoised on the only fields of the configuration it reads."""
    return memo.get(("tp_comm_overlap", config.tp, config.sequence_parallel, config.attention),
                    tp_comm_overlap_for, model, cluster, request, config)


def _priced_moe_dispatcher(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, config: TrainConfig,
                           rates: TrainRates, memo: Memo) -> str:
    """moe_dispatcher_for, memoised on the only fields of the request and configuration it reads."""
    return memo.get(("moe_dispatcher", request.moe_dispatcher, config.tp, config.pp, config.dp, config.cp, config.ep,
                     config.micro_batch_size), moe_dispatcher_for, model, cluster, request, config, rates)


def block_seconds_floor(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, request: TrainRequest,
                        rates: TrainRates, memo: Memo) -> float:
    """The least time per micro-batch (training_time.block_seconds) at which estimate() can price
    a decoder block of this configuration (its layout, b, SP and recompute; schedule and ZeRO
    do not enter a block's terms): its terms with the precision and TP overlap estimate()
    gives it; under EP without the all-to-alls and the MoE syncs' host waits
    (training_time.exchange_free_block_seconds), whichever dispatcher and combined 1F1B
    estimate() runs them with (it falls back from one to the other where memory is short),
    and then its terms read dp only through ep (dp_per_ep_group = ep/tp). The bounded training
    search rests on it (train_search.step_seconds_floor)."""
    config = config.with_(precision=request.precision, fp8_recipe=request.resolved_fp8_recipe)
    config = config.with_(tp_comm_overlap=_priced_tp_comm_overlap(model, cluster, request, config, memo))
    imbalance = expert_imbalance(request)
    if config.ep > 1:
        return exchange_free_block_seconds(model, cluster, config, request.seq_len, _placement(cluster, config, memo),
                                           rates, imbalance, CP_KV_ROTATION[request.engine])
    return block_seconds(_layer_terms(model, cluster, config, request.seq_len, rates, memo, imbalance,
                                      request.engine, request.moe_host_seconds)[1])


def estimate(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, request: TrainRequest,
             rates: TrainRates | None = None, memo: Memo | None = None) -> TrainEstimate | Rejected:
    """The estimate of one configuration, or the reasons it cannot run. `memo` is the
    search's (values that repeat across its configurations); standalone calls get a new one.
    Megatron's combined 1F1B (moe_comm_overlap_for) runs where its one more forward in flight
    fits; where only that does not, the configuration runs without it. Likewise DeepEP
    (moe_dispatcher_for, auto) where only its buffers do not fit: NCCL all-to-alls instead."""
    memo = memo or Memo()
    model = trained_model(model, request)
    B, s = request.global_batch, request.seq_len
    given = c = config
    reasons = memo.get(("structural", c.tp, c.pp, c.dp, c.ep), structural_reasons, model, c.tp, c.pp, c.dp, B, c.ep)
    reasons = reasons or engine_reasons(model, c, request) or config_reasons(model, config, B, request.engine)
    if not reasons and c.recompute == "outputs":
        refusal = outputs_recompute_refusal(model, request)
        reasons = [f"recompute outputs: {refusal}"] if refusal else []
    if not reasons and c.recompute == "op":
        refusal = op_recompute_refusal(model, request)
        reasons = [f"recompute op: {refusal}"] if refusal else []
    if reasons:
        return Rejected(config.layout, tuple(reasons))
    check_precision(cluster, request.precision, request.resolved_fp8_recipe, request.engine)
    if config.precision != request.precision:  # the search builds configurations without it
        config = config.with_(precision=request.precision)
    if config.fp8_recipe != request.resolved_fp8_recipe:
        config = config.with_(fp8_recipe=request.resolved_fp8_recipe)
    if config.grad_reduce != request.grad_reduce:
        config = config.with_(grad_reduce=request.grad_reduce)
    if config.optimizer_states != request.optimizer_states:
        config = config.with_(optimizer_states=request.optimizer_states)
    if config.engine != request.engine:
        config = config.with_(engine=request.engine)
    if config.attention_kernel != request.attention_kernel:
        config = config.with_(attention_kernel=request.attention_kernel)
    rates = rates or train_rates(model, cluster, request.attention_kernel)
    overlap = _priced_tp_comm_overlap(model, cluster, request, config, memo)
    if config.tp_comm_overlap != overlap:  # the search builds configurations without it
        config = config.with_(tp_comm_overlap=overlap)
    # moe_comm_overlap_for reads only these fields of the request and configuration (none without EP)
    moe_overlap = config.ep > 1 and memo.get(("moe_comm_overlap", request.moe_comm_overlap, config.ep,
                                               config.recompute, config.pp, config.schedule, config.virtual_stages,
                                               config.zero_stage, request.engine_versions.megatron,
                                               config.micro_batch_size, config.dp),
                                              moe_comm_overlap_for, model, request, config)
    if config.moe_comm_overlap != moe_overlap:
        config = config.with_(moe_comm_overlap=moe_overlap)
    if config.ep > 1:
        if request.moe_dispatcher == "deepep":  # TrainRequest refuses deepep under other engines
            refusal = memo.get(("deepep_refusal", config.tp, config.pp, config.dp, config.cp, config.ep),
                               deepep_refusal, model, cluster, config)
            if refusal is not None:
                return Rejected(config.layout, (f"--moe-dispatcher deepep: {refusal}",))
        dispatcher = _priced_moe_dispatcher(model, cluster, request, config, rates, memo)
        if config.moe_dispatcher != dispatcher:
            config = config.with_(moe_dispatcher=dispatcher)
    imbalance = expert_imbalance(request)
    m = B // (config.micro_batch_size * config.dp)
    capacity = memo.get(("capacity",), lambda: cluster.gpu.cuda_visible_memory_bytes)
    least, every_split = least_memory(model, config, request, m, memo, imbalance)
    if least.total_bytes > capacity:  # no split fits, whatever it falls back to: no stage times needed
        mtp_here = model.num_mtp_layers if least.stage == config.pp - 1 else 0
        return Rejected(config.layout, (oom_reason(least, capacity, mtp_here, every_split),),
                        least.total_bytes - capacity)
    splits = stage_split_options(model, cluster, config, s, rates, memo, imbalance, request.engine,
                                 request.moe_host_seconds)
    config, layers, memories, memory, faster = _fitting_split(model, config, splits, s, m, capacity, memo, imbalance)
    if memory.total_bytes > capacity:
        if config.moe_comm_overlap:  # its one more forward in flight may be what does not fit: without it
            return _fallen_back(estimate(model, cluster, given, replace(request, moe_comm_overlap=False), rates, memo))
        if config.moe_dispatcher == "deepep" and request.moe_dispatcher == "auto":  # DeepEP's buffers: without
            return _fallen_back(estimate(model, cluster, given, replace(request, moe_dispatcher="alltoall"), rates,
                                         memo))
        mtp_here = model.num_mtp_layers if memory.stage == config.pp - 1 else 0
        return Rejected(config.layout, (oom_reason(memory, capacity, mtp_here),), memory.total_bytes - capacity)
    placement, terms = _layer_terms(model, cluster, config, s, rates, memo, imbalance, request.engine,
                                    request.moe_host_seconds)
    params = memo.get(("stage_params", config.tp, config.pp, layers, config.ep, config.virtual_stages),
                      stage_params_per_gpu, model, config.tp, config.pp, layers, config.ep, config.virtual_stages)
    causal = config.attention == "flash"  # flash kernels skip the masked half; the 2021 count keeps it
    flops = memo.get(("flops_per_sequence", s, causal), _flops_per_sequence, model, s, causal)
    c = config
    dp = memo.get(("dp_collectives", c.tp, c.pp, c.dp, c.cp, c.ep, c.zero_stage, c.grad_reduce, layers,
                   c.account_for_embedding_and_loss),
                  _dp_collectives, params, c, cluster, layers)
    num_gpus = c.tp * c.cp * c.pp * c.dp
    link = memo.get(("dp_link", c.tp, c.dp_cp), dp_link, cluster, c)  # all dp_link reads: the DP group's stride and size
    reductions = gradient_reductions_per_step(request.engine, config, B // (config.micro_batch_size * config.dp))
    rerun_share = recomputed_share(model, config, layers)  # a ZeRO-3 rerun gathers only the rerun layers
    gathers = zero3_gathers_per_micro_batch(request.engine, config, rerun_share)
    kept = None
    if partial_recompute(config):  # block recompute: the other layers (and the MTP blocks) keep all
        kept = _layer_terms(model, cluster, config.with_(recompute="none", recompute_num_layers=None,
                                                         recompute_every=None), s, rates,
                            memo, imbalance, request.engine, request.moe_host_seconds)[1]
    times = step_times(model, cluster, config, B, s, rates, layers, placement, terms, params, *flops, dp, link,
                       reductions, gathers, kept, recomputed_layers(config, layers) if kept is not None else None)
    step = times.breakdown.total
    counted = (times.model_flops_per_step
               + rerun_share * (times.hardware_flops_per_step - times.model_flops_per_step))
    v = config.virtual_stages
    return TrainEstimate(
        config=config,
        num_micro_batches=m,
        memory=memory,
        capacity_per_gpu_bytes=capacity,
        step_time_seconds=step,
        tokens_per_second=B * s / step,
        tflops_per_gpu=flops_per_s_to_tflops(counted / (step * num_gpus)),
        model_tflops_per_gpu=flops_per_s_to_tflops(times.model_flops_per_step / (step * num_gpus)),
        dp_reductions_per_step=reductions,
        zero3_gathers_per_micro_batch=gathers,
        mfu=times.model_flops_per_step / (step * num_gpus * rates.peak_flops_per_s),
        bubble_fraction=pipeline.bubble_fraction(config.pp, m, v),
        bubble_over_compute_ratio=pipeline.bubble_over_compute_ratio(config.pp, m, v),
        tp_allreduce_seconds_per_layer=times.tp_seconds_per_layer,
        alltoall_seconds_per_layer=terms.ep.alltoall_seconds_per_moe_layer,
        alltoall_link=terms.ep.link,
        memory_fallback=faster is not None,
        faster_split=faster,
        tp_link=times.tp_link,
        pp_link=times.pp_link,
        dp_link=times.dp_link,
        time_breakdown_seconds=times.breakdown,
        num_layers_per_stage=memo.get(("layers_per_stage", c.pp, v, c.first_last_layers,
                                       c.account_for_embedding_and_loss), _layers_per_stage, model, c),
        slowest_stage=times.slowest_stage,
        stage_memories=memories,
        layer_terms=terms,
        stage_seconds_per_micro_batch=times.stage_seconds_per_micro_batch,
        pp_send_seconds=times.pp_send_seconds,
        pp_send_bytes=times.pp_send_bytes,
        dp_collectives=times.dp,
    )


def least_memory(model: ModelSpec, config: TrainConfig, request: TrainRequest, m: int, memo: Memo,
                 imbalance: float) -> tuple[TrainMemory, bool]:
    """A memory no stage split of the configuration goes below on its worst stage, whatever
    estimate() falls back to for memory: the leanest variant (no combined 1F1B, whose forward in
    flight adds activations; NCCL's all-to-all where DeepEP was chosen, whose buffers add bytes)
    with each stage kind (first, middle, last) given the fewest layers any split gives it
    (split_candidates; the configuration's own split where its stages are even or fixed). A
    stage's memory grows with its own layers only, so the worst stage of every split holds at
    least this; where it does not fit, the stage it names overflows under every split, by at
    least what it says, and estimate() rejects the configuration on it without pricing the
    stages' times. With whether the stages are uneven (False: one split, the memory is the
    configuration's own, exactly)."""
    c, L, pp = config, model.num_hidden_layers, config.pp
    fallback = "alltoall" if c.moe_dispatcher == "deepep" and request.moe_dispatcher == "auto" else c.moe_dispatcher
    lean = c.with_(moe_comm_overlap=False, moe_dispatcher=fallback)
    fixed = c.first_last_layers is not None or c.account_for_embedding_and_loss
    v = c.virtual_stages
    if fixed or pp == 1 or (L % pp == 0 and (L // pp) % v == 0 and not model.num_mtp_layers):
        return worst_stage_memory(stage_memories(model, lean, request.seq_len, m, memo=memo, imbalance=imbalance)), False
    triples = [t for _, t in split_candidates(L, pp, v, request.engine, bool(model.num_mtp_layers))]
    layers = (min(t[0] for t in triples), min(t[1] for t in triples), min(t[2] for t in triples))
    stages = (0, 1, pp - 1) if pp > 2 else None  # a split's heaviest middle stage is the second
    return worst_stage_memory(stage_memories(model, lean, request.seq_len, m, stages, memo, imbalance, layers)), True


def _fallen_back(result: TrainEstimate | Rejected) -> TrainEstimate | Rejected:
    """An estimate that dropped something for memory, marked so (TrainEstimate.memory_fallback)."""
    return replace(result, memory_fallback=True) if isinstance(result, TrainEstimate) else result


class FittedSplit(NamedTuple):
    """One stage split's memory (split_memory), and from _fitting_split the faster split that did
    not fit, if any."""

    config: TrainConfig
    layers: tuple[int, int, int]
    """(first, middle, last) stage layers."""
    memories: tuple[TrainMemory, ...]
    """Per stage, first to last."""
    worst: TrainMemory
    faster: FasterSplit | None = None


def split_memory(model: ModelSpec, config: TrainConfig, seq_len: int, m: int, memo: Memo, imbalance: float,
                 layers: tuple[int, int, int] | None = None) -> FittedSplit:
    """The stages' memory of the configuration's own split (`layers`: its stage layers, when known)."""
    layers = stage_layers(model, config) if layers is None else layers
    memories = stage_memories(model, config, seq_len, m, memo=memo, imbalance=imbalance, layers=layers)
    return FittedSplit(config, layers, memories, worst_stage_memory(memories))


def with_split(config: TrainConfig, named: tuple[tuple[int, int] | None, bool]) -> TrainConfig:
    """The configuration running a split named (first/last layers, account) (SplitOptions)."""
    first_last, account = named
    return config.with_(first_last_layers=first_last, account_for_embedding_and_loss=account)


def _fitting_split(model: ModelSpec, config: TrainConfig, splits: SplitOptions | None, seq_len: int, m: int,
                   capacity: float, memo: Memo, imbalance: float) -> FittedSplit:
    """The fastest of `splits` (stage_split_options) that fits, with the faster split that did
    not fit if any, else the split tried that came closest (whose overshoot the rejection
    reports); the configuration as it is without splits. A faster split can put a layer more on
    the first stage, which holds the most micro-batches, where an even one fits. Each stage kind's
    memory grows with its own layers only, so once a split overflows on a kind, splits with at
    least as many layers there are skipped, and none is tried where even the fewest layers a split
    gives that kind cannot fit."""
    fastest = split_memory(model, config if splits is None else with_split(config, splits.first), seq_len, m,
                           memo, imbalance)
    if splits is None or fastest.worst.total_bytes <= capacity:
        return fastest
    closest = fastest  # the least overshoot tried: the fastest so far
    faster = FasterSplit(_layers_per_stage(model, fastest.config), fastest.worst.total_bytes - capacity,
                         fastest.worst.stage)
    least, pp = splits.least_layers(), config.pp
    for memory in fastest.memories:
        kind = stage_kind(memory.stage, pp)
        # a stage of n layers holds at most total/n bytes per layer (the rest is fixed), so with
        # the fewest layers any split gives that kind it still needs total * least/n
        if memory.total_bytes * least[kind] > capacity * fastest.layers[kind]:
            return closest
    limits = [float("inf")] * 3  # first, middle, last: the layers at which that kind overflowed
    _tighten(limits, fastest.memories, fastest.layers, capacity, pp)
    for named, layers in splits.ordered()[1:]:
        if layers[0] >= limits[0] or layers[1] >= limits[1] or layers[2] >= limits[2]:
            continue
        tried = split_memory(model, with_split(config, named), seq_len, m, memo, imbalance, layers)
        if tried.worst.total_bytes <= capacity:
            return tried._replace(faster=faster)
        if tried.worst.total_bytes < closest.worst.total_bytes:  # the closest miss is what the rejection reports
            closest = tried
        _tighten(limits, tried.memories, layers, capacity, pp)
    return closest


def _tighten(limits: list[float], memories: tuple[TrainMemory, ...], layers: tuple[int, int, int],
             capacity: float, pp: int) -> None:
    """Lower each overflowing stage kind's limit to its layers here (_fitting_split)."""
    for memory in memories:
        if memory.total_bytes > capacity:
            kind = stage_kind(memory.stage, pp)
            limits[kind] = min(limits[kind], layers[kind])


def _layers_per_stage(model: ModelSpec, config: TrainConfig) -> tuple[int, ...]:
    return split.layers_per_stage(model.num_hidden_layers, config.pp, first_last_layers(model, config))


def _flops_per_sequence(model: ModelSpec, s: int, causal: bool) -> tuple[float, float]:
    """(model FLOPs, Narayanan et al. 2021's count, eq. 3) per sequence."""
    return (flops_model.model_flops_per_sequence(model, s, causal),
            flops_model.megatron_flops_per_sequence(model, s, causal))


def _dp_collectives(params: StageParams, c: TrainConfig, cluster: ClusterSpec,
                    layers: tuple[int, int, int]) -> DpCollectives:
    """dp_collectives of the worst stage's parameters, ZeRO-2/3's per layer of its most loaded stage."""
    return dp_collectives(params.worst, c, cluster, params.worst_routed_experts, num_units=max(layers))


def with_stage_split(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, seq_len: int,
                     rates: TrainRates, memo: Memo | None = None,
                     imbalance: float = efficiency.EXPERT_LOAD_IMBALANCE,
                     engine: str = "megatron") -> TrainConfig:
    """The configuration with its stage split filled in where stages cannot be even (p does
    not divide L, or v does not divide L/p): of Megatron's fastest balanced first/last split
    (p not dividing L) and, with Megatron, the embedding and loss counted as layers, the one
    whose slowest stage is faster (StageSeconds.slowest; a tie keeps the first/last split).
    The estimate takes the next fastest (stage_split_options) where this one does not fit."""
    options = stage_split_options(model, cluster, config, seq_len, rates, memo, imbalance, engine)
    return config if options is None else with_split(config, options.first)


def stage_split_options(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, seq_len: int,
                        rates: TrainRates, memo: Memo | None = None,
                        imbalance: float = efficiency.EXPERT_LOAD_IMBALANCE,
                        engine: str = "megatron", moe_host_seconds: float | None = None) -> SplitOptions | None:
    """Every (first/last layers, account) split the configuration may run (SplitOptions: the
    fastest is with_stage_split's); None where the split is fixed or the stages are even.
    `moe_host_seconds`: --moe-host-ms (moe_host_seconds_for)."""
    L, c = model.num_hidden_layers, config
    v = c.virtual_stages
    fixed = c.first_last_layers is not None or c.account_for_embedding_and_loss
    # even stages need no split, unless MTP modules weigh on the last (then the splits are weighed)
    if fixed or c.pp == 1 or (L % c.pp == 0 and (L // c.pp) % v == 0 and not model.num_mtp_layers):
        return None
    memo = memo or Memo()
    key = (c.tp, c.pp, c.micro_batch_size, c.sequence_parallel, c.recompute, seq_len, c.attention, c.precision,
           c.fp8_recipe, c.ep, c.dp if c.ep > 1 else 0, imbalance, c.cp, c.tp_comm_overlap, c.moe_comm_overlap,
           c.moe_dispatcher, c.grad_reduce, moe_host_seconds, c.engine)
    options = memo.get(("stage_split", v, engine, key), _split_options_of, model, cluster, c, seq_len, rates, memo,
                       imbalance, engine, key, moe_host_seconds)
    assert options.first is not None, "config_reasons lets through only configurations with a split"
    return options


def _split_options_of(model: ModelSpec, cluster: ClusterSpec, c: TrainConfig, seq_len: int, rates: TrainRates,
                      memo: Memo, imbalance: float, engine: str,
                      key: tuple, moe_host_seconds: float | None = None) -> SplitOptions:
    """stage_split_options for one configuration (`key`: what its stage times depend on)."""
    L, pp, v = model.num_hidden_layers, c.pp, c.virtual_stages
    costs = memo.get(("stage_seconds", engine, key), _stage_seconds, model, cluster, c, seq_len, rates, memo,
                     imbalance, engine, moe_host_seconds)
    return SplitOptions(costs, pp, split_candidates(L, pp, v, engine, bool(model.num_mtp_layers)))


def _stage_seconds(model: ModelSpec, cluster: ClusterSpec, c: TrainConfig, seq_len: int, rates: TrainRates,
                   memo: Memo, imbalance: float, engine: str = "megatron",
                   moe_host_seconds: float | None = None) -> split.StageSeconds:
    _, terms = _layer_terms(model, cluster, c, seq_len, rates, memo, imbalance, engine, moe_host_seconds)
    layer_params = memo.get(("layer_params", c.tp, c.ep), layer_params_per_gpu, model, c.tp, c.ep)
    ends = memo.get(("stage_params", c.tp, c.pp, (0, 0, 0), c.ep), stage_params_per_gpu, model, c.tp, c.pp,
                    (0, 0, 0), c.ep)
    return stage_seconds(model, c, terms, rates, layer_params, ends)


class SplitOptions:
    """The stage splits a configuration may run, each `(kind, (first, middle, last) stage
    layers)`: kind 0 Megatron's first/last-stage flags, 1 its account flag (the embedding and
    loss counted as layers), 2 a per-chunk split (Megatron's layout string, torchtitan's module
    lists); which are offered is split_candidates' rule. A split is named `(first/last layers or
    None, account)`.
    `first` is the fastest; `ordered()` every split fastest first with its stage layers and
    `least_layers()` each stage kind's fewest, both worked out only when the fastest does not
    fit (the search asks for `first` thousands of times). Fastest: the least
    StageSeconds.slowest, ties to the smaller kind, then the smaller first and last stage."""

    __slots__ = ("_costs", "_pp", "_candidates", "_ordered", "_least", "first")

    def __init__(self, costs: split.StageSeconds, pp: int,
                 candidates: tuple[tuple[int, tuple[int, int, int]], ...]) -> None:
        self._costs, self._pp, self._candidates = costs, pp, candidates
        self._ordered: tuple | None = None
        self._least: tuple[int, int, int] | None = None
        self.first = _named_split(*min(self._keyed())[1:]) if candidates else None

    def _keyed(self) -> list[tuple[float, int, int, int, int]]:
        """(slowest stage's seconds, kind, f, l, c) per candidate: StageSeconds.slowest written
        out (c = 0 when p = 2 adds a 0 to the max, which stage times never go below; the search
        builds thousands of these)."""
        costs = self._costs
        w, first_extra, last_extra = costs.seconds_per_layer, costs.first_extra_seconds, costs.last_extra_seconds
        return [(max(f * w + first_extra, last * w + last_extra, c * w), kind, f, last, c)
                for kind, (f, c, last) in self._candidates]

    def ordered(self) -> tuple[tuple[tuple[tuple[int, int] | None, bool], tuple[int, int, int]], ...]:
        """Every split, fastest first, with its (first, middle, last) stage layers."""
        if self._ordered is None:
            self._ordered = tuple((_named_split(kind, f, last, c), (f, c, last))
                                  for _, kind, f, last, c in sorted(self._keyed()))
        return self._ordered

    def least_layers(self) -> tuple[int, int, int]:
        """Each stage kind's fewest layers over the splits (first, middle, last)."""
        if self._least is None:
            triples = [t for _, t in self._candidates]
            self._least = (min(t[0] for t in triples), min(t[1] for t in triples), min(t[2] for t in triples))
        return self._least


def _named_split(kind: int, first: int, last: int, middle: int) -> tuple[tuple[int, int] | None, bool]:
    """(first/last layers, account) of a SplitOptions candidate: the account flag sets no
    first/last layers, nor does the even split among the first/last ones (weighed where MTP
    modules load the last stage: split_candidates), which needs no flag; middle 0 when p = 2."""
    if kind == 1:
        return None, True
    if first == last and middle in (0, first):
        return None, False
    return (first, last), False


@functools.cache
def split_candidates(num_layers: int, pp: int, v: int, engine: str,
                     heavy_last: bool = False) -> tuple[tuple[int, tuple[int, int, int]], ...]:
    """Every (kind, (first, middle, last) layers) split SplitOptions weighs: Megatron's balanced
    first/last splits (p not dividing L, or `heavy_last`: MTP modules on the last stage, where
    the even split is one of them), its account split (the embedding and loss counted as
    layers), and where neither flag splits the layers the per-chunk split's (layout string or
    torchtitan's module lists). A function of its arguments alone, cached: the search asks
    for it with every configuration key."""
    uneven = num_layers % pp or (heavy_last and engine == "megatron")
    first_last = tuple(split.candidate_splits(num_layers, pp, v)) if uneven else ()
    account = split.account_split(num_layers, pp, v) if engine == "megatron" else None
    options = [(0, triple) for triple in first_last]
    if account is not None:
        options.append((1, split.stage_triple(num_layers, pp, account)))
    if not options and has_layout_split(num_layers, pp, v, engine):  # the layout string only where neither flag splits
        options = [(2, triple) for triple in split.layout_splits(num_layers, pp, v)]
    return tuple(options)


@functools.cache
def has_split(num_layers: int, pp: int, v: int) -> bool:
    """stage_split.has_split, cached here (a function of three numbers that config_reasons asks
    for every configuration; planner/cost keeps no caches of its own)."""
    return split.has_split(num_layers, pp, v)


@functools.cache
def has_layout_split(num_layers: int, pp: int, v: int, engine: str) -> bool:
    """Whether a per-chunk split (Megatron's --pipeline-model-parallel-layout, torchtitan's
    module_fqns_per_model_part: PER_CHUNK_SPLIT_ENGINES) splits these layers (stage_split.
    layout_splits), as the plan uses it: p not dividing L or v not dividing L/p (then the flags
    have no split with stages of v-multiple layers; Megatron's layout string names every chunk,
    get_num_layers_to_build reads it, core_v0.19.0), v > 1, at least one layer per chunk.
    The search tries the v dividing ceil(L/p) (train_search.schedule_options); a --virtual-stages
    asked for runs with any v a split holds (126 layers on 16 stages at v = 3: 7 | 8 x14 | 7 in
    chunks of 3, 3, 2 and 2, 3, 3; 80 layers on 4 stages at v = 3: chunks of 7, 7, 6)."""
    if engine not in PER_CHUNK_SPLIT_ENGINES or v <= 1 or (num_layers % pp == 0 and (num_layers // pp) % v == 0):
        return False
    return next(split.layout_splits(num_layers, pp, v), None) is not None


MOE_TRAINING_CAVEAT = ("MoE training times are calibrated loosely: against NVIDIA's published MoE runs "
                       "(Megatron-Bridge), each as its recipe ran it, a median 11% off, mostly optimistic (GPT-OSS "
                       "on B200 up to 44% slower than planned); one fitted constant, the host's "
                       "time per MoE layer, carries most of it, so treat a deadline from these numbers with care "
                       "(docs/cost-model.md, Known limitations).")


TORCHTITAN_MOE_CAVEAT = ("torchtitan's MoE training is priced by the same model with no torchtitan MoE "
                         "measurement behind it: its host time per MoE block (the wait after each EP "
                         "layer's token-count sync) is Megatron's fitted value, an estimate here; "
                         "--moe-host-ms sets it, plan explain shows what it moves.")


TORCHTITAN_CAVEAT = ("torchtitan's times and memory are priced from its source at v0.2.2 (FSDP2's fp32 "
                     "sharded states, torchao's fp8 casts, its DDP and schedules) on the kernel rates fitted to NeMo's "
                     "runs; no torchtitan run is in the calibration set, so they are unverified "
                     "(docs/cost-model.md, Known limitations).")


def trained_model(model: ModelSpec, request: TrainRequest) -> ModelSpec:
    """The model the run trains: the spec with the multi-token-prediction modules the request
    trains (--mtp-layers; by default the spec's with Megatron, as DeepSeek-V3 was trained and
    NVIDIA's recipe runs it, Megatron-Bridge recipes/deepseek/deepseek_v3.py v0.4.0
    mtp_num_layers = 1; none with torchtitan, which builds no MTP module at v0.2.2). The plan's
    costs read model.num_mtp_layers (stage_params_per_gpu, mtp_stage_seconds, flops). Megatron
    builds MTP only with rotary or no position embeddings (arguments.py core_v0.14.0 and
    core_v0.19.0): asked for a learned-position model, a SpecError; by default such a model
    trains none (training_caveats says so). Its 16 bits (params.training_dtype reads the dtype): a
    float16 checkpoint trains in float16 with Megatron (--fp16) unless --precision bf16 was given
    (TrainRequest.bf16_asked), and in bfloat16 with torchtitan, whose mixed_precision_param takes
    bfloat16 or float32 only (config/job_config.py at v0.2.2; the emitted TOML leaves its default,
    bfloat16)."""
    num = request.mtp_layers
    if num is None:
        num = model.num_mtp_layers if request.engine == "megatron" and mtp_position_ok(model) else 0
    if num and not mtp_position_ok(model):
        raise SpecError(f"--mtp-layers {num}: Megatron-LM builds multi-token prediction only with rope or no "
                        f"position embeddings; {model.name} has learned positions")
    update: dict = {} if num == model.num_mtp_layers else {"num_mtp_layers": num}
    if model.dtype == "float16" and (request.bf16_asked or request.engine == "torchtitan"):
        update["dtype"] = "bfloat16"
    return model.model_copy(update=update) if update else model


def mtp_position_ok(model: ModelSpec) -> bool:
    """Megatron builds MTP modules only with rotary or no position embeddings."""
    return model.position_embedding != "learned"


def training_caveats(model: ModelSpec, request: TrainRequest, recompute: str | None = None) -> tuple[str, ...]:
    """What the plan's numbers do not cover, said with them (the text's Notes, JSON `notes`,
    plan explain's notes): MoE training times loosely calibrated; the spec's multi-token-
    prediction layers left untrained (trained_model); a quantized spec's weights not what
    training keeps; torchtitan's selective checkpointing where it is priced as Megatron's.
    `model`: the spec as given; `recompute`: the recommended configuration's level (None: the
    request's)."""
    caveats: tuple[str, ...] = ()
    level = recompute or request.recompute
    refusal = op_recompute_refusal(model, request) if request.engine == "torchtitan" else None
    if level == "selective" and refusal is not None:
        # train_engines.TORCHTITAN_AC_MODES: torchtitan runs its per-op checkpoint all the same
        caveats += (f"recompute selective: the job config asks torchtitan for its per-op selective checkpointing "
                    f"(mode \"selective\", selective_ac_option \"op\"), which the plan cannot price here "
                    f"({refusal.split(';')[0]}); the memory and step time shown are Megatron's selective level "
                    f"(the attention core rerun; with flash attention it keeps what no recompute keeps), so what "
                    f"runs keeps less memory and reruns more than shown.",)
    if model.is_moe:
        caveats += (MOE_TRAINING_CAVEAT,)
        if request.engine == "torchtitan":
            caveats += (TORCHTITAN_MOE_CAVEAT,)
    if request.engine == "torchtitan":
        caveats += (TORCHTITAN_CAVEAT,)
    num_trained = trained_model(model, request).num_mtp_layers
    if model.num_mtp_layers > num_trained:
        why = ("--mtp-layers" if request.mtp_layers is not None
               else f"{request.engine} builds no multi-token-prediction module" if request.engine != "megatron"
               else "Megatron-LM builds them only with rope or no position embeddings")
        trained = f"{num_trained} of them" if num_trained else "the main model only"
        caveats += (f"the spec's {model.num_mtp_layers} multi-token-prediction layer(s) are not all trained ({why}): "
                    f"the plan and command train {trained}.",)
    if request.recompute in ("op", "selective") and op_recompute_refusal(model, request) is None:
        caveats += ("recompute op is torchtitan's selective activation checkpointing (mode \"selective\", "
                    "selective_ac_option \"op\"), what --recompute selective runs there: it reruns every second "
                    "matmul (three of a block's seven) and the elementwise ops and saves the rest, attention "
                    "included: not Megatron's selective (the attention core rerun).",)
    if model.dtype == "float32":
        caveats += ("the spec's float32 weights train in bf16 mixed precision (--bf16, fp32 master weights "
                    "and gradients), as the plan prices; fp32 training (4-byte activations, TF32 matmuls) is "
                    "not planned.",)
    if model.quantization is not None:
        caveats += (f"training keeps {model.dtype} weights with {request.precision} GEMMs; the spec's "
                    f"{model.quantization} weights describe a serving checkpoint and are not planned here.",)
    return caveats
