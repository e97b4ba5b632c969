"""Model-state memory of mixed-precision Adam training, per GPU, with its sharding.

Legend: P parameters held by one GPU (its pipeline stage, split by tensor parallelism),
d data-parallel degree, z ZeRO stage; MoE: ep expert-parallel degree, P_x the routed-expert
parameters among P, d_x = t*cp*d/ep the expert-data-parallel degree (d*cp without EP). Bytes per parameter: weights 2 (16-bit),
gradients 4 (Megatron's fp32 main grads), optimizer 12 (fp32 master, Adam m and v).
Sharding over d (Rajbhandari et al. 2020, ZeRO; Megatron's distributed optimizer is
z = 1): z >= 1 divides the optimizer, z >= 2 also the gradients, z = 3 also the weights.
Expert parallelism (Megatron-Core, --expert-model-parallel-size ep, expert TP 1): a GPU
holds ceil(E/ep) whole experts per MoE layer, and their states are sharded over the
expert-data-parallel group of the t*cp*d/ep GPUs holding the same experts, not over d
(megatron/core/parallel_state.py core_v0.19.0: expert_data_parallel_size = world /
(etp * ep * pp)).
Sources: Megatron-LM docs/api-guide/dist_optimizer.md; Rajbhandari et al. 2020 sec. 5;
docs/cost-model.md#training-model-state-memory-zero. FP8 (--precision fp8): Transformer
Engine's fp8 weight copies and scaling state on top (fp8_weight_cache_bytes,
docs/cost-model.md#training-fp8).
Pure and uncached: the training estimate memoises what a search asks for repeatedly.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import efficiency
from planner.cost.moe import moe_layers_of
from planner.cost.params import (
    layer_linear_weights_per_gpu,
    layer_linear_weights_per_gpu_by_kind,
    layer_params_per_gpu,
    moe_layer_excess_weights_by_kind,
    mtp_module_params_per_gpu,
    param_counts,
    training_dtype,
)
from planner.cost.stage_split import stage_layer_indices
from planner.layout import TrainConfig
from planner.specs import ModelSpec


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a TP group holds on the first, a middle and the last stage."""

    first_stage: float
    last_stage: float
    middle_stage: float = 0.0
    """Blocks only (0 when pp <= 2: no middle stage)."""
    routed_experts: StageParams | None = None
    """The routed-expert parameters among these (MoE; None for a dense model): sharded over
    the expert-data-parallel group, not the data-parallel one."""

    @property
    def worst(self) -> float:
        return max(self.first_stage, self.last_stage, self.middle_stage)

    @property
    def worst_routed_experts(self) -> float:
        """The routed-expert parameters of the stage `worst` picks (0 for a dense model)."""
        if self.routed_experts is None:
            return 0.0
        stages = ((self.first_stage, self.routed_experts.first_stage),
                  (self.last_stage, self.routed_experts.last_stage),
                  (self.middle_stage, self.routed_experts.middle_stage))
        return max(stages, key=lambda pair: pair[0])[1]


def expert_data_parallel_size(tp: int, dp: int, ep: int, cp: int = 1) -> int:
    """d_x = t*cp*d/ep with EP (expert TP 1: the GPUs holding the same experts; the expert grid
    has no CP, its ranks fold the CP ranks in), d*cp without it (expert TP = t: the dense
    parameters' group): Megatron's world / (etp * ep * pp), parallel_state.py core_v0.19.0.
    t = 2, cp = 4, d = 8, ep = 16: 2*4*8/16 = 4."""
    return tp * cp * dp // ep if ep > 1 else dp * cp


def routed_expert_params_per_layer(model: ModelSpec, tp: int, ep: int = 1) -> float:
    """The mean block's routed-expert matmul weights on one GPU: E experts split t ways
    without EP, ceil(E/ep) whole experts with it (params.routed_expert_share_per_gpu),
    weighted by the share of MoE layers."""
    return layer_linear_weights_per_gpu_by_kind(model, tp, ep)[1]


