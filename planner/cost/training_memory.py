"""Model-state memory of mixed-precision Adam training, per GPU, with its sharding.

Legend: P parameters held by one GPU (its pipeline stage, split by tensor parallelism),
d data-parallel degree, z ZeRO stage. Bytes per parameter: weights 2 (16-bit),
gradients 4 (Megatron's fp32 main grads), optimizer 12 (fp32 master, Adam m and v).
Sharding over d (Rajbhandari et al. 2020, ZeRO; Megatron's distributed optimizer is
z = 1): z >= 1 divides the optimizer, z >= 2 also the gradients, z = 3 also the weights.
Sources: Megatron-LM docs/api-guide/dist_optimizer.md; Rajbhandari et al. 2020 sec. 5;
docs/cost-model.md#training-model-state-memory-zero.
Pure and uncached: the training estimate memoises what a search asks for repeatedly.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import efficiency
from planner.cost.params import layer_params_per_gpu, param_counts
from planner.specs import ModelSpec


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a TP group holds on the first, a middle and the last stage."""

    first_stage: float
    last_stage: float
    middle_stage: float = 0.0
    """Blocks only (0 when pp <= 2: no middle stage)."""

    @property
    def worst(self) -> float:
        return max(self.first_stage, self.last_stage, self.middle_stage)


def stage_params_per_gpu(model: ModelSpec, tp: int, pp: int,
                         layers: tuple[int, int, int] | None = None) -> StageParams:
    """First stage: its blocks + vocab-parallel embedding V*h/t + learned positions.
    Last stage: its blocks + final norm + output layer V*h/t (with pp > 1 Megatron keeps
    a copy of tied embeddings there). Middle: its blocks. `layers` = (first, middle, last)
    blocks; None = L/p on every stage. pp = 1: one stage holding everything."""
    counts = param_counts(model)
    even = model.num_hidden_layers / pp
    first_blocks, middle_blocks, last_blocks = layers or (even, even if pp > 2 else 0, even)
    per_layer = layer_params_per_gpu(model, tp)
    vocab = model.vocab_size * model.hidden_size / tp
    positions = counts.embedding - model.vocab_size * model.hidden_size
    first = first_blocks * per_layer + vocab + positions
    head = vocab if (counts.lm_head or pp > 1) else 0.0
    last = last_blocks * per_layer + counts.final_norm + head
    if pp == 1:
        whole = first + last - last_blocks * per_layer
        return StageParams(whole, whole)
    return StageParams(first, last, middle_blocks * per_layer)


@dataclass(frozen=True)
class ModelStateBytes:
    weights_bytes: float
    gradient_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.gradient_bytes + self.optimizer_bytes


def model_state_bytes(params_per_gpu: float, dp: int, zero_stage: int) -> ModelStateBytes:
    """weights 2*P (/d if z = 3), gradients 4*P (/d if z >= 2), optimizer 12*P (/d if z >= 1)."""
    return ModelStateBytes(
        weights_bytes=params_per_gpu * efficiency.TRAIN_BYTES_PER_PARAM_WEIGHTS
        / (dp if zero_stage >= 3 else 1),
        gradient_bytes=params_per_gpu * efficiency.TRAIN_BYTES_PER_PARAM_GRADIENTS
        / (dp if zero_stage >= 2 else 1),
        optimizer_bytes=params_per_gpu * efficiency.TRAIN_BYTES_PER_PARAM_OPTIMIZER
        / (dp if zero_stage >= 1 else 1),
    )
