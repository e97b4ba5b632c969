"""Expert parallelism worked by hand: the all-to-all's alpha-beta time inside a node and
across nodes, experts per GPU, where an EP group lands, MLA's KV cache under TP vs
data-parallel attention, and what EP changes in one decode step.

Links as the shipped DGX H100 profiles give them: NVLink 450 GB/s per GPU one way, 1 us;
8 x 400 Gb/s NDR per node = 400 GB/s, 50 GB/s per GPU when all 8 send at once, 5 us.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost import efficiency as eff
from planner.cost.comm import alltoall_seconds, group_alltoall_seconds
from planner.cost.moe import ep_combine_bytes, ep_dispatch_bytes, sequence_parallel_moe
from planner.cost.params import (
    experts_per_gpu,
    layer_weight_bytes_per_gpu,
    routed_expert_share_per_gpu,
)
from planner.cost.serving_memory import stage_memory
from planner.cost.serving_time import (
    StepLoad,
    ep_exchange_seconds_per_moe_layer,
    expert_load_factor,
    serving_collectives,
    stage_step_time,
)
from planner.layout import GroupTopology, Layout, Link, ep_group_ranks, ep_group_topology, place
from planner.requests import ServeRequest

NVLINK = Link("nvlink", "intra_node", 450e9, 1e-6)
NIC_SHARE = Link("infiniband", "inter_node", 50e9, 5e-6)
MIB = 1_048_576


def test_alltoall_inside_one_node_by_hand():
    """n = 8 on one node, S = 1 MiB each: 7 latencies + 7/8 of S over NVLink:
    7 * 1 us + 917,504 B / 450e9 B/s = 7 us + 2.0389 us = 9.0389 us."""
    group = GroupTopology(8, 8, 1, NVLINK, None)
    assert group_alltoall_seconds(MIB, group) == pytest.approx(7e-6 + 917_504 / 450e9, rel=1e-12)
    assert group_alltoall_seconds(MIB, group) == pytest.approx(9.0389e-6, rel=1e-4)


def test_alltoall_across_two_nodes_by_hand():
    """n = 16 over 2 nodes, g = 8 each, S = 1 MiB: 7/16 of S stays on NVLink (458,752 B /
    450e9 = 1.019 us), 8/16 crosses the NICs at 50 GB/s per GPU (524,288 B / 50e9 =
    10.486 us), in parallel: the NIC share wins. Latencies 7 * 1 us + 1 * 5 us = 12 us.
    T = 12 + 10.486 = 22.486 us: 2.5x the one-node time for the same bytes per GPU."""
    group = GroupTopology(16, 8, 2, NVLINK, NIC_SHARE)
    expected = 7e-6 + 5e-6 + 524_288 / 50e9
    assert group_alltoall_seconds(MIB, group) == pytest.approx(expected, rel=1e-12)
    assert group_alltoall_seconds(MIB, group) == pytest.approx(22.486e-6, rel=1e-4)
    one_node = group_alltoall_seconds(MIB, GroupTopology(8, 8, 1, NVLINK, None))
    assert group_alltoall_seconds(MIB, group) > 2 * one_node


def test_alltoall_one_rank_is_free_and_datasheet_links_are_derated():
    """One rank sends nothing. On a placed group the datasheet links run at NCCL's bus
    bandwidth share (0.77): the bandwidth term of the one-node case grows by 1/0.77; the
    dispatch kernel's fixed cost (43 us, fitted on DeepEP's floor) comes on top."""
    assert alltoall_seconds(MIB, GroupTopology(1, 1, 1, None, None), None) == 0.0
    group = GroupTopology(8, 8, 1, NVLINK, None)
    derated = alltoall_seconds(MIB, group, None)
    assert derated == pytest.approx(43e-6 + 7e-6 + 917_504 / (450e9 * eff.NCCL_BUSBW_FRACTION_OF_LINK), rel=1e-12)


@given(st.integers(1, 1 << 30), st.sampled_from([(8, 8, 1), (16, 8, 2), (32, 8, 4), (16, 4, 4)]))
def test_alltoall_grows_with_size(message_bytes, shape):
    n, g, nodes = shape
    group = GroupTopology(n, g, nodes, NVLINK, NIC_SHARE if nodes > 1 else None)
    assert group_alltoall_seconds(message_bytes + 1, group) >= group_alltoall_seconds(message_bytes, group) > 0


def test_experts_per_gpu_by_hand():
    """DeepSeek-V3's 256 routed experts: ep 8 -> 32 per GPU, ep 64 -> 4, ep 96 -> ceil(2.67)
    = 3 on the fullest GPU (vLLM gives the first 256 mod 96 = 64 ranks the extra one);
    without EP all 256, each split over t. Share of the routed weights on one GPU: 1/t
    without EP (1/8 at tp 8), 32/256 = 1/8 at ep 8, 3/256 at ep 96."""
    model = resolve_model("deepseek-v3")
    assert [experts_per_gpu(model, ep) for ep in (1, 8, 64, 96)] == [256, 32, 4, 3]
    assert routed_expert_share_per_gpu(model, 8, 1) == pytest.approx(1 / 8)
    assert routed_expert_share_per_gpu(model, 1, 8) == pytest.approx(32 / 256)
    assert routed_expert_share_per_gpu(model, 1, 96) == pytest.approx(3 / 256)


@given(st.sampled_from(["deepseek-v3", "qwen3-30b-a3b", "mixtral-8x7b", "qwen3-235b-a22b"]),
       st.sampled_from([1, 2, 4]), st.integers(0, 6), st.integers(0, 3))
def test_expert_weights_per_gpu_never_grow_with_ep(name, tp, low, more):
    """For a fixed tp, a larger EP group (a multiple of a smaller one) never puts more
    weight on a GPU."""
    model = resolve_model(name)
    small = tp * 2**low
    large = small * 2**more
    assert layer_weight_bytes_per_gpu(model, tp, large) <= layer_weight_bytes_per_gpu(model, tp, small) + 1e-6


def test_ep_group_placement_by_hand():
    """tp=2 pp=2 dp=4 ep=8 on 2 x 8 GPUs. vLLM's order gives DP rank d the GPUs
    (d*pp + stage)*tp + t: stage 0's EP group is {0,1, 4,5, 8,9, 12,13}: 4 on each of 2
    nodes. Megatron's (pp outermost) makes it the 8 consecutive ranks 0..7: one node."""
    cluster = resolve_cluster("2x8xH100")
    layout = Layout(2, 2, 4, 8)
    assert ep_group_ranks(layout) == [0, 1, 4, 5, 8, 9, 12, 13]
    vllm = ep_group_topology(cluster, layout)
    assert (vllm.num_ranks, vllm.ranks_per_node, vllm.num_nodes) == (8, 4, 2)
    assert vllm.inter is not None
    megatron = ep_group_topology(cluster, layout, pp_outermost=True)
    assert (megatron.ranks_per_node, megatron.num_nodes, megatron.inter) == (8, 1, None)
    assert ep_group_topology(cluster, Layout(2, 2, 4)) is None
    assert place(cluster, Layout(1, 1, 16, 16)).ep_link.kind == "infiniband"
    assert place(cluster, Layout(1, 1, 16, 8)).ep_link.kind == "nvlink"


