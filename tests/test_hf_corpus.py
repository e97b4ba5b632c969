"""Every real config.json in tests/fixtures/hf_configs either imports with the parameter
count an independent counter gets from the same file (within 2%) and the checkpoint's
weight format, or is refused in one line naming what the cost model does not describe.

The independent counter walks the layers one by one as the Hugging Face modeling code
builds them (transformers models/<family>/modeling_<family>.py: LlamaDecoderLayer,
MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock, DeepseekV3Attention / DeepseekV3MoE /
DeepseekV3MLP, Llama4TextMoe / Llama4TextMLP, GptOssMLP; hybrids: NemotronHBlock with
NemotronHMamba2Mixer / NemotronHMoE, Qwen3_5DecoderLayer with Qwen3_5GatedDeltaNet;
Gemma4TextDecoderLayer with Gemma4TextAttention, Gemma4TextRouter and Gemma4TextExperts;
DeciLMDecoderLayer from Nemotron-NAS block_configs; MiMoV2Attention from vLLM's
mimo_v2_flash.py), not through ModelSpec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from planner.cost.params import param_counts
from planner.hf_config import load_hf_config
from planner.specs import SpecError

CORPUS = Path(__file__).parent / "fixtures" / "hf_configs"
FOLDERS = sorted(path.parent for path in CORPUS.glob("*/config.json"))

PLANNED = 80
"""Folders that import (the rest are refused); a change in this number is a change in
coverage, to be made on purpose."""


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    return raw["text_config"] if "hidden_size" not in raw and "text_config" in raw else raw


def is_moe_layer(c: dict[str, Any], i: int) -> bool:
    """Which decoder layers hold a sparse MoE block, per family."""
    experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")
    if not experts:
        return False
    freq = c.get("moe_layer_freq")
    if isinstance(freq, list):  # MiniMax-M3, MiMo-V2: one flag per layer
        return bool(freq[i])
    if c.get("model_type") == "llama4_text":  # Llama4TextDecoderLayer: layer_idx in moe_layers
        return (i + 1) % c.get("interleave_moe_layer_step", 1) == 0
    if "decoder_sparse_step" in c:  # Qwen3MoeDecoderLayer
        return i not in (c.get("mlp_only_layers") or []) and (i + 1) % c["decoder_sparse_step"] == 0
    return i >= (c.get("first_k_dense_replace") or 0) and i % (freq or 1) == 0  # DeepseekV3


def attention(c: dict[str, Any]) -> int:
    h, a = c["hidden_size"], c["num_attention_heads"]
    if c.get("kv_lora_rank"):  # DeepseekV3Attention
        r_q, r_kv = c.get("q_lora_rank"), c["kv_lora_rank"]
        nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        q = (h * r_q + r_q + r_q * a * (nope + rope)) if r_q else h * a * (nope + rope)
        kv = h * (r_kv + rope) + r_kv + r_kv * a * (nope + v)
        n_i, d_i = c.get("index_n_heads") or 0, c.get("index_head_dim") or 0
        indexer = r_q * n_i * d_i + h * d_i + 2 * d_i + h * n_i if n_i else 0  # DSA Indexer
        return q + kv + a * v * h + indexer
    k, d = c.get("num_key_value_heads") or a, c.get("head_dim") or h // a
    bias = (a * d + 2 * k * d + h) if c.get("attention_bias") else 0
    return 2 * h * a * d + 2 * h * k * d + bias


def mimo_v2_attention(c: dict[str, Any], i: int) -> int:
    """MiMoV2Attention (vllm/model_executor/models/mimo_v2_flash.py): hybrid_layer_pattern 1 =
    a sliding-window layer with the swa_* heads and dims, 0 = full attention; q_proj h*a*d,
    k_proj h*k*d, v_proj h*k*d_v, o_proj a*d_v*h; a window layer with
    add_swa_attention_sink_bias adds one sink logit per query head."""
    prefix = "swa_" if c["hybrid_layer_pattern"][i] == 1 else ""
    h, a = c["hidden_size"], c[prefix + "num_attention_heads"]
    k, d, d_v = c[prefix + "num_key_value_heads"], c[prefix + "head_dim"], c[prefix + "v_head_dim"]
    sinks = a if c.get(f"add_{'swa' if prefix else 'full'}_attention_sink_bias") else 0
    return h * a * d + h * k * d + h * k * d_v + a * d_v * h + sinks


def ffn(c: dict[str, Any], size: int) -> int:
    activation = c.get("hidden_act") or c.get("hidden_activation") or "silu"
    return (2 if activation == "relu2" else 3) * c["hidden_size"] * size


def mlp(c: dict[str, Any], i: int) -> int:
    h = c["hidden_size"]
    llama4 = c.get("model_type") == "llama4_text"
    if not is_moe_layer(c, i):
        size = c.get("intermediate_size_mlp") if llama4 else None
        return ffn(c, size or c.get("dense_intermediate_size") or c["intermediate_size"])
    experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts")
    expert_size = c["intermediate_size"] if llama4 else c.get("moe_intermediate_size") or c["intermediate_size"]
    shared_size = (c.get("shared_expert_intermediate_size") or c.get("share_expert_dim")
                   or c.get("shared_intermediate_size") or expert_size)
    num_shared = 1 if llama4 else (c.get("n_shared_experts") or c.get("num_shared_experts") or 0)
    if c.get("shared_expert_intermediate_size") == 0:
        num_shared = 0
    return experts * ffn(c, expert_size) + num_shared * ffn(c, shared_size) + h * experts


def mamba2_mixer(c: dict[str, Any]) -> int:
    """NemotronHMamba2Mixer: in_proj, conv1d (+ bias), dt_bias, A_log, D, gated norm, out_proj."""
    h, heads = c["hidden_size"], c["mamba_num_heads"]
    inner = heads * c["mamba_head_dim"]
    conv_dim = inner + 2 * c["n_groups"] * c["ssm_state_size"]
    in_proj = h * (inner + conv_dim + heads)
    conv = conv_dim * c["conv_kernel"] + (conv_dim if c.get("use_conv_bias", True) else 0)
    return in_proj + conv + heads + heads + heads + inner + inner * h


def nemotron_h_moe(c: dict[str, Any]) -> int:
    """NemotronHMoE: router, non-gated experts (in the latent width when moe_latent_size),
    the shared expert at h, the latent projections."""
    h, experts, latent = c["hidden_size"], c["n_routed_experts"], c.get("moe_latent_size")
    width = latent or h
    routed = experts * 2 * width * c["moe_intermediate_size"]
    shared = 2 * h * c["moe_shared_expert_intermediate_size"]
    return h * experts + routed + shared + (2 * h * latent if latent else 0)


def nemotron_h_layers(c: dict[str, Any]) -> int:
    """NemotronHBlock: one RMSNorm and one mixer per block."""
    h = c["hidden_size"]
    pattern = c.get("hybrid_override_pattern")
    kinds = ([{"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}[ch] for ch in pattern]
             if pattern else c["layers_block_type"])
    a, k = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or c.get("attention_head_dim") or h // a
    mixers = {"mamba": mamba2_mixer(c), "attention": 2 * h * a * d + 2 * h * k * d,
              "mlp": 2 * h * c["intermediate_size"], "moe": nemotron_h_moe(c) if "moe" in kinds else 0}
    return sum(h + mixers[kind] for kind in kinds)


def gated_deltanet(c: dict[str, Any]) -> int:
    """Qwen3_5GatedDeltaNet: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d (no bias),
    dt_bias, A_log, gated norm (d_v), out_proj."""
    h = c["hidden_size"]
    key_dim = c["linear_num_key_heads"] * c["linear_key_head_dim"]
    value_dim = c["linear_num_value_heads"] * c["linear_value_head_dim"]
    conv_dim = 2 * key_dim + value_dim
    heads = c["linear_num_value_heads"]
    return (h * conv_dim + h * value_dim + 2 * h * heads + conv_dim * c["linear_conv_kernel_dim"]
            + 2 * heads + c["linear_value_head_dim"] + value_dim * h)


def qwen3_5_layer(c: dict[str, Any], i: int) -> int:
    """Qwen3_5DecoderLayer: Gated DeltaNet or gated attention (q_proj 2x for the output gate),
    then the MLP (Qwen3.5-MoE: experts + one shared expert with its h -> 1 gate)."""
    h, a, k, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    if c["layer_types"][i] == "linear_attention":
        mixer = gated_deltanet(c)
    else:
        mixer = (2 if c.get("attn_output_gate") else 1) * h * a * d + 2 * h * k * d + a * d * h
    if c.get("num_experts"):
        ffn_all = (c["num_experts"] * 3 * h * c["moe_intermediate_size"] + h * c["num_experts"]
                   + 3 * h * c["shared_expert_intermediate_size"])
    else:
        ffn_all = 3 * h * c["intermediate_size"]
    return mixer + ffn_all + 2 * h


def gemma4_layer(c: dict[str, Any], i: int) -> int:
    """Gemma4TextDecoderLayer: attention with the layer kind's head dim and KV heads (full
    layers: global_head_dim; with attention_k_eq_v num_global_key_value_heads and no v_proj),
    q_norm and k_norm (d each; v_norm has no weight), four RMSNorms, the dense MLP; with
    enable_moe_block the router (proj h*E, scale h, per_expert_scale E), the experts
    (gate_up_proj 2*f_e*h, down_proj h*f_e each) and three more RMSNorms; with
    hidden_size_per_layer_input p the per-layer gate h*p, projection p*h and their norm."""
    h, a = c["hidden_size"], c["num_attention_heads"]
    sliding = c["layer_types"][i] == "sliding_attention"
    d = c["head_dim"] if sliding or not c.get("global_head_dim") else c["global_head_dim"]
    k_eq_v = bool(c.get("attention_k_eq_v")) and not sliding
    k = c["num_global_key_value_heads"] if k_eq_v else c["num_key_value_heads"]
    attention = h * a * d + (1 if k_eq_v else 2) * h * k * d + a * d * h + 2 * d
    layer = attention + 4 * h + 3 * h * c["intermediate_size"]
    if c.get("enable_moe_block"):
        experts = c["num_experts"]
        layer += h * experts + h + experts + experts * 3 * h * c["moe_intermediate_size"] + 3 * h
    per_layer = c.get("hidden_size_per_layer_input") or 0
    return layer + (2 * h * per_layer + h if per_layer else 0)


def decilm_layer(c: dict[str, Any], block: dict[str, Any]) -> int:
    """DeciLMDecoderLayer (modeling_decilm.py): unless attention.no_op, input_layernorm and
    LlamaAttention with num_attention_heads / n_heads_in_group KV heads; then
    post_attention_layernorm and a gated MLP of int(2 * ffn_mult * h / 3) rounded up to a
    multiple of 256 (_ffn_mult_to_intermediate_size)."""
    h, a = c["hidden_size"], c["num_attention_heads"]
    d = h // a
    layer = 0
    if not block["attention"]["no_op"]:
        k = a // block["attention"]["n_heads_in_group"]
        layer += h + 2 * h * a * d + 2 * h * k * d
    width = int(2 * block["ffn"]["ffn_mult"] * h / 3)
    width += (256 - width % 256) % 256
    return layer + h + 3 * h * width


def independent_total(raw: dict[str, Any]) -> int:
    c = text_config(raw)
    h, vocab = c["hidden_size"], c["vocab_size"]
    tied = c.get("tie_word_embeddings", raw.get("tie_word_embeddings", False))
    if c.get("block_configs"):
        layers = sum(decilm_layer(c, block) for block in c["block_configs"])
    elif c.get("model_type") == "nemotron_h":
        layers = nemotron_h_layers(c)
    elif c.get("model_type") == "gemma4_text":
        layers = sum(gemma4_layer(c, i) for i in range(c["num_hidden_layers"]))
    elif "linear_attention" in (c.get("layer_types") or []):
        layers = sum(qwen3_5_layer(c, i) for i in range(c["num_hidden_layers"]))
    elif c.get("hybrid_layer_pattern"):
        layers = sum(mimo_v2_attention(c, i) + mlp(c, i) + 2 * h for i in range(c["num_hidden_layers"]))
    else:
        layers = sum(attention(c) + mlp(c, i) + 2 * h for i in range(c["num_hidden_layers"]))
    return layers + vocab * h * (1 if tied else 2) + h


def mixed_formats(layers: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """A MIXED_PRECISION map's (MLP format, other block matmuls' format when it differs, LM
    head format), read off the module names (W4A16_NVFP4 stores NVFP4 weights)."""
    def formats(keep: Any) -> set[str]:
        return {spec["quant_algo"].lower().removeprefix("w4a16_") for name, spec in layers.items()
                if keep(name) and not name.startswith("mtp")}
    head = formats(lambda name: name == "lm_head")
    mlp = formats(lambda name: ".mlp." in name or name.endswith(".experts"))
    rest = formats(lambda name: name != "lm_head" and ".mlp." not in name and not name.endswith(".experts"))
    assert len(mlp) == 1 and len(rest) <= 1 and len(head) <= 1, (mlp, rest, head)
    main = mlp.pop()
    secondary = rest.pop() if rest else None
    return main, secondary if secondary != main else None, head.pop() if head else None


def expected_format(folder: Path, raw: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """The weight formats the checkpoint declares: (main, secondary, LM head); None = the
    dtype. A MIXED_PRECISION map is read from hf_quant_config.json (ModelOpt's own record:
    the copies in the corpus's config.json files are cut, README.md)."""
    quant = raw.get("quantization_config") or text_config(raw).get("quantization_config")
    sidecar = folder / "hf_quant_config.json"
    if sidecar.is_file() and (quant is None or quant.get("quant_algo") == "MIXED_PRECISION"):
        quant = json.loads(sidecar.read_text())["quantization"]
    if quant is None:
        return None, None, None
    if quant.get("quant_algo") == "MIXED_PRECISION":
        return mixed_formats(quant["quantized_layers"])
    return expected_single_format(quant), None, None


def expected_single_format(quant: dict[str, Any]) -> str | None:
    algo = quant.get("quant_algo")
    if algo:
        return algo.lower()
    groups = quant.get("config_groups") or {}
    bits = {g["weights"]["num_bits"] for g in groups.values()}
    return {"fp8": "fp8", "mxfp4": "mxfp4"}.get(quant.get("quant_method"), f"int{min(bits)}" if bits else None)


def test_the_corpus_is_all_there() -> None:
    assert len(FOLDERS) == 89
    assert sum((folder / "hf_quant_config.json").is_file() for folder in FOLDERS) == 28


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda folder: folder.name)
def test_each_config_plans_right_or_is_refused_in_one_line(folder: Path) -> None:
    raw = json.loads((folder / "config.json").read_text())
    try:
        model = load_hf_config(folder / "config.json")
    except SpecError as exc:
        message = str(exc)
        assert "\n" not in message
        assert "not modelled" in message or "unsupported" in message, message
        return
    expected = independent_total(raw)
    assert param_counts(model).total == pytest.approx(expected, rel=0.02)
    formats = (model.quantization, model.secondary_quantization, model.lm_head_quantization)
    assert formats == expected_format(folder, raw)


def test_how_many_plan() -> None:
    planned = 0
    for folder in FOLDERS:
        try:
            load_hf_config(folder / "config.json")
            planned += 1
        except SpecError:
            pass
    assert planned == PLANNED
