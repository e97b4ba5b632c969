"""`--moe-backend`: the routed experts' kernel a deployment chooses. marlin is vLLM's weight-only
Marlin MoE kernel (KernelConfig.moe_backend, vllm/config/kernel.py at 0.33.0; SGLang 0.5.23's
--moe-runner-backend marlin), priced at its measured rates (catalog serving_moe_kernels
marlin_mxfp4, fitted to AIConfigurator's vLLM 0.24.0 kernel data); auto keeps the engine's pick."""

from __future__ import annotations

import json

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.serving_time import StepLoad, moe_kernel, stage_step_time, with_moe_backend
from planner.errors import SpecError
from planner.layout import Layout, place
from planner.requests import ServeRequest
from planner.serve import estimate
from planner.serve_search import check_moe_backend


def _argv(plan_json, *args):
    code, out = plan_json("--model", "gpt-oss-120b", "--cluster", "1x8xH200", "--max-model-len", "16384", *args)
    assert code == 0
    return out["recommended"]["command"][-1]["argv"]


def test_marlin_is_emitted_for_vllm_and_sglang(plan_json):
    argv = _argv(plan_json, "--moe-backend", "marlin")
    assert argv[argv.index("--moe-backend") + 1] == "marlin"
    argv = _argv(plan_json, "--moe-backend", "marlin", "--engine-version", "vllm=0.22.0")
    assert argv[argv.index("--moe-backend") + 1] == "marlin"
    argv = _argv(plan_json, "--moe-backend", "marlin", "--emit", "sglang")
    assert argv[argv.index("--moe-runner-backend") + 1] == "marlin"
    assert "--moe-backend" not in _argv(plan_json)
    code, out = plan_json("--model", "gpt-oss-120b", "--cluster", "1x8xH200", "--moe-backend", "marlin")
    assert code == 0 and out["moe_backend"] == "marlin"


@pytest.mark.parametrize(("args", "message"), [
    (("--model", "llama-3.1-70b", "--cluster", "1x8xH100"), "--moe-backend marlin: llama-3.1-70b has no routed experts"),
    (("--model", "gpt-oss-120b", "--cluster", "1x8xA100"), "no measured marlin MoE kernel for mxfp4 experts on A100"),
    (("--model", "qwen3-30b-a3b", "--cluster", "1x8xH100"), "no measured marlin MoE kernel for bf16 experts on H100"),
    (("--model", "gpt-oss-120b", "--cluster", "1x8xH100", "--emit", "sglang", "--engine-version",
      "sglang=0.5.10.post1"), "SGLang 0.5.10.post1 has no --moe-runner-backend marlin"),
])
def test_a_backend_the_planner_cannot_price_or_emit_is_refused(run_plan, args, message):
    result = run_plan(*args, "--moe-backend", "marlin")
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_backend_selects_its_measured_kernel():
    """H200's marlin_mxfp4 entry (floor 33.5 us held at the default's, HBM share 1.0, 283
    TFLOP/s, 24 rows at half rate, 3.93 pair passes) replaces the default MXFP4 kernel (33.5 us,
    1.0, 858 TFLOP/s, 70, 3.74); auto leaves the cluster as it is."""
    model, cluster = resolve_model("gpt-oss-120b"), resolve_cluster("1x8xH200")
    assert with_moe_backend(cluster, "auto") is cluster
    default, marlin = moe_kernel(model, cluster), moe_kernel(model, with_moe_backend(cluster, "marlin"))
    assert (default.floor_seconds, default.flops_per_s, default.half_rows, default.pair_passes) == pytest.approx(
        (33.5e-6, 858e12, 70, 3.74))
    assert (marlin.floor_seconds, marlin.flops_per_s, marlin.half_rows, marlin.pair_passes) == pytest.approx(
        (33.5e-6, 283e12, 24, 3.93))
    assert marlin.hbm_bytes_per_s == pytest.approx(cluster.gpu.hbm_bytes_per_s)
    check_moe_backend(model, cluster, "marlin")
    with pytest.raises(SpecError):
        check_moe_backend(model, resolve_cluster("1x8xA100"), "marlin")


def test_marlin_slows_the_prompt_and_barely_the_decode():
    """gpt-oss-120b on one H200: an 8,192-token prompt step's experts run at Marlin's 264 TFLOP/s
    instead of 677, so the step is slower by most of the experts' time; a 16-sequence decode
    step reads the same weights at the same HBM share with the same floor, its padded GEMMs at
    a few rows per expert about as fast (264 / (1 + 22) against 677 / (1 + 54) per row)."""
    model, cluster = resolve_model("gpt-oss-120b"), resolve_cluster("1x1xH200")
    layout = Layout(1, 1, 1)
    request = ServeRequest(input_len=8192, output_len=1024, batch=4, max_model_len=10240)
    auto = estimate(model, cluster, layout, request)
    marlin = estimate(model, cluster, layout, ServeRequest(input_len=8192, output_len=1024, batch=4,
                                                           max_model_len=10240, moe_backend="marlin"))
    placement, stage = place(cluster, layout), auto.stages[0]
    prompt, decode = StepLoad(0, 0, 8192, 8192 ** 2 / 2), StepLoad(16, 16 * 8192)
    marlin_cluster = with_moe_backend(cluster, "marlin")
    slow = stage_step_time(model, marlin_cluster, layout, placement, stage, prompt)
    fast = stage_step_time(model, cluster, layout, placement, stage, prompt)
    assert slow.moe_seconds > 2 * fast.moe_seconds
    assert slow.seconds - fast.seconds == pytest.approx(slow.moe_seconds - fast.moe_seconds, rel=1e-9)
    d_slow = stage_step_time(model, marlin_cluster, layout, placement, stage, decode)
    d_fast = stage_step_time(model, cluster, layout, placement, stage, decode)
    assert 0.95 < d_slow.seconds / d_fast.seconds < 1.1
    assert marlin.ttft_seconds > 1.3 * auto.ttft_seconds
    assert marlin.tpot_seconds >= auto.tpot_seconds


