"""vLLM's async scheduling: step k + 1 is scheduled as step k starts, so a request that reaches a
busy engine during step k joins step k + 2 (planner/cost/serving_sim.py, "Async scheduling";
the steady state's round ahead in planner/cost/continuous_batching.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.continuous_batching import steady_state
from planner.cost.serving_sim import EngineLimits, SimRequest, StepLoad, simulate, simulate_replicas
from planner.engines import EngineVersions
from planner.requests import ServeRequest, Speculation

STEP = 0.01
BIG_KV = 10**7


def const(_: StepLoad) -> float:
    return STEP


def test_a_request_that_comes_mid_step_skips_the_step_scheduled_ahead():
    """One replica, 10 ms steps, budget 200. A (100 prompt, 5 output tokens) sent at 0: prefill
    [0, 10), decodes [10, 50). B (100, 2) sent at 25 ms, during A's third step [20, 30).
    Without async scheduling B is taken in when that step ends: prefill [30, 40) beside A's
    decode, TTFT 15 ms, E2E 25 ms. With it, step [30, 40) was scheduled at 20 ms, when that
    step began, before B came; B is taken in at 30 ms for step [40, 50): first token at 50 ms
    (TTFT 25 ms), second at 60 ms (E2E 35 ms). C (100, 2) sent at 70 ms finds the engine idle:
    TTFT 10 ms, E2E 20 ms either way. A is the same either way: its steps are scheduled
    ahead, but its tokens come every step."""
    requests = [SimRequest(0.0, 100, 5), SimRequest(0.025, 100, 2), SimRequest(0.070, 100, 2)]
    for ahead, ttft, e2e in ((False, (0.010, 0.015, 0.010), (0.050, 0.025, 0.020)),
                             (True, (0.010, 0.025, 0.010), (0.050, 0.035, 0.020))):
        limits = EngineLimits(BIG_KV, 8, 200, schedules_ahead=ahead)
        for replay in (True, False):
            res = simulate_replicas(requests, 1, limits, const, replay_solos=replay)
            assert res.ttft_seconds == pytest.approx(ttft), (ahead, replay)
            assert res.e2e_seconds == pytest.approx(e2e), (ahead, replay)


def test_a_step_ahead_with_nothing_to_carry_lets_the_next_arrival_in_at_once():
    """A (100, 2) sent at 0: prefill [0, 10), its last token [10, 20). B (100, 2) sent at 15 ms.
    The step after A's last one would be scheduled at 10 ms with nothing in it (A ends in
    [10, 20)): vLLM's engine blocks on the step in progress and schedules what came meanwhile
    as it ends, so B is taken in at 20 ms as without async scheduling: TTFT 15 ms."""
    requests = [SimRequest(0.0, 100, 2), SimRequest(0.015, 100, 2)]
    for ahead in (False, True):
        res = simulate(requests, EngineLimits(BIG_KV, 8, 200, schedules_ahead=ahead), const)
        assert res.ttft_seconds == pytest.approx((0.010, 0.015)), ahead


def test_lockstep_ranks_schedule_ahead_too():
    """Two ranks in lockstep, 10 ms steps: rank 0 runs A (100, 5) from 0; rank 1's B (100, 2)
    comes at 25 ms. With async scheduling the group's step [30, 40) was scheduled at 20 ms, so B
    waits for [40, 50): TTFT 25 ms (15 without)."""
    from planner.cost.serving_sim import simulate_lockstep

    for ahead, ttft in ((False, 0.015), (True, 0.025)):
        limits = EngineLimits(BIG_KV, 8, 200, schedules_ahead=ahead)
        _, rank1 = simulate_lockstep([[SimRequest(0.0, 100, 5)], [SimRequest(0.025, 100, 2)]], limits,
                                     lambda loads: STEP)
        assert rank1.ttft_seconds == pytest.approx((ttft,)), ahead


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(0.0, 0.05), st.integers(1, 300)), min_size=1, max_size=40))
def test_single_token_outputs_never_wait_for_a_step_ahead(arrivals):
    """With one output token and prompts that are never chunked (a budget above the whole burst)
    every request ends in the step that carries its prompt, so the step scheduled ahead is
    always empty and async scheduling changes nothing. (A chunked prompt's next chunk does fill
    it: 257 tokens over a 256-token budget, a prompt sent during the first chunk waits for the
    second.)"""
    t, requests = 0.0, []
    for gap, prompt in arrivals:
        t += gap
        requests.append(SimRequest(t, prompt, 1))

    def priced(load: StepLoad) -> float:
        return 0.002 + 1e-4 * load.prefill_tokens

    runs = [simulate(requests, EngineLimits(BIG_KV, 64, 40 * 300, schedules_ahead=ahead), priced)
            for ahead in (False, True)]
    assert runs[0].ttft_seconds == pytest.approx(runs[1].ttft_seconds, rel=1e-12, abs=1e-15)
    chunked = [SimRequest(0.0, 257, 1), SimRequest(0.015625, 1, 1)]
    waits = [simulate(chunked, EngineLimits(BIG_KV, 64, 256, schedules_ahead=ahead), priced).ttft_seconds[1]
             for ahead in (False, True)]
    assert waits[1] > waits[0]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(0.0, 0.05), st.integers(1, 300), st.integers(2, 20)), min_size=1,
                max_size=40))
def test_async_scheduling_never_brings_a_first_token_sooner(arrivals):
    """Taking in arrivals a step earlier than they come can only delay them: every request's
    TTFT is at least what it is without async scheduling, at the same step costs."""
    t, requests = 0.0, []
    for gap, prompt, output in arrivals:
        t += gap
        requests.append(SimRequest(t, prompt, output))
    runs = [simulate(requests, EngineLimits(BIG_KV, 64, 4096, schedules_ahead=ahead), const)
            for ahead in (False, True)]
    for before, after in zip(runs[0].ttft_seconds, runs[1].ttft_seconds, strict=True):
        assert after >= before - 1e-12


def flat_round(*_args, **_kwargs) -> float:
    return STEP


@pytest.mark.parametrize("open_loop", [False, True])
def test_the_steady_state_waits_out_the_round_scheduled_ahead(open_loop):
    """Every round 10 ms whatever it carries, 4 requests (in flight, or on average at a rate),
    100 prompt tokens (one chunk), 20 output tokens. Async scheduling adds the round scheduled
    ahead to a new request's TTFT when it finds the engine busy: (C - 1) / C = 0.75 of a round
    in a closed loop of 4, +7.5 ms; at a rate 1 - e^-C_e of one, C_e = 4 (1 - 10 ms / E2E) the
    requests the engine holds (E2E = 10 ms + 1 + 1 + 19 rounds of 10 ms plus the waits, about
    0.23 s: C_e = 3.83, 1 - e^-3.83 = 0.978, +9.78 ms)."""
    runs = [steady_state(4, 100, 20, 1000, 1, flat_round, 0.010, open_loop=open_loop, schedules_ahead=ahead)
            for ahead in (False, True)]
    held = 4 * (1 - 0.010 / runs[1].e2e_seconds)
    busy = -math.expm1(-held) if open_loop else 0.75
    assert runs[1].ahead_seconds == pytest.approx(busy * STEP, rel=1e-6)
    assert runs[0].ahead_seconds == 0.0
    assert runs[1].ttft_seconds - runs[0].ttft_seconds == pytest.approx(busy * STEP, rel=0.01)
    if open_loop:
        assert busy == pytest.approx(0.978, abs=0.001)
    assert runs[1].decode_round_seconds == runs[0].decode_round_seconds


def test_single_token_outputs_wait_for_no_round_ahead():
    """One output token and one-chunk prompts: no decodes, the step scheduled ahead is empty;
    TTFT is unchanged. Prompts of two chunks (1,500 tokens over a 1,000-token budget, arriving
    at a rate, 0.5 in the replica on average) fill it."""
    runs = [steady_state(4, 100, 1, 1000, 1, flat_round, 0.010, schedules_ahead=ahead) for ahead in (False, True)]
    assert runs[1].ttft_seconds == runs[0].ttft_seconds
    runs = [steady_state(0.5, 1500, 1, 1000, 1, flat_round, 0.010, open_loop=True, schedules_ahead=ahead)
            for ahead in (False, True)]
    assert runs[1].ttft_seconds > runs[0].ttft_seconds


def test_each_release_says_whether_it_schedules_ahead():
    """vLLM 0.33.0 and 0.22.0 turn async scheduling on unless something excludes it (0.22.0:
    ngram speculation); 0.6.6.post1's V0 engine has none; --no-async-scheduling turns it off."""
    ngram = Speculation("ngram", 3, (0.5,))
    assert ServeRequest().schedules_ahead
    assert ServeRequest(speculation=ngram).schedules_ahead
    assert not ServeRequest(engine_versions=EngineVersions(vllm="0.22.0"), speculation=ngram).schedules_ahead
    assert ServeRequest(engine_versions=EngineVersions(vllm="0.22.0")).schedules_ahead
    assert not ServeRequest(engine_versions=EngineVersions(vllm="0.6.6.post1")).schedules_ahead
    assert not ServeRequest(async_scheduling=False).schedules_ahead


