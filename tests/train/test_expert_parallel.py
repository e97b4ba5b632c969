"""Training with expert parallelism (Megatron-Core): all-to-all time per MoE layer, expert
memory per GPU, the expert-data-parallel group, the search's EP rules and the DeepSeek-V3
question through the CLI. Hand-worked numbers in each docstring.

Cluster figures used (planner/data GPU catalog, 2x8xH100): NVLink 450 GB/s per GPU, 1 us;
InfiniBand 8 x 400 Gb/s per node = 50 GB/s per GPU, 5 us; NCCL reaches 0.77 of a link
(comm.NCCL_BUSBW_FRACTION_OF_LINK): B_intra = 346.5 GB/s, B_nic = 38.5 GB/s.
DeepSeek-V3: h = 7168, k = 8 of E = 256 experts, f_x = 2048, 58 MoE layers of 61.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.cost import activations as act
from planner.cost.params import experts_per_gpu
from planner.cost.training_memory import (
    expert_data_parallel_size,
    expert_sharded_model_state_bytes,
    routed_expert_params_per_layer,
    stage_params_per_gpu,
)
from planner.cost.training_time import ep_seconds_per_layer
from planner.layout import TrainConfig, divisors
from planner.requests import LayoutFilter, TrainRequest
from planner.train import TrainEstimate, estimate, train_rates
from planner.train_search import search

DSV3 = resolve_model("deepseek-v3")
S = 4096
B_INTRA = 450e9 * 0.77
B_NIC = 50e9 * 0.77
ALPHA_INTRA, ALPHA_NIC = 1e-6, 5e-6


def config(tp: int, dp: int, ep: int, recompute: str = "none", pp: int = 1, b: int = 1) -> TrainConfig:
    return TrainConfig(tp, pp, dp, b, "1f1b", 1, recompute, tp > 1, 1, ep=ep)


def test_alltoall_per_moe_layer_inside_one_node():
    """EP 8 on one node (tp=1, dp=8, b=1, s=4096): S = 4096/1 * 8 * 7168 * 2 = 469,762,048 B.
    One all-to-all: fixed + (g-1)*alpha + (g-1)/n * S / B_intra = 43 us + 7 us + 7/8 *
    469,762,048 / 346.5e9 = 50 us + 1.186258 ms = 1.236258 ms (the fixed 43 us is the
    dispatch kernel's, efficiency.ALLTOALL_FIXED_SECONDS); 4 per MoE layer (dispatch,
    combine, forward and backward) = 4.945 ms; 6 with full recompute."""
    cluster = resolve_cluster("1x8xH100")
    rates = train_rates(DSV3, cluster)
    ep = ep_seconds_per_layer(DSV3, cluster, config(1, 8, 8), S, rates)
    message = 4096 * 8 * 7168 * 2
    assert ep.message_bytes == message == 469_762_048
    one = 43e-6 + 7 * ALPHA_INTRA + 7 / 8 * message / B_INTRA
    assert ep.alltoall_seconds == pytest.approx(one, rel=1e-9)
    assert ep.alltoall_seconds == pytest.approx(1.236258e-3, rel=1e-5)
    assert ep.num_alltoalls == 4 and ep.alltoall_seconds_per_moe_layer == pytest.approx(4 * one)
    assert ep.link == "nvlink"
    assert ep.moe_layer_share == pytest.approx(58 / 61)
    full = ep_seconds_per_layer(DSV3, cluster, config(1, 8, 8, "full"), S, rates)
    assert full.num_alltoalls == 6


def test_alltoall_per_moe_layer_over_two_nodes():
    """EP 16 over 2 nodes (tp=1, dp=16): g = 8 ranks per node, N = 2 nodes, n = 16.
    One all-to-all: fixed + (g-1)*alpha_intra + (N-1)*alpha_nic + max((g-1)/n * S / B_intra,
    (n-g)/n * S / B_nic) = 43 us + 7 us + 5 us + max(7/16 * 469,762,048 / 346.5e9 = 0.593 ms,
    8/16 * 469,762,048 / 38.5e9 = 6.100805 ms) = 6.155805 ms: the NICs, 5x EP 8's."""
    cluster = resolve_cluster("2x8xH100")
    rates = train_rates(DSV3, cluster)
    ep = ep_seconds_per_layer(DSV3, cluster, config(1, 16, 16), S, rates)
    message = 469_762_048
    intra, inter = 7 / 16 * message / B_INTRA, 8 / 16 * message / B_NIC
    assert inter > intra
    assert ep.alltoall_seconds == pytest.approx(43e-6 + 7 * ALPHA_INTRA + ALPHA_NIC + inter, rel=1e-9)
    assert ep.alltoall_seconds == pytest.approx(6.155805e-3, rel=1e-5)
    assert ep.link == "infiniband"


def test_alltoall_message_is_the_tp_ranks_share():
    """tp=4, ep=8 (2 TP groups): each GPU sends its s*b/t = 1024 sequence-parallel tokens,
    S = 1024 * 8 * 7168 * 2 = 117,440,512 B; EP 8 = 8 consecutive ranks (Megatron's order,
    pp outermost) even with pp = 2: one node, NVLink."""
    cluster = resolve_cluster("2x8xH100")
    ep = ep_seconds_per_layer(DSV3, cluster, config(4, 2, 8, pp=2), S, train_rates(DSV3, cluster))
    assert ep.message_bytes == 117_440_512
    assert ep.link == "nvlink"


def test_no_alltoall_without_ep():
    cluster = resolve_cluster("1x8xH100")
    ep = ep_seconds_per_layer(DSV3, cluster, config(8, 1, 1), S, train_rates(DSV3, cluster))
    assert ep.alltoall_seconds == 0 and ep.comm_seconds_per_layer == 0 and ep.link is None


def test_deepseek_v3_experts_per_gpu_at_ep64():
    """ep=64, tp=1: 256/64 = 4 whole experts per GPU per MoE layer, each 3 * h * f_x =
    3 * 7168 * 2048 = 44,040,192 parameters: 176,160,768 per MoE layer, 58 MoE layers on one
    stage = 10,217,324,544 (the mean block carries 58/61 of it), and the MTP module's MoE block
    one more: 59 * 176,160,768 = 10,393,485,312."""
    assert experts_per_gpu(DSV3, 64) == 4
    per_moe_layer = 4 * 3 * 7168 * 2048
    assert per_moe_layer == 176_160_768
    assert routed_expert_params_per_layer(DSV3, 1, 64) == pytest.approx(per_moe_layer * 58 / 61)
    params = stage_params_per_gpu(DSV3, 1, 1, ep=64)
    assert params.routed_experts.first_stage == pytest.approx(59 * per_moe_layer) == 10_393_485_312
    no_mtp = DSV3.model_copy(update={"num_mtp_layers": 0})
    assert stage_params_per_gpu(no_mtp, 1, 1, ep=64).routed_experts.first_stage == pytest.approx(58 * per_moe_layer)
    without_ep = stage_params_per_gpu(DSV3, 1, 1)
    assert without_ep.first_stage - params.first_stage == pytest.approx(59 * (256 - 4) * 3 * 7168 * 2048)


