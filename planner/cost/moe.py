"""Per-MoE-layer quantities shared by serving and training (pure; SI units).

Legend: E routed experts, e experts per token (top-k), h hidden size, t tensor-parallel
degree, ep expert-parallel degree, P_expert one routed expert's parameters.
Sources: docs/cost-model.md (Expert parallelism); DeepSeek-V3 technical report sec. 3.2;
Megatron-Core's alltoall token dispatcher (megatron/core/transformer/moe/token_dispatcher.py).
"""

from __future__ import annotations

from planner.cost.params import activation_bytes_per_element, expert_params
from planner.layout import Layout
from planner.specs import ModelSpec


def moe_layers_of(model: ModelSpec, num_layers: float) -> float:
    """MoE layers among num_layers consecutive ones (the mean block's share)."""
    return num_layers * model.num_moe_layers / model.num_hidden_layers if model.is_moe else 0.0


def routed_expert_flops(model: ModelSpec, num_layers: float, num_tokens: float) -> float:
    """2 * e * P_expert * tokens over the MoE layers among num_layers: the routed experts'
    share of the stage's forward FLOPs (all of its GPUs together)."""
    if not model.is_moe:
        return 0.0
    per_token = 2 * model.num_experts_per_tok * expert_params(model)
    return moe_layers_of(model, num_layers) * per_token * num_tokens


def expert_load_factor(layout: Layout, imbalance: float) -> float:
    """The busiest GPU's routed work over the mean: `imbalance` when whole experts sit on
    GPUs (EP: some experts are more popular than others), 1 when every expert is TP-split
    over the group (each GPU does 1/t of every expert)."""
    return imbalance if layout.ep > 1 else 1.0


def ep_alltoall_message_bytes(model: ModelSpec, layout: Layout, num_tokens: float) -> float:
    """S, what one GPU sends in one dispatch (and gets back in one combine): its share of the
    step's tokens (1/t of its replica's), each to e experts, h values each in the activation
    dtype: tokens / t * e * h * bytes."""
    return num_tokens / layout.tp * model.num_experts_per_tok * model.hidden_size * activation_bytes_per_element(model)
