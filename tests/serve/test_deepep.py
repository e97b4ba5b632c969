"""DeepEP as the serving EP exchange (--all2all-backend deepep_low_latency |
deepep_high_throughput): the bytes it moves, its time on the links, its buffers, the constants
fitted on AIConfigurator's measured kernels, and the flags the engines get. Hand-worked numbers
carry their arithmetic; docs/cost-model.md (Expert parallelism: DeepEP)."""

from __future__ import annotations

import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import cluster_from_shorthand, resolve_cluster, resolve_model
from planner.cost.moe import deepep_ll_buffer_bytes, deepep_traffic, expected_parts_hit
from planner.cost.serving_time import ep_exchange_ops, ep_exchange_seconds_per_moe_layer
from planner.layout import Layout, place
from planner.requests import LayoutFilter, ServeRequest
from planner.serve import estimate
from planner.specs import SpecError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import deepep_calibration  # noqa: E402

DEEPSEEK = resolve_model("deepseek-v3")
EP16 = Layout(1, 1, 16, 16)


def two_h200_nodes():
    cluster = cluster_from_shorthand(2, 8, "H200-SXM-141GB", "2x8xH200")
    return cluster, place(cluster, EP16)


def test_low_latency_dispatch_over_two_nodes_by_hand():
    """DeepSeek-V3 (fp8 experts: fp8 dispatch), 128 tokens per rank, EP 16 on 2 x 8 H200.
    Message: 16 B header + 7,168 fp8 values + 7,168 / 128 = 56 fp32 scales = 7,408 B.
    1,024 (token, expert) pairs: 7,585,792 B, 7/16 to the node's other GPUs (3,318,784 B),
    8/16 off the node (3,792,896 B). NVLink 3,318,784 / (450e9 x 0.65) = 11.35 us; RDMA
    3,792,896 / (50e9 x 0.93) = 81.57 us; fixed 16.8 + 5.6 log2(2) = 22.4 us: 103.97 us
    (AIConfigurator measured 102.1 us)."""
    nvlink, rdma = deepep_traffic(DEEPSEEK, EP16, 128, "deepep_low_latency", "dispatch", 8, 2)
    assert (nvlink, rdma) == (3_318_784, 3_792_896)
    cluster, placement = two_h200_nodes()
    dispatch = ep_exchange_ops(DEEPSEEK, cluster, EP16, placement, 128, backend="deepep_low_latency")[0]
    assert dispatch.kind == "all-to-all" and dispatch.count_per_step == 1
    assert dispatch.seconds == pytest.approx(22.4e-6 + 81.57e-6, rel=1e-3)


def test_high_throughput_sends_a_token_once_per_rank_and_once_per_remote_node():
    """E 256, e 8 routed uniformly over 16 ranks of 16 experts: ranks hit = 16 (1 - C(240, 8) /
    C(256, 8)) = 6.523; over 2 nodes of 128 experts: nodes hit = 2 (1 - C(128, 8) / C(256, 8)) =
    1.993, less the own node's chance 1.993 / 2: 0.9965 remote nodes per token. 128 tokens,
    7,408 B each: NVLink 128 x 6.523 x 7,408 x 7/16 = 2,706,169 B, RDMA 128 x 0.9965 x 7,408 =
    944,915 B. (DeepSeek-V3's own group-limited routing: the next test.)"""
    uniform = DEEPSEEK.model_copy(update={"num_expert_groups": None, "expert_groups_per_token": None})
    ranks = 16 * (1 - math.comb(240, 8) / math.comb(256, 8))
    nodes = 2 * (1 - math.comb(128, 8) / math.comb(256, 8))
    assert expected_parts_hit(uniform, 16) == pytest.approx(ranks) == pytest.approx(6.5233, abs=1e-4)
    assert expected_parts_hit(uniform, 2) == pytest.approx(nodes) == pytest.approx(1.99302, abs=1e-5)
    nvlink, rdma = deepep_traffic(uniform, EP16, 128, "deepep_high_throughput", "dispatch", 8, 2)
    assert nvlink == pytest.approx(128 * ranks * 7408 * 7 / 16)
    assert rdma == pytest.approx(128 * (nodes - nodes / 2) * 7408) == pytest.approx(944_915, abs=1)


