"""Hugging Face config.json import: the tests write Llama-, Mixtral- and Qwen2-style configs
(the published values of those repositories, irrelevant keys included) and check they load
to exactly the shipped YAML (name and source aside), through `resolve_model`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from planner.catalog import resolve_model
from planner.cost.params import param_counts, weight_bytes
from planner.specs import ModelSpec, SpecError

# meta-llama/Llama-3.1-70B config.json
LLAMA_3_1_70B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 8192,
    "initializer_range": 0.02,
    "intermediate_size": 28672,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

# mistralai/Mixtral-8x7B-v0.1 config.json
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}

# Qwen/Qwen2.5-72B-Instruct config.json (qkv biases come from model_type qwen2)
QWEN_2_5_72B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 8192,
    "initializer_range": 0.02,
    "intermediate_size": 29568,
    "max_position_embeddings": 32768,
    "max_window_layers": 70,
    "model_type": "qwen2",
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}

IGNORED = {"name", "source", "architecture"}
"""Provenance: a shipped YAML names its architecture only where an engine treats it apart."""


def _write(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def _fields(model: ModelSpec) -> dict[str, Any]:
    return {k: v for k, v in model.model_dump().items() if k not in IGNORED}


def _assert_same_model(loaded: ModelSpec, shipped: ModelSpec) -> None:
    assert _fields(loaded) == _fields(shipped)
    assert param_counts(loaded) == param_counts(shipped)
    assert weight_bytes(loaded) == weight_bytes(shipped)


@pytest.mark.parametrize(
    ("config", "shipped_name", "dirname"),
    [
        (LLAMA_3_1_70B, "llama-3.1-70b", "Llama-3.1-70B"),
        (MIXTRAL_8X7B, "mixtral-8x7b", "Mixtral-8x7B-v0.1"),
        (QWEN_2_5_72B, "qwen2.5-72b", "Qwen2.5-72B-Instruct"),
    ],
)
def test_config_json_loads_to_the_shipped_yaml(
    tmp_path: Path, config: dict[str, Any], shipped_name: str, dirname: str
) -> None:
    path = _write(tmp_path / dirname, config)
    shipped = resolve_model(shipped_name)
    by_file = resolve_model(str(path))
    by_dir = resolve_model(str(path.parent))
    _assert_same_model(by_file, shipped)
    _assert_same_model(by_dir, shipped)
    assert by_file.name == dirname
    assert by_file == by_dir


def test_mixtral_counts_from_config(tmp_path: Path) -> None:
    """46.7B total, 12.9B active (two of eight experts)."""
    counts = param_counts(resolve_model(str(_write(tmp_path, MIXTRAL_8X7B))))
    assert counts.total == pytest.approx(46.7e9, rel=0.01)
    assert counts.active == pytest.approx(12.9e9, rel=0.01)


def test_name_or_path_names_the_model(tmp_path: Path) -> None:
    config = {**LLAMA_3_1_70B, "_name_or_path": "meta-llama/Llama-3.1-70B"}
    assert resolve_model(str(_write(tmp_path, config))).name == "Llama-3.1-70B"


def test_explicit_head_dim_and_tied_embeddings(tmp_path: Path) -> None:
    """Llama-3.2-1B-style: head_dim given, tied embeddings -> no separate lm_head."""
    config = {
        **LLAMA_3_1_70B,
        "head_dim": 64,
        "num_attention_heads": 32,
        "tie_word_embeddings": True,
    }
    model = resolve_model(str(_write(tmp_path, config)))
    assert model.head_dim == 64 and model.tie_word_embeddings
    assert param_counts(model).lm_head == 0


def test_gating_follows_the_family_not_the_activation_name(tmp_path: Path) -> None:
    """LlamaMLP is gated whatever its activation is called; GPTNeoXMLP never is; a family
    in neither list falls back to the activation (gelu -> two matrices)."""
    llama_gelu = {**LLAMA_3_1_70B, "hidden_act": "gelu_new"}
    assert resolve_model(str(_write(tmp_path / "a", llama_gelu))).gated_mlp is True
    neox = {**LLAMA_3_1_70B, "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}
    assert resolve_model(str(_write(tmp_path / "b", neox))).gated_mlp is False
    unknown = {**LLAMA_3_1_70B, "model_type": "newfamily", "architectures": [], "hidden_act": "gelu"}
    assert resolve_model(str(_write(tmp_path / "c", unknown))).gated_mlp is False
    unknown_silu = {**unknown, "hidden_act": "silu"}
    assert resolve_model(str(_write(tmp_path / "d", unknown_silu))).gated_mlp is True


# google/gemma-2-9b config.json (gated GeGLU MLP under the name gelu_pytorch_tanh; no
# tie_word_embeddings key: Gemma2Config ties them by default)
GEMMA_2_9B: dict[str, Any] = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "sliding_window_size": 4096,
    "torch_dtype": "float32",
    "transformers_version": "4.42.0.dev0",
    "use_cache": True,
    "vocab_size": 256000,
}


def test_gemma_2_9b_is_9_24b_parameters(tmp_path: Path) -> None:
    """Gemma-2-9B: 9.24B parameters (the model card; 9,241,705,984 in the checkpoint). Read as
    a two-matrix MLP it would be 7.08B: the GeGLU has 3 matrices of 3584 x 14336 per layer."""
    model = resolve_model(str(_write(tmp_path, GEMMA_2_9B)))
    assert model.gated_mlp and model.tie_word_embeddings and model.head_dim == 256
    assert param_counts(model).total == pytest.approx(9.24e9, rel=0.01)


def test_multimodal_wrapper_plans_its_text_model(tmp_path: Path) -> None:
    """A Llava-style config: the language model sits in text_config; the top level holds the
    dtype. Read as that text model, with the wrapper named in the source."""
    text = {k: v for k, v in LLAMA_3_1_70B.items() if k not in ("architectures", "torch_dtype")}
    wrapper = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "image_token_index": 128256,
        "torch_dtype": "bfloat16",
        "text_config": text,
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024},
    }
    loaded = resolve_model(str(_write(tmp_path, wrapper)))
    _assert_same_model(loaded.model_copy(update={"text_model_of": None}), resolve_model("llama-3.1-70b"))
    assert "llava" in loaded.source and "text model" in loaded.source and loaded.text_model_of == "llava"


def test_gemma_3_wrapper_reads_text_config_and_ties_by_default(tmp_path: Path) -> None:
    """google/gemma-3-27b-it: Gemma3ForConditionalGeneration, text_config of gemma3_text."""
    wrapper = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "text_config": {
            "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
            "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
            "num_key_value_heads": 16, "query_pre_attn_scalar": 168, "sliding_window": 1024,
            "max_position_embeddings": 131072, "vocab_size": 262208,
        },
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
    }
    model = resolve_model(str(_write(tmp_path, wrapper)))
    assert model.gated_mlp and model.tie_word_embeddings
    # 27.0B of language model (the 0.4B SigLIP tower is not counted)
    assert param_counts(model).total == pytest.approx(27.0e9, rel=0.02)


@pytest.mark.parametrize(("torch_dtype", "dtype"), [("float16", "float16"), ("float32", "float32")])
def test_torch_dtype(tmp_path: Path, torch_dtype: str, dtype: str) -> None:
    config = {**LLAMA_3_1_70B, "torch_dtype": torch_dtype}
    assert resolve_model(str(_write(tmp_path, config))).dtype == dtype


@pytest.mark.parametrize(
    ("quantization_config", "shipped_name"),
    [
        # an FP8-dynamic checkpoint
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "llama-3.1-70b-fp8"),
        # meta-llama's own *-FP8 checkpoints
        ({"quant_method": "fbgemm_fp8", "activation_scheme": "dynamic"}, "llama-3.1-70b-fp8"),
        # hugging-quants AWQ-INT4
        (
            {
                "quant_method": "awq",
                "bits": 4,
                "group_size": 128,
                "version": "gemm",
                "zero_point": True,
            },
            "llama-3.1-70b-awq",
        ),
        # a GPTQ 4-bit, group 128 checkpoint
        (
            {
                "quant_method": "gptq",
                "bits": 4,
                "group_size": 128,
                "desc_act": True,
                "sym": True,
                "damp_percent": 0.01,
            },
            "llama-3.1-70b-awq",
        ),
        # compressed-tensors FP8 (Neural Magic / Red Hat)
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {"targets": ["Linear"], "weights": {"type": "float", "num_bits": 8}}
                },
            },
            "llama-3.1-70b-fp8",
        ),
    ],
)
def test_quantization_config_maps_to_the_shipped_variant(
    tmp_path: Path, quantization_config: dict[str, Any], shipped_name: str
) -> None:
    config = {**LLAMA_3_1_70B, "quantization_config": quantization_config}
    loaded = resolve_model(str(_write(tmp_path, config)))
    _assert_same_model(loaded, resolve_model(shipped_name))


def test_gptq_8bit_and_awq_legacy_keys(tmp_path: Path) -> None:
    gptq8 = {
        **LLAMA_3_1_70B,
        "quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": 128},
    }
    assert resolve_model(str(_write(tmp_path / "a", gptq8))).quantization == "int8"
    awq_legacy = {
        **LLAMA_3_1_70B,
        "quantization_config": {"quant_method": "awq", "w_bit": 4, "q_group_size": 64},
    }
    model = resolve_model(str(_write(tmp_path / "b", awq_legacy)))
    assert (model.quantization, model.quantization_group_size) == ("int4", 64)


def test_gptq_per_channel_group(tmp_path: Path) -> None:
    """GPTQ group_size -1 means one scale per output channel (a row of h = 8192 weights), so the
    scale overhead is 2.5/8192 B per weight, not the 2.5 B of a one-weight group: the weights
    stay near 0.5 B each and well under the bf16 size."""
    config = {
        **LLAMA_3_1_70B,
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": -1},
    }
    model = resolve_model(str(_write(tmp_path, config)))
    assert model.quantization == "int4" and model.quantization_group_size == 8192
    assert weight_bytes(model) < weight_bytes(resolve_model("llama-3.1-70b-awq"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"hidden_size": 8192,', "malformed JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({**LLAMA_3_1_70B, "torch_dtype": "float8"}), "torch_dtype"),
        (
            json.dumps({**LLAMA_3_1_70B, "quantization_config": {"quant_method": "bitsandbytes"}}),
            "quantization_config",
        ),
        (
            json.dumps(
                {
                    **LLAMA_3_1_70B,
                    "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": "x"},
                }
            ),
            "group_size",
        ),
        # AWQ's group_size 0 was read as "absent" and planned at 128; -2 means nothing
        (json.dumps({**LLAMA_3_1_70B, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 0}}),
         "quantization_config.group_size: expected a positive integer or -1"),
        (json.dumps({**LLAMA_3_1_70B, "quantization_config": {"quant_method": "gptq", "bits": 4,
                                                              "q_group_size": -2}}),
         "quantization_config.q_group_size"),
        # 8,192 hidden inputs are not whole groups of 96 (no quantizer writes it, vLLM refuses it)
        (json.dumps({**LLAMA_3_1_70B, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 96}}),
         "quantization_group_size: int4 groups of 96 do not divide the hidden size 8,192"),
        (json.dumps({k: v for k, v in LLAMA_3_1_70B.items() if k != "vocab_size"}), "vocab_size"),
        (json.dumps({**LLAMA_3_1_70B, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}}),
         "quantization_config.weight_block_size: expected two positive integers"),
        # a string where an object belongs was dropped (Llama 3.1 planned without its scaling)
        (json.dumps({**LLAMA_3_1_70B, "rope_scaling": "llama3"}), "rope_scaling: expected an object"),
        (json.dumps({**LLAMA_3_1_70B, "num_key_value_heads": 7}), "num_key_value_heads"),
        (json.dumps({**LLAMA_3_1_70B, "torch_dtype": ["bfloat16"]}), "torch_dtype"),
        (json.dumps({**LLAMA_3_1_70B, "dtype": None, "torch_dtype": 16}), "torch_dtype"),
        (json.dumps({**LLAMA_3_1_70B, "quantization_config": {
            "quant_method": "compressed-tensors", "config_groups": [{"weights": {}}]}}),
         "quantization_config.config_groups"),
        (json.dumps({**LLAMA_3_1_70B, "quantization_config": {
            "quant_method": "compressed-tensors", "config_groups": {"group_0": "int4"}}}),
         "quantization_config.config_groups.group_0"),
        (json.dumps({**LLAMA_3_1_70B, "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {"group_0": {"weights": [4]}}}}),
         "quantization_config.config_groups.group_0.weights"),
        (json.dumps({**LLAMA_3_1_70B, "hidden_size": 8192.0}), "hidden_size: must be an integer"),
        (json.dumps({**LLAMA_3_1_70B, "hidden_size": "8192"}), "hidden_size: must be an integer"),
        (json.dumps({**LLAMA_3_1_70B, "num_hidden_layers": True}), "num_hidden_layers: must be an integer"),
        (json.dumps({**LLAMA_3_1_70B, "hidden_size": 10**30}), "hidden_size"),
        (json.dumps({**LLAMA_3_1_70B, "tie_word_embeddings": "yes"}), "tie_word_embeddings"),
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
        ('{"hidden_size": ' + "9" * 5000 + "}", "malformed JSON"),
        (json.dumps({"model_type": "llava", "text_config": [1]}), "text_config"),
        (json.dumps({"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 8}}),
         "text_config: num_hidden_layers: missing"),
    ],
)
def test_bad_config_json_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        resolve_model(str(path))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(str(path)) and message in str(info.value)


def test_non_utf8_config_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe{bad")
    with pytest.raises(SpecError, match="cannot read"):
        resolve_model(str(path))


def test_directory_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no config.json"):
        resolve_model(str(tmp_path))


# The heads of the published config.json files (architectures, model_type, is_encoder_decoder)
NOT_DECODERS = {
    "bert-base-uncased": {"architectures": ["BertForMaskedLM"], "model_type": "bert",
                          "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                          "intermediate_size": 3072, "vocab_size": 30522,
                          "max_position_embeddings": 512, "hidden_act": "gelu"},
    "roberta-base": {"architectures": ["RobertaForMaskedLM"], "model_type": "roberta"},
    "t5-base": {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
                "is_encoder_decoder": True, "d_model": 768},
    "facebook/bart-large": {"architectures": ["BartModel"], "model_type": "bart",
                            "is_encoder_decoder": True},
    "google/vit-base-patch16-224": {"architectures": ["ViTForImageClassification"],
                                    "model_type": "vit", "hidden_size": 768},
    "openai/whisper-large-v3": {"architectures": ["WhisperForConditionalGeneration"],
                                "model_type": "whisper", "is_encoder_decoder": True},
    "unknown encoder-decoder": {"model_type": "newseq2seq", "is_encoder_decoder": True},
    "unknown masked LM": {"architectures": ["NewForMaskedLM"]},
}


@pytest.mark.parametrize("name", sorted(NOT_DECODERS))
def test_non_decoder_architectures_are_refused(tmp_path: Path, name: str) -> None:
    """A BERT, T5, ViT or Whisper config.json is not planned as a decoder LLM (which would
    print a `vllm serve` command for it): one line naming what it is."""
    path = _write(tmp_path, NOT_DECODERS[name])
    with pytest.raises(SpecError) as info:
        resolve_model(str(path))
    message = str(info.value)
    assert message.startswith(str(path)) and "decoder-only" in message and "\n" not in message
    assert any(kind in message for kind in ("encoder-only", "encoder-decoder", "vision model"))


# --- every current family: real configs in tests/fixtures/hf_configs --------------------

CORPUS = Path(__file__).parent / "fixtures" / "hf_configs"


def test_modelopt_fp8_read_from_hf_quant_config_beside_config_json() -> None:
    """nvidia/Llama-3.1-70B-Instruct-FP8 declares FP8 only in hf_quant_config.json."""
    model = resolve_model(str(CORPUS / "nvidia--Llama-3.1-70B-Instruct-FP8" / "config.json"))
    assert model.quantization == "fp8"
    assert weight_bytes(model) == pytest.approx(72.7e9, rel=0.01)


def test_nvfp4_deepseek_keeps_attention_in_bf16() -> None:
    model = resolve_model(str(CORPUS / "nvidia--DeepSeek-V3.1-NVFP4" / "config.json"))
    assert (model.quantization, model.quantization_scope) == ("nvfp4", "mlp")


@pytest.mark.parametrize("experts_key", ["num_local_experts", "num_experts", "n_routed_experts"])
def test_expert_count_under_every_familys_key(tmp_path: Path, experts_key: str) -> None:
    config = {**MIXTRAL_8X7B}
    config[experts_key] = config.pop("num_local_experts")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert param_counts(resolve_model(str(path))).total == pytest.approx(46.7e9, rel=0.01)


def test_minimax_m3_counts_dense_layers_and_a_gated_swigluoai() -> None:
    """3 dense layers of dense_intermediate_size, 57 MoE layers of 128 experts + 1 shared;
    swigluoai is gated: 426B (the issue's figure; 301B before)."""
    model = resolve_model(str(CORPUS / "MiniMaxAI--MiniMax-M3" / "config.json"))
    assert model.gated_mlp and model.num_dense_layers == 3
    assert param_counts(model).total == pytest.approx(426e9, rel=0.01)


def test_relu2_is_a_two_matrix_mlp(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_3_1_70B, "model_type": "custom", "hidden_act": "relu2"}))
    assert resolve_model(str(path)).gated_mlp is False


