"""Hand-worked disaggregated serving formulas: KV transfer (intra vs inter node) and rate matching."""

from __future__ import annotations

import math

import pytest

from planner.cost.disaggregated import (
    decode_requests_per_second,
    max_prefill_rate,
    prefill_at_rate,
    prefill_worker,
    rate_match,
)
from planner.cost.kv_transfer import LayerKv, kv_transfer, prompt_kv_layers, window_tail_tokens
from planner.layout import Link

KV_BYTES_PER_TOKEN_70B = 327_680
"""Llama-3.1-70B, 16-bit KV: 2 (K, V) * 80 layers * 8 KV heads * 128 dims * 2 bytes."""
LAYERS_70B_1024 = (LayerKv(80, KV_BYTES_PER_TOKEN_70B // 80 * 1024),)
"""I = 1,024 prompt tokens: 80 full-attention layers of 4,096 B per token each."""
NVLINK = Link("nvlink", "intra_node", 450e9, 2e-6)
IB = Link("infiniband", "inter_node", 50e9, 5e-6)


def test_kv_transfer_inside_a_node():
    """S = 327,680 * 1,024 = 335,544,320 B over min(2, 4) = 2 streams, 80 layers:
    message = S / (80 * 2) = 2,097,152 B; NVLink t = 2e-6 + 2,097,152 / 450e9 = 6.66034e-6 s;
    T_x = 80 * t = 5.32827e-4 s, all of it in TTFT: vLLM's NixlConnector reads the blocks
    after the prefill ends (no layer-by-layer saving)."""
    kv = kv_transfer(LAYERS_70B_1024, 2, 4, NVLINK, None)
    assert kv.bytes_per_request == 335_544_320
    assert (kv.num_streams, kv.copies) == (2, 1)
    assert kv.transfer_seconds == pytest.approx(5.32827e-4, rel=1e-5)
    assert kv.exposed_seconds == kv.transfer_seconds
    assert (kv.link_kind, kv.link_scope, kv.source) == ("nvlink", "intra_node", "model")


def test_a_pipelined_prefill_workers_stages_send_at_once():
    """The same request from a tp=1 pp=4 prefill worker to a tp=4 decode worker: each stage's GPU
    holds its 20 layers, so 4 GPUs send at once, min(1 * 4, 4) = 4 streams: message = S / (80 *
    4) = 1,048,576 B, t = 2e-6 + 1,048,576 / 450e9 = 4.330169e-6 s, T_x = 80 * t = 3.46414e-4 s
    (one stream, as before, 80 * (2e-6 + 4,194,304 / 450e9) = 9.0565e-4 s)."""
    piped = kv_transfer(LAYERS_70B_1024, 1, 4, NVLINK, None, prefill_pp=4)
    assert piped.num_streams == 4
    assert piped.transfer_seconds == pytest.approx(3.46414e-4, rel=1e-5)
    assert kv_transfer(LAYERS_70B_1024, 1, 4, NVLINK, None).transfer_seconds == pytest.approx(9.0565e-4, rel=1e-4)
    # more senders than receivers: the decode worker's t_D bound it
    assert kv_transfer(LAYERS_70B_1024, 2, 4, NVLINK, None, prefill_pp=4).num_streams == 4


def test_kv_transfer_across_nodes():
    """Same request over a 400 Gb/s NIC (50e9 B/s per GPU, 5 us): t = 5e-6 + 2,097,152 / 50e9
    = 4.694304e-5 s; T_x = 80 * t = 3.7554432e-3 s, exposed whole."""
    slow = kv_transfer(LAYERS_70B_1024, 2, 4, IB, None)
    assert slow.transfer_seconds == pytest.approx(3.7554432e-3, rel=1e-7)
    assert slow.exposed_seconds == slow.transfer_seconds
    nvlink = kv_transfer(LAYERS_70B_1024, 2, 4, NVLINK, None)
    assert slow.transfer_seconds > 7 * nvlink.transfer_seconds


def test_mla_latent_goes_whole_to_every_decode_rank():
    """DeepSeek-V3, 70,272 B of latent per token (61 layers x 576 x 2 B), I = 8,192:
    S = 575,668,224 B. The latent is not split by heads, so each of the t_D = 2 decode ranks
    reads all of it: one stream of S / 61 = 9,437,184 B per layer, t = 5e-6 + 9,437,184 / 50e9
    = 1.9374368e-4 s, T_x = 61 t = 1.18183645e-2 s (S / n with n = 2 streams, as for GQA,
    would be half). A decode worker of 2 GPUs takes in 2 / (1 * 2) / T_x = 84.6 prompts/s."""
    from planner.cost.kv_transfer import kv_link_requests_per_second

    kv = kv_transfer((LayerKv(61, 1152 * 8192),), 2, 2, IB, None, mla=True)
    assert kv.bytes_per_request == 575_668_224
    assert (kv.num_streams, kv.copies) == (1, 2)
    assert kv.transfer_seconds == pytest.approx(1.18183645e-2, rel=1e-7)
    assert kv_link_requests_per_second(kv, 2) == pytest.approx(1 / 1.18183645e-2, rel=1e-7)


def test_a_window_layer_sends_only_its_windows_tail():
    """NixlConnector keeps ceil(W / B) + 1 blocks of a sliding-window layer (blocks_per_sw):
    W = 128, B = 16: 9 blocks. I = 1,024 is 64 blocks, 55 dropped: 1,024 - 880 = 144 tokens;
    I = 1,000 is 63 blocks (the last holds 8), 54 dropped: 1,000 - 864 = 136; I = 100 is 7
    blocks, all kept: 100."""
    assert window_tail_tokens(1024, 128, 16) == 144
    assert window_tail_tokens(1000, 128, 16) == 136
    assert window_tail_tokens(100, 128, 16) == 100
    assert window_tail_tokens(144, 128, 16) == 144


def test_gpt_oss_prompt_kv_counts_the_window_layers_tail():
    """gpt-oss-120b, 16-bit KV: every layer 8 KV heads * 64 * 2 (K, V) * 2 B = 2,048 B per
    token; 18 full layers send I = 1,024 tokens, 18 window layers (W = 128) 144:
    18 * 2,048 * 1,024 = 37,748,736 + 18 * 2,048 * 144 = 5,308,416 -> 43,057,152 B, 57% of
    the 75,497,472 B that all 36 layers' whole prompt would be."""
    from planner.catalog import resolve_model

    layers = prompt_kv_layers(resolve_model("gpt-oss-120b"), "auto", 1024)
    assert layers == (LayerKv(18, 2048 * 1024), LayerKv(18, 2048 * 144))
    kv = kv_transfer(layers, 2, 2, NVLINK, None)
    assert kv.bytes_per_request == 43_057_152
    # Two streams: 18 messages of 1,048,576 B and 18 of 147,456 B, t = 2e-6 + m / 450e9:
    # 18 * 4.33017e-6 + 18 * 2.32768e-6 = 1.19841e-4 s.
    assert kv.transfer_seconds == pytest.approx(18 * (2e-6 + 1_048_576 / 450e9) + 18 * (2e-6 + 147_456 / 450e9))


def test_a_recurrent_layer_sends_one_state():
    """Nemotron-H-56B (tests/fixtures/hf_configs): 10 attention layers of 8 * 128 * 2 * 2 =
    4,096 B per token, I = 1,000: 4,096,000 B each; 54 Mamba2 layers each send one sequence's
    state, 16,900,096 B (conv 122,880 + SSM 16,777,216; test_hybrid_params), whatever I is:
    10 * 4,096,000 + 54 * 16,900,096 = 953,565,184 B."""
    from pathlib import Path

    from planner.catalog import resolve_model

    config = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs" / "nvidia--Nemotron-H-56B-Base-8K"
    layers = prompt_kv_layers(resolve_model(str(config / "config.json")), "auto", 1000)
    assert layers == (LayerKv(10, 4_096_000), LayerKv(54, 16_900_096))
    assert kv_transfer(layers, 1, 1, NVLINK, None).bytes_per_request == 953_565_184


def constant(seconds: float):
    return lambda b: seconds


def test_prefill_worker_capacity_and_queueing_by_hand():
    """I = 1,024, B = 8,192: n_max = 8 prompts per step, S_p = 1, k = 1, T = 0.5 s:
    capacity 8 / 0.5 = 16 req/s. At r = 8 (gated_batch_prefill, T constant: c = 0): a step
    carries mu = r T + p0 = 4 + e^-4 = 4.0183 prompts, U = 0.5 / (0.5 + e^-4 / 8) = 0.99544;
    an arrival waits out the rest of a step, E[T^2] / (2 E[T]) = 0.25 s, U of the time, and
    runs a step of 0.5 s: wait 0.24886 s, prefill 0.74886 s; utilization (against the capacity)
    8 / 16 = 0.5. The steps take all that waits, so a constant T never queues a prompt past the
    next step (the n_max cap aside): any TTFT over 0.75 s is met up to the 90% cap."""
    worker = prefill_worker(1024, 8192, 1, constant(0.5))
    assert worker.capacity_requests_per_second == 16.0
    load = prefill_at_rate(worker, 8.0, constant(0.5))
    assert load.prompts_per_step == pytest.approx(4 + math.exp(-4))
    assert load.utilization == 0.5
    assert load.busy_fraction == pytest.approx(0.5 / (0.5 + math.exp(-4) / 8))
    assert load.wait_seconds == pytest.approx(0.25 * load.busy_fraction)
    assert load.prefill_seconds == pytest.approx(0.74886, abs=1e-5)
    assert max_prefill_rate(worker, 0.75, constant(0.5)) == pytest.approx(0.9 * 16)
    assert max_prefill_rate(worker, 0.4, constant(0.5)) == 0.0
    assert max_prefill_rate(worker, None, constant(0.5)) == pytest.approx(0.9 * 16)


def test_chunked_prompt_takes_several_steps():
    """I = 20,000 > B = 8,192: S_p = ceil(20,000 / 8,192) = 3 steps of one prompt; with T = 0.2
    s and k = 2 in flight, capacity = 2 * 1 / (3 * 0.2) = 3.333 req/s."""
    worker = prefill_worker(20_000, 8192, 2, constant(0.2))
    assert (worker.steps_per_prompt, worker.prompts_per_step_max) == (3, 1.0)
    assert worker.capacity_requests_per_second == pytest.approx(10 / 3)


def test_a_long_prompt_fills_consecutive_micro_batches_of_a_pipelined_worker():
    """I = 20,000, B = 8,192: S_p = 3 chunks. On a worker pipelined over p = 4 stages (k = 4,
    T = 0.2 s a round) the chunks go into 3 consecutive micro-batches, one every T / p = 0.05 s,
    the last through all stages in T: service = 0.2 * (1 + 2 / 4) = 0.3 s (3 * 0.2 = 0.6 s
    with one chunk a round). Capacity is the micro-batches' count either way: 4 / (3 * 0.2) =
    6.667 req/s. At r = 10/3 (rho = 0.5): D = 3 * 0.2 / 4 = 0.15 s, wait = 0.5 * 0.15 / (2 *
    0.5) = 0.075 s, prefill = 0.375 s. Without PP (p = 1) the service stays S_p T = 0.6 s."""
    from planner.cost.continuous_batching import prompt_service_seconds

    assert prompt_service_seconds(3, 0.2, 4) == pytest.approx(0.3)
    assert prompt_service_seconds(3, 0.2, 1) == pytest.approx(0.6)
    assert prompt_service_seconds(1, 0.2, 4) == pytest.approx(0.2)
    piped = prefill_worker(20_000, 8192, 4, constant(0.2), pipeline_stages=4)
    assert piped.capacity_requests_per_second == pytest.approx(20 / 3)
    load = prefill_at_rate(piped, 10 / 3, constant(0.2))
    assert load.utilization == pytest.approx(0.5)
    assert load.wait_seconds == pytest.approx(0.075)
    assert load.prefill_seconds == pytest.approx(0.375)


def test_a_pipelined_worker_takes_prompts_every_stage_step():
    """The same worker as pipelined over p = 4 stages, k = 4 micro-batches per round of
    T = 0.5 s: capacity 4 * 8 / 0.5 = 64 req/s. At r = 32: rho = 0.5, b = clamp(32 * 0.5 / 4)
    = 4; a micro-batch starts every T / p = 0.125 s, so wait = 0.5 * 0.125 / (2 * 0.5) =
    0.0625 s (a whole round, 0.5 s, would give 0.25 s), prefill = 0.0625 + 0.5 = 0.5625 s.
    Four lockstep lanes (k = 4, p = 1) start together every T: wait 0.25 s."""
    piped = prefill_worker(1024, 8192, 4, constant(0.5), pipeline_stages=4)
    assert piped.capacity_requests_per_second == 64.0
    load = prefill_at_rate(piped, 32.0, constant(0.5))
    assert (load.prompts_per_step, load.utilization) == (4.0, 0.5)
    assert load.wait_seconds == pytest.approx(0.0625)
    assert load.prefill_seconds == pytest.approx(0.5625)
    lanes = prefill_worker(1024, 8192, 4, constant(0.5))
    assert prefill_at_rate(lanes, 32.0, constant(0.5)).wait_seconds == pytest.approx(0.25)


def test_rate_matching_by_hand():
    """Decode: C_d = 100 sequences, O = 256, T_d = 25 ms: r_d = 100 / (256 * 0.025) = 15.625
    req/s per worker. 2 prefill workers at 8 req/s = 16 req/s against 3 decode workers at
    5 req/s = 15 req/s: R = 15, the decode side binds; with 1 prefill worker R = 8 (prefill)."""
    assert decode_requests_per_second(100, 256, 0.025) == pytest.approx(15.625)
    match = rate_match(8.0, 2, 5.0, 3)
    assert (match.requests_per_second, match.binding) == (15.0, "decode")
    assert (match.prefill_requests_per_second, match.decode_requests_per_second) == (16.0, 15.0)
    assert rate_match(8.0, 1, 5.0, 3).binding == "prefill"


def test_prompts_per_step_follow_what_arrives_during_a_step():
    """gated_batch_prefill's worked example: T(b) = 0.01 + 0.09 b s, n_max = 8, k = 1, r = 7 /s.
    mu = r T(mu) + exp(-r T(mu)) = 1.3001 (T 0.12701 s, p0 0.4110); s (1 - (r c)^2) = r T + r^2
    (a^2 + 2 a c mu) + p0 gives s = 2.3540, E[T^2] = 0.021507 s^2; U = 0.12701 / (0.12701 +
    0.4110 / 7) = 0.6838; the rest of a step 0.021507 / (2 * 0.12701) = 0.08467 s; its own
    step of 1 + 7 * 0.16934 = 2.1854 prompts 0.20668 s, alone 0.1 s: prefill 0.6838 * (0.08467
    + 0.20668) + 0.3162 * 0.1 = 0.2309 s. The step simulation of the same worker
    (serving_sim.simulate, 20,000 Poisson arrivals): 0.2312 s; the M/D/1 at full steps had
    given 0.1884 s (rho = 7 / 10.959 against one prompt's 0.1 s step), taking the full round's
    arrivals 0.885 s."""
    def linear(b: float) -> float:
        return 0.1 + 0.09 * (b - 1)

    worker = prefill_worker(1024, 8192, 1, linear)
    load = prefill_at_rate(worker, 7.0, linear)
    assert load.prompts_per_step == pytest.approx(1.3001, abs=1e-4)
    assert load.utilization == pytest.approx(7 / (8 / 0.73))
    assert load.busy_fraction == pytest.approx(0.6838, abs=1e-4)
    assert load.wait_seconds == pytest.approx(0.6838 * 0.08467, rel=1e-3)
    assert load.prefill_seconds == pytest.approx(0.2309, abs=1e-4)
    # batching that pays: T(b) = 0.2 + 0.02 (b - 1), r = 20: mu = 20 (0.18 + 0.02 mu) + p0 = 3.6 +
    # 0.4 mu + e^-6: 6.004 prompts a step, T 0.3001 s
    def flat(b: float) -> float:
        return 0.2 + 0.02 * (b - 1)

    busy = prefill_at_rate(prefill_worker(1024, 8192, 1, flat), 20.0, flat)
    assert busy.prompts_per_step == pytest.approx(6.0, rel=1e-3)
    assert busy.round_seconds == pytest.approx(0.3, rel=1e-3)


def test_gated_batches_agree_with_the_step_simulation():
    """gated_batch_prefill against serving_sim.simulate of the same worker (one engine, whole
    1,024-token prompts, n_max = 8, 8,000 Poisson arrivals) at 30%, 50% and 70% of capacity, a
    steep step (a prompt's compute dominates: Llama-3.1-70B's prefill worker, T(1) = 77.4 ms, 63.3
    ms a prompt more) and a flat one (0.2 s + 20 ms a prompt), with and without async scheduling:
    within 5% (docs/cost-model.md: within 4% to 70% over 20,000 arrivals; 9% at 80%)."""
    import random

    from planner.cost.serving_sim import EngineLimits, SimRequest, bench_metrics, simulate

    for first, more in ((0.0774, 0.0633), (0.2, 0.02)):
        def step(b: float, first=first, more=more) -> float:
            return first + more * (b - 1)
        for ahead in (False, True):
            worker = prefill_worker(1024, 8192, 1, step, schedules_ahead=ahead)
            for share in (0.3, 0.5, 0.7):
                rate = share * worker.capacity_requests_per_second
                rng, now, requests = random.Random(1), 0.0, []
                for _ in range(8000):
                    now += rng.expovariate(rate)
                    requests.append(SimRequest(now, 1024, 1))
                result = simulate(requests, EngineLimits(10**8, 1024, 8192, schedules_ahead=ahead),
                                  lambda load, step=step: step(load.num_tokens / 1024))
                simulated = bench_metrics(result).ttft_seconds.mean
                assert prefill_at_rate(worker, rate, step).prefill_seconds == pytest.approx(simulated, rel=0.05), \
                    (first, more, ahead, share)


def test_prefill_steps_are_priced_at_a_few_prompt_counts():
    """Every count to 16, then powers of sqrt(2) (16 * 1.414 = 22.6 -> 23, 32, 45.3 -> 45, 64,
    90.5 -> 91) and the most, 100; 8,192 one-token prompts per step take 34 priced steps, not
    8,192 (a search of 30 s became 0.9 s)."""
    from planner.disagg_search import prefill_price_points

    assert prefill_price_points(100) == [*range(1, 17), 23, 32, 45, 64, 91, 100]
    assert len(prefill_price_points(8192)) == 34 and prefill_price_points(8192)[-1] == 8192
    assert prefill_price_points(8) == [*range(1, 9)] and prefill_price_points(1) == [1]


def test_a_prefill_step_runs_at_most_max_num_seqs_prompts():
    """One-token prompts under an 8,192-token budget on H100: vLLM's scheduler runs at most
    max_num_seqs = 1,024 sequences a step (vLLM 0.33.0's H100 default), so n_max = 1,024, not
    8,192; T(b) between priced counts is linear."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.disagg_search import prefill_rounds, price_shape
    from planner.requests import ServeRequest

    cluster, model = resolve_cluster("1x8xH100"), resolve_model("llama-3.1-8b")
    request = ServeRequest(input_len=1, output_len=16)
    shape = price_shape(model, cluster, request, 1, 1, 8192, 1)
    worker, seconds = prefill_rounds(model, cluster, request, shape, 8192)
    assert worker.prompts_per_step_max == 1024 and len(worker.round_table) == 1024
    assert seconds(24) == pytest.approx(seconds(23) + (seconds(32) - seconds(23)) / 9)


def test_copies_are_counted_node_by_node():
    """plan_copies: a copy never splits a node's share. 36 planned GPUs of 8-GPU nodes are 4
    full nodes and 4 GPUs on a fifth: a one-node 5-GPU deployment fits once a node, 4 copies
    (floor(36 / 5) = 7 would split copies over nodes); a 4-GPU one twice a node and once on
    the partial node, 9; a same-node deployment over 2 nodes of 3 GPUs each: 4 full nodes x 2
    slots = 8 slots, 4 copies; prefill and decode on 3 nodes of their own: 5 nodes (the
    partial one counted) // 3 = 1."""
    from planner.disagg_search import plan_copies

    assert plan_copies(36, 8, 5, 1, True) == 4
    assert plan_copies(36, 8, 4, 1, True) == 9
    assert plan_copies(36, 8, 6, 2, True) == 4
    assert plan_copies(36, 8, 22, 3, False) == 1
    assert plan_copies(2047, 8, 22, 4, False) == 64
    assert plan_copies(7, 8, 4, 1, True) == 1 and plan_copies(8, 8, 4, 1, True) == 2


def test_no_ttft_limit_never_plans_less_than_a_limit():
    """Without a TTFT limit a prefill worker runs at 90% of its capacity; with one, at most
    that too, so dropping the limit (the loosest) never lowers the rate."""
    worker = prefill_worker(1024, 8192, 1, constant(0.5))
    assert max_prefill_rate(worker, 1e6, constant(0.5)) == pytest.approx(max_prefill_rate(worker, None, constant(0.5)))


def micro_batches(b: float) -> tuple[float, float]:
    """(path, busiest stage) of one micro-batch of b prompts: a stage 4 + b ms, path 10 + 2 b ms."""
    return 0.010 + 0.002 * b, 0.004 + 0.001 * b


def test_a_pipelined_workers_throughput_grows_with_the_micro_batches_it_fills():
    """p = 2 stages, n_max = 2 prompts a step (I = 512, B = 1,024), one micro-batch's path 10 +
    2 b ms and busiest stage 4 + b ms. With n prompts in it: n = 1, 2 ride one micro-batch:
    1 / 12 ms = 83.3 /s, 2 / 14 ms = 142.9 /s; n = 3 fills two (2 + 1) that follow each other
    through the stages, busy 6 + 5 = 11 ms < the path of 2, 14 ms: 3 / 14 ms = 214.3 /s; n = 4:
    (6 + 6 = 12 < 14) 285.7 /s, and no more past p n_max = 4."""
    from planner.cost.disaggregated import pipelined_throughput

    worker = prefill_worker(512, 1024, 2, constant(0.014), pipeline_stages=2, micro_batch_seconds=micro_batches)
    assert len(worker.micro_batch_table) == 2
    got = [pipelined_throughput(worker, n) for n in (1, 2, 3, 4, 5)]
    assert got == pytest.approx([1 / 0.012, 2 / 0.014, 3 / 0.014, 4 / 0.014, 4 / 0.014])


def test_pipelined_prefill_seconds_by_hand():
    """The worker above at r = 100 /s: P(n) / P(0) = 1, 100 x 0.012 = 1.2, x 0.7 = 0.84, x 0.46667
    = 0.392, x 0.35 = 0.1372, then geometric with ratio 0.35: the tail holds 0.1372 x 0.35 / 0.65
    = 0.073877 and sum_j (4 + j) of it 0.1372 x (4 x 0.53846 + 0.35 / 0.4225) = 0.409165. Mass
    3.643077, mean prompts in it 5.013965 / 3.643077 = 1.37630: 13.76 ms by Little's law. Alone
    (r -> 0): the path of one prompt, 12 ms. The round model (one micro-batch every T / p) said
    7 ms of service and queue at this load: the worker does not pipeline until prompts wait."""
    from planner.cost.disaggregated import pipelined_prefill_seconds

    worker = prefill_worker(512, 1024, 2, constant(0.014), pipeline_stages=2, micro_batch_seconds=micro_batches)
    mass = 1 + 1.2 + 0.84 + 0.392 + 0.1372 + 0.1372 * 0.35 / 0.65
    mean = 1.2 + 2 * 0.84 + 3 * 0.392 + 4 * 0.1372 + 0.1372 * (4 * 0.35 / 0.65 + 0.35 / 0.65**2)
    assert pipelined_prefill_seconds(worker, 100.0) == pytest.approx(mean / mass / 100.0, rel=1e-12)
    assert pipelined_prefill_seconds(worker, 100.0) == pytest.approx(0.013763, rel=1e-4)
    assert pipelined_prefill_seconds(worker, 0.0) == pytest.approx(0.012)
    assert prefill_at_rate(worker, 100.0, constant(0.014)).prefill_seconds == pytest.approx(0.013763, rel=1e-4)
    # at or past p n_max a path (4 / 14 ms = 285.7 /s) the queue grows without end
    assert pipelined_prefill_seconds(worker, 290.0) == float("inf")
    # lockstep lanes (k = 4 > p = 2) or chunked prompts keep the round model
    assert not prefill_worker(512, 1024, 4, constant(0.014), 2, micro_batches).micro_batch_table
    assert not prefill_worker(4096, 1024, 2, constant(0.014), 2, micro_batches).micro_batch_table


def test_a_pipelined_prefill_worker_queues_as_its_step_simulation_does():
    """A 2-stage prefill-only worker (512-token prompts, an 8,192-token budget: 16 a step; each
    stage 3 ms + 10 ms per prompt, 1 ms of engine work, 0.5 ms hops) at 40% of its pipelined
    capacity (39 /s), 2,000 Poisson arrivals stepped through vLLM's batch queue
    (serving_sim.simulate): TTFT 105 ms. The chain: within 25%; the round model, one
    micro-batch every T / p: 33 ms."""
    import random

    from planner.cost.disaggregated import pipelined_throughput
    from planner.cost.serving_sim import (
        EngineLimits,
        PipelineStep,
        SimRequest,
        bench_metrics,
        simulate,
    )

    def stage(prompts: float) -> float:
        return 0.003 + 0.010 * prompts

    def path(prompts: float) -> float:
        return 0.001 + 2 * (stage(prompts) + 0.0005)

    def rounds(prompts: float) -> float:
        return max(path(prompts), 2 * stage(prompts))

    worker = prefill_worker(512, 8192, 2, rounds, 2, lambda b: (path(b), stage(b)))
    rate = 0.4 * pipelined_throughput(worker, 32)
    rng, now, requests = random.Random(1), 0.0, []
    for _ in range(2000):
        now += rng.expovariate(rate)
        requests.append(SimRequest(now, 512, 1))
    result = simulate(requests, EngineLimits(10**8, 1024, 8192, pipeline_stages=2),
                      lambda load: PipelineStep(0.001, (stage(load.num_tokens / 512),) * 2, 0.0005))
    simulated = bench_metrics(result).ttft_seconds.mean
    assert prefill_at_rate(worker, rate, rounds).prefill_seconds == pytest.approx(simulated, rel=0.25)
    assert prefill_worker(512, 8192, 2, rounds, 2).micro_batch_table == ()
    assert prefill_at_rate(prefill_worker(512, 8192, 2, rounds, 2), rate, rounds).prefill_seconds < 0.5 * simulated


def test_a_pipelined_worker_of_many_short_prompts_is_a_lone_path_at_a_light_load():
    """32-token prompts under an 8,192-token budget (256 a step) on 2 stages: 512 states, summed
    in blocks. At 0.1 req/s a prompt takes one micro-batch's path, 10 ms, and the time grows
    with the rate (found by a sweep: the first block once carried the empty worker's weight for
    all its states, 7.5 s at 0.1 req/s, 0.75 s at 1, 18 ms at 100)."""
    def rounds(b: float) -> float:
        return 0.02 + 1e-5 * b

    worker = prefill_worker(32, 8192, 2, rounds, 2, lambda b: (0.01 + 5e-6 * b, 0.005 + 2.5e-6 * b))
    times = [prefill_at_rate(worker, r, rounds).prefill_seconds for r in (0.1, 1, 10, 100, 1000, 10_000, 30_000)]
    assert times[0] == pytest.approx(0.010005, rel=1e-3)
    assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:], strict=False))


