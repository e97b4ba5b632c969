"""Hand-worked numbers for the serving cost model (planner/serve.py), arithmetic in
each docstring. Shapes from the shipped specs (Hugging Face config.json values):

llama-3.1-8b:  L=32, h=4096, a=32, k=8, d=128, f=14336, V=128256, untied, bf16.
llama-3.1-70b: L=80, h=8192, a=64, k=8, d=128, f=28672, V=128256, untied, bf16.
"""

from __future__ import annotations

import pytest

from planner.cost.params import kv_bytes_per_token_per_gpu
from planner.cost.pipeline import serving_stage_utilization
from planner.cost.serving_memory import stage_layer_counts, stage_memory
from planner.cost.serving_time import (
    StepLoad,
    causal_pairs,
    engine_step_seconds,
    expected_experts_touched,
    pipeline_hop_seconds,
    round_time,
    serving_bubble_fraction,
    stage_step_time,
    tp_allreduce_seconds_per_layer,
)
from planner.layout import Layout, place
from planner.requests import ServeRequest
from planner.serve import ServeEstimate, estimate

from .conftest import ring_only

# ---------------------------------------------------------------- stage split (vLLM get_pp_indices)


@pytest.mark.parametrize(
    ("num_layers", "pp", "expected"),
    [
        (126, 4, [31, 32, 32, 31]),  # 126 // 4 = 31, 2 extra -> stages 2, 1
        (80, 3, [27, 27, 26]),  # 80 // 3 = 26, 2 extra -> stages 1, 0
        (126, 8, [15, 16, 16, 16, 16, 16, 16, 15]),  # 15, 6 extra -> stages 6..1
        (80, 2, [40, 40]),
        (80, 1, [80]),
        # vLLM's own tests/distributed/test_pipeline_partition.py::test_uneven_auto_partition
        (3, 2, [2, 1]),
        (4, 3, [1, 2, 1]),
        (5, 3, [2, 2, 1]),
    ],
)
def test_stage_layer_counts_follow_vllm_get_pp_indices(num_layers, pp, expected):
    """L // p layers each; the L % p extra layers go to the stages counted back from the
    second-to-last (stage p-2, p-3, ...), never to the last, which also holds the LM head."""
    assert stage_layer_counts(num_layers, pp) == expected
    assert sum(expected) == num_layers


# ---------------------------------------------------------------- weights per GPU per stage


def test_weight_bytes_per_gpu_per_stage_70b_tp8_pp2(model, cluster):
    """llama-3.1-70b, tp=8, pp=2, bf16 (2 bytes per parameter).

    One layer: attention Q h*a*d = 8192*8192 = 67,108,864; K,V 2*h*k*d = 16,777,216;
    O 67,108,864 -> 150,994,944. MLP 3*h*f = 3*8192*28672 = 704,643,072. Norms 2h = 16,384.
    Per GPU at t=8 (k = t: one KV head each, nothing replicated): the matmuls / 8 =
    855,638,016 / 8 = 106,954,752, norms whole 16,384 -> 106,971,136 params = 213,942,272 B.
    Stage 0: 40 layers = 8,557,690,880 + embedding V*h/t*2 = 128256*8192/8*2 = 262,668,288
             -> 8,820,359,168 B.
    Stage 1: 40 layers + LM head 262,668,288 + final norm h*2 = 16,384 -> 8,820,375,552 B.
    """
    stages = stage_memory(
        model("llama-3.1-70b"),
        cluster("2x8xA100"),
        Layout(8, 2, 1),
        ServeRequest(max_model_len=8192),
        max_num_seqs=256,
    )
    assert [s.num_layers for s in stages] == [40, 40]
    assert stages[0].weights_bytes == 8_820_359_168
    assert stages[1].weights_bytes == 8_820_375_552


def test_uneven_split_puts_the_extra_layers_before_the_last_stage(model, cluster):
    """llama-3.1-405b over pp=4: [31, 32, 32, 31] layers; the middle stages are heaviest
    by one layer, less the embedding/LM head the ends carry (V*h*2/t = 128256*16384*2/8
    = 525 MB, while a 405B layer at t=8 is about 800 MB)."""
    stages = stage_memory(
        model("llama-3.1-405b"),
        cluster("4x8xH100"),
        Layout(8, 4, 1),
        ServeRequest(max_model_len=8192),
        max_num_seqs=256,
    )
    assert [s.num_layers for s in stages] == [31, 32, 32, 31]
    assert stages[1].weights_bytes == stages[2].weights_bytes
    layer = stages[1].weights_bytes / 32
    embedding = 128256 * 16384 * 2 / 8
    assert stages[0].weights_bytes == pytest.approx(31 * layer + embedding, rel=1e-12)
    assert stages[1].weights_bytes > stages[0].weights_bytes