def test_mla_kv_under_tp_vs_data_parallel_attention():
    """DeepSeek-V3's MLA caches one latent per token and layer, (512 + 64) * 2 B * 61 layers
    = 70,272 B, shared by all heads, so each GPU of a TP group holds all of it: at tp=8 the
    8 GPUs hold one copy of each sequence's KV. With data-parallel attention (tp=1, dp=8,
    ep=8) each GPU holds its own sequences: the same 70,272 B per token per GPU, 8 replicas,
    so the node caches 8x the tokens per byte of KV space; each GPU has less of that space
    (it holds all the attention weights instead of 1/8), so 5.2x here, still far more."""
    model = resolve_model("deepseek-v3")
    cluster = resolve_cluster("1x8xH200")
    request = ServeRequest(max_model_len=8192)
    (tp8,) = stage_memory(model, cluster, Layout(8, 1, 1, 8), request, 256)
    (dpa,) = stage_memory(model, cluster, Layout(1, 1, 8, 8), request, 256)
    assert tp8.kv_bytes_per_token == dpa.kv_bytes_per_token == (512 + 64) * 2 * 61 == 70_272
    cluster_tokens_tp8 = tp8.kv_cache_tokens * 1
    cluster_tokens_dpa = dpa.kv_cache_tokens * 8
    space_ratio = 8 * dpa.kv_cache_bytes / tp8.kv_cache_bytes
    assert cluster_tokens_dpa / cluster_tokens_tp8 == pytest.approx(space_ratio, rel=0.01)
    assert dpa.weights_bytes > tp8.weights_bytes
    assert cluster_tokens_dpa > 5 * cluster_tokens_tp8