def test_group_limited_routing_reaches_fewer_nodes():
    """DeepSeek-V3 routes each token within its 4 best of 8 groups of 32 experts (n_group 8,
    topk_group 4): the 8 experts are drawn from 128. Over 8 nodes of 32 experts (one group each):
    8 x 4/8 x (1 - C(96, 8)/C(128, 8)) = 3.629 nodes per token, where uniform routing reaches
    8 x (1 - C(224, 8)/C(256, 8)) = 5.295. Over 16 ranks of 16 experts (half a group each):
    16 x 4/8 x (1 - C(112, 8)/C(128, 8)) = 5.339. Over 2 nodes of 4 groups each: the node holds
    i of the 4 picked groups with the hypergeometric chance C(4, i) C(4, 4 - i)/C(8, 4), and is
    then missed with chance C(128 - 32 i, 8)/C(128, 8): 1.926 nodes (1.993 uniform). A Monte
    Carlo of the routing gives 3.632, 5.337 and 1.926."""
    assert (DEEPSEEK.num_expert_groups, DEEPSEEK.expert_groups_per_token) == (8, 4)
    eight = 8 * 4 / 8 * (1 - math.comb(96, 8) / math.comb(128, 8))
    assert expected_parts_hit(DEEPSEEK, 8) == pytest.approx(eight) == pytest.approx(3.629, abs=1e-3)
    assert expected_parts_hit(DEEPSEEK, 16) == pytest.approx(16 * 0.5 * (1 - math.comb(112, 8) / math.comb(128, 8)))
    two = 2 * sum(math.comb(4, i) * math.comb(4, 4 - i) / math.comb(8, 4)
                  * (1 - math.comb(128 - 32 * i, 8) / math.comb(128, 8)) for i in range(1, 5))
    assert expected_parts_hit(DEEPSEEK, 2) == pytest.approx(two) == pytest.approx(1.926, abs=1e-3)
    uniform = DEEPSEEK.model_copy(update={"num_expert_groups": None, "expert_groups_per_token": None})
    assert expected_parts_hit(uniform, 8) == pytest.approx(5.295, abs=1e-3)


def test_group_limited_routing_over_shares_that_straddle_groups():
    """144 experts in 6 groups of 24, top 8 from 2 groups, over 4 shares of 36: each share holds a
    whole group and half of another. Share 0 = group 0 + half of group 1, of the 2 groups picked
    (15 pairs) and their 48 experts: neither picked (6 pairs) misses it; only group 1 (4 pairs)
    holds 12 of the 48, only group 0 (4) 24, both (1) 36, each missed with chance
    C(48 - covered, 8)/C(48, 8); every share alike. Over the 4 shares 4 x (1 - 6/15 - 4/15 x
    C(36, 8)/C(48, 8) - 4/15 x C(24, 8)/C(48, 8) - 1/15 x C(12, 8)/C(48, 8)) = 2.3124 shares per
    token, as a Monte Carlo of the routing gives (2.312); uniform routing over all 144: 3.63."""
    model = DEEPSEEK.model_copy(update={"num_local_experts": 144, "num_experts_per_tok": 8,
                                        "num_expert_groups": 6, "expert_groups_per_token": 2})
    pairs = math.comb(48, 8)
    share = 1 - (6 / 15 + 4 / 15 * math.comb(36, 8) / pairs + 4 / 15 * math.comb(24, 8) / pairs
                 + 1 / 15 * math.comb(12, 8) / pairs)
    assert expected_parts_hit(model, 4) == pytest.approx(4 * share) == pytest.approx(2.3124, abs=1e-4)


