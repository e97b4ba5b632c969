"""Hand-worked cases and properties of the step-level scheduler simulation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.serving_sim import (
    EngineLimits,
    FirstWave,
    SimRequest,
    StepLoad,
    _simulate_dispatched,
    bench_metrics,
    first_wave,
    simulate,
    simulate_lockstep,
    simulate_replicas,
    weighted_percentile,
)

STEP = 0.01
BIG_KV = 10**7


def const(_: StepLoad) -> float:
    return STEP


def test_chunked_prefill_two_requests():
    """Budget 100; A = 150/3 tokens, B = 50/3 tokens, both at t=0, 10 ms steps.

    step 1: A's first chunk of 100 (pairs 100*101/2 = 5050).
    step 2: A's last 50 at offset 100 (50*100 + 50*51/2 = 6275) + B's 50 (1275) = 7550 pairs;
            both prompts finish: first tokens at 20 ms (2 prompts completing: sampled once each).
    steps 3, 4: both decode (contexts 151+51 = 202, then 204); 3rd token at 40 ms.
    TTFT = 20 ms, E2E = 40 ms, TPOT = (40-20)/2 = 10 ms for both.
    """
    res = simulate(
        [SimRequest(0, 150, 3), SimRequest(0, 50, 3)], EngineLimits(BIG_KV, 256, 100), const
    )
    assert res.ttft_seconds == pytest.approx((0.02, 0.02))
    assert res.e2e_seconds == pytest.approx((0.04, 0.04))
    assert res.tpot_seconds == pytest.approx((0.01, 0.01))
    assert res.step_loads == (
        StepLoad(0, 0.0, 100, 5050.0),
        StepLoad(0, 0.0, 100, 7550.0, 2),
        StepLoad(2, 202.0, 0, 0.0),
        StepLoad(2, 204.0, 0, 0.0),
    )
    assert res.step_num_regular_itl == (0, 0, 2, 2)
    m = bench_metrics(res)
    assert m.itl_seconds.mean == pytest.approx(0.01)
    assert m.duration_seconds == pytest.approx(0.04)
    assert m.output_token_throughput_per_second == pytest.approx(6 / 0.04)


def test_first_token_extra_shifts_ttft_and_e2e_not_tpot():
    res = simulate([SimRequest(0, 10, 4)], EngineLimits(BIG_KV, 8, 100), const, 0.005)
    # prefill step ends at 10 ms, then 3 decode steps: 40 ms.
    assert res.ttft_seconds[0] == pytest.approx(0.015)
    assert res.e2e_seconds[0] == pytest.approx(0.045)
    assert res.tpot_seconds[0] == pytest.approx(0.01)
    # the benchmark's clock starts at the client's send: one request lasts its E2E, 45 ms (was 40)
    assert res.makespan_seconds == pytest.approx(0.045)
    assert bench_metrics(res).request_throughput_per_second == pytest.approx(1 / 0.045)


def test_the_clock_starts_before_the_first_send():
    """vllm bench serve starts its clock, then sleeps the first request's interval before sending
    it (get_request): one request sent at the workload's t = 1 s (the engine sees it 5 ms later,
    at the simulation's 1.0: its send is at 0.995, the clock's 0 at -0.005) lasts 45 ms (40 in
    the engine), so the benchmark takes 1 + 0.045 = 1.045 s. From the first send it would be
    45 ms, 23x the rate asked."""
    res = simulate([SimRequest(1.0, 10, 4)], EngineLimits(BIG_KV, 8, 100), const, 0.005)
    assert bench_metrics(res).duration_seconds == pytest.approx(0.045)
    m = bench_metrics(res, -0.005)
    assert m.duration_seconds == pytest.approx(1.045)
    assert m.request_throughput_per_second == pytest.approx(1 / 1.045)
    # a clock start after the first send is the first send (the clock cannot start later)
    assert bench_metrics(res, 2.0).duration_seconds == pytest.approx(0.045)


def test_burst_drains_and_later_steps_are_faster():
    """4 requests of output 10 and 4 of output 100, 10 prompt tokens each, all at t=0.

    Step 1 prefills all 80 tokens (8 first tokens). Steps 2..10 decode 8 requests: the short
    ones emit tokens 2..10 and finish at step 10. Steps 11..100 decode only the 4 long ones.
    With step time 1 ms + 1 ms per decoding sequence, steps 2..10 take 9 ms, later ones 5 ms.
    """
    reqs = [SimRequest(0, 10, 10)] * 4 + [SimRequest(0, 10, 100)] * 4
    res = simulate(reqs, EngineLimits(BIG_KV, 64, 1000), lambda load: 0.001 * (1 + load.decode_seqs))
    decode_seqs = [load.decode_seqs for load in res.step_loads]
    assert decode_seqs == [0] + [8] * 9 + [4] * 90
    assert res.step_seconds[1] == pytest.approx(0.009)
    assert res.step_seconds[-1] == pytest.approx(0.005)
    short_e2e = 0.001 + 9 * 0.009
    assert res.e2e_seconds[:4] == pytest.approx((short_e2e,) * 4)
    assert res.e2e_seconds[4:] == pytest.approx((short_e2e + 90 * 0.005,) * 4)


def test_max_num_seqs_queues_the_rest():
    """max_num_seqs 1: B (10/2) waits for A (10/2): A prefill 10 ms, decode 20 ms; B 30, 40."""
    res = simulate([SimRequest(0, 10, 2)] * 2, EngineLimits(BIG_KV, 1, 100), const)
    assert res.ttft_seconds == pytest.approx((0.01, 0.03))
    assert res.e2e_seconds == pytest.approx((0.02, 0.04))


def test_preemption_with_a_tiny_kv_cache():
    """KV of 4 blocks of 4 tokens; A and B: prompt 4, output 6 (peak KV 9 tokens = 3 blocks).

    step 1: both prefill (1 block each). steps 2..4: both decode, A's and B's computed tokens
    4 -> 5 needs a 2nd block each at step 2 (4 used). Step 6 (computed 8 -> 9) needs a 3rd
    block for A: none free, so B (admitted last) is preempted: one preemption at least, and
    both finish, B's tokens recomputed.
    """
    reqs = [SimRequest(0, 4, 6), SimRequest(0, 4, 6)]
    res = simulate(reqs, EngineLimits(16, 8, 100, block_size_tokens=4), const)
    assert res.num_preemptions >= 1
    assert res.e2e_seconds[0] < res.e2e_seconds[1]
    # A never waits: 1 prefill step + 5 decode steps.
    assert res.e2e_seconds[0] == pytest.approx(0.06)
    # B's recompute prefill carries its prompt and generated tokens again.
    assert any(load.prefill_tokens > 4 for load in res.step_loads[1:])
    assert len(bench_metrics(res).itl_seconds.__dict__) == 3
    assert res.irregular_itl_seconds and min(res.irregular_itl_seconds) > STEP


def test_request_that_never_fits_raises():
    with pytest.raises(ValueError, match="request 1"):
        simulate([SimRequest(0, 4, 2), SimRequest(0, 100, 100)], EngineLimits(64, 8, 100), const)


def test_clock_jumps_to_next_arrival():
    res = simulate(
        [SimRequest(0, 5, 1), SimRequest(1.0, 5, 1)], EngineLimits(BIG_KV, 8, 100), const
    )
    assert res.ttft_seconds == pytest.approx((0.01, 0.01))
    assert res.tpot_seconds == (None, None)
    assert res.makespan_seconds == pytest.approx(1.01)


def test_replicas_round_robin_halves_the_batch():
    reqs = [SimRequest(0, 10, 5)] * 4
    one = simulate(reqs[::2], EngineLimits(BIG_KV, 8, 100), const)
    two = simulate_replicas(reqs, 2, EngineLimits(BIG_KV, 8, 100), const)
    assert two.e2e_seconds == pytest.approx(one.e2e_seconds * 2)
    assert len(two.step_seconds) == 2 * len(one.step_seconds)


def test_a_client_limit_below_the_replicas_keeps_that_many_busy():
    """vllm bench serve's --max-concurrency is one semaphore over all requests: 2 slots over
    4 replicas keep 2 requests in flight, not one per replica. 8 identical requests of 10
    prompt and 5 output tokens, each alone taking E2E t: 2 at a time, so the burst takes 4 t
    (it took 2 t with each replica given a slot of its own)."""
    reqs = [SimRequest(0, 10, 5)] * 8
    alone = simulate(reqs[:1], EngineLimits(BIG_KV, 8, 100), const).e2e_seconds[0]
    limited = simulate_replicas(reqs, 4, EngineLimits(BIG_KV, 8, 100), const, max_concurrency=2)
    assert limited.last_completion_seconds - limited.first_arrival_seconds == pytest.approx(4 * alone)
    # 3 slots over 4 replicas: 3 at a time, the last 2 requests in a third wave
    three = simulate_replicas(reqs, 4, EngineLimits(BIG_KV, 8, 100), const, max_concurrency=3)
    assert three.last_completion_seconds - three.first_arrival_seconds == pytest.approx(3 * alone)


def test_a_client_limit_between_dp_and_twice_dp_keeps_every_slot_busy():
    """One semaphore, least-loaded dispatch: 24 identical requests (10 prompt, 5 output tokens)
    over 8 replicas whose steps take the same 10 ms however full; one request alone takes
    E2E t. 8 slots: 3 waves of 8, 3 t. 12 slots: 12 at once (4 replicas run 2, 4 run 1), all
    done at t, then the other 12: 2 t. (Splitting 12 slots statically, 2 to each of the
    first 4 replicas and 1 to the rest, left 3 requests queued on each 1-slot replica: 3 t.)"""
    reqs = [SimRequest(0, 10, 5)] * 24
    limits = EngineLimits(BIG_KV, 8, 100)
    alone = simulate(reqs[:1], limits, const).e2e_seconds[0]
    for slots, waves in ((8, 3), (12, 2), (16, 2), (24, 1)):
        res = simulate_replicas(reqs, 8, limits, const, max_concurrency=slots)
        assert res.makespan_seconds == pytest.approx(waves * alone), slots


def test_a_client_limit_below_the_groups_spreads_over_them():
    """Two EP groups of two ranks in lockstep, 2 client slots, four requests (1,000-token prompts
    and a 100-token one, 2 output tokens each; 1 s + 10 ms per prompt token a step): the first
    two go to one rank of each group, so neither waits on the other's prompt. Request 0
    (1,000 tokens) runs alone in group 0: 11 s + 1 s, E2E 12 s; request 1 (100 tokens) in
    group 1: 2 s + 1 s, E2E 3 s (packed into group 0 it would have taken 12 s in lockstep)."""
    limits = EngineLimits(BIG_KV, 8, 2048)
    reqs = [SimRequest(0.0, 1000, 2), SimRequest(0.0, 100, 2), SimRequest(0.0, 100, 2), SimRequest(0.0, 100, 2)]
    res = simulate_replicas(reqs, 4, limits, _prompt_priced, max_concurrency=2, lockstep_ranks=2,
                            group_step_seconds=lambda loads: max(_prompt_priced(x) for x in loads))
    assert res.e2e_seconds[:2] == (12.0, 3.0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.integers(1, 20)), min_size=1, max_size=24),
       st.integers(1, 6), st.integers(1, 3))
def test_dispatching_a_burst_at_once_matches_the_fixed_split(shapes, replicas, ranks):
    """All requests at t = 0 with no client limit: least-loaded dispatch hands request k to group
    k mod g, rank (k // g) mod d, exactly the split simulate_replicas fixes in advance (and
    deduplicates); the two agree request by request."""
    requests = [SimRequest(0.0, i, o) for i, o in shapes]
    limits = EngineLimits(BIG_KV, 8, 512)
    def group(loads):
        return max(_prompt_priced(x) for x in loads)

    fixed = simulate_replicas(requests, replicas, limits, _prompt_priced, lockstep_ranks=ranks,
                              group_step_seconds=group)
    groups = [list(range(f, min(f + ranks, replicas))) for f in range(0, replicas, ranks)]
    live = _simulate_dispatched(requests, list(range(len(requests))), groups, limits, group, 0.0, None)
    assert live.e2e_seconds == pytest.approx(fixed.e2e_seconds)
    assert live.ttft_seconds == pytest.approx(fixed.ttft_seconds)
    assert sorted(live.step_seconds) == pytest.approx(sorted(fixed.step_seconds))


def test_a_request_alone_is_replayed_and_a_second_one_makes_its_steps_real():
    """One replica, 10 ms steps, budget 200. A (100 prompt, 5 output tokens) sent at 0 runs alone:
    its prefill step ends at 10 ms (TTFT 10 ms), 4 decode steps end at 50 ms (E2E 50 ms). B
    (100, 2) sent at 25 ms, during A's third step [20, 30): taken in at 30, its prefill shares
    A's fourth step, first token at 40 ms (TTFT 15 ms), second at 50 ms (E2E 25 ms). C (100, 2)
    sent at 60 ms, the engine idle: alone, TTFT 10 ms, E2E 20 ms. A's solo is stepped from its
    start once B comes; C's is replayed (the same request alone, simulated once)."""
    requests = [SimRequest(0.0, 100, 5), SimRequest(0.025, 100, 2), SimRequest(0.060, 100, 2)]
    limits = EngineLimits(BIG_KV, 8, 200)
    for replay in (True, False):
        res = simulate_replicas(requests, 1, limits, const, replay_solos=replay)
        assert res.ttft_seconds == pytest.approx((0.010, 0.015, 0.010)), replay
        assert res.e2e_seconds == pytest.approx((0.050, 0.025, 0.020)), replay
        assert len(res.step_seconds) == 5 + 2  # A's five (B rides in two of them), C's two
        assert res.last_completion_seconds == pytest.approx(0.080)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(0.0, 6.0), st.sampled_from([(40, 3), (300, 12), (7, 1)])), min_size=1,
                max_size=30),
       st.integers(1, 6), st.integers(1, 2), st.sampled_from([None, 1, 3]), st.sampled_from([(), (0.8, 0.5)]),
       st.sampled_from([400, BIG_KV]))