def test_expert_data_parallel_group():
    """d_x = t*d/ep with EP, d without: tp=8 dp=16 ep=8 -> 16; ep=128 -> 1; tp=4 dp=32 ep=8
    -> 16; tp=1 dp=64 ep=64 -> 1; no EP, tp=2 dp=8 -> 8."""
    assert expert_data_parallel_size(8, 16, 8) == 16
    assert expert_data_parallel_size(8, 16, 128) == 1
    assert expert_data_parallel_size(4, 32, 8) == 16
    assert expert_data_parallel_size(1, 64, 64) == 1
    assert expert_data_parallel_size(2, 8, 1) == 8


def test_expert_states_shard_over_the_expert_data_parallel_group():
    """ZeRO-1, P = 10e9 of which P_x = 8e9 experts, d = 64, d_x = 1 (ep = 64, tp = 1):
    optimizer 12 * 2e9 / 64 + 12 * 8e9 / 1 = 0.375e9 + 96e9 bytes; gradients 4 * 10e9;
    weights 2 * 10e9 (ZeRO-1 shards neither)."""
    states = expert_sharded_model_state_bytes(10e9, 8e9, 64, 1, 1)
    assert states.optimizer_bytes == pytest.approx(12 * 2e9 / 64 + 12 * 8e9)
    assert states.gradient_bytes == pytest.approx(4 * 10e9)
    assert states.weights_bytes == pytest.approx(2 * 10e9)


def test_dispatched_tokens_activation():
    """s=4096, b=1, tp=4, ep=8: n = 4096/4 * 8 = 8192 (token, expert) pairs per GPU, the
    permuted input n*h*2 = 8192 * 7168 * 2 = 117,440,512 B per MoE layer (u = 1), times 58/61
    for the mean block. Without EP every TP rank gathers the group's 4096 tokens: n = 32,768,
    4x. Full recompute keeps none."""
    with_ep = act.moe_dispatch_bytes_per_layer(DSV3, S, 1, 4, 8, "none", imbalance=1.0)
    assert with_ep == pytest.approx(117_440_512 * 58 / 61)
    assert act.moe_dispatch_bytes_per_layer(DSV3, S, 1, 4, 1, "none") == pytest.approx(4 * with_ep)
    assert act.moe_dispatch_bytes_per_layer(DSV3, S, 1, 4, 8, "full") == 0


MOE_MODELS = ["deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b"]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(name=st.sampled_from(MOE_MODELS), tp=st.sampled_from([1, 2, 4, 8]), data=st.data())
def test_expert_weight_bytes_per_gpu_never_grow_with_ep(name: str, tp: int, data) -> None:
    """Over the EP degrees Megatron accepts (ep = tp * d, E divisible by ep), the routed
    experts' parameters (hence weight bytes) per GPU never grow as ep grows, and never exceed
    the TP-split experts' E/t without EP."""
    model = resolve_model(name)
    valid = [ep for ep in divisors(model.num_local_experts) if ep % tp == 0 and ep > 1]
    if not valid:
        return
    degrees = sorted(data.draw(st.lists(st.sampled_from(valid), min_size=1, max_size=4, unique=True)))
    sizes = [routed_expert_params_per_layer(model, tp, ep) for ep in degrees]
    assert all(a >= b for a, b in zip(sizes, sizes[1:], strict=False))
    assert sizes[0] <= routed_expert_params_per_layer(model, tp, 1) * (1 + 1e-12)


def test_moe_with_tp_needs_sequence_parallelism_and_experts_divisible():
    """Megatron-Core: the MoE layer raises on TP without SP in training; E % ep == 0."""
    cluster = resolve_cluster("2x8xH100")
    request = TrainRequest(global_batch=64, seq_len=S)
    no_sp = TrainConfig(4, 1, 4, 1, "1f1b", 1, "full", False, 1, ep=8)
    result = estimate(resolve_model("mixtral-8x7b"), cluster, no_sp, request)
    assert not isinstance(result, TrainEstimate)
    assert any("sequence parallelism" in r for r in result.reasons)
    odd = TrainConfig(2, 1, 8, 1, "1f1b", 1, "full", True, 1, ep=16)
    result = estimate(resolve_model("mixtral-8x7b"), cluster, odd, request)
    assert not isinstance(result, TrainEstimate)
    assert any("not divisible by ep=16" in r for r in result.reasons)


def test_search_plans_ep_for_mixtral_and_keeps_megatron_rules():
    """Every feasible Mixtral configuration: E = 8 divisible by ep, SP whenever tp > 1; the
    all-to-all appears in the breakdown only when ep > 1, and always unless Megatron's combined
    1F1B hides it (--overlap-moe-expert-parallel-comm, only where Megatron allows it);
    EP configurations are found."""
    model, cluster = resolve_model("mixtral-8x7b"), resolve_cluster("4x8xH100")
    plan = search(model, cluster, TrainRequest(global_batch=512, seq_len=S))
    assert any(e.config.ep > 1 for e in plan.layouts)
    for e in plan.layouts:
        c = e.config
        assert model.num_local_experts % c.ep == 0
        assert c.tp == 1 or c.sequence_parallel
        possible = (c.ep > 1 and c.recompute != "full"
                    and (c.pp == 1 or (c.schedule == "interleaved" and c.virtual_stages > 1)))
        assert possible or not c.moe_comm_overlap  # where possible, unless its extra forward does not fit
        if c.ep == 1:
            assert e.time_breakdown_seconds.ep_comm == 0
        elif not c.moe_comm_overlap:
            assert e.time_breakdown_seconds.ep_comm > 0
        assert (e.alltoall_link is not None) == (c.ep > 1)
    assert any(e.config.moe_comm_overlap for e in plan.layouts)