def _b200_argv(plan_json, *args):
    code, out = plan_json("--model", "gpt-oss-120b", "--cluster", "1x8xB200", "--max-model-len", "16384",
                          "--moe-backend", "flashinfer_mxfp8", *args)
    assert code == 0 and out["moe_backend"] == "flashinfer_mxfp8"
    return out["recommended"]["command"][-1]["argv"]


@pytest.mark.parametrize("versions", [(), ("--engine-version", "vllm=0.22.0")])
def test_mxfp8_activations_are_emitted_for_vllm(plan_json, engine_check, versions):
    """vLLM 0.22.0 and 0.33.0: `--moe-backend flashinfer_trtllm` (a KernelConfig.moe_backend
    choice, vllm/config/kernel.py) and `--quantization-config` asking for MXFP8 MoE activations,
    which the MXFP4 oracle resolves to FLASHINFER_TRTLLM_MXFP4_MXFP8; both flags in the release's
    parser."""
    from planner.engines import EngineVersions

    argv = _b200_argv(plan_json, *versions)
    assert argv[argv.index("--moe-backend") + 1] == "flashinfer_trtllm"
    assert json.loads(argv[argv.index("--quantization-config") + 1]) == {"moe": {"activation": "mxfp8"}}
    release = versions[1].split("=")[1] if versions else EngineVersions().vllm
    assert engine_check(argv, EngineVersions(vllm=release)) == []


@pytest.mark.parametrize("sglang", ["0.5.23", "0.5.10.post1"])
def test_mxfp8_activations_are_emitted_for_sglang(plan_json, engine_check, sglang):
    """Both SGLang releases: the flashinfer_mxfp4 runner at its default precision, which quantizes
    the MoE input to MXFP8 (bf16 is the 16-bit alternative)."""
    from planner.engines import EngineVersions

    argv = _b200_argv(plan_json, "--emit", "sglang", "--engine-version", f"sglang={sglang}")
    assert argv[argv.index("--moe-runner-backend") + 1] == "flashinfer_mxfp4"
    assert argv[argv.index("--flashinfer-mxfp4-moe-precision") + 1] == "default"
    assert engine_check(argv, EngineVersions(sglang=sglang)) == []