@pytest.mark.parametrize(("folder", "feature"), [
    ("moonshotai--Kimi-K3", "linear-attention layers"),
    ("deepseek-ai--DeepSeek-V4-Pro", "compressed sparse attention"),
])
def test_unmodelled_layers_are_refused_in_one_line(folder: str, feature: str) -> None:
    with pytest.raises(SpecError, match=feature) as info:
        resolve_model(str(CORPUS / folder / "config.json"))
    assert "\n" not in str(info.value)


def test_gpt_oss_layer_types_give_the_window_layers() -> None:
    """openai/gpt-oss-120b: layer_types alternates 18 sliding_attention (sliding_window 128)
    and 18 full_attention layers; the shipped YAML says the same."""
    model = resolve_model("tests/fixtures/hf_configs/openai--gpt-oss-120b/config.json")
    assert (model.sliding_window, model.num_window_layers) == (128, 18)
    shipped = resolve_model("gpt-oss-120b")
    assert (shipped.sliding_window, shipped.num_window_layers) == (128, 18)


@pytest.mark.parametrize(
    ("keys", "window", "num_window_layers"),
    [
        ({"model_type": "mistral", "sliding_window": 4096}, 4096, 32),  # Mistral-7B v0.1: all
        ({"model_type": "mistral", "sliding_window": None}, None, 0),  # v0.3
        ({"model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False,
          "max_window_layers": 28}, None, 0),  # Qwen2/Qwen3: an unused window
        ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": True,
          "max_window_layers": 28}, 4096, 4),  # layers 28..31
        ({"model_type": "gemma2", "sliding_window": 4096}, 4096, 16),  # even layers of 32
        ({"model_type": "gemma3_text", "sliding_window": 1024}, 1024, 27),  # 32 - 32 // 6
        ({"model_type": "gemma3_text", "sliding_window": 1024, "sliding_window_pattern": 4}, 1024, 24),
        # Command R7B / Command A (Cohere2Config: pattern 4, every fourth layer global): they were
        # planned with every layer windowed, an eighth of the KV a 128K-token request holds
        ({"model_type": "cohere2", "sliding_window": 4096, "sliding_window_pattern": 4}, 4096, 24),
        ({"model_type": "cohere2", "sliding_window": 4096}, 4096, 24),  # the class default, 4
        # EXAONE-4.0's pattern string: L (local) L L G over the layers
        ({"model_type": "exaone4", "sliding_window": 4096, "sliding_window_pattern": "LLLG"}, 4096, 24),
        ({"model_type": "llama", "sliding_window": 128,
          "layer_types": ["sliding_attention", "full_attention"] * 16}, 128, 16),
        ({"model_type": "llama", "sliding_window": 128, "layer_types": ["full_attention"] * 32}, None, 0),
    ],
)
def test_sliding_window_layers_each_familys_way(tmp_path: Path, keys: dict, window: int | None,
                                                num_window_layers: int) -> None:
    config = {**{k: v for k, v in LLAMA_3_1_70B.items() if k != "model_type"},
              "num_hidden_layers": 32, **keys}
    model = resolve_model(str(_write(tmp_path, config)))
    assert (model.sliding_window, model.num_window_layers) == (window, num_window_layers)


