"""Import a Hugging Face `config.json` as a ModelSpec (field names map one to one).

Read: the Llama-family shape keys, `torch_dtype` (or `dtype`), `head_dim`,
`tie_word_embeddings`, `rope_theta` (for the Megatron-LM command; in transformers v5's
`rope_parameters` too, with_rope_parameters), RoPE scaling (Llama 3's factor; the context a
linear or dynamic scaling extends, rope_extended_positions); `sliding_window` and
which layers use it (`layer_types`, the Gemma and Qwen2 patterns); MoE keys under each
family's name (`num_local_experts` / `num_experts` / `n_routed_experts`,
`num_experts_per_tok`, `moe_intermediate_size`, `n_shared_experts` and shared expert sizes,
the dense/MoE layer pattern); MLA ranks and head dims; `num_nextn_predict_layers`; hybrid
layers (Nemotron-H's `hybrid_override_pattern` / `layers_block_type` with the Mamba2 shape
and `moe_latent_size`, Qwen3.5's `linear_attention` layer_types with the Gated DeltaNet
`linear_*` shape, recurrent_fields); and the
weight format from `quantization_config` (fp8; AWQ/GPTQ/compressed-tensors bits ->
int4/int8; modelopt FP8/NVFP4 and per-module MIXED_PRECISION; mxfp4) or ModelOpt's `hf_quant_config.json` beside
config.json. Everything else in the file (tokenizer ids, ...) does not
affect the plan and is ignored; layers the cost model does not describe (UNMODELLED_KEYS)
are refused in one line.

The planner plans decoder-only language models: an encoder (BERT), an encoder-decoder
(T5, Whisper) or a vision model is refused with the reason. A multimodal wrapper (Llava,
Gemma 3, Llama 4, Mistral 3) is planned as its text model, read from `text_config`; its
vision or audio tower is not counted (the spec's `source` says so).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from planner.hf_mixed_precision import (
    MIXED_LAYERS_FIELD,
    mixed_precision_fields,
    mixed_precision_layers,
)
from planner.specs import MAX_NUM_LAYERS, ModelSpec, SpecError, check_size, read_spec_text, validate

SHAPE_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "moe_intermediate_size",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "index_n_heads",
    "index_head_dim",
    "attention_bias",
    "mlp_bias",
    "rope_theta",
)
REQUIRED_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
"""Without these at the top level, a `text_config` (multimodal wrapper) holds the model."""

GATED_MLP_MODEL_TYPES = frozenset({
    "llama", "llama4_text", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "gemma", "gemma2", "gemma3", "gemma3_text", "phi3", "phimoe", "granite", "granitemoe",
    "olmo", "olmo2", "cohere", "cohere2", "deepseek_v2", "deepseek_v3", "stablelm", "minicpm",
    "dbrx", "glm", "glm4", "internlm2", "exaone", "gpt_oss", "kimi_k2", "deepseek_v32",
    "glm4_moe", "glm_moe_dsa", "minimax_m2", "minimax_m3", "step3p7", "mimo", "gemma4", "gemma4_text",
})
"""Families whose MLP multiplies a gate (act(x W_gate) * x W_up, then W_down: 3 matrices)
whatever the activation is called: LlamaMLP, MistralMLP, MixtralBlockSparseTop2MLP (w1, w3,
w2), Qwen2MLP, Qwen3MLP, GemmaMLP / Gemma2MLP / Gemma3MLP (gelu_pytorch_tanh, gated),
Gemma4TextMLP and Gemma4TextExperts (gate_up_proj), Phi3MLP (gate_up_proj), GraniteMLP, OlmoMLP, CohereMLP, DeepseekV3MLP, StableLmMLP,
DbrxExpertGLU, Glm4MLP: each family's transformers modeling_<family>.py; internlm2,
exaone and minicpm from their remote-code modeling files (w1/w3, gate/up)."""
NON_GATED_MLP_MODEL_TYPES = frozenset({
    "gpt2", "gpt_neox", "gptj", "gpt_neo", "gpt_bigcode", "opt", "bloom", "falcon", "phi",
    "starcoder2", "mpt", "codegen", "persimmon", "nemotron",
})
"""Families with a two-matrix MLP (up, activation, down): GPT2MLP (c_fc, c_proj),
GPTNeoXMLP (dense_h_to_4h), GPTJMLP (fc_in, fc_out), OPT (fc1, fc2), BloomMLP, FalconMLP,
PhiMLP (fc1, fc2), Starcoder2MLP (c_fc, c_proj), MptMLP, PersimmonMLP and NemotronMLP
(relu^2): transformers modeling_<family>.py."""
LAYERNORM_MODEL_TYPES = NON_GATED_MLP_MODEL_TYPES
"""Families normed by LayerNorm, not RMSNorm: the two-matrix-MLP families above, each
modeling_<family>.py's nn.LayerNorm (NemotronLayerNorm1P for nemotron)."""
LAYERNORM_1P_MODEL_TYPES = frozenset({"nemotron"})
"""LayerNorm with the weight stored as gamma - 1 (transformers modeling_nemotron.py NemotronLayerNorm1P)."""
GATED_ACTIVATIONS = {"silu", "swiglu", "swish", "gelu_pytorch_tanh_gated", "geglu", "swigluoai"}
"""A family in neither list: gated if its activation names a gated unit (SwiGLU-era
configs say silu; swigluoai is gpt-oss's clamped SwiGLU, gate and up in one matrix);
anything else (relu2, Nemotron's squared ReLU; gelu) is a two-matrix MLP."""
TIED_BY_DEFAULT_MODEL_TYPES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "cohere", "cohere2"})
"""Families whose config class defaults tie_word_embeddings to true (GemmaConfig,
Gemma2Config, Gemma3TextConfig, CohereConfig, Cohere2Config: Command R7B's and Command A's
config.json say only use_embedding_sharing: true), so a config.json without the key ties them;
the Llama, Mistral, Qwen and Phi-3 config classes default to false."""
QKV_BIAS_MODEL_TYPES = {"qwen2", "qwen2_moe"}
QK_NORM_MODEL_TYPES = {"qwen3", "qwen3_moe"}
"""Families with an RMSNorm on each head's query and key (transformers' Qwen3Attention q_norm /
k_norm over head_dim); other families say it with use_qk_norm and qk_norm_type "per_head", or
with qk_norm: true (Apertus)."""
PER_HEAD_USE_QK_NORM_MODEL_TYPES = {"bailing_moe"}
"""Families whose use_qk_norm alone is that per-head RMSNorm (Ling-2.0: vLLM bailing_moe.py
query_layernorm / key_layernorm over head_dim); Llama 4's use_qk_norm is a weightless L2 norm."""
UNMODELLED_KEYS = {
    "compress_ratios": "compressed sparse attention (DeepSeek-V4 compress_ratios)",
    "linear_attn_config": "linear-attention layers",
}
"""Keys whose architecture the parameter and KV formulas do not model: such a config is
refused in one line naming the feature, never planned with a wrong count."""
UNMODELLED_NONZERO_KEYS = {
    "hidden_size_per_layer_input": "per-layer input embeddings (Gemma 4 hidden_size_per_layer_input)",
    "num_kv_shared_layers": "layers reusing an earlier layer's KV (Gemma 4 num_kv_shared_layers)",
}
"""Keys refused only when set to something other than 0 (Gemma 4 configs carry them as 0)."""
KNOWN_LAYER_TYPES = {"full_attention", "sliding_attention", "chunked_attention", "linear_attention"}
"""layer_types entries the cost model describes: "sliding_attention" layers attend within
`sliding_window` (window_fields); "chunked_attention" (Llama 4's local chunks) is planned as
full attention (it only caps the KV a layer keeps, so counting it in full over-reserves KV,
it never under-reserves it); "linear_attention" is a Gated DeltaNet layer (Qwen3-Next,
Qwen3.5: the linear_* keys), refused without them (MiniMax's lightning attention).
"deepseek_sparse_attention" (GLM-5.2's and 5.3's NVFP4 configs name every layer so) is MLA
with the DSA indexer the importer reads from index_n_heads / index_head_dim: known when the
config has them."""
DEFAULT_SLIDING_WINDOW_PATTERN = {"gemma3": 6, "gemma3_text": 6, "cohere2": 4, "exaone4": 4}
"""Each family's config class default sliding_window_pattern (Gemma3TextConfig 6, Cohere2Config 4,
Exaone4Config 4): layer i is global when (i + 1) % pattern == 0, the others slide."""
FAMILY_DEFAULTS = {"gemma3_text": {"vocab_size": 262_208, "max_position_embeddings": 131_072}}
"""Keys a family's config class fills in when config.json leaves them out (Gemma3TextConfig's
defaults: google/gemma-3-27b-it's text_config names neither)."""
DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "half": "float16"}

