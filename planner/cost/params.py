"""Parameter counts and weight bytes of a decoder-only transformer.

Legend: L layers, h hidden size, a attention heads, k KV heads, d head dim,
f FFN size (per expert for MoE), V vocab, E experts, e experts per token,
t tensor-parallel degree. Counts are parameters (int); bytes are bytes (int or
float when quantized sizes are fractional per weight).
Sources: docs/cost-model.md#parameters-and-weight-bytes; Narayanan et al. 2021 sec. 5.1 eq. (2)
for the GPT check 12*L*h^2*(1 + 13/(12h) + (V+s)/(12*L*h)).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.specs import ModelSpec

BYTES_PER_ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1}
MATMUL_PRECISION_OF_DTYPE = {"float32": "tf32", "float16": "fp16", "bfloat16": "bf16"}
"""The tensor-core precision a checkpoint dtype's matmuls run in (fp32 weights use TF32)."""
INT4_BYTES_PER_WEIGHT = 0.5
INT4_SCALE_BYTES_PER_GROUP = 2.0 + 0.5
"""AWQ/GPTQ: an fp16 scale and a packed 4-bit zero point per group of weights."""
PER_CHANNEL_SCALE_BYTES = 4
"""fp8/int8 weight-only: one fp32 scale per output channel (row of ~h weights)."""


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a whole model (no parallelism)."""

    attention_per_layer: int
    mlp_per_layer: int
    """All experts (and the router) for MoE."""
    mlp_active_per_layer: int
    norms_per_layer: int
    embedding: int
    """Token (and learned position) embeddings."""
    lm_head: int
    """0 when tied to the embedding."""
    final_norm: int
    num_layers: int

    @property
    def per_layer(self) -> int:
        return self.attention_per_layer + self.mlp_per_layer + self.norms_per_layer

    @property
    def total(self) -> int:
        return self.num_layers * self.per_layer + self.embedding + self.lm_head + self.final_norm

    @property
    def active(self) -> int:
        """Parameters one token touches: experts_per_token experts, not all of them."""
        per_layer = self.attention_per_layer + self.mlp_active_per_layer + self.norms_per_layer
        return self.num_layers * per_layer + self.embedding + self.lm_head + self.final_norm


def attention_params_per_layer(model: ModelSpec) -> int:
    """Q h*a*d + K,V 2*h*k*d + O a*d*h, plus q/k/v(/o) biases where the model has them."""
    h, a, k, d = model.hidden_size, model.num_attention_heads, model.num_key_value_heads, model.head_dim
    weights = h * a * d + 2 * h * k * d + a * d * h
    qkv_bias = a * d + 2 * k * d if (model.attention_bias or model.qkv_bias) else 0
    out_bias = h if model.attention_bias else 0
    return weights + qkv_bias + out_bias


def mlp_params(model: ModelSpec, ffn_size: int) -> int:
    """Gated (SwiGLU) 3*h*f, standard (GPT) 2*h*f, plus biases where the model has them."""
    h = model.hidden_size
    num_up = 2 if model.gated_mlp else 1
    weights = (num_up + 1) * h * ffn_size
    biases = num_up * ffn_size + h if model.mlp_bias else 0
    return weights + biases


def norm_params(model: ModelSpec) -> int:
    """One norm: RMSNorm has a weight (h), LayerNorm a weight and a bias (2h)."""
    return model.hidden_size * (2 if model.norm_type == "layernorm" else 1)


def param_counts(model: ModelSpec) -> ParamCounts:
    h, v = model.hidden_size, model.vocab_size
    if model.is_moe:
        expert = mlp_params(model, model.expert_intermediate_size)
        router = h * model.num_local_experts
        shared = model.num_shared_experts * expert
        mlp = model.num_local_experts * expert + shared + router
        mlp_active = model.num_experts_per_tok * expert + shared + router
    else:
        mlp = mlp_active = mlp_params(model, model.intermediate_size)
    positions = model.max_position_embeddings * h if model.position_embedding == "learned" else 0
    return ParamCounts(
        attention_per_layer=attention_params_per_layer(model),
        mlp_per_layer=mlp,
        mlp_active_per_layer=mlp_active,
        norms_per_layer=2 * norm_params(model),
        embedding=v * h + positions,
        lm_head=0 if model.tie_word_embeddings else v * h,
        final_norm=norm_params(model),
        num_layers=model.num_hidden_layers,
    )


def activation_bytes_per_element(model: ModelSpec) -> int:
    """Activations, KV cache (auto), norms and embeddings stay in the model dtype."""
    return BYTES_PER_ELEMENT[model.dtype]


def linear_bytes_per_weight(model: ModelSpec) -> float:
    """Bytes per transformer-block matmul weight, quantization scales included.

    int4 (AWQ/GPTQ): 0.5 + 2.5/group (fp16 scale + 4-bit zero per group of 128: +3.9%).
    fp8/int8: 1 + 4/h (an fp32 scale per output channel of ~h inputs: <0.1%).
    Unquantized: the model dtype.
    """
    if model.quantization is None:
        return float(BYTES_PER_ELEMENT[model.dtype])
    if model.quantization == "int4":
        return INT4_BYTES_PER_WEIGHT + INT4_SCALE_BYTES_PER_GROUP / model.quantization_group_size
    return BYTES_PER_ELEMENT[model.quantization] + PER_CHANNEL_SCALE_BYTES / model.hidden_size


def linear_weights_per_layer(model: ModelSpec, counts: ParamCounts) -> int:
    """Matmul weights of one block (quantizable): everything but biases, norms, router."""
    h, a, k, d = model.hidden_size, model.num_attention_heads, model.num_key_value_heads, model.head_dim
    attention = h * a * d + 2 * h * k * d + a * d * h
    num_experts = (model.num_local_experts or 1) + model.num_shared_experts
    ffn = model.expert_intermediate_size if model.is_moe else model.intermediate_size
    mlp = num_experts * (3 if model.gated_mlp else 2) * h * ffn
    return attention + mlp


def weight_bytes(model: ModelSpec) -> float:
    """All weights: quantized block matmuls + dtype-sized embeddings, head, norms, biases."""
    counts = param_counts(model)
    linear = model.num_hidden_layers * linear_weights_per_layer(model, counts)
    other = counts.total - linear
    return linear * linear_bytes_per_weight(model) + other * BYTES_PER_ELEMENT[model.dtype]


def kv_bytes_per_token(model: ModelSpec, kv_cache_dtype: str = "auto") -> int:
    """Whole model, one token: 2 (K and V) * L * k * d * bytes per element."""
    return kv_bytes_per_token_per_gpu(model, model.num_hidden_layers, 1, kv_cache_dtype)


def kv_bytes_per_token_per_gpu(model: ModelSpec, num_layers: int, tp: int, kv_cache_dtype: str) -> int:
    """One GPU of a TP group holding num_layers layers: 2 (K, V) * L_s * max(1, k/t) * d *
    bytes per element (the model dtype's, or 1 for an fp8 KV cache)."""
    kv_bytes = 1 if kv_cache_dtype == "fp8" else activation_bytes_per_element(model)
    return 2 * num_layers * kv_heads_per_gpu(model, tp) * model.head_dim * kv_bytes


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """vLLM: KV heads split when k >= t, replicated (one per GPU) when t > k."""
    return max(1, model.num_key_value_heads // tp)


def tp_head_reasons(model: ModelSpec, tp: int) -> list[str]:
    """Why attention cannot split over t ranks: every rank needs whole query heads, and KV
    heads must either split evenly (k divisible by t) or replicate evenly (t divisible by
    k). The same rule in vLLM and Megatron-LM."""
    a, k = model.num_attention_heads, model.num_key_value_heads
    if a % tp:
        return [f"attention heads {a} not divisible by tp={tp}"]
    if k % tp and tp % k:
        return [f"KV heads {k} neither divisible by nor dividing tp={tp}"]
    return []


def layer_linear_weights_per_gpu(model: ModelSpec, tp: int) -> float:
    """One block's matmul weights on one GPU of a TP group: split by t, except the K and V
    projections, of which each GPU keeps max(1, k/t) heads (replicated when t > k)."""
    h, d = model.hidden_size, model.head_dim
    linear = linear_weights_per_layer(model, param_counts(model))
    kv_full = 2 * h * model.num_key_value_heads * d
    kv_per_gpu = 2 * h * kv_heads_per_gpu(model, tp) * d
    return (linear - kv_full) / tp + kv_per_gpu


def layer_other_params(model: ModelSpec) -> int:
    """One block's parameters outside its matmuls (norms, biases), kept whole on every GPU
    (a slight overcount for column-parallel biases)."""
    counts = param_counts(model)
    return counts.per_layer - linear_weights_per_layer(model, counts)


def layer_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """One block's parameters on one GPU of a TP group."""
    return layer_linear_weights_per_gpu(model, tp) + layer_other_params(model)


def layer_weight_bytes_per_gpu(model: ModelSpec, tp: int) -> float:
    """One block's weight bytes on one GPU: matmuls at the quantized size, the rest in the
    model dtype."""
    return (layer_linear_weights_per_gpu(model, tp) * linear_bytes_per_weight(model)
            + layer_other_params(model) * BYTES_PER_ELEMENT[model.dtype])


def matmul_precision_of_dtype(model: ModelSpec) -> str:
    """The model dtype's matmul precision (weight-only int4/int8 dequantise into it)."""
    return MATMUL_PRECISION_OF_DTYPE[model.dtype]