def test_replaying_solos_matches_stepping_every_request(gaps, replicas, ranks, client_slots, drafts, kv_tokens):
    """Requests at random gaps (steps of 1-4 s: some run alone, some meet) over replicas
    (lockstep groups of `ranks`), with or without a client limit, speculative decoding and a
    KV cache that preempts: replaying each request that runs alone gives the same latencies,
    steps and makespan as stepping it."""
    arrival, requests = 0.0, []
    for gap, (prompt, output) in gaps:
        arrival += gap
        requests.append(SimRequest(arrival, prompt, output))
    limits = EngineLimits(kv_tokens, 8, 128, draft_acceptance=drafts)
    def group(loads):
        return max(_prompt_priced(x) for x in loads) + 0.001 * len(loads)

    runs = [simulate_replicas(requests, replicas * ranks, limits, _prompt_priced, max_concurrency=client_slots,
                              lockstep_ranks=ranks, group_step_seconds=group, replay_solos=replay)
            for replay in (True, False)]
    replayed, stepped = runs
    assert replayed.ttft_seconds == pytest.approx(stepped.ttft_seconds, rel=1e-9, abs=1e-12)
    assert replayed.e2e_seconds == pytest.approx(stepped.e2e_seconds, rel=1e-9, abs=1e-12)
    for mine, theirs in zip(replayed.tpot_seconds, stepped.tpot_seconds, strict=True):  # None for one token
        assert mine == theirs or mine == pytest.approx(theirs, rel=1e-9, abs=1e-12)
    assert sorted(replayed.step_seconds) == pytest.approx(sorted(stepped.step_seconds), rel=1e-12)
    assert sum(replayed.step_num_regular_itl) == sum(stepped.step_num_regular_itl)
    assert sorted(replayed.irregular_itl_seconds) == pytest.approx(sorted(stepped.irregular_itl_seconds), rel=1e-9)
    assert replayed.num_preemptions == stepped.num_preemptions
    assert replayed.makespan_seconds == pytest.approx(stepped.makespan_seconds, rel=1e-12)


