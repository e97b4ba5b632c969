"""vLLM's internal DP load balancer (planner/cost/dp_router.py) by hand, and as the step
simulation routes with it."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_model
from planner.cost.dp_router import SNAPSHOT_SECONDS, VllmDpRouter
from planner.cost.serving_sim import EngineLimits, SimRequest, StepLoad, simulate_replicas
from planner.engines import parse_engine_versions
from planner.layout import Layout
from planner.requests import ServeRequest
from planner.serve import vllm_balances_dp


def round_robin(d: int):
    """Servers in turn: request k to server k mod d."""
    sent = iter(range(10**9))
    return lambda: next(sent) % d


def routed(router: VllmDpRouter, counts: list[int], now: float = 0.0) -> tuple[int, int]:
    router.refresh(now, lambda: list(counts))
    engine, server = router.route()
    counts[engine] += 1
    return engine, server


def test_a_burst_goes_round_robin():
    """4 engines, 4 servers taking requests in turn, nothing finishing. Server c's
    first request scans from c (eng_start_index = 4 c // 4), every score 0: engine c; its own
    count there makes that engine's score 4, and its scan start moves to c + 1: its next goes to
    c + 1, and so on. So server c's j-th request lands on (c + j) mod 4, and 16 requests put 4 on
    each engine."""
    router, counts = VllmDpRouter(4, next_server=round_robin(4)), [0, 0, 0, 0]
    got = [routed(router, counts) for _ in range(16)]
    assert [server for _, server in got] == [k % 4 for k in range(16)]
    assert [engine for engine, _ in got] == [(k % 4 + k // 4) % 4 for k in range(16)]
    assert counts == [4, 4, 4, 4]


def test_servers_sharing_a_snapshot_herd_to_its_least_loaded_engine():
    """The snapshot at t = 0 holds [5, 3, 5, 5] requests in flight. Four requests within the
    same 100 ms, one from each server, none of which has requests of its own in flight: each
    scores engine 1 at 3 and the others at 5, and its own increment (+4 on engine 1) is its
    alone, so all four go to engine 1; the exact count would have sent them to 1, 1, 0, 1 (5, 4:
    then 5, 5, 5, 5 and ties). The next snapshot (t = 0.1 s: [5, 7, 5, 5]) turns them away."""
    router, counts = VllmDpRouter(4, next_server=round_robin(4)), [5, 3, 5, 5]
    assert [routed(router, counts, now)[0] for now in (0.0, 0.02, 0.05, 0.09)] == [1, 1, 1, 1]
    assert counts == [5, 7, 5, 5]
    assert routed(router, counts, SNAPSHOT_SECONDS)[0] != 1


def test_a_servers_own_count_outweighs_a_stale_snapshot():
    """d = 2: server 0 sends twice to engine 0 while the snapshot says [0, 0]: the first scores
    max(2 x 0, 0) = 0 at engine 0 (its scan starts at 0); the second (server 0 again: requests 0,
    2, with server 1's request 1 in between) scores engine 0 at max(2 x 1, 0 + 2 x 1) = 2 and
    engine 1 at max(0, 0) = 0: engine 1. After both of server 0's requests finish, its own
    count is 0 again and only the snapshot (and its increments) counts."""
    router, counts = VllmDpRouter(2, next_server=round_robin(2)), [0, 0]
    first, between, second = (routed(router, counts) for _ in range(3))
    assert (first, second) == ((0, 0), (1, 0))
    assert between[1] == 1
    router.finished(0, 0)
    router.finished(1, 0)
    assert router.own[0] == {}


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.lists(st.tuples(st.floats(0, 0.5), st.booleans()), min_size=1, max_size=60))
def test_each_servers_counts_add_up_to_the_engines(d, events):
    """Whatever the sends and finishes: the servers' own counts on an engine add up to its
    requests in flight, and no count goes below zero."""
    router, counts, now = VllmDpRouter(d), [0] * d, 0.0
    flying: list[tuple[int, int]] = []
    rng = random.Random(d)
    for gap, finish in events:
        now += gap
        if finish and flying:
            engine, server = flying.pop(rng.randrange(len(flying)))
            router.refresh(now, lambda: list(counts))
            router.finished(engine, server)
            counts[engine] -= 1
        else:
            flying.append(routed(router, counts, now))
    for e in range(d):
        assert sum(own.get(e, 0) for own in router.own) == counts[e]
        assert all(v > 0 for own in router.own for v in own.values())


def _prompt_step(load: StepLoad) -> float:
    return 0.005 + load.prefill_tokens * 2e-5


def test_the_simulated_deployment_routes_as_vllm_and_finishes_every_request():
    """8 dense replicas at 60 req/s of 1,024/64-token prompts (Poisson, seed 0): with vLLM's
    balancer every request still completes, the servers' counts end at zero, and the mean TTFT is
    no lower than with the exact count (which sends each prompt to the fewest in flight; the
    servers herd within a snapshot and collide on an engine's prompts)."""
    rng = random.Random(0)
    t, requests = 0.0, []
    for _ in range(600):
        t += rng.expovariate(60.0)
        requests.append(SimRequest(t, 1024, 64))
    limits = EngineLimits(10**7, 256, 2048)
    exact = simulate_replicas(requests, 8, limits, _prompt_step)
    vllm = simulate_replicas(requests, 8, limits, _prompt_step, dp_router="vllm")
    assert len(vllm.ttft_seconds) == 600 and all(x > 0 for x in vllm.e2e_seconds)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(vllm.ttft_seconds) >= mean(exact.ttft_seconds)
    # one replica: nothing to balance, the same run
    one = simulate_replicas(requests[:50], 1, limits, _prompt_step, dp_router="vllm")
    assert one == simulate_replicas(requests[:50], 1, limits, _prompt_step)


def test_which_deployments_vllm_balances():
    """A dense model's replicas and an EP group's ranks sit behind vLLM 0.33.0's balancer; an MoE
    model's replicas without EP, SGLang's servers, the V0 engine's and 0.22.0's do not."""
    dense, moe = resolve_model("llama-3.1-8b"), resolve_model("qwen3-30b-a3b")
    request = ServeRequest()
    assert vllm_balances_dp(dense, Layout(tp=1, pp=1, dp=8), request)
    assert not vllm_balances_dp(dense, Layout(tp=8, pp=1, dp=1), request)
    assert vllm_balances_dp(moe, Layout(tp=1, pp=1, dp=8, ep=8), request)
    assert not vllm_balances_dp(moe, Layout(tp=2, pp=1, dp=4), request)
    assert not vllm_balances_dp(dense, Layout(tp=1, pp=1, dp=8), ServeRequest(pool_engine="sglang"))
    v0 = ServeRequest(engine_versions=parse_engine_versions("vllm=0.6.6.post1"))
    assert not vllm_balances_dp(dense, Layout(tp=1, pp=1, dp=8), v0)
    # 0.22.0's balancer (4 waiting + running of the snapshot alone) is not the one modelled
    older = ServeRequest(engine_versions=parse_engine_versions("vllm=0.22.0"))
    assert not vllm_balances_dp(dense, Layout(tp=1, pp=1, dp=8), older)