def placed_moe_layer_excess(model: ModelSpec, pp: int, layers: tuple[int, int, int],
                            v: int = 1, excess_params: float = 1.0) -> tuple[float, float, float]:
    """(first, middle, last) stage's MoE layers less their mean share (moe_layers_of), where the
    model places its dense layers (dense_layer_indices) and the stages build the layers of
    stage_split.stage_layer_indices; the middle is the heaviest middle stage: the one with the
    most MoE layers when an MoE layer outweighs a dense one (`excess_params` > 0,
    params.moe_layer_excess_weights_by_kind), the fewest when it is lighter (large EP).
    (0, 0, 0) without positions, with one stage, or for ends-only triples. DeepSeek-V3 on 4
    stages of 16, 15 x 2, 15 (v = 1; dense 0-2): stage 0 13 MoE of 16 (mean share 15.21),
    middle 15 of 15 (14.26): (-2.21, +0.74, +0.74)."""
    indices = model.dense_layer_indices
    first, middle, last = layers
    per_stage = (first,) + (middle,) * (pp - 2) + (last,) if pp > 1 else ()
    if not model.is_moe or indices is None or pp < 2 or sum(per_stage) != model.num_hidden_layers:
        return 0.0, 0.0, 0.0
    dense = set(indices)
    excess = [len(own) - sum(1 for i in own if i in dense) - moe_layers_of(model, len(own))
              for own in stage_layer_indices(per_stage, v)]
    return excess[0], max(excess[1:-1], key=lambda e: e * excess_params, default=0.0), excess[-1]


def stage_params_per_gpu(model: ModelSpec, tp: int, pp: int,
                         layers: tuple[int, int, int] | None = None, ep: int = 1, v: int = 1) -> StageParams:
    """First stage: its blocks + vocab-parallel embedding V*h/t + learned positions.
    Last stage: its blocks + final norm + output layer V*h/t (with pp > 1 Megatron keeps
    a copy of tied embeddings there) + the model's multi-token-prediction modules
    (params.mtp_module_params_per_gpu; with pp > 1 and untied embeddings also the copy of the
    embedding they share, gpt_model.py core_v0.14.0: built where mtp_process).
    Middle: its blocks. `layers` = (first, middle, last)
    blocks; None = L/p on every stage. pp = 1: one stage holding everything. `ep`: the routed
    experts whole, ceil(E/ep) per GPU (routed_experts says how many parameters they are).
    Blocks are the mean block, except where the model places its dense layers: a stage then
    holds what its MoE layers above their mean share weigh beyond dense ones
    (placed_moe_layer_excess over v chunks, params.moe_layer_excess_weights_by_kind)."""
    counts = param_counts(model)
    even = model.num_hidden_layers / pp
    first_blocks, middle_blocks, last_blocks = layers or (even, even if pp > 2 else 0, even)
    per_layer = layer_params_per_gpu(model, tp, ep)
    vocab = model.vocab_size * model.hidden_size / tp
    num_mtp = model.num_mtp_layers
    mtp, mtp_routed = mtp_module_params_per_gpu(model, tp, ep) if num_mtp else (0.0, 0.0)
    mtp_embedding = vocab if num_mtp and pp > 1 and counts.lm_head else 0.0
    router, routed_excess, other = moe_layer_excess_weights_by_kind(model, tp, ep)
    excess = router + routed_excess + other
    excess_first, excess_middle, excess_last = (placed_moe_layer_excess(model, pp, layers, v, excess) if layers
                                                else (0.0, 0.0, 0.0))
    experts = None
    if model.is_moe:
        routed = routed_expert_params_per_layer(model, tp, ep)
        every_layer = model.num_hidden_layers * routed + num_mtp * mtp_routed
        experts = (StageParams(every_layer, every_layer) if pp == 1 else
                   StageParams(first_blocks * routed + excess_first * routed_excess,
                               last_blocks * routed + excess_last * routed_excess + num_mtp * mtp_routed,
                               middle_blocks * routed + excess_middle * routed_excess))
    positions = counts.embedding - model.vocab_size * model.hidden_size
    first = first_blocks * per_layer + excess_first * excess + vocab + positions
    head = vocab if (counts.lm_head or pp > 1) else 0.0
    last = last_blocks * per_layer + excess_last * excess + counts.final_norm + head + num_mtp * mtp + mtp_embedding
    if pp == 1:
        whole = first + last - last_blocks * per_layer
        return StageParams(whole, whole, routed_experts=experts)
    return StageParams(first, last, middle_blocks * per_layer + excess_middle * excess, experts)


@dataclass(frozen=True)
class ModelStateBytes:
    weights_bytes: float
    gradient_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.gradient_bytes + self.optimizer_bytes


def gradient_bytes_per_param(config: TrainConfig) -> int:
    """The main gradients' bytes per parameter: 4 (fp32) or 2 (--grad-reduce bf16)."""
    return efficiency.GRADIENT_BYTES_PER_PARAM[config.grad_reduce]


@dataclass(frozen=True)
class StateBytesPerParam:
    """Bytes per parameter of the weights and the optimizer states a GPU keeps (the gradients'
    are gradient_bytes_per_param)."""
    weights: float
    optimizer: float