def test_ep_puts_vllms_gather_and_scatter_and_imbalance_into_the_step():
    """qwen3-30b-a3b (48 MoE layers, h 2048, E 128, top-8) at tp=1 dp=8 ep=8 on one H100
    node, 64 decoding sequences per DP rank. vLLM's default EP path (allgather_reducescatter)
    all-gathers the 8 ranks' hidden states and router logits, S = 8 * 64 * (2048 + 128) * 2 B
    = 2,228,224 B, and reduce-scatters the outputs, S = 8 * 64 * 2048 * 2 B = 2,097,152 B.
    NVLink at NCCL's bus bandwidth, 450e9 * 0.77 = 346.5e9 B/s, 1 us per step of the ring:
    dispatch 7 us + 7/8 * 2,228,224 / 346.5e9 = 7 + 5.6268 us = 12.6268 us,
    combine  7 us + 7/8 * 2,097,152 / 346.5e9 = 7 + 5.2958 us = 12.2958 us; 24.9226 us.
    Without EP there is none. The busiest GPU's routed work is EXPERT_LOAD_IMBALANCE times
    the mean under EP and exactly the mean without it."""
    model = resolve_model("qwen3-30b-a3b")
    cluster = resolve_cluster("1x8xH100")
    request = ServeRequest(max_model_len=4096)
    load = StepLoad(64, 64 * 1024)
    ep = Layout(1, 1, 8, 8)
    assert ep_dispatch_bytes(model, ep, 64) == 8 * 64 * (2048 + 128) * 2 == 2_228_224
    assert ep_combine_bytes(model, ep, 64) == 8 * 64 * 2048 * 2 == 2_097_152
    (stage,) = stage_memory(model, cluster, ep, request, 64)
    with_ep = stage_step_time(model, cluster, ep, place(cluster, ep), stage, load)
    bus = 450e9 * 0.77
    expected = 7e-6 + 7 / 8 * 2_228_224 / bus + 7e-6 + 7 / 8 * 2_097_152 / bus
    assert with_ep.ep_exchange_seconds_per_moe_layer == pytest.approx(expected, rel=1e-12)
    assert with_ep.ep_exchange_seconds_per_moe_layer == pytest.approx(24.9226e-6, rel=1e-4)
    plain = Layout(1, 1, 8)
    (stage1,) = stage_memory(model, cluster, plain, request, 64)
    assert stage_step_time(model, cluster, plain, place(cluster, plain), stage1, load).ep_exchange_seconds_per_moe_layer == 0
    assert expert_load_factor(ep, 1.3) == 1.3
    assert expert_load_factor(plain, 1.3) == 1.0


def test_ep_inside_one_tp_group_exchanges_nothing():
    """tp=8 ep=8 (one replica, vLLM data_parallel_size 1): every TP rank already holds the
    step's tokens, runs its 16 experts on them, and the MLP's TP all-reduce sums the outputs
    (FusedMoE dispatches only when dp_size > 1): no dispatch or combine is priced, none is
    listed, and the step costs no more than the same layout's TP all-reduces and experts."""
    model = resolve_model("qwen3-30b-a3b")
    cluster = resolve_cluster("1x8xH100")
    layout = Layout(8, 1, 1, 8)
    assert ep_dispatch_bytes(model, layout, 64) == ep_combine_bytes(model, layout, 64) == 0
    assert ep_exchange_seconds_per_moe_layer(model, cluster, layout, place(cluster, layout), 64) == 0
    listed = serving_collectives(model, cluster, layout, place(cluster, layout), 64, 1, 48, 1024)
    assert {c.kind for c in listed} == {"all-reduce"}


