"""Typed, validated specs: the model, the GPU, the links and the cluster.

File keys carry human units (GiB, GB/s, Gb/s, us, TFLOP/s); each schema converts
them to SI once, in a property whose name carries the unit. Every user mistake
becomes a `SpecError` whose message is one line: `file: field: problem`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from planner import units
from planner.errors import SpecError
from planner.schema import (
    Field,
    Name,
    Spec,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

T = TypeVar("T")


def computed_once(compute: Callable[..., T]) -> Callable[..., T]:
    """compute(spec, *args) as Spec.derived keeps it: computed once per spec instance and
    positional arguments (hashable values: a TP degree, a format name, a layout). For the
    pure functions of a model that the serving search asks for with every layout, stage
    and step (the parameter counts, a block's bytes per GPU)."""
    @functools.wraps(compute)
    def once(spec: Spec, *args: Hashable) -> T:
        return spec.derived(compute, *args)

    return once

Dtype = Literal["float32", "float16", "bfloat16"]
Quantization = Literal["fp8", "int8", "int4", "nvfp4", "mxfp4"]
WeightFormat = Literal["fp8", "int8", "int4", "nvfp4", "mxfp4", "mxfp8"]
"""A stored matmul weight format: the main quantizations plus those seen only beside one in
per-module mixed-precision checkpoints (ModelOpt MIXED_PRECISION's MXFP8)."""
QuantizationScope = Literal["all", "mlp", "experts"]
IntraKind = Literal["nvlink", "pcie", "xgmi"]
InterKind = Literal["infiniband", "roce", "ethernet"]

# Plausibility bounds. Each is far above anything published (the largest dense models have
# ~100-130 layers and hidden sizes near 2**14-2**15; the largest clusters ~10**5 GPUs), so
# no real input is refused, while a typo (hidden_size 10**30, 10**30 nodes) is a one-line
# error instead of a plan with 54-digit GiB figures or a search that never ends.
MAX_NUM_LAYERS = 4096
"""Deepest published LLMs: ~130 layers (Llama-3.1-405B 126); DeepNet trained 1,000."""
MAX_HIDDEN_SIZE = 2**18
MAX_INTERMEDIATE_SIZE = 2**19
MAX_NUM_HEADS = 2**14
MAX_HEAD_DIM = 2**14
MAX_VOCAB_SIZE = 2**22
"""Largest published vocabularies: ~256k (Gemma) -- 16x headroom."""
MAX_POSITION_EMBEDDINGS = 2**27
"""~134M tokens; the longest published context is 10M (Llama 4 Scout)."""
MAX_NUM_EXPERTS = 2**14
MAX_ROPE_THETA = 10.0**12
"""Published RoPE bases reach 10^8 (1M for Qwen, 500k for Llama 3.1)."""
MAX_ROUTER_SCALING = 100.0
"""Published routed_scaling_factor values: DeepSeek-V3 2.5, Kimi K2 2.827, DeepSeek-V2 16."""
MAX_NUM_GPUS = 2**20
"""1,048,576 GPUs in one cluster; the largest built today are ~10**5."""
MAX_SM_COUNT = 4096
"""Streaming multiprocessors per GPU; B200 has 148."""
MAX_GPUS_PER_NODE = 1024
"""A node (one intra-node fabric) of up to 1,024 GPUs; NVL72 racks have 72, NVL576 576."""
MAX_MEMORY_GIB = 2**14
MAX_BANDWIDTH_GB_PER_S = 100_000.0
"""100 TB/s (HBM or links) per GPU; B200 HBM is 8 TB/s, NVLink 5 0.9 TB/s one way."""
MAX_NIC_GBIT_PER_S = 100_000.0
MAX_NUM_NICS_PER_NODE = 1024
MAX_LATENCY_US = 10_000_000.0
"""10 s per step."""
MAX_TFLOPS = 100_000.0
"""100 PFLOP/s per GPU; B200 is 9 PFLOP/s dense fp4."""
MIN_PHYSICAL_QUANTITY = 0.01
"""Smallest memory (GiB), bandwidth (GB/s, Gb/s) or peak (TFLOP/s) taken: below it every
time in the plan overflows to infinity."""
MAX_SPEC_FILE_BYTES = units.BYTES_PER_MIB
"""1 MiB: a model spec, config.json or hardware profile with measured curves is a few KB to
tens of KB; anything larger is not a spec (and parsing tens of MB of YAML takes minutes)."""
MAX_SPEC_NODES = 500_000
"""Values (mappings, lists, scalars) a spec may hold once YAML aliases are expanded."""
MAX_SPEC_DEPTH = 64
"""Nesting a spec may have (the deepest real one, a profile's measured curves, has 4)."""


def Count(upper: int, lower: int = 1) -> Any:
    """A strict integer in [lower, upper]: 4096.0, "4096" and true are refused, not coerced."""
    return StrictInt(ge=lower, le=upper)


def Quantity(upper: float, lower: float = MIN_PHYSICAL_QUANTITY) -> Any:
    """A finite number in [lower, upper], or in (0, upper] when lower is 0 (an integer is
    taken; true, nan and inf are not)."""
    low = {"gt": 0.0} if lower == 0 else {"ge": lower}
    return StrictFloat(le=upper, **low)


Flag = StrictBool()
"""true or false only (not 1, "yes")."""


class _Spec(Spec, extra="forbid"):
    """Frozen; an unknown field is an error."""


LLAMA4_NOPE_LAYER_INTERVAL = 4
"""Llama 4: every fourth layer is a NoPE layer of full attention, the others chunked
(transformers' Llama4TextConfig, no_rope_layer_interval = 4)."""


class ModelSpec(_Spec):
    """A decoder-only transformer. Field names follow Hugging Face config.json."""

    name: Name()
    source: str | None = None
    """Where the numbers come from (model card, config.json URL, paper)."""
    architecture: str | None = None
    """config.json's `architectures[0]` (GptOssForCausalLM): the class the engines build, where
    they treat families apart (SGLang's KV pools of window layers, engines.SglangRelease
    hybrid_swa_architectures). None: not given (a YAML spec without it)."""
    num_hidden_layers: Count(MAX_NUM_LAYERS)
    hidden_size: Count(MAX_HIDDEN_SIZE)
    num_attention_heads: Count(MAX_NUM_HEADS)
    num_key_value_heads: Count(MAX_NUM_HEADS) | None = None
    """Grouped-query attention KV heads; defaults to num_attention_heads (MHA)."""
    head_dim: Count(MAX_HEAD_DIM) | None = None
    """Defaults to hidden_size / num_attention_heads."""
    intermediate_size: Count(MAX_INTERMEDIATE_SIZE)
    """FFN hidden size of the dense MLP (of each expert for MoE unless moe_intermediate_size)."""
    gated_mlp: Flag = True
    """SwiGLU-style MLP with 3 matrices; false = GPT-style 2 matrices."""
    mlp_activation: Literal["silu", "gelu", "relu", "squared_relu", "xielu"] | None = None
    """The MLP's activation where it is not the usual one for its kind (None: SiLU gated, i.e.
    SwiGLU; GELU in a two-matrix MLP): Nemotron-4's squared ReLU, Gemma's GELU-gated (GeGLU),
    Apertus' xIELU. The cost model prices every activation alike; the Megatron-LM command needs
    it (--squared-relu)."""
    vocab_size: Count(MAX_VOCAB_SIZE)
    max_position_embeddings: Count(MAX_POSITION_EMBEDDINGS)
    tie_word_embeddings: Flag = False
    dtype: Dtype = "bfloat16"
    quantization: Quantization | None = None
    """Weight-only quantization of the transformer-block linear layers."""
    quantization_group_size: Count(MAX_HIDDEN_SIZE) = 128
    """int4 (AWQ/GPTQ) weights per scale group."""
    quantization_block_size: Count(MAX_HIDDEN_SIZE) | None = None
    """fp8 in scale blocks (weight_block_size [n, k]: DeepSeek-V3, Qwen3 FP8 [128, 128]): k, the
    inputs one scale covers; None = a scale per output channel or per tensor."""
    trust_remote_code: Flag = False
    """The checkpoint ships code the engines must run to load it (Kimi-K2.5's tokenizer,
    tokenization_kimi.py, named by its tokenizer_config.json auto_map; or its configuration
    class, where config.json's auto_map names one for a model_type the engines lack:
    Llama-3.3-Nemotron-Super-49B's configuration_decilm.py): the serving commands carry vLLM's
    and SGLang's --trust-remote-code. Read on import (hf_config.tokenizer_code, config_code);
    vLLM's Kimi-K2.5 recipe passes the flag."""
    checkpoint_kv_cache_dtype: Literal["fp8", "nvfp4"] | None = None
    """The KV cache format a ModelOpt checkpoint's quantization config asks for (config.json
    quantization_config with quant_method "modelopt": kv_cache_scheme {dynamic: false,
    num_bits: 8, type: float} or kv_cache_quant_algo "FP8"): vLLM 0.17.0 and later take it for
    `--kv-cache-dtype auto` (resolve_kv_cache_dtype_string, vllm/utils/torch_utils.py at 0.33.0;
    requests.for_checkpoint). None: the checkpoint names none (the engine's 16-bit default)."""
    quantization_zero_point: Flag = True
    """int4: a 4-bit zero point per group beside its 16-bit scale (AWQ, GPTQ); off for a
    symmetric compressed-tensors checkpoint, which stores the scale only."""
    int8_activations: Flag = False
    """int8: the GEMM inputs are quantized to int8 too (compressed-tensors W8A8, whose
    config_groups name 8-bit integer input_activations), so the block matmuls run on the int8
    tensor cores (vLLM's CompressedTensorsW8A8Int8, cutlass_scaled_mm); off: weight-only
    (GPTQ 8-bit), dequantized into the dtype's GEMMs."""
    attention_bias: Flag = False
    """Biases on q, k, v and o projections (GPT-style)."""
    qkv_bias: Flag = False
    """Biases on q, k, v only (Qwen2-style)."""
    mlp_bias: Flag = False
    norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    layernorm_1p: Flag = False
    """LayerNorm with its weight stored as gamma - 1 (Nemotron's LayerNorm1P; Megatron-LM's
    --apply-layernorm-1p, layernorm_zero_centered_gamma): the same work, another checkpoint."""
    position_embedding: Literal["rope", "learned"] = "rope"
    partial_rotary_factor: Quantity(1.0, 0) = 1.0
    """The share of each query and key head's dims RoPE rotates (config.json
    partial_rotary_factor: Nemotron's 0.5; Megatron-LM's --rotary-percent); 1 = all."""
    rope_theta: Quantity(MAX_ROPE_THETA) = 10000.0
    """RoPE base frequency (config.json rope_theta); 10000 is the RoPE paper's and Megatron's default."""
    llama3_rope_scaling_factor: Quantity(1024.0) | None = None
    """Llama 3.1's frequency-dependent RoPE scaling (config.json rope_scaling.rope_type "llama3",
    its factor: 8 for Llama 3.1, 32 for Llama 3.2); None = plain RoPE. Megatron-LM's
    --use-rope-scaling --rope-scaling-factor (its low/high frequency factors 1 and 4 and original
    length 8,192 are Llama 3.1's)."""
    qk_norm: Flag = False
    """An RMSNorm over each head's query and key before RoPE (Qwen3; Megatron-LM's --qk-layernorm)."""
    qk_norm_across_heads: Flag = False
    """RMSNorms over the query and the key of all heads at once, before RoPE (MiniMax-M2's
    qk_norm_type "per_layer"). Under TP each rank holds some of the heads, so every layer
    all-reduces each token's two partial sums of squares before it can normalize (vLLM 0.33.0
    model_executor/layers/minimax_rms_norm/rms_norm_tp.py, MiniMaxText01RMSNormTP): one more
    all-reduce per layer and step, tiny but on the critical path."""
    attention_chunk_size: Count(MAX_POSITION_EMBEDDINGS) | None = None
    """Llama 4's chunked local attention (config.json attention_chunk_size): its RoPE layers
    attend within chunks of this many tokens, its NoPE layers (every fourth) in full, with an L2
    norm of queries and keys in the RoPE layers. Serving caches the chunked layers as vLLM's
    hybrid KV cache manager does, a window of the chunk (num_kv_window_layers, kv_window_tokens),
    and prices their attention as such a window (at most the chunk's keys a query: over, never
    under; docs/cost-model.md, Known limitations);
    Megatron-LM's command cannot express it (emit/megatron.model_refusals)."""
    num_local_experts: Count(MAX_NUM_EXPERTS) | None = None
    num_experts_per_tok: Count(MAX_NUM_EXPERTS) | None = None
    moe_intermediate_size: Count(MAX_INTERMEDIATE_SIZE) | None = None
    num_shared_experts: Count(MAX_NUM_EXPERTS, lower=0) = 0
    shared_expert_intermediate_size: Count(MAX_INTERMEDIATE_SIZE) | None = None
    """FFN size of each shared expert; defaults to the routed experts' (DeepSeek's
    n_shared_experts x moe_intermediate_size; Qwen2-MoE's shared_expert_intermediate_size)."""
    num_expert_groups: Count(MAX_NUM_EXPERTS) | None = None
    """Group-limited routing (Hugging Face n_group; DeepSeek-V2/V3): the routed experts split into
    this many equal groups of consecutive experts, and each token's top-k drawn only from its
    `expert_groups_per_token` best groups (DeepSeek-V3 report, arXiv:2412.19437, sec. 3.2.2:
    node-limited routing, each token to at most 4 nodes). None: any expert."""
    expert_groups_per_token: Count(MAX_NUM_EXPERTS) | None = None
    """Group-limited routing: the groups a token's experts come from (Hugging Face topk_group)."""
    router_score_function: Literal["softmax", "sigmoid", "sqrtsoftplus"] = "softmax"
    """How the router turns its logits into expert scores (Hugging Face scoring_func): softmax
    (Mixtral, Qwen3), sigmoid (DeepSeek-V3, Kimi K2, GLM-5, MiniMax-M2, Llama 4), sqrtsoftplus
    (DeepSeek-V4). What the launch command trains (Megatron-LM's --moe-router-score-function);
    no cost depends on the router fields."""
    router_expert_bias: Flag = False
    """Aux-loss-free balancing: a learned per-expert bias added to the scores for the top-k
    choice only (Hugging Face topk_method noaux_tc, e_score_correction_bias; MiniMax's
    use_routing_bias). Megatron-LM's --moe-router-enable-expert-bias."""
    router_topk_scaling_factor: Quantity(MAX_ROUTER_SCALING) | None = None
    """The chosen experts' weights are multiplied by it (Hugging Face routed_scaling_factor:
    DeepSeek-V3 2.5, Kimi K2 2.827); None: 1. Megatron-LM's --moe-router-topk-scaling-factor."""
    router_topk_normalized: Flag = True
    """The chosen experts' weights sum to 1 (Hugging Face norm_topk_prob; false: DeepSeek-V2,
    Qwen2-MoE, whose softmax runs over every expert before the top-k: Megatron-LM's
    --moe-router-pre-softmax)."""
    router_probs_on_input: Flag = False
    """The router's weight scales the expert's input, not its output (Llama 4's Llama4TextMoe:
    hidden_states * sigmoid(top-1 logit)). Megatron-LM's --moe-apply-probs-on-input."""
    num_dense_layers: Count(MAX_NUM_LAYERS, lower=0) = 0
    """MoE models: layers whose MLP is dense (intermediate_size) instead of routed
    (DeepSeek-V3's first_k_dense_replace 3, every other layer of Llama-4 Maverick)."""
    dense_layer_indices: list[Count(MAX_NUM_LAYERS - 1, lower=0)] | None = None
    """MoE models: which layers (0-based, ascending) are the num_dense_layers dense ones, where
    known (a config.json's pattern: DeepSeek-V3's first_k_dense_replace 3 is [0, 1, 2]). Each
    pipeline stage then holds and runs its own dense and MoE layers (serving memory and step
    per stage; Megatron's --moe-layer-freq); None: they are spread evenly over the stages."""
    text_model_of: str | None = None
    """The multimodal wrapper this is the language model of (its config.json's model_type, e.g.
    qwen3_vl): the vision or audio towers, and the engine's encoder cache, are not counted in
    weights or memory, and the model summary says so."""
    unknown_model_type: str | None = None
    """A config.json's model_type (\"\" where it has none) when neither transformers 5.16.1 nor
    vLLM 0.33.0 has a configuration class for it and the config names no code of its own
    (auto_map): planned from its generic keys as a standard decoder, which the model line says,
    since the engines may not load it or may build it otherwise. None: a known family, or a YAML spec."""
    num_mtp_layers: Count(MAX_NUM_LAYERS, lower=0) = 0
    """Multi-token-prediction layers (num_nextn_predict_layers): reported beside, not in,
    the main parameter count (DeepSeek-V3's 671B excludes its 14B MTP module)."""
    q_lora_rank: Count(MAX_HIDDEN_SIZE) | None = None
    """MLA (DeepSeek-V2/V3, Kimi K2): rank of the query down-projection; None = a full q_proj."""
    kv_lora_rank: Count(MAX_HIDDEN_SIZE) | None = None
    """MLA: rank of the compressed KV latent cached per token (set = the model uses MLA)."""
    qk_nope_head_dim: Count(MAX_HEAD_DIM) | None = None
    """MLA: per-head query/key dims without RoPE."""
    qk_rope_head_dim: Count(MAX_HEAD_DIM) | None = None
    """MLA: per-head query/key dims with RoPE (the key part shared by all heads is cached)."""
    v_head_dim: Count(MAX_HEAD_DIM) | None = None
    """Per-head value dims: MLA's (required with it); in other attention the width per head of
    the V projection and of the output projection's input when it differs from the query/key
    head dim (MiMo-V2-Flash: 128 beside 192 on every layer); None = head_dim."""
    index_n_heads: Count(MAX_NUM_HEADS) | None = None
    """DSA (DeepSeek-V3.2, GLM-5): heads of the lightning indexer that picks the keys each
    query attends to (set together with index_head_dim; needs MLA with q_lora_rank)."""
    index_head_dim: Count(MAX_HEAD_DIM) | None = None
    """DSA: dims of the indexer's one key per token and layer, cached beside the MLA latent."""
    quantization_scope: QuantizationScope = "all"
    """Which block matmuls carry `quantization`: all, the MLPs only (attention kept in the
    model dtype, as ModelOpt NVFP4 DeepSeek checkpoints exclude self_attn), or the routed
    experts only (gpt-oss mxfp4; GLM-5 NVFP4)."""
    secondary_quantization: WeightFormat | None = None
    """Format of the block matmuls quantization_scope leaves out, instead of the dtype
    (ModelOpt MIXED_PRECISION: Qwen3.6's attention and Gated DeltaNet projections in FP8
    beside NVFP4 MLPs). Needs quantization with a scope of mlp or experts."""
    lm_head_quantization: WeightFormat | None = None
    """Format of an untied LM head (Qwen3.6 NVFP4 stores it in NVFP4); None = the dtype."""
    sliding_window: Count(MAX_POSITION_EMBEDDINGS) | None = None
    """Tokens a sliding-window attention layer attends to (config.json sliding_window: each
    query sees itself and the window - 1 tokens before it); None = every layer attends to the
    whole context. vLLM keeps only the window's KV blocks of such a layer."""
    num_sliding_window_layers: Count(MAX_NUM_LAYERS, lower=0) | None = None
    """How many layers use the window (layer_types "sliding_attention": 18 of gpt-oss-120b's
    36); the rest attend in full. Defaults to every layer when sliding_window is set (Mistral-7B
    v0.1). Pipeline stages take their share in proportion (the patterns alternate)."""
    num_recurrent_layers: Count(MAX_NUM_LAYERS, lower=0) = 0
    """Layers whose token mixer is recurrent (recurrent_kind) instead of attention: they keep
    no KV cache but a fixed state per sequence (Nemotron-H's Mamba2 blocks, Qwen3.5's
    linear_attention layers). Counts and per-GPU sizes take the mean layer."""
    recurrent_kind: Literal["mamba2", "gated_deltanet"] | None = None
    """Which recurrent mixer: Mamba2 (mamba_* fields, ssm_state_size, n_groups, conv_kernel)
    or Gated DeltaNet (linear_* fields, conv_kernel)."""
    num_mlp_only_layers: Count(MAX_NUM_LAYERS, lower=0) = 0
    """Layers with an MLP or MoE and no token mixer (Nemotron-H's "-" and "E" blocks)."""
    num_mixer_only_layers: Count(MAX_NUM_LAYERS, lower=0) = 0
    """Layers with a token mixer (attention or recurrent) and no MLP (Nemotron-H's "M" and "*"
    blocks); in an MoE model they are among num_dense_layers (the layers without experts)."""
    mamba_num_heads: Count(MAX_NUM_HEADS) | None = None
    """Mamba2: SSM heads (d_inner = mamba_num_heads * mamba_head_dim)."""
    mamba_head_dim: Count(MAX_HEAD_DIM) | None = None
    ssm_state_size: Count(MAX_HEAD_DIM) | None = None
    """Mamba2: state dims N per head (B and C have n_groups * N channels each)."""
    n_groups: Count(MAX_NUM_HEADS) | None = None
    """Mamba2: groups sharing B and C."""
    conv_kernel: Count(MAX_HEAD_DIM) | None = None
    """Recurrent mixers: width of the causal depthwise convolution (Mamba2 conv_kernel, Gated
    DeltaNet linear_conv_kernel_dim); the state keeps its last conv_kernel - 1 inputs."""
    linear_num_key_heads: Count(MAX_NUM_HEADS) | None = None
    """Gated DeltaNet: query/key heads."""
    linear_num_value_heads: Count(MAX_NUM_HEADS) | None = None
    """Gated DeltaNet: value heads (one dk x dv state matrix each)."""
    linear_key_head_dim: Count(MAX_HEAD_DIM) | None = None
    linear_value_head_dim: Count(MAX_HEAD_DIM) | None = None
    recurrent_state_dtype: Dtype | None = None
    """dtype of the recurrent (SSM / delta-rule) state; None = the model dtype. vLLM keeps
    the convolution state in the model dtype."""
    attention_output_gate: Flag = False
    """Attention layers gate their output with a sigmoid of a second query-sized projection
    (Qwen3-Next / Qwen3.5 attn_output_gate: q_proj is 2 * a * d wide)."""
    moe_latent_size: Count(MAX_HIDDEN_SIZE) | None = None
    """Latent MoE (Nemotron-3 Super/Ultra): routed experts work in this width, between an
    h -> latent and a latent -> h projection shared by all experts of the layer."""
    global_head_dim: Count(MAX_HEAD_DIM) | None = None
    """Head dim of the full-attention (non-window) layers when it differs from head_dim
    (Gemma 4: 512 global, 256 sliding); None = head_dim."""
    num_global_key_value_heads: Count(MAX_NUM_HEADS) | None = None
    """KV heads of the full-attention layers when they differ from num_key_value_heads
    (Gemma 4 with attention_k_eq_v: 2 global, 8 sliding); None = num_key_value_heads."""
    attention_k_eq_v: Flag = False
    """Full-attention layers have no v_proj: V comes from the K projection (Gemma 4
    Gemma4TextAttention: value_states = k_proj(x), normed without the RoPE), so the checkpoint
    has one KV projection there; the KV cache still holds K and V."""

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("num_key_value_heads") is None and "num_attention_heads" in data:
            data["num_key_value_heads"] = data["num_attention_heads"]
        hidden, heads = data.get("hidden_size"), data.get("num_attention_heads")
        if (
            data.get("head_dim") is None
            and isinstance(hidden, int)
            and isinstance(heads, int)
            and heads > 0
            and hidden % heads == 0
        ):
            data["head_dim"] = hidden // heads
        return data

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelSpec:
        if self.head_dim is None:
            raise ValueError(
                f"head_dim: required because hidden_size {self.hidden_size} is not divisible "
                f"by num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads: {self.num_key_value_heads} does not divide "
                f"num_attention_heads {self.num_attention_heads}"
            )
        experts = (self.num_local_experts, self.num_experts_per_tok)
        if (experts[0] is None) != (experts[1] is None):
            raise ValueError(
                "num_experts_per_tok: MoE needs both num_local_experts and num_experts_per_tok"
            )
        moe_only = {"moe_intermediate_size": self.moe_intermediate_size,
                    "num_shared_experts": self.num_shared_experts or None,
                    "shared_expert_intermediate_size": self.shared_expert_intermediate_size}
        given = [name for name, value in moe_only.items() if value is not None]
        if given and not self.is_moe:
            raise ValueError(
                f"{given[0]}: describes routed experts, but the model has none (set "
                "num_local_experts and num_experts_per_tok for MoE, or drop it)"
            )
        if self.is_moe and self.num_experts_per_tok > self.num_local_experts:
            raise ValueError(
                f"num_experts_per_tok: {self.num_experts_per_tok} exceeds "
                f"num_local_experts {self.num_local_experts}"
            )
        groups = (self.num_expert_groups, self.expert_groups_per_token)
        if (groups[0] is None) != (groups[1] is None):
            missing = "num_expert_groups" if groups[0] is None else "expert_groups_per_token"
            raise ValueError(f"{missing}: group-limited routing needs both num_expert_groups and "
                             f"expert_groups_per_token")
        if groups[0] is not None:
            if not self.is_moe:
                raise ValueError("num_expert_groups: describes routed experts, but the model has none")
            if self.num_local_experts % groups[0]:
                raise ValueError(f"num_expert_groups: {groups[0]} does not divide num_local_experts "
                                 f"{self.num_local_experts}")
            if groups[1] > groups[0]:
                raise ValueError(f"expert_groups_per_token: {groups[1]} exceeds num_expert_groups {groups[0]}")
            if groups[1] * self.num_local_experts // groups[0] < self.num_experts_per_tok:
                raise ValueError(f"expert_groups_per_token: {groups[1]} groups of "
                                 f"{self.num_local_experts // groups[0]} experts hold fewer than "
                                 f"num_experts_per_tok {self.num_experts_per_tok}")
        if self.num_dense_layers > (self.num_hidden_layers if self.is_moe else 0):
            raise ValueError(
                f"num_dense_layers: {self.num_dense_layers} needs an MoE model with at least "
                f"as many layers (num_hidden_layers {self.num_hidden_layers})"
            )
        if self.is_moe and self.num_dense_layers == self.num_hidden_layers:
            raise ValueError(f"num_dense_layers: {self.num_dense_layers} of {self.num_hidden_layers} layers leaves "
                             f"no MoE layer; drop the expert fields for a dense model")
        self._check_dense_layer_indices()
        mla = (self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim)
        if any(value is not None for value in mla) and None in (*mla, self.v_head_dim):
            raise ValueError(
                "kv_lora_rank: MLA needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim "
                "and v_head_dim together"
            )
        if (self.index_n_heads is None) != (self.index_head_dim is None) or (
                self.index_n_heads is not None and self.q_lora_rank is None):
            raise ValueError("index_n_heads: a DSA indexer needs index_n_heads and "
                             "index_head_dim together, on MLA with q_lora_rank")
        self._check_window()
        self._check_recurrent()
        if self.quantization_scope == "experts" and self.quantization is not None and not self.num_local_experts:
            raise ValueError("quantization_scope: experts quantizes the routed experts only, and this model "
                             "has none (num_local_experts); use all or mlp")
        if (problem := self.int4_group_problem()) is not None:
            raise ValueError(f"quantization_group_size: {problem}")
        if self.int8_activations and self.quantization != "int8":
            raise ValueError("int8_activations: int8 GEMM inputs go with int8 weights (quantization: int8)")
        if self.quantization_block_size is not None and self.quantization != "fp8":
            raise ValueError("quantization_block_size: scale blocks are an fp8 checkpoint's (quantization: fp8)")
        if self.secondary_quantization is not None and (
                self.quantization is None or self.quantization_scope == "all"):
            raise ValueError("secondary_quantization: the format of the matmuls quantization_scope "
                             "leaves out needs quantization with quantization_scope mlp or experts")
        self._check_global_attention()
        return self

    def int4_group_problem(self) -> str | None:
        """Why int4 weights cannot have this group size: the q, k, v, gate and up projections
        read the whole hidden state, so it must be whole groups (below the hidden size; a
        group as wide stands for one scale per output channel). vLLM 0.33.0's AWQ/GPTQ kernels
        raise on a part group (model_executor/layers/quantization/auto_awq.py); a quantizer
        could not have written one."""
        g, h = self.quantization_group_size, self.hidden_size
        if self.quantization != "int4" or g >= h or not h % g:
            return None
        return f"int4 groups of {g} do not divide the hidden size {h:,}"

    def _check_dense_layer_indices(self) -> None:
        indices = self.dense_layer_indices
        if indices is None:
            return
        if len(indices) != self.num_dense_layers:
            raise ValueError(f"dense_layer_indices: {len(indices)} layers listed, but num_dense_layers "
                             f"is {self.num_dense_layers}")
        if any(b <= a for a, b in zip(indices, indices[1:], strict=False)):
            raise ValueError("dense_layer_indices: must be ascending, each layer once")
        if indices and indices[-1] >= self.num_hidden_layers:
            raise ValueError(f"dense_layer_indices: layer {indices[-1]} is past the last "
                             f"(num_hidden_layers {self.num_hidden_layers}, counted from 0)")

    def _check_global_attention(self) -> None:
        k = self.num_global_key_value_heads
        if k is not None and self.num_attention_heads % k:
            raise ValueError(f"num_global_key_value_heads: {k} does not divide "
                             f"num_attention_heads {self.num_attention_heads}")
        shaped = (self.global_head_dim, k) != (None, None) or self.attention_k_eq_v
        if self.attention_k_eq_v and self.v_head_dim not in (None, self.global_head_dim or self.head_dim):
            raise ValueError(f"v_head_dim: {self.v_head_dim} cannot differ from the key head dim of "
                             "attention_k_eq_v layers (their V is the K projection)")
        if shaped and (self.is_mla or self.num_window_layers >= self.num_hidden_layers):
            raise ValueError("global_head_dim: full-attention layer shapes need full-attention "
                             "layers beside sliding-window ones (num_sliding_window_layers), "
                             "and no MLA")

    def _check_window(self) -> None:
        if self.sliding_window is None and self.num_sliding_window_layers:
            raise ValueError(f"num_sliding_window_layers: {self.num_sliding_window_layers} "
                             f"sliding-window layers need sliding_window (tokens)")
        if (self.num_sliding_window_layers or 0) > self.num_hidden_layers:
            raise ValueError(f"num_sliding_window_layers: {self.num_sliding_window_layers} exceeds "
                             f"num_hidden_layers {self.num_hidden_layers}")

    def _check_recurrent(self) -> None:
        num_layers = self.num_hidden_layers
        if (self.num_recurrent_layers + self.num_mlp_only_layers > num_layers
                or self.num_mixer_only_layers + self.num_mlp_only_layers > num_layers):
            raise ValueError(f"num_recurrent_layers: {self.num_recurrent_layers} recurrent, "
                             f"{self.num_mlp_only_layers} MLP-only and {self.num_mixer_only_layers} "
                             f"mixer-only layers do not fit in num_hidden_layers {num_layers}")
        if self.is_moe and self.num_mixer_only_layers > self.num_dense_layers:
            raise ValueError(f"num_dense_layers: {self.num_dense_layers} must count the "
                             f"{self.num_mixer_only_layers} mixer-only layers (they have no experts)")
        shape = {"mamba2": (self.mamba_num_heads, self.mamba_head_dim, self.ssm_state_size, self.n_groups,
                            self.conv_kernel),
                 "gated_deltanet": (self.linear_num_key_heads, self.linear_num_value_heads,
                                    self.linear_key_head_dim, self.linear_value_head_dim, self.conv_kernel)}
        if self.num_recurrent_layers and (self.recurrent_kind is None
                                          or any(v is None for v in shape[self.recurrent_kind])):
            raise ValueError("recurrent_kind: recurrent layers need recurrent_kind and its shape: "
                             "mamba2 mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups, "
                             "conv_kernel; gated_deltanet linear_num_key_heads, linear_num_value_heads, "
                             "linear_key_head_dim, linear_value_head_dim, conv_kernel")

    @property
    def num_chunked_layers(self) -> int:
        """Layers of chunked local attention (Llama 4's RoPE layers: all but every fourth, its
        NoPE layers; transformers' Llama4TextConfig no_rope_layer_interval 4); 0 without chunks."""
        if not self.attention_chunk_size:
            return 0
        return self.num_hidden_layers - self.num_hidden_layers // LLAMA4_NOPE_LAYER_INTERVAL

    @property
    def num_kv_window_layers(self) -> int:
        """Layers whose KV cache keeps a bounded span of each sequence: sliding-window layers, or
        Llama 4's chunked ones (vLLM 0.33.0 caches those with ChunkedLocalAttentionSpec in its
        hybrid KV cache manager, VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE on by default,
        admitting min(chunk + in-flight tokens, M) a request as a window of that size)."""
        return self.num_window_layers or self.num_chunked_layers

    @property
    def kv_window_tokens(self) -> int | None:
        """The span num_kv_window_layers keep: sliding_window, or the attention chunk."""
        return self.sliding_window or self.attention_chunk_size

    @property
    def num_window_layers(self) -> int:
        """Layers that attend within sliding_window (0 without a window)."""
        if self.sliding_window is None:
            return 0
        if self.num_sliding_window_layers is None:
            return self.num_hidden_layers
        return self.num_sliding_window_layers

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2 sec. 2.1): a compressed KV latent."""
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts is not None

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - self.num_dense_layers if self.is_moe else 0


class PeakTflops(_Spec):
    """Dense (no sparsity) datasheet peaks, TFLOP/s (int8: TOPS). None = unknown."""

    fp32: Quantity(MAX_TFLOPS) | None = None
    tf32: Quantity(MAX_TFLOPS) | None = None
    bf16: Quantity(MAX_TFLOPS) | None = None
    fp16: Quantity(MAX_TFLOPS) | None = None
    fp8: Quantity(MAX_TFLOPS) | None = None
    int8: Quantity(MAX_TFLOPS) | None = None
    fp4: Quantity(MAX_TFLOPS) | None = None


class AchievableTflops(_Spec):
    """Measured maximum achievable dense matmul, TFLOP/s. None = not measured."""

    bf16: Quantity(MAX_TFLOPS) | None = None
    fp16: Quantity(MAX_TFLOPS) | None = None
    fp8: Quantity(MAX_TFLOPS) | None = None
    fp4: Quantity(MAX_TFLOPS) | None = None


class DecodeHbmUtilization(_Spec):
    """Share of datasheet HBM bandwidth the serving engine's linear kernels stream their weights
    at in a decode step, by matmul precision (the kernels differ by weight format). None = not
    measured (cost/efficiency.py DECODE_HBM_UTILIZATION)."""

    bf16: Quantity(1.0) | None = None
    fp16: Quantity(1.0) | None = None
    fp8: Quantity(1.0) | None = None
    fp4: Quantity(1.0) | None = None


class IntraNodeLink(_Spec):
    """GPU-to-GPU fabric inside a node, per GPU, one direction."""

    kind: IntraKind
    bandwidth_gb_per_s: Quantity(MAX_BANDWIDTH_GB_PER_S)
    latency_us: Quantity(MAX_LATENCY_US, lower=0)
    peer_to_peer: Flag | None = None
    """False where the driver gives the GPUs no peer-to-peer access over PCIe (GeForce cards on
    NVIDIA's stock driver): NCCL then stages every transfer through host memory, and vLLM turns
    its custom all-reduce off (layout.intra_node_link prices the staged path). None (left out)
    is resolved on validation: a GPU's typical link True, a cluster's the GPU's own on the same
    fabric (ClusterSpec._gpu_peer_access), else True; a link built by model_copy may keep None:
    read peer_access."""
    p2p_bandwidth_gb_per_s: Quantity(MAX_BANDWIDTH_GB_PER_S) | None = None
    p2p_latency_us: Quantity(MAX_LATENCY_US, lower=0) | None = None
    """`plan probe`'s send/recv fit on this link (its own, beside the all-reduce's figures above):
    what a pipeline send costs; None: the link's figures (comm.p2p_seconds)."""

    @property
    def peer_access(self) -> bool:
        """Whether the GPUs reach each other's memory directly (peer_to_peer, None = True)."""
        return self.peer_to_peer is not False

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return units.gb_per_s_to_bytes_per_s(self.bandwidth_gb_per_s)

    @property
    def latency_seconds(self) -> float:
        return units.us_to_seconds(self.latency_us)