NOT_DECODER_MODEL_TYPES = {
    **dict.fromkeys(
        ("bert", "roberta", "xlm-roberta", "xlm-roberta-xl", "distilbert", "albert", "electra",
         "deberta", "deberta-v2", "camembert", "mpnet", "modernbert", "longformer", "big_bird",
         "ernie", "nomic_bert", "xlnet", "layoutlm", "layoutlmv2", "layoutlmv3", "funnel"),
        "an encoder-only model"),
    **dict.fromkeys(
        ("t5", "mt5", "umt5", "longt5", "switch_transformers", "bart", "mbart", "pegasus",
         "pegasus_x", "marian", "led", "blenderbot", "blenderbot-small", "prophetnet", "fsmt",
         "nllb-moe", "m2m_100", "encoder-decoder", "vision-encoder-decoder",
         "speech-encoder-decoder", "whisper", "speech_to_text", "seamless_m4t", "pix2struct",
         "florence2"),
        "an encoder-decoder model"),
    **dict.fromkeys(
        ("vit", "deit", "beit", "swin", "swinv2", "convnext", "convnextv2", "dinov2", "clip",
         "clip_vision_model", "siglip", "siglip_vision_model", "sam", "detr", "yolos",
         "segformer", "mobilevit", "resnet", "efficientnet", "data2vec-vision"),
        "a vision model"),
    **dict.fromkeys(
        ("wav2vec2", "wav2vec2-bert", "hubert", "wavlm", "data2vec-audio", "unispeech",
         "unispeech-sat", "sew", "audio-spectrogram-transformer", "clap"),
        "a speech/audio encoder"),
}
"""model_type -> what it is, for the families the planner refuses: it plans decoder-only
LLMs (a vLLM/SGLang generate server, Megatron-LM GPT training), and would plan these as one,
printing a `vllm serve` command for a BERT."""
UNMODELLED_DECODER_MODEL_TYPES = {
    "jamba": "Mamba and attention layers interleaved (attn_layer_period) with experts every "
             "expert_layer_period layers",
    "zamba": "Mamba layers with a shared attention block",
    "zamba2": "Mamba2 layers with shared attention blocks",
    "bamba": "Mamba2 and attention layers interleaved (attn_layer_indices)",
    "falcon_h1": "attention and Mamba2 heads in parallel in every layer",
    "mamba": "a state-space model without attention",
    "mamba2": "a state-space model without attention",
    "falcon_mamba": "a state-space model without attention",
    "rwkv": "a recurrent (RWKV) model without attention",
    "recurrent_gemma": "recurrent (RG-LRU) blocks interleaved with local attention",
    "longcat_flash": "two attention and MLP blocks per layer with zero-computation experts (LongCat-Flash)",
    "hunyuan_v1_moe": "per-layer lists of expert sizes, top-k and shared experts (Hunyuan-A13B's "
                      "moe_intermediate_size, moe_topk, num_shared_expert)",
    # Llama-3.2-Vision: its cross_attention_layers attend to image tokens, not the text's KV;
    # vLLM removed MllamaForConditionalGeneration after 0.10.2 (models/registry.py at 0.33.0)
    **dict.fromkeys(("mllama", "mllama_text_model"),
                    "cross-attention layers over image tokens (Llama-3.2-Vision; vLLM serves it no more "
                    "after 0.10.2)"),
}
"""Decoders whose layer structure the planner does not model: their configs carry the
attention keys, so without this they would be planned as plain transformers (a Jamba 52B as
92B of attention + MoE layers). Hybrids it does model: Nemotron-H (hybrid_override_pattern),
Qwen3-Next / Qwen3.5 (layer_types with linear_attention)."""

NOT_DECODER_ARCHITECTURE_SUFFIXES = {
    "ForMaskedLM": "an encoder-only model", "ForPreTraining": "an encoder-only model",
    "ForSeq2SeqLM": "an encoder-decoder model", "ForSpeechSeq2Seq": "an encoder-decoder model",
    "ForImageClassification": "a vision model", "ForCTC": "a speech/audio encoder",
    "ForAudioClassification": "a speech/audio encoder",
}


def load_hf_config(path: Path) -> ModelSpec:
    """The ModelSpec of a Hugging Face config.json. Malformed values are one-line SpecErrors
    naming the key (check_layer_keys before any per-layer loop); a type this reader did not
    foresee still ends in one line naming the file, not a traceback."""
    try:
        return _load_hf_config(path)
    except (TypeError, ValueError, OverflowError, MemoryError, RecursionError, AttributeError, KeyError) as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError(f"{path}: a value of an unexpected type or size ({type(exc).__name__}: "
                        f"{str(exc)[:120]}); check the keys against the model's transformers config class") from None


LAYER_INT_KEYS = ("decoder_sparse_step", "first_k_dense_replace", "interleave_moe_layer_step",
                  "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval")
"""Keys the per-layer MoE patterns read as integers (num_dense_layers); with_layer_types checks
its own full_attention_interval."""