def test_sequence_parallel_moe_by_hand():
    """qwen3-30b-a3b at tp=2 dp=4 ep=8 (vLLM use_sequence_parallel_moe: t > 1, d > 1), 64
    tokens per replica: each TP rank takes 32 into the MoE layer; the EP group of 8 gathers
    8 * 32 * (2048 + 128) * 2 = 1,114,112 B and scatters 8 * 32 * 2048 * 2 = 1,048,576 B;
    the output, 64 * 2048 * 2 = 262,144 B, is all-gathered over the 2 TP ranks instead of
    all-reduced. At 346.5e9 B/s and 1 us per step:
    dispatch 7 + 7/8 * 1,114,112 / 346.5e9 = 7 + 2.81342 us, combine 7 + 2.64791 us,
    TP all-gather 1 + 1/2 * 262,144 / 346.5e9 = 1 + 0.37828 us; the all-reduce it replaces is
    the one the per-layer term counts, vLLM's fused kernel on H100 at tp 2 (catalog
    serving_allreduce: 3.76 us measured at 262,144 B, 131,072 bf16 elements): the exchange
    9.81342 + 9.64791 + 1.37828 = 20.83961 us, and 3.76 us off the layer's all-reduces
    (17.07961 us net, as one term, before the two were reported apart).
    The listing moves the MoE layers' after-MLP all-reduces to the TP all-gather (48 of them
    per prefill)."""
    model = resolve_model("qwen3-30b-a3b")
    cluster = resolve_cluster("1x8xH100")
    layout = Layout(2, 1, 4, 8)
    assert sequence_parallel_moe(layout) and not sequence_parallel_moe(Layout(1, 1, 8, 8))
    assert not sequence_parallel_moe(Layout(8, 1, 1, 8))
    placement = place(cluster, layout)
    assert ep_exchange_seconds_per_moe_layer(model, cluster, layout, placement, 64) == pytest.approx(20.83961e-6, rel=1e-5)
    from planner.cost.serving_time import ep_exchange_parts

    exchange, replaced = ep_exchange_parts(model, cluster, layout, placement, 64)
    assert (exchange - replaced) == pytest.approx(17.07961e-6, rel=1e-5)
    assert replaced == pytest.approx(3.76e-6, rel=1e-3)
    listed = {(c.phase, c.name): c for c in serving_collectives(model, cluster, layout, placement, 64, 1, 48, 1024)}
    assert listed["prefill", "after MLP"].count_per_step == 0
    assert listed["prefill", "after attention"].count_per_step == 48
    assert listed["prefill", "MoE output"].count_per_step == 48
    assert listed["prefill", "MoE output"].kind == "all-gather"
    assert listed["decode", "MoE dispatch"].message_bytes == 1_114_112


def test_a_measured_alltoall_curve_leaves_vllms_exchange_alone(tmp_path):
    """A profile whose probe measured the 8-GPU intra-node all-to-all: vLLM's default EP path
    runs an all-gather and a reduce-scatter, not an all-to-all, so the serving exchange is
    the same with and without the curve (training's Megatron all-to-all reads it)."""
    from planner.catalog import load_cluster

    base = ("name: m\nnum_nodes: 1\ngpus_per_node: 8\ngpu: H100\n"
            "intra_node: {kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 1}\n"
            "measured:\n  alltoall_curves:")
    (tmp_path / "curve.yaml").write_text(
        base + "\n  - {link: intra_node, num_ranks: 8, sizes_bytes: [1048576, 4194304], median_seconds: [3.0e-5, 6.0e-5]}\n")
    (tmp_path / "none.yaml").write_text(base + " []\n")
    measured, plain = load_cluster(tmp_path / "curve.yaml"), load_cluster(tmp_path / "none.yaml")
    assert measured.alltoall_curve("intra_node", 8) is not None
    model = resolve_model("qwen3-30b-a3b")
    layout = Layout(1, 1, 8, 8)
    assert ep_exchange_seconds_per_moe_layer(model, measured, layout, place(measured, layout), 64) == pytest.approx(
        ep_exchange_seconds_per_moe_layer(model, plain, layout, place(plain, layout), 64), rel=1e-12)