class InterNodeLink(_Spec):
    """Node networking: NICs per node, each NIC's line rate (Gb/s), one direction."""

    kind: InterKind
    num_nics_per_node: Count(MAX_NUM_NICS_PER_NODE)
    nic_bandwidth_gbit_per_s: Quantity(MAX_NIC_GBIT_PER_S)
    latency_us: Quantity(MAX_LATENCY_US, lower=0)
    p2p_bandwidth_gb_per_s_per_gpu: Quantity(MAX_BANDWIDTH_GB_PER_S) | None = None
    p2p_latency_us: Quantity(MAX_LATENCY_US, lower=0) | None = None
    """`plan probe`'s send/recv fit across nodes, per GPU with every local rank sending at once
    (as a pipeline boundary's TP ranks do): what a pipeline send costs; None: the NICs' share."""

    @property
    def node_bandwidth_bytes_per_s(self) -> float:
        return self.num_nics_per_node * units.gbit_per_s_to_bytes_per_s(
            self.nic_bandwidth_gbit_per_s
        )

    @property
    def latency_seconds(self) -> float:
        return units.us_to_seconds(self.latency_us)


MAX_GEMM_HALF_RATE_DIMENSION = 4096
"""Bound on a catalog GEMM half-rate dimension (fitted values are 128-384)."""
MAX_PAIR_PASSES = 4.0
"""Bound on a fused-MoE op's hidden-width passes per routed pair: the most any engine's path
makes is 4 (permute read and write, the per-pair down output's write, the top-k sum's read)."""
MAX_KERNEL_FLOOR_US = 10_000.0
"""Bound on a catalog kernel's fixed time (fitted MoE floors are 1-40 us)."""
MAX_COMPUTE_CAPABILITY = 20.0
"""Bound on a catalog compute capability (10.0 is Blackwell)."""