def test_combine_messages_are_16_bit():
    """Combine returns bf16 partial outputs: 2 x 7,168 = 14,336 B per message, no header."""
    nvlink, rdma = deepep_traffic(DEEPSEEK, EP16, 128, "deepep_low_latency", "combine", 8, 2)
    assert nvlink + rdma == 128 * 8 * 14_336 * 15 / 16


def test_a_16_bit_model_dispatches_16_bit():
    """bf16 experts: 16 + 2 x 7,168 = 14,352 B per dispatch message."""
    bf16 = DEEPSEEK.model_copy(update={"quantization": None})
    nvlink, rdma = deepep_traffic(bf16, EP16, 1, "deepep_low_latency", "dispatch", 8, 2)
    assert nvlink + rdma == 8 * 14_352 * 15 / 16


def test_a_step_is_one_call_and_low_latency_plans_vllms_256_token_budget():
    """vLLM sizes DeepEP for the step's budget, so a step's tokens go in one dispatch and one
    combine; under the low-latency backend with EP over DP ranks its default budget is 256
    tokens (use_batched_dp_moe), without an exchange or with another backend the GPU's."""
    from planner.cost.serving_memory import max_num_batched_tokens

    cluster, placement = two_h200_nodes()
    ops = ep_exchange_ops(DEEPSEEK, cluster, EP16, placement, 600, backend="deepep_low_latency")
    assert [op.count_per_step for op in ops] == [1, 1]
    request = ServeRequest(all2all_backend="deepep_low_latency")
    assert max_num_batched_tokens(cluster, request, EP16) == 256
    assert max_num_batched_tokens(cluster, request, Layout(8, 1, 2, 8)) == 8192
    assert max_num_batched_tokens(cluster, ServeRequest(), EP16) == 8192
    assert max_num_batched_tokens(cluster, ServeRequest(all2all_backend="deepep_low_latency",
                                                        max_num_batched_tokens=1024), EP16) == 1024


def test_low_latency_buffer_by_hand():
    """vLLM sizes DeepEP's low-latency RDMA buffer for the step's budget, 256 tokens by default
    there. DeepSeek-V3 at 256:
    dispatch message 16 + max(2 x 7,168, 7,168 + 4 x 56) = 14,352 B, combine 4 x 56 + 14,336 =
    14,560 B; send max(256 x 14,352, 256 x 256 x 14,560) = 954,204,160 B, receive 256 x 256 x
    14,560 = 954,204,160 B, signalling 256 x 4 = 1,024 B: 2 x (954,204,160 + 954,204,160 +
    1,024) = 3,816,818,688 B, + 128 B of DeepEP's alignment = 3,816,818,816 B (3.55 GiB)."""
    assert deepep_ll_buffer_bytes(DEEPSEEK) == 3_816_818_816
    # linear in the budget but for the 128-B alignment and the fixed signalling words
    assert deepep_ll_buffer_bytes(DEEPSEEK, 512) == 2 * (3_816_818_816 - 128 - 2048) + 2048 + 128