def test_a_pattern_neither_a_period_nor_l_and_g_is_refused(tmp_path: Path) -> None:
    config = {**LLAMA_3_1_70B, "model_type": "exaone4", "sliding_window": 4096, "sliding_window_pattern": "LLX"}
    with pytest.raises(SpecError, match=r"config.json: sliding_window_pattern: expected a positive integer"):
        resolve_model(str(_write(tmp_path, config)))


def test_cohere_families_tie_their_embeddings_by_default(tmp_path: Path) -> None:
    """Cohere2Config (and CohereConfig) default tie_word_embeddings to true; Command R7B's
    config.json says only use_embedding_sharing: true. Counted untied, R7B came out 9.08B: its
    256,000 x 4,096 = 1,048,576,000 output weights too many (published 8B)."""
    config = {**{k: v for k, v in LLAMA_3_1_70B.items() if k != "tie_word_embeddings"}, "model_type": "cohere2",
              "use_embedding_sharing": True}
    tied = resolve_model(str(_write(tmp_path / "a", config)))
    untied = resolve_model(str(_write(tmp_path / "b", {**config, "tie_word_embeddings": False})))
    assert tied.tie_word_embeddings and not untied.tie_word_embeddings
    assert param_counts(untied).total - param_counts(tied).total == 128_256 * 8_192