CUDA_RESERVED_GIB_TYPICAL = 0.61
"""nvidia-smi total minus the CUDA-visible total, the median over the GPUs whose visible total
planner/data/gpus.yaml cites (A100-40GB 0.61, A100-80GB 0.85, H100 0.54, H200 0.60, B200 0.71
GiB): the memory the driver keeps for itself, used for GPUs with no cited visible total."""


class MoeKernel(_Spec):
    """The serving engine's fused-MoE op for one expert weight format on one GPU, fitted to
    measurements: floor_us + max(touched experts' weight bytes / (hbm_bandwidth *
    hbm_utilization), FLOPs / (tflops * u(rows) u(N) u(K))), u(rows) = rows / (rows +
    half_rows) at the rows each touched expert gets (cost/serving_time.moe_kernel_seconds;
    docs/cost-model.md, Serving: the MoE kernels)."""

    floor_us: Quantity(MAX_KERNEL_FLOOR_US)
    """The op's time at negligible work: its kernels' launch and fixed cost."""
    hbm_utilization: Quantity(1.0)
    """Share of hbm_bandwidth the op streams touched experts' weights at."""
    tflops: Quantity(MAX_TFLOPS)
    """Its asymptotic matmul rate, TFLOP/s."""
    half_rows: Quantity(MAX_GEMM_HALF_RATE_DIMENSION)
    """Rows per expert at which it runs at half that rate (tile and wave quantization)."""
    pair_passes: StrictFloat(ge=0.0, le=MAX_PAIR_PASSES) = 0.0
    """Hidden-width passes over every routed (token, expert) pair's row outside the expert GEMMs'
    FLOPs (gather or permute, the per-pair output's write, the top-k sum's read), at the GPU's
    elementwise HBM rate: work that does not split with TP."""