def test_deepep_buffers_come_out_of_the_kv_cache():
    """DP + EP on 2 x 8 H200: low latency adds 1 GiB (NVLink) + the RDMA buffer to every GPU's
    overhead, high throughput 1 GiB + 1 GiB (the group spans nodes), the default nothing; the
    KV cache gets what is left (under low latency the profile run's 256-token forward also
    takes less than the GPU's 8,192-token budget did)."""
    cluster = resolve_cluster("2x8xH200")
    stages = {}
    for backend in ("allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput"):
        request = ServeRequest(input_len=2048, output_len=512, batch=16, all2all_backend=backend,
                               layout=LayoutFilter(tp=1, pp=1, dp=16, ep=16))
        stages[backend] = estimate(DEEPSEEK, cluster, EP16, request).stages[0]
    default = stages["allgather_reducescatter"]
    for backend, buffers in (("deepep_low_latency", 2**30 + 3_816_818_816), ("deepep_high_throughput", 2 * 2**30)):
        stage = stages[backend]
        assert stage.overhead_bytes - default.overhead_bytes == pytest.approx(buffers)
        freed = default.activation_bytes - stage.activation_bytes
        assert default.kv_cache_bytes - stage.kv_cache_bytes == pytest.approx(buffers - freed)
    assert stages["deepep_high_throughput"].activation_bytes == default.activation_bytes
    assert stages["deepep_low_latency"].activation_bytes < default.activation_bytes


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([4, 8]), st.integers(min_value=32, max_value=256))
def test_deepep_moves_less_than_the_all_gather_across_many_nodes(nodes, tokens):
    """The default all-gathers every rank's tokens to every rank (ep x N tokens: its NVLink
    phase grows with ep); DeepEP sends each only where its experts are, so over 4 and 8 nodes
    it takes less time once the bytes count: low latency from 32 tokens per rank, high
    throughput (whose notify phase costs 105-137 us there) from 128. (Over one or two nodes
    the all-gather can cost less: a node's GPUs share the gathered bytes across its NICs, and
    DeepEP's fixed cost is larger; vLLM's guide names DeepEP for multi-node deployments.)"""
    cluster = cluster_from_shorthand(nodes, 8, "H200-SXM-141GB", f"{nodes}x8xH200")
    layout = Layout(1, 1, 8 * nodes, 8 * nodes)
    placement = place(cluster, layout)
    default = ep_exchange_seconds_per_moe_layer(DEEPSEEK, cluster, layout, placement, tokens)
    assert ep_exchange_seconds_per_moe_layer(DEEPSEEK, cluster, layout, placement, tokens,
                                             "deepep_low_latency") < default
    if tokens >= 128:
        assert ep_exchange_seconds_per_moe_layer(DEEPSEEK, cluster, layout, placement, tokens,
                                                 "deepep_high_throughput") < default


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["deepep_low_latency", "deepep_high_throughput"]), st.sampled_from([1, 2, 4, 8]),
       st.integers(min_value=1, max_value=255))
def test_more_tokens_never_take_less_time(backend, nodes, tokens):
    cluster = cluster_from_shorthand(nodes, 8, "H200-SXM-141GB", f"{nodes}x8xH200")
    layout = Layout(1, 1, 8 * nodes, 8 * nodes)
    placement = place(cluster, layout)
    assert (ep_exchange_seconds_per_moe_layer(DEEPSEEK, cluster, layout, placement, tokens, backend)
            <= ep_exchange_seconds_per_moe_layer(DEEPSEEK, cluster, layout, placement, tokens + 1, backend))


def test_no_exchange_inside_one_tp_group():
    """EP within one replica's TP group (d = 1): no exchange whatever the backend."""
    cluster = resolve_cluster("1x8xH200")
    layout = Layout(8, 1, 1, 8)
    placement = place(cluster, layout)
    assert ep_exchange_ops(DEEPSEEK, cluster, layout, placement, 64, backend="deepep_low_latency") == ()


def test_constants_are_the_fit():
    """efficiency.py's DeepEP constants are bench/deepep_calibration.py's fit, rounded."""
    rows = deepep_calibration.load_rows()
    fitted, used = deepep_calibration.fit(rows), deepep_calibration.catalog()
    for key, value in fitted.items():
        tolerance = 0.06e-6 if "seconds" in key else 0.005
        assert used[key] == pytest.approx(value, abs=tolerance), key


def test_calibration_error():
    """AIConfigurator's DeepEP rows (H200, 1-8 nodes): low latency 7% median |error| (max 41%),
    high throughput 16% (its 8-node rows run at half the NIC rate of 2 and 4 nodes: -42% on
    the combine); the bounds hold it there."""
    scores = deepep_calibration.score(deepep_calibration.load_rows())
    assert scores["low_latency"]["median_abs"] <= 0.08 and scores["low_latency"]["max_abs"] <= 0.45
    assert scores["normal"]["median_abs"] <= 0.18 and scores["normal"]["max_abs"] <= 0.60
    assert scores["all"]["median_abs"] <= 0.10
    assert scores["all"]["rows"] == 374