def test_ep_comm_in_the_step_is_the_pacing_stages_moe_layers():
    """ep_comm = m * L_slowest * phi * n_a2a * T_a2a (the mean block's MoE share) without the
    overlap; with Megatron's combined 1F1B, m * L_slowest * phi * (f * max(0, n_a2a * T_a2a - C)
    + (1 - f) * n_a2a * T_a2a), C the layer's forward, backward and recompute plus the busiest
    GPU's extra expert work, f the share of the critical path's chunk passes it pairs: at p = 2,
    v = 2 the last stage warms up with W = (v-1)*N + 1 = N + 1 forwards (N = 2 when p divides m),
    so f = (2m - 3) / (2m + 1) (pipeline.combined_1f1b_paired_share)."""
    model, cluster = resolve_model("qwen3-30b-a3b"), resolve_cluster("4x8xH100")
    fixed = LayoutFilter(tp=1, pp=2, dp=16, ep=16)  # the EP group spans two nodes: not all hidden
    for overlap in (False, True):
        request = TrainRequest(global_batch=256, seq_len=S, layout=fixed, schedule="interleaved", virtual_stages=2,
                               recompute="selective", moe_comm_overlap=overlap, moe_dispatcher="alltoall")
        e = search(model, cluster, request).layouts[0]
        assert e.config.moe_comm_overlap == overlap
        ep, layer = e.layer_terms.ep, e.layer_terms.layer
        exposed = ep.num_alltoalls * ep.alltoall_seconds
        if overlap:
            full = exposed
            exposed = max(0.0, exposed - (layer.forward + layer.backward + layer.recompute + ep.imbalance_seconds))
            assert 0 < exposed < ep.num_alltoalls * ep.alltoall_seconds
            m = e.num_micro_batches
            assert m % 2 == 0
            paired = (2 * m - 3) / (2 * m + 1)
            exposed = paired * exposed + (1 - paired) * full
        layers = e.num_layers_per_stage[e.slowest_stage]
        assert e.time_breakdown_seconds.ep_comm == pytest.approx(
            e.num_micro_batches * layers * ep.moe_layer_share * exposed)


def test_the_deepseek_v3_question_plans_ep_with_pp():
    """`plan --workload train --model deepseek-v3 --cluster 256x8xH100 --global-batch 4096
    --seq-len 4096`: the recommendation has EP > 1 and PP > 1, fits, and its Megatron
    command carries EP, the dispatcher the estimate priced (DeepEP: the flex dispatcher; NCCL:
    alltoall), grouped GEMMs, MoE, MLA and MTP flags, the MTP module on the last stage with the
    loss, where the split gives that stage fewer decoder layers (NVIDIA's recipe layouts do the
    same: Megatron-Bridge recipes/deepseek/deepseek_v3.py v0.4.0, 13 + mtp + loss at pp 4)."""
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "deepseek-v3", "--cluster", "256x8xH100",
                                      "--global-batch", "4096", "--seq-len", "4096", "--json"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["recommended"]
    assert best["ep"] > 1 and best["pp"] > 1
    assert best["memory_per_gpu_bytes"] <= best["capacity_per_gpu_bytes"]
    assert best["alltoall_seconds_per_layer"] > 0 and best["alltoall_link"] in ("nvlink", "infiniband")
    assert best["time_breakdown_seconds"]["ep_comm"] >= 0
    argv = best["command"][0]["argv"]
    assert argv[argv.index("--expert-model-parallel-size") + 1] == str(best["ep"])
    assert argv[argv.index("--expert-tensor-parallel-size") + 1] == "1"
    assert best["alltoall_link"] == "infiniband"
    flex = best["moe_dispatcher"] == "deepep"
    assert argv[argv.index("--moe-token-dispatcher-type") + 1] == ("flex" if flex else "alltoall")
    assert ("--moe-flex-dispatcher-backend" in argv) == flex and "--moe-enable-deepep" not in argv  # core_v0.19.0
    assert argv[argv.index("--mtp-num-layers") + 1] == "1"
    stages = best["num_layers_per_stage"]
    assert stages[-1] < max(stages)
    for flag in ("--moe-grouped-gemm", "--multi-latent-attention", "--kv-lora-rank", "--num-experts",
                 "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
                 "--moe-layer-freq", "--sequence-parallel"):
        assert flag in argv, flag


def test_expert_imbalance_slows_the_busiest_gpu_in_training():
    """--expert-imbalance u for training: the busiest GPU's routed GEMMs (u - 1) * 3 passes *
    2*k*P_x*b*s/t / R are added, the dispatched activations grow u-fold (plus (u - 1) times
    the routed intermediates); the all-to-all is unchanged. Mixtral, tp=2 pp=2 dp=4 ep=8."""
    model, cluster = resolve_model("mixtral-8x7b"), resolve_cluster("2x8xH100")
    fixed = LayoutFilter(tp=2, pp=2, dp=4, ep=8)
    even = search(model, cluster, TrainRequest(global_batch=64, seq_len=S, layout=fixed, micro_batch=1,
                                               recompute="none", schedule="1f1b", zero_stage=1,
                                               expert_imbalance=1.0))
    busy = search(model, cluster, TrainRequest(global_batch=64, seq_len=S, layout=fixed, micro_batch=1,
                                               recompute="none", schedule="1f1b", zero_stage=1,
                                               expert_imbalance=1.5))
    a, b = even.layouts[0], busy.layouts[0]
    assert a.layer_terms.ep.imbalance_seconds == 0
    rates = train_rates(model, cluster)
    routed = 2 * 2 * 3 * 4096 * 14336 * 1 * S / 2  # 2*k*P_x*b*s/t, P_x = 3*h*f_x
    assert b.layer_terms.ep.imbalance_seconds == pytest.approx(0.5 * 3 * routed / rates.matmul_flops_per_s)
    assert b.alltoall_seconds_per_layer == a.alltoall_seconds_per_layer
    assert b.step_time_seconds > a.step_time_seconds
    assert b.memory.activation_bytes > a.memory.activation_bytes


def test_expert_imbalance_is_accepted_for_training():
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "mixtral-8x7b", "--cluster", "2x8xH100",
                                      "--global-batch", "64", "--seq-len", "4096", "--expert-imbalance", "1.3",
                                      "--json"])
    assert result.exit_code == 0, result.output