class ServingMoeKernels(_Spec):
    """Measured fused-MoE kernels by the routed experts' weight format; None = not measured
    (the step then prices experts like dense GEMMs)."""

    bf16: MoeKernel | None = None
    fp8: MoeKernel | None = None
    mxfp4: MoeKernel | None = None
    nvfp4: MoeKernel | None = None
    marlin_mxfp4: MoeKernel | None = None
    """MXFP4 experts under vLLM's `--moe-backend marlin` (the weight-only Marlin MoE kernel,
    16-bit activations), which a deployment may choose over the default (mxfp4)."""
    flashinfer_mxfp8_mxfp4: MoeKernel | None = None
    """MXFP4 experts under `--moe-backend flashinfer_mxfp8`: FlashInfer's TRT-LLM MoE with the
    activations quantized to MXFP8 (vLLM's FLASHINFER_TRTLLM_MXFP4_MXFP8; Blackwell), which a
    deployment may choose over the default 16-bit-activation kernel (mxfp4)."""
    fp8_ep: MoeKernel | None = None
    """Block-fp8 experts under expert parallelism, where the engine picks another kernel than
    without it (vLLM on Hopper: FlashInfer's CUTLASS MoE instead of Triton); None = fp8's."""

    def kernel(self, weight_format: str, backend: str = "auto") -> MoeKernel | None:
        """The kernel of this weight format under this MoE backend (auto: the engine's default)."""
        name = weight_format if backend == "auto" else f"{backend}_{weight_format}"
        return getattr(self, name, None)

    def ep_kernel(self, weight_format: str, ep: int) -> MoeKernel | None:
        """<format>_ep: the engine's own kernel for this format under EP (ep > 1), None where
        the catalog has none (the format's default kernel runs under EP too)."""
        return getattr(self, f"{weight_format}_ep", None) if ep > 1 else None

    def for_ep(self, weight_format: str, ep: int) -> MoeKernel | None:
        """The engine's kernel for this format at this EP degree: ep_kernel, else <format>'s."""
        return self.ep_kernel(weight_format, ep) or getattr(self, weight_format, None)