def _args(**changes):
    from dataclasses import replace

    from planner.emit.command import ServeArgs
    from planner.engines import EngineVersions

    base = ServeArgs(model="M", tp=1, pp=1, dp=16, ep=16, gpus_per_node=8, gpu_memory_utilization=0.9,
                     max_model_len=8192, max_num_seqs=64, quantization=None, kv_cache_dtype="auto",
                     dtype="bfloat16", engine_versions=EngineVersions(), max_num_batched_tokens=None,
                     gpu_memory_bytes=141 * 2**30, weights_and_kv_bytes_per_gpu=100 * 2**30)
    return replace(base, **changes)


@pytest.mark.parametrize("backend, sglang_mode", [("deepep_low_latency", "low_latency"),
                                                  ("deepep_high_throughput", "normal")])
def test_engines_get_the_backend(backend, sglang_mode, engine_check):
    """vLLM: --all2all-backend <backend> beside --enable-expert-parallel; SGLang: --moe-a2a-backend
    deepep --deepep-mode <low_latency | normal> on the DP-attention server; each argv accepted
    by the release's own flags."""
    from planner.emit.sglang import sglang_steps
    from planner.emit.vllm import vllm_steps
    from planner.engines import EngineVersions

    args = _args(all2all_backend=backend)
    for step in vllm_steps(args):
        argv = list(step.argv)
        assert argv[argv.index("--all2all-backend") + 1] == backend
        assert engine_check(step.argv, EngineVersions()) == []
    for step in sglang_steps(args):
        if "serve" not in " ".join(step.argv):
            continue
        argv = list(step.argv)
        assert argv[argv.index("--moe-a2a-backend") + 1] == "deepep"
        assert argv[argv.index("--deepep-mode") + 1] == sglang_mode
        assert engine_check(step.argv, EngineVersions()) == []
        # low latency: SGLang dispatches at most 128 tokens per rank per call unless told; the
        # plan's 256 per rank (vLLM's budget there), prompts chunked to 256 x 16 ranks
        low_latency = backend == "deepep_low_latency"
        assert ("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=256" in argv) == low_latency
        assert ("--chunked-prefill-size" in argv) == low_latency
        if low_latency:
            assert argv[argv.index("--chunked-prefill-size") + 1] == str(256 * 16)


def test_no_backend_flag_without_an_exchange_or_by_default():
    """The default stays implicit; EP inside one TP group (d = 1) has no exchange to run."""
    from planner.emit.vllm import engine_flags

    assert "--all2all-backend" not in engine_flags(_args())
    assert "--all2all-backend" not in engine_flags(_args(tp=8, dp=1, ep=8, all2all_backend="deepep_low_latency"))


