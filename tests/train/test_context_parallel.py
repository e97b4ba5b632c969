"""Context parallelism for training, as Megatron-Core core_v0.19.0 runs it
(docs/cost-model.md#training-context-parallelism): the ring-attention KV exchange by hand,
activations at s/cp, memory never growing with cp, the long-sequence question, refusals."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.cost import efficiency
from planner.cost.training_time import cp_seconds_per_layer
from planner.layout import Rejected, TrainConfig, cp_group_ranks, place
from planner.requests import TrainRequest
from planner.train import TrainEstimate, estimate, memory_per_gpu, train_rates

LLAMA_8B = resolve_model("llama-3.1-8b")
PEAK = 989e12  # H100 SXM dense bf16
SUSTAINED = 0.93  # what a training step keeps of its kernels' rates (efficiency.TRAIN_SUSTAINED_RATE_FRACTION)
FLASH_FORWARD = SUSTAINED * PEAK * 0.61  # H100's catalog flash_attention_forward_fraction (AIConfigurator)
FLASH_BACKWARD = SUSTAINED * PEAK * 0.61 * 0.63 / 0.73  # scaled by FlashAttention-2's backward/forward ratio


def config(tp: int, cp: int, dp: int, pp: int = 1, b: int = 1, recompute: str = "none",
           zero: int = 1) -> TrainConfig:
    return TrainConfig(tp, pp, dp, b, "1f1b", 1, recompute, tp > 1, zero, cp=cp)


def ring(cluster_name: str, c: TrainConfig, s: int):
    cluster = resolve_cluster(cluster_name)
    rates = train_rates(LLAMA_8B, cluster)
    return cp_seconds_per_layer(LLAMA_8B, c, s // c.cp, place(cluster, c.layout), rates)


def test_ring_exchange_per_layer_inside_a_node_cp2_vs_cp4():
    """llama-3.1-8b (32 heads, 8 KV heads, d = 128) at tp = 2 on one H100 node, b = 1,
    s = 16,384: 4 KV heads and 16 query heads per GPU; NVLink 450 GB/s, 1 us.

    cp = 2 (ranks 0 and 2), chunk 8,192: KV chunk 2 * 8,192 * 4 * 128 * 2 = 16,777,216 B;
    send 1 us + 16,777,216 / 450e9 = 38.283 us forward, 1 us + 74.565 us = 75.565 us backward
    (KV and dKV). One step's attention: 4 * 8,192^2 * 128 * 16 / 2 = 274,877,906,944 FLOP,
    / (0.93 * 989e12 * 0.61) = 489.93 us forward, 2.5x / (0.93 * 989e12 * 0.61 * 0.63/0.73) =
    1.41923 ms backward (H100's catalog flash share, tests/train/test_fp8_kernels.py, at the 0.93
    a step sustains): every
    send hides. One step each way: 113.85 us sent, 0 exposed.

    cp = 4 (ranks 0, 2, 4, 6), chunk 4,096: 8,388,608 B, 19.641 us / 38.283 us per send, 3 steps
    each way = 173.77 us sent (1.5x the bytes of cp = 2), step attention 122.48 us / 354.81 us:
    still 0 exposed."""
    two = ring("1x8xH100", config(2, 2, 2), 16384)
    assert two.kv_chunk_bytes == 2 * 8192 * 4 * 128 * 2 == 16_777_216
    assert two.send_seconds == pytest.approx(1e-6 + 16_777_216 / 450e9, rel=1e-12)
    assert two.send_seconds == pytest.approx(38.283e-6, rel=1e-4)
    assert two.step_forward_seconds == pytest.approx(274_877_906_944 / FLASH_FORWARD, rel=1e-9)
    assert two.step_forward_seconds == pytest.approx(489.93e-6, rel=1e-4)
    assert two.step_backward_seconds == pytest.approx(1.41923e-3, rel=1e-4)
    assert two.total == pytest.approx(113.848e-6, rel=1e-4)
    assert two.exposed == 0.0 and two.link == "nvlink"

    four = ring("1x8xH100", config(2, 4, 1), 16384)
    assert four.kv_chunk_bytes == 8_388_608
    assert four.send_seconds == pytest.approx(19.641e-6, rel=1e-4)
    assert four.step_forward_seconds == pytest.approx(two.step_forward_seconds / 4, rel=1e-12)
    assert four.total == pytest.approx(3 * (19.6414e-6 + 38.2827e-6), rel=1e-4)
    assert four.exposed == 0.0
    assert cp_group_ranks(config(2, 4, 1).layout) == [0, 2, 4, 6]


def test_ring_exchange_across_nodes_is_partly_exposed():
    """tp = 8, cp = 2 on 2x8xH100, s = 8,192: the CP pair is ranks 0 and 8, one per node, so
    the ring runs on each GPU's NIC share, 50 GB/s, 5 us. 1 KV head per GPU, chunk 4,096:
    2 * 4,096 * 1 * 128 * 2 = 2,097,152 B; send 5 + 41.943 = 46.943 us forward, 5 + 83.886 =
    88.886 us backward. Attention per step 4 * 4,096^2 * 128 * 4 / 2 = 17,179,869,184 FLOP:
    30.620 us forward, 88.702 us backward (H100's catalog flash share 0.61, backward x 0.63/0.73,
    both at the 0.93 a step sustains). Exposed (46.943 - 30.620) + (88.886 - 88.702) = 16.51 us
    per layer and micro-batch; full recompute adds the forward's 16.32 us again."""
    cross = ring("2x8xH100", config(8, 2, 1), 8192)
    assert cross.link == "infiniband"
    assert cross.kv_chunk_bytes == 2_097_152
    forward = 5e-6 + 2_097_152 / 50e9 - 17_179_869_184 / FLASH_FORWARD
    backward = 5e-6 + 2 * 2_097_152 / 50e9 - 2.5 * 17_179_869_184 / FLASH_BACKWARD
    assert cross.exposed == pytest.approx(forward + backward, rel=1e-6)
    assert cross.exposed == pytest.approx(16.507e-6, rel=1e-3)
    again = ring("2x8xH100", config(8, 2, 1, recompute="full"), 8192)
    assert again.exposed == pytest.approx(cross.exposed + forward, rel=1e-9)