MAX_PLAUSIBLE_CURVE_BYTES_PER_S = 1e13
"""The most bytes a second a measured collective curve may claim at any size (its size over its
time), 10 TB/s: over five times the fastest GPU link shipped (NVLink 5, 1.8 TB/s a GPU, NVIDIA
GB200 NVL72 data sheet). Above it the curve is not a measurement (a mistyped unit, swapped
columns): a profile claiming 1 GB in 10 us moved a plan's TPOT by 21%."""


class _Curve(_Spec):
    """Measured times by message size: at least two sizes (one point cannot tell latency from
    bandwidth), strictly increasing, one time each, none faster than
    MAX_PLAUSIBLE_CURVE_BYTES_PER_S. Times are taken as measured, dips included (NCCL switching
    protocols; a CPU probe's first sizes can take longer than its last)."""

    sizes_bytes: list[Count(2**48)]
    median_seconds: list[Quantity(3600.0, lower=0)]

    @model_validator(mode="after")
    def _same_length(self) -> _Curve:
        if len(self.sizes_bytes) != len(self.median_seconds) or len(self.sizes_bytes) < 2:
            raise ValueError("sizes_bytes and median_seconds must be equally long, with at least two sizes "
                             "(one point cannot separate latency from bandwidth)")
        if list(self.sizes_bytes) != sorted(set(self.sizes_bytes)):
            raise ValueError("sizes_bytes must be strictly increasing")
        for size, seconds in zip(self.sizes_bytes, self.median_seconds, strict=True):
            if size > MAX_PLAUSIBLE_CURVE_BYTES_PER_S * seconds:
                rate = size / seconds if seconds else math.inf
                raise ValueError(f"{size:,} bytes in {seconds:g} s is {rate:.3g} B/s, above any "
                                 f"link ({MAX_PLAUSIBLE_CURVE_BYTES_PER_S:.0e} B/s): not a measurement (units?)")
        return self