def test_weighted_percentile_is_numpy_linear():
    # np.percentile([1, 2, 2, 5], 50) = 2.0; at 99: pos 2.97 -> 2 + 0.97*3 = 4.91.
    assert weighted_percentile([(2.0, 2), (1.0, 1), (5.0, 1)], 50) == pytest.approx(2.0)
    assert weighted_percentile([(2.0, 2), (1.0, 1), (5.0, 1)], 99) == pytest.approx(4.91)
    assert weighted_percentile([], 99) == 0.0


requests_st = st.lists(
    st.builds(
        SimRequest,
        st.floats(0, 0.2, allow_nan=False),
        st.integers(1, 200),
        st.integers(1, 60),
    ),
    min_size=1,
    max_size=25,
)


def _step_time(load: StepLoad) -> float:
    return 0.001 + 1e-5 * load.decode_seqs + 1e-6 * load.prefill_tokens


@settings(max_examples=150, deadline=None)
@given(
    reqs=requests_st,
    kv_blocks=st.integers(16, 200),
    max_seqs=st.integers(1, 16),
    budget=st.integers(1, 300),
    block=st.sampled_from([1, 4, 16]),
)
def test_properties(reqs, kv_blocks, max_seqs, budget, block):
    limits = EngineLimits(kv_blocks * 16, max_seqs, budget, block)
    if any(
        math.ceil((r.input_len + r.output_len - 1) / block) > kv_blocks * 16 // block for r in reqs
    ):
        with pytest.raises(ValueError):
            simulate(reqs, limits, _step_time)
        return
    res = simulate(reqs, limits, _step_time)
    for r, ttft, e2e in zip(reqs, res.ttft_seconds, res.e2e_seconds, strict=True):
        assert 0 < ttft <= e2e
        assert r.arrival_seconds + e2e <= res.last_completion_seconds + 1e-9
    # Every token after the first is one inter-token latency.
    num_itl = sum(res.step_num_regular_itl) + len(res.irregular_itl_seconds)
    assert num_itl == sum(r.output_len - 1 for r in reqs)
    # The engine never schedules more than its budget or its KV cache.
    for load in res.step_loads:
        assert load.decode_seqs + load.prefill_tokens <= budget
        assert load.decode_seqs <= max_seqs
    # Prefill tokens: each prompt once, plus what preemption recomputes.
    total_prefill = sum(load.prefill_tokens for load in res.step_loads)
    assert total_prefill >= sum(r.input_len for r in reqs)
    if res.num_preemptions == 0:
        assert total_prefill == sum(r.input_len for r in reqs)