MEGATRON_STATE_BYTES = StateBytesPerParam(efficiency.TRAIN_BYTES_PER_PARAM_WEIGHTS,
                                          efficiency.TRAIN_BYTES_PER_PARAM_OPTIMIZER)
"""16-bit weights; fp32 master weights and Adam's two moments (2, 12)."""


def megatron_state_bytes(optimizer_states: str, master_remainders: bool) -> StateBytesPerParam:
    """Megatron's weights and optimizer bytes per parameter by --optimizer-states: fp32 (2, 12),
    MEGATRON_STATE_BYTES; bf16 (the precision-aware optimizer, bf16 moments 2 + 2) with the fp32
    master weights kept whole (4): (2, 8), or as their 16-bit remainders where Transformer Engine
    keeps them (`master_remainders`, precision_aware_master_remainders: 2): (2, 6)."""
    if optimizer_states == "fp32":
        return MEGATRON_STATE_BYTES
    master = (efficiency.MASTER_REMAINDER_BYTES_PER_PARAM if master_remainders
              else efficiency.MASTER_WEIGHT_BYTES_PER_PARAM)
    return StateBytesPerParam(efficiency.TRAIN_BYTES_PER_PARAM_WEIGHTS,
                              master + efficiency.ADAM_MOMENTS_BYTES_PER_PARAM[optimizer_states])


def precision_aware_master_remainders(zero_stage: int, training_dtype: str, precision: str,
                                      fp8_recipe: str | None) -> bool:
    """Whether the precision-aware optimizer keeps the master weights as 16-bit remainders: under
    the distributed optimizer (ZeRO-1) with bf16 weights, and bf16 or delayed-scaling fp8 matmuls.
    There Megatron hands the optimizer the bf16 shards and Transformer Engine's FusedAdam keeps the
    master weights (use_precision_aware_optimizer_no_fp8_or_ds_fp8, optimizer_config.py and
    distrib_optimizer.py core_v0.19.0), with store_param_remainders. With the other fp8 recipes
    Megatron keeps fp32 main params itself; fp16 weights have no such remainder; Megatron-FSDP
    (ZeRO-2/3) keeps fp32 main params (--megatron-fsdp-main-params-dtype fp32) and is priced so."""
    delayed_or_bf16 = precision != "fp8" or (fp8_recipe or "delayed") == "delayed"
    return zero_stage == 1 and training_dtype == "bfloat16" and delayed_or_bf16


def master_remainders(config: TrainConfig, model: ModelSpec) -> bool:
    """Whether the configuration's master weights are 16-bit remainders: --optimizer-states bf16
    where Transformer Engine keeps them (precision_aware_master_remainders)."""
    return config.optimizer_states != "fp32" and precision_aware_master_remainders(
        config.zero_stage, training_dtype(model), config.precision, config.fp8_recipe)


def optimizer_step_bytes(config: TrainConfig, model: ModelSpec) -> float:
    """The Adam step's HBM bytes per parameter it updates: OPTIMIZER_STEP_BYTES_PER_PARAM, or
    under Megatron with bf16 optimizer states optimizer_step_bytes_per_param of its states."""
    if config.engine != "megatron" or config.optimizer_states == "fp32":
        return efficiency.OPTIMIZER_STEP_BYTES_PER_PARAM
    remainders = master_remainders(config, model)
    # TE's FusedAdam reads the main gradients as they are (use_decoupled_grad): 2 B under --grad-reduce bf16
    return optimizer_step_bytes_per_param(megatron_state_bytes(config.optimizer_states, remainders), remainders,
                                          gradient_bytes_per_param(config))


def optimizer_step_bytes_per_param(per_param: StateBytesPerParam, master_remainders: bool,
                                   gradient_read_bytes: float = efficiency.OPTIMIZER_STEP_GRADIENT_READ_BYTES
                                   ) -> float:
    """The Adam step's HBM bytes per parameter it updates: the gradient read (fp32:
    OPTIMIZER_STEP_GRADIENT_READ_BYTES), every optimizer state read and written, and the 16-bit
    weight written (2), or read and written where it is the master weight's upper half
    (`master_remainders`). Megatron's fp32 states: 4 + 2 * 12 + 2 = 30
    (OPTIMIZER_STEP_BYTES_PER_PARAM); bf16 moments with remainders 4 + 2 * 6 + 2 * 2 = 20 (18 with
    bf16 gradients); with fp32 master weights 4 + 2 * 8 + 2 = 22."""
    weight = efficiency.TRAIN_BYTES_PER_PARAM_WEIGHTS * (2 if master_remainders else 1)
    return gradient_read_bytes + 2 * per_param.optimizer + weight