def test_explain_shows_the_training_estimates_ep_numbers():
    """plan explain --workload train with EP: the all-to-all rows carry the estimate's time
    and count (m * MoE layers of the pacing stage, per phase 2), the expert gradients reduce
    over d_x = t*d/ep ranks beside the dense ones over d, the map places the EP group as the
    estimate does (Megatron's order), the breakdown has the all-to-all."""
    from planner.explain_train import explain_training

    model, cluster = resolve_model("mixtral-8x7b"), resolve_cluster("2x8xH200")
    request = TrainRequest(global_batch=64, seq_len=S, layout=LayoutFilter(tp=2, pp=2, dp=4, ep=2),
                           moe_dispatcher="alltoall")
    explanation = explain_training(model, cluster, request, settings=None)
    e = search(model, cluster, request).layouts[0]
    a2a = [r for r in explanation.collectives if r.kind == "all-to-all"]
    assert [r.phase for r in a2a] == ["forward", "backward"]
    moe_layers = e.num_layers_per_stage[e.slowest_stage] * e.layer_terms.ep.moe_layer_share
    for row in a2a:
        assert row.total_seconds == e.layer_terms.ep.alltoall_seconds
        assert row.count_per_step == pytest.approx(2 * e.num_micro_batches * moe_layers)
        assert row.group_size == 2 and row.link == e.alltoall_link
    experts = [r for r in explanation.collectives if r.name.endswith("(experts)")]
    assert experts and all(r.group_size == expert_data_parallel_size(2, 4, 2) == 4 for r in experts)
    dense = [r for r in explanation.collectives if r.name.endswith("(dense)")]
    assert dense and all(r.group_size == 4 for r in dense)
    assert sum(r.total_seconds for r in experts + dense if r.kind == "reduce-scatter") == pytest.approx(
        e.dp_collectives.gradient_seconds)
    assert explanation.placement.ep_link == e.alltoall_link
    assert "EP all-to-all" in [s.name for s in explanation.breakdown.segments]


MIXTRAL = resolve_model("mixtral-8x7b")


def test_moe_mlp_width_is_every_expert_a_token_visits():
    """Mixtral-8x7B: k = 2 experts of f_x = 14,336 per token (gated): the MLP width is
    2 x 14,336 = 28,672, and at t = 4 a token keeps gate, up and product,
    3 * 28,672 / 4 * 2 B = 43,008 B of MLP intermediates per layer; with Q, K, V and the
    context (a = 32 heads / 4 = 8, k = 8 KV heads / 4 = 2, d = 128):
    (2 * 8 + 2 * 2) * 128 * 2 B = 5,120 B; together 48,128 B per token per layer.
    DeepSeek-V3: 8 x 2,048 routed + 1 x 2,048 shared = 18,432 on its 58 MoE layers and its
    dense FFN of 18,432 on the other 3: 18,432."""
    from planner.cost.params import mlp_width_per_token

    assert mlp_width_per_token(MIXTRAL) == 28_672
    assert act.split_bytes_per_token(MIXTRAL, 2, 4) == 48_128
    assert mlp_width_per_token(DSV3) == 18_432


def test_moe_model_flops_count_every_expert_a_token_visits():
    """Model FLOPs of Mixtral equal those of the same block with a dense FFN of k * f_x =
    28,672 (the router's [h, E] GEMM is not counted, as in Megatron's count): per token at
    s = 1, 3 * (32 * 2 * (25,165,824 + 16,777,216 + 3 * 4,096 * 28,672) + 2 * 4,096 * 32,000)
    + the attention core (4 * 1 * 32 * 128 * 32 layers * 3 = 1,572,864)
    = 3 * (25,232,932,864 + 262,144,000) + 1,572,864 = 76,485,230,592 + 1,572,864
    = 76,486,803,456 FLOP."""
    from planner.cost.flops import model_flops_per_sequence

    dense_twin = MIXTRAL.model_copy(update={"intermediate_size": 28_672, "num_local_experts": None,
                                            "num_experts_per_tok": None})
    assert model_flops_per_sequence(MIXTRAL, 1) == pytest.approx(model_flops_per_sequence(dense_twin, 1))
    assert model_flops_per_sequence(MIXTRAL, 1) == pytest.approx(76_486_803_456)


def test_mla_trains_as_megatron_builds_it():
    """DeepSeek-V3's attention as Megatron-Core trains it (no weight absorption):
    - per GPU at t = 1 the queries and keys are 128 heads of 128 + 64 = 192, values and context
      128 of 128: 128 * (192 + 192 + 128 + 128) = 81,920 elements per token; Llama-3.1-70B at
      t = 8 (GQA, one KV head per GPU): 8 * 128 + 128 + 128 + 8 * 128 = 2,304;
    - the linear GEMMs hold the layer's 187,105,280 MLA weights (q_a 7,168 x 1,536, q_b
      1,536 x 128 * 192, kv_a 7,168 x 576, kv_b 512 x 128 * 256, o 16,384 x 7,168);
    - the core per head is [s, 192] x [192, s] and [s, s] x [s, 128]: 2 * 128 * (192 + 128)
      = 81,920 FLOP per (query, key) pair, not the GQA formula's 4 * 128 * 56 = 28,672."""
    from planner.cost.flops import attention_core_gemms, layer_gemms_forward, linear_gemms
    from planner.cost.params import mla_attention_weights, training_attention_widths

    assert training_attention_widths(DSV3, 1).total == 81_920
    assert training_attention_widths(resolve_model("llama-3.1-70b"), 8).total == 2_304
    gemms = layer_gemms_forward(DSV3, 1, 1, 1)
    mla = [g for i, g in enumerate(linear_gemms(gemms)) if i not in (2, 3)]  # less the MLP's two
    assert sum(g.m * g.n * g.k for g in mla) == sum(mla_attention_weights(DSV3)) == 187_105_280
    s = 4096
    core = sum(g.flops for g in attention_core_gemms(layer_gemms_forward(DSV3, 1, s, 1)))
    assert core == 81_920 * s * s


def test_combined_1f1b_exposure_by_hand():
    """moe_overlap_exposed_seconds = max(0, A - C): all-to-alls of 4 ms under 6 ms of compute
    hide entirely; 10 ms under 6 ms leave 4 ms."""
    from planner.cost.training_time import moe_overlap_exposed_seconds

    assert moe_overlap_exposed_seconds(0.004, 0.006) == 0.0
    assert moe_overlap_exposed_seconds(0.010, 0.006) == pytest.approx(0.004)