def test_measured_allgather_and_reduce_scatter_curves_price_vllms_exchange(tmp_path):
    """A profile whose probe measured the 8-GPU intra-node all-gather (1 MiB -> 20 us, 4 MiB ->
    40 us) and reduce-scatter (1 MiB -> 10 us, 4 MiB -> 40 us): Qwen3-30B-A3B at tp=1 dp=8 ep=8
    with 64 tokens per rank gathers S = 2,228,224 B and scatters S = 2,097,152 B (2 MiB), read
    log-log off the curves: 20 * (2,228,224 / 1 MiB)**(log 2 / log 4) = 20 * 2.125**0.5 =
    29.155 us, and 10 * 2**(log 4 / log 4) = 20 us; 49.155 us, both listed as measured."""
    from planner.catalog import load_cluster

    path = tmp_path / "measured.yaml"
    path.write_text(
        "name: m\nnum_nodes: 1\ngpus_per_node: 8\ngpu: H100\n"
        "intra_node: {kind: nvlink, bandwidth_gb_per_s: 450, latency_us: 1}\n"
        "measured:\n"
        "  allgather_curves:\n"
        "  - {link: intra_node, num_ranks: 8, sizes_bytes: [1048576, 4194304], median_seconds: [2.0e-5, 4.0e-5]}\n"
        "  reduce_scatter_curves:\n"
        "  - {link: intra_node, num_ranks: 8, sizes_bytes: [1048576, 4194304], median_seconds: [1.0e-5, 4.0e-5]}\n")
    cluster = load_cluster(path)
    model = resolve_model("qwen3-30b-a3b")
    layout = Layout(1, 1, 8, 8)
    placement = place(cluster, layout)
    expected = 20e-6 * (2_228_224 / MIB) ** 0.5 + 20e-6
    assert ep_exchange_seconds_per_moe_layer(model, cluster, layout, placement, 64) == pytest.approx(expected, rel=1e-9)
    assert expected == pytest.approx(49.155e-6, rel=1e-4)
    listed = [c for c in serving_collectives(model, cluster, layout, placement, 64, 1, 48, 1024) if c.phase == "decode"]
    assert {(c.name, c.source) for c in listed} == {("MoE dispatch", "measured"), ("MoE combine", "measured")}
    from planner.render.serve import ep_exchange_source
    from planner.serve import estimate

    result = estimate(model, cluster, layout, ServeRequest(max_model_len=4096, batch=64))
    assert ep_exchange_source(result) == "measured"
    plain = resolve_cluster("1x8xH100")
    assert ep_exchange_source(estimate(model, plain, layout, ServeRequest(max_model_len=4096, batch=64))) == "model"
    assert ep_exchange_source(estimate(model, plain, Layout(8, 1, 1, 8), ServeRequest(max_model_len=4096))) is None


def test_dp_ranks_of_an_ep_group_step_in_lockstep():
    """An EP group of d DP ranks steps together (vLLM's per-step DP sync and every MoE layer's
    all-gather): d = ep / tp; 1 when EP stays in one TP group, without EP, for dense models
    (continuous_batching.steady_state prices the busiest rank: test_continuous_batching)."""
    from planner.serve import lockstep_ranks

    moe, dense = resolve_model("qwen3-30b-a3b"), resolve_model("llama-3.1-8b")
    assert lockstep_ranks(moe, Layout(1, 1, 8, 8)) == 8
    assert lockstep_ranks(moe, Layout(2, 1, 4, 8)) == 4
    assert lockstep_ranks(moe, Layout(8, 1, 1, 8)) == 1
    assert lockstep_ranks(moe, Layout(1, 1, 8)) == 1
    assert lockstep_ranks(dense, Layout(1, 1, 8)) == 1