@settings(max_examples=80, deadline=None)
@given(reqs=requests_st, max_seqs=st.integers(1, 16), budget=st.integers(1, 300))
def test_a_kv_cache_that_never_preempts_matches_an_unbounded_one(reqs, max_seqs, budget):
    """KV large enough for every request at once gives the same schedule as an infinite one.

    (Monotonicity of the makespan in KV size in general is false for FCFS with preemption:
    a preemption can happen to reorder work favourably, so only this equality is tested.)
    """
    enough = sum(r.input_len + r.output_len for r in reqs) + 16 * len(reqs)
    a = simulate(reqs, EngineLimits(enough, max_seqs, budget), const)
    b = simulate(reqs, EngineLimits(BIG_KV, max_seqs, budget), const)
    assert a.num_preemptions == 0
    assert a.e2e_seconds == b.e2e_seconds


def test_max_concurrency_closed_loop_by_hand():
    """vllm bench serve --max-concurrency 2 with 4 requests (10 prompt tokens, 3 output
    tokens) all due at t = 0, a constant 10 ms step and a 5 ms client-engine path (the
    first-token extra: the response's way back plus the next request's way in).
    r0, r1 are sent at -5 ms (so that each TTFT carries the 5 ms), reach the engine at 0:
    step 0 (0-10 ms) prefills both, first tokens at 10 ms; steps 1-2 decode, both finish at
    30 ms: TTFT 10 + 5 = 15 ms, E2E 30 + 5 = 35 ms. Their slots free at 30 ms: r2, r3 are
    sent then and reach the engine at 35 ms, idle until then; step 3 (35-45 ms) prefills
    them, they finish at the end of step 5 (65 ms): TTFT 45 - 30 = 15 ms, E2E 65 - 30 = 35 ms.
    The burst lasts from 0 to 65 ms."""
    requests = [SimRequest(0.0, 10, 3) for _ in range(4)]
    limits = EngineLimits(kv_cache_tokens=10_000, max_num_seqs=8, max_num_batched_tokens=1000)
    result = simulate(requests, limits, lambda load: 0.010, first_token_extra_seconds=0.005, max_concurrency=2)
    assert result.ttft_seconds == pytest.approx((0.015,) * 4)
    assert result.e2e_seconds == pytest.approx((0.035,) * 4)
    assert len(result.step_seconds) == 6
    assert result.last_completion_seconds == pytest.approx(0.065)