def test_the_plan_says_what_each_other_backend_changes():
    """The recommended layout exchanges over 8 nodes: the plan re-prices it under both DeepEP
    modes and with dual-batch overlap (the user's choices stay the defaults); a layout without
    an exchange gets none."""
    from planner.render.serve import all2all_backend_lines
    from planner.serve_search import plan_serving

    request = ServeRequest(input_len=2048, output_len=1024, batch=64, layout=LayoutFilter(tp=1, pp=1, dp=64, ep=64))
    plan = plan_serving(DEEPSEEK, resolve_cluster("8x8xH200"), request)
    options = {o.value: o.estimate for o in plan.all2all_backend_options}
    # dual-batch overlap is offered once a DeepEP backend is chosen (vLLM refuses it otherwise)
    assert list(options) == ["deepep_low_latency", "deepep_high_throughput"]
    on_deepep = plan_serving(DEEPSEEK, resolve_cluster("8x8xH200"), replace(request, all2all_backend="deepep_low_latency"))
    assert [o.value for o in on_deepep.all2all_backend_options] == [
        "allgather_reducescatter", "deepep_high_throughput", "--enable-dbo"]
    best = plan.recommended
    for value, other in options.items():
        assert other.layout == best.layout
        if value.startswith("deepep"):
            assert other.ep_exchange_seconds_per_moe_layer < best.ep_exchange_seconds_per_moe_layer
    lines = all2all_backend_lines(on_deepep)
    assert len(lines) == 3 and lines[0].startswith("EP exchange: --all2all-backend allgather_reducescatter")
    assert lines[2].startswith("EP exchange: --enable-dbo (dual-batch overlap)")
    assert "vLLM runs its decode steps without CUDA graphs" in lines[1]
    # under --emit sglang the lines name SGLang's flags and its eager decode (moe_hook.py, 0.5.23)
    sglang = plan_serving(DEEPSEEK, resolve_cluster("8x8xH200"),
                          replace(request, all2all_backend="deepep_low_latency", pool_engine="sglang"))
    sglang_lines = all2all_backend_lines(sglang)
    high = next(line for line in sglang_lines if "deepep_high_throughput" in line)
    assert "--moe-a2a-backend deepep --deepep-mode normal" in high and "SGLang runs its decode steps" in high
    assert "vLLM" not in " ".join(sglang_lines)
    from planner.render.serve import options_json

    rows = options_json("all2all_backend", on_deepep.all2all_backend_options)
    assert [{k: v for k, v in row.items() if k in ("all2all_backend", "enable_dbo")} for row in rows] == [
        {"all2all_backend": "allgather_reducescatter"}, {"all2all_backend": "deepep_high_throughput"},
        {"enable_dbo": True}]
    inside = plan_serving(DEEPSEEK, resolve_cluster("1x8xH200"),
                          ServeRequest(input_len=2048, output_len=256, layout=LayoutFilter(tp=8, pp=1, dp=1, ep=8)))
    assert inside.all2all_backend_options == ()


# Dual-batch overlap (--enable-dbo)

def test_dual_batch_overlap_by_hand():
    """A half step of 10 ms of which 4 ms is the exchange over 2 MoE layers: work C = 6 ms,
    X = 4 ms, hidden behind the other half: 2 max(6, 4) = 12 ms. With an 8 ms exchange
    (C = 2 ms) 2 max(2, 8) = 16 ms, 12 ms of it exposed exchange."""
    from planner.cost.serving_time import StepTime, dbo_step_time

    half = StepTime(0.010, 0.004, 0.001, 0.0001, "memory", 0.0008, 0.002, 0.0, 0.003)
    full = dbo_step_time(half, 2)
    assert full.seconds == pytest.approx(0.012)
    assert full.ep_exchange_seconds_per_moe_layer == 0.0
    assert (full.gemm_seconds, full.overhead_seconds) == (0.008, 0.0016)
    busy = StepTime(0.010, 0.001, 0.0005, 0.0, "memory", 0.0005, 0.004, 0.0, 0.0)
    assert dbo_step_time(busy, 2).seconds == pytest.approx(0.016)
    assert 2 * dbo_step_time(busy, 2).ep_exchange_seconds_per_moe_layer == pytest.approx(0.012)


def _step(load, backend="deepep_low_latency", dbo=True, nodes=8):
    from planner.cost.serving_memory import stage_memory
    from planner.cost.serving_time import stage_step_time, step_constants

    cluster = cluster_from_shorthand(nodes, 8, "H200-SXM-141GB", f"{nodes}x8xH200")
    layout = Layout(1, 1, 8 * nodes, 8 * nodes)
    request = ServeRequest(all2all_backend=backend, enable_dbo=dbo)
    stage = stage_memory(DEEPSEEK, cluster, layout, request, 64)[0]
    constants = step_constants(DEEPSEEK, cluster, layout, backend, dbo)
    return stage_step_time(DEEPSEEK, cluster, layout, place(cluster, layout), stage, load, constants=constants)