# ---------------------------------------------------------------- KV bytes per token per GPU


@pytest.mark.parametrize(
    ("tp", "num_layers", "kv_dtype", "expected"),
    [
        (1, 80, "auto", 327_680),  # 2 * 80 * 8 heads * 128 * 2 B = 320 KiB, whole model
        (8, 80, "auto", 40_960),  # k/t = 1 head per GPU: 2*80*1*128*2
        (16, 80, "auto", 40_960),  # t > k: replicated, still 1 head per GPU (not 1/2)
        (8, 80, "fp8", 20_480),  # fp8 KV: 1 byte per element halves it
        (8, 40, "auto", 20_480),  # a pp=2 stage holds half the layers
        (4, 80, "auto", 81_920),  # 2 heads per GPU
    ],
)
def test_kv_bytes_per_token_per_gpu_gqa_70b(model, tp, num_layers, kv_dtype, expected):
    """2 (K and V) * L_s * max(1, k/t) * d * bytes, llama-3.1-70b (k = 8, d = 128)."""
    assert kv_bytes_per_token_per_gpu(model("llama-3.1-70b"), num_layers, tp, kv_dtype) == expected


def test_kv_cache_tokens_are_whole_16_token_blocks(model, cluster):
    """vLLM allocates the KV cache in 16-token blocks: tokens = blocks * 16, and no more
    than the free bytes hold."""
    stages = stage_memory(
        model("llama-3.1-70b"),
        cluster("1x2xA100"),
        Layout(2, 1, 1),
        ServeRequest(max_model_len=8192),
        max_num_seqs=256,
    )
    s = stages[0]
    assert s.kv_cache_tokens % 16 == 0
    assert s.kv_cache_tokens * s.kv_bytes_per_token <= s.kv_cache_bytes
    assert (s.kv_cache_tokens + 16) * s.kv_bytes_per_token > s.kv_cache_bytes


# ---------------------------------------------------------------- TP all-reduce at decode


