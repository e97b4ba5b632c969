"""int8 checkpoints: compressed-tensors W8A8 (8-bit integer weights and GEMM inputs) runs its block
matmuls on the int8 tensor cores (vLLM's CompressedTensorsW8A8Int8, cutlass_scaled_mm); GPTQ 8-bit
is weight-only and dequantizes into the dtype's GEMMs (serving_time.matmul_precision)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.serving_time import (
    achievable_flops_per_s,
    activation_quant_bytes_per_token,
    matmul_precision,
)
from planner.errors import SpecError
from planner.hf_config import load_hf_config as load_model

LLAMA_8B = Path(__file__).resolve().parent.parent / "fixtures" / "hf_configs" / "meta-llama--Meta-Llama-3.1-8B" / "config.json"


def _w8a8(input_activations: dict | None) -> dict:
    group = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel",
                                                "symmetric": True}}
    if input_activations is not None:
        group["input_activations"] = input_activations
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"group_0": group},
            "ignore": ["lm_head"]}


def _write(tmp_path: Path, quantization_config: dict) -> Path:
    config = json.loads(LLAMA_8B.read_text())
    config["quantization_config"] = quantization_config
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_the_import_tells_w8a8_from_weight_only(tmp_path: Path) -> None:
    w8a8 = load_model(_write(tmp_path, _w8a8({"num_bits": 8, "type": "int", "strategy": "token",
                                                   "dynamic": True, "symmetric": True})))
    assert w8a8.quantization == "int8" and w8a8.int8_activations
    weight_only = load_model(_write(tmp_path, _w8a8(None)))
    assert weight_only.quantization == "int8" and not weight_only.int8_activations
    gptq = load_model(_write(tmp_path, {"quant_method": "gptq", "bits": 8, "group_size": 128}))
    assert gptq.quantization == "int8" and not gptq.int8_activations


def test_w8a8_gemms_run_at_the_int8_rate() -> None:
    """H100: int8 and fp8 share one tensor-core peak (1,979), so int8 GEMMs run at the measured fp8
    kernels' 1,025 TFLOP/s (0.75 of the peak, 1,484, had priced them 45% above fp8's: a review);
    A100 has no fp8: 0.75 of its 624 int8 TOPS = 468, beside bf16's measured 271. The weight-only
    checkpoint stays at bf16's 794 on H100. Each GEMM input is quantized on the way in: read 2 +
    write 1 B an element over 2h + (a*d + f)/t elements, Llama-3.1-8B at t = 1:
    3 * (2*4096 + 4096 + 14336) = 79,872 B a token and layer."""
    model = resolve_model("llama-3.1-8b")
    w8a8 = model.model_copy(update={"quantization": "int8", "int8_activations": True})
    weight_only = model.model_copy(update={"quantization": "int8"})
    fp8 = model.model_copy(update={"quantization": "fp8"})
    h100, a100 = resolve_cluster("1x8xH100"), resolve_cluster("1x8xA100")
    assert matmul_precision(w8a8, h100) == "int8" and matmul_precision(weight_only, h100) == "bf16"
    assert achievable_flops_per_s(w8a8, h100) == achievable_flops_per_s(fp8, h100) == pytest.approx(1025e12)
    assert achievable_flops_per_s(w8a8, a100) == pytest.approx(0.75 * 624e12)
    assert achievable_flops_per_s(weight_only, h100) == pytest.approx(794e12)
    assert activation_quant_bytes_per_token(w8a8, 1, "int8") == 3 * (2 * 4096 + 4096 + 14336)


def test_int8_inputs_need_int8_weights() -> None:
    model = resolve_model("llama-3.1-8b")
    with pytest.raises((SpecError, ValueError), match="int8_activations"):
        type(model)(**{**model.model_dump(), "quantization": "fp8", "int8_activations": True})
