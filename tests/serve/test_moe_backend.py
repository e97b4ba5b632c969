"""`--moe-backend`: the routed experts' kernel a deployment chooses. marlin is vLLM's weight-only
Marlin MoE kernel (KernelConfig.moe_backend, vllm/config/kernel.py at 0.33.0; SGLang 0.5.23's
--moe-runner-backend marlin), priced at its measured rates (catalog serving_moe_kernels
marlin_mxfp4, fitted to AIConfigurator's vLLM 0.24.0 kernel data); auto keeps the engine's pick."""

from __future__ import annotations

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
    """H200's marlin_mxfp4 entry (floor 34.0 us held at the default's, HBM share 1.0, 264
    TFLOP/s, 22 rows at half rate) replaces the default MXFP4 kernel (34.0 us, 1.0, 677 TFLOP/s,
    54); auto leaves the cluster as it is."""
    model, cluster = resolve_model("gpt-oss-120b"), resolve_cluster("1x8xH200")
    assert with_moe_backend(cluster, "auto") is cluster
    default, marlin = moe_kernel(model, cluster), moe_kernel(model, with_moe_backend(cluster, "marlin"))
    assert (default.floor_seconds, default.flops_per_s, default.half_rows) == pytest.approx((34.0e-6, 677e12, 54))
    assert (marlin.floor_seconds, marlin.flops_per_s, marlin.half_rows) == pytest.approx((34.0e-6, 264e12, 22))
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
