"""The model's facts a plan states once, above its layouts: parameter counts, KV bytes per
token at the plan's KV dtype, experts and attention kind. Read from the homes in
planner/cost/params.py; nothing here is a new formula."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.cost.params import (
    FP8_DS_MLA,
    kv_bytes_per_token,
    param_counts,
    recurrent_state_bytes_per_sequence,
)
from planner.specs import ModelSpec

Attention = Literal["mha", "gqa", "mqa", "mla"]


@dataclass(frozen=True)
class ModelSummary:
    total_params: int
    """The main model (ParamCounts.total): MTP layers are beside it, in mtp_params."""
    active_params: int
    """Parameters one token touches (experts_per_token routed experts, not all)."""
    mtp_params: int
    """Multi-token-prediction layers; 0 when the model has none."""
    kv_cache_bytes_per_token: int
    """Whole model (every attention layer, no parallelism), at kv_cache_dtype."""
    kv_cache_dtype: str
    """The KV cache's element type: fp8, or the model dtype when the request says auto."""
    num_experts: int
    """Routed experts per MoE layer; 0 for a dense model."""
    experts_per_token: int
    """Routed experts each token uses; 0 for a dense model."""
    num_shared_experts: int
    num_moe_layers: int
    attention: Attention
    weight_dtype: str
    """The block matmuls' storage type: the quantization when there is one, else the dtype."""
    secondary_weight_dtype: str | None = None
    """Mixed-precision checkpoints: the format of the block matmuls outside the quantization's
    scope (secondary_quantization); None = the dtype or the same as weight_dtype."""
    lm_head_weight_dtype: str | None = None
    """An LM head stored in a quantized format (lm_head_quantization); None = the dtype."""
    num_recurrent_layers: int = 0
    recurrent_kind: str | None = None
    recurrent_state_bytes_per_sequence: int = 0
    """Whole model (every recurrent layer, no parallelism): what each running sequence holds
    besides its KV."""


def attention_kind(model: ModelSpec) -> Attention:
    """MLA when a KV latent is cached; else by KV heads k of a heads: k = a MHA, k = 1 MQA,
    otherwise GQA."""
    if model.is_mla:
        return "mla"
    if model.num_key_value_heads == model.num_attention_heads:
        return "mha"
    return "mqa" if model.num_key_value_heads == 1 else "gqa"


def model_summary(model: ModelSpec, kv_cache_dtype: str = "auto") -> ModelSummary:
    """`kv_cache_dtype`: the plan's (ServeRequest.kv_cache_dtype; training caches no KV, so
    auto, the model dtype)."""
    counts = param_counts(model)
    return ModelSummary(
        total_params=counts.total,
        active_params=counts.active,
        mtp_params=counts.mtp,
        kv_cache_bytes_per_token=kv_bytes_per_token(model, kv_cache_dtype),
        kv_cache_dtype=kv_cache_dtype if kv_cache_dtype in ("fp8", FP8_DS_MLA) else model.dtype,
        num_experts=model.num_local_experts or 0,
        experts_per_token=model.num_experts_per_tok or 0,
        num_shared_experts=model.num_shared_experts,
        num_moe_layers=model.num_moe_layers,
        attention=attention_kind(model),
        weight_dtype=model.quantization or model.dtype,
        secondary_weight_dtype=model.secondary_quantization if model.quantization else None,
        lm_head_weight_dtype=None if model.tie_word_embeddings else model.lm_head_quantization,
        num_recurrent_layers=model.num_recurrent_layers,
        recurrent_kind=model.recurrent_kind,
        recurrent_state_bytes_per_sequence=recurrent_state_bytes_per_sequence(model, model.num_recurrent_layers),
    )