@pytest.mark.parametrize("limit_ms", [12.5, 13.0, 14.0, 16.0, 20.0, 40.0, 400.0])
def test_max_prefill_rate_agrees_with_bisection_and_its_grid_memo(limit_ms):
    """The pipelined worker above (capacity 285.7 /s, 0.9 of it = 257.1): the rate the grid-
    bracketed false-position search finds meets the limit and is the largest that does, as 60
    plain bisection steps over [0, 0.9 capacity] find it, to 2^-24 of the rate or of the limit
    (max_prefill_rate's tolerance); and a grid memo
    shared by every limit (as a disaggregated search shares one per prefill shape, asked in
    any order) changes no answer. 400 ms: the cap meets it, the cap is the answer."""
    worker = prefill_worker(512, 1024, 2, constant(0.014), pipeline_stages=2, micro_batch_seconds=micro_batches)
    limit = limit_ms / 1e3

    def seconds(rate: float) -> float:
        return prefill_at_rate(worker, rate, constant(0.014)).prefill_seconds

    good, bad = 0.0, 0.9 * worker.capacity_requests_per_second
    if seconds(bad) <= limit:
        good = bad
    else:
        for _ in range(60):
            middle = (good + bad) / 2
            good, bad = (middle, bad) if seconds(middle) <= limit else (good, middle)
    found = max_prefill_rate(worker, limit, constant(0.014))
    assert seconds(found) <= limit and found <= good * (1 + 2.0**-40)
    # within RATE_RELATIVE_TOLERANCE (2^-24) of the rate, or its prefill time of the limit
    # (where the time is flat in the rate, 12.5 ms, that is 1.7e-6 of the rate)
    assert found >= good * (1 - 2.0**-24) or seconds(found) >= limit * (1 - 2.0**-23)
    assert found == pytest.approx(good, rel=1e-5)
    shared: dict[int, float] = {}
    for other in (40.0, 12.5, 16.0):  # fill the memo from other limits first
        max_prefill_rate(worker, other / 1e3, constant(0.014), shared)
    assert max_prefill_rate(worker, limit, constant(0.014), shared) == found