class CollectiveCurve(_Curve):
    """Measured medians of one collective for one link class and group size (from `plan probe`):
    sizes_bytes is the all-reduce buffer, or for all-to-all the bytes each rank sends in total."""

    link: Literal["intra_node", "inter_node", "world"]
    num_ranks: Count(MAX_NUM_GPUS)
    mode: str | None = None
    """How the probe laid the group over the ranks (its own label; not read by the planner)."""


class EngineAllreduceCurve(_Curve):
    """The serving engine's (vLLM's) TP all-reduce as its communicator dispatches it (custom
    one-shot / two-shot kernels, symmetric memory, NCCL for the largest messages), measured for
    a TP group of num_ranks inside one NVLink node. docs/cost-model.md (Serving: one engine
    step, its TP all-reduce)."""

    num_ranks: Count(MAX_NUM_GPUS)


class FusedAllreduceCurve(EngineAllreduceCurve):
    """vLLM's fused all-reduce + RMSNorm (AllReduceFusionPass, on by default on Hopper and
    Blackwell with TP > 1: FlashInfer's trtllm_allreduce_fusion, one-shot / two-shot kernels
    over NVLink peer memory) for a TP group of num_ranks inside one node: its measured time by
    message size, and the largest message vLLM fuses (larger ones go to its unfused all-reduce).
    docs/cost-model.md (Serving: one engine step, its TP all-reduce)."""

    max_mib: Quantity(MAX_MEMORY_GIB * units.BYTES_PER_GIB / units.BYTES_PER_MIB)
    """The largest message (MiB) vLLM fuses at this group size (FI_ALLREDUCE_FUSION_MAX_SIZE_MB)."""

    def fuses(self, message_bytes: float) -> bool:
        return message_bytes <= self.max_mib * units.BYTES_PER_MIB


class GPU(_Spec):
    """One accelerator model: memory, HBM bandwidth, peaks, typical fabric."""

    name: Name()
    aliases: list[str] = Field(default_factory=list)
    source: str | None = None
    memory_gib: Quantity(MAX_MEMORY_GIB)
    """Total device memory as nvidia-smi / rocm-smi report it (display, batch tiers)."""
    cuda_visible_memory_gib: Quantity(MAX_MEMORY_GIB) | None = None
    """Total as the CUDA runtime reports it (torch.cuda.mem_get_info()[1], the "total capacity"
    of PyTorch's out-of-memory message): what vLLM's gpu_memory_utilization multiplies. When not
    given: memory_gib - CUDA_RESERVED_GIB_TYPICAL."""
    hbm_bandwidth_gb_per_s: Quantity(MAX_BANDWIDTH_GB_PER_S)
    peak_tflops: PeakTflops
    achievable_matmul_tflops: AchievableTflops = Field(default_factory=AchievableTflops)
    serving_matmul_tflops: AchievableTflops = Field(default_factory=AchievableTflops)
    """The serving engine's own linear kernels (vLLM), measured at prefill shapes: the rate the
    serving step's GEMMs run at where given, else achievable_matmul_tflops (training's
    best-kernel figure). docs/cost-model.md (Serving: one engine step)."""
    serving_decode_hbm_utilization: DecodeHbmUtilization = Field(default_factory=DecodeHbmUtilization)
    """The serving engine's (vLLM) decode weight stream by matmul precision, where measured:
    fitted from how TPOT falls with TP (bench/decode_bandwidth_calibration.py). docs/cost-model.md
    (Serving: one engine step)."""
    compute_capability: Quantity(MAX_COMPUTE_CAPABILITY) | None = None
    """NVIDIA's compute capability (major.minor: 8.0 Ampere, 8.9 Ada, 9.0 Hopper, 10.0
    Blackwell); None when not NVIDIA or not given. Gates what needs an architecture, e.g.
    Transformer Engine's block-scaled fp8 (>= 9.0)."""
    sm_count: Count(MAX_SM_COUNT) | None = None
    """Streaming multiprocessors (cudaGetDeviceProperties multiProcessorCount): what kernels that
    hold SMs while others run share (DeepEP's 20 under Megatron's combined 1F1B). None: not given."""
    serving_moe_kernels: ServingMoeKernels = Field(default_factory=ServingMoeKernels)
    """The serving engine's (vLLM) fused-MoE kernels by expert weight format, where measured."""
    serving_allreduce: list[FusedAllreduceCurve] = Field(default_factory=list)
    """The serving engine's (vLLM) fused all-reduce + RMSNorm for TP inside one NVLink node, by
    group size, where measured; none = the TP all-reduces are NCCL's (the probe's curves or the
    ring model)."""

    serving_allreduce_unfused: list[EngineAllreduceCurve] = Field(default_factory=list)
    """The serving engine's (vLLM) TP all-reduce where it does not fuse it, inside one NVLink
    node, by group size, where measured; none = NCCL's (the probe's curves or the ring model)."""

    gemm_half_rate_dimension: Quantity(MAX_GEMM_HALF_RATE_DIMENSION) | None = None
    """Measured GEMM dimension at half the asymptotic matmul rate, u(x) = x/(x + this)
    (cost/efficiency.py GEMM_HALF_RATE_DIMENSION when not given)."""
    flash_attention_forward_fraction: Quantity(1.0) | None = None
    """Measured flash-attention forward rate as a share of the dense 16-bit peak at head dim 128
    (cost/efficiency.py FLASH_ATTENTION_FORWARD_FRACTION_OF_PEAK when not given)."""
    flash_attention_head_dim_half: Quantity(4096.0) | None = None
    """Head dim at which the flash kernel's per-score softmax work costs as much as its matmuls:
    smaller head dims run at (d/(d + this)) / (128/(128 + this)) of the head-dim-128 share
    (cost/efficiency.py FLASH_ATTENTION_HEAD_DIM_HALF when not given)."""
    elementwise_hbm_utilization: Quantity(1.0) | None = None
    """Measured share of hbm_bandwidth a memory-bound elementwise kernel sustains at a layer's
    tensor sizes (cost/efficiency.py ELEMENTWISE_HBM_UTILIZATION when not given)."""
    intra_node: IntraNodeLink | None = None
    """Typical fabric of a node built from this GPU."""
    inter_node: InterNodeLink | None = None
    """Typical networking of such a node."""
    typical_gpus_per_node: Count(MAX_GPUS_PER_NODE) = 8
    """The node size the typical inter_node figures describe."""

    @model_validator(mode="after")
    def _typical_peer_access(self) -> GPU:
        """The typical fabric's peer access, True where left out (a ClusterSpec link that leaves
        it out takes this one)."""
        link = self.intra_node
        if link is None or link.peer_to_peer is not None:
            return self
        return self.model_copy(update={"intra_node": link.model_copy(update={"peer_to_peer": True})})

    @model_validator(mode="after")
    def _visible_within_total(self) -> GPU:
        visible = self.cuda_visible_memory_gib
        if visible is not None and visible > self.memory_gib:
            raise ValueError(f"cuda_visible_memory_gib: {visible:g} GiB is more than memory_gib "
                             f"{self.memory_gib:g} GiB (CUDA sees at most the device's memory)")
        if visible is None and self.memory_gib <= CUDA_RESERVED_GIB_TYPICAL:
            raise ValueError(f"memory_gib: {self.memory_gib:g} GiB leaves nothing after the "
                             f"{CUDA_RESERVED_GIB_TYPICAL:g} GiB the driver reserves (give cuda_visible_memory_gib)")
        return self

    @property
    def memory_bytes(self) -> int:
        return units.gib_to_bytes(self.memory_gib)

    @property
    def cuda_visible_memory_bytes(self) -> int:
        visible = self.cuda_visible_memory_gib
        return units.gib_to_bytes(self.memory_gib - CUDA_RESERVED_GIB_TYPICAL if visible is None else visible)

    @property
    def hbm_bytes_per_s(self) -> float:
        return units.gb_per_s_to_bytes_per_s(self.hbm_bandwidth_gb_per_s)

    def peak_flops_per_s(self, precision: str) -> float | None:
        tflops = getattr(self.peak_tflops, precision)
        return None if tflops is None else units.tflops_to_flops_per_s(tflops)

    def achievable_flops_per_s(self, precision: str) -> float | None:
        tflops = getattr(self.achievable_matmul_tflops, precision, None)
        return None if tflops is None else units.tflops_to_flops_per_s(tflops)

    def serving_flops_per_s(self, precision: str) -> float | None:
        """The serving engine's measured GEMM rate, else the achievable one (None: neither)."""
        tflops = getattr(self.serving_matmul_tflops, precision, None)
        return self.achievable_flops_per_s(precision) if tflops is None else units.tflops_to_flops_per_s(tflops)

    def decode_hbm_utilization(self, precision: str) -> float | None:
        """The measured decode weight-stream share for this matmul precision, or None."""
        return getattr(self.serving_decode_hbm_utilization, precision, None)

    def fused_allreduce(self, num_ranks: int, message_bytes: float) -> FusedAllreduceCurve | None:
        """The measured curve that prices this message, None where vLLM would not fuse it (a
        larger message, a group size it does not fuse) or nothing was measured."""
        curve = _curve_for_ranks(self.serving_allreduce, num_ranks)
        return curve if curve is not None and curve.fuses(message_bytes) else None

    def unfused_allreduce(self, num_ranks: int) -> EngineAllreduceCurve | None:
        """The measured curve of vLLM's unfused all-reduce for this group size, or None."""
        return _curve_for_ranks(self.serving_allreduce_unfused, num_ranks)