def test_a_gemma3_wrapper_takes_its_text_class_defaults(tmp_path: Path) -> None:
    """google/gemma-3-27b-it's text_config leaves out vocab_size and max_position_embeddings
    (Gemma3TextConfig's defaults: 262,208 and 131,072): it was refused as missing them."""
    text = {"model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
            "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16, "sliding_window": 1024}
    config = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text,
              "torch_dtype": "bfloat16", "vision_config": {"model_type": "siglip_vision_model"}}
    model = resolve_model(str(_write(tmp_path, config)))
    assert (model.vocab_size, model.max_position_embeddings, model.tie_word_embeddings) == (262_208, 131_072, True)
    assert model.num_window_layers == 62 - 62 // 6


def test_minimax_lightning_attention_layers_are_refused(tmp_path: Path) -> None:
    """MiniMax-M1's attn_type_list: 0 = lightning (linear) attention, 1 = softmax (vLLM's
    minimax_text_01.py). It was planned as 80 softmax layers (8x its KV); M2's list of all 1s
    stays planned."""
    lightning = {**LLAMA_3_1_70B, "attn_type_list": ([0] * 7 + [1]) * 10}
    with pytest.raises(SpecError, match=r"attn_type_list: 70 lightning \(linear\) attention layers"):
        resolve_model(str(_write(tmp_path / "a", lightning)))
    softmax = {**LLAMA_3_1_70B, "attn_type_list": [1] * 80}
    assert resolve_model(str(_write(tmp_path / "b", softmax))).num_hidden_layers == 80


def test_ernie_45_moe_keys(tmp_path: Path) -> None:
    """ERNIE-4.5-300B-A47B names its experts moe_num_experts / moe_k / moe_num_shared_experts and
    its dense prefix moe_layer_start_index (vLLM ernie45_moe.py: MoE where (i + 1) % interval == 0
    and start <= i <= end); it was refused as an MoE size without experts. Hand count: attention
    8,192 x (8,192 + 2 x 1,024) + 8,192 x 8,192 = 150,994,944 a layer, 54 layers = 8,153,726,976;
    3 dense MLPs 3 x 8,192 x 28,672 x 3 = 2,113,929,216; 51 MoE layers of 64 experts 3 x 8,192 x
    3,584 = 88,080,384 each, 287,482,373,120, and routers 51 x 8,192 x 64 = 26,738,688; embeddings
    and LM head 2 x 103,424 x 8,192 = 1,694,498,816; norms 8,192 x (2 x 54 + 1) = 892,928:
    299,471,759,744 (published 300B)."""
    config = {"architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "hidden_act": "silu",
              "hidden_size": 8192, "intermediate_size": 28672, "max_position_embeddings": 131072,
              "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 54, "vocab_size": 103424,
              "rope_theta": 500000, "use_bias": False, "tie_word_embeddings": False, "moe_num_experts": 64,
              "moe_num_shared_experts": 0, "moe_layer_start_index": 3, "moe_intermediate_size": 3584, "moe_k": 8,
              "moe_layer_interval": 1, "moe_use_aux_free": True, "head_dim": 128, "torch_dtype": "bfloat16"}
    model = resolve_model(str(_write(tmp_path, config)))
    assert (model.num_local_experts, model.num_experts_per_tok, model.num_dense_layers) == (64, 8, 3)
    assert model.dense_layer_indices == [0, 1, 2] and model.router_expert_bias
    assert param_counts(model).total == pytest.approx(299_471_759_744, rel=1e-4)


def test_a_bad_sliding_window_is_one_line(tmp_path: Path) -> None:
    config = {**LLAMA_3_1_70B, "sliding_window": -4}
    with pytest.raises(SpecError, match=r"config.json: sliding_window: must be at least 1") as info:
        resolve_model(str(_write(tmp_path, config)))
    assert "\n" not in str(info.value)


def test_nemotron_h_pattern_gives_the_layer_kinds() -> None:
    """Nemotron-H-56B's hybrid_override_pattern: 54 M (Mamba2), 10 * (attention), 54 - (MLP)
    blocks of one mixer each; the SSM state fp32 (vLLM's default for Nemotron-H)."""
    model = resolve_model(str(CORPUS / "nvidia--Nemotron-H-56B-Base-8K" / "config.json"))
    assert (model.num_hidden_layers, model.num_recurrent_layers, model.recurrent_kind) == (118, 54, "mamba2")
    assert (model.num_mlp_only_layers, model.num_mixer_only_layers) == (54, 64)
    assert (model.head_dim, model.gated_mlp, model.recurrent_state_dtype) == (128, False, "float32")


def test_qwen3_5_layer_types_give_the_gated_deltanet_layers() -> None:
    """Qwen3.5-27B: 48 linear_attention (Gated DeltaNet) and 16 full_attention layers with the
    output gate; the state in mamba_ssm_dtype float32."""
    model = resolve_model(str(CORPUS / "Qwen--Qwen3.5-27B" / "config.json"))
    assert (model.num_recurrent_layers, model.recurrent_kind, model.conv_kernel) == (48, "gated_deltanet", 4)
    assert model.attention_output_gate and model.recurrent_state_dtype == "float32"