def test_a_step_of_one_or_two_prompts_queues_as_the_m_d_1():
    """n_max = 1 (8,192-token prompts under an 8,192 budget): one prompt a step, a deterministic
    service of T(1) = 0.2 s, the M/D/1's exact case: at 90% of capacity (4.5 /s), wait 0.9 * 0.2
    / (2 * 0.1) = 0.9 s, prefill 1.1 s (the step simulation: 1.084 s; gated batches had priced
    0.269 s, a review). n_max = 2 stays there too (GATED_MIN_PROMPTS); n_max = 3 is gated."""
    def step(b: float) -> float:
        return 0.2 * b

    one = prefill_worker(8192, 8192, 1, step)
    load = prefill_at_rate(one, 0.9 * one.capacity_requests_per_second, step)
    assert load.busy_fraction is None
    assert load.prefill_seconds == pytest.approx(1.1)
    assert prefill_at_rate(prefill_worker(4096, 8192, 1, step), 5.0, step).busy_fraction is None
    assert prefill_at_rate(prefill_worker(2700, 8192, 1, step), 5.0, step).busy_fraction is not None


def test_poisson_tails_and_the_lag_share_by_hand():
    """P(X > 8), X ~ Poisson(4): 1 - sum_{k<=8} e^-4 4^k / k! = 0.0213634; far tails without
    the cdf's rounding (mean 746, n = 1,024: 2.455e-22, where 1 - cdf gave 1.0 once e^-746
    underflowed) and below it (mean 160, n = 1,024: 0, not 1e-15). lag_share(0.01, 0.04) over
    100,000 steps: 0.2 (1 - (1 - 0.95^100000) / 5,000) = 0.19996; entered once in 1e15 steps it is
    5e-11, not the long run's 1e55 / (1e55 + 1)."""
    from planner.cost.disaggregated import lag_share, poisson_tail_above

    assert poisson_tail_above(4.0, 8) == pytest.approx(1 - sum(math.exp(-4) * 4**k / math.factorial(k)
                                                               for k in range(9)), rel=1e-12)
    assert poisson_tail_above(746.0, 1024) == pytest.approx(2.455138e-22, rel=1e-5)
    assert poisson_tail_above(160.0, 1024) < 1e-300
    assert poisson_tail_above(5.0, 0) == pytest.approx(1 - math.exp(-5))
    assert lag_share(0.01, 0.04) == pytest.approx(0.19996)
    assert lag_share(1e-15, 1e-70) == pytest.approx(5e-11, rel=1e-3)
    assert lag_share(0.0, 0.0) == 0.0