def _curve_for_ranks(curves: list[EngineAllreduceCurve], num_ranks: int) -> EngineAllreduceCurve | None:
    """The curve measured for a group of num_ranks, or None."""
    return next((c for c in curves if c.num_ranks == num_ranks), None)


class Measured(_Spec, extra="allow"):
    """What `plan probe` measured; free-form except the curves the planner reads."""

    date: str | None = None
    backend: str | None = None
    flags: list[str] = Field(default_factory=list)
    allreduce_curves: list[CollectiveCurve] = Field(default_factory=list)
    alltoall_curves: list[CollectiveCurve] = Field(default_factory=list)
    allgather_curves: list[CollectiveCurve] = Field(default_factory=list)
    """sizes_bytes is the gathered buffer (what every rank ends with), as nccl-tests sizes it."""
    reduce_scatter_curves: list[CollectiveCurve] = Field(default_factory=list)
    """sizes_bytes is the buffer every rank reduces (its input), as nccl-tests sizes it."""

    CURVE_LISTS = ("allreduce_curves", "alltoall_curves", "allgather_curves", "reduce_scatter_curves")

    @model_validator(mode="after")
    def _known_curve_lists(self) -> Measured:
        """The rest is free-form, but a curve list under another name (allreduce_curve) would be
        ignored while the profile still says its links were measured."""
        for key in object.__getattribute__(self, "_extra") or {}:
            if key.endswith(("_curve", "_curves")):
                raise ValueError(f"{key}: not a curve list the planner reads ({', '.join(self.CURVE_LISTS)})")
        for key in self.CURVE_LISTS:
            seen = set()
            for curve in getattr(self, key):
                if (curve.link, curve.num_ranks) in seen:
                    raise ValueError(f"{key}: two curves for {curve.link} at {curve.num_ranks} ranks (one each)")
                seen.add((curve.link, curve.num_ranks))
        return self


AllreduceCurve = CollectiveCurve  # the name the cost model and older code import


class ClusterSpec(_Spec):
    """A homogeneous cluster: num_nodes x gpus_per_node of one GPU."""

    name: Name()
    source: str | None = None
    num_nodes: Count(MAX_NUM_GPUS)
    gpus_per_node: Count(MAX_GPUS_PER_NODE)
    gpu: GPU
    intra_node: IntraNodeLink | None = None
    inter_node: InterNodeLink | None = None
    measured: Measured | None = None

    @field_validator("gpu", mode="before")
    @classmethod
    def _resolve_gpu(cls, value: Any, info: ValidationInfo) -> Any:
        """A GPU given by name is looked up by the resolver the loader passes in the
        validation context (the catalog's), so this schema never imports the catalog."""
        if isinstance(value, str):
            resolve = (info.context or {}).get("resolve_gpu")
            if resolve is None:
                raise ValueError("a GPU name needs the GPU catalog: load the profile with planner.catalog")
            return resolve(value)
        if isinstance(value, dict) and isinstance(value.get("peak_tflops"), dict) and not _sixteen_bit_rate_given(value):
            raise ValueError("peak_tflops.bf16: missing: no 16-bit tensor-core rate (peak_tflops.bf16 or .fp16, or "
                             "achievable_matmul_tflops.bf16) to price prompts and batched decode; give one, or "
                             "measure it with `plan probe`")
        return value

    @model_validator(mode="after")
    def _gpu_peer_access(self) -> ClusterSpec:
        """A link that leaves `peer_to_peer` out takes the GPU's own on the same fabric (the
        catalog's), else True: peer access is the card's and its driver's (GeForce cards have none
        on NVIDIA's stock driver), not the topology's, so a profile copied from an L40S one for
        RTX 4090s had priced vLLM's custom all-reduce on them (a review: 375 tok/s, 261 staged)."""
        link = self.intra_node
        if link is None or link.peer_to_peer is not None:
            return self
        own = self.gpu.intra_node
        access = own.peer_access if own is not None and own.kind == link.kind else True
        return self.model_copy(update={"intra_node": link.model_copy(update={"peer_to_peer": access})})

    @model_validator(mode="after")
    def _links_present(self) -> ClusterSpec:
        if self.num_gpus > MAX_NUM_GPUS:
            raise ValueError(
                f"num_nodes: {self.num_nodes:,} nodes x {self.gpus_per_node} GPUs = "
                f"{self.num_gpus:,} GPUs, more than the {MAX_NUM_GPUS:,} a cluster is taken to have"
            )
        if self.gpus_per_node > 1 and self.intra_node is None:
            raise ValueError("intra_node: required when gpus_per_node > 1")
        if self.num_nodes > 1 and self.inter_node is None:
            raise ValueError("inter_node: required when num_nodes > 1")
        for key in Measured.CURVE_LISTS if self.measured is not None else ():
            for curve in getattr(self.measured, key):
                most = {"intra_node": self.gpus_per_node, "inter_node": self.num_gpus, "world": self.num_gpus}[curve.link]
                if curve.link == "inter_node" and self.num_nodes == 1:
                    raise ValueError(f"measured.{key}: an inter_node curve, but the cluster has one node")
                if curve.num_ranks > most:
                    raise ValueError(f"measured.{key}: {curve.num_ranks} ranks on one {curve.link} curve, more than "
                                     f"the {most} GPUs such a group can span here")
        return self

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def inter_node_bandwidth_bytes_per_s_per_gpu(self) -> float:
        """A node's NIC bandwidth shared by all its GPUs when they all cross at once."""
        assert self.inter_node is not None
        return self.inter_node.node_bandwidth_bytes_per_s / self.gpus_per_node

    def allreduce_curve(self, link: str, num_ranks: int) -> CollectiveCurve | None:
        return _find_curve(self.measured.allreduce_curves if self.measured else [], link, num_ranks)

    def alltoall_curve(self, link: str, num_ranks: int) -> CollectiveCurve | None:
        return _find_curve(self.measured.alltoall_curves if self.measured else [], link, num_ranks)

    def allgather_curve(self, link: str, num_ranks: int) -> CollectiveCurve | None:
        return _find_curve(self.measured.allgather_curves if self.measured else [], link, num_ranks)

    def reduce_scatter_curve(self, link: str, num_ranks: int) -> CollectiveCurve | None:
        return _find_curve(self.measured.reduce_scatter_curves if self.measured else [], link, num_ranks)