FSDP2_STATE_BYTES = StateBytesPerParam(efficiency.FSDP2_BYTES_PER_PARAM_WEIGHTS,
                                       efficiency.FSDP2_BYTES_PER_PARAM_OPTIMIZER)
"""torchtitan's FSDP2: fp32 sharded parameters that are the master copy; Adam's moments (4, 8)."""
AUTOCAST_STATE_BYTES = StateBytesPerParam(
    efficiency.FSDP2_BYTES_PER_PARAM_WEIGHTS + efficiency.AUTOCAST_WEIGHT_COPY_BYTES_PER_PARAM,
    efficiency.FSDP2_BYTES_PER_PARAM_OPTIMIZER)
"""torchtitan's DDP: fp32 parameters and the bf16 copies autocast saves for the backward;
Adam's moments (6, 8)."""


def model_state_bytes(params_per_gpu: float, dp: int, zero_stage: int,
                      gradient_bytes_per_param: float = efficiency.TRAIN_BYTES_PER_PARAM_GRADIENTS,
                      per_param: StateBytesPerParam = MEGATRON_STATE_BYTES) -> ModelStateBytes:
    """weights w*P (/d if z = 3), gradients g*P (/d if z >= 2), optimizer o*P (/d if z >= 1);
    Megatron's (w, g, o) = (2, 4, 12), g = 2 with --grad-reduce bf16; torchtitan's FSDP2
    (4, 4, 8). P = 1e9, d = 8: Megatron ZeRO-1 2e9 + 4e9 + 1.5e9 = 7.5e9 B; FSDP2 ZeRO-3
    (4 + 4 + 8) * 1e9 / 8 = 2e9 B."""
    return ModelStateBytes(
        weights_bytes=params_per_gpu * per_param.weights / (dp if zero_stage >= 3 else 1),
        gradient_bytes=params_per_gpu * gradient_bytes_per_param
        / (dp if zero_stage >= 2 else 1),
        optimizer_bytes=params_per_gpu * per_param.optimizer / (dp if zero_stage >= 1 else 1),
    )


def least_total_model_state_bytes(params: float, gradient_bytes_per_param: float,
                                  per_param: StateBytesPerParam = MEGATRON_STATE_BYTES) -> float:
    """The least bytes of model state any layout holds over all of its GPUs together: every
    parameter's weight, main gradient and optimizer state kept at least once (TP, PP and EP
    split them, ZeRO shards them, nothing stores less), (w + g + o) * P with the engine's least
    (w, o). Activations and overheads only add. Llama-3.1-70B (70.55e9 parameters) with fp32
    gradients under Megatron: 18 * 70.55e9 = 1.27e12 bytes, more than 8 H100s hold
    (8 * 79.7 GiB = 6.85e11); under torchtitan's FSDP2 16 * 70.55e9 = 1.13e12."""
    return params * (per_param.weights + gradient_bytes_per_param + per_param.optimizer)


def expert_sharded_model_state_bytes(params_per_gpu: float, routed_expert_params_per_gpu: float,
                                     dp: int, expert_dp: int, zero_stage: int,
                                     gradient_bytes_per_param: float = efficiency.TRAIN_BYTES_PER_PARAM_GRADIENTS,
                                     per_param: StateBytesPerParam = MEGATRON_STATE_BYTES) -> ModelStateBytes:
    """model_state_bytes of the P - P_x dense parameters over d plus those of the P_x routed-
    expert ones over d_x (expert_data_parallel_size): Megatron's distributed optimizer keeps
    separate buffers for the expert parameters, reduced and sharded over the
    expert-data-parallel group (megatron/core/distributed/distributed_data_parallel.py)."""
    dense = model_state_bytes(params_per_gpu - routed_expert_params_per_gpu, dp, zero_stage,
                              gradient_bytes_per_param, per_param)
    experts = model_state_bytes(routed_expert_params_per_gpu, expert_dp, zero_stage, gradient_bytes_per_param,
                                per_param)
    return ModelStateBytes(dense.weights_bytes + experts.weights_bytes,
                           dense.gradient_bytes + experts.gradient_bytes,
                           dense.optimizer_bytes + experts.optimizer_bytes)


FSDP_UNIT_BUFFERS = 2
"""Megatron-FSDP holds the layer it computes and the one it prefetches unsharded
(--fsdp-double-buffer; PyTorch FSDP's forward/backward prefetch likewise keeps two units)."""