@pytest.mark.parametrize("step_of", [
    lambda b: 0.0774 + 0.0633 * (b - 1),            # steep, linear
    lambda b: 0.03 * math.sqrt(b),                   # concave
    lambda b: max(0.02, 0.005 * b),                  # a floor, then linear
    lambda b: 0.01 + 0.0002 * b,                     # many short prompts
])
@pytest.mark.parametrize("ahead", [False, True])
def test_the_gated_price_never_falls_as_the_rate_rises(step_of, ahead):
    """max_prefill_rate bisects on prefill_seconds(r): 200 rates from 1% to 95% of capacity, each
    priced at least as high as the one before (the table segment's slope had jumped as mu crossed
    a whole count, a 13% fall; the lag share had flipped between 0 and 1: a review)."""
    worker = prefill_worker(64 if step_of(1) < 0.015 else 1024, 8192 if step_of(1) >= 0.015 else 65536, 1,
                            step_of, schedules_ahead=ahead)
    assert worker.gated_batches
    capacity = worker.capacity_requests_per_second
    prices = [prefill_at_rate(worker, (0.01 + 0.94 * k / 199) * capacity, step_of).prefill_seconds
              for k in range(200)]
    assert all(later >= earlier * (1 - 1e-9) for earlier, later in zip(prices, prices[1:], strict=False))
    assert all(math.isfinite(price) and price > 0 for price in prices)


