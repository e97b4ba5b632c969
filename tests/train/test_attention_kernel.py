"""--attention-kernel: which flash kernel's speed the training estimate prices
(docs/cost-model.md#training-attention).

auto is the kernel the engine picks by itself (Transformer Engine's cuDNN FusedAttention on
Hopper and later, under Megatron's --attention-backend auto; torchtitan's SDPA, cuDNN first),
at the GPU's measured forward share (catalog flash_attention_forward_fraction); fa2 forces
FlashAttention-2, "35% utilization on the H100 GPU" (Shah et al. 2024, FlashAttention-3,
abstract), on compute capability 9.0 and later; below that FA2 is what the measured kernels are.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost import efficiency
from planner.emit.megatron import attention_args
from planner.layout import TrainConfig
from planner.requests import TrainRequest
from planner.train import TrainEstimate, estimate, train_rates

LLAMA_8B = resolve_model("llama-3.1-8b")


def test_fa2_on_h100_by_hand():
    """H100: bf16 peak 989 TFLOP/s. auto: forward 0.61 (AIConfigurator's FA3-class kernels),
    backward 0.61 x 0.63/0.73 = 0.52644; fa2: 0.35 x 989 = 346.15 TFLOP/s forward, backward
    0.35 x 0.63/0.73 = 0.30205 -> 298.73 TFLOP/s (head dim 128: no head-dim factor); a training
    step sustains 0.93 of each (TRAIN_SUSTAINED_RATE_FRACTION): 321.92 and 277.82."""
    cluster = resolve_cluster("1x8xH100")
    auto, fa2 = train_rates(LLAMA_8B, cluster), train_rates(LLAMA_8B, cluster, "fa2")
    assert auto.flash_forward_flops_per_s == pytest.approx(0.93 * 0.61 * 989e12)
    assert auto.flash_backward_flops_per_s == pytest.approx(0.93 * 0.61 * 0.63 / 0.73 * 989e12)
    assert fa2.flash_forward_flops_per_s == pytest.approx(321.92e12, rel=1e-4)
    assert fa2.flash_backward_flops_per_s == pytest.approx(277.82e12, rel=1e-4)
    assert fa2.matmul_flops_per_s == auto.matmul_flops_per_s  # only attention changes


@pytest.mark.parametrize(("gpu", "slower"), [("A100", False), ("L40S", False), ("H100", True), ("H200", True),
                                             ("B200", True)])
def test_fa2_is_slower_only_from_hopper_on(gpu, slower):
    """Ampere and Ada: FlashAttention-2 is what the catalog's measured kernels are (A100 0.58,
    L40S 0.55), no change; Hopper (0.61) and Blackwell (B200 0.50) drop to 0.35."""
    cluster = resolve_cluster(f"1x8x{gpu}")
    auto, fa2 = train_rates(LLAMA_8B, cluster), train_rates(LLAMA_8B, cluster, "fa2")
    if slower:
        assert fa2.flash_forward_flops_per_s < auto.flash_forward_flops_per_s
        assert fa2.flash_forward_flops_per_s == pytest.approx(
            efficiency.TRAIN_SUSTAINED_RATE_FRACTION * efficiency.FA2_FORWARD_FRACTION_OF_PEAK_HOPPER
            * cluster.gpu.peak_flops_per_s("bf16"))
    else:
        assert fa2 == auto


@settings(max_examples=20, deadline=None)
@given(seq_k=st.sampled_from([4, 16, 64]), tp=st.sampled_from([1, 2, 8]), cp=st.sampled_from([1, 2, 4]),
       gpu=st.sampled_from(["A100", "H100", "B200"]), recompute=st.sampled_from(["none", "full"]))
def test_fa2_never_runs_faster(seq_k, tp, cp, gpu, recompute):
    """Whatever the layout, FlashAttention-2 forced never makes a step shorter, and on Ampere it
    changes nothing."""
    cluster = resolve_cluster(f"4x8x{gpu}")
    dp = 32 // (tp * cp)
    config = TrainConfig(tp=tp, pp=1, dp=dp, cp=cp, micro_batch_size=1, schedule="1f1b", virtual_stages=1,
                         recompute=recompute, sequence_parallel=tp > 1, zero_stage=1)
    steps = {}
    for kernel in ("auto", "fa2"):
        request = TrainRequest(global_batch=64, seq_len=seq_k * 1024, attention_kernel=kernel)
        result = estimate(LLAMA_8B, cluster, config, request)
        if not isinstance(result, TrainEstimate):
            return  # out of memory either way (memory does not depend on the kernel)
        steps[kernel] = result.step_time_seconds
        assert result.config.attention_kernel == kernel
    assert steps["fa2"] >= steps["auto"]
    if gpu == "A100":
        assert steps["fa2"] == steps["auto"]


def test_fa2_costs_most_where_attention_is_most_of_the_step():
    """Llama-3.1-8B on 8 H100 at 8K and 128K tokens (tp 1, cp 1 and cp 8): the attention core's
    share grows with s, so does FA2's slowdown."""
    cluster = resolve_cluster("1x8xH100")
    slowdown = {}
    for seq_len, cp in ((8192, 1), (131072, 8)):
        config = TrainConfig(tp=1, pp=1, dp=8 // cp, cp=cp, micro_batch_size=1, schedule="1f1b",
                             virtual_stages=1, recompute="full", sequence_parallel=False, zero_stage=1)
        auto, fa2 = (estimate(LLAMA_8B, cluster, config, TrainRequest(global_batch=8, seq_len=seq_len,
                                                                       attention_kernel=k)) for k in ("auto", "fa2"))
        slowdown[seq_len] = fa2.step_time_seconds / auto.step_time_seconds - 1
    assert 0 < slowdown[8192] < slowdown[131072]
    assert slowdown[131072] > 0.3


