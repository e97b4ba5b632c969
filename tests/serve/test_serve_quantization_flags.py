"""Which checkpoint the launch command expects: --quantization only when the engine must
quantize a 16-bit checkpoint itself (vLLM refuses a --quantization that contradicts a
pre-quantized checkpoint's own quantization_config)."""

from __future__ import annotations


def _recommended_argv(plan_json, *args):
    code, out = plan_json("--model", *args, "--cluster", "1x8xH100", "--max-model-len", "8192")
    assert code == 0
    return out["recommended"]["command"][-1]["argv"]


def test_prequantized_fp8_spec_emits_no_quantization_flag(plan_json, run_plan):
    argv = _recommended_argv(plan_json, "llama-3.1-70b-fp8")
    assert "--quantization" not in argv
    text = run_plan("--model", "llama-3.1-70b-fp8", "--cluster", "1x8xH100", "--max-model-len", "8192").stdout
    assert "MODEL must be the fp8 checkpoint" in text


def test_fp8_override_of_a_bf16_spec_quantizes_on_the_fly(plan_json):
    """Under the release's name for online fp8: vLLM 0.33.0 deprecates `fp8` for it
    (model_executor/layers/quantization/fp8.py: "use `--quantization fp8_per_tensor`");
    0.22.0 still takes `fp8`; SGLang's is `fp8`."""
    argv = _recommended_argv(plan_json, "llama-3.1-70b", "--quantization", "fp8")
    assert argv[argv.index("--quantization") + 1] == "fp8_per_tensor"
    argv = _recommended_argv(plan_json, "llama-3.1-70b", "--quantization", "fp8", "--engine-version", "vllm=0.22.0")
    assert argv[argv.index("--quantization") + 1] == "fp8"
    argv = _recommended_argv(plan_json, "llama-3.1-70b", "--quantization", "fp8", "--emit", "sglang")
    assert argv[argv.index("--quantization") + 1] == "fp8"


def test_int4_override_needs_an_awq_or_gptq_checkpoint(plan_json, run_plan):
    argv = _recommended_argv(plan_json, "llama-3.1-70b", "--quantization", "int4")
    assert "--quantization" not in argv
    text = run_plan("--model", "llama-3.1-70b", "--quantization", "int4", "--cluster", "1x8xH100",
                    "--max-model-len", "8192").stdout
    assert "cannot quantize to int4 on the fly" in text