def test_busiest_gpu_reads_more_experts_than_the_mean_one_by_hand():
    """Mixtral-8x7B over 4 GPUs (2 experts each), one token choosing 2 of 8: each expert is
    chosen with p = 1/4; a GPU's count is Binomial(2, 1/4): F(0) = 0.5625, F(1) = 0.9375; the
    busiest of 4: (1 - 0.5625^4) + (1 - 0.9375^4) = 0.89988 + 0.22752 = 1.12741 experts,
    against 2 x 1/4 = 0.5 on the mean GPU. So the step's expert read is 1.127 experts' bytes."""
    from planner.catalog import resolve_model as model_named
    from planner.cost.serving_time import (
        busiest_gpu_experts_touched,
        local_expert_bytes,
        routed_expert_bytes_read,
    )
    from planner.layout import Layout as L

    mixtral = model_named("mixtral-8x7b")
    assert busiest_gpu_experts_touched(mixtral, 2, 4, 1) == pytest.approx(1.1274109, rel=1e-6)
    layout = L(tp=1, pp=1, dp=4, ep=4)
    _, expert_bytes = local_expert_bytes(mixtral, layout)
    assert routed_expert_bytes_read(mixtral, layout, 0.25) == pytest.approx(1.1274109 * expert_bytes, rel=1e-6)
    # the routing known (the calibration's collectors): every GPU its share of the touched ones
    assert routed_expert_bytes_read(mixtral, layout, 0.25, touched_experts=2) == pytest.approx(0.5 * expert_bytes)


@given(st.integers(1, 64), st.integers(2, 64), st.floats(0.01, 5000))
def test_the_busiest_gpu_reads_between_the_mean_and_all(local, gpus, tokens):
    from planner.catalog import resolve_model as model_named
    from planner.cost.serving_time import busiest_gpu_experts_touched

    deepseek = model_named("deepseek-v3")
    p = 1 - (1 - 8 / 256) ** tokens
    busiest = busiest_gpu_experts_touched(deepseek, local, gpus, tokens)
    assert local * p * (1 - 1e-9) <= busiest <= local * (1 + 1e-9)
    assert busiest <= busiest_gpu_experts_touched(deepseek, local, gpus + 1, tokens) + 1e-9


@given(st.integers(1, 64), st.integers(2, 64), st.floats(0.01, 5000))
def test_the_busiest_gpu_is_the_binomial_maximum_summed_term_by_term(local, gpus, tokens):
    """E[max of G Binomial(l, p)] = sum over x < l of 1 - F(x)^G, F from math.comb term by term
    (no recurrence, no early stop): the planner's recurrence, which stops once F reaches 1, agrees."""
    import math

    from planner.catalog import resolve_model as model_named
    from planner.cost.serving_time import busiest_gpu_experts_touched

    deepseek = model_named("deepseek-v3")
    p = 1 - (1 - 8 / 256) ** tokens
    cdf, expected = 0.0, 0.0
    for x in range(local):
        cdf += math.comb(local, x) * p**x * (1 - p) ** (local - x)
        expected += 1 - min(cdf, 1.0) ** gpus
    assert busiest_gpu_experts_touched(deepseek, local, gpus, tokens) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@given(st.sampled_from([2, 4, 8, 16, 32, 64]), st.floats(1.0, 64.0))
def test_the_busiest_gpu_gets_at_most_min_ep_and_e_over_k_times_the_mean(ep, imbalance):
    """Qwen3-235B (128 experts, top 8): a GPU holds 128/ep experts, so each token sends it at most
    min(8, 128/ep) of its 8 choices against the mean 8/ep: min(ep, 16) times the mean. At ep 8,
    --expert-imbalance 20 prices 8; at ep 32, 16."""
    from planner.cost.moe import max_expert_load_factor

    model = resolve_model("qwen3-235b-a22b-fp8")
    layout = Layout(1, 1, ep, ep)
    factor = expert_load_factor(layout, imbalance, model)
    assert factor == min(imbalance, ep, 16) == min(imbalance, max_expert_load_factor(ep, model))
    assert expert_load_factor(Layout(1, 1, 8, 8), 20.0, model) == 8
    assert expert_load_factor(Layout(1, 1, 32, 32), 20.0, model) == 16
