"""Parameter counts and weight bytes of a decoder-only transformer.

Legend: L layers, h hidden size, a attention heads, k KV heads, d head dim of queries and
keys, d_v of values (v_head_dim; d unless given: MiMo-V2-Flash 128 beside 192) (Gemma 4's and
MiMo-V2-Flash's full-attention layers: k_g KV heads of d_g dims, F of them beside S
sliding-window layers),
f FFN size (per expert for MoE), V vocab, E experts, e experts per token,
t tensor-parallel degree. Hybrid models: L_a attention layers, R recurrent layers (Mamba2:
H heads of P dims, N state dims, G groups, K conv width, I = H*P; Gated DeltaNet: n_k key
and n_v value heads of d_k and d_v dims), each with a fixed state per sequence. Counts are parameters (int); bytes are bytes (int or
float when quantized sizes are fractional per weight).
Sources: docs/cost-model.md#parameters-and-weight-bytes; Narayanan et al. 2021 sec. 5.1 eq. (2)
for the GPT check 12*L*h^2*(1 + 13/(12h) + (V+s)/(12*L*h)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from planner.specs import GPU, ModelSpec, computed_once

BYTES_PER_ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "int8": 1}
MATMUL_PRECISION_OF_DTYPE = {"float32": "tf32", "float16": "fp16", "bfloat16": "bf16"}
"""The tensor-core precision a checkpoint dtype's matmuls run in (fp32 weights use TF32)."""
INT4_BYTES_PER_WEIGHT = 0.5
INT4_SCALE_BYTES_PER_GROUP = 2.0
"""int4: a 16-bit scale per group of weights (compressed-tensors' symmetric pack-quantized)."""
INT4_ZERO_POINT_BYTES_PER_GROUP = 0.5
"""AWQ/GPTQ: a packed 4-bit zero point per group beside the scale (quantization_zero_point)."""
INT8_ZERO_POINT_BYTES_PER_GROUP = 1
"""GPTQ 8-bit: one 8-bit zero point per group (qzeros, packed)."""
BLOCK_SCALED_BYTES = {"nvfp4": (0.5, 16, 1), "mxfp4": (0.5, 32, 1), "mxfp8": (1, 32, 1)}
"""Bytes per value, weights per block and scale bytes per block: NVFP4 an FP8 E4M3 scale per
16 FP4 values, MXFP4 and MXFP8 an E8M0 scale per 32 (sources in bytes_per_weight)."""
PER_CHANNEL_SCALE_BYTES = 4
"""fp8/int8 weight-only: one fp32 scale per output channel (row of ~h weights)."""
INDEXER_SCALE_BLOCK = 128
"""DSA indexer keys: one fp32 scale per 128 fp8 values."""
FP8_DS_MLA = "fp8_ds_mla"
"""DeepSeek's fp8 MLA cache layout (kv_cache_format): per token and layer the latent in fp8
with an fp32 scale per 128 values, the RoPE key in 16 bits (656 bytes for DeepSeek-V3.2:
vllm/v1/attention/backends/mla/flashmla_sparse.py and mla_attention.py get_kv_cache_spec at 0.33.0)."""
DS_MLA_SCALE_BLOCK = 128
"""fp8_ds_mla: one fp32 scale per 128 latent values."""
HOPPER_COMPUTE_CAPABILITY_MAJOR = 9


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a whole model (no parallelism)."""

    attention_per_layer: float
    """The mean attention layer (int unless the full and window layers differ, Gemma 4)."""
    mlp_per_layer: int
    """All experts (and the router) of an MoE layer; the MLP of a dense model's layer."""
    mlp_active_per_layer: int
    norms_per_layer: int
    embedding: int
    """Token (and learned position) embeddings."""
    lm_head: int
    """0 when tied to the embedding."""
    final_norm: int
    num_layers: int
    num_dense_layers: int = 0
    """MoE models: layers with a dense MLP (dense_mlp_per_layer) instead of experts."""
    dense_mlp_per_layer: int = 0
    mtp: int = 0
    """Multi-token-prediction layers, reported beside the total (not in it)."""
    recurrent_per_layer: int = 0
    """One recurrent mixer (Mamba2 or Gated DeltaNet), its inner norm included."""
    num_recurrent_layers: int = 0
    num_mlp_only_layers: int = 0
    """Layers with an MLP/MoE and no mixer (no attention, no recurrent block, one norm)."""
    num_mixer_only_layers: int = 0
    """Layers with a mixer and no MLP (one norm)."""

    @property
    def num_attention_layers(self) -> int:
        return self.num_layers - self.num_recurrent_layers - self.num_mlp_only_layers

    @property
    def num_mlp_layers_of_mlp_per_layer(self) -> int:
        """Layers whose MLP is mlp_per_layer (MoE layers; every MLP of a dense model)."""
        return self.num_layers - self.num_mixer_only_layers - self.num_dense_layers

    def _blocks(self, mlp_per_layer: float) -> float:
        norms = (2 * self.num_layers - self.num_mlp_only_layers - self.num_mixer_only_layers) * self.norms_per_layer / 2
        return (self.num_attention_layers * self.attention_per_layer
                + self.num_recurrent_layers * self.recurrent_per_layer + norms
                + self.num_mlp_layers_of_mlp_per_layer * mlp_per_layer
                + self.num_dense_layers * self.dense_mlp_per_layer)

    @property
    def blocks(self) -> int:
        """All blocks: L_a attention + R recurrent mixers + their norms (two per layer, one in a
        mixer-only or MLP-only layer) + MoE layers' MLPs + dense layers' MLPs."""
        return round(self._blocks(self.mlp_per_layer))

    @property
    def per_layer(self) -> float:
        """The mean block (exact when every layer is alike)."""
        return self.blocks / self.num_layers

    @property
    def active_per_layer(self) -> float:
        """The mean block's parameters one token touches."""
        return self._blocks(self.mlp_active_per_layer) / self.num_layers

    @property
    def total(self) -> int:
        return self.blocks + self.embedding + self.lm_head + self.final_norm

    @property
    def active(self) -> int:
        """Parameters one token touches: experts_per_token experts, not all of them."""
        return round(self.num_layers * self.active_per_layer) + self.embedding + self.lm_head + self.final_norm


def attention_params_per_layer(model: ModelSpec) -> float:
    """Q h*a*d (2*h*a*d with an output gate) + K h*k*d + V h*k*d_v + O a*d_v*h, plus q/k/v(/o) biases
    where the model has them; MLA: its projections (mla_attention_weights) plus the q_a and
    kv_a RMSNorms. Two layer shapes (Gemma 4): the mean attention layer
    (attention_linear_weights)."""
    if model.is_mla:
        indexer_norm = 2 * model.index_head_dim if model.index_head_dim else 0  # k_norm LayerNorm
        return (sum(mla_attention_weights(model)) + (model.q_lora_rank or 0) + model.kv_lora_rank
                + indexer_norm)
    h, a = model.hidden_size, model.num_attention_heads
    k, d, d_v, _ = attention_shape(model, False)
    weights = attention_linear_weights(model)
    qkv_bias = a * d + k * (d + d_v) if (model.attention_bias or model.qkv_bias) else 0
    out_bias = h if model.attention_bias else 0
    return weights + qkv_bias + out_bias


