"""PP whole prompts at a rate fall into a convoy (continuous_batching.convoy_capacity_per_s):
each round's arrivals ride one micro-batch through every stage, so a replica keeps up with
fewer requests a second than the spread steady state's capacity says. Worked by hand, and
checked against the step simulation (serving_sim, vLLM 0.33.0's batch queue)."""

from __future__ import annotations

import math

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.continuous_batching import convoy_capacity_per_s
from planner.cost.serving_time import StepLoad
from planner.requests import LayoutFilter, ServeRequest
from planner.serve import burst_metrics
from planner.serve_search import plan_serving


def affine_round(load: StepLoad, convoy: StepLoad | None) -> float:
    """R = 0.1 s + 1 ms a decoding sequence + 20 ms a whole prompt (0.02 s / 1,000 tokens)."""
    prompts = 0.0 if convoy is None else convoy.prefill_tokens / 1000
    return 0.1 + 0.001 * load.decode_seqs + 0.02 * prompts


def test_convoy_capacity_by_hand() -> None:
    """I = 1,000, O = 100 (D = 99 decode rounds), B = 4,000: q = B / I = 4 prompts a convoy,
    beside D q = 396 decodes; R(396, 4) - R0 = 0.396 + 0.08 = 0.476 s, so lambda = 4 / 0.476 =
    8.403 req/s, which is 1 / (a D + b) = 1 / (0.099 + 0.02) for this affine round whatever q."""
    assert convoy_capacity_per_s(affine_round, 1000, 100, 4000) == pytest.approx(4 / 0.476, rel=1e-12)
    assert convoy_capacity_per_s(affine_round, 1000, 100, 8000) == pytest.approx(1 / 0.119, rel=1e-12)


def test_convoy_capacity_is_the_fixed_points_edge() -> None:
    """Below the capacity the convoy's round T = R(lambda D T, lambda T) settles (iterated from
    the empty round it converges); past it the iteration grows without bound."""
    capacity = convoy_capacity_per_s(affine_round, 1000, 100, 4000)

    def settles(rate: float) -> bool:
        t = 0.1
        for _ in range(10_000):
            t = affine_round(StepLoad(rate * 99 * t, 0), StepLoad(0, 0, rate * t * 1000, 0, rate * t))
            if t > 1e6:
                return False
        return True

    assert settles(0.98 * capacity)
    assert not settles(1.02 * capacity)


def test_one_output_token_leaves_the_prompts_alone() -> None:
    """O = 1: no decodes, so lambda = q / (q b) = 1 / b = 50 req/s (each prompt adds its 20 ms
    to the convoy's path, however many ride it)."""
    assert convoy_capacity_per_s(affine_round, 1000, 1, 4000) == pytest.approx(50.0, rel=1e-12)


