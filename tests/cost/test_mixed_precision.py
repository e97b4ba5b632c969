"""Per-module mixed-precision checkpoints (ModelOpt MIXED_PRECISION): weight bytes by module
kind, the import of the four corpus checkpoints, and the maps it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.params import (
    bytes_per_weight,
    layer_weight_bytes_per_gpu,
    lm_head_bytes_per_weight,
    matmul_formats_by_kind,
    param_counts,
    weight_bytes,
)
from planner.cost.serving_time import matmul_precision
from planner.hf_mixed_precision import mixed_precision_fields
from planner.model_summary import model_summary
from planner.render.catalog import describe_model
from planner.specs import ModelSpec, SpecError

CORPUS = Path(__file__).parent.parent / "fixtures" / "hf_configs"
QWEN36_35B = CORPUS / "nvidia--Qwen3.6-35B-A3B-NVFP4"


@pytest.fixture(scope="module")
def qwen36_35b() -> ModelSpec:
    return resolve_model(str(QWEN36_35B))


def test_qwen36_35b_weight_bytes_by_module_kind(qwen36_35b: ModelSpec) -> None:
    """Qwen3.6-35B-A3B NVFP4: h 2048, 40 layers (10 gated attention, 30 Gated DeltaNet),
    256 experts and one shared expert of 512, V 248,320, untied head; quantized_layers: experts,
    shared expert and lm_head W4A16_NVFP4 (0.5 + 1/16 = 0.5625 B), attention and linear_attn
    FP8 (1 + 4/2048 = 1.001953125 B).

    attention 2*2048*4096 + 2*2048*512 + 4096*2048 = 27,262,976, x10 = 272,629,760;
    Gated DeltaNet (C = 8192) 2048*8192 + 2048*4096 + 2*2048*32 + 4096*2048 = 33,685,504,
    x30 = 1,010,565,120; mixers 1,283,194,880 * 1.001953125 = 1,285,701,120 B.
    routed 256*3*2048*512*40 = 32,212,254,720 * 0.5625 = 18,119,393,280 B.
    shared 3*2048*512*40 = 125,829,120 * 0.5625 = 70,778,880 B.
    lm_head 248,320*2048 = 508,559,360 * 0.5625 = 286,064,640 B.
    bf16: embedding 508,559,360 + router 2048*256*40 = 20,971,520 + DeltaNet conv/dt/A/norm
    32,960*30 = 988,800 + norms 4096*40 + 2048 = 165,888; 530,685,568 * 2 = 1,061,371,136 B.
    Total 20,823,309,056 B (bf16 would be 69,321,047,296 B)."""
    model = qwen36_35b
    assert (model.quantization, model.quantization_scope, model.secondary_quantization,
            model.lm_head_quantization) == ("nvfp4", "mlp", "fp8", "nvfp4")
    assert matmul_formats_by_kind(model) == ("fp8", "nvfp4", "nvfp4")
    assert bytes_per_weight(model, "fp8") == 1.001953125
    assert lm_head_bytes_per_weight(model) == 0.5625
    assert param_counts(model).total == 34_660_523_648
    assert weight_bytes(model) == pytest.approx(
        1_285_701_120 + 18_119_393_280 + 70_778_880 + 286_064_640 + 1_061_371_136)
    assert weight_bytes(model) == pytest.approx(20_823_309_056)


def test_whole_model_bytes_equal_the_per_gpu_layers_plus_embedding_and_head(qwen36_35b: ModelSpec) -> None:
    """One home for per-kind bytes: L * layer bytes (t = 1) + embedding and final norm in bf16
    + the head in its format = weight_bytes."""
    model, counts = qwen36_35b, param_counts(qwen36_35b)
    assembled = (model.num_hidden_layers * layer_weight_bytes_per_gpu(model, 1)
                 + (counts.embedding + counts.final_norm) * 2 + counts.lm_head * 0.5625)
    assert assembled == pytest.approx(weight_bytes(model))


def test_weight_only_nvfp4_beside_fp8_runs_the_activation_dtypes_gemms(qwen36_35b: ModelSpec) -> None:
    """W4A16_NVFP4 dequantises into bf16 GEMMs: the planner's one GEMM precision stays bf16
    (the FP8 mixers' W8A8 GEMMs are counted at bf16, a conservative compute time)."""
    for cluster in ("1x8xH100", "1x8xB200"):
        assert matmul_precision(qwen36_35b, resolve_cluster(cluster)) == "bf16"


def test_mxfp8_is_8_bits_and_an_e8m0_scale_per_32(qwen36_35b: ModelSpec) -> None:
    assert bytes_per_weight(qwen36_35b, "mxfp8") == 1 + 1 / 32


FOUR = {
    "nvidia--Qwen3.6-35B-A3B-NVFP4": ("nvfp4", "mlp", "fp8", "nvfp4"),
    "nvidia--Qwen3.6-27B-NVFP4": ("nvfp4", "mlp", "fp8", "nvfp4"),
    # The corpus copies of these two maps are cut to their first entries (fixtures README.md):
    # as read, a kind is quantized in a few layers only.
    "nvidia--MiniMax-M3-NVFP4": "attention MXFP8 in 3 of 60 layers, unquantized in the rest",
    "nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4":
        "recurrent projections FP8 in 1 of 23 layers, unquantized in the rest",
}


@pytest.mark.parametrize("folder", sorted(FOUR))
def test_each_mixed_checkpoint_plans_with_its_formats_or_is_refused_in_one_line(folder: str) -> None:
    expected = FOUR[folder]
    if isinstance(expected, str):
        with pytest.raises(SpecError) as refused:
            resolve_model(str(CORPUS / folder))
        assert "\n" not in str(refused.value) and expected in str(refused.value)
        assert "not modelled" in str(refused.value)
        return
    model = resolve_model(str(CORPUS / folder))
    assert (model.quantization, model.quantization_scope, model.secondary_quantization,
            model.lm_head_quantization) == expected
    assert weight_bytes(model) < weight_bytes(model.model_copy(update={"secondary_quantization": None}))


def layers_map(model: ModelSpec, **algos: str) -> dict[str, dict[str, str]]:
    """A quantized_layers map of every layer: keys attention, linear_attn, experts, shared."""
    names = {"attention": "self_attn.q_proj", "linear_attn": "linear_attn.out_proj",
             "experts": "mlp.experts", "shared": "mlp.shared_expert.up_proj"}
    full = model.num_hidden_layers - model.num_recurrent_layers
    layers = {}
    for i in range(model.num_hidden_layers):
        for key, algo in algos.items():
            mixer = key in ("attention", "linear_attn")
            if mixer and (key == "attention") != (i % 4 == 3):  # Qwen3.5: every 4th attention
                continue
            layers[f"model.layers.{i}.{names[key]}"] = {"quant_algo": algo}
    assert full == 10
    return layers


def test_routed_experts_apart_from_the_rest_fit_the_experts_scope(qwen36_35b: ModelSpec) -> None:
    layers = layers_map(qwen36_35b, attention="FP8", linear_attn="FP8", experts="NVFP4", shared="FP8")
    fields = mixed_precision_fields(qwen36_35b, (layers, "x"))
    assert (fields["quantization"], fields["quantization_scope"], fields["secondary_quantization"]) == (
        "nvfp4", "experts", "fp8")


@pytest.mark.parametrize(("algos", "why"), [
    ({"attention": "FP8", "linear_attn": "NVFP4", "experts": "NVFP4", "shared": "NVFP4"},
     "a block's mixers in two formats"),
    ({"attention": "FP8", "linear_attn": "FP8", "experts": "NVFP4", "shared": "MXFP8"},
     "formats other than one over a scope"),
    ({"attention": "W4A16_NVFP4", "linear_attn": "W4A16_NVFP4", "experts": "FP8", "shared": "W4A16_NVFP4"},
     "FP8 GEMMs beside weight-only"),
    ({"attention": "INT4_AWQ", "linear_attn": "FP8", "experts": "NVFP4", "shared": "NVFP4"},
     "unsupported ModelOpt algorithm 'INT4_AWQ'"),
])
def test_maps_that_do_not_fit_are_refused_in_one_line(qwen36_35b: ModelSpec, algos: dict[str, str],
                                                      why: str) -> None:
    with pytest.raises(SpecError, match=why) as refused:
        mixed_precision_fields(qwen36_35b, (layers_map(qwen36_35b, **algos), "x"))
    assert "\n" not in str(refused.value)


def test_secondary_quantization_needs_a_scope_that_leaves_matmuls_out(qwen36_35b: ModelSpec) -> None:
    fields = qwen36_35b.model_dump()
    fields.update(quantization_scope="all")
    with pytest.raises(ValueError, match="secondary_quantization"):
        ModelSpec(**fields)


def test_the_summary_names_every_weight_format(qwen36_35b: ModelSpec) -> None:
    summary = model_summary(qwen36_35b)
    assert (summary.weight_dtype, summary.secondary_weight_dtype, summary.lm_head_weight_dtype) == (
        "nvfp4", "fp8", "nvfp4")
    assert "nvfp4 mlp + fp8 other weights (nvfp4 LM head)" in describe_model(qwen36_35b)


def test_grouped_int8_counts_its_scales_and_zero_points():
    """GPTQ 8-bit in groups of 128: an fp16 scale and an 8-bit zero per group, 1 + 3/128 =
    1.0234375 B a weight (it had been priced 1 + 4/h, per channel: Qwen2.5-72B-GPTQ-Int8 75.5 GB
    against about 77.1: a read); without zero points 1 + 2/128; per channel (group = h, what the
    HF import gives a channel-wise compressed-tensors W8A8) 1 + 4/h."""
    from planner.catalog import resolve_model

    model = resolve_model("llama-3.1-8b")
    grouped = model.model_copy(update={"quantization": "int8", "quantization_group_size": 128})
    assert bytes_per_weight(grouped, "int8") == 1 + 3 / 128
    symmetric = grouped.model_copy(update={"quantization_zero_point": False})
    assert bytes_per_weight(symmetric, "int8") == 1 + 2 / 128
    channel = grouped.model_copy(update={"quantization_group_size": 4096})
    assert bytes_per_weight(channel, "int8") == 1 + 4 / 4096