def run_cli(*args: str):
    from typer.testing import CliRunner

    from planner.cli import app

    return CliRunner().invoke(app, list(args))


BASE = ("--model", "llama-3.1-8b", "--cluster", "1x1xH100", "--input-len", "1024", "--output-len", "256",
        "--request-rate", "8")


def test_no_async_scheduling_is_priced_and_launched():
    """--no-async-scheduling: one round less of TTFT at a rate (the step scheduled ahead), the same
    TPOT, and the launch says so: vLLM's `--no-async-scheduling`, SGLang's
    `--disable-overlap-schedule` (its overlap scheduler schedules ahead the same way)."""
    import json

    on, off = (run_cli(*BASE, "--json", *flag) for flag in ((), ("--no-async-scheduling",)))
    assert on.exit_code == 0 and off.exit_code == 0, (on.output, off.output)
    on, off = (json.loads(r.stdout) for r in (on, off))
    assert (on["async_scheduling"], off["async_scheduling"]) == (True, False)
    on, off = on["recommended"], off["recommended"]
    assert off["ttft_seconds"] < on["ttft_seconds"]
    assert off["tpot_seconds"] == pytest.approx(on["tpot_seconds"], rel=0.01)
    vllm = run_cli(*BASE, "--no-async-scheduling")
    assert vllm.exit_code == 0 and "--no-async-scheduling" in vllm.stdout
    assert "--no-async-scheduling" not in run_cli(*BASE).stdout
    sglang = run_cli(*BASE, "--no-async-scheduling", "--emit", "sglang")
    assert sglang.exit_code == 0 and "--disable-overlap-schedule" in sglang.stdout


