"""Import a Hugging Face `config.json` as a ModelSpec (field names map one to one).

Read: the Llama-family shape keys, `torch_dtype` (or `dtype`), `head_dim`,
`tie_word_embeddings`, `rope_theta` (for the Megatron-LM command), MoE keys (`num_local_experts`, `num_experts_per_tok`,
`moe_intermediate_size`, `n_shared_experts`), and `quantization_config`
(fp8; AWQ/GPTQ/compressed-tensors bits -> int4/int8). Everything else in the
file (tokenizer ids, rope scaling, ...) does not affect the plan and is ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planner.specs import ModelSpec, SpecError, validate

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
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "attention_bias",
    "mlp_bias",
    "rope_theta",
)
GATED_ACTIVATIONS = {"silu", "swiglu", "swish", "gelu_pytorch_tanh_gated", "geglu"}
QKV_BIAS_MODEL_TYPES = {"qwen2", "qwen2_moe"}
DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "half": "float16"}


def load_hf_config(path: Path) -> ModelSpec:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read: {exc.__class__.__name__}") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: line {exc.lineno}: malformed JSON: {exc.msg}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: (top level): expected a JSON object")
    return validate(ModelSpec, spec_fields_from_hf(raw, path), str(path))


def spec_fields_from_hf(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    fields: dict[str, Any] = {key: raw[key] for key in SHAPE_KEYS if raw.get(key) is not None}
    fields.setdefault("tie_word_embeddings", False)
    name = raw.get("_name_or_path") or (path.parent.name if path.parent.name else path.stem)
    fields["name"] = str(name).rstrip("/").split("/")[-1] or "hf-model"
    fields["source"] = f"Hugging Face config.json ({path})"
    fields["gated_mlp"] = str(raw.get("hidden_act", "silu")).lower() in GATED_ACTIVATIONS
    fields["qkv_bias"] = raw.get("model_type") in QKV_BIAS_MODEL_TYPES
    if raw.get("n_shared_experts") is not None:
        fields["num_shared_experts"] = raw["n_shared_experts"]
    dtype = raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"
    if dtype not in DTYPES:
        raise SpecError(f"{path}: torch_dtype: unsupported dtype {dtype!r}")
    fields["dtype"] = DTYPES[dtype]
    quantization = raw.get("quantization_config")
    if quantization is not None:
        fields.update(_quantization_fields(quantization, path, fields.get("hidden_size")))
    return fields


def _quantization_fields(config: Any, path: Path, hidden_size: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise SpecError(f"{path}: quantization_config: expected an object")
    method = str(config.get("quant_method", "")).lower()
    if method in {"fp8", "fbgemm_fp8"}:  # fbgemm_fp8: Meta's own FP8 checkpoints
        return {"quantization": "fp8"}
    bits = config.get("bits") or config.get("w_bit") or _compressed_tensors_bits(config)
    if method in {"awq", "gptq", "compressed-tensors"} and bits in (4, 8):
        group = config.get("group_size") or config.get("q_group_size") or 128
        if isinstance(group, bool) or not isinstance(group, int):
            raise SpecError(
                f"{path}: quantization_config.group_size: expected an integer (got {group!r})"
            )
        if group < 1:  # GPTQ's -1: one scale per output channel, i.e. per row of ~h weights
            group = hidden_size
        kind = "int4" if bits == 4 else "int8"
        return {"quantization": kind, "quantization_group_size": group}
    if method == "compressed-tensors" and _compressed_tensors_is_fp8(config):
        return {"quantization": "fp8"}
    raise SpecError(
        f"{path}: quantization_config: unsupported quant_method {method!r} "
        f"(supported: fp8, awq/gptq 4- or 8-bit, compressed-tensors)"
    )


def _compressed_tensors_bits(config: dict[str, Any]) -> int | None:
    for group in (config.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        if weights.get("type") == "int":
            return weights.get("num_bits")
    return None


def _compressed_tensors_is_fp8(config: dict[str, Any]) -> bool:
    for group in (config.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        if weights.get("type") == "float" and weights.get("num_bits") == 8:
            return True
    return False