def fsdp_unit_buffer_bytes(params_per_gpu: float, num_layers: int, zero_stage: int,
                           gradient_bytes_per_param: float = efficiency.TRAIN_BYTES_PER_PARAM_GRADIENTS) -> float:
    """What sharding must still hold whole while a layer runs: with z = 3 the 16-bit weights
    of FSDP_UNIT_BUFFERS layers (2 B each), with z >= 2 the fp32 gradients of as many layers
    before their reduce-scatter (4 B each), a layer being the stage's P/L (its blocks: the
    embedding and head are their own units, counted in the mean). P = 1e9 over 10 layers:
    z = 3: 2 * 1e8 * (2 + 4) = 1.2e9 B; z = 2: 2 * 1e8 * 4 = 8e8 B; z <= 1: 0.
    fsdp_unit_buffers splits it into its weights and its gradients."""
    units = fsdp_unit_buffers(params_per_gpu, num_layers, zero_stage, gradient_bytes_per_param)
    return units.weights_bytes + units.gradient_bytes


def fsdp_unit_buffers(params_per_gpu: float, num_layers: int, zero_stage: int,
                      gradient_bytes_per_param: float = efficiency.TRAIN_BYTES_PER_PARAM_GRADIENTS
                      ) -> ModelStateBytes:
    """fsdp_unit_buffer_bytes as (gathered weights, unreduced gradients, no optimizer bytes):
    P = 1e9 over 10 layers at z = 3: weights 2 * 1e8 * 2 = 4e8 B, gradients 2 * 1e8 * 4 = 8e8 B."""
    if zero_stage < 2 or num_layers <= 0:
        return ModelStateBytes(0.0, 0.0, 0.0)
    per_layer = params_per_gpu / num_layers
    weights = efficiency.TRAIN_BYTES_PER_PARAM_WEIGHTS if zero_stage >= 3 else 0
    return ModelStateBytes(FSDP_UNIT_BUFFERS * per_layer * weights,
                           FSDP_UNIT_BUFFERS * per_layer * gradient_bytes_per_param, 0.0)


def fp8_gemms_per_layer(model: ModelSpec) -> int:
    """Transformer Engine GEMMs of one block: QKV, output projection, MLP up and down; an
    MoE block's experts run one up and one down GEMM each (TE GroupedLinear)."""
    return 2 + 2 * (model.num_local_experts if model.is_moe else 1)


def fp8_weight_cache_bytes(model: ModelSpec, tp: int, num_layers: float, dp: int, zero_stage: int,
                           ep: int = 1, recipe: str = "delayed") -> float:
    """--precision fp8, per GPU: num_layers * (c_w * W_lin/t + n_gemm * S_gemm), /d with ZeRO-3.

    W_lin/t the block's linear weights on one GPU (layer_linear_weights_per_gpu); c_w bytes
    each: delayed and tensorwise 2, the fp8 copy TE keeps across micro-batches and its
    transpose for the dgrad GEMM (efficiency.TRAIN_FP8_WEIGHT_CACHE_BYTES_PER_PARAM); mxfp8
    2.0625, the row-wise and column-wise MXFP8 copies with their 1/32 scales
    (TRAIN_MXFP8_WEIGHT_CACHE_BYTES_PER_PARAM); blockwise 2.0005, both fp8 copies with one fp32
    scale per 128x128 block (TRAIN_FP8_BLOCKWISE_WEIGHT_CACHE_BYTES_PER_PARAM). S_gemm: delayed scaling's amax histories and
    scales (TRAIN_FP8_SCALING_BYTES_PER_GEMM), 0 for the other recipes. The 16-bit
    weights stay (Megatron keeps bf16 params unless --fp8-param-gather, not emitted). The
    embedding and the LM head stay 16-bit: Megatron's output layer is a plain
    ColumnParallelLinear unless the MXFP8 recipe and --fp8-output-proj are set
    (megatron/core/models/gpt/gpt_model.py, core_v0.19.0; --fp8-output-proj not emitted).
    Assumption: ZeRO-3 (Megatron FSDP) keeps only its shard's copies between uses."""
    per_param = {"mxfp8": efficiency.TRAIN_MXFP8_WEIGHT_CACHE_BYTES_PER_PARAM,
                 "blockwise": efficiency.TRAIN_FP8_BLOCKWISE_WEIGHT_CACHE_BYTES_PER_PARAM}.get(
        recipe, efficiency.TRAIN_FP8_WEIGHT_CACHE_BYTES_PER_PARAM)
    scaling = efficiency.TRAIN_FP8_SCALING_BYTES_PER_GEMM if recipe == "delayed" else 0
    per_layer = layer_linear_weights_per_gpu(model, tp, ep) * per_param + fp8_gemms_per_layer(model) * scaling
    return num_layers * per_layer / (dp if zero_stage >= 3 else 1)