def check_layer_keys(text: dict[str, Any], origin: str) -> None:
    """The keys the per-layer loops read, checked before any loop runs: num_hidden_layers an
    integer within the spec's bound (a 10^12-layer config would loop for a day), the layer
    pattern keys integers, lists of integers or of names, and a pattern given per layer as long
    as the model (transformers' configs require it; a short one silently planned the rest as
    attention + MLP layers)."""
    layers = text.get("num_hidden_layers")
    if layers is not None and (not isinstance(layers, int) or isinstance(layers, bool)):
        raise SpecError(f"{origin}: num_hidden_layers: must be an integer (got {str(layers)[:40]!r})")
    if layers is not None and not 1 <= layers <= MAX_NUM_LAYERS:
        raise SpecError(f"{origin}: num_hidden_layers: must be from 1 to {MAX_NUM_LAYERS:,} (a plausibility "
                        f"bound; got {str(layers)[:40]})")
    for key in LAYER_INT_KEYS:
        value = text.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise SpecError(f"{origin}: {key}: expected a non-negative integer (got {str(value)[:40]!r})")
    step = text.get("decoder_sparse_step")
    if step == 0 and text.get("num_experts", text.get("num_local_experts")):
        # every step-th layer is MoE: transformers' and vLLM's (i + 1) % step divides by it
        raise SpecError(f"{origin}: decoder_sparse_step: 0 (every step-th layer is an MoE layer: at least 1)")
    only = text.get("mlp_only_layers")
    if only is not None and not (isinstance(only, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                                                  for i in only)):
        raise SpecError(f"{origin}: mlp_only_layers: expected a list of layer indices")
    if only and layers is not None and not all(0 <= i < layers for i in only):
        # an index past the model had been ignored (a read); the YAML's dense_layer_indices refuses it
        raise SpecError(f"{origin}: mlp_only_layers: index {next(i for i in only if not 0 <= i < layers)} is "
                        f"outside the {layers} layers (0..{layers - 1})")
    for key in ("layer_types", "moe_layer_freq"):
        value = text.get(key)
        if key == "layer_types" and value is not None and not isinstance(value, list):
            # a bare string was ignored, every layer then planned as full attention (found by a fuzz sweep)
            raise SpecError(f"{origin}: layer_types: expected a list of layer type names (got {str(value)[:40]!r})")
        if isinstance(value, list):
            kinds = (str,) if key == "layer_types" else (int, bool)
            if not all(isinstance(item, kinds) for item in value):
                raise SpecError(f"{origin}: {key}: expected a list of "
                                f"{'layer type names' if key == 'layer_types' else 'per-layer flags'}")
            if layers is not None and len(value) != layers:
                raise SpecError(f"{origin}: {key}: {len(value)} entries for num_hidden_layers {layers}")
    pattern = text.get("hybrid_override_pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise SpecError(f"{origin}: hybrid_override_pattern: expected a string of block characters")
        if layers is not None and len(pattern) != layers:
            raise SpecError(f"{origin}: hybrid_override_pattern: {len(pattern)} blocks for num_hidden_layers {layers}")


def _load_hf_config(path: Path) -> ModelSpec:
    raw = _read_json(path)
    remote_config = config_code(raw)
    check_model_type(raw, path)
    check_decoder(raw, path)
    text, origin = text_model(raw, path)
    wrapped = text is not raw
    text = {**FAMILY_DEFAULTS.get(family(text), {}), **text}
    check_layer_keys(text, origin)
    text = with_layer_types(text, origin)
    raw = raw if wrapped else text  # a text-only config stays one mapping (spec_fields_from_hf tells wrappers by it)
    check_modelled(text, origin)
    fields = spec_fields_from_hf(raw, text, path)
    sidecar = path.parent / "hf_quant_config.json"
    engine_quant = raw.get("quantization_config")
    wanted = "quantization" not in fields or engine_quant is None
    sidecar_config = _read_json(sidecar) if wanted and path.name == "config.json" and sidecar.is_file() else None
    if "quantization" not in fields and sidecar_config is not None:
        # ModelOpt's own record: its quantized_layers replace a copy in quantization_config
        fields.update(_modelopt_fields(sidecar_config, sidecar))
    if engine_quant is None:
        engine_quant = sidecar_config  # vLLM reads the sidecar only without quantization_config
    kv_cache_dtype = checkpoint_kv_cache_dtype(engine_quant)
    if kv_cache_dtype is not None:
        fields["checkpoint_kv_cache_dtype"] = kv_cache_dtype
    tokenizer_config = path.parent / "tokenizer_config.json"
    if remote_config or (path.name == "config.json" and tokenizer_config.is_file()
                         and tokenizer_code(_read_json(tokenizer_config))):
        fields["trust_remote_code"] = True
    elif not tokenizer_config.is_file() and raw.get("model_type") in REMOTE_TOKENIZER_MODEL_TYPES:
        fields["trust_remote_code"] = True  # a config alone: the family's tokenizer is its own code
    architectures = raw.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        fields["architecture"] = architectures[0][:100]
    model_type = raw.get("model_type")
    if not remote_config and not (isinstance(model_type, str) and model_type in native_config_model_types()):
        fields["unknown_model_type"] = "" if model_type is None else str(model_type)[:40]
    mixed = fields.pop(MIXED_LAYERS_FIELD, None)
    try:
        model = validate(ModelSpec, fields, origin)
    except SpecError as exc:
        raise SpecError(in_file_terms(str(exc), origin, text)) from None
    if mixed is None:
        return model
    return validate(ModelSpec, {**fields, **mixed_precision_fields(model, mixed)}, origin)


ALWAYS_GATED_ATTENTION = ("qwen3_next",)
"""model_types whose attention always has an output gate, with no config key for it: Qwen3-Next's
query projection is twice as wide (queries and the gate; transformers' and vLLM's
Qwen3NextAttention). Qwen3.5 says so in `attn_output_gate`."""
DEFAULT_FULL_ATTENTION_INTERVAL = 4
"""Qwen3-Next's layer pattern where its config.json gives neither `layer_types` nor
`full_attention_interval` (transformers' Qwen3NextConfig default)."""


def with_layer_types(text: dict[str, Any], origin: str) -> dict[str, Any]:
    """The text model's keys with `layer_types` spelled out where a Gated DeltaNet hybrid gives
    only its period: transformers' Qwen3NextConfig builds the list from `full_attention_interval`
    (default 4) when the key is missing, layer i full attention when (i + 1) % interval == 0, else
    linear attention. Qwen/Qwen3-Next-80B-A3B's published config.json is such a file: 48 layers,
    interval 4, so 12 full-attention and 36 Gated DeltaNet layers (planned as 48 attention layers
    before, with 4x the KV cache and no recurrent state)."""
    if isinstance(text.get("layer_types"), list) or "linear_num_value_heads" not in text:
        return text
    interval, layers = text.get("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL), text.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool):
        return text  # the shape check names the missing or malformed layer count
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        raise SpecError(f"{origin}: full_attention_interval: expected a positive integer (every n-th layer full "
                        f"attention), got {interval!r}")
    kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    return {**text, "layer_types": kinds}


def check_modelled(text: dict[str, Any], origin: str) -> None:
    """Refuse, in one line, an architecture whose layers the cost model does not describe."""
    unmodelled = {key: feature for key, feature in UNMODELLED_KEYS.items() if text.get(key) is not None}
    unmodelled |= {key: feature for key, feature in UNMODELLED_NONZERO_KEYS.items() if text.get(key)}
    for key, feature in unmodelled.items():
            raise SpecError(f"{origin}: {key}: {feature} are not modelled; the planner models "
                            f"attention + MLP/MoE decoder blocks")
    lightning = text.get("attn_type_list")
    if isinstance(lightning, list) and 0 in lightning:
        raise SpecError(f"{origin}: attn_type_list: {lightning.count(0)} lightning (linear) attention layers (0) are "
                        f"not modelled; the planner models attention + MLP/MoE decoder blocks")
    kinds = text.get("layer_types")
    known = KNOWN_LAYER_TYPES - (set() if "linear_num_value_heads" in text else {"linear_attention"})
    known |= {"deepseek_sparse_attention"} if text.get("index_n_heads") else set()
    unknown = sorted({kind for kind in kinds if kind not in known}
                     if isinstance(kinds, list) else set(), key=str)
    if unknown:
        raise SpecError(f"{origin}: layer_types: {', '.join(map(str, unknown))} layers are not "
                        f"modelled; the planner models attention + MLP/MoE decoder blocks")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object_pairs_hook: a key given twice is an error (json keeps the last silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _read_json(path: Path) -> dict[str, Any]:
    text = read_spec_text(path)
    try:
        raw = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: line {exc.lineno}: malformed JSON: {exc.msg}") from None
    except RecursionError:
        raise SpecError(f"{path}: (parse): malformed JSON: nested too deeply") from None
    except ValueError as exc:  # a number of more than 4,300 digits (Python's limit)
        raise SpecError(f"{path}: (parse): malformed JSON: {str(exc).split(';')[0]}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: (top level): expected a JSON object")
    check_size(raw, str(path))
    return raw


SPEC_ONLY_KEYS = ("name", "source", "quantization", "quantization_scope", "gated_mlp")
"""Keys of a planner model spec that no config.json has: a spec saved as .json had been read as a
config.json, its quantization and name dropped (a critical read)."""


def check_model_type(raw: dict[str, Any], path: Path) -> None:
    """A .json with neither model_type nor architectures but a model spec's keys is a model spec
    written as JSON: refused (specs are YAML), not planned without its quantization."""
    if raw.get("model_type") is None and raw.get("architectures") is None:
        spec_keys = [key for key in SPEC_ONLY_KEYS if key in raw]
        if spec_keys:
            raise SpecError(f"{path}: model_type: missing, and {spec_keys[0]} is a planner model spec's key: "
                            f"a .json is read as a Hugging Face config.json; write the spec as YAML (.yaml)")


def family(config: dict[str, Any]) -> str:
    """model_type, else the architecture's name before "For" (LlamaForCausalLM -> llama)."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type:
        return model_type.lower()
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0].split("For")[0].lower()
    return ""


def check_decoder(raw: dict[str, Any], path: Path) -> None:
    """Refuse what is not a decoder-only language model, naming what it is."""
    model_type = family(raw)
    what = NOT_DECODER_MODEL_TYPES.get(model_type)
    field = f"model_type: {model_type!r}"
    if what is None and raw.get("is_encoder_decoder") is True:
        what, field = "an encoder-decoder model", "is_encoder_decoder: true"
    architectures = raw.get("architectures")
    if what is None and isinstance(architectures, list):
        for name in architectures:
            for suffix, kind in NOT_DECODER_ARCHITECTURE_SUFFIXES.items():
                if isinstance(name, str) and name.endswith(suffix):
                    what, field = kind, f"architectures: {name!r}"
    if what is not None:
        raise SpecError(f"{path}: {field} is {what}; the planner plans decoder-only language "
                        f"models (vLLM/SGLang serving, Megatron-LM training)")
    if model_type in UNMODELLED_DECODER_MODEL_TYPES:
        raise SpecError(f"{path}: model_type: {model_type!r}: {UNMODELLED_DECODER_MODEL_TYPES[model_type]}, "
                        f"which the planner does not model (it would plan a plain transformer)")


def text_model(raw: dict[str, Any], path: Path) -> tuple[dict[str, Any], str]:
    """The mapping that describes the language model and the origin to name in errors: the
    top level, or `text_config` when the top level lacks the shape keys (a multimodal
    wrapper such as Llava or Gemma 3)."""
    if all(key in raw for key in REQUIRED_KEYS) or "text_config" not in raw:
        return raw, str(path)
    text = raw["text_config"]
    if not isinstance(text, dict):
        raise SpecError(f"{path}: text_config: expected an object (the wrapped language model)")
    check_decoder(text, path)
    return text, f"{path}: text_config"


FILE_KEYS = {
    "num_local_experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "experts_per_token", "top_k_experts", "moe_k"),
    "num_shared_experts": ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"),
    "expert_intermediate_size": ("moe_intermediate_size", "intermediate_size"),
    "num_mtp_layers": ("num_nextn_predict_layers", "mtp_num_hidden_layers"),
    "llama3_rope_scaling_factor": ("rope_scaling.factor", "rope_parameters.factor"),
    "rope_theta": ("rope_theta", "rope_parameters.rope_theta"),
    "partial_rotary_factor": ("partial_rotary_factor", "rope_parameters.partial_rotary_factor", "rotary_dim"),
}
"""ModelSpec fields a config.json names otherwise, with the keys it may carry them under, in the
order the import reads them (moe_fields, spec_fields_from_hf)."""


def in_file_terms(message: str, origin: str, text: dict[str, Any]) -> str:
    """A validation error about an imported field, naming the key the file has it under
    (`n_routed_experts: must be an integer`, where it had said num_local_experts, which the
    file does not contain; a CLI read)."""
    prefix = f"{origin}: "
    if not message.startswith(prefix):
        return message
    field, sep, rest = message[len(prefix):].partition(": ")
    if not sep or field not in FILE_KEYS:
        return message

    def present(key: str) -> bool:
        head, _, tail = key.partition(".")
        value = text.get(head)
        return value is not None if not tail else isinstance(value, dict) and value.get(tail) is not None

    key = next((key for key in FILE_KEYS[field] if present(key)), None)
    return message if key is None or key == field else f"{prefix}{key}: {rest}"


def with_rope_parameters(text: dict[str, Any], path: Path) -> dict[str, Any]:
    """transformers v5's `rope_parameters` (rope_theta, partial_rotary_factor and the scaling
    in one object; per layer type where nested, the full-attention layers' taken) read into the
    older top-level keys where those are absent: GLM-5's and Qwen3.5's config.json carry their
    rope_theta (1e6, 1e7) and Qwen3.5 its partial_rotary_factor (0.25) only there, and the import
    had taken RoPE's default 10,000 and the full rotation (a CLI read)."""
    params = text.get("rope_parameters")
    if params is None:
        return text
    if not isinstance(params, dict):
        raise SpecError(f"{path}: rope_parameters: expected an object or null (got {params!r:.40})")
    if isinstance(params.get("full_attention"), dict):  # nested per layer type (Gemma 4)
        params = params["full_attention"]
    filled = dict(text)
    for key in ("rope_theta", "partial_rotary_factor"):
        if filled.get(key) is None and params.get(key) is not None:
            filled[key] = params[key]
    if filled.get("rope_scaling") is None and params.get("rope_type", params.get("type")) not in (None, "default"):
        filled["rope_scaling"] = params
    return filled


ROPE_TYPES_NOT_EXTENDING = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling",
                                      "default"})
"""RoPE scaling types whose `factor` vLLM does not apply to max_position_embeddings
(_get_and_verify_max_len, vllm/config/model.py at 0.33.0: YaRN's and Llama 3's positions are
already the scaled ones); for the others (linear, dynamic, ...) the context is
max_position_embeddings x factor, except on Gemma 3, whose count is already scaled."""


def _number(value: Any) -> bool:
    """An int or float, not a bool (JSON's true is an int to Python)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_scalar_keys(text: dict[str, Any], origin: str) -> None:
    """Keys whose wrong type or range the import had ignored or defaulted, planning another model
    than the file's (a critical read): each a one-line error naming it, as transformers' config
    classes and vLLM 0.33.0 would refuse or misread it."""
    rotated = text.get("partial_rotary_factor")
    if rotated is not None and not (_number(rotated) and 0 < rotated <= 1):
        raise SpecError(f"{origin}: partial_rotary_factor: expected a number in (0, 1] (got {str(rotated)[:40]!r})")
    scale = first_present(text, "routed_scaling_factor", "moe_router_scaling_factor")
    if scale is not None and not _number(scale):
        key = "routed_scaling_factor" if text.get("routed_scaling_factor") is not None else "moe_router_scaling_factor"
        raise SpecError(f"{origin}: {key}: expected a number (got {str(scale)[:40]!r})")
    window_layers = text.get("max_window_layers")
    if text.get("use_sliding_window") and window_layers is not None and (
            not isinstance(window_layers, int) or isinstance(window_layers, bool)):
        raise SpecError(f"{origin}: max_window_layers: expected an integer (got {str(window_layers)[:40]!r})")
    scaling = text.get("rope_scaling")
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type"))
        factor = scaling.get("factor")
        if kind is not None and kind not in KNOWN_ROPE_TYPES:
            raise SpecError(f"{origin}: rope_scaling.rope_type: {str(kind)[:40]!r} is not a RoPE type vLLM 0.33.0 "
                            f"has (get_rope: {', '.join(sorted(KNOWN_ROPE_TYPES))})")
        if kind != "llama3" and factor is not None and not (_number(factor) and factor > 0):  # llama3's: the spec's
            raise SpecError(f"{origin}: rope_scaling.factor: expected a positive number (got {str(factor)[:40]!r})")


KNOWN_ROPE_TYPES = frozenset({"default", "linear", "dynamic", "ntk", "yarn", "llama3", "mllama4", "longrope",
                              "deepseek_yarn", "deepseek_llama_scaling", "proportional", "bailing_mrope", "openpangu",
                              "su", "mrope", "telechat3-yarn", "xdrope"})
"""rope_scaling types vLLM 0.33.0's get_rope builds (vllm/model_executor/layers/rotary_embedding/__init__.py),
and the legacy names patch_rope_parameters maps onto them (vllm/transformers_utils/config.py: "su" ->
longrope, "mrope" -> default, "telechat3-yarn"), and HunYuan-VL's "xdrope", which transformers 5.x
rewrites and vLLM serves through its transformers backend; any other is "Unknown RoPE scaling type"."""


def rope_extended_positions(text: dict[str, Any], kind: str | None) -> int | None:
    """max_position_embeddings x the RoPE scaling factor where vLLM 0.33.0 extends the context
    by it (ROPE_TYPES_NOT_EXTENDING); None where it does not."""
    scaling, positions = text.get("rope_scaling"), text.get("max_position_embeddings")
    if not isinstance(scaling, dict) or not isinstance(positions, int) or "gemma3" in (kind or ""):
        return None
    factor = scaling.get("factor")
    if scaling.get("rope_type", scaling.get("type")) in ROPE_TYPES_NOT_EXTENDING or \
            not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 1:
        return None
    return int(positions * factor)


def spec_fields_from_hf(raw: dict[str, Any], text: dict[str, Any], path: Path) -> dict[str, Any]:
    """ModelSpec fields from the text model's keys; dtype and quantization may sit at the
    top level of a wrapper."""
    wrapped = text is not raw  # before with_rope_parameters' copy (a v5 text-only config had read as wrapped)
    text = with_rope_parameters(text, path)
    limit = text.get("model_max_length")
    if type(limit) is int and limit > 0:
        # vLLM 0.33.0 takes model_max_length as the context where a config gives it, over
        # max_position_embeddings (model_arch_config_convertor.py, "For Command-R / Cohere,
        # Cohere2 models": c4ai-command-r-v01 8,192 positions, 131,072 served)
        text = {**text, "max_position_embeddings": limit}
    kind = family(text) or family(raw)
    check_scalar_keys(text, str(path))
    fields: dict[str, Any] = {key: text[key] for key in SHAPE_KEYS if text.get(key) is not None}
    extended = rope_extended_positions(text, kind)
    if extended is not None:
        fields["max_position_embeddings"] = extended
    fields.setdefault("tie_word_embeddings", kind in TIED_BY_DEFAULT_MODEL_TYPES)
    name = raw.get("_name_or_path") or (path.parent.name if path.parent.name else path.stem)
    fields["name"] = str(name).rstrip("/").split("/")[-1] or "hf-model"
    fields["source"] = f"Hugging Face config.json ({path})"
    if not wrapped and isinstance(raw.get("vision_config"), dict):
        # a flat vision-language config (Qwen2-VL: the text keys at the top, vision_config beside
        # them) had been planned as a text model with no word of its tower (a read)
        fields["source"] += f", the text model of a {kind or 'vision-language'} config; its vision tower not counted"
        fields["text_model_of"] = kind or "vision-language"
    if wrapped:
        fields["source"] += (f", the text model ({kind or 'text_config'}) of a "
                             f"{family(raw) or 'multimodal'} wrapper; vision/audio towers not counted")
        fields["text_model_of"] = family(raw) or "multimodal"
    fields["gated_mlp"] = gated_mlp(text, kind)
    activation = mlp_activation(text, fields["gated_mlp"])
    if activation is not None:
        fields["mlp_activation"] = activation
    fields["qkv_bias"] = kind in QKV_BIAS_MODEL_TYPES
    if kind in LAYERNORM_MODEL_TYPES:
        fields["norm_type"] = "layernorm"
        fields["layernorm_1p"] = kind in LAYERNORM_1P_MODEL_TYPES
    rotated = text.get("partial_rotary_factor")
    if rotated is None and isinstance(text.get("rotary_dim"), int) and isinstance(text.get("head_dim"), int):
        rotated = text["rotary_dim"] / text["head_dim"]  # MiniMax-M2: rotary_dim 64 of head_dim 128
    if _number(rotated) and 0 < rotated < 1:
        fields["partial_rotary_factor"] = float(rotated)
    fields.update(moe_fields(text, kind, str(path)))
    if text.get("hybrid_layer_pattern") is not None:
        fields.update(hybrid_pattern_fields(text, path))
    else:
        fields.update(window_fields(text, kind, str(path)))
    fields.update(global_attention_fields(text))
    fields.update(recurrent_fields(text, path))
    if text.get("block_configs") is not None:
        fields.update(block_config_fields(text, path))
    mtp = text.get("num_nextn_predict_layers") or text.get("mtp_num_hidden_layers")  # DeepSeek's; Qwen3.5's
    if mtp:
        fields["num_mtp_layers"] = mtp
    scaling = text.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise SpecError(f"{path}: rope_scaling: expected an object or null (got {scaling!r:.40})")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "llama3":
        fields["llama3_rope_scaling_factor"] = scaling.get("factor")
    if (kind in QK_NORM_MODEL_TYPES or text.get("qk_norm") is True  # Apertus's key
            or (text.get("use_qk_norm") is True
                and (text.get("qk_norm_type") == "per_head" or kind in PER_HEAD_USE_QK_NORM_MODEL_TYPES))):
        fields["qk_norm"] = True
    elif text.get("use_qk_norm") is True and text.get("qk_norm_type") == "per_layer":
        fields["qk_norm_across_heads"] = True  # MiniMax-M2: one norm over every head's query / key
    if kind == "llama4_text" and text.get("attention_chunk_size"):
        fields["attention_chunk_size"] = text["attention_chunk_size"]
    if isinstance(text.get("draft_vocab_size"), int) and text["draft_vocab_size"] > 0:
        # an EAGLE-3 draft head: its LM head covers the draft vocabulary, its embedding is the
        # target's (vLLM shares it: llm_base_proposer._maybe_share_embeddings at 0.33.0)
        fields["vocab_size"] = text["draft_vocab_size"]
    fields["dtype"] = _dtype(text, raw, path)
    quantization = raw.get("quantization_config", text.get("quantization_config"))
    if quantization is not None:
        fields.update(_quantization_fields(quantization, path, fields.get("hidden_size")))
    return fields


NEMOTRON_H_BLOCKS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
"""hybrid_override_pattern characters -> NemotronHConfig.layers_block_type names
(transformers models/nemotron_h/configuration_nemotron_h.py)."""
MAMBA2_KEYS = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel")
GATED_DELTANET_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                       "linear_value_head_dim")
DEFAULT_MAMBA_SSM_CACHE_DTYPE = "float32"
"""vLLM's NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE: the SSM state is fp32 unless
the config's mamba_ssm_cache_dtype says otherwise."""


def recurrent_fields(text: dict[str, Any], path: Path) -> dict[str, Any]:
    """Hybrid models' layer kinds and recurrent shapes: Nemotron-H's blocks (one mixer or one
    MLP each: hybrid_override_pattern, or the layers_block_type list), Qwen3.5's
    linear_attention layers (Gated DeltaNet beside attention, an MLP in every layer)."""
    blocks = text.get("layers_block_type")
    pattern = text.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        unknown = sorted(set(pattern) - set(NEMOTRON_H_BLOCKS))
        if unknown:
            raise SpecError(f"{path}: hybrid_override_pattern: block characters {''.join(unknown)!r} are not "
                            f"modelled (known: M Mamba2, * attention, - MLP, E MoE)")
        blocks = [NEMOTRON_H_BLOCKS[char] for char in pattern]
    if isinstance(blocks, list):
        return nemotron_h_fields(text, blocks, path)
    kinds = text.get("layer_types")
    if isinstance(kinds, list) and "linear_attention" in kinds:
        fields = {key: text[key] for key in GATED_DELTANET_KEYS if key in text}
        fields.update(num_recurrent_layers=kinds[:text.get("num_hidden_layers", len(kinds))].count("linear_attention"),
                      recurrent_kind="gated_deltanet", conv_kernel=text.get("linear_conv_kernel_dim"),
                      attention_output_gate=bool(text.get("attn_output_gate", text.get("model_type") in ALWAYS_GATED_ATTENTION)))
        if text.get("mamba_ssm_dtype") in DTYPES:
            fields["recurrent_state_dtype"] = DTYPES[text["mamba_ssm_dtype"]]
        return fields
    return {}


def nemotron_h_fields(text: dict[str, Any], blocks: list[Any], path: Path) -> dict[str, Any]:
    """NemotronHBlock: a norm and ONE mixer (Mamba2, attention, MLP or MoE) per layer."""
    unknown = sorted({str(kind) for kind in blocks} - set(NEMOTRON_H_BLOCKS.values()))
    if unknown:
        raise SpecError(f"{path}: layers_block_type: {', '.join(unknown)} blocks are not modelled")
    count = {kind: blocks.count(kind) for kind in NEMOTRON_H_BLOCKS.values()}
    fields = {key: text[key] for key in MAMBA2_KEYS if key in text}
    fields.update(num_recurrent_layers=count["mamba"], recurrent_kind="mamba2",
                  num_mlp_only_layers=count["mlp"] + count["moe"],
                  num_mixer_only_layers=count["mamba"] + count["attention"],
                  recurrent_state_dtype=DTYPES.get(str(text.get("mamba_ssm_cache_dtype")),
                                                   DEFAULT_MAMBA_SSM_CACHE_DTYPE))
    if text.get("num_hidden_layers") is None:  # NemotronHConfig: len(layers_block_type)
        fields["num_hidden_layers"] = len(blocks)
    if text.get("head_dim") is None and text.get("attention_head_dim") is not None:
        fields["head_dim"] = text["attention_head_dim"]
    if count["moe"]:
        # the blocks without experts (Mamba, attention, MLP) interleave with the MoE ones and
        # differ from each other: the stages share the mean block (no dense_layer_indices)
        fields["num_dense_layers"] = len(blocks) - count["moe"]
        fields["num_shared_experts"] = text.get("n_shared_experts") or 0
        if text.get("moe_shared_expert_intermediate_size"):
            fields["shared_expert_intermediate_size"] = text["moe_shared_expert_intermediate_size"]
        if text.get("moe_latent_size"):
            fields["moe_latent_size"] = text["moe_latent_size"]
    return fields


DECILM_FFN_MULTIPLE = 256
"""DeciLM's _ffn_mult_to_intermediate_size rounds int(2 * ffn_mult * h / 3) up to this."""


def decilm_ffn_size(ffn_mult: float, hidden_size: int) -> int:
    """DeciLM's _ffn_mult_to_intermediate_size (configuration_decilm.py / modeling_decilm.py;
    llama.cpp's DeciModel): int(2 * ffn_mult * h / 3) rounded up to a multiple of 256."""
    size = int(2 * ffn_mult * hidden_size / 3)
    return -(-size // DECILM_FFN_MULTIPLE) * DECILM_FFN_MULTIPLE


def block_config_fields(text: dict[str, Any], path: Path) -> dict[str, Any]:
    """DeciLM / Nemotron-NAS `block_configs` (DeciLMDecoderLayer): one entry per layer; an
    attention with `no_op` has no input_layernorm and no self_attn (an MLP-only layer, one
    norm); every other attention has n_heads_in_group query heads per KV head; each FFN is
    a gated LlamaMLP of decilm_ffn_size(ffn_mult, h). The spec has one FFN width, so
    intermediate_size is the mean of the layers' widths, rounded to an integer: the total
    is then exact but for 3 * h * L * (rounding <= 0.5), under 0.001% (Nemotron-Super-49B:
    mean 20,531.2 -> 20,531, 0.2 * 3 * 8192 * 80 = 393,216 of 49.9B). Refused in one line: a
    layer replaced by a linear map, an FFN no_op, a window or sink tokens, or attention
    layers with different n_heads_in_group."""
    blocks, h = text["block_configs"], text.get("hidden_size")
    where = f"{path}: block_configs"
    if not isinstance(blocks, list) or not all(
            isinstance(b, dict) and isinstance(b.get("attention"), dict) and isinstance(b.get("ffn"), dict)
            for b in blocks):
        raise SpecError(f"{where}: expected a list of {{attention, ffn}} objects")
    if not isinstance(h, int) or isinstance(h, bool) or h < 1:
        raise SpecError(f"{path}: hidden_size: expected a positive integer (got {h!r})")
    if text.get("num_hidden_layers") not in (None, len(blocks)):
        raise SpecError(f"{where}: {len(blocks)} entries for num_hidden_layers "
                        f"{text['num_hidden_layers']} (one per layer expected)")
    attention = [b["attention"] for b in blocks if not b["attention"].get("no_op")]
    for block in blocks:
        for part in ("attention", "ffn"):
            config = block[part]
            for key, feature in (("replace_with_linear", "layers replaced by a linear map"),
                                 ("window_length", "windowed attention"),
                                 ("num_sink_tokens", "sink-token attention"),
                                 ("sparsify", "sparsified layers")):
                if config.get(key):
                    raise SpecError(f"{where}: {part}.{key}: {feature} are not modelled")
        if block["ffn"].get("no_op"):
            raise SpecError(f"{where}: ffn.no_op: attention-only layers are not modelled")
    groups = {a.get("n_heads_in_group") for a in attention}
    heads = text.get("num_attention_heads")
    if len(groups) > 1:
        raise SpecError(f"{where}: attention layers with different n_heads_in_group "
                        f"({', '.join(sorted(map(str, groups)))}) are not modelled")
    mults = [b["ffn"].get("ffn_mult") for b in blocks]
    if not all(_number(m) and m > 0 for m in mults):
        raise SpecError(f"{where}: ffn.ffn_mult: expected positive numbers")
    sizes = [decilm_ffn_size(m, h) for m in mults]
    fields: dict[str, Any] = {"num_hidden_layers": text.get("num_hidden_layers", len(blocks)),
                              "intermediate_size": round(sum(sizes) / len(sizes)),
                              "num_mlp_only_layers": len(blocks) - len(attention)}
    group = groups.pop() if groups else None
    if isinstance(group, int) and not isinstance(group, bool) and group > 0 and isinstance(heads, int):
        fields["num_key_value_heads"] = heads // group
    elif attention:
        raise SpecError(f"{where}: attention.n_heads_in_group: expected a positive integer (got {group!r})")
    return fields


def first_present(config: dict[str, Any], *keys: str) -> Any:
    return next((config[key] for key in keys if config.get(key) is not None), None)


EXPERTS_SIZED_BY_INTERMEDIATE_SIZE = frozenset({
    "mixtral", "phimoe", "olmoe", "flex_olmo", "jetmoe", "granitemoe", "granitemoeshared", "granitemoehybrid",
    "gpt_oss", "minimax", "minimax_m2", "minimax_m3_vl", "minimaxm3sparse", "llama4_text", "arctic"})
"""Families whose routed experts are intermediate_size wide (their transformers configs have no
moe_intermediate_size: MixtralConfig, PhimoeConfig, OlmoeConfig, GptOssConfig, MiniMaxConfig,
Llama4TextConfig, ...). Every other MoE config must carry moe_intermediate_size: one without it
(a hand-edited Qwen3-MoE config) was planned with its experts intermediate_size wide, 724B
parameters for a 41B model (found by a CLI sweep)."""


def moe_fields(text: dict[str, Any], kind: str, origin: str = "config.json") -> dict[str, Any]:
    """Experts (num_local_experts / num_experts / n_routed_experts), shared experts and which
    layers are dense, each family's way; {} for a dense model."""
    experts = first_present(text, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
    if experts == 0 and first_present(text, "num_experts_per_tok", "experts_per_token", "moe_topk", "moe_k"):
        # 0 experts beside a top-k: a mistake, not a dense model (the YAML spec refuses 0 too)
        return {"num_local_experts": experts}
    if not experts:
        return {}
    fields = {"num_local_experts": experts,
              "num_experts_per_tok": first_present(text, "num_experts_per_tok", "experts_per_token",
                                                   "top_k_experts", "moe_k")}
    if text.get("moe_intermediate_size") is None and kind not in EXPERTS_SIZED_BY_INTERMEDIATE_SIZE:
        raise SpecError(f"{origin}: moe_intermediate_size: missing ({kind!r} sizes its experts by it; only "
                        f"Mixtral-style families size them by intermediate_size)")
    groups, per_token = text.get("n_group"), text.get("topk_group")
    if groups not in (None, 1) or per_token not in (None, 1):
        # group-limited routing (DeepseekV3TopkRouter / DeepseekV2 MoEGate, transformers): a token's
        # experts come from its topk_group best of n_group groups; n_group 1 (Kimi K2) limits nothing
        for key, value in (("n_group", groups), ("topk_group", per_token)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"{origin}: {key}: group-limited routing needs a positive integer (got {value!r})")
        if per_token > groups:
            raise SpecError(f"{origin}: topk_group: {per_token} exceeds n_group {groups}")
        if per_token < groups:
            fields["num_expert_groups"], fields["expert_groups_per_token"] = groups, per_token
    fields.update(router_fields(text, kind, origin))
    shared_size = first_present(text, "shared_expert_intermediate_size", "share_expert_dim",
                                "shared_intermediate_size")
    num_shared = first_present(text, "n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
    if kind == "llama4_text":
        # Llama4TextMoe: routed and shared experts of intermediate_size; dense layers
        # (Llama4TextMLP) of intermediate_size_mlp (transformers modeling_llama4.py).
        fields["moe_intermediate_size"] = text.get("intermediate_size")
        fields["intermediate_size"] = text.get("intermediate_size_mlp", text.get("intermediate_size"))
        num_shared = 1
    if kind == "gemma4_text":
        # Gemma4TextDecoderLayer with enable_moe_block: the dense Gemma4TextMLP
        # (intermediate_size) runs beside the routed experts (moe_intermediate_size) in every
        # layer, on every token: a shared expert (transformers modeling_gemma4.py).
        if not text.get("enable_moe_block"):
            return {}
        num_shared, shared_size = 1, text.get("intermediate_size")
    if num_shared is None and shared_size:  # Qwen2-MoE: one shared expert of that size
        num_shared = 1
    if num_shared and shared_size != 0:
        fields["num_shared_experts"] = num_shared
        if shared_size:
            fields["shared_expert_intermediate_size"] = shared_size
    if text.get("dense_intermediate_size"):  # MiniMax-M3: dense layers' own FFN size
        fields["intermediate_size"] = text["dense_intermediate_size"]
    fields.update(dense_layer_fields(dense_layer_indices(text, kind)))
    if text.get("intermediate_size") is None:  # all layers MoE (Qwen3.5-MoE): no dense FFN size
        fields["intermediate_size"] = text.get("moe_intermediate_size")
    return fields


ROUTER_SCORE_FUNCTIONS = ("softmax", "sigmoid", "sqrtsoftplus")
"""Hugging Face scoring_func values (transformers' DeepSeek, GLM, MiniMax routers; DeepSeek-V4's
sqrtsoftplus)."""
SIGMOID_ROUTER_MODEL_TYPES = ("llama4_text",)
"""Families whose router is a sigmoid with no scoring_func key: Llama4TextMoe's router scores the
top-1 logit with a sigmoid and scales the expert's input by it (transformers modeling_llama4.py)."""
BIASED_SIGMOID_ROUTER_MODEL_TYPES = ("nemotron_h",)
"""Families whose router is DeepSeek-V3's (sigmoid scores, an e_score_correction_bias for the
top-k choice) with no scoring_func or topk_method key: NemotronHTopkRouter (transformers
modeling_nemotron_h.py)."""


def router_fields(text: dict[str, Any], kind: str, origin: str) -> dict[str, Any]:
    """How the router scores and weighs experts (ModelSpec.router_*), from scoring_func,
    topk_method noaux_tc (or MiniMax's use_routing_bias, Step's use_moe_router_bias),
    routed_scaling_factor (Step's moe_router_scaling_factor) and norm_topk_prob; Llama 4's
    sigmoid on the expert's input and Nemotron-H's biased sigmoid by family."""
    fields: dict[str, Any] = {}
    score = first_present(text, "scoring_func", "score_function")  # Ling-2.0 names it score_function
    if score is not None:
        if score not in ROUTER_SCORE_FUNCTIONS:
            raise SpecError(f"{origin}: scoring_func: {score!r} is not a router the planner knows "
                            f"(known: {', '.join(ROUTER_SCORE_FUNCTIONS)})")
        fields["router_score_function"] = score
    if kind in SIGMOID_ROUTER_MODEL_TYPES:
        fields.update(router_score_function="sigmoid", router_probs_on_input=True)
    if kind in BIASED_SIGMOID_ROUTER_MODEL_TYPES:
        fields.update(router_score_function="sigmoid", router_expert_bias=True)
    if (text.get("topk_method") == "noaux_tc" or text.get("use_routing_bias") is True
            or text.get("use_moe_router_bias") is True  # DeepSeek's, MiniMax's and Step's names
            or text.get("moe_use_aux_free") is True  # ERNIE 4.5's (its e_score_correction_bias)
            or text.get("moe_router_enable_expert_bias") is True):  # Ling-2.0's
        fields["router_expert_bias"] = True
    scale = first_present(text, "routed_scaling_factor", "moe_router_scaling_factor")
    if _number(scale) and scale != 1:
        fields["router_topk_scaling_factor"] = scale
    if text.get("norm_topk_prob") is False:
        fields["router_topk_normalized"] = False
    return fields


def dense_layer_indices(text: dict[str, Any], kind: str) -> list[int]:
    """The layers (0-based) with a dense MLP in an MoE model, by whichever key the family uses:
    moe_layer_freq as a per-layer 0/1 list (MiniMax-M3, MiMo-V2); first_k_dense_replace with
    an integer moe_layer_freq (DeepseekV3DecoderLayer: MoE when i >= k and i % freq == 0);
    Qwen3-MoE's mlp_only_layers and decoder_sparse_step (MoE when i not in mlp_only_layers
    and (i + 1) % step == 0); Llama 4's interleave_moe_layer_step (MoE when (i + 1) % step == 0);
    ERNIE 4.5's moe_layer_start_index / _end_index / _interval (MoE when start <= i <= end and
    (i + 1) % interval == 0, vLLM ernie45_moe.py at 0.33.0).
    Empty without a readable num_hidden_layers (the spec's own check then names it)."""
    num_layers = text.get("num_hidden_layers")
    if not isinstance(num_layers, int) or isinstance(num_layers, bool):
        return []
    freq = text.get("moe_layer_freq")
    if isinstance(freq, list):
        return [i for i, flag in enumerate(freq[:num_layers]) if not flag]
    if kind == "llama4_text":
        step = text.get("interleave_moe_layer_step") or 1
        return [i for i in range(num_layers) if (i + 1) % step]
    if "moe_layer_start_index" in text or "moe_layer_interval" in text:  # ERNIE 4.5 (vLLM ernie45_moe.py)
        start, step = text.get("moe_layer_start_index") or 0, text.get("moe_layer_interval") or 1
        end = text.get("moe_layer_end_index", num_layers - 1)
        return [i for i in range(num_layers) if (i + 1) % step or not start <= i <= end]
    if "decoder_sparse_step" in text or "mlp_only_layers" in text:
        step, only = text.get("decoder_sparse_step") or 1, set(text.get("mlp_only_layers") or [])
        return [i for i in range(num_layers) if i in only or (i + 1) % step]
    first_k = text.get("first_k_dense_replace") or 0
    step = freq if isinstance(freq, int) and freq > 0 else 1
    return [i for i in range(num_layers) if i < first_k or i % step]


def dense_layer_fields(indices: list[int]) -> dict[str, Any]:
    """num_dense_layers, and dense_layer_indices where there are any."""
    return {"num_dense_layers": len(indices), **({"dense_layer_indices": indices} if indices else {})}


def global_attention_fields(text: dict[str, Any]) -> dict[str, Any]:
    """Gemma 4's full-attention layer shape (Gemma4TextAttention): global_head_dim on every
    non-sliding layer; with attention_k_eq_v, num_global_key_value_heads and no v_proj."""
    fields: dict[str, Any] = {}
    if text.get("global_head_dim") not in (None, text.get("head_dim")):
        fields["global_head_dim"] = text["global_head_dim"]
    if text.get("attention_k_eq_v"):
        fields["attention_k_eq_v"] = True
        if text.get("num_global_key_value_heads") is not None:
            fields["num_global_key_value_heads"] = text["num_global_key_value_heads"]
    return fields


SWA_SHAPE_KEYS = ("num_attention_heads", "num_key_value_heads", "head_dim", "v_head_dim")
"""MiMo-V2's sliding-window layers take swa_<key> where the full layers take <key>."""


def hybrid_pattern_fields(text: dict[str, Any], path: Path) -> dict[str, Any]:
    """MiMo-V2-Flash's per-layer attention kinds (MiMoV2FlashForCausalLM): hybrid_layer_pattern
    has one flag per layer, 1 = a sliding-window layer of sliding_window_size tokens with the
    swa_* shape, 0 = a full-attention layer with the top-level shape
    (vllm/model_executor/models/mimo_v2_flash.py MiMoV2Attention; sglang models/mimo_v2.py).
    The window layers' shape becomes the spec's (num_key_value_heads, head_dim), the full
    layers' KV heads and head dim num_global_key_value_heads and global_head_dim where they
    differ. One query-head count and one value head dim for both kinds is what the cost model
    describes; anything else is refused. The per-head attention-sink logits of the window
    layers (a * S parameters, 2,496 of MiMo-V2-Flash's 309B) are left out."""
    pattern, num_layers = text["hybrid_layer_pattern"], text.get("num_hidden_layers")
    if (not isinstance(pattern, list) or not isinstance(num_layers, int) or len(pattern) < num_layers
            or any(flag not in (0, 1) or isinstance(flag, bool) for flag in pattern)):
        raise SpecError(f"{path}: hybrid_layer_pattern: expected one flag per layer, 0 (full "
                        f"attention) or 1 (sliding window), for num_hidden_layers {num_layers}")
    num_window = sum(pattern[:num_layers])
    if not num_window:
        return {}
    swa = {key: text.get(f"swa_{key}", text.get(key)) for key in SWA_SHAPE_KEYS}
    for key in ("num_attention_heads", "v_head_dim"):
        if swa[key] != text.get(key):
            raise SpecError(f"{path}: swa_{key}: sliding-window layers with their own {key} "
                            f"({swa[key]} vs {text.get(key)}) are not modelled")
    window = text.get("sliding_window_size", text.get("sliding_window"))
    fields = {"sliding_window": window, "num_sliding_window_layers": num_window}
    fields.update({key: swa[key] for key in ("num_key_value_heads", "head_dim") if swa[key] is not None})
    if num_window == num_layers:
        return fields
    if text.get("num_key_value_heads") not in (None, swa["num_key_value_heads"]):
        fields["num_global_key_value_heads"] = text["num_key_value_heads"]
    if text.get("head_dim") not in (None, swa["head_dim"]):
        fields["global_head_dim"] = text["head_dim"]
    return fields


def sliding_layers_of_pattern(pattern: Any, num_layers: int, origin: str) -> int:
    """Window layers of a sliding_window_pattern: an integer p (Gemma 3, Cohere2, EXAONE 4:
    layer i global when (i + 1) % p == 0) or a string of L (local) and G (global) repeated over
    the layers (EXAONE-4.0's "LLLG")."""
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 1:
        return num_layers - num_layers // pattern
    if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
        return sum(1 for i in range(num_layers) if pattern[i % len(pattern)] == "L")
    raise SpecError(f"{origin}: sliding_window_pattern: expected a positive integer (every n-th layer "
                    f"global) or a string of L and G (got {str(pattern)[:40]!r})")


def window_fields(text: dict[str, Any], kind: str, origin: str = "config.json") -> dict[str, Any]:
    """sliding_window and how many layers use it, each family's way: the count of
    "sliding_attention" in layer_types (gpt-oss, Gemma 3 and later); Gemma 2's even layers
    (Gemma2DecoderLayer: is_sliding = not layer_idx % 2); a sliding_window_pattern, or the
    family's default one (Gemma 3, Cohere2, EXAONE 4: sliding_layers_of_pattern); Qwen2's layers from max_window_layers on
    when use_sliding_window; else every layer (Mistral-7B v0.1). {} without a window, or
    when use_sliding_window is false (Qwen2/Qwen3 configs carry an unused sliding_window)."""
    window, num_layers = text.get("sliding_window"), text.get("num_hidden_layers")
    if window is None or window is False or text.get("use_sliding_window") is False:
        return {}
    if not isinstance(num_layers, int) or isinstance(num_layers, bool):
        return {"sliding_window": window}
    kinds = text.get("layer_types")
    pattern = text.get("sliding_window_pattern", DEFAULT_SLIDING_WINDOW_PATTERN.get(kind))
    if isinstance(kinds, list):
        count = sum(1 for kind_ in kinds[:num_layers] if kind_ == "sliding_attention")
    elif kind == "gemma2":
        count = (num_layers + 1) // 2
    elif pattern is not None:
        count = sliding_layers_of_pattern(pattern, num_layers, origin)
    elif text.get("use_sliding_window") and isinstance(text.get("max_window_layers"), int):
        count = max(0, num_layers - text["max_window_layers"])
    else:
        count = num_layers
    return {"sliding_window": window, "num_sliding_window_layers": count} if count else {}


def gated_mlp(config: dict[str, Any], kind: str) -> bool:
    """By family (GATED_MLP_MODEL_TYPES / NON_GATED_MLP_MODEL_TYPES); else by activation."""
    if kind in GATED_MLP_MODEL_TYPES:
        return True
    if kind in NON_GATED_MLP_MODEL_TYPES:
        return False
    activation = first_present(config, "hidden_act", "hidden_activation", "mlp_hidden_act") or "silu"
    return str(activation).lower() in GATED_ACTIVATIONS


ACTIVATIONS = {"silu": "silu", "swish": "silu", "swiglu": "silu", "swigluoai": "silu", "gelu": "gelu",
               "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu", "gelu_pytorch_tanh_gated": "gelu",
               "geglu": "gelu", "relu": "relu", "relu2": "squared_relu", "xielu": "xielu"}
"""config.json activation names -> ModelSpec.mlp_activation (gpt-oss's swigluoai is a clamped
SwiGLU; Nemotron's relu2 is squared ReLU)."""


def mlp_activation(config: dict[str, Any], gated: bool) -> str | None:
    """ModelSpec.mlp_activation: the activation where it is not its MLP kind's usual one (SiLU
    gated, GELU in two matrices); None for the usual one or a name not in ACTIVATIONS."""
    name = first_present(config, "hidden_act", "hidden_activation", "mlp_hidden_act")
    activation = ACTIVATIONS.get(str(name).lower()) if isinstance(name, str) else None
    return None if activation == ("silu" if gated else "gelu") else activation


def _dtype(text: dict[str, Any], raw: dict[str, Any], path: Path) -> str:
    for config in (text, raw):
        for key in ("torch_dtype", "dtype"):
            value = config.get(key)
            if value is None:
                continue
            if not isinstance(value, str) or value not in DTYPES:
                raise SpecError(f"{path}: {key}: unsupported dtype {value!r} "
                                f"(expected one of {', '.join(DTYPES)})")
            return DTYPES[value]
    return "bfloat16"


def _quantization_fields(config: Any, path: Path, hidden_size: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise SpecError(f"{path}: quantization_config: expected an object")
    method = str(config.get("quant_method", "")).lower()
    if method in {"fp8", "fbgemm_fp8"}:  # fbgemm_fp8: Meta's own FP8 checkpoints
        # block-scaled (weight_block_size [n, k]: DeepSeek-V3, Qwen3 FP8) or per channel; the
        # modules left 16-bit (modules_to_not_convert, which vLLM's fbgemm_fp8.py and fp8.py
        # honour: Meta's Llama-3.1-405B-FP8 keeps every self_attn, and its first and last layers,
        # in bf16, priced here as attention 16-bit on every layer: _scope)
        return {"quantization": "fp8", "quantization_scope": _scope(config.get("modules_to_not_convert")),
                **fp8_block_fields(config.get("weight_block_size"), path, "quantization_config.weight_block_size")}
    if method == "mxfp4":  # gpt-oss: modules_to_not_convert names attention and the router
        return {"quantization": "mxfp4",
                "quantization_scope": _scope(config.get("modules_to_not_convert"))}
    if method == "modelopt" or (not method and "quant_algo" in config):
        return _modelopt_fields(config, path)
    weights = _compressed_tensors_weights(config, path) if method == "compressed-tensors" else []
    widths = sorted({(w.get("type"), w.get("num_bits")) for w in weights}, key=str)
    if len(widths) > 1:
        # one format per checkpoint is what the spec holds: a group of 8-bit attention beside
        # 4-bit MLPs had been priced all 8-bit, by the groups' order (a read)
        raise SpecError(f"{path}: quantization_config.config_groups: weights of several formats "
                        f"({', '.join(f'{bits}-bit {kind}' for kind, bits in widths)}) are not planned from a "
                        f"config.json; write a model YAML with quantization, quantization_scope and "
                        f"secondary_quantization")
    bits = config.get("bits") or config.get("w_bit") or next(
        (w.get("num_bits") for w in weights if w.get("type") == "int"), None)
    if method == "awq" and bits == 8:
        raise SpecError(f"{path}: quantization_config.{'bits' if config.get('bits') is not None else 'w_bit'}: 8-bit "
                        f"AWQ weights: vLLM 0.33.0 serves 4-bit AWQ only (AutoAWQConfig.TYPE_MAP, "
                        f"model_executor/layers/quantization/auto_awq.py; SGLang 0.5.23's AWQConfig, "
                        f"srt/layers/quantization/awq/awq.py, too)")
    if method in {"awq", "gptq", "compressed-tensors"} and type(bits) is int and bits in (4, 8):
        scheme = next((w for w in weights if w.get("type") == "int"), {})
        key, group = next(((k, v) for k, v in (("group_size", config.get("group_size")),
                                                ("q_group_size", config.get("q_group_size")),
                                                ("config_groups.*.weights.group_size", scheme.get("group_size")))
                           if v is not None), ("group_size", 128))
        if isinstance(group, bool) or not isinstance(group, int) or group == 0 or group < -1:
            raise SpecError(
                f"{path}: quantization_config.{key}: expected a positive integer or -1 (one scale per "
                f"output channel) (got {group!r})"
            )
        if scheme.get("strategy") == "channel":  # compressed-tensors: one scale per output channel
            group = -1
        if group == -1:  # GPTQ's -1: one scale per output channel, i.e. per row of ~h weights
            group = hidden_size
        kind = "int4" if bits == 4 else "int8"
        # zero points: AWQ's zero_point (default on), GPTQ's qzeros (always stored), none for a
        # symmetric compressed-tensors scheme (its default), which keeps a scale per group only
        zero_point = (not scheme.get("symmetric", True) if method == "compressed-tensors"
                      else bool(config.get("zero_point", True)))
        fields = {"quantization": kind, "quantization_group_size": group, "quantization_zero_point": zero_point,
                  "quantization_scope": _scope(config.get("ignore", config.get("modules_to_not_convert")))}
        if kind == "int8" and _int8_inputs(config):  # W8A8: the GEMMs run on the int8 tensor cores
            fields["int8_activations"] = True
        return fields
    fp8 = next((w for w in weights if w.get("type") == "float" and w.get("num_bits") == 8), None)
    if fp8 is not None:  # a "block" strategy names its block_structure [n, k]
        return {"quantization": "fp8", "quantization_scope": _scope(config.get("ignore")), **fp8_block_fields(
            fp8.get("block_structure") if fp8.get("strategy") == "block" else None, path,
            "quantization_config.config_groups.*.weights.block_structure")}
    if any(w.get("type") == "float" and w.get("num_bits") == 4 and w.get("group_size") == 16
           for w in weights):  # NVFP4 in compressed-tensors form
        return {"quantization": "nvfp4", "quantization_scope": _scope(config.get("ignore"))}
    if method in {"awq", "gptq", "compressed-tensors"} and bits is not None:
        bits_key = "bits" if config.get("bits") is not None else "w_bit" if config.get("w_bit") is not None else \
            "config_groups.*.weights.num_bits"  # the key the file has (AWQ's w_bit; a CLI read)
        if isinstance(bits, bool) or not isinstance(bits, int):  # "4" as a string (found by a fuzz sweep)
            raise SpecError(f"{path}: quantization_config.{bits_key}: expected an integer (got {bits!r})")
        raise SpecError(f"{path}: quantization_config.{bits_key}: {bits!r}-bit {method} weights are not planned "
                        f"(4- or 8-bit integer weights are)")
    if method in {"awq", "gptq"}:  # no bits at all ("unsupported quant_method 'awq'" contradicted itself)
        raise SpecError(f"{path}: quantization_config.bits: missing (an {method} checkpoint names its 4 or 8 "
                        f"bits)")
    if method == "compressed-tensors":  # neither integer nor float weights named (found by a fuzz sweep)
        raise SpecError(f"{path}: quantization_config.config_groups: no weights scheme the planner reads (4- or "
                        f"8-bit integer, 8-bit float or NVFP4 weights under config_groups.*.weights)")
    raise SpecError(
        f"{path}: quantization_config: unsupported quant_method {method!r} "
        f"(supported: fp8, awq/gptq 4- or 8-bit, compressed-tensors, modelopt, mxfp4)"
    )


def fp8_block_fields(block: Any, path: Path, key: str) -> dict[str, Any]:
    """quantization_block_size from an fp8 checkpoint's [n, k] scale block: k, the inputs one
    scale covers (what a TP split of a row-parallel layer must keep whole); {} without blocks."""
    if block is None:
        return {}
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in block)):
        raise SpecError(f"{path}: {key}: expected two positive integers [n, k] (got {str(block)[:40]})")
    return {"quantization_block_size": block[1]}


NATIVE_MODEL_TYPES_FILE = Path(__file__).parent / "data" / "native_config_model_types.txt"


@cache
def native_config_model_types() -> frozenset[str]:
    """model_type values whose configuration class transformers (5.16.1, the least vLLM 0.33.0
    takes) or vLLM 0.33.0 itself has: planner/data/native_config_model_types.txt."""
    lines = NATIVE_MODEL_TYPES_FILE.read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith(("#", "[")))


def config_code(config: Any) -> bool:
    """Whether a checkpoint's configuration is its own code: config.json's auto_map names an
    AutoConfig class and its model_type is not one the engines know (native_config_model_types).
    transformers' AutoConfig.from_pretrained then refuses it without trust_remote_code (its
    resolve_trust_remote_code: remote code and no local class), and vLLM passes the flag through
    (get_config, vllm/transformers_utils/config.py at 0.33.0, which clears it only for its own
    registry's types). Llama-3.3-Nemotron-Super-49B's "nemotron-nas" (configuration_decilm.py);
    not DeepSeek-V3's or MiniMax-M2's auto_map, whose model_types transformers has."""
    if not isinstance(config, dict):
        return False
    auto_map, model_type = config.get("auto_map"), config.get("model_type")
    return (isinstance(auto_map, dict) and bool(auto_map.get("AutoConfig")) and isinstance(model_type, str)
            and model_type not in native_config_model_types())


REMOTE_TOKENIZER_MODEL_TYPES = frozenset({"kimi_k2", "kimi_k25"})
"""model_types whose published checkpoints ship their tokenizer as code (Moonshot's
tokenizer_config.json: auto_map AutoTokenizer tokenization_kimi.TikTokenTokenizer, which
vLLM 0.33.0's tokenizer registry has no entry for): a config.json read without its
tokenizer_config.json still gets --trust-remote-code (its command had failed loading the
tokenizer: a read)."""


def tokenizer_code(tokenizer_config: Any) -> bool:
    """Whether a checkpoint's tokenizer is its own code: tokenizer_config.json's auto_map names
    an AutoTokenizer class (Kimi-K2's tokenization_kimi.TikTokenTokenizer), which transformers
    loads only with trust_remote_code, as vLLM and SGLang call it."""
    auto_map = tokenizer_config.get("auto_map") if isinstance(tokenizer_config, dict) else None
    return isinstance(auto_map, dict) and bool(auto_map.get("AutoTokenizer"))


def checkpoint_kv_cache_dtype(config: Any) -> str | None:
    """The KV cache format the engines take for `--kv-cache-dtype auto` from the quantization
    config they read (config.json's quantization_config, else hf_quant_config.json:
    vllm/transformers_utils/config.py at 0.33.0), as vLLM's get_kv_cache_quant_algo_string does
    (vllm/utils/torch_utils.py at 0.33.0): only for a ModelOpt config, whose quant_method starts
    "modelopt" (a legacy hf_quant_config.json has none, but vLLM gives it one when its producer is
    modelopt and it names a quant_algo: _normalize_quantization_config,
    vllm/transformers_utils/model_arch_config_convertor.py at 0.17.0-0.33.0); kv_cache_scheme (a
    dict: static 8-bit float -> fp8, 4-bit float -> nvfp4) before kv_cache_quant_algo ("FP8",
    "NVFP4"), under `quantization` or at the top. SGLang reads the same fields into its ModelOpt
    config's kv_cache_quant_algo (requests.for_checkpoint). None: the engines' 16-bit default."""
    if not isinstance(config, dict):
        return None
    inner = config["quantization"] if isinstance(config.get("quantization"), dict) else config
    producer = config.get("producer")
    legacy = (isinstance(producer, dict) and producer.get("name") == "modelopt"
              and inner.get("quant_algo") is not None)
    if not str(config.get("quant_method", "")).startswith("modelopt") and not legacy:
        return None
    algo = (inner.get("kv_cache_scheme") or config.get("kv_cache_scheme")
            or inner.get("kv_cache_quant_algo") or config.get("kv_cache_quant_algo"))
    if isinstance(algo, dict):
        if algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get("type") == "float":
            return "fp8"
        if algo.get("num_bits") == 4 and algo.get("type") == "float":
            return "nvfp4"
        return None  # vLLM warns and keeps auto
    return {"fp8": "fp8", "nvfp4": "nvfp4"}.get(algo.lower()) if isinstance(algo, str) else None


MODELOPT_ALGOS = {"FP8": "fp8", "NVFP4": "nvfp4", "MXFP4": "mxfp4"}
"""NVIDIA ModelOpt quant_algo -> weight format (the checkpoint carries it: vLLM and SGLang
read hf_quant_config.json / quantization_config themselves)."""


def _modelopt_fields(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """A ModelOpt checkpoint: quant_algo at the top of quantization_config, or under
    `quantization` in hf_quant_config.json; exclude_modules says what stays unquantized.
    MIXED_PRECISION carries its per-module map until the layer counts are known."""
    config = config.get("quantization", config) if isinstance(config.get("quantization"), dict) else config
    algo = config.get("quant_algo")
    if algo == "MIXED_PRECISION":  # per-module formats: planner/hf_mixed_precision.py
        return mixed_precision_layers(config, path)
    if algo not in MODELOPT_ALGOS:
        raise SpecError(f"{path}: quant_algo: unsupported ModelOpt algorithm {algo!r} "
                        f"(supported: {', '.join(MODELOPT_ALGOS)}, MIXED_PRECISION)")
    return {"quantization": MODELOPT_ALGOS[algo],
            "quantization_scope": _scope(config.get("exclude_modules", config.get("ignore")))}


NOT_BLOCK_MATMULS = r"(gate|norm|bias|indexers?_proj|indexer\.[\w.]*)\$?['\"]?\s*$"
"""Excluded module names that are not the block matmuls a quantization scope is about: router
gates, norms, biases and a DSA indexer's small projections (GLM-5-FP8 lists each layer's
self_attn.kv_a_layernorm and self_attn.indexers_proj, which had read as its attention
excluded)."""


def _scope(excluded: Any) -> str:
    """Which block matmuls a checkpoint quantizes, from its excluded module names (a list,
    or ModelOpt's stringified list): shared experts excluded -> routed experts only (also
    Gemma 4's `layers.N.mlp`, the dense MLP that runs beside its experts, which live in
    `layers.N.experts`); attention excluded -> the MLPs; else all."""
    entries = excluded if isinstance(excluded, list) else re.split(r"[,\[\]]", str(excluded or ""))
    # router gates (mlp.gate, shared_expert_gate) are not block matmuls the scope is about:
    # llm-compressor's usual ignore list names them, and "shared_expert_gate" had read as the
    # shared experts excluded (Qwen2-57B-A14B W4A16 planned 41.6 GB where it is 31.2: a read)
    names = " ".join(name for name in map(str, entries) if not re.search(NOT_BLOCK_MATMULS, name.strip()))
    if "shared_expert" in names or re.search(r"layers\.\d+\.mlp\*", names) and "experts" not in names:
        return "experts"
    if "attn" in names:
        return "mlp"
    return "all"


def _int8_inputs(config: dict[str, Any]) -> bool:
    """Whether a compressed-tensors config quantizes the GEMM inputs to 8-bit integers: a config
    group whose input_activations are {"type": "int", "num_bits": 8} (W8A8; vLLM's
    CompressedTensorsW8A8Int8 scheme, compressed_tensors.py _is_dynamic_token_w8a8 /
    _is_static_tensor_w8a8 at 0.33.0). GPTQ and AWQ quantize the weights only."""
    groups = config.get("config_groups") if str(config.get("quant_method", "")).lower() == "compressed-tensors" else None
    if not isinstance(groups, dict):
        return False
    return any(isinstance(group, dict) and isinstance(group.get("input_activations"), dict)
               and group["input_activations"].get("type") == "int" and group["input_activations"].get("num_bits") == 8
               for group in groups.values())


def _compressed_tensors_weights(config: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """The `weights` scheme of every compressed-tensors config group."""
    groups = config.get("config_groups") or {}
    where = f"{path}: quantization_config.config_groups"
    if not isinstance(groups, dict):
        raise SpecError(f"{where}: expected an object of named groups (got {type(groups).__name__})")
    schemes = []
    for name, group in groups.items():
        if not isinstance(group, dict):
            raise SpecError(f"{where}.{name}: expected an object (got {group!r:.40})")
        weights = group.get("weights") or {}
        if not isinstance(weights, dict):
            raise SpecError(f"{where}.{name}.weights: expected an object (got {weights!r:.40})")
        schemes.append(weights)
    return schemes