def test_combined_1f1b_only_where_megatron_runs_it():
    """TransformerConfig (core_v0.19.0) asserts EP > 1, no full recompute and, with pp > 1, a
    virtual pipeline: the overlap is planned exactly there, for MoE models, with Megatron."""
    from planner.train import moe_comm_overlap_for, moe_comm_overlap_possible

    moe, dense = resolve_model("qwen3-30b-a3b"), resolve_model("llama-3.1-8b")

    def config(pp=1, schedule="1f1b", v=1, recompute="none", ep=8):
        return TrainConfig(1, pp, 8, 1, schedule, v, recompute, False, 1, ep=ep)

    assert moe_comm_overlap_possible(moe, config())
    assert moe_comm_overlap_possible(moe, config(pp=4, schedule="interleaved", v=2, recompute="selective"))
    assert not moe_comm_overlap_possible(moe, config(pp=4))  # 1F1B without a virtual pipeline
    assert not moe_comm_overlap_possible(moe, config(recompute="full"))
    assert not moe_comm_overlap_possible(moe, config(ep=1))
    assert not moe_comm_overlap_possible(dense, config(ep=1))
    request = TrainRequest(global_batch=256, seq_len=S)
    assert moe_comm_overlap_for(moe, request, config())
    assert not moe_comm_overlap_for(moe, replace(request, moe_comm_overlap=False), config())
    assert not moe_comm_overlap_for(moe, replace(request, engine="torchtitan"), config())


def test_combined_1f1b_holds_one_more_forward():
    """Megatron schedules one more warm-up forward with the overlap (schedules.py
    core_v0.19.0): interleaved, stage 0 of p = 4, v = 2 holds p + (p - 1 + 1)/v = 6 micro-batches
    instead of 4 + 3/2 = 5.5; without pipelining two (a forward beside each backward)."""
    from planner.cost.activations import micro_batches_in_flight

    assert micro_batches_in_flight("interleaved", 4, 64, 2, 0) == 5.5
    assert micro_batches_in_flight("interleaved", 4, 64, 2, 0, extra_forwards=1) == 6.0
    assert micro_batches_in_flight("1f1b", 1, 64, 1, 0, extra_forwards=1) == 2.0
    assert micro_batches_in_flight("1f1b", 1, 1, 1, 0, extra_forwards=1) == 1.0  # at most m


def test_the_command_carries_the_overlap_where_it_is_planned():
    """The plan that overlaps the all-to-alls launches with --overlap-moe-expert-parallel-comm;
    --no-moe-comm-overlap leaves it out (and prices every all-to-all)."""
    from planner.emit.megatron import megatron_steps

    model, cluster = resolve_model("qwen3-30b-a3b"), resolve_cluster("4x8xH100")
    fixed = LayoutFilter(tp=1, pp=2, dp=16, ep=16)
    for overlap in (True, False):
        request = TrainRequest(global_batch=256, seq_len=S, layout=fixed, schedule="interleaved", virtual_stages=2,
                               recompute="selective", moe_comm_overlap=overlap)
        e = search(model, cluster, request).layouts[0]
        argv = [a for step in megatron_steps(model, cluster, e.config, 256, S) for a in step.argv]
        assert ("--overlap-moe-expert-parallel-comm" in argv) == overlap


def test_the_overlap_runs_where_its_extra_forward_fits():
    """Qwen3-30B-A3B on 16 GPUs at pp = 1, ep = 16, b = 1, no recompute: without pipelining the
    combined 1F1B holds two micro-batches (100.3 GiB with it, 73.5 GiB without). On H200s
    (141 GB) it runs; on H100s (80 GB) only the plain schedule fits, and the estimate is that
    one, not a rejection."""
    model = resolve_model("qwen3-30b-a3b")
    config = TrainConfig(1, 1, 16, 1, "1f1b", 1, "none", False, 1, ep=16)
    request = TrainRequest(global_batch=512, seq_len=S)
    plain = replace(request, moe_comm_overlap=False)
    h200 = estimate(model, resolve_cluster("2x8xH200"), config, request)
    assert isinstance(h200, TrainEstimate) and h200.config.moe_comm_overlap
    assert h200.memory_per_gpu_bytes > estimate(model, resolve_cluster("2x8xH200"), config, plain).memory_per_gpu_bytes
    h100 = estimate(model, resolve_cluster("2x8xH100"), config, request)
    assert isinstance(h100, TrainEstimate) and not h100.config.moe_comm_overlap
    assert h100.memory_fallback  # the search then tries more recompute, which may fit the overlap
    assert replace(h100, memory_fallback=False) == estimate(model, resolve_cluster("2x8xH100"), config, plain)


def test_token_permutation_bytes_by_hand():
    """Megatron's alltoall dispatcher, one MoE layer, forward: permutation 1 (read N*h, write
    N*e*h), with EP and several local experts the sort by local expert and back (4 N*e*h), the
    unpermutation (read N*e*h, write N*h). Qwen3-235B-A22B, h 4,096, e 8, 4,096 tokens, bf16:
    ep 8 (16 experts a GPU): 2 * 4,096 * 4,096 * (2 + 16 + 32) = 1,677,721,600 B; without EP
    no sort: * 18 = 603,979,776 B; with EP at t = 2 the GPU permutes its 2,048 sequence-parallel
    tokens; a dense model none."""
    from planner.cost.moe import training_permutation_bytes

    qwen = resolve_model("qwen3-235b-a22b")
    assert training_permutation_bytes(qwen, 4096, 1, 8) == 1_677_721_600
    assert training_permutation_bytes(qwen, 4096, 1, 1) == 603_979_776
    assert training_permutation_bytes(qwen, 4096, 2, 8) == 1_677_721_600 / 2
    assert training_permutation_bytes(resolve_model("llama-3.1-8b"), 4096, 1, 1) == 0.0


def test_the_permutation_is_in_the_layer_forward_and_backward(monkeypatch):
    """layer_seconds adds the permutation at the HBM rate to the forward and again to the
    backward (the mean block's MoE share, 1 for Qwen3-30B-A3B): the layer less the same layer
    priced with no permutation is bytes / R_hbm each way."""
    from planner.cost import training_time as tt
    from planner.cost.moe import training_permutation_bytes

    model, cluster = resolve_model("qwen3-30b-a3b"), resolve_cluster("1x8xH100")
    rates = train_rates(model, cluster)
    with_it = tt.layer_seconds(model, S, 2, 1, False, "none", rates, "flash", "bf16", 8, 8)
    expected = training_permutation_bytes(model, S * 2, 1, 8) / rates.elementwise_bytes_per_s
    monkeypatch.setattr(tt, "training_permutation_bytes", lambda *args: 0.0)
    without = tt.layer_seconds(model, S, 2, 1, False, "none", rates, "flash", "bf16", 8, 8)
    assert with_it.forward - without.forward == pytest.approx(expected)
    assert with_it.backward - without.backward == pytest.approx(expected)
    assert with_it.recompute == without.recompute == 0.0