@pytest.mark.parametrize("args", [
    ("--async-scheduling", "--engine-version", "vllm=0.6.6.post1"),
    ("--async-scheduling", "--engine-version", "vllm=0.22.0", "--speculative-method", "ngram",
     "--num-speculative-tokens", "3", "--draft-acceptance", "0.5"),
])
def test_async_scheduling_where_the_release_cannot_run_it_is_a_usage_error(args):
    result = run_cli(*BASE, *args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--async-scheduling" in lines[0], result.output


def load_round(load: StepLoad, chunk: StepLoad | None = None, carriers: int = 1) -> float:
    """5 ms + 20 us a decode + 40 us per 1,000 prompt tokens (and a chunk's, when priced apart)."""
    tokens = load.prefill_tokens + (0.0 if chunk is None else chunk.prefill_tokens)
    return 0.005 + 2e-5 * load.decode_seqs + 4e-8 * tokens


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.floats(0.2, 64.0), st.integers(16, 20000), st.integers(1, 2000), st.sampled_from([512, 2048, 8192]),
       st.booleans())
def test_the_round_ahead_never_brings_the_first_token_sooner(concurrency, input_len, output_len, budget, open_loop):
    """The steady state's TTFT with async scheduling is never below its TTFT without it, at a
    rate or in a closed loop (of whole clients), whatever the prompts' chunking."""
    if not open_loop:
        concurrency = max(1, round(concurrency))
    runs = [steady_state(concurrency, input_len, output_len, budget, 1, load_round, 0.010, open_loop=open_loop,
                         schedules_ahead=ahead) for ahead in (False, True)]
    assert runs[1].ttft_seconds >= runs[0].ttft_seconds * (1 - 1e-9)


@pytest.mark.parametrize(("spec", "cluster_name", "degrees", "input_len", "output_len", "clients"), [
    ("llama-3.1-70b", "1x8xH100", (8, 1, 1), 1024, 256, 32),
    ("qwen3-30b-a3b", "1x2xH100", (2, 1, 1), 2048, 256, 64),
])
def test_a_closed_loops_steady_state_waits_as_its_simulation_does(monkeypatch, spec, cluster_name, degrees, input_len,
                                                                   output_len, clients):
    """C clients in a closed loop (--max-concurrency C, 20 C prompts, lengths within 10%): past
    the first waves (the first 2 C requests), the steady state's TTFT is the simulated one within
    6%, with async scheduling and without, and the step scheduled ahead adds about as much to
    both (Llama-3.1-70B tp=8 at 32 clients: +17.9 ms priced, +21.5 simulated; Qwen3-30B-A3B
    tp=2 at 64: +20.6 and +23.0). A closed loop's sends are locked to the step ends that free
    its clients, so the simulated wait for the step in progress depends on where the
    first-token cost and the prompt's tokenization put the arrival in the step; the steady
    state takes the mean: the 3.5 ms of Qwen3's 2,048-token tokenization moved its simulated
    TTFT by +0.5 ms (63.7 -> 64.2 ms, priced 64.1 -> 67.6, +5.4%)."""
    import statistics

    import planner.serve as serve
    from planner.catalog import resolve_cluster, resolve_model
    from planner.layout import Layout
    from planner.requests import LayoutFilter

    runs = []
    simulate_replicas_of_serve = serve.simulate_replicas
    monkeypatch.setattr(serve, "simulate_replicas", lambda *a, **k: runs.append(simulate_replicas_of_serve(*a, **k))
                        or runs[-1])
    model, cluster = resolve_model(spec), resolve_cluster(cluster_name)
    priced, simulated = [], []
    for ahead in (False, True):
        base = dict(input_len=input_len, output_len=output_len, batch=clients, layout=LayoutFilter(*degrees),
                    async_scheduling=ahead)
        estimate = serve.estimate(model, cluster, Layout(*degrees), ServeRequest(**base))
        serve.burst_metrics(model, cluster, estimate, ServeRequest(
            **base, num_prompts=20 * clients, max_concurrency=clients, request_rate_per_s=math.inf,
            random_range_ratio=0.1))
        settled = statistics.mean(runs[-1].ttft_seconds[2 * clients:])
        assert estimate.ttft_seconds == pytest.approx(settled, rel=0.06), ahead
        priced.append(estimate.ttft_seconds)
        simulated.append(settled)
    assert priced[1] - priced[0] == pytest.approx(simulated[1] - simulated[0], rel=0.25)