def test_dual_batch_overlap_starts_at_vllms_thresholds():
    """vLLM micro-batches a decode-only step from 32 tokens, a step with prompt chunks from 512."""
    from planner.cost.serving_time import StepLoad

    for tokens, split in ((31, False), (32, True)):
        load = StepLoad(tokens, tokens * 3000)
        assert (_step(load).seconds != _step(load, dbo=False).seconds) == split
    for prompt, split in ((400, False), (480, True)):
        load = StepLoad(32, 32 * 3000, prompt, prompt * prompt / 2, 1)
        assert (_step(load).seconds != _step(load, dbo=False).seconds) == split


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["deepep_low_latency", "deepep_high_throughput"]), st.integers(min_value=32, max_value=512))
def test_overlap_hides_at_most_the_exchange(backend, tokens):
    """Two half steps cost at least one full step's work (weights read twice, fixed costs
    paid twice), so dual-batch overlap can at most hide the exchange, never more."""
    from planner.cost.moe import moe_layers_of
    from planner.cost.serving_time import StepLoad

    load = StepLoad(tokens, tokens * 3000)
    single = _step(load, backend, dbo=False)
    exchange = moe_layers_of(DEEPSEEK, DEEPSEEK.num_hidden_layers) * single.ep_exchange_seconds_per_moe_layer
    assert _step(load, backend).seconds >= single.seconds - exchange - 1e-12


def test_dbo_flags_for_both_engines(engine_check):
    """vLLM --enable-dbo (ParallelConfig.enable_dbo), SGLang --enable-two-batch-overlap, on an EP
    group that exchanges; not without one."""
    from planner.emit.sglang import sglang_steps
    from planner.emit.vllm import engine_flags, vllm_steps
    from planner.engines import EngineVersions

    args = _args(all2all_backend="deepep_low_latency", enable_dbo=True)
    for step in vllm_steps(args):
        assert "--enable-dbo" in step.argv and engine_check(step.argv, EngineVersions()) == []
    for step in sglang_steps(args):
        if "serve" in " ".join(step.argv):
            assert "--enable-two-batch-overlap" in step.argv and engine_check(step.argv, EngineVersions()) == []
    assert "--enable-dbo" not in engine_flags(_args(tp=8, dp=1, ep=8, enable_dbo=True))


@pytest.mark.parametrize("cluster_name, words", [("1x8xMI300X", "compute capability 8.0 and later, not MI300X"),
                                                 ("1x4xL40S", "over NVLink (this node has pcie)")])
def test_deepep_is_refused_where_it_cannot_run(cluster_name, words):
    """DeepEP is CUDA on NVIDIA GPUs with NVLink inside the node: on MI300X or PCIe-only L40S the
    backend (and dual-batch overlap over it) is a usage error, and the plan offers no DeepEP
    alternative there (found by a CLI sweep: both were priced and emitted)."""
    from planner.serve_search import plan_serving

    model, cluster = resolve_model("qwen3-30b-a3b"), resolve_cluster(cluster_name)
    gpus = cluster.num_gpus
    layout = LayoutFilter(tp=1, dp=gpus, ep=gpus)
    with pytest.raises(SpecError, match=re.escape(words)):
        plan_serving(model, cluster, ServeRequest(layout=layout, all2all_backend="deepep_low_latency"))
    plan = plan_serving(model, cluster, ServeRequest(layout=layout))
    assert plan.recommended is not None
    assert not [o for o in plan.all2all_backend_options if o.value.startswith("deepep")]
    on_h100 = plan_serving(model, resolve_cluster("1x8xH100"), ServeRequest(layout=LayoutFilter(tp=1, dp=8, ep=8)))
    assert {o.value for o in on_h100.all2all_backend_options} >= {"deepep_low_latency", "deepep_high_throughput"}