def test_routed_fp8_casts_by_hand():
    """The routed experts cast e permuted copies per token (and their e output gradients): over
    the dense layer's MLP norm output (2 B/element transposed, delayed) and MLP-down gradient
    (4 B). Qwen3-30B-A3B (h 2,048, e 8, no shared expert), every layer MoE: mxfp8, ep 8, t 1:
    4.0625 * (8 - 1) * 2,048 = 58,240 B per token each way; delayed: 4 * 16,384 - 2 * 2,048 =
    61,440 forward, 4 * 14,336 = 57,344 backward; with EP at t = 2 the routed copies halve."""
    from planner.cost.training_time import moe_routed_cast_bytes

    qwen = resolve_model("qwen3-30b-a3b")
    assert moe_routed_cast_bytes(qwen, 1, 8, "mxfp8") == (58_240, 58_240)
    assert moe_routed_cast_bytes(qwen, 1, 8, "delayed") == (61_440, 57_344)
    assert moe_routed_cast_bytes(qwen, 2, 8, "delayed") == (4 * 8_192 - 2 * 2_048, 4 * (8_192 - 2_048))
    assert moe_routed_cast_bytes(resolve_model("llama-3.1-8b"), 1, 1, "delayed") == (0.0, 0.0)


def test_the_overlap_follows_the_release_with_fsdp_and_the_parameters_dtype():
    """core_v0.14.0 accepts --overlap-moe-expert-parallel-comm with Megatron-FSDP at startup,
    but its combined 1F1B bypasses the hooks FSDP gathers and reduces with; core_v0.19.0 runs
    them together (mcore_fsdp_adapter.py). Megatron asserts bf16 or fp16 parameters for the
    overlap, which every plan trains with (params.training_dtype): an fp32 checkpoint trains in
    bf16 (--bf16) with the overlap too."""
    from planner.emit.megatron import megatron_steps
    from planner.engines import parse_engine_versions
    from planner.train import moe_comm_overlap_for

    model = resolve_model("qwen3-30b-a3b")
    fsdp = TrainConfig(1, 1, 16, 1, "1f1b", 1, "none", False, 3, ep=16)
    new = TrainRequest(global_batch=256, seq_len=S)
    old = replace(new, engine_versions=parse_engine_versions("megatron=core_v0.14.0"))
    assert moe_comm_overlap_for(model, new, fsdp)
    assert not moe_comm_overlap_for(model, old, fsdp)
    assert moe_comm_overlap_for(model, old, replace(fsdp, zero_stage=1))
    fp32 = model.model_copy(update={"dtype": "float32"})
    assert moe_comm_overlap_for(fp32, new, replace(fsdp, zero_stage=1))
    argv = [a for step in megatron_steps(fp32, resolve_cluster("2x8xH100"), replace(fsdp, zero_stage=1), 256, S)
            for a in step.argv]
    assert {"--fp32", "--bf16", "--fp16"} & set(argv) == {"--bf16"}


def test_the_plan_says_why_the_all_to_all_overlap_is_off():
    """Where an EP configuration runs without the combined 1F1B although it was asked for, the
    reason: full recompute, 1F1B with pp > 1, Megatron-FSDP on core_v0.14.0, or
    (the estimate's choice) its extra forward not fitting; nothing where it runs or was turned off."""
    from planner.engines import parse_engine_versions
    from planner.train import moe_comm_overlap_off_reason

    model = resolve_model("qwen3-30b-a3b")
    request = TrainRequest(global_batch=256, seq_len=S)
    plain = TrainConfig(1, 1, 16, 1, "1f1b", 1, "none", False, 1, ep=16)
    assert "full recompute" in moe_comm_overlap_off_reason(model, request, replace(plain, recompute="full"))
    assert "interleaved" in moe_comm_overlap_off_reason(model, request, replace(plain, pp=2, dp=8))
    fp32 = model.model_copy(update={"dtype": "float32"})  # trains in bf16 all the same
    assert moe_comm_overlap_off_reason(fp32, request, plain) == moe_comm_overlap_off_reason(model, request, plain)
    old = replace(request, engine_versions=parse_engine_versions("megatron=core_v0.14.0"))
    assert "Megatron-FSDP" in moe_comm_overlap_off_reason(model, old, replace(plain, zero_stage=3))
    assert "memory" in moe_comm_overlap_off_reason(model, request, plain)  # possible, yet not running
    assert moe_comm_overlap_off_reason(model, request, replace(plain, moe_comm_overlap=True)) is None
    assert moe_comm_overlap_off_reason(model, replace(request, moe_comm_overlap=False), plain) is None


def test_the_routed_casts_are_in_the_layer_casts_for_every_recipe(monkeypatch):
    """fp8_cast_bytes_per_layer adds moe_routed_cast_bytes per token whatever the recipe (the
    block-scaled recipes once returned before adding them): Qwen3-30B-A3B's layer casts less
    the same with the routed term zeroed are tokens * moe_routed_cast_bytes, each way."""
    from planner.cost import training_time as tt

    qwen, tokens = resolve_model("qwen3-30b-a3b"), 4096
    for recipe in ("delayed", "tensorwise", "mxfp8", "blockwise"):
        routed = tt.moe_routed_cast_bytes(qwen, 1, 8, recipe)
        with_routed = tt.fp8_cast_bytes_per_layer(qwen, tokens, 1, 1, recipe, 8)
        with monkeypatch.context() as patched:
            patched.setattr(tt, "moe_routed_cast_bytes", lambda *args: (0.0, 0.0))
            without = tt.fp8_cast_bytes_per_layer(qwen, tokens, 1, 1, recipe, 8)
        assert routed[0] > 0 and routed[1] > 0, recipe
        assert with_routed[0] - without[0] == pytest.approx(routed[0] * tokens), recipe
        assert with_routed[1] - without[1] == pytest.approx(routed[1] * tokens), recipe


# ---- expert parallelism with context parallelism (Megatron-Core's expert grid folds the CP
# ranks in: parallel_state.py core_v0.19.0 builds the experts' ranks as etp-ep-edp over a
# stage's tp*cp*dp GPUs, cp = 1 there)

def cp_config(tp: int, cp: int, dp: int, ep: int, b: int = 1, recompute: str = "none") -> TrainConfig:
    return TrainConfig(tp, 1, dp, b, "1f1b", 1, recompute, tp > 1, 1, ep=ep, cp=cp)