# Qwen/Qwen3-Next-80B-A3B-Instruct config.json: the shape keys as published (no layer_types, no
# attn_output_gate: transformers' Qwen3NextConfig fills both in)
QWEN3_NEXT_80B: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "intermediate_size": 5120, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "num_experts": 512, "num_experts_per_tok": 10, "decoder_sparse_step": 1, "norm_topk_prob": True,
    "mlp_only_layers": [], "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "vocab_size": 151936, "rope_theta": 10000000, "partial_rotary_factor": 0.25,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-06,
}


def test_qwen3_next_layers_from_its_full_attention_interval(tmp_path: Path) -> None:
    """Qwen3-Next gives its layer pattern as full_attention_interval 4: layers 3, 7, ..., 47
    ((i + 1) % 4 == 0) are full attention, the other 48 - 12 = 36 Gated DeltaNet; so the KV cache
    is 12 layers x 2 x 2 KV heads x 256 x 2 B = 24 KiB per token (48 layers would be 96 KiB), and
    its attention is output-gated (no key says so; Qwen3NextAttention always is)."""
    from planner.cost.params import kv_bytes_per_token

    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_NEXT_80B))
    model = resolve_model(str(path))
    assert (model.num_recurrent_layers, model.recurrent_kind) == (36, "gated_deltanet")
    assert model.attention_output_gate and model.text_model_of is None  # text-only, not a wrapper
    assert kv_bytes_per_token(model) == 12 * 2 * 2 * 256 * 2 == 24 * 1024
    without_interval = {key: value for key, value in QWEN3_NEXT_80B.items() if key != "full_attention_interval"}
    path.write_text(json.dumps(without_interval))  # transformers' default interval is 4 too
    assert resolve_model(str(path)).num_recurrent_layers == 36
    path.write_text(json.dumps({**QWEN3_NEXT_80B, "full_attention_interval": 0}))
    with pytest.raises(SpecError, match="full_attention_interval: expected a positive integer"):
        resolve_model(str(path))


@pytest.mark.parametrize(("change", "feature"), [
    ({"hybrid_override_pattern": "M*-X"}, "block characters 'X' are not modelled"),
    ({"layer_types": ["linear_attention", "full_attention"] * 2}, "linear_attention layers are not modelled"),
])
def test_unknown_hybrid_layers_are_refused_in_one_line(tmp_path: Path, change: dict, feature: str) -> None:
    """A Nemotron-H block character the planner does not know; linear_attention layers without
    Gated DeltaNet shapes (MiniMax's lightning attention names its layers the same)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_3_1_70B, "num_hidden_layers": 4, **change}))
    with pytest.raises(SpecError, match=feature) as info:
        resolve_model(str(path))
    assert "\n" not in str(info.value)


def test_compressed_tensors_int4_group_and_symmetry_from_the_scheme():
    """Kimi-K2.5 (compressed-tensors pack-quantized, config_groups.group_0.weights: 4-bit int,
    group_size 32, symmetric): the experts hold 0.5 + 2/32 = 0.5625 bytes per weight (a bf16
    scale per 32, no zero point), not the AWQ default of 0.5 + 2.5/128; its weights come to
    594 GB (553.4 GiB), the size of Moonshot's int4 checkpoints."""
    from planner.catalog import resolve_model
    from planner.cost.params import bytes_per_weight, weight_bytes

    kimi = resolve_model(str(CORPUS / "moonshotai--Kimi-K2.5"))
    assert (kimi.quantization, kimi.quantization_group_size, kimi.quantization_zero_point) == ("int4", 32, False)
    assert bytes_per_weight(kimi, "int4") == 0.5625
    assert round(weight_bytes(kimi) / 1e9) == 594


def test_qwen35_mtp_layer_is_read():
    """Qwen3.5 configs name their multi-token-prediction layers mtp_num_hidden_layers (1)."""
    from planner.catalog import resolve_model

    assert resolve_model(str(CORPUS / "Qwen--Qwen3.5-27B")).num_mtp_layers == 1


FIXTURE_CONFIGS = Path(__file__).parent / "fixtures" / "hf_configs"


def test_group_limited_routing_from_n_group_and_topk_group(tmp_path: Path) -> None:
    """DeepSeek-R1 (n_group 8, topk_group 4): its tokens' experts come from 4 of 8 groups, as the
    shipped deepseek-v3 spec says; Kimi K2 (n_group 1) is not group-limited; an impossible
    topk_group is a one-line error naming the key and the file."""
    r1 = resolve_model(str(FIXTURE_CONFIGS / "deepseek-ai--DeepSeek-R1" / "config.json"))
    assert (r1.num_expert_groups, r1.expert_groups_per_token) == (8, 4)
    assert (resolve_model("deepseek-v3").num_expert_groups, resolve_model("deepseek-v3").expert_groups_per_token) == (8, 4)
    kimi = resolve_model(str(FIXTURE_CONFIGS / "moonshotai--Kimi-K2-Instruct" / "config.json"))
    assert kimi.num_expert_groups is None and kimi.expert_groups_per_token is None
    config = json.loads((FIXTURE_CONFIGS / "deepseek-ai--DeepSeek-R1" / "config.json").read_text())
    for bad, message in ((9, "topk_group: 9 exceeds n_group 8"), (0, "topk_group: group-limited routing needs a "
                                                                    "positive integer (got 0)")):
        path = _write(tmp_path / f"bad-{bad}", {**config, "topk_group": bad})
        with pytest.raises(SpecError, match=re.escape(message)) as raised:
            resolve_model(str(path))
        assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_multimodal_wrappers_text_model_says_its_towers_are_not_counted():
    """Qwen3-VL's config.json wraps a text model: the plan sizes the language model only, and the
    model line says so (it said so only in the spec's source)."""
    from planner.render.catalog import describe_model

    model = resolve_model(str(FIXTURE_CONFIGS / "Qwen--Qwen3-VL-8B-Instruct"))
    assert model.text_model_of == "qwen3_vl"
    assert "the text model of qwen3_vl (its vision/audio towers not counted" in describe_model(model)
    assert resolve_model("llama-3.1-8b").text_model_of is None


def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURE_CONFIGS / name / "config.json").read_text())