def mla_attention_weights(model: ModelSpec) -> tuple[int, int]:
    """MLA matmul weights of one layer as (replicated under TP, split under TP).

    transformers models/deepseek_v3/modeling_deepseek_v3.py DeepseekV3Attention: q_a_proj
    h*r_q and q_b_proj r_q*a*(d_nope+d_rope) (or q_proj h*a*(d_nope+d_rope) when
    q_lora_rank is None), kv_a_proj_with_mqa h*(r_kv+d_rope), kv_b_proj
    r_kv*a*(d_nope+d_v), o_proj a*d_v*h. vLLM's DeepseekV2MLAAttention keeps the two
    down-projections (q_a, kv_a) whole on every rank and splits the rest by heads.

    A DSA lightning indexer (DeepSeek-V3.2 inference/model.py `Indexer`) adds wq_b
    r_q*n_i*d_i, wk h*d_i and weights_proj h*n_i, which vLLM keeps whole on every rank."""
    h, a, r_q, r_kv = model.hidden_size, model.num_attention_heads, model.q_lora_rank, model.kv_lora_rank
    d_qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    replicated = h * (r_kv + model.qk_rope_head_dim) + (h * r_q if r_q else 0)
    if model.index_n_heads:
        n_i, d_i = model.index_n_heads, model.index_head_dim
        replicated += r_q * n_i * d_i + h * d_i + h * n_i
    query = r_q * a * d_qk if r_q else h * a * d_qk
    split = query + r_kv * a * (model.qk_nope_head_dim + model.v_head_dim) + a * model.v_head_dim * h
    return replicated, split


def recurrent_weights(model: ModelSpec) -> tuple[int, int]:
    """One recurrent mixer's parameters as (matmul weights, the rest), as transformers builds it.

    Mamba2 (models/nemotron_h/modeling_nemotron_h.py NemotronHMamba2Mixer), I = H*P,
    C = I + 2*G*N (conv channels): in_proj h*(I + C + H) + out_proj I*h; conv1d C*K + C bias,
    dt_bias, A_log, D 3*H, gated RMSNorm I.
    Gated DeltaNet (models/qwen3_5/modular_qwen3_5.py Qwen3_5GatedDeltaNet, from
    Qwen3NextGatedDeltaNet), C = 2*n_k*d_k + n_v*d_v: in_proj_qkv h*C, in_proj_z h*n_v*d_v,
    in_proj_b and in_proj_a h*n_v each, out_proj n_v*d_v*h; conv1d C*K (no bias), dt_bias
    and A_log 2*n_v, gated RMSNorm d_v."""
    h, kernel = model.hidden_size, model.conv_kernel
    width_in, width_out = recurrent_projection_widths(model)
    matmuls = h * width_in + width_out * h
    if model.recurrent_kind == "mamba2":
        heads, inner = model.mamba_num_heads, model.mamba_num_heads * model.mamba_head_dim
        channels = inner + 2 * model.n_groups * model.ssm_state_size
        return matmuls, channels * kernel + channels + 3 * heads + inner
    if model.recurrent_kind == "gated_deltanet":
        heads, value = model.linear_num_value_heads, model.linear_num_value_heads * model.linear_value_head_dim
        channels = 2 * model.linear_num_key_heads * model.linear_key_head_dim + value
        return matmuls, channels * kernel + 2 * heads + model.linear_value_head_dim
    return 0, 0


def recurrent_projection_widths(model: ModelSpec) -> tuple[int, int]:
    """A recurrent mixer's (input projection outputs, output projection inputs): Mamba2
    (I + C + H, I); Gated DeltaNet (C + n_v*d_v + 2*n_v, n_v*d_v) (recurrent_weights); (0, 0)
    without one."""
    if model.recurrent_kind == "mamba2":
        heads, inner = model.mamba_num_heads, model.mamba_num_heads * model.mamba_head_dim
        return 2 * inner + 2 * model.n_groups * model.ssm_state_size + heads, inner
    if model.recurrent_kind == "gated_deltanet":
        heads, value = model.linear_num_value_heads, model.linear_num_value_heads * model.linear_value_head_dim
        return 2 * model.linear_num_key_heads * model.linear_key_head_dim + 2 * value + 2 * heads, value
    return 0, 0


def recurrent_params_per_layer(model: ModelSpec) -> int:
    """One recurrent mixer's parameters (recurrent_weights, both parts); 0 without one.
    Nemotron-H-56B (h 8192, H 256, P 64, N 256, G 8, K 4): I = 16,384, C = 20,480;
    8192*37,120 + 16,384*8192 + 20,480*5 + 3*256 + 16,384 = 438,424,320."""
    return sum(recurrent_weights(model))