def test_expert_data_parallel_group_with_cp():
    """d_x = t*cp*d/ep: tp=2 cp=4 dp=8 ep=16 -> 2*4*8/16 = 4; tp=1 cp=8 dp=4 ep=8 -> 4;
    without EP the experts shard with the dense weights over d*cp: tp=2 cp=4 dp=2 -> 8."""
    assert expert_data_parallel_size(2, 8, 16, cp=4) == 4
    assert expert_data_parallel_size(1, 4, 8, cp=8) == 4
    assert expert_data_parallel_size(2, 2, 1, cp=4) == 8


def test_ep_group_over_cp_ranks_is_consecutive():
    """Megatron's order puts a stage's TP ranks first, then CP, then DP; the expert grid's EP
    group is ep consecutive ranks. tp=1 cp=8 ep=8 on 8-GPU nodes: the node's 8 GPUs, NVLink.
    tp=2 cp=4 ep=16: ranks 0-15, two nodes of 8; the expert-data-parallel group (t*cp*d/ep =
    2*4*4/16 = 2 ranks at stride 16) crosses nodes."""
    from planner.layout import Layout, ep_group_topology, expert_dp_group_topology
    cluster = resolve_cluster("4x8xH100")
    one_node = ep_group_topology(cluster, Layout(1, 1, 4, 8, cp=8), pp_outermost=True)
    assert (one_node.num_ranks, one_node.ranks_per_node, one_node.num_nodes) == (8, 8, 1)
    layout = Layout(2, 1, 4, 16, cp=4)
    assert layout.dp_per_ep_group == 8 and layout.num_ep_groups == 2
    two_nodes = ep_group_topology(cluster, layout, pp_outermost=True)
    assert (two_nodes.ranks_per_node, two_nodes.num_nodes) == (8, 2)
    expert_dp = expert_dp_group_topology(cluster, layout, expert_data_parallel_size(2, 4, 16, cp=4))
    assert (expert_dp.num_ranks, expert_dp.ranks_per_node, expert_dp.num_nodes) == (2, 1, 2)


def test_alltoall_with_cp_sends_the_ranks_chunk():
    """DeepSeek-V3 at s = 32,768 over cp = 8, tp = 1, ep = 8 on one node: each GPU holds
    s/cp = 4,096 tokens, so S = 4096 * 8 * 7168 * 2 = 469,762,048 B, the same all-to-all as
    EP 8 over 8 DP ranks at s = 4,096 (test_alltoall_per_moe_layer_inside_one_node)."""
    from planner.cost.training_time import layer_terms
    from planner.layout import place
    cluster = resolve_cluster("1x8xH100")
    rates = train_rates(DSV3, cluster)
    c = cp_config(1, 8, 1, 8)
    terms = layer_terms(DSV3, cluster, c, 32_768, place(cluster, c.layout, True), rates)
    plain = ep_seconds_per_layer(DSV3, cluster, config(1, 8, 8), S, rates)
    assert terms.ep.message_bytes == plain.message_bytes == 469_762_048
    assert terms.ep.alltoall_seconds == pytest.approx(plain.alltoall_seconds, rel=1e-12)
    assert terms.ep.link == "nvlink"


def test_ep_with_cp_follows_megatron_rules():
    """ep = t x a divisor of cp*d: tp=2 cp=4 dp=2 -> ep 16 (2 x 8) is valid, ep 32 (2 x 16,
    more ranks than the 8 of cp*d) is not, though it divides the 128 experts; torchtitan folds
    its experts' mesh the same way (efsdp = dp_shard*cp*tp/ep) and plans it too."""
    cluster = resolve_cluster("2x8xH100")
    model = resolve_model("qwen3-30b-a3b")
    request = TrainRequest(global_batch=16, seq_len=32_768)
    good = estimate(model, cluster, cp_config(2, 4, 2, 16, recompute="full"), request)
    assert isinstance(good, TrainEstimate), good
    bad = estimate(model, cluster, cp_config(2, 4, 2, 32, recompute="full"), request)
    assert not isinstance(bad, TrainEstimate)
    assert any("ep=32 not tp x a divisor of cp*dp" in r for r in bad.reasons)
    titan_config = replace(cp_config(2, 4, 2, 16, recompute="full"), zero_stage=3)
    titan = estimate(model, cluster, titan_config, replace(request, engine="torchtitan"))
    assert isinstance(titan, TrainEstimate), titan


def test_cli_layout_with_cp_and_ep():
    """--layout tp=1,cp=8,ep=8 plans: Megatron's command carries --context-parallel-size 8 and
    --expert-model-parallel-size 8, torchtitan's job config context_parallel_degree = 8 and
    expert_parallel_degree = 8."""
    args = ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "1x8xH100", "--global-batch", "8",
            "--seq-len", "32768", "--layout", "tp=1,cp=8,ep=8", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["recommended"]
    assert (best["cp"], best["ep"]) == (8, 8)
    argv = " ".join(" ".join(step["argv"]) for step in best["command"])
    assert "--context-parallel-size 8" in argv and "--expert-model-parallel-size 8" in argv
    titan = CliRunner().invoke(app, [*args[:-1], "--engine", "torchtitan", "--emit", "torchtitan"])
    assert titan.exit_code == 0, titan.output
    assert "context_parallel_degree = 8" in titan.output and "expert_parallel_degree = 8" in titan.output
    # ep = 16 is tp x 16 CP and DP ranks where there are 8: a usage error, one line, exit 2
    wrong = CliRunner().invoke(app, [*args[:-2], "tp=1,cp=8,ep=16"])
    assert wrong.exit_code == 2
    assert "ep must be tp times a divisor of cp*dp" in wrong.output


def test_long_context_moe_keeps_tp_in_the_node_with_cp():
    """DeepSeek-V3 at 32K on 1,024 H100: with EP over CP ranks the search finds TP 8 in the
    node with CP (before, EP only over DP ranks, it ran TP 16 across two nodes)."""
    model, cluster = DSV3, resolve_cluster("128x8xH100")
    plan = search(model, cluster, TrainRequest(global_batch=512, seq_len=32_768), keep_top=1)
    best = plan.layouts[0].config
    assert best.tp <= 8 and best.cp > 1 and best.ep > 1