@pytest.mark.parametrize(("name", "change", "message"), [
    ("Qwen--Qwen3-30B-A3B", {"decoder_sparse_step": "2"}, "decoder_sparse_step: expected a non-negative integer"),
    ("Qwen--Qwen3-30B-A3B", {"mlp_only_layers": 5}, "mlp_only_layers: expected a list of layer indices"),
    ("Qwen--Qwen3-30B-A3B", {"mlp_only_layers": [[1]]}, "mlp_only_layers: expected a list of layer indices"),
    ("Qwen--Qwen3-30B-A3B", {"num_hidden_layers": 10**12}, "num_hidden_layers: must be from 1 to 4,096"),
    ("Qwen--Qwen3-30B-A3B", {"num_hidden_layers": 48.0}, "num_hidden_layers: must be an integer"),
    ("deepseek-ai--DeepSeek-R1", {"first_k_dense_replace": "3"}, "first_k_dense_replace: expected a non-negative"),
    ("nvidia--Nemotron-H-56B-Base-8K", {"hybrid_override_pattern": "M-M-M*-M-"},
     "hybrid_override_pattern: 9 blocks for num_hidden_layers 118"),
    ("nvidia--Nemotron-H-56B-Base-8K", {"hybrid_override_pattern": ""},
     "hybrid_override_pattern: 0 blocks for num_hidden_layers 118"),
])
def test_malformed_layer_keys_are_one_line_errors_before_any_layer_loop(tmp_path: Path, name: str, change: dict,
                                                                       message: str) -> None:
    """Keys the per-layer patterns read are checked first (hf_config.check_layer_keys): a string
    where an integer is due was a TypeError traceback, 10^12 layers a loop of a day, a pattern
    shorter than the model silently planned the rest as attention + MLP layers."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_fixture(name), **change}))
    with pytest.raises(SpecError, match=re.escape(message)) as info:
        resolve_model(str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_a_value_no_check_foresaw_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """A ModelOpt quant_algo given as a list: no key check knows it, and the reader's TypeError
    becomes one line naming the file (load_hf_config), not a traceback."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_3_1_70B, "quantization_config": {"quant_method": "modelopt",
                                                                        "quant_algo": ["FP8"]}}))
    with pytest.raises(SpecError, match="a value of an unexpected type or size") as info:
        resolve_model(str(path))
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_zero_experts_beside_a_top_k_is_an_error_not_a_dense_model(tmp_path: Path) -> None:
    """Mixtral's config.json with num_local_experts 0 (num_experts_per_tok still 2) was planned as
    a dense 7.2B model; the YAML spec refuses 0 experts, and so does the import now."""
    with pytest.raises(SpecError, match="num_local_experts: must be at least 1"):
        resolve_model(str(_write(tmp_path, {**MIXTRAL_8X7B, "num_local_experts": 0})))


def test_experts_only_quantization_of_a_dense_model_is_refused() -> None:
    """quantization_scope experts on a model without routed experts would print "fp8 experts +
    bfloat16 other weights" and plan plain bf16."""
    base = resolve_model("llama-3.1-8b")
    with pytest.raises(ValueError, match="quantization_scope: experts quantizes the routed experts only"):
        ModelSpec(**{**base.model_dump(), "quantization": "fp8", "quantization_scope": "experts"})