def test_without_a_limit_every_request_is_sent_at_its_arrival():
    """The same burst with no concurrency limit: all four prefill in step 0 and finish at
    30 ms (TTFT 15 ms, E2E 35 ms each, with the 5 ms path)."""
    requests = [SimRequest(0.0, 10, 3) for _ in range(4)]
    limits = EngineLimits(kv_cache_tokens=10_000, max_num_seqs=8, max_num_batched_tokens=1000)
    result = simulate(requests, limits, lambda load: 0.010, first_token_extra_seconds=0.005)
    assert result.ttft_seconds == pytest.approx((0.015,) * 4)
    assert result.e2e_seconds == pytest.approx((0.035,) * 4)
    assert len(result.step_seconds) == 3


def test_burst_steps_are_priced_at_a_bucketed_context():
    """Exact below 256 tokens; above, a multiple of 2^(floor(log2 x) - 7): 100,003 in
    [2^16, 2^17) -> multiples of 512, 100,003 / 512 = 195.3 -> 99,840 (0.16% off)."""
    from planner.serve import context_bucket_tokens
    assert context_bucket_tokens(255) == 255
    assert context_bucket_tokens(257) == 256
    assert context_bucket_tokens(1000) == 1000  # [512, 1024): multiples of 4
    assert context_bucket_tokens(100_003) == 99_840