def test_deepep_on_ampere_runs_high_throughput_inside_a_node_only():
    """DeepEP's Ampere build has neither the low-latency nor the internode kernels (setup.py at
    v1.2.1: DISABLE_SM90_FEATURES leaves out NVSHMEM). On A100: deepep_low_latency is a usage
    error; deepep_high_throughput runs an EP group inside a node and is refused across nodes."""
    from planner.serve import Rejected, ServeEstimate
    from planner.serve_search import plan_serving

    model, one, two = resolve_model("qwen3-30b-a3b"), resolve_cluster("1x8xA100"), resolve_cluster("2x8xA100")
    with pytest.raises(SpecError, match="low-latency kernels need SM90 features"):
        plan_serving(model, one, ServeRequest(layout=LayoutFilter(tp=1, dp=8, ep=8),
                                              all2all_backend="deepep_low_latency"))
    request = ServeRequest(all2all_backend="deepep_high_throughput")
    inside = estimate(model, one, Layout(1, 1, 8, ep=8), request)
    across = estimate(model, two, Layout(1, 1, 16, ep=16), request)
    assert isinstance(inside, ServeEstimate)
    assert isinstance(across, Rejected) and "runs inside one node only" in across.reasons[0]


def test_deepep_on_ampere_counts_the_pipeline_in_the_ep_groups_span():
    """vLLM gives each DP rank pp * tp consecutive GPUs, so an EP group of 8 DP ranks at tp=1
    and pp=2 touches 8 x 2 = 16 GPUs: two A100 nodes, over InfiniBand. The check compared ep = 8
    with the node's 8 GPUs and let it run on DeepEP's intranode-only Ampere build."""
    from planner.serve import Rejected, ServeEstimate

    model, two = resolve_model("qwen3-30b-a3b"), resolve_cluster("2x8xA100")
    request = ServeRequest(all2all_backend="deepep_high_throughput")
    staged = estimate(model, two, Layout(1, 2, 8, ep=8), request)
    flat = estimate(model, two, Layout(1, 1, 8, ep=8), request)
    assert isinstance(staged, Rejected) and "runs inside one node only" in staged.reasons[0]
    assert isinstance(flat, ServeEstimate)


def test_an_other_backend_at_another_concurrency_says_so():
    """DeepSeek-V3 on 4x8 H200, 1,024/1,024 tokens: DeepEP's low-latency kernels halve TPOT while
    tok/s fall, because their 256-token step budget runs 122 sequences a replica where the default
    runs 279; the line said neither (a CLI read). A backend at the same concurrency adds nothing."""
    from planner.render.serve import _changes
    from planner.serve_search import plan_serving

    plan = plan_serving(DEEPSEEK, resolve_cluster("4x8xH200"), ServeRequest(input_len=1024, output_len=1024))
    best = plan.recommended
    for option in plan.all2all_backend_options:
        other = option.estimate
        text = _changes(best, other)
        said = f", at {other.batch:,} concurrent sequences per replica (not {best.batch:,})"
        assert text.endswith(said) == (other.batch != best.batch)
    assert _changes(best, best).endswith("(+0%)")


def test_the_what_if_lines_and_the_roles_say_what_the_commands_run():
    """DeepSeek-V3 on 2x8 H200: the high-throughput what-if line carries the eager-decode caveat
    the plan gives a layout that runs it; asked for high throughput, a disaggregated deployment's
    notes say its decode workers run the low-latency kernels, as their command does (a CLI read)."""
    from planner.disagg_cli import disagg_launch_notes
    from planner.disagg_search import plan_disaggregated
    from planner.render.serve import all2all_backend_lines
    from planner.serve_search import plan_serving

    model, cluster = resolve_model("deepseek-v3"), resolve_cluster("2x8xH200")
    lines = all2all_backend_lines(plan_serving(model, cluster, ServeRequest(layout=LayoutFilter(tp=1, pp=1, dp=16,
                                                                                                ep=8))))
    high = [line for line in lines if "deepep_high_throughput" in line]
    assert high and all("without CUDA graphs" in line for line in high)
    assert not any("without CUDA graphs" in line for line in lines if "deepep_low_latency" in line)
    request = ServeRequest(all2all_backend="deepep_high_throughput", max_ttft_seconds=0.6)
    best = plan_disaggregated(model, cluster, request).recommended
    assert best is not None and best.decode.ep > 1
    notes = disagg_launch_notes(model, cluster, request, best, "vllm")
    assert any("decode workers its low-latency ones" in note for note in notes)