@pytest.mark.parametrize(("keys", "qk_norm", "score", "bias"), [
    # Ling-2.0 (bailing_moe): its own names for the per-head QK norm and DeepSeek-V3's router
    ({"model_type": "bailing_moe", "use_qk_norm": True, "score_function": "sigmoid",
      "moe_router_enable_expert_bias": True}, True, "sigmoid", True),
    ({"model_type": "apertus", "qk_norm": True}, True, "softmax", False),  # Apertus
    ({"model_type": "llama", "use_qk_norm": True}, False, "softmax", False),  # no per-head norm named
])
def test_other_families_names_for_qk_norm_and_the_router(tmp_path: Path, keys: dict, qk_norm: bool, score: str,
                                                         bias: bool) -> None:
    moe = {"num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 2048} if "score_function" in keys else {}
    model = resolve_model(str(_write(tmp_path, {**LLAMA_3_1_70B, **moe, **keys})))
    assert model.qk_norm is qk_norm
    if moe:
        assert (model.router_score_function, model.router_expert_bias) == (score, bias)


@pytest.mark.parametrize(("keys", "gated", "activation"), [
    ({"model_type": "nemotron", "hidden_act": "relu2"}, False, "squared_relu"),  # Nemotron's squared ReLU
    ({"model_type": "gemma", "hidden_activation": "gelu_pytorch_tanh"}, True, "gelu"),  # GeGLU
    ({"model_type": "apertus", "hidden_act": "xielu"}, False, "xielu"),
    ({"model_type": "llama", "hidden_act": "silu"}, True, None),  # SwiGLU: the usual gated one
    ({"model_type": "gpt2", "hidden_act": "gelu_new"}, False, None),  # GELU: the usual two-matrix one
])
def test_the_mlp_activation_where_it_is_not_the_usual_one(tmp_path: Path, keys: dict, gated: bool,
                                                          activation: str | None) -> None:
    """Megatron-LM builds GELU in a two-matrix MLP unless told --squared-relu, so Nemotron-4's
    relu2 was launched as a GELU model; xIELU and GeGLU it cannot build (the command is refused)."""
    config = {**{k: v for k, v in LLAMA_3_1_70B.items() if k != "hidden_act"}, **keys}
    model = resolve_model(str(_write(tmp_path, config)))
    assert (model.gated_mlp, model.mlp_activation) == (gated, activation)


def test_nemotron_layernorm_1p_and_half_rotary(tmp_path: Path) -> None:
    """A Nemotron config.json (transformers NemotronConfig: relu2, partial_rotary_factor 0.5,
    NemotronLayerNorm1P): LayerNorm with the 1p weight and half of each head rotated, as the
    shipped nemotron-4-340b spec says; the Megatron command carries --apply-layernorm-1p and
    --rotary-percent 0.5, not --normalization RMSNorm. Rotary work per token at t = 8, 96 heads,
    8 KV heads of 192 dims: (96/8 + 1) * 192 * 0.5 = 1,248 elements (2,496 for a full rotation)."""
    from planner.cost.params import rotary_elements_per_token
    from planner.emit.megatron import model_args

    config = {"model_type": "nemotron", "architectures": ["NemotronForCausalLM"], "hidden_size": 18432,
              "intermediate_size": 73728, "num_hidden_layers": 96, "num_attention_heads": 96,
              "num_key_value_heads": 8, "vocab_size": 256000, "hidden_act": "relu2", "partial_rotary_factor": 0.5,
              "max_position_embeddings": 4096, "rope_theta": 10000, "torch_dtype": "bfloat16",
              "tie_word_embeddings": False}
    model = resolve_model(str(_write(tmp_path / "nemotron", config)))
    assert (model.norm_type, model.layernorm_1p, model.partial_rotary_factor) == ("layernorm", True, 0.5)
    shipped = resolve_model("nemotron-4-340b")
    assert (shipped.layernorm_1p, shipped.partial_rotary_factor) == (True, 0.5)
    assert rotary_elements_per_token(model, 8) == (96 / 8 + 1) * 192 * 0.5 == 1248
    args = model_args(model, 4096, 8)  # the flags exist at both releases (tests/engine_flags)
    assert "--apply-layernorm-1p" in args and args[args.index("--rotary-percent") + 1] == "0.5"
    assert "RMSNorm" not in args


@pytest.mark.parametrize(("model_type", "refused"), [("qwen3_moe", True), ("deepseek_v3", True), ("mixtral", False)])
def test_experts_without_their_own_size_are_refused_unless_the_family_sizes_them_by_intermediate_size(
        tmp_path: Path, model_type: str, refused: bool) -> None:
    """A Qwen3-MoE config without moe_intermediate_size was planned with its 128 experts 28,672
    wide (Llama-70B's intermediate_size): 724B parameters where the family's are 768 wide. Families
    whose experts are intermediate_size wide (Mixtral) have no such key."""
    config = {**LLAMA_3_1_70B, "model_type": model_type, "num_local_experts": 8, "num_experts_per_tok": 2}
    path = str(_write(tmp_path, config))
    if refused:
        with pytest.raises(SpecError, match=r"config.json: moe_intermediate_size: missing \('" + model_type):
            resolve_model(path)
    else:
        assert resolve_model(path).num_local_experts == 8


@pytest.mark.parametrize(("update", "message"), [
    # found by a fuzz sweep: each said something else, or nothing
    ({"quantization_config": {"quant_method": "compressed-tensors"}},
     "quantization_config.config_groups: no weights scheme the planner reads (4- or 8-bit integer, 8-bit "
     "float or NVFP4 weights under config_groups.*.weights)"),
    ({"quantization_config": {"quant_method": "awq", "bits": "4"}},
     "quantization_config.bits: expected an integer (got '4')"),
    ({"layer_types": "full_attention"}, "layer_types: expected a list of layer type names (got 'full_attention')"),
])
def test_odd_config_fields_are_named(tmp_path: Path, update: dict[str, Any], message: str) -> None:
    path = _write(tmp_path, {**LLAMA_3_1_70B, **update})
    with pytest.raises(SpecError) as error:
        resolve_model(str(path))
    assert str(error.value) == f"{path}: {message}"


@pytest.mark.parametrize(("fixture", "theta", "rotated"), [
    ("zai-org--GLM-5", 1_000_000.0, 1.0),  # rope_parameters {"rope_theta": 1000000, "rope_type": "default"}
    ("Qwen--Qwen3.5-27B", 10_000_000.0, 0.25),  # theta and partial_rotary_factor only in rope_parameters
    ("meta-llama--Meta-Llama-3.1-8B", 500_000.0, 1.0),  # the older top-level keys
])
def test_transformers_v5_rope_parameters_are_read(fixture, theta, rotated):
    """transformers v5 moves rope_theta, partial_rotary_factor and the scaling into
    `rope_parameters`; the import had taken RoPE's default 10,000 (a CLI read: the Megatron
    command's --rotary-base would have trained GLM-5 at the wrong base)."""
    from planner.hf_config import load_hf_config

    model = load_hf_config(FIXTURE_CONFIGS / fixture / "config.json")
    assert model.rope_theta == theta and model.partial_rotary_factor == rotated


def test_a_llama3_config_in_rope_parameters_keeps_its_scaling(tmp_path):
    """Llama-3.1-8B's rope_scaling and rope_theta moved into rope_parameters: the same spec."""
    from planner.hf_config import load_hf_config

    config = json.loads((FIXTURE_CONFIGS / "meta-llama--Meta-Llama-3.1-8B" / "config.json").read_text())
    scaling, theta = config.pop("rope_scaling"), config.pop("rope_theta")
    config["rope_parameters"] = {**scaling, "rope_theta": theta}
    (tmp_path / "config.json").write_text(json.dumps(config))
    moved = load_hf_config(tmp_path / "config.json")
    assert moved.rope_theta == 500_000 and moved.llama3_rope_scaling_factor == 8
    assert moved.max_position_embeddings == 131_072


@pytest.mark.parametrize(("scaling", "positions"), [
    ({"rope_type": "linear", "factor": 4.0}, 4 * 8192),  # vLLM multiplies: 32,768
    ({"type": "dynamic", "factor": 2.0}, 2 * 8192),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}, 8192),  # already scaled
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, 8192),
])
def test_rope_scaling_extends_the_context_as_vllm_does(tmp_path, scaling, positions):
    """vLLM 0.33.0's _get_and_verify_max_len: max_position_embeddings x factor, except for the
    YaRN, Llama 3, LongRoPE and DeepSeek types, whose positions are already the scaled ones."""
    from planner.hf_config import load_hf_config

    config = json.loads((FIXTURE_CONFIGS / "meta-llama--Meta-Llama-3.1-8B" / "config.json").read_text())
    config.update(max_position_embeddings=8192, rope_scaling=scaling)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_hf_config(tmp_path / "config.json").max_position_embeddings == positions


def test_an_awq_config_without_bits_says_the_bits_are_missing(tmp_path):
    """{"quant_method": "awq", "group_size": 128}: the error names the missing key (it said the
    quant_method, which it lists as supported, was unsupported; a CLI read)."""
    from planner.hf_config import load_hf_config

    config = json.loads((FIXTURE_CONFIGS / "meta-llama--Meta-Llama-3.1-8B" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "group_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match=r"quantization_config\.bits: missing"):
        load_hf_config(tmp_path / "config.json")


def test_llama_3_2_vision_is_refused(tmp_path):
    """mllama's cross_attention_layers attend to image tokens; planned as self-attention they had
    counted KV for every text token in 40 layers, not 32 (a CLI read). vLLM serves it no more."""
    from planner.hf_config import load_hf_config

    text = json.loads((FIXTURE_CONFIGS / "meta-llama--Meta-Llama-3.1-8B" / "config.json").read_text())
    text.update(model_type="mllama_text_model", num_hidden_layers=40, cross_attention_layers=[3, 8, 13, 18])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mllama", "text_config": text,
                                                      "architectures": ["MllamaForConditionalGeneration"]}))
    with pytest.raises(SpecError, match="model_type: 'mllama'.*cross-attention layers over image tokens"):
        load_hf_config(tmp_path / "config.json")