# ---------------------------------------------------------------- DP ranks in lockstep


def _prompt_priced(load: StepLoad) -> float:
    """1 s per step + 10 ms per prompt token."""
    return 1.0 + 0.01 * load.prefill_tokens


def test_lockstep_ranks_wait_for_the_busiest_by_hand():
    """Two ranks, one request each at t = 0: rank 0 a 100-token prompt, rank 1 a 1000-token
    one, two output tokens each, a budget that takes either prompt in one step. Alone, rank 0
    steps 1 + 1 = 2 s (prefill, first token) then 1 s (second token): TTFT 2 s, E2E 3 s; rank 1
    11 s then 1 s: 11 s and 12 s. In lockstep every step lasts its slower rank's: 11 s, then
    1 s, so both requests see TTFT 11 s and E2E 12 s."""
    limits = EngineLimits(BIG_KV, 8, 2048)
    ranks = [[SimRequest(0.0, 100, 2)], [SimRequest(0.0, 1000, 2)]]
    alone = [simulate(reqs, limits, _prompt_priced) for reqs in ranks]
    assert [(r.ttft_seconds[0], r.e2e_seconds[0]) for r in alone] == [(2.0, 3.0), (11.0, 12.0)]
    group = simulate_lockstep(ranks, limits, lambda loads: max(_prompt_priced(x) for x in loads))
    assert [(r.ttft_seconds[0], r.e2e_seconds[0]) for r in group] == [(11.0, 12.0), (11.0, 12.0)]
    merged = simulate_replicas([SimRequest(0.0, 100, 2), SimRequest(0.0, 1000, 2)], 2, limits, _prompt_priced,
                               lockstep_ranks=2, group_step_seconds=lambda loads: max(_prompt_priced(x) for x in loads))
    assert merged.e2e_seconds == (12.0, 12.0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.integers(1, 20)), min_size=1, max_size=24), st.integers(2, 4))