def test_torchtitan_gathers_kv_behind_one_step():
    """torchtitan keeps torch's all-gather rotation: tp = 2, cp = 4 on one H100 node, s =
    16,384 (the second case above): sends of S = 8,388,608 B take 19.641 us; the forward
    gathers 3 of them back to back, 58.92 us, behind one step's attention (122.48 us); the
    backward gathers KV again (58.92 us behind 354.81 us) and passes dKV in 3 ring steps of S:
    58.92 + 58.92 + 58.92 = 176.77 us sent, nothing exposed. Across nodes (tp = 8, cp = 2,
    2x8xH100, s = 8,192: one send of 46.943 us forward, steps 30.620 / 88.702 us): the gather
    is one send, so it exposes 16.323 us forward as the ring does, and the backward's dKV send
    of S (not 2S as TE's KV + dKV) hides: 16.323 us in all (the ring: 16.51)."""
    cluster = resolve_cluster("1x8xH100")
    c = config(2, 4, 1)
    rates = train_rates(LLAMA_8B, cluster)
    gathered = cp_seconds_per_layer(LLAMA_8B, c, 16384 // 4, place(cluster, c.layout), rates, "allgather")
    assert gathered.total == pytest.approx(9 * gathered.send_seconds, rel=1e-12)
    assert gathered.total == pytest.approx(176.77e-6, rel=1e-4)
    assert gathered.exposed == 0.0
    cross_cluster = resolve_cluster("2x8xH100")
    c = config(8, 2, 1)
    cross = cp_seconds_per_layer(LLAMA_8B, c, 4096, place(cross_cluster, c.layout),
                                 train_rates(LLAMA_8B, cross_cluster), "allgather")
    forward = 5e-6 + 2_097_152 / 50e9 - 17_179_869_184 / FLASH_FORWARD
    assert cross.exposed == pytest.approx(forward, rel=1e-6)
    assert cross.exposed == pytest.approx(16.323e-6, rel=1e-3)


def test_no_cp_no_ring():
    assert ring("1x8xH100", config(8, 1, 1), 8192).total == 0.0


def test_activations_per_gpu_halve_with_cp2():
    """tp = 2, pp = 1, b = 1, s = 16,384, m = 2 micro-batches, dp*cp = 4 either way: every
    activation term is linear in the tokens a rank holds (flash attention keeps no s x s
    scores), so s/2 per rank halves them; weights are replicated over cp and ZeRO-1 shards the
    optimizer over dp*cp = 4 both times."""
    one = memory_per_gpu(LLAMA_8B, config(2, 1, 4), 16384, 2)
    two = memory_per_gpu(LLAMA_8B, config(2, 2, 2), 16384, 2)
    assert two.activation_bytes == pytest.approx(one.activation_bytes / 2, rel=1e-12)
    assert two.weights_bytes == one.weights_bytes
    assert two.optimizer_bytes == one.optimizer_bytes


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    replicas=st.sampled_from([4, 8, 16]),
    b=st.sampled_from([1, 2]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    zero=st.sampled_from([0, 1]),
    seq_len=st.sampled_from([8192, 32768]),
)
def test_memory_per_gpu_never_grows_with_cp(tp, pp, replicas, b, recompute, zero, seq_len):
    """Same GPUs (dp * cp = replicas), same global batch: doubling cp halves what each rank
    holds per micro-batch and at most doubles the micro-batches in flight (m = B/(b*dp)), and
    model states shard over dp*cp either way, so activations never grow; the total never grows
    but for the one NCCL communicator CP adds going from cp = 1 to 2."""
    global_batch = 64
    previous = None
    cp = 1
    while cp <= replicas:
        mem = memory_per_gpu(LLAMA_8B, config(tp, cp, replicas // cp, pp, b, recompute, zero), seq_len,
                             global_batch // (b * (replicas // cp)))
        if previous is not None:
            assert mem.activation_bytes <= previous.activation_bytes * (1 + 1e-12)
            allowance = efficiency.NCCL_BUFFER_BYTES_LARGER if cp == 2 else 0
            assert mem.total_bytes <= previous.total_bytes + allowance + 1e-6
        previous, cp = mem, cp * 2


def test_megatron_rules_refuse_what_it_would():
    """s divisible by 2*cp (arguments.py), CP only in TE's attention (flash here)."""
    cluster = resolve_cluster("1x8xH100")
    odd = estimate(LLAMA_8B, cluster, config(2, 4, 1), TrainRequest(global_batch=8, seq_len=8196))
    assert isinstance(odd, Rejected) and "2*cp = 8" in odd.reasons[0]
    unfused = estimate(LLAMA_8B, cluster, replace(config(2, 2, 2), attention="materialized"),
                       TrainRequest(global_batch=8, seq_len=8192, attention="materialized"))
    assert isinstance(unfused, Rejected) and "flash" in unfused.reasons[0]
    fine = estimate(LLAMA_8B, cluster, config(2, 2, 2), TrainRequest(global_batch=8, seq_len=8192))
    assert isinstance(fine, TrainEstimate) and fine.layer_terms.cp.link == "nvlink"


def plan_json(*args: str) -> dict:
    result = CliRunner().invoke(app, ["--workload", "train", "--json", "--top", "5", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_long_sequences_choose_context_parallelism():
    """llama-3.1-70b at 131,072 tokens on 32x8xH100: without CP each micro-batch's activations
    (or full recompute) dominate; the plan splits the sequence (cp > 1), emits
    --context-parallel-size and --cp-comm-type p2p, and reports the ring's time."""
    out = plan_json("--model", "llama-3.1-70b", "--cluster", "32x8xH100", "--global-batch", "64",
                    "--seq-len", "131072")
    best = out["recommended"]
    assert best["cp"] > 1
    assert best["tp"] * best["cp"] * best["pp"] * best["dp"] == 256
    assert best["time_breakdown_seconds"]["cp_comm"] >= 0.0 and best["cp_comm_seconds_per_layer"] > 0.0
    argv = best["command"][0]["argv"]
    assert argv[argv.index("--context-parallel-size") + 1] == str(best["cp"])
    assert argv[argv.index("--cp-comm-type") + 1] == "p2p"


def test_short_sequences_keep_cp_1():
    """At 4,096 tokens CP is not searched (less than 4,096 tokens per rank at cp = 2)."""
    out = plan_json("--model", "llama-3.1-70b", "--cluster", "32x8xH100", "--global-batch", "512",
                    "--seq-len", "4096")
    assert out["recommended"]["cp"] == 1
    assert "--context-parallel-size" not in out["recommended"]["command"][0]["argv"]


def test_cp_options_below_the_chunk_floor_only_where_the_batch_starves_the_pipelines():
    """4,096 tokens: cp = 2 leaves 2,048 a rank, under MIN_CP_CHUNK_TOKENS, so with 512 sequences
    over dp 2 * pp 8 = 16 nothing is added; with 8 sequences over dp 2 * pp 8 each pipeline gets
    4 for its 8 stages, and cp = 2 (2,048 a rank) is tried; cp = 4 (1,024) needs dp divisible
    by 4."""
    from planner.train_search import cp_options

    assert cp_options(TrainRequest(global_batch=512, seq_len=4096), 2, 8) == []
    assert cp_options(TrainRequest(global_batch=8, seq_len=4096), 2, 8) == [2]
    assert cp_options(TrainRequest(global_batch=8, seq_len=4096), 4, 8) == [2, 4]
    assert cp_options(TrainRequest(global_batch=8, seq_len=4096), 8, 8) == [2, 4]


def test_a_small_batch_keeps_tp_in_the_node_through_cp():
    """Llama-3.1-70B on 16x8 H100 at 8 sequences of 4,096 tokens: the batch caps dp * (sequences
    per pipeline), so without CP below 8K tokens the plan recommended tp=16 over InfiniBand; with
    it, TP stays inside the node and cp = 2 takes the ranks."""
    out = plan_json("--model", "llama-3.1-70b", "--cluster", "16x8xH100", "--global-batch", "8",
                    "--seq-len", "4096")
    best = out["recommended"]
    assert best["tp"] <= 8 and best["cp"] == 2


def test_materialized_attention_bounded_search_refuses_cp_layouts_without_bounding_them():
    """Mixtral-8x7B on 128x8 A100 at 120 sequences of 4,096 tokens with --attention materialized:
    the batch starves the pipelines, so cp = 2 layouts are candidates (cp_options), and the
    bounded search (hundreds of layouts) orders them by a step-time floor that needs a block
    time, which CP without flash has none of (cp_reasons). They rank last (layout_promise
    infinite) and are refused with the reason; the plan is all cp = 1. This crashed once."""
    out = plan_json("--model", "mixtral-8x7b", "--cluster", "128x8xA100", "--global-batch", "120",
                    "--seq-len", "4096", "--attention", "materialized", "--show-rejected")
    assert {lay["cp"] for lay in out["layouts"]} == {1}
    refused = [r for r in out["rejected"] if r["cp"] > 1]  # some first for the batch or layers (structural)
    assert refused and all(any("needs flash attention" in why or "not divisible by" in why
                               for why in r["reasons"]) for r in refused)
    assert any("needs flash attention" in why for r in refused for why in r["reasons"])


def test_layout_cp_fixes_the_degree_and_serving_refuses_it():
    out = plan_json("--model", "llama-3.1-8b", "--cluster", "2x8xH100", "--global-batch", "16",
                    "--seq-len", "16384", "--layout", "tp=4,cp=4")
    assert {(lay["tp"], lay["cp"]) for lay in out["layouts"]} == {(4, 4)}
    serve = CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--layout", "cp=2"])
    assert serve.exit_code == 2 and "training degree" in serve.output


def test_explain_shows_the_cp_groups_and_the_ring():
    """explain --workload train reads the estimate's ring (layer_terms.cp): the CP group's
    ranks at stride tp, the ring's sends per layer, gradients over dp*cp."""
    result = CliRunner().invoke(app, ["explain", "--workload", "train", "--model", "llama-3.1-8b",
                                      "--cluster", "2x8xH100", "--global-batch", "16", "--seq-len", "16384",
                                      "--layout", "tp=4,cp=4", "--no-sensitivity"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "CP 4: each sequence split over 4 ranks at stride tp=4" in text
    assert "ranks 0, 4, 8, 12" in text
    assert "ring: next KV chunk" in text and "ring: KV and dKV" in text