def test_explain_names_the_cp_ranks_of_an_ep_group():
    """plan explain's placement: ep=16 at tp=2 cp=4 gathers the TP groups of the 4 CP ranks of
    2 DP replicas (16 consecutive ranks: two nodes of 8); ep=8 at tp=1 cp=8 the node's 8 CP ranks."""
    base = ["explain", "--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "4x8xH100",
            "--global-batch", "128", "--seq-len", "32768", "--no-sensitivity"]
    wide = CliRunner().invoke(app, [*base, "--layout", "tp=2,cp=4,ep=16"])
    assert wide.exit_code == 0, wide.output
    text = " ".join(wide.output.split())
    assert "EP groups of 16 GPUs (the TP groups of 4 CP ranks x 2 DP ranks; 2 groups over the stages)" in text
    assert "8 GPUs on each of 2 nodes" in text
    node = CliRunner().invoke(app, [*base, "--layout", "tp=1,cp=8,ep=8"])
    assert node.exit_code == 0, node.output
    text = " ".join(node.output.split())
    assert "EP groups of 8 GPUs (8 CP ranks; 4 groups over the stages), inside one node" in text
    assert "data-parallel attention" not in text


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2, 4, 8]), dp=st.sampled_from([1, 2, 4, 8, 16]),
       data=st.data())
def test_ep_groups_partition_the_stage_with_cp(tp: int, cp: int, dp: int, data) -> None:
    """For every valid ep = tp x k (k dividing cp*dp): the EP groups and the expert-data-parallel
    groups tile a stage's tp*cp*dp GPUs (groups x ep = ep x d_x = tp*cp*dp), the EP group is ep
    consecutive ranks (on 8-GPU nodes: min(ep, 8) per node, ceil(ep/8) nodes), and the
    estimate's rule (train.ep_reasons) accepts exactly these degrees."""
    from planner.layout import Layout, ep_group_topology
    from planner.train import ep_reasons
    k = data.draw(st.sampled_from(divisors(cp * dp)))
    ep = tp * k
    layout = Layout(tp, 1, dp, ep, cp=cp)
    ranks = tp * cp * dp
    assert layout.num_ep_groups * ep == ranks
    assert expert_data_parallel_size(tp, dp, ep, cp) * ep == ranks or ep == 1
    if ep > 1:
        group = ep_group_topology(resolve_cluster("16x8xH100"), layout, pp_outermost=True)
        assert (group.ranks_per_node, group.num_nodes) == (min(ep, 8), -(-ep // 8))
    model = resolve_model("qwen3-235b-a22b")  # 128 experts: every ep here divides them
    config = TrainConfig(tp, 1, dp, 1, "1f1b", 1, "full", tp > 1, 1, ep=ep, cp=cp)
    assert not any("not tp x a divisor" in r for r in ep_reasons(model, config))
    wrong = TrainConfig(tp, 1, dp, 1, "1f1b", 1, "full", tp > 1, 1, ep=tp * cp * dp * 2, cp=cp)
    if wrong.ep <= 128:
        assert any("not tp x a divisor" in r for r in ep_reasons(model, wrong))


def test_combined_1f1b_pairs_by_hand():
    """pipeline.combined_1f1b_paired_share: critical path T + p - 1 chunk passes (T = v*m), the
    last stage pairs T - W. p = 1: W = 1, so m = 1 pairs nothing and m = 4 pairs 3 of 4.
    p = 4, v = 8, m = 16: N = 4 (p divides m), W = (8-1)*4 + 1 = 29, (128 - 29)/(128 + 3) = 99/131.
    p = 2, v = 2, m = 8: N = 2, W = 3, (16 - 3)/(16 + 1) = 13/17."""
    from planner.cost.pipeline import combined_1f1b_paired_share

    assert combined_1f1b_paired_share(1, 1) == 0.0
    assert combined_1f1b_paired_share(1, 4) == pytest.approx(3 / 4)
    assert combined_1f1b_paired_share(4, 16, 8) == pytest.approx(99 / 131)
    assert combined_1f1b_paired_share(2, 8, 2) == pytest.approx(13 / 17)


@given(p=st.sampled_from([1, 2, 4, 8]), v=st.integers(1, 8), m=st.integers(1, 512))
@settings(max_examples=200, deadline=None)
def test_combined_1f1b_pairs_more_with_more_micro_batches(p, v, m):
    """The share is in [0, 1), 0 only at one micro-batch, and never falls as m grows (the
    unpaired fill, drain and warm-up are fixed per step; N may grow with m, W with it, but
    never faster than T)."""
    from planner.cost.pipeline import combined_1f1b_paired_share

    if p == 1:
        v = 1
    if v > 1 and m < p:  # Megatron interleaves only with at least p micro-batches (microbatch_group_size)
        m = p
    share = combined_1f1b_paired_share(p, m, v)
    assert 0.0 <= share < 1.0
    assert (share == 0.0) == (m == 1)
    assert combined_1f1b_paired_share(p, 2 * m, v) >= share - 1e-12


def test_one_micro_batch_per_step_runs_without_the_moe_overlap():
    """DeepSeek-V3 on 32x8 H100 at a global batch of 64 with tp=4, pp=1, ep=256: dp = 64, one
    micro-batch per step, nothing to pair. The overlap stays off (the plan said so and priced
    every exchange hidden: 0.89 s a step against 1.43 s without it), its exchange all exposed,
    and the plan says why."""
    out = CliRunner().invoke(app, ["--workload", "train", "--model", "deepseek-v3", "--cluster", "32x8xH100",
                                   "--global-batch", "64", "--seq-len", "4096", "--layout", "tp=4,pp=1,ep=256"])
    assert out.exit_code == 0, out.output
    assert "1 micro-batch per step leaves it no forward to pair" in " ".join(out.output.split())
    command = next(line for line in out.output.splitlines() if "pretrain_gpt.py" in line)
    assert "--overlap-moe-expert-parallel-comm" not in command
    request = TrainRequest(global_batch=64, seq_len=S, layout=LayoutFilter(tp=4, pp=1, ep=256))
    best = search(DSV3, resolve_cluster("32x8xH100"), request).layouts[0]
    assert best.num_micro_batches == 1 and not best.config.moe_comm_overlap
    ep = best.layer_terms.ep
    layers = best.num_layers_per_stage[0] + DSV3.num_mtp_layers  # 61 + the MTP block on the last stage
    assert best.time_breakdown_seconds.ep_comm == pytest.approx(layers * ep.moe_layer_share
                                                                * ep.num_alltoalls * ep.alltoall_seconds)


def test_the_moe_overlap_launches_with_32_device_connections():
    """Megatron's MoE README (core_v0.19.0) requires CUDA_DEVICE_MAX_CONNECTIONS > 1 for the EP
    all-to-all overlap; with TP or CP validate_args then warns instead of asserting 1 and names
    32. A plan with the overlap emits 32 (it emitted 1, the TP rule), one without it keeps 1."""
    from planner.emit.megatron import launch_env

    overlap = replace(config(tp=2, dp=4, ep=8), moe_comm_overlap=True)
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in launch_env(overlap)
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in launch_env(config(tp=2, dp=4, ep=8))