@pytest.mark.parametrize(("args", "message"), [
    (("--model", "gpt-oss-120b", "--cluster", "1x8xH200"),
     "--moe-backend flashinfer_mxfp8: no measured flashinfer_mxfp8 MoE kernel for mxfp4 experts on H200"),
    (("--model", "qwen3-30b-a3b", "--cluster", "1x8xB200"),
     "no measured flashinfer_mxfp8 MoE kernel for bf16 experts on B200-SXM-180GB (measured there: mxfp4)"),
])
def test_mxfp8_activations_are_refused_where_unmeasured(run_plan, args, message):
    result = run_plan(*args, "--moe-backend", "flashinfer_mxfp8")
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_mxfp8_activations_speed_up_gpt_oss_on_b200():
    """B200's flashinfer_mxfp8_mxfp4 entry (floor 21.3 us, HBM share 1.0, 3,323 TFLOP/s, 125
    rows at half rate, 2.8 pair passes) replaces the 16-bit-activation default (19.6 us, 1.0,
    709 TFLOP/s, 38, 4.0). An 8,192-token prompt on one GPU: 8192*4/128 = 256 rows per expert,
    compute-bound; each layer's pair passes are 8192*4 pairs x 2880 x 2 B = 188.74 MB at 0.55 x
    8 TB/s = 4.4 TB/s, 42.90 us a pass (4.0 and 2.8 of them). The 36 layers' expert time less
    their floors and pair passes shrinks by the rate ratio 3323/709 = 4.69 times the half-rate
    terms (256/381)/(256/294) = 0.772: 3.62x. A 16-sequence decode step: 64 of the 128 experts
    get one row each, where a padded GEMM runs at about rate/half_rows, so the MoE time falls to
    about 0.77 of the default's; SGLang 0.5.14's measurements of the two kernels at this shape and
    16 tokens (the fixture's flashinfer_mxfp8_mxfp4 rows, aiconfigurator-core 0.12.0): 0.155 /
    0.202 ms = 0.77."""
    model, cluster = resolve_model("gpt-oss-120b"), resolve_cluster("1x1xB200")
    fast_cluster = with_moe_backend(cluster, "flashinfer_mxfp8")
    default, mxfp8 = moe_kernel(model, cluster), moe_kernel(model, fast_cluster)
    assert (default.floor_seconds, default.flops_per_s, default.half_rows, default.pair_passes) == pytest.approx(
        (19.6e-6, 709e12, 38, 4.0))
    assert (mxfp8.floor_seconds, mxfp8.flops_per_s, mxfp8.half_rows, mxfp8.pair_passes) == pytest.approx(
        (21.3e-6, 3323e12, 125, 2.8))
    pass_seconds = 8192 * 4 * 2880 * 2 / (0.55 * 8e12)
    assert pass_seconds == pytest.approx(42.90e-6, rel=1e-3)
    layout = Layout(1, 1, 1)
    placement = place(cluster, layout)
    stage = estimate(model, cluster, layout, ServeRequest(input_len=8192, output_len=1024, batch=4,
                                                          max_model_len=10240)).stages[0]
    prompt, decode = StepLoad(0, 0, 8192, 8192 ** 2 / 2), StepLoad(16, 16 * 8192)
    slow = stage_step_time(model, cluster, layout, placement, stage, prompt)
    fast = stage_step_time(model, fast_cluster, layout, placement, stage, prompt)
    layers = model.num_hidden_layers
    ratio = ((slow.moe_seconds - layers * (default.floor_seconds + 4.0 * pass_seconds))
             / (fast.moe_seconds - layers * (mxfp8.floor_seconds + 2.8 * pass_seconds)))
    assert ratio == pytest.approx(3323 / 709 * (256 / 381) / (256 / 294), rel=0.01)
    assert slow.seconds - fast.seconds == pytest.approx(slow.moe_seconds - fast.moe_seconds, rel=1e-9)
    d_slow = stage_step_time(model, cluster, layout, placement, stage, decode)
    d_fast = stage_step_time(model, fast_cluster, layout, placement, stage, decode)
    assert d_fast.moe_seconds / d_slow.moe_seconds == pytest.approx(0.155 / 0.202, abs=0.05)


def test_the_plan_prices_the_other_measured_backends():
    """gpt-oss-120b on 8 B200: the recommended layout re-estimated under marlin and
    flashinfer_mxfp8 (both measured there for MXFP4 experts), each exactly what estimating that
    layout under that backend gives; on H200 only marlin; under --moe-backend marlin the
    default (auto) is the option; a dense model has none."""
    from dataclasses import replace

    from planner.serve_search import plan_serving

    model = resolve_model("gpt-oss-120b")
    request = ServeRequest(input_len=1024, output_len=1024)
    plan = plan_serving(model, resolve_cluster("1x8xB200"), request)
    assert [o.value for o in plan.moe_backend_options] == ["marlin", "flashinfer_mxfp8"]
    for option in plan.moe_backend_options:
        again = estimate(model, resolve_cluster("1x8xB200"), plan.recommended.layout,
                         replace(request, moe_backend=option.value))
        assert (option.estimate.layout, option.estimate.tpot_seconds, option.estimate.ttft_seconds) == (
            plan.recommended.layout, again.tpot_seconds, again.ttft_seconds)
    fast = plan.moe_backend_options[1].estimate
    assert fast.ttft_seconds < plan.recommended.ttft_seconds
    assert [o.value for o in plan_serving(model, resolve_cluster("1x8xH200"), request).moe_backend_options] == [
        "marlin"]
    marlin = plan_serving(model, resolve_cluster("1x8xH200"), replace(request, moe_backend="marlin"))
    assert [o.value for o in marlin.moe_backend_options] == ["auto"]
    assert plan_serving(resolve_model("llama-3.1-8b"), resolve_cluster("1x8xB200"), request).moe_backend_options == ()


def test_the_options_are_printed_and_in_the_json(plan_json, run_plan):
    code, out = plan_json("--model", "gpt-oss-120b", "--cluster", "1x8xB200", "--input-len", "1024")
    assert code == 0
    assert [o["moe_backend"] for o in out["moe_backend_options"]] == ["marlin", "flashinfer_mxfp8"]
    assert all(o["ttft_seconds"] > 0 and o["tpot_seconds"] > 0 for o in out["moe_backend_options"])
    text = run_plan("--model", "gpt-oss-120b", "--cluster", "1x8xB200", "--input-len", "1024").stdout
    assert "MoE kernel: --moe-backend flashinfer_mxfp8 (FlashInfer's MXFP4 kernel on MXFP8-quantized" in text
    code, out = plan_json("--model", "llama-3.1-8b", "--cluster", "1x1xH100")
    assert code == 0 and out["moe_backend_options"] == []


def test_the_backend_lists_agree():
    from typing import get_args, get_type_hints

    from planner.cli import MoeBackend
    from planner.requests import MOE_BACKENDS

    literal = set(get_args(get_type_hints(ServeRequest)["moe_backend"]))
    assert set(MOE_BACKENDS) == literal == {m.value for m in MoeBackend}