def _sixteen_bit_rate_given(gpu: dict[str, Any]) -> bool:
    """Does an inline GPU (a profile's `gpu:` mapping) give a 16-bit tensor rate, peak or
    measured? Without one no layout can be priced (serving_time.no_tensor_rate_error)."""
    rates = [gpu.get(table) for table in ("peak_tflops", "achievable_matmul_tflops", "serving_matmul_tflops")]
    return any(isinstance(table, dict) and any(table.get(dtype) is not None for dtype in ("bf16", "fp16"))
               for table in rates)


def _find_curve(curves: list[CollectiveCurve], link: str, num_ranks: int) -> CollectiveCurve | None:
    return next((c for c in curves if c.link == link and c.num_ranks == num_ranks), None)


PROBLEMS = {
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "finite_number": "must be a finite number",
    "string_type": "must be a string",
    "dict_type": "must be a mapping of fields",
    "model_type": "must be a mapping of fields",
    "list_type": "must be a list",
}
"""Our wording for the schema's type errors (its own says "Input should be ...")."""


def format_validation_error(origin: str, error: ValidationError) -> str:
    """One line: origin: field: problem (the first error; the schema lists the rest)."""
    first = error.errors()[0]
    loc = ".".join(str(part) for part in first["loc"]) or "(top level)"
    kind = first["type"]
    if kind == "extra_forbidden":
        problem = "unknown field"
    elif kind == "missing":
        problem = "missing required field"
    else:
        problem = PROBLEMS.get(kind) or _bound_problem(kind, first.get("ctx", {})) or first[
            "msg"].removeprefix("Value error, ")
        if "input" in first and not isinstance(first["input"], dict | list) and "(got " not in problem:
            problem += f" (got {_short_repr(first['input'])})"
            if kind == "float_type" and isinstance(first["input"], str) and "e" in first["input"].lower() \
                    and _is_number(first["input"]):
                # YAML 1.1 (PyYAML) reads 1e-5 as text: an exponent needs a dot and a sign
                problem += (f"; YAML reads an exponent without a dot in the number and a sign after the e as "
                            f"text: write it as {yaml_float(first['input'])}")
    if kind == "value_error" and ":" in problem and loc == "(top level)":
        return f"{origin}: {problem}"
    more = len(error.errors()) - 1
    suffix = f" (+{more} more)" if more else ""
    return f"{origin}: {loc}: {problem}{suffix}"


def yaml_float(text: str) -> str:
    """A number written as YAML 1.1 reads it as one: a dot in the mantissa, a sign in the
    exponent (1e-5 -> 1.0e-5, 1.0e30 -> 1.0e+30)."""
    mantissa, _, exponent = text.strip().lower().partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    if exponent[:1] not in ("+", "-"):
        exponent = "+" + exponent
    return f"{mantissa}e{exponent}"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _bound_problem(kind: str, ctx: dict[str, Any]) -> str | None:
    if kind == "literal_error" and "expected" in ctx:
        return f"must be {ctx['expected']}"
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']:,} (a plausibility bound)"
    if kind == "greater_than_equal":
        return f"must be at least {ctx['ge']:,}"
    if kind == "greater_than":
        return f"must be greater than {ctx['gt']:,}"
    return None


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def read_spec_text(path: Path) -> str:
    """A spec file's text: at most MAX_SPEC_FILE_BYTES of UTF-8, read before any parsing
    (so /dev/zero or a 50 MB file is refused at once, not parsed for minutes). A pipe or a
    device is refused before it is opened: a FIFO would block the open forever (found by a
    fuzz sweep)."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise SpecError(f"{path}: not a regular file (a pipe or a device)")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SPEC_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc.__class__.__name__}") from None
    if len(data) > MAX_SPEC_FILE_BYTES:
        raise SpecError(f"{path}: larger than {MAX_SPEC_FILE_BYTES // units.BYTES_PER_MIB} MiB: "
                        f"not a model spec, config.json or hardware profile")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: cannot read: not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                        f"offset {exc.start}; a binary file?)") from None


def check_size(data: Any, origin: str) -> None:
    """Refuse a document nested deeper than any spec, or whose YAML aliases expand to more
    than MAX_SPEC_NODES values (a "billion laughs" file is small but validates forever)."""
    stack, seen = [(data, 1)], 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_SPEC_NODES:
            raise SpecError(f"{origin}: more than {MAX_SPEC_NODES:,} values (YAML aliases?): not a spec")
        if depth > MAX_SPEC_DEPTH:
            raise SpecError(f"{origin}: nested more than {MAX_SPEC_DEPTH} levels deep: not a spec")
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently: `hidden_size` written twice would plan a different model than the user reads)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the schema rejects it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's core schema for booleans and integers, not PyYAML's YAML 1.1: `yes`, `on`, `no` stay
# strings (the schema refuses them where a flag is due), `032` is 32 (1.1: octal 26) and `1:08:16`
# a string (1.1: sexagesimal 4096); 0o17 and 0x1f keep their bases. Floats keep 1.1's resolver.
_YAML_11_RESOLVED = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int")
UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _YAML_11_RESOLVED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                      list("tTfF"))
UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:int",
                                      re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                                      list("-+0123456789"))


def _construct_yaml_12_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """An integer as YAML 1.2 reads it: decimal unless 0o or 0x says otherwise (leading zeros
    are decimal)."""
    value = str(loader.construct_scalar(node)).replace("_", "")
    if value.startswith(("0o", "0x")):
        return int(value[2:], 8 if value[1] == "o" else 16)
    return int(value, 10)


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_yaml_12_int)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """Safe-load a YAML file whose top level must be a mapping (no key given twice)."""
    text = read_spec_text(path)
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark, opened = exc.problem_mark, exc.context_mark
        where = f"line {mark.line + 1}" if mark is not None else "(parse)"
        # an unclosed bracket or quote is found where the file ends: name where it opened
        started = (f" ({exc.context} at line {opened.line + 1})"
                   if opened is not None and exc.context and (mark is None or opened.line != mark.line) else "")
        raise SpecError(f"{path}: {where}: malformed YAML: {exc.problem or 'parse error'}{started}") from None
    except yaml.YAMLError as exc:  # a ReaderError: a control character, i.e. not a text file
        reason = getattr(exc, "reason", None) or "parse error"
        raise SpecError(f"{path}: (parse): malformed YAML: {reason}") from None
    except RecursionError:
        raise SpecError(f"{path}: (parse): malformed YAML: nested too deeply") from None
    except ValueError as exc:  # a number of more than 4,300 digits (Python's limit), a bad date
        raise SpecError(f"{path}: (parse): malformed YAML: {str(exc).split(';')[0]}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: (top level): expected a mapping of fields")
    check_size(data, str(path))
    return data


def validate(schema: type[_Spec], data: dict[str, Any], origin: str,
             context: dict[str, Any] | None = None) -> Any:
    try:
        return schema.model_validate(data, context=context)
    except ValidationError as exc:
        raise SpecError(format_validation_error(origin, exc)) from None
    except SpecError as exc:  # raised by nested resolution (unknown GPU name)
        raise SpecError(f"{origin}: {exc}") from None


def load_model(path: Path) -> ModelSpec:
    return validate(ModelSpec, read_yaml_mapping(path), str(path))


def load_cluster(path: Path, resolve_gpu: Callable[[str], GPU] | None = None) -> ClusterSpec:
    """A hardware profile; `resolve_gpu` turns a `gpu: NAME` into the catalog's GPU
    (planner.catalog.load_cluster passes its own)."""
    context = None if resolve_gpu is None else {"resolve_gpu": resolve_gpu}
    return validate(ClusterSpec, read_yaml_mapping(path), str(path), context)