def test_lockstep_never_finishes_a_request_sooner(shapes, ranks):
    """All requests at t = 0, no client limit: each rank schedules the same steps in lockstep
    as alone (its step count does not depend on time), and every step lasts at least its own,
    so no request finishes sooner."""
    requests = [SimRequest(0.0, i, o) for i, o in shapes]
    limits = EngineLimits(BIG_KV, 8, 512)
    alone = simulate_replicas(requests, ranks, limits, _prompt_priced)
    group = simulate_replicas(requests, ranks, limits, _prompt_priced, lockstep_ranks=ranks,
                              group_step_seconds=lambda loads: max(_prompt_priced(x) for x in loads))
    assert all(g >= a - 1e-9 for g, a in zip(group.e2e_seconds, alone.e2e_seconds, strict=True))


def test_a_prompt_waits_until_its_whole_sequence_fits():
    """vLLM admits a request only when its whole prompt's blocks are free
    (scheduler_reserve_full_isl, on by default), though it allocates one chunk. KV of 8 blocks
    of 4 tokens, budget 16: A (prompt 24, output 8) takes 4 blocks in step 1 and 6 in step 2,
    leaving 2 free; B (prompt 24, 6 blocks) is not admitted on a first chunk of 8 that would
    fit, so when A's decode needs its 7th block in step 3 there is no B to preempt: 0
    preemptions, and B starts after A finishes (at 8 blocks A holds them all)."""
    reqs = [SimRequest(0, 24, 8), SimRequest(0, 24, 1)]
    res = simulate(reqs, EngineLimits(32, 8, 16, block_size_tokens=4), const)
    assert res.num_preemptions == 0
    assert res.ttft_seconds[1] > res.e2e_seconds[0]


def test_first_wave_by_hand():
    """Four 100-token prompts, one output token each, two clients, a 100-token budget and 1 s
    steps: request 0 and 1 are sent at 0 s and prefill in steps 1 and 2 (TTFT 1 s and 2 s);
    request 2 is sent when request 0 completes (1 s) and queues behind request 1, so it prefills
    in step 3 (TTFT 3 - 1 = 2 s); request 3, sent at 2 s, in step 4 (2 s). The first wave
    averages 1.5 s, the later two 2 s, and the burst's mean (2 x 1.5 + 2 x 2) / 4 = 1.75 s."""
    result = simulate([SimRequest(0.0, 100, 1)] * 4, EngineLimits(10**6, 8, 100), lambda load: 1.0,
                      max_concurrency=2)
    assert result.ttft_seconds == (1.0, 2.0, 2.0, 2.0)
    assert first_wave(result, 2) == FirstWave(2, 1.5, 2, 2.0)
    assert bench_metrics(result).ttft_seconds.mean == pytest.approx(1.75)
    assert first_wave(result, 4) is None  # nothing comes after the first wave