@pytest.mark.parametrize("layout", [dict(tp=2, pp=4), dict(tp=4, pp=2), dict(tp=1, pp=8)])
def test_pipelines_of_whole_prompts_convoy_below_the_spread_capacity(layout: dict) -> None:
    """Llama-3.1-70B on 8 H100, 1,024/256: the convoy pays each prompt's stage p times a round
    where the spread steady state pays it once, so its capacity is the lower; without PP there
    is no convoy (inf)."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100")
    capacity = plan_serving(model, cluster, ServeRequest(input_len=1024, output_len=256,
                                                         layout=LayoutFilter(**layout, dp=1))).recommended
    assert math.isinf(capacity.convoy_rate_per_s)  # priced under a rate only
    light = plan_serving(model, cluster, ServeRequest(input_len=1024, output_len=256, request_rate_per_s=0.5,
                                                      layout=LayoutFilter(**layout, dp=1))).recommended
    assert light.convoy_rate_per_s < capacity.throughput_tokens_per_second / 256
    flat = plan_serving(model, cluster, ServeRequest(input_len=1024, output_len=256, request_rate_per_s=0.5,
                                                     layout=LayoutFilter(tp=8, pp=1, dp=1))).recommended
    assert math.isinf(flat.convoy_rate_per_s)


def test_prompts_that_take_turns_do_not_convoy() -> None:
    """Two prompts exceed a step's budget (2 x 16,000 > 8,192): each takes micro-batches of its
    own (the lanes of steady_state), so no convoy is priced."""
    best = plan_serving(resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100"),
                        ServeRequest(input_len=16000, output_len=8, request_rate_per_s=0.1,
                                     layout=LayoutFilter(tp=2, pp=4, dp=1))).recommended
    assert math.isinf(best.convoy_rate_per_s)


def test_a_rate_past_the_convoy_is_overloaded_as_the_simulated_burst_shows() -> None:
    """Llama-3.1-70B tp=2 pp=4, 1,024/256 tokens: the convoy keeps up with 8.4 req/s, the
    spread steady state said 15.6. At 11 req/s the plan says overloaded (the convoy's note),
    and the step simulation's queue grows (its backlog check); at 7 req/s it keeps up and the
    simulation's does not."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100")
    pinned = LayoutFilter(tp=2, pp=4, dp=1)
    over = plan_serving(model, cluster, ServeRequest(input_len=1024, output_len=256, request_rate_per_s=11,
                                                     layout=pinned)).recommended
    assert over.overloaded and over.convoy_rate_per_s == pytest.approx(8.4, rel=0.02)
    assert any(note.startswith("Overloaded (convoy)") for note in over.notes)
    # it serves what the convoy completes, 8.4 x 256 tok/s, not the spread capacity's 15.6 x 256
    assert over.throughput_tokens_per_second == pytest.approx(over.convoy_rate_per_s * 256, rel=1e-9)
    request = ServeRequest(input_len=1024, output_len=256, request_rate_per_s=11, layout=pinned, num_prompts=1500)
    assert burst_metrics(model, cluster, over, request).backlog.growing
    fine = plan_serving(model, cluster, ServeRequest(input_len=1024, output_len=256, request_rate_per_s=7,
                                                     layout=pinned)).recommended
    assert not fine.overloaded and fine.offered_rate_per_s == 7
    request = ServeRequest(input_len=1024, output_len=256, request_rate_per_s=7, layout=pinned, num_prompts=1500)
    assert not burst_metrics(model, cluster, fine, request).backlog.growing


def test_json_carries_the_convoy_rate() -> None:
    """Under a rate the layout's JSON says the convoy's capacity per replica (8.4 req/s at tp=2
    pp=4, 1,024/256 on 8 H100); null where no convoy forms (tp=8: no PP) and without a rate."""
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    common = ["--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--input-len", "1024", "--output-len", "256",
              "--json"]
    rated = [*common, "--request-rate", "1", "--num-prompts", "50"]
    piped = json.loads(CliRunner().invoke(app, [*rated, "--layout", "tp=2,pp=4"]).output)["recommended"]
    assert piped["convoy_rate_per_second_per_replica"] == pytest.approx(8.4, rel=0.02)
    flat = json.loads(CliRunner().invoke(app, [*rated, "--layout", "tp=8"]).output)["recommended"]
    assert flat["convoy_rate_per_second_per_replica"] is None
    unrated = json.loads(CliRunner().invoke(app, [*common, "--layout", "tp=2,pp=4"]).output)["recommended"]
    assert unrated["convoy_rate_per_second_per_replica"] is None


def test_clients_hold_a_convoy_they_cannot_keep_up_with() -> None:
    """With --max-concurrency the clients hold the queue a convoy leaves growing: 11 req/s on
    tp=2 pp=4 (its convoy 8.4) with 1,000 clients is client-held, not kept up through the spread
    closed loop (which said 496 in flight and TPOT 176 ms; a 3,000-prompt simulated burst
    completes 10.3 req/s at TPOT 314 ms): the times are the clients' closed loop, and a note
    says why."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100")
    held = plan_serving(model, cluster, ServeRequest(input_len=1024, output_len=256, request_rate_per_s=11,
                                                     max_concurrency=1000,
                                                     layout=LayoutFilter(tp=2, pp=4, dp=1))).recommended
    assert held.offered_rate_per_s is None and not held.overloaded
    assert any(note.startswith("Client-held (convoy)") for note in held.notes)
    assert held.batch == 1000


def test_the_convoy_forms_only_where_prompts_share_a_step() -> None:
    """2 x 5,000 > 8,000 tokens: prompts take turns (prompts_take_turns), so no convoy (inf);
    2 x 4,000 = 8,000 still shares a step: q = 2, lambda = 1 / (0.099 + 0.08) = 5.587 req/s."""
    assert math.isinf(convoy_capacity_per_s(affine_round, 5000, 100, 8000))
    assert convoy_capacity_per_s(affine_round, 4000, 100, 8000) == pytest.approx(1 / 0.179, rel=1e-12)


def test_an_overloaded_convoy_serves_the_convoys_tokens_and_is_no_pareto_point() -> None:
    """Llama-3.1-405B on 2x8 H100 at 1 req/s of 1,024 / 256 tokens: tp=1 pp=16's convoy keeps
    up with less than the rate, so it is overloaded; its tokens/s are what the convoy completes
    (dp x its rate x 256), below the 256 tok/s the layouts that keep up serve, and it is not
    marked Pareto beside them (a CLI read: 376 tok/s and "pareto" before)."""
    plan = plan_serving(resolve_model("llama-3.1-405b"), resolve_cluster("2x8xH100"),
                        ServeRequest(request_rate_per_s=1.0, num_prompts=200, max_model_len=16384))
    piped = next(r for r in plan.layouts if (r.layout.tp, r.layout.pp) == (1, 16))
    assert piped.overloaded and piped.convoy_rate_per_s < 1.0
    assert piped.throughput_tokens_per_second == pytest.approx(piped.convoy_rate_per_s * 256, rel=1e-9)
    keeping = [r for r in plan.layouts if not r.overloaded]
    assert keeping and all(r.throughput_tokens_per_second == pytest.approx(256) for r in keeping)
    assert piped.layout not in plan.pareto and plan.pareto <= {r.layout for r in keeping}