def recurrent_state_elements_per_gpu(model: ModelSpec, tp: int) -> tuple[int, int]:
    """One sequence's state in one recurrent layer on one GPU of a TP group, as (convolution,
    recurrent) elements: the conv keeps its last K - 1 inputs of every channel it sees, the
    recurrence one matrix per head. TP splits heads (and Mamba2's groups, Gated DeltaNet's key
    heads, replicated one per GPU when t exceeds them, as KV heads).
    Mamba2: conv (K-1) * (I/t + 2*max(1, G/t)*N), SSM (H/t) * P * N (vLLM MambaSpec shapes,
    vllm/model_executor/layers/mamba/mamba_utils.py mamba2_state_shape).
    Gated DeltaNet: conv (K-1) * (2*max(1, n_k/t)*d_k + n_v/t*d_v), state (n_v/t) * d_k * d_v
    (gated_delta_net_state_shape)."""
    kernel = model.conv_kernel
    if model.recurrent_kind == "mamba2":
        heads = model.mamba_num_heads // tp
        groups = max(1, model.n_groups // tp)
        conv = (kernel - 1) * (heads * model.mamba_head_dim + 2 * groups * model.ssm_state_size)
        return conv, heads * model.mamba_head_dim * model.ssm_state_size
    if model.recurrent_kind == "gated_deltanet":
        keys, values = max(1, model.linear_num_key_heads // tp), model.linear_num_value_heads // tp
        d_k, d_v = model.linear_key_head_dim, model.linear_value_head_dim
        return (kernel - 1) * (2 * keys * d_k + values * d_v), values * d_k * d_v
    return 0, 0


def recurrent_state_bytes_per_sequence(model: ModelSpec, num_layers: int = 1, tp: int = 1) -> int:
    """One sequence's recurrent state on one GPU holding num_layers recurrent layers:
    num_layers * (conv elements * e_model + recurrent elements * e_state), e_state the bytes of
    recurrent_state_dtype (vLLM: mamba_ssm_cache_dtype, float32 for Nemotron-H by default, its
    NemotronHForCausalLMConfig; the conv state in the model dtype).
    Nemotron-H-56B, t = 1: conv 3 * 20,480 * 2 B = 122,880; SSM 256 * 64 * 256 * 4 B =
    16,777,216; 16,900,096 B per Mamba layer."""
    conv, state = recurrent_state_elements_per_gpu(model, tp)
    state_bytes = BYTES_PER_ELEMENT[model.recurrent_state_dtype or model.dtype]
    return num_layers * (conv * activation_bytes_per_element(model) + state * state_bytes)


def num_attention_layers(model: ModelSpec) -> int:
    """Layers with attention (and a KV cache): L - R - MLP-only layers."""
    return model.num_hidden_layers - model.num_recurrent_layers - model.num_mlp_only_layers


def sublayers_per_layer(model: ModelSpec) -> float:
    """The mean block's share of a full layer's two sublayers (mixer, MLP):
    (2L - MLP-only - mixer-only) / (2L). 1 for a transformer; 1/2 for Nemotron-H, whose blocks
    hold one mixer each (one residual all-reduce under TP, about half the kernels)."""
    layers = model.num_hidden_layers
    return (2 * layers - model.num_mlp_only_layers - model.num_mixer_only_layers) / (2 * layers)


def num_dense_mlp_layers(model: ModelSpec) -> int:
    """Layers with a dense MLP: an MoE model's num_dense_layers, every layer of a dense one,
    less the mixer-only layers (which have no MLP)."""
    dense = model.num_dense_layers if model.is_moe else model.num_hidden_layers
    return dense - model.num_mixer_only_layers


def mlp_params(model: ModelSpec, ffn_size: int, width: int | None = None) -> int:
    """Gated (SwiGLU) 3*w*f, standard (GPT) 2*w*f, plus biases where the model has them;
    w = h unless an expert works in a latent width."""
    h = width or model.hidden_size
    num_up = 2 if model.gated_mlp else 1
    weights = (num_up + 1) * h * ffn_size
    biases = num_up * ffn_size + h if model.mlp_bias else 0
    return weights + biases


def norm_params(model: ModelSpec) -> int:
    """One norm: RMSNorm has a weight (h), LayerNorm a weight and a bias (2h)."""
    return model.hidden_size * (2 if model.norm_type == "layernorm" else 1)


def shared_expert_size(model: ModelSpec) -> int:
    return model.shared_expert_intermediate_size or model.expert_intermediate_size


def mlp_width_per_token(model: ModelSpec) -> float:
    """The MLP intermediates one token produces in a layer, over the mean layer: the FFN width,
    or for MoE the routed experts' (top-k x expert width) plus the shared experts' on the MoE
    layers and intermediate_size on the dense ones (DeepSeek-V3: 3 of 61 layers). What the
    activation function reads and writes, and what training keeps of it; Mixtral's 2 x 14,336
    per token, not the one expert's intermediate_size."""
    if not model.is_moe:
        return model.intermediate_size
    moe = model.num_experts_per_tok * model.expert_intermediate_size + model.num_shared_experts * shared_expert_size(model)
    return (model.num_moe_layers * moe + model.num_dense_layers * model.intermediate_size) / model.num_hidden_layers


def expert_params(model: ModelSpec) -> int:
    """One routed expert: mlp_params at f_e, in the latent width when moe_latent_size is set."""
    return mlp_params(model, model.expert_intermediate_size, model.moe_latent_size)


def latent_projection_params(model: ModelSpec) -> int:
    """Latent MoE (NemotronHMoE fc1_latent_proj, fc2_latent_proj): 2*h*latent, else 0."""
    return 2 * model.hidden_size * model.moe_latent_size if model.moe_latent_size else 0


def moe_mlp_params(model: ModelSpec) -> tuple[int, int]:
    """One MoE layer's MLP as (all, active): E routed experts (e active) + shared experts,
    always active, + the router h*E (+ the latent projections)."""
    expert = expert_params(model)
    router = model.hidden_size * model.num_local_experts + latent_projection_params(model)
    shared = model.num_shared_experts * mlp_params(model, shared_expert_size(model))
    return (model.num_local_experts * expert + shared + router,
            model.num_experts_per_tok * expert + shared + router)


@computed_once
def param_counts(model: ModelSpec) -> ParamCounts:
    h, v = model.hidden_size, model.vocab_size
    dense = mlp_params(model, model.intermediate_size)
    mlp, mlp_active = moe_mlp_params(model) if model.is_moe else (dense, dense)
    positions = model.max_position_embeddings * h if model.position_embedding == "learned" else 0
    attention, norms = attention_params_per_layer(model), 2 * norm_params(model)
    # An MTP module (DeepSeek-V3 sec. 2.2): a block (MoE when the model is) plus two RMSNorms
    # and an h x 2h projection; it shares the embedding and output head.
    mtp_block = attention + norms + (mlp if model.is_moe else dense) + 2 * h + 2 * h * h
    return ParamCounts(
        attention_per_layer=attention,
        mlp_per_layer=mlp,
        mlp_active_per_layer=mlp_active,
        norms_per_layer=norms,
        embedding=v * h + positions,
        lm_head=0 if model.tie_word_embeddings else v * h,
        final_norm=norm_params(model),
        num_layers=model.num_hidden_layers,
        num_dense_layers=num_dense_mlp_layers(model) if model.is_moe else 0,
        dense_mlp_per_layer=dense if model.num_dense_layers else 0,
        mtp=model.num_mtp_layers * mtp_block,
        recurrent_per_layer=recurrent_params_per_layer(model),
        num_recurrent_layers=model.num_recurrent_layers,
        num_mlp_only_layers=model.num_mlp_only_layers,
        num_mixer_only_layers=model.num_mixer_only_layers,
    )


def activation_bytes_per_element(model: ModelSpec) -> int:
    """Activations, KV cache (auto), norms and embeddings stay in the model dtype."""
    return BYTES_PER_ELEMENT[model.dtype]


def linear_bytes_per_weight(model: ModelSpec) -> float:
    """Bytes per matmul weight in the main format (`quantization`), scales included."""
    return bytes_per_weight(model, model.quantization)


def bytes_per_weight(model: ModelSpec, weight_format: str | None) -> float:
    """Bytes per stored matmul weight of a format, quantization scales included.

    int4 (AWQ/GPTQ): 0.5 + 2.5/group (fp16 scale + 4-bit zero per group of 128: +3.9%);
    without zero points (symmetric compressed-tensors) 0.5 + 2/group: Kimi-K2.5's experts at
    group 32, 0.5625.
    fp8/int8: 1 + 4/h (an fp32 scale per output channel of ~h inputs: <0.1%; DeepSeek's
    fp8 with one fp32 scale per 128x128 block is 1 + 4/16384, 0.04% less). int8 in groups
    smaller than h (GPTQ 8-bit, group 128): 1 + (2 + 1)/128 = 1.0234, an fp16 scale and an
    8-bit zero point per group (1 + 2/128 without zero points).
    nvfp4: 0.5 + 1/16 (FP4 E2M1 values, one FP8 E4M3 scale per block of 16; NVIDIA,
    "Introducing NVFP4", 2025; the per-tensor fp32 scale is negligible).
    mxfp4: 0.5 + 1/32 (FP4 E2M1 values, one E8M0 scale per block of 32; OCP Microscaling
    Formats (MX) v1.0, sec. 5).
    mxfp8: 1 + 1/32 (FP8 values, one E8M0 scale per block of 32; OCP MX v1.0, sec. 5).
    None: the model dtype.
    """
    if weight_format is None:
        return float(BYTES_PER_ELEMENT[model.dtype])
    if weight_format == "int4":
        per_group = INT4_SCALE_BYTES_PER_GROUP + (INT4_ZERO_POINT_BYTES_PER_GROUP if model.quantization_zero_point else 0)
        return INT4_BYTES_PER_WEIGHT + per_group / model.quantization_group_size
    if weight_format in BLOCK_SCALED_BYTES:
        value_bytes, block, scale_bytes = BLOCK_SCALED_BYTES[weight_format]
        return value_bytes + scale_bytes / block
    if weight_format == "int8" and model.quantization_group_size < model.hidden_size:
        # GPTQ 8-bit in groups: an fp16 scale and an 8-bit zero point per group (qzeros)
        per_group = INT4_SCALE_BYTES_PER_GROUP + (INT8_ZERO_POINT_BYTES_PER_GROUP if model.quantization_zero_point else 0)
        return BYTES_PER_ELEMENT["int8"] + per_group / model.quantization_group_size
    return BYTES_PER_ELEMENT[weight_format] + PER_CHANNEL_SCALE_BYTES / model.hidden_size


class AttentionShape(NamedTuple):
    """One attention layer kind's shape: KV heads, query/key head dim, value head dim, and how
    many KV projections the checkpoint holds (2: K and V; 1: Gemma 4's K that is also V)."""

    kv_heads: int
    key_dim: int
    value_dim: int
    kv_projections: int


def attention_shape(model: ModelSpec, full: bool) -> AttentionShape:
    """The shape of a full-attention (full=True) or sliding-window layer. Full layers may have
    their own KV heads k_g (num_global_key_value_heads) and head dim d_g (global_head_dim):
    Gemma 4 (transformers models/gemma4/modeling_gemma4.py Gemma4TextAttention; with
    attention_k_eq_v one projection that is both K and V: v_proj is None, value_states =
    k_proj(x)) and MiMo-V2-Flash (4 KV heads on its full layers, 8 on its window layers:
    vllm/model_executor/models/mimo_v2_flash.py MiMoV2Attention, hybrid_layer_pattern 1 =
    sliding window). The value head dim is v_head_dim on every layer when given (MiMo-V2-Flash
    128 beside a key dim of 192), else the layer's key dim; every other model has one shape,
    (k, d, d, 2). MLA layers are described by mla_attention_weights, not by this shape."""
    value_dim = None if model.is_mla else model.v_head_dim  # MLA's d_v belongs to its latent form
    if not full:
        return AttentionShape(model.num_key_value_heads, model.head_dim, value_dim or model.head_dim, 2)
    key_dim = model.global_head_dim or model.head_dim
    return AttentionShape(model.num_global_key_value_heads or model.num_key_value_heads, key_dim,
                          value_dim or key_dim, 1 if model.attention_k_eq_v else 2)


def multiply_adds_per_attention_pair(model: ModelSpec) -> tuple[int, int]:
    """(full, window): multiply-adds of one (query, key) pair in one layer of each kind, over
    all heads: a * d for the score q.k plus a * d_v for adding p * v to the context, with the
    kind's dims (attention_shape). MiMo-V2-Flash: 64 * (192 + 128) = 20,480 on both kinds;
    Gemma-4-26B-A4B: full 16 * (512 + 512) = 16,384, window 16 * (256 + 256) = 8,192.
    MLA prompts run as ordinary attention over the up-projected keys and values (vLLM's MLA
    backends, vllm/v1/attention/backends/mla/common.py, prefill path): a * (d_nope + d_rope +
    d_v), DeepSeek-V3 128 * (128 + 64 + 128) = 40,960."""
    a = model.num_attention_heads
    if model.is_mla:
        mla = a * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
        return mla, mla
    full, window = attention_shape(model, True), attention_shape(model, False)
    return a * (full.key_dim + full.value_dim), a * (window.key_dim + window.value_dim)


def has_two_attention_shapes(model: ModelSpec) -> bool:
    return attention_shape(model, True) != attention_shape(model, False)


def num_full_attention_layers(model: ModelSpec) -> int:
    """F = L_a - S: attention layers that attend to the whole context."""
    return num_attention_layers(model) - min(model.num_window_layers, num_attention_layers(model))


def mean_over_attention_kinds(model: ModelSpec, full: float, window: float) -> float:
    """(F * full + S * window) / (F + S): the mean attention layer of a per-kind quantity;
    `window` itself when both kinds share one shape (every model but Gemma 4)."""
    if not has_two_attention_shapes(model):
        return window
    num_full = num_full_attention_layers(model)
    return (num_full * full + (num_attention_layers(model) - num_full) * window) / num_attention_layers(model)


def attention_linear_weights_of_kind(model: ModelSpec, full: bool) -> int:
    """One attention layer's matmul weights (no biases, no norms): Q h*a*d (doubled by an
    output gate) + K h*k*d + V h*k*d_v (none when K is V) + O a*d_v*h, with the layer kind's
    shape (attention_shape). Gemma-4-26B-A4B: sliding 2*2816*16*256 + 2*2816*8*256 =
    34,603,008; global 2*2816*16*512 + 2816*2*512 = 49,020,928. MiMo-V2-Flash (h 4096, a 64,
    d 192, d_v 128): full (k 4) 4096*64*192 + 4096*4*(192+128) + 64*128*4096 = 89,128,960;
    window (k 8) 4096*64*192 + 4096*8*(192+128) + 64*128*4096 = 94,371,840."""
    h, a = model.hidden_size, model.num_attention_heads
    k, d, d_v, num_kv = attention_shape(model, full)
    value = h * k * d_v if num_kv == 2 else 0
    return (2 if model.attention_output_gate else 1) * h * a * d + h * k * d + value + a * d_v * h


def attention_linear_weights(model: ModelSpec) -> float:
    """The mean attention layer's matmul weights (mean_over_attention_kinds); MLA's projections."""
    if model.is_mla:
        return sum(mla_attention_weights(model))
    return mean_over_attention_kinds(model, attention_linear_weights_of_kind(model, True),
                                     attention_linear_weights_of_kind(model, False))


def mixer_linear_weights(model: ModelSpec) -> float:
    """The mean block's token-mixer matmul weights: (L_a * attention + R * recurrent) / L."""
    return ((num_attention_layers(model) * attention_linear_weights(model)
             + model.num_recurrent_layers * recurrent_weights(model)[0]) / model.num_hidden_layers)


def mlp_linear_weights(model: ModelSpec) -> tuple[float, float]:
    """The mean block's MLP matmul weights as (routed experts, other: dense, shared, latent
    projections)."""
    per_ffn = (3 if model.gated_mlp else 2) * model.hidden_size
    num_layers = model.num_hidden_layers
    dense = per_ffn * model.intermediate_size * num_dense_mlp_layers(model) / num_layers
    if not model.is_moe:
        return 0.0, float(dense)
    routed = model.num_local_experts * (expert_params(model) - expert_bias_params(model))
    shared = model.num_shared_experts * per_ffn * shared_expert_size(model) + latent_projection_params(model)
    return (routed * model.num_moe_layers / num_layers,
            shared * model.num_moe_layers / num_layers + dense)


def expert_bias_params(model: ModelSpec) -> int:
    """One routed expert's MLP biases (0 without mlp_bias)."""
    width = model.moe_latent_size or model.hidden_size
    return (2 if model.gated_mlp else 1) * model.expert_intermediate_size + width if model.mlp_bias else 0


def linear_weights_per_layer(model: ModelSpec, counts: ParamCounts | None = None) -> float:
    """Matmul weights of the mean block: everything but biases, norms, router."""
    return mixer_linear_weights(model) + sum(mlp_linear_weights(model))


def matmul_formats_by_kind(model: ModelSpec) -> tuple[str | None, str | None, str | None]:
    """The stored format of a block's (mixer: attention and recurrent projections, routed
    experts, other MLP: dense, shared, latent projections) matmuls, None for the dtype:
    `quantization` over quantization_scope, secondary_quantization (else the dtype) over the
    rest; all in the dtype without quantization."""
    main, rest = model.quantization, model.secondary_quantization if model.quantization else None
    scope = model.quantization_scope
    return (main if scope == "all" else rest, main, rest if scope == "experts" else main)


def matmul_bytes(model: ModelSpec, attention: float, routed: float, other: float) -> float:
    """A block's matmul bytes from its (mixer, routed-expert, other MLP) weights:
    sum of weights * bytes_per_weight of the kind's format (matmul_formats_by_kind)."""
    formats = matmul_formats_by_kind(model)
    return sum(weights * bytes_per_weight(model, weight_format)
               for weights, weight_format in zip((attention, routed, other), formats, strict=True))


def lm_head_bytes_per_weight(model: ModelSpec) -> float:
    """An untied LM head's format (lm_head_quantization), else the dtype (a tied head is the
    embedding)."""
    tied = model.tie_word_embeddings
    return bytes_per_weight(model, None if tied else model.lm_head_quantization)


def weight_bytes(model: ModelSpec) -> float:
    """All weights: block matmuls in their kinds' formats (matmul_bytes), the LM head in its
    format, and dtype-sized embeddings, norms, biases and router."""
    counts = param_counts(model)
    kinds = (mixer_linear_weights(model), *mlp_linear_weights(model))
    matmuls = model.num_hidden_layers * sum(kinds)
    other = counts.total - matmuls - counts.lm_head
    return (model.num_hidden_layers * matmul_bytes(model, *kinds)
            + counts.lm_head * lm_head_bytes_per_weight(model) + other * BYTES_PER_ELEMENT[model.dtype])


def kv_bytes_per_token(model: ModelSpec, kv_cache_dtype: str = "auto") -> int:
    """Whole model, one token: L_a * k * (d + d_v) * bytes per element (K and V), L_a the
    attention layers (recurrent and MLP-only layers keep no KV cache); two layer shapes
    (Gemma 4, MiMo-V2-Flash) per kind, (F * k_g * (d_g + d_v) + S * k * (d + d_v)) * bytes."""
    window = min(model.num_window_layers, num_attention_layers(model))
    return kv_bytes_per_token_per_gpu(model, num_attention_layers(model), 1, kv_cache_dtype, window)


@computed_once
def kv_bytes_per_token_per_layer_by_kind(model: ModelSpec, tp: int, kv_cache_dtype: str) -> tuple[int, int]:
    """(full, window): one token in one full-attention and one sliding-window layer on one GPU
    of a TP group, max(1, k/t) * (d + d_v) * bytes per element (K and V; the model dtype's,
    or 1 for an fp8 KV cache), with the kind's shape (attention_shape).

    Gemma 4's attention_k_eq_v layers still cache K and V, each k_g * d_g wide: V is the K
    projection without k_norm's scale and the RoPE, so the two differ, and vLLM
    (vllm/model_executor/models/gemma4.py Gemma4Attention) loads k_proj into both the K and V
    slots of its QKVParallelLinear and builds an ordinary Attention over them.
    MLA: (r_kv + d_rope) * bytes: one latent and one RoPE key per token and layer, shared by
    all heads, so every rank of a TP group holds all of it (DeepSeek-V2 sec. 2.1.2; vLLM's MLA
    backends cache kv_lora_rank + qk_rope_head_dim per token); in fp8_ds_mla (kv_cache_format)
    r_kv * (1 + 4/128) + d_rope * 2."""
    kv_bytes = 1 if kv_cache_dtype in ("fp8", FP8_DS_MLA) else activation_bytes_per_element(model)
    if model.is_mla:
        if kv_cache_dtype == FP8_DS_MLA:
            latent = (model.kv_lora_rank * (1 + PER_CHANNEL_SCALE_BYTES / DS_MLA_SCALE_BLOCK)
                      + model.qk_rope_head_dim * activation_bytes_per_element(model))
        else:
            latent = (model.kv_lora_rank + model.qk_rope_head_dim) * kv_bytes
        latent = int(latent) + indexer_key_bytes(model)
        return latent, latent
    full, window = attention_shape(model, True), attention_shape(model, False)
    return (max(1, full.kv_heads // tp) * (full.key_dim + full.value_dim) * kv_bytes,
            kv_heads_per_gpu(model, tp) * (window.key_dim + window.value_dim) * kv_bytes)


def kv_cache_format(model: ModelSpec, gpu: GPU, kv_cache_dtype: str) -> str:
    """The layout vLLM 0.33.0 stores --kv-cache-dtype in: a DSA model (index_head_dim) with an
    fp8 cache on Hopper runs FLASHMLA_SPARSE (FLASH_ATTN_MLA_SPARSE, first in the SM90 list of
    vllm/platforms/cuda.py, takes no fp8 cache), which serves fp8 as fp8_ds_mla
    (_canonicalize_sparse_mla_kv_cache_dtype in model_executor/layers/attention/mla_attention.py):
    r_kv fp8 values, an fp32 scale per 128 of them and d_rope 16-bit values, 512 + 16 + 128 = 656
    bytes for DeepSeek-V3.2 against 576 as plain fp8. On Blackwell FLASHINFER_MLA_SPARSE comes
    first for an fp8 cache and keeps plain fp8. Else the dtype as given."""
    hopper = gpu.compute_capability is not None and int(gpu.compute_capability) == HOPPER_COMPUTE_CAPABILITY_MAJOR
    if kv_cache_dtype == "fp8" and model.is_mla and model.index_head_dim and hopper:
        return FP8_DS_MLA
    return kv_cache_dtype


def kv_bytes_per_token_per_gpu(model: ModelSpec, num_layers: int, tp: int, kv_cache_dtype: str,
                               num_window_layers: int = 0) -> int:
    """One GPU of a TP group holding num_layers attention layers, num_window_layers of them
    sliding-window: (L_s - S_s) * full + S_s * window (kv_bytes_per_token_per_layer_by_kind;
    the two are equal unless the model has two attention shapes)."""
    full, window = kv_bytes_per_token_per_layer_by_kind(model, tp, kv_cache_dtype)
    return (num_layers - num_window_layers) * full + num_window_layers * window


def indexer_key_bytes(model: ModelSpec) -> int:
    """DSA: the indexer's key per token and layer, d_i fp8 values + an fp32 scale per 128
    (vLLM's DeepseekV32IndexerCache: d_i + d_i/128*4 bytes, 132 for d_i = 128), whatever the
    KV cache dtype; 0 without DSA."""
    d_i = model.index_head_dim or 0
    return d_i + d_i // INDEXER_SCALE_BLOCK * PER_CHANNEL_SCALE_BYTES


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """vLLM: KV heads split when k >= t, replicated (one per GPU) when t > k."""
    return max(1, model.num_key_value_heads // tp)


class AttentionWidths(NamedTuple):
    """Per token on one GPU of a TP group, the widths of the tensors attention makes and keeps
    in training (Megatron): queries, keys, values and the context (attention output)."""

    query: float
    key: float
    value: float
    context: float

    @property
    def total(self) -> float:
        return self.query + self.key + self.value + self.context


def training_attention_widths(model: ModelSpec, tp: int) -> AttentionWidths:
    """GQA: a/t query heads of d, k_gpu key and value heads (kv_heads_per_gpu; d_v = v_head_dim
    where narrower), a/t context heads. MLA as Megatron-Core trains it (multi_latent_attention.py,
    no weight absorption: the latents are up-projected into a/t heads of keys and values):
    queries and keys of d_nope + d_rope, values and context of d_v, every head its own;
    DeepSeek-V3 at t = 1: 128 * (192 + 192 + 128 + 128) = 81,920 elements."""
    a = model.num_attention_heads / tp
    if model.is_mla:
        d_qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        return AttentionWidths(a * d_qk, a * d_qk, a * model.v_head_dim, a * model.v_head_dim)
    d_v = attention_shape(model, False).value_dim
    kv = kv_heads_per_gpu(model, tp)
    return AttentionWidths(a * model.head_dim, kv * model.head_dim, kv * d_v, a * d_v)


def rotary_elements_per_token(model: ModelSpec, tp: int) -> float:
    """Elements one token's rotary embedding rewrites on one GPU: the query and key heads'
    (a/t + k_gpu) * d, times the rotated share of each head (partial_rotary_factor: Nemotron's
    half); MLA's decoupled rope parts only, a/t query heads and the one shared key
    of qk_rope_head_dim each (DeepSeek-V2, arXiv:2405.04434, sec. 2.1.3); 0 with learned
    positions (position_embedding: learned)."""
    if model.position_embedding != "rope":
        return 0.0
    if model.is_mla:
        return (model.num_attention_heads / tp + 1) * model.qk_rope_head_dim
    heads = model.num_attention_heads / tp + kv_heads_per_gpu(model, tp)
    return heads * model.head_dim * model.partial_rotary_factor


def tp_head_reasons(model: ModelSpec, tp: int) -> list[str]:
    """Why attention cannot split over t ranks: every rank needs whole query heads, and KV
    heads must either split evenly (k divisible by t) or replicate evenly (t divisible by
    k). The same rule in vLLM and Megatron-LM; Gemma 4 checks it for both layer kinds'
    KV heads (vLLM Gemma4Attention asserts it per layer)."""
    a = model.num_attention_heads
    if a % tp:
        return [f"attention heads {a} not divisible by tp={tp}"]
    for k, kind in ((model.num_key_value_heads, ""), (attention_shape(model, True)[0], "full-attention ")):
        if k % tp and tp % k:
            return [f"{kind}KV heads {k} neither divisible by nor dividing tp={tp}"]
    return recurrent_head_reasons(model, tp)


def tp_scale_group_reasons(model: ModelSpec, tp: int, ep: int = 1) -> list[str]:
    """Why quantized weights cannot split over t ranks: with one scale per group of g inputs, a
    row-parallel layer (attention output, MLP down projection) gives each rank input/t of them,
    and vLLM 0.33.0 loads only whole groups on every rank.
    - int4 (AWQ, GPTQ, compressed-tensors W4A16), g = quantization_group_size: its Marlin
      kernels refuse a group that straddles the shard and the AWQ/GPTQ kernels it falls back to
      raise "The input size is not aligned with the quantized weight shape"
      (model_executor/layers/quantization/auto_awq.py, utils/marlin_utils.py
      check_marlin_supports_layer). Routed experts split over TP (no EP) fall back to the MoE
      WNA16 kernels (expert_shard_loads). A group at least the hidden size
      stands for one scale per output channel (GPTQ's group_size -1: hf_config), which any
      split keeps whole.
    - block-scaled fp8, g = quantization_block_size: RowParallelLinear raises "Weight
      input_size_per_partition = ... is not divisible by weight quantization block_k"
      (quantization/utils/fp8_utils.py validate_fp8_block_shape); column-parallel layers pass
      (merged ones allow a mismatch, linear.py _maybe_allow_fp8_block_shape_mismatch); routed
      experts split over TP pass where their blocks refine (expert_shard_loads).
    The hidden size, which the other projections read whole, is whole groups in any int4 spec
    (ModelSpec.int4_group_problem). Layers that quantization_scope leaves out are not checked."""
    if model.quantization == "int4" and model.quantization_group_size < model.hidden_size:
        g, what, kernels = model.quantization_group_size, "int4 groups", "vLLM's AWQ/GPTQ kernels"
    elif model.quantization == "fp8" and model.quantization_block_size is not None:
        g, what, kernels = model.quantization_block_size, "fp8 scale blocks", "vLLM's block-fp8 layers"
    else:
        return []
    if tp == 1:
        return []
    for name, width in row_parallel_inputs(model):
        if width % tp or (width // tp) % g:
            return [f"{what} of {g} do not split over tp={tp}: {name} inputs {width:,} / {tp} = "
                    f"{width / tp:,.6g} a rank, not whole {what.split()[-1]} ({kernels} refuse it)"]
    if model.is_moe and ep <= 1 and not expert_shard_loads(model, tp, g):
        return [f"{what} of {g} do not split over tp={tp}: expert FFN inputs {model.expert_intermediate_size:,} / "
                f"{tp} = {model.expert_intermediate_size / tp:,.6g} a rank hold no whole group of {MIN_SHARD_GROUP} or "
                f"more (vLLM's fused-MoE kernels refuse it; EP keeps experts whole)"]
    return []


def row_parallel_inputs(model: ModelSpec) -> list[tuple[str, int]]:
    """The row-parallel layers quantization_scope quantizes, with their inputs: attention
    output (each layer kind's value width), the dense MLP's and the shared experts' down
    projection."""
    scope = model.quantization_scope
    inputs: list[tuple[str, int]] = []
    if scope == "all":
        dims = {model.v_head_dim} if model.is_mla else {attention_shape(model, True).value_dim,
                                                         attention_shape(model, False).value_dim}
        inputs += [("attention output", model.num_attention_heads * d) for d in sorted(dims)]
    if scope in ("all", "mlp"):
        if not model.is_moe or model.num_dense_layers:
            inputs.append(("MLP down projection", model.intermediate_size))
        if model.is_moe and model.num_shared_experts:
            inputs.append(("shared experts' down projection", model.num_shared_experts * shared_expert_size(model)))
    return inputs


def expert_shard_loads(model: ModelSpec, tp: int, group: int) -> bool:
    """Whether vLLM 0.33.0 loads a routed expert split over t ranks (no EP) whose scales cover
    `group` inputs: the shard is whole groups, or a smaller group of at least MIN_SHARD_GROUP
    divides both it and the hidden size. int4's MoE WNA16 kernels halve the group until it does
    (moe_wna16.py create_weights); block fp8 refines its blocks to gcd(block, shard, hidden)
    (fused_moe/oracle/fp8.py refine_fp8_moe_block_shape; validate_fp8_block_shape_moe raises
    below it, padding needs a --moe-backend other than auto). For the power-of-two groups of
    both formats the two rules agree."""
    width = model.expert_intermediate_size
    if width % tp:
        return False
    shard = width // tp
    return shard % group == 0 or math.gcd(group, shard, model.hidden_size) >= MIN_SHARD_GROUP


MIN_SHARD_GROUP = 32
"""The smallest scale group vLLM 0.33.0 runs a TP-split expert shard at: MoE WNA16's halved int4
group (moe_wna16.py asserts >= 32), block fp8's refined block (refine_fp8_moe_block_shape)."""


def recurrent_head_reasons(model: ModelSpec, tp: int) -> list[str]:
    """Recurrent heads split over TP like attention heads: Mamba2's H (vLLM MambaMixer2
    asserts num_heads % tp == 0), Gated DeltaNet's value heads and key heads (or t a
    multiple of them)."""
    if model.recurrent_kind == "mamba2" and model.mamba_num_heads % tp:
        return [f"Mamba2 heads {model.mamba_num_heads} not divisible by tp={tp}"]
    if model.recurrent_kind == "gated_deltanet":
        keys, values = model.linear_num_key_heads, model.linear_num_value_heads
        if values % tp or (keys % tp and tp % keys):
            return [f"linear-attention heads ({keys} key, {values} value) do not split over tp={tp}"]
    return []


def attention_replicated_weights(model: ModelSpec, tp: int) -> tuple[float, float]:
    """The mean attention layer's matmul weights that TP does not split, as (in the model,
    per GPU): GQA's K and V projections, of which each GPU keeps max(1, k/t) heads
    (replicated when t > k), per layer kind (mean_over_attention_kinds); MLA's two
    down-projections, whole on every GPU. A Gemma 4 attention_k_eq_v layer has one K
    projection in the checkpoint, but vLLM loads it into both the K and V slots of its
    QKVParallelLinear (vllm/model_executor/models/gemma4.py), so a GPU holds 2*h*max(1, k_g/t)*d_g;
    in general h*max(1, k/t)*(d + d_v) per kind."""
    if model.is_mla:
        replicated = mla_attention_weights(model)[0]
        return replicated, replicated
    h = model.hidden_size
    full, window = attention_shape(model, True), attention_shape(model, False)

    def in_model(shape: AttentionShape) -> int:
        return h * shape.kv_heads * (shape.key_dim + (shape.value_dim if shape.kv_projections == 2 else 0))

    return (mean_over_attention_kinds(model, in_model(full), in_model(window)),
            mean_over_attention_kinds(model, h * max(1, full.kv_heads // tp) * (full.key_dim + full.value_dim),
                                      h * kv_heads_per_gpu(model, tp) * (window.key_dim + window.value_dim)))


def experts_per_gpu(model: ModelSpec, ep: int) -> int:
    """ceil(E / ep): routed experts on the fullest GPU of an EP group (vLLM gives the first
    E mod ep ranks one more, vllm/model_executor/layers/fused_moe/layer.py determine_expert_map);
    all E without EP."""
    return -(-model.num_local_experts // ep) if ep > 1 else model.num_local_experts


def routed_expert_share_per_gpu(model: ModelSpec, tp: int, ep: int = 1) -> float:
    """Share of the routed experts' weights on one GPU: 1/t (every expert TP-split) without
    EP, ceil(E/ep)/E whole experts with it (expert TP 1)."""
    if ep <= 1 or not model.is_moe:
        return 1 / tp
    return experts_per_gpu(model, ep) / model.num_local_experts


def layer_linear_weights_per_gpu_by_kind(model: ModelSpec, tp: int, ep: int = 1) -> tuple[float, float, float]:
    """The mean block's matmul weights on one GPU of a TP group as (attention, routed
    experts, other MLP): split by t, except the attention weights TP replicates
    (attention_replicated_weights) and the routed experts under EP
    (routed_expert_share_per_gpu)."""
    full, per_gpu = attention_replicated_weights(model, tp)
    routed, other = mlp_linear_weights(model)
    attention = ((attention_linear_weights(model) - full) / tp + per_gpu) * num_attention_layers(model)
    recurrent = recurrent_weights(model)[0] / tp * model.num_recurrent_layers
    return ((attention + recurrent) / model.num_hidden_layers,
            routed * routed_expert_share_per_gpu(model, tp, ep), other / tp)


def layer_linear_weights_per_gpu(model: ModelSpec, tp: int, ep: int = 1) -> float:
    return sum(layer_linear_weights_per_gpu_by_kind(model, tp, ep))


def layer_other_params(model: ModelSpec) -> int:
    """One block's parameters outside its matmuls (norms, biases), kept whole on every GPU
    (a slight overcount for column-parallel biases)."""
    counts = param_counts(model)
    return counts.per_layer - linear_weights_per_layer(model, counts)


def layer_params_per_gpu(model: ModelSpec, tp: int, ep: int = 1) -> float:
    """One block's parameters on one GPU of a TP group."""
    return layer_linear_weights_per_gpu(model, tp, ep) + layer_other_params(model)


@computed_once
def layer_weight_bytes_per_gpu(model: ModelSpec, tp: int, ep: int = 1) -> float:
    """The mean block's weight bytes on one GPU: matmuls in their kinds' formats
    (matmul_bytes), norms and biases in the model dtype."""
    kinds = layer_linear_weights_per_gpu_by_kind(model, tp, ep)
    return matmul_bytes(model, *kinds) + layer_other_params(model) * BYTES_PER_ELEMENT[model.dtype]


def moe_layer_excess_weights_by_kind(model: ModelSpec, tp: int, ep: int = 1) -> tuple[float, float, float]:
    """What one MoE layer's MLP holds on one GPU beyond one dense layer's, as (router, routed
    experts, other MLP) weights: the router h * E (whole on every GPU), the routed experts
    (routed_expert_share_per_gpu), the shared experts and latent projections less the dense
    MLP (both split t ways); biases left out. (0, 0, 0) for a dense model."""
    if not model.is_moe:
        return 0.0, 0.0, 0.0
    per_ffn = (3 if model.gated_mlp else 2) * model.hidden_size
    routed = (model.num_local_experts * (expert_params(model) - expert_bias_params(model))
              * routed_expert_share_per_gpu(model, tp, ep))
    shared = model.num_shared_experts * per_ffn * shared_expert_size(model) + latent_projection_params(model)
    dense = per_ffn * model.intermediate_size
    return float(model.hidden_size * model.num_local_experts), routed, (shared - dense) / tp


@computed_once
def moe_layer_excess_bytes_per_gpu(model: ModelSpec, tp: int, ep: int = 1) -> float:
    """moe_layer_excess_weights_by_kind in bytes: the matmuls in their kinds' formats, the
    router in the dtype. A stage holding Delta more MoE layers than the mean share holds
    Delta times this more (serving_memory.stage_memory). 0 for a dense model.
    DeepSeek-V3 at t = 8: experts 256 * 3 * 7168 * 2048 / 8 = 1,409,286,144 weights, shared
    3 * 7168 * 2048 / 8 = 5,505,024, less the dense MLP 3 * 7168 * 18432 / 8 = 49,545,216, all
    fp8 at 1 + 4/7168 B (bytes_per_weight): 1,366,007,808 B; the router 7168 * 256 * 2 B =
    3,670,016 B: 1,369,677,824 B (1.28 GiB)."""
    router, routed, other = moe_layer_excess_weights_by_kind(model, tp, ep)
    return matmul_bytes(model, 0.0, routed, other) + router * BYTES_PER_ELEMENT[model.dtype]


@computed_once
def moe_layer_excess_active_params(model: ModelSpec) -> float:
    """One MoE layer's MLP parameters a token touches outside its routed experts (shared
    experts, latent projections, router) less one dense layer's MLP: what a stage's non-routed
    matmul FLOPs per token gain, over 2, per MoE layer above its mean share. DeepSeek-V3:
    3 * 7168 * 2048 + 7168 * 256 - 3 * 7168 * 18432 = -350,486,528 (its dense layers' MLP is
    nine experts wide). 0 for a dense model."""
    if not model.is_moe:
        return 0.0
    _, active = moe_mlp_params(model)
    return active - model.num_experts_per_tok * expert_params(model) - mlp_params(model, model.intermediate_size)


def matmul_precision_of_dtype(model: ModelSpec) -> str:
    """The model dtype's matmul precision (weight-only int4/int8 dequantise into it)."""
    return MATMUL_PRECISION_OF_DTYPE[model.dtype]


def training_dtype(model: ModelSpec) -> str:
    """The 16-bit type a model trains in (mixed precision, its matmuls and the activations and
    weights the memory model counts at 2 bytes): float16 for a float16 checkpoint (Megatron's
    --fp16), else bfloat16 (--bf16), a float32 checkpoint included: its dtype is how the weights
    were stored, and Megatron without --bf16/--fp16 would train in fp32 (4-byte activations and
    weights, TF32 matmuls), which the plan does not price."""
    return "float16" if model.dtype == "float16" else "bfloat16"


def mtp_module_params_per_gpu(model: ModelSpec, tp: int, ep: int = 1) -> tuple[float, float]:
    """One multi-token-prediction module on one GPU of a TP group, as (all, of which routed
    experts): a block of the final decoder layer's kind (an MoE block when the model is one:
    Megatron builds the MTP layer from the decoder's last layer spec, gpt_layer_specs.py
    core_v0.14.0 get_gpt_mtp_block_spec; DeepSeek-V3 sec. 2.2), its two norms, enorm, hnorm and
    its final norm, and eh_proj [2h -> h], column-parallel (t ways). The embedding and output
    head it shares are the stage's (training_memory.stage_params_per_gpu). DeepSeek-V3 at t = 2,
    ep = 8 (32 of 256 experts a GPU): attention (187.1M - 15.1M replicated down-projections)/2
    + 15.1M = 101.1M, experts 32 * 44.0M = 1,409.3M, shared expert 44.0M/2 = 22.0M, router
    1.8M, eh_proj 102.8M/2 = 51.4M, norms 0.04M: 1,585.7M, of which 1,409.3M routed."""
    h = model.hidden_size
    full, replicated = attention_replicated_weights(model, tp)
    attention = (attention_linear_weights(model) - full) / tp + replicated
    per_ffn = (3 if model.gated_mlp else 2) * h
    if model.is_moe:
        routed = (model.num_local_experts * (expert_params(model) - expert_bias_params(model))
                  * routed_expert_share_per_gpu(model, tp, ep))
        shared = model.num_shared_experts * per_ffn * shared_expert_size(model) + latent_projection_params(model)
        other = shared / tp + h * model.num_local_experts  # the router, whole on every GPU
    else:
        routed, other = 0.0, per_ffn * model.intermediate_size / tp
    norms = 5 * norm_params(model)  # the block's two, enorm, hnorm, the final norm
    return attention + routed + other + norms + 2 * h * h / tp, routed