def test_megatron_attention_flags():
    """--attention-backend auto (TE picks cuDNN's fused kernel on Hopper and later), flash pinned
    to FlashAttention-2, or unfused for materialized scores (language_module._set_attention_backend
    and TransformerConfig.flash_attention_version at core_v0.19.0)."""
    base = TrainConfig(tp=1, pp=1, dp=8, micro_batch_size=1, schedule="1f1b", virtual_stages=1,
                       recompute="none", sequence_parallel=False, zero_stage=1)
    assert attention_args(base) == ["--attention-backend", "auto"]
    assert attention_args(base.with_(attention_kernel="fa2")) == [
        "--attention-backend", "flash", "--flash-attention-version", "2"]
    assert attention_args(base.with_(attention="materialized")) == ["--attention-backend", "unfused"]


TRAIN = ("--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
         "--seq-len", "32768")


@pytest.mark.parametrize(("extra", "message"), [
    (("--attention", "materialized"), "--attention-kernel fa2: only with --attention flash"),
    (("--engine", "torchtitan"), "--attention-kernel fa2: torchtitan v0.2.2 runs SDPA"),
    (("--engine-version", "megatron=core_v0.14.0"), "--attention-kernel fa2: Megatron-LM core_v0.14.0 has no "
                                                    "--flash-attention-version"),
])
def test_fa2_where_it_cannot_run_is_a_one_line_error(run_plan, extra, message):
    result = run_plan(*TRAIN, "--attention-kernel", "fa2", *extra)
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""


def test_plan_says_what_fa2_costs_and_the_json_names_the_kernel(run_plan):
    text = run_plan(*TRAIN, "--attention-kernel", "fa2", "--top", "1")
    assert text.returncode == 0, text.stderr
    assert "Attention: FlashAttention-2 forced (--attention-kernel fa2), 35% of the 16-bit peak forward" in text.stdout
    assert "--attention-backend flash --flash-attention-version 2" in text.stdout
    data = json.loads(run_plan(*TRAIN, "--attention-kernel", "fa2", "--top", "1", "--json").stdout)
    assert data["layouts"][0]["attention_kernel"] == "fa2"
    default = json.loads(run_plan(*TRAIN, "--top", "1", "--json").stdout)
    assert default["layouts"][0]["attention_kernel"] == "auto"
    assert default["layouts"][0]["tokens_per_second"] > data["layouts"][0]["tokens_per_second"]