def _allreduce(cluster_spec, tp: int, pp: int, message_bytes: float) -> tuple[float, str | None]:
    layout = Layout(tp, pp, cluster_spec.num_gpus // (tp * pp))
    placement = place(cluster_spec, layout)
    seconds, _ = tp_allreduce_seconds_per_layer(cluster_spec, layout, placement, message_bytes)
    return seconds, None if placement.tp_link is None else placement.tp_link.kind


def test_allreduce_one_rank_is_zero(cluster):
    """tp = 1: nothing to combine, no link, 0 seconds."""
    assert _allreduce(cluster("2x8xA100"), 1, 1, 1e6) == (0.0, None)


def test_allreduce_inside_a_node_by_hand(cluster):
    """2x8xA100, tp=8 (one node, NVLink 300 GB/s per GPU, alpha 1 us; NCCL's ring model,
    ring_only), decode batch 256 of
    llama-3.1-70b: S = 256 * 8192 * 2 B = 4,194,304 B. The datasheet link runs at NCCL's
    measured busbw fraction 0.77: beta = 231 GB/s. One ring all-reduce:
    2(n-1)*alpha + 2(n-1)/n * S/beta = 14 us + 1.75 * 4,194,304 / 231e9 = 14 + 31.78 us
    = 45.78 us; two per layer (after attention and after the MLP) = 91.55 us."""
    seconds, link = _allreduce(ring_only(cluster("2x8xA100")), 8, 1, 256 * 8192 * 2)
    assert link == "nvlink"
    assert seconds == pytest.approx(2 * (14e-6 + 1.75 * 4_194_304 / 231e9), rel=1e-12)
    assert seconds == pytest.approx(91.55e-6, rel=1e-3)


@pytest.mark.parametrize(("bandwidth_gb_per_s", "source"), [(450.0, "fused"), (300.0, "fused"), (200.0, "model"),
                                                          (2.3, "model")])
def test_engine_allreduce_curves_only_on_the_fabric_they_were_measured_on(cluster, bandwidth_gb_per_s, source):
    """The catalog's vLLM all-reduce curves were measured on DGX H100 NVLink (450 GB/s a GPU). A
    profile whose NVLink is a factor 2 or more slower (H800's 200, the 2.3 GB/s host path a CPU
    probe merged into an H100 profile) got DGX timings all the same; it is priced on its own
    link now, and a real node's NCCL-measured 300-480 GB/s keeps the curves."""
    h100 = cluster("1x8xH100")
    slower = h100.model_copy(update={"intra_node": h100.intra_node.model_copy(
        update={"bandwidth_gb_per_s": bandwidth_gb_per_s})})
    layout = Layout(4, 1, 2)
    _, priced = tp_allreduce_seconds_per_layer(slower, layout, place(slower, layout), 8 * 8192 * 2)
    assert priced == source


def test_allreduce_crossing_nodes_is_slower_by_hand(cluster):
    """Same message over tp=16 on 2x8xA100: the ring crosses InfiniBand, whose per-GPU
    share is 8 x 200 Gb/s / 8 GPUs = 25 GB/s (x 0.77 busbw = 19.25 GB/s), alpha 5 us:
    2 * (30 * 5 us + 2*15/16 * 4,194,304 / 19.25e9) = 2 * (150 + 408.5) us = 1117 us,
    about 12x the tp=8 ring inside the node."""
    spec = cluster("2x8xA100")
    inside, _ = _allreduce(spec, 8, 1, 256 * 8192 * 2)
    across, link = _allreduce(spec, 16, 1, 256 * 8192 * 2)
    assert link == "infiniband"
    assert across == pytest.approx(2 * (30 * 5e-6 + 30 / 16 * 4_194_304 / 19.25e9), rel=1e-12)
    assert across > 10 * inside


def test_decode_allreduce_message_is_batch_times_hidden_times_two(model, cluster):
    """The planner's decode message: one in-flight batch * h * 2 B. llama-3.1-70b on
    2x8xA100, tp=8 pp=1 dp=2, --batch 64: 64 * 8192 * 2 = 1,048,576 B; NVLink at 0.77 busbw
    (NCCL's ring model, ring_only)."""
    result = estimate(model("llama-3.1-70b"), ring_only(cluster("2x8xA100")), Layout(8, 1, 2),
                      ServeRequest(batch=64, max_model_len=8192))
    assert isinstance(result, ServeEstimate)
    assert result.allreduce_message_bytes == 1_048_576
    assert result.tp_allreduce_seconds_per_layer == pytest.approx(
        2 * (14e-6 + 1.75 * 1_048_576 / 231e9), rel=1e-12
    )


# ---------------------------------------------------------------- one engine step (decode, prompt chunk)


def _eight_b_step(model, cluster, load: StepLoad):
    m, c = model("llama-3.1-8b"), cluster("1x1xH100")
    layout = Layout(1, 1, 1)
    stage = stage_memory(m, c, layout, ServeRequest(max_model_len=8192), max_num_seqs=256)[0]
    return stage_step_time(m, c, layout, place(c, layout), stage, load), stage


def test_decode_step_memory_bound_8b_h100_batch_1(model, cluster):
    """llama-3.1-8b on one H100-SXM (3350 GB/s HBM; the layers' bf16 weights stream at the
    catalog's measured 0.90, the LM head and the KV cache at 0.76; vLLM's 56 us fixed cost per
    layer per step), one sequence at context 1152.

    Weights: per layer 41,943,040 attention + 176,160,768 MLP + 8,192 norms = 218,112,000;
    * 32 = 6,979,584,000; + embedding 525,336,576 + LM head 525,336,576 + final norm 4,096
    = 8,030,261,248 params = 16,060,522,496 B. A decode step reads all of it except the
    embedding table (it gathers one row): 16,060,522,496 - 1,050,673,152 = 15,009,849,344 B:
    the LM head and final norm 1,050,681,344 B at 0.76 -> 0.4127 ms, the rest 13,959,168,000 B
    at 0.90 -> 4.6299 ms. KV: 1152 tokens read + 1 written * 131,072 B = 151,126,016 B
    -> 0.0594 ms. Norms, rotary and SwiGLU: 16 * 4096 + 4 * (32 + 8) * 128 + 6 * 14336 =
    172,032 B per token per layer, * 32 layers = 5,505,024 B at the H100's elementwise 0.90 of
    3350 GB/s = 1.83 us. Step = 0.4127 + 4.6299 + 0.0594 + 0.0018 + 32 * 56 us = 6.896 ms (the
    GEMMs at M = 1 row: 16.06e9 FLOP at 794 TFLOP/s * u(1) = 1/129 would take 2.4 ms, below the
    read)."""
    step, stage = _eight_b_step(model, cluster, StepLoad(1, 1152))
    assert stage.weights_bytes == 16_060_522_496
    assert step.bound == "memory"
    hbm = 3350e9 * 0.76
    weights = 1_050_681_344 / hbm + 13_959_168_000 / (3350e9 * 0.90)
    elementwise = 32 * 172_032 / (3350e9 * 0.90)
    assert step.gemm_seconds == pytest.approx(weights, rel=1e-9)
    assert step.attention_seconds == pytest.approx(1153 * 131_072 / hbm, rel=1e-9)
    assert step.elementwise_seconds == pytest.approx(elementwise, rel=1e-9)
    assert step.seconds == pytest.approx(weights + 1153 * 131_072 / hbm + elementwise + 32 * 56e-6, rel=1e-9)
    assert step.seconds == pytest.approx(6.896e-3, rel=1e-3)


def test_mixed_step_decode_plus_prompt_chunk_8b_h100(model, cluster):
    """The same GPU, 64 decoding sequences (context 1152 each) plus a 2,048-token prompt chunk
    that completes in this step: M = 2,112 rows.
    GEMMs per layer at M = 2112 (u(x) = x / (x + 128)): QKV 2112 x 6144 x 4096, O 2112 x 4096 x
    4096, up 2112 x 28672 x 4096, down 2112 x 4096 x 14336; their FLOP-weighted rate
    sum(F) / sum(F / (u(M) u(N) u(K))) = 0.9056 of the achievable 794 TFLOP/s.
    Linear FLOPs 2 * 6,979,584,000 * 2112 = 2.948e13; the LM head only for the 65 rows that
    sample (64 decodes + the prompt's last position): 2 * 128256 * 4096 * 65 = 6.829e10 at
    u(65) u(128256) u(4096) = 0.3263. Compute 41.00 + 0.264 = 41.27 ms: above the 5.9 ms read,
    so compute-bound. Attention: KV read (64 * 1152 + 2112 written) * 131,072 B / 2.546e12 =
    3.904 ms; the chunk's causal pairs 2048 * 2049 / 2 = 2,098,176, 4 * pairs * 32 heads *
    128 * 32 layers = 1.100e12 FLOP at the H100's measured flash share 0.61 of the 989 TFLOP/s
    peak = 1.823 ms. Norms, rotary, SwiGLU: 2112 * 32 * 172,032 B = 1.163e10 B at 0.90 of
    3350 GB/s = 3.856 ms. Step = 41.27 + 3.904 + 1.823 + 3.856 + 32 * 56 us = 52.65 ms."""
    load = StepLoad(64, 64 * 1152, 2048, causal_pairs(2048), 1)
    step, _ = _eight_b_step(model, cluster, load)
    dims = [(2112, 6144, 4096), (2112, 4096, 4096), (2112, 28672, 4096), (2112, 4096, 14336)]

    def u(x):
        return x / (x + 128)

    flops = [2 * m * n * k for m, n, k in dims]
    rate = sum(flops) / sum(f / (u(m) * u(n) * u(k)) for f, (m, n, k) in zip(flops, dims, strict=True))
    assert rate == pytest.approx(0.9056, abs=1e-4)
    head_u = u(65) * u(128256) * u(4096)
    compute = (2 * 6_979_584_000 * 2112 / rate + 2 * 128256 * 4096 * 65 / head_u) / 794e12
    hbm = 3350e9 * 0.76
    attention = (64 * 1152 + 2112) * 131_072 / hbm + 4 * 2_098_176 * 32 * 128 * 32 / (989e12 * 0.61)
    elementwise = 2112 * 32 * 172_032 / (3350e9 * 0.90)
    assert step.bound == "compute"
    assert step.gemm_seconds == pytest.approx(compute, rel=1e-9)
    assert step.attention_seconds == pytest.approx(attention, rel=1e-9)
    assert step.elementwise_seconds == pytest.approx(elementwise, rel=1e-9)
    assert step.seconds == pytest.approx(compute + attention + elementwise + 32 * 56e-6, rel=1e-9)
    assert step.seconds == pytest.approx(52.65e-3, rel=1e-3)


def test_prompt_attention_grows_quadratically(model, cluster):
    """A prompt alone in a step: linear 2 * 6.98e9 * s FLOP, causal attention 4 * s^2/2 * 32 *
    4096 at a lower rate. Doubling s from 16,384 to 32,768 more than doubles the step once
    the s^2 term matters."""
    short, _ = _eight_b_step(model, cluster, StepLoad(0, 0, 16384, causal_pairs(16384), 1))
    long, _ = _eight_b_step(model, cluster, StepLoad(0, 0, 32768, causal_pairs(32768), 1))
    assert 2.3 < long.seconds / short.seconds < 2.7


def test_causal_pairs():
    """A chunk of c tokens after o earlier ones: c*o + c*(c+1)/2. 4 tokens alone: 1+2+3+4 = 10;
    the same 4 after 6 others: 24 + 10 = 34; a prompt split in two chunks has the pairs of
    the whole: pairs(3) + pairs(3, 3) = 6 + 9 + 6 = 21 = pairs(6)."""
    assert causal_pairs(4) == 10
    assert causal_pairs(4, 6) == 34
    assert causal_pairs(3) + causal_pairs(3, 3) == causal_pairs(6) == 21


# ---------------------------------------------------------------- MoE


def test_expected_experts_touched_mixtral(model):
    """E * (1 - (1 - e/E)^n), E = 8, e = 2: n = 1 -> 8 * (1 - 0.75) = 2 (exactly the two it
    routes to); n = 2 -> 8 * (1 - 0.5625) = 3.5; n = 256 -> 8 * (1 - 0.75^256) = 8."""
    mixtral = model("mixtral-8x7b")
    assert expected_experts_touched(mixtral, 1) == pytest.approx(2.0)
    assert expected_experts_touched(mixtral, 2) == pytest.approx(3.5)
    assert expected_experts_touched(mixtral, 256) == pytest.approx(8.0)
    assert expected_experts_touched(model("llama-3.1-8b"), 256) == 1.0


# ---------------------------------------------------------------- serving bubble


@pytest.mark.parametrize(
    ("in_flight", "pp", "idle"), [(1, 4, 0.75), (2, 4, 0.5), (1, 2, 0.5), (4, 4, 0.0), (2, 2, 0.0)]
)
def test_serving_bubble_without_hops(in_flight, pp, idle):
    """k batches in flight over p stages of 1 time unit, no hop cost: a round takes
    max(k, p) units and each stage is busy k of them -> idle 1 - k/p (0 once k >= p)."""
    round_seconds = max(in_flight, pp) * 1.0
    assert serving_bubble_fraction(in_flight, pp, 1.0, round_seconds) == pytest.approx(idle)
    assert serving_stage_utilization(in_flight, pp) == pytest.approx(1 - idle)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_serving_bubble_when_fewer_batches_than_stages(serve_one, batch):
    """llama-3.1-70b over pp=4 on 1x4xH100: with k = batch < 4 sequences (one per in-flight
    batch) a round lasts at least one micro-batch's path through all four stages, so the
    busiest stage works k of its stage-times and idles the rest: more than 1 - k/4 less the
    spread between stages."""
    result = serve_one("llama-3.1-70b", "1x4xH100", (1, 4, 1), batch=batch, max_model_len=8192)
    assert isinstance(result, ServeEstimate)
    assert result.batches_in_flight == batch
    steps = [step.seconds for step in result.decode_steps]
    assert result.bubble_fraction >= 1 - batch * max(steps) / sum(steps) - 1e-12
    assert result.bubble_fraction > 0


def test_serving_bubble_near_zero_with_enough_batches(serve_one):
    """k >= p: in a decode-only round the stages stay busy; only the hops (tens of us against
    ~10 ms stages) idle. The reported bubble is over the mean round: a quarter of the rounds
    (64 clients, 256 output tokens: lambda * S_p = 64 / 256) carry a 1,024-token prompt chunk
    whose path through the 4 stages paces the round while the other stages wait on it, so it is
    well above the decode round's (mean_bubble_fraction)."""
    result = serve_one("llama-3.1-70b", "1x4xH100", (1, 4, 1), batch=64, max_model_len=8192)
    assert isinstance(result, ServeEstimate)
    assert result.batches_in_flight == 4
    decode_only = serving_bubble_fraction(4, 4, result.stage_step_seconds, result.steady.decode_round_seconds)
    assert 0 <= decode_only < 0.02
    assert 0.2 < result.bubble_fraction < 0.5


def test_no_bubble_without_pipeline(serve_one):
    """pp = 1: one step per round, the engine's step cost (0 + 10 us per sequence) then the GPU
    step."""
    result = serve_one("llama-3.1-70b", "1x4xH100", (4, 1, 1), batch=1, max_model_len=8192)
    assert result.bubble_fraction == 0.0
    lone = result.steady
    assert lone.decode_round_seconds == pytest.approx(result.stage_step_seconds + 0.0 + 10e-6 * lone.decode_seqs)


def seventy_b_on_four_stages(model, cluster):
    """llama-3.1-70b-fp8 at tp=1 pp=4 on 1x4xH100, 64 decodes (context 1152) over 4
    micro-batches, one 1024-token prompt chunk; with each stage's time for a decode-only
    share (small) and for a share carrying the chunk (big)."""
    m, c = model("llama-3.1-70b-fp8"), cluster("1x4xH100")
    layout = Layout(1, 4, 1)
    placement = place(c, layout)
    stages = stage_memory(m, c, layout, ServeRequest(max_model_len=8192), max_num_seqs=256)
    decode = StepLoad(64, 64 * 1152)
    chunk = StepLoad(0, 0, 1024, causal_pairs(1024), 1)
    per = decode.scaled(1 / 4)
    carrier = StepLoad(16, 16 * 1152, 1024, causal_pairs(1024), 1)
    small = [stage_step_time(m, c, layout, placement, s, per).seconds for s in stages]
    big = [stage_step_time(m, c, layout, placement, s, carrier).seconds for s in stages]
    return m, c, layout, placement, stages, decode, chunk, per, carrier, small, big


def test_prompt_chunk_rides_in_one_micro_batch_and_paces_the_round(model, cluster):
    """llama-3.1-70b-fp8 at tp=1 pp=4 on 1x4xH100, 64 decodes (context 1152) spread over the
    k = 4 micro-batches and one 1024-token prompt chunk in one of them. The round is the
    longest of: the carrier's path (its engine step, its time on every stage, 4 hops), the
    busiest stage (the carrier's share plus 3 decode-only shares), 4 engine steps. The
    carrier's path is a whole prefill of 1024 tokens through all 80 layers, so it paces the
    round: the pipeline cannot overlap one micro-batch with itself (why PP loses to TP under
    chunked prefill)."""
    m, c, layout, placement, stages, decode, chunk, per, carrier, small, big = seventy_b_on_four_stages(model, cluster)
    got = round_time(m, c, layout, placement, stages, decode, 4, chunk)
    path = engine_step_seconds(carrier) + sum(big) + 4 * pipeline_hop_seconds(m, placement, carrier.num_tokens)
    busiest = max(b + 3 * n for b, n in zip(big, small, strict=True))
    engines = 3 * engine_step_seconds(per) + engine_step_seconds(carrier)
    assert got.seconds == pytest.approx(max(path, busiest, engines), rel=1e-12)
    assert got.seconds == pytest.approx(path, rel=1e-12)
    spread = round_time(m, c, layout, placement, stages, StepLoad(64, 64 * 1152, 1024, causal_pairs(1024), 1), 4)
    assert got.seconds > 1.5 * spread.seconds


def test_a_prompt_wave_fills_several_micro_batches_one_after_another(model, cluster):
    """The same layout, 64 decodes and 3 micro-batches each carrying a 1024-token chunk (a
    wave of prompts: vLLM's scheduler gives each new step the next chunk while the last is in
    flight). The round's cadence is the longest of a carrier's path, the busiest stage (3
    carriers and 1 decode-only share) and the engine scheduling 3 carriers and 1 decode step;
    the last carrier's lag behind the first is not in it (vLLM keeps p steps in flight, so
    rounds overlap; a prompt's latency over its chunks is prompt_service_seconds)."""
    m, c, layout, placement, stages, decode, chunk, per, carrier, small, big = seventy_b_on_four_stages(model, cluster)
    got = round_time(m, c, layout, placement, stages, decode, 4, chunk, num_chunks=3)
    path = engine_step_seconds(carrier) + sum(big) + 4 * pipeline_hop_seconds(m, placement, carrier.num_tokens)
    busiest = max(3 * b + 1 * n for b, n in zip(big, small, strict=True))
    engines = engine_step_seconds(per) + 3 * engine_step_seconds(carrier)
    assert got.seconds == pytest.approx(max(path, busiest, engines), rel=1e-12)
    one = round_time(m, c, layout, placement, stages, decode, 4, chunk)
    # three chunks in one round cost less than three rounds of one: the pipeline overlaps them
    assert one.seconds <= got.seconds < 3 * one.seconds
    from planner.cost.serving_time import mean_bubble_fraction, round_busy_seconds
    assert round_busy_seconds(got, 3) == pytest.approx(busiest, rel=1e-12)
    # half the rounds decode only, half carry the wave: idle = 1 - mean busy / mean round
    decode_round = round_time(m, c, layout, placement, stages, decode, 4)
    busy = 0.5 * 4 * max(small) + 0.5 * busiest
    assert mean_bubble_fraction(4, decode_round, got, 0.5, 3) == pytest.approx(
        1 - busy / (0.5 * decode_round.seconds + 0.5 * got.seconds), rel=1e-9)
    with pytest.raises(ValueError, match="micro-batches"):
        round_time(m, c, layout, placement, stages, decode, 2, chunk, num_chunks=3)


def test_fp8_70b_on_eight_h100_throughput_runs_small_replicas(serve_plan):
    """The throughput question MLPerf submitters answer with replicas of tp * pp <= 2
    (Llama-2-70B fp8 on 8 x H100): with the prompt chunk pacing a pipeline round, pure
    TP replicas beat pp = 4, and tp = 2 x dp = 4 comes first."""
    plan = serve_plan("llama-3.1-70b-fp8", "1x8xH100", input_len=1024, output_len=256)
    best = plan.recommended.layout
    assert best.tp * best.pp <= 2 and (best.tp, best.pp, best.dp) == (2, 1, 4)


def test_elementwise_bytes_llama_70b_tp8(model):
    """Per token per layer on one of 8 GPUs: two fused add + RMSNorms on the whole hidden state
    2 * 4 * 2 B * 8192 = 131,072; rotary on 64/8 query + 8/8 key heads read + written
    2 * 2 B * (8 + 1) * 128 = 4,608; SwiGLU read 2 * 28672/8, write 28672/8 at 2 B: 21,504.
    Total 157,184 B. fp8 GEMMs first quantize their inputs (read 2 B, write 1 B):
    3 * (2 * 8192 + 64 * 128 / 8 + 28672 / 8) = 3 * 20,992 = 62,976 B; 16-bit GEMMs none.
    NVFP4 writes 0.5 B + one fp8 scale per 16 elements: (2 + 0.5625) * 20,992 = 53,792 B."""
    from planner.cost.serving_time import (
        activation_quant_bytes_per_token,
        elementwise_bytes_per_token,
    )
    m = model("llama-3.1-70b")
    assert elementwise_bytes_per_token(m, 8) == 157_184
    assert activation_quant_bytes_per_token(m, 8, "fp8") == 62_976
    assert activation_quant_bytes_per_token(m, 8, "fp4") == 53_792
    assert activation_quant_bytes_per_token(m, 8, "bf16") == 0


def test_gemm_precision_by_checkpoint_and_gpu(model, cluster):
    """fp8 W8A8 runs fp8 GEMMs on Hopper and Blackwell; NVFP4 (W4A4, every block matmul) runs fp4
    GEMMs where the GPU has fp4 tensor cores (B200), else the 16-bit ones; AWQ int4 is weight-only."""
    from planner.cost.serving_time import matmul_precision
    h100, b200 = cluster("1x8xH100"), cluster("1x8xB200")
    assert matmul_precision(model("llama-3.1-70b-fp8"), h100) == "fp8"
    assert matmul_precision(model("llama-3.1-70b-nvfp4"), b200) == "fp4"
    assert matmul_precision(model("llama-3.1-70b-nvfp4"), h100) == "bf16"
    assert matmul_precision(model("llama-3.1-70b-awq"), h100) == "bf16"


def test_prompt_attention_rate_is_the_gpus_measured_flash_share(cluster):
    """B200: 2,250 TFLOP/s bf16 at its measured forward share 0.50 (catalog, fitted to
    AIConfigurator's kernels) = 1,125 TFLOP/s; H100: 989 * 0.61 = 603.29 TFLOP/s."""
    from planner.cost.serving_time import attention_flops_per_s
    assert attention_flops_per_s(cluster("1x8xB200")) == pytest.approx(1125e12)
    assert attention_flops_per_s(cluster("1x8xH100")) == pytest.approx(603.29e12)


def test_step_parts_add_up_to_the_step(model, cluster):
    """What plan explain splits the step into covers it whole: the bytes- or FLOP-bound work
    (linear layers, attention, elementwise kernels) + the fixed per-layer cost + the layers'
    all-reduces (no EP here) = the step, for a decode-only and a mixed step."""
    for load in (StepLoad(64, 64 * 1152), StepLoad(64, 64 * 1152, 2048, causal_pairs(2048), 1)):
        step, _ = _eight_b_step(model, cluster, load)
        assert step.elementwise_seconds > 0
        assert step.seconds == pytest.approx(step.compute_or_memory_seconds + step.overhead_seconds
                                             + 32 * step.allreduce_seconds_per_layer, rel=1e-12)


def test_a_chunked_prompts_collectives_are_its_chunks(model, cluster):
    """Llama-3.1-70B at tp=2 pp=4, a 32,768-token prompt run as N = 5 chunks: each prefill
    all-reduce moves one chunk's rows, 32,768 / 5 * 8,192 * 2 B = 107.4 MB (102.4 MiB), 5 x 80 =
    400 of each per prompt, and 5 x 3 = 15 pipeline sends (plan explain showed one 512 MiB
    all-reduce per layer, the prompt unchunked, against the 5 chunks the plan priced)."""
    from planner.cost.serving_time import serving_collectives

    m, c = model("llama-3.1-70b"), cluster("1x8xH100")
    layout = Layout(2, 4, 1)
    placement = place(c, layout)
    rows = serving_collectives(m, c, layout, placement, 16, 4, 20, 32_768, prompt_chunks=5)
    prefill = [r for r in rows if r.phase == "prefill"]
    allreduces = [r for r in prefill if r.kind == "all-reduce"]
    assert [r.message_bytes for r in allreduces] == [pytest.approx(32_768 / 5 * 8192 * 2)] * 2
    assert [r.count_per_step for r in allreduces] == [400, 400]
    (send,) = [r for r in prefill if r.kind == "send"]
    assert send.count_per_step == 15 and send.message_bytes == pytest.approx(32_768 / 5 * 8192 * 2)
    whole = serving_collectives(m, c, layout, placement, 16, 4, 20, 32_768)
    assert [r.count_per_step for r in whole if r.phase == "prefill" and r.kind == "all-reduce"] == [80, 80]


def test_a_longer_output_never_shortens_e2e_where_decodes_spread_thin_over_the_stages():
    """Llama-3.1-8B tp=2 pp=4 on L40S, 25,245-token prompts at 77 clients: a micro-batch holds
    about 0.16 decoding sequences. The decoding sequence's own path was priced as the whole
    micro-batch scaled up to one sequence, its prompt tokens six times over: E2E 122.7, 62.4,
    44.7 s at 2, 3, 4 output tokens (found by a property sweep). Now its path holds the one
    sequence beside the micro-batch's share of the prompts, and E2E grows with the output."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.layout import Layout
    from planner.requests import ServeRequest
    from planner.serve import estimate

    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xL40S")
    e2e = [estimate(model, cluster, Layout(2, 4, 1), ServeRequest(input_len=25245, output_len=o, batch=77))
           .request_latency_seconds for o in (2, 3, 4, 8)]
    assert e2e == sorted(e2e)
    assert e2e[-1] < 1.05 * e2e[0]  # a few more decode rounds, not a different regime
