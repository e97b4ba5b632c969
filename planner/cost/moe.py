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


def sequence_parallel_moe(layout: Layout) -> bool:
    """vLLM's use_sequence_parallel_moe (vllm/config/parallel.py at 0.33.0, default
    all2all_backend): EP over the TP ranks of several DP ranks (t > 1 and d > 1). Each TP
    rank then takes 1/t of its replica's tokens into the MoE layer (sequence_parallel_chunk)
    and the layer's output is all-gathered over TP instead of all-reduced."""
    return layout.ep > 1 and layout.tp > 1 and layout.dp_per_ep_group > 1


def ep_dispatch_bytes(model: ModelSpec, layout: Layout, num_tokens: float) -> float:
    """S of vLLM's dispatch (AgRsAll2AllManager.dispatch_router_logits,
    vllm/distributed/device_communicators/all2all.py at 0.33.0): the all-gathered buffer over
    the EP group, every token's hidden state and its E router logits:
    ep * N/t * (h + E) * bytes (_ep_group_buffer_bytes)."""
    return _ep_group_buffer_bytes(model, layout, num_tokens, model.hidden_size + model.num_local_experts)


def ep_combine_bytes(model: ModelSpec, layout: Layout, num_tokens: float) -> float:
    """S of vLLM's combine (AgRsAll2AllManager.combine): the reduce-scattered buffer, the
    partial outputs, h values per token: ep * N/t * h * bytes (_ep_group_buffer_bytes)."""
    return _ep_group_buffer_bytes(model, layout, num_tokens, model.hidden_size)


def _ep_group_buffer_bytes(model: ModelSpec, layout: Layout, num_tokens: float, values_per_token: int) -> float:
    """A buffer of `values_per_token` activation-dtype values for each of the EP group's
    ep * N/t tokens (ep ranks, N/t each; t = 1: a rank's own N). 0 when the EP group is one
    replica's TP group (d = 1): its tokens are already on every rank, and the MLP's TP
    all-reduce sums the experts' outputs."""
    if layout.ep <= 1 or layout.dp_per_ep_group <= 1 or not model.is_moe:
        return 0.0
    return layout.ep * num_tokens / layout.tp * values_per_token * activation_bytes_per_element(model)