@pytest.mark.parametrize(("fixture", "key", "value", "named"), [
    ("deepseek-ai--DeepSeek-V3", "n_routed_experts", "256", "n_routed_experts: must be an integer"),
    ("deepseek-ai--DeepSeek-V3", "num_nextn_predict_layers", -1, "num_nextn_predict_layers: must be at least 0"),
    ("meta-llama--Meta-Llama-3.1-8B", "rope_scaling", {"rope_type": "llama3", "factor": "8"},
     "rope_scaling.factor: must be a number"),
])
def test_errors_name_the_key_the_file_has(tmp_path, fixture, key, value, named):
    """A bad value under a family's own key is reported under that key, not the planner's field
    name (num_local_experts, num_mtp_layers, llama3_rope_scaling_factor), which the file lacks."""
    from planner.hf_config import load_hf_config

    config = json.loads((FIXTURE_CONFIGS / fixture / "config.json").read_text())
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match=re.escape(named)):
        load_hf_config(tmp_path / "config.json")


def _llama_8b_with(tmp_path, **changes):
    import json as _json

    from planner.hf_config import load_hf_config

    source = Path(__file__).parent / "fixtures" / "hf_configs" / "meta-llama--Meta-Llama-3.1-8B" / "config.json"
    config = {**_json.loads(source.read_text()), **changes}
    for key in [k for k, v in changes.items() if v is None]:
        config.pop(key)
    path = tmp_path / "config.json"
    path.write_text(_json.dumps(config))
    return load_hf_config(path)


def test_a_v5_text_only_config_is_not_a_wrapper(tmp_path):
    """transformers v5 writes rope_parameters in place of rope_theta/rope_scaling; the import
    copies the mapping to read them, and that copy had made a text-only Llama read as "the text
    model of llama" (and refused under V0 as a vision-language wrapper: a read)."""
    model = _llama_8b_with(tmp_path, rope_theta=None, rope_scaling=None,
                           rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                                            "rope_theta": 500000.0})
    assert model.text_model_of is None and "text model" not in model.source
    assert model.rope_theta == 500000.0


def test_fp8_checkpoints_keep_what_they_do_not_convert_16_bit(tmp_path):
    """Meta's FP8 checkpoints (fbgemm_fp8) leave every self_attn in bf16 (modules_to_not_convert),
    which vLLM honours: the attention weights are priced at 2 bytes, the MLPs at fp8's. Llama-3.1-8B:
    attention 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2) = 1,610,612,736 params at 2 B instead of
    about 1 (+1.61 GB)."""
    names = ["lm_head", *(f"model.layers.{i}.self_attn" for i in range(32))]
    excluded = _llama_8b_with(tmp_path, quantization_config={"quant_method": "fbgemm_fp8",
                                                             "modules_to_not_convert": names})
    everything = _llama_8b_with(tmp_path, quantization_config={"quant_method": "fbgemm_fp8"})
    assert excluded.quantization == "fp8" and excluded.quantization_scope == "mlp"
    assert everything.quantization_scope == "all"
    from planner.cost.params import weight_bytes

    extra = weight_bytes(excluded) - weight_bytes(everything)
    assert extra == pytest.approx(32 * (4096 * 4096 * 2 + 4096 * 1024 * 2), rel=0.01)


def test_router_gates_in_an_ignore_list_are_not_excluded_matmuls():
    """llm-compressor's usual ignore list names the routers (mlp.gate, shared_expert_gate); they
    are not the shared experts, so the scope stays all (it had read "experts")."""
    from planner.hf_config import _scope

    assert _scope(["lm_head", "re:.*mlp.gate$", "re:.*mlp.shared_expert_gate$"]) == "all"
    assert _scope(["lm_head", "model.layers.0.mlp.shared_expert.down_proj"]) == "experts"
    assert _scope("['lm_head', 'model.layers.*.self_attn*']") == "mlp"


def test_excluded_norms_and_indexer_projections_leave_the_scope_whole():
    """GLM-5-FP8 lists each layer's attention norms and DSA indexer projection unconverted, not
    its attention matmuls: scope all (reading "attn" in those names had made it mlp)."""
    from planner.hf_config import _scope

    glm = ["lm_head", "model.layers.3.self_attn.kv_a_layernorm", "model.layers.3.self_attn.indexers_proj",
           "model.layers.3.self_attn.indexer.k_norm.bias", "model.layers.3.mlp.gate.e_score_correction_bias"]
    assert _scope(glm) == "all"
    assert _scope([*glm, "model.layers.3.self_attn"]) == "mlp"


def test_model_max_length_is_the_context_vllm_serves(tmp_path):
    """Command-R's config.json: max_position_embeddings 8,192 beside model_max_length 131,072,
    which vLLM 0.33.0 takes as the context (model_arch_config_convertor.py); the plan had refused
    --max-model-len 131072 (a read)."""
    model = _llama_8b_with(tmp_path, max_position_embeddings=8192, model_max_length=131072, rope_scaling=None)
    assert model.max_position_embeddings == 131072


def test_kimis_config_alone_still_gets_trust_remote_code():
    """Moonshot's Kimi checkpoints ship their tokenizer as code (tokenization_kimi), which vLLM
    loads only with --trust-remote-code; a config.json read without its tokenizer_config.json
    (the corpus keeps configs only) had planned a command without the flag (a read)."""
    from planner.hf_config import load_hf_config

    root = Path(__file__).parent / "fixtures" / "hf_configs"
    for name in ("moonshotai--Kimi-K2-Instruct", "moonshotai--Kimi-K2.5"):
        path = root / name / "config.json"
        assert not (path.parent / "tokenizer_config.json").exists()
        assert load_hf_config(path).trust_remote_code
    assert not load_hf_config(root / "deepseek-ai--DeepSeek-V3" / "config.json").trust_remote_code


def test_a_flat_vision_language_config_says_its_tower_is_not_counted(tmp_path):
    """Qwen2-VL keeps its text keys at the top level with vision_config beside them: planned as
    the text model, and now said so (vLLM loads the ~0.68B-parameter tower too)."""
    model = _llama_8b_with(tmp_path, model_type="qwen2_vl", vision_config={"depth": 32, "embed_dim": 1280})
    assert model.text_model_of == "qwen2_vl" and "vision tower not counted" in model.source


def test_compressed_tensors_groups_of_several_formats_are_refused(tmp_path):
    """int8 attention beside int4 MLPs in two config groups had been priced all at the first
    group's width (by the groups' order: a read); one line naming the key instead."""
    groups = {"group_0": {"targets": ["re:.*self_attn.*"], "weights": {"num_bits": 8, "type": "int",
                                                                       "strategy": "channel"}},
              "group_1": {"targets": ["re:.*mlp.*"], "weights": {"num_bits": 4, "type": "int", "group_size": 128}}}
    with pytest.raises(SpecError, match="config_groups: weights of several formats"):
        _llama_8b_with(tmp_path, quantization_config={"quant_method": "compressed-tensors", "config_groups": groups})
    same = {"group_0": groups["group_1"], "group_1": {**groups["group_1"], "targets": ["re:.*self_attn.*"]}}
    model = _llama_8b_with(tmp_path, quantization_config={"quant_method": "compressed-tensors", "config_groups": same})
    assert model.quantization == "int4"