def test_the_kv_handoff_takes_the_probes_send_fit_before_its_all_reduce_curve():
    """A probe profile with both a 2-rank all-reduce curve and a send/recv fit on the link: each
    layer's message is a send, priced by the send fit, alpha + S / beta. 32 layers of 4 MiB over
    one stream, the send fit 257.7 us and 1.39 GB/s (a gloo probe of 4 ranks): 32 x (257.7 us +
    4,194,304 B / 1.39e9 B/s) = 32 x 3.2753 ms = 104.81 ms, where the all-reduce curve (7.10 ms at
    4 MiB) gave 227.3 ms. Without a send fit the curve prices it, as before; both "measured"."""
    from planner.specs import AllreduceCurve

    curve = AllreduceCurve(link="intra_node", num_ranks=2, sizes_bytes=[2**20, 2**22],
                           median_seconds=[2.0e-3, 7.102e-3])
    layers = (LayerKv(32, 4 * 2**20),)
    probed = Link("pcie", "intra_node", 0.5e9, 600e-6, measured=True,
                  p2p_bandwidth_bytes_per_s=1.39e9, p2p_latency_seconds=257.7e-6)
    sent = kv_transfer(layers, 1, 1, probed, curve)
    assert sent.transfer_seconds == pytest.approx(32 * (257.7e-6 + 4 * 2**20 / 1.39e9), rel=1e-12)
    assert sent.transfer_seconds == pytest.approx(0.10481, rel=1e-4)
    assert sent.source == "measured"
    no_send_fit = Link("pcie", "intra_node", 0.5e9, 600e-6, measured=True)
    reduced = kv_transfer(layers, 1, 1, no_send_fit, curve)
    assert reduced.transfer_seconds == pytest.approx(32 * 7.102e-3, rel=1e-12)
