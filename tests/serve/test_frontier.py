"""`plan --frontier`: output tok/s per GPU against tok/s per user over a sweep of TPOT limits
(planner/frontier.py, planner/render/frontier.py): the sweep's targets and the Pareto front by
hand, their invariants, the sweep against the planner's own SLA search, and the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.frontier import FrontierCandidate, pareto_front, tpot_targets, trace_frontier
from planner.requests import ServeRequest
from planner.serve_search import plan_serving


def candidate(user: float, gpu: float, label: str = "x") -> FrontierCandidate:
    """A point at `user` tok/s per user (TPOT = 1 / user) and `gpu` tok/s per GPU."""
    return FrontierCandidate("aggregated", label, 1 / user, 0.1, gpu, 1, 8)


def test_targets_by_hand():
    """fastest 10 ms, peak 160 ms, 5 targets: the first is 10 x 1.02 = 10.2 ms; ratio
    (160 / 10.2)^(1/4) = 15.6863^0.25 = 1.990123; so 10.2, 10.2 x 1.990123 = 20.299,
    40.398, 80.397 and 160 ms, each rounded up to the 0.1 ms the frontier prints (the limit is
    the printed number): 10.2, 20.3, 40.4, 80.4, 160.0 ms."""
    targets = tpot_targets(0.010, 0.160, 5)
    assert [round(t * 1e3, 9) for t in targets] == [10.2, 20.3, 40.4, 80.4, 160.0]


def test_a_printed_limit_plans_again_to_the_same_point(run_plan):
    """The frontier's advice: plan again with --max-tpot-ms set to a point's printed TPOT limit
    and the SLA search picks the same deployment and concurrency (the limits were unrounded, and
    87.0 ms printed ran 206 sequences where --max-tpot-ms 87.0 gives 205)."""
    args = ("--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--mode", "aggregated")
    frontier = json.loads(run_plan(*args, "--frontier", "--json").stdout)
    for point in frontier["points"][-3:]:
        limit = f"{point['tpot_limit_seconds'] * 1e3:.1f}"
        again = json.loads(run_plan(*args, "--max-tpot-ms", limit, "--json").stdout)["layouts"][0]
        assert f"tp={again['tp']} pp={again['pp']} dp={again['dp']}" == point["aggregated"]["deployment"]
        assert again["concurrency"] == point["aggregated"]["concurrency"]


def test_one_target_when_the_ends_meet():
    """peak 10.1 ms is below 1.02 x 10 ms = 10.2 ms: one target, 10.2 ms."""
    assert tpot_targets(0.010, 0.0101, 5) == pytest.approx((0.0102,))


def test_pareto_front_by_hand():
    """(tok/s/user, tok/s/GPU): A (100, 10), B (50, 300), C (50, 200) loses to B on GPU,
    D (40, 300) loses to B on user, E (10, 600), F = B again (the first of equals is kept)."""
    a, b, c, d, e = (candidate(100, 10, "A"), candidate(50, 300, "B"), candidate(50, 200, "C"),
                     candidate(40, 300, "D"), candidate(10, 600, "E"))
    f = candidate(50, 300, "F")
    assert [p.label for p in pareto_front([a, b, c, d, e, f])] == ["A", "B", "E"]


points = st.lists(st.tuples(st.floats(1, 1000), st.floats(0, 1e5)), min_size=1, max_size=12)


def printed(c: FrontierCandidate) -> tuple[float, float]:
    """The list's figures: 0.1 tok/s per user, whole tok/s per GPU."""
    return round(c.tokens_per_second_per_user, 1), round(c.goodput_per_gpu)


@given(points)
def test_the_front_is_exactly_the_unbeaten(pairs):
    """At the printed figures: no member is beaten on both axes by any candidate; every
    candidate left out is matched or beaten on both by a member."""
    cands = [candidate(u, g, str(i)) for i, (u, g) in enumerate(pairs)]
    front = pareto_front(cands)
    assert front
    for m in front:
        assert not any(printed(c)[0] > printed(m)[0] and printed(c)[1] > printed(m)[1] for c in cands)
    for c in cands:
        if c not in front:
            assert any(printed(m)[0] >= printed(c)[0] and printed(m)[1] >= printed(c)[1] for m in front)


def test_points_equal_at_the_printed_figures_are_one():
    """26.50 and 26.49 tok/s/user (TPOT 37.74 and 37.75 ms) both print 26.5: the point at 187
    tok/s/GPU is beaten at the printed figures by the one at 609, and not listed (it was, beside
    it: a CLI read on DeepSeek-V3)."""
    fast, wide = candidate(26.50, 187, "aggregated"), candidate(26.49, 609, "disaggregated")
    assert [p.label for p in pareto_front([fast, wide])] == ["disaggregated"]


@pytest.fixture(scope="module")
def frontier_8b(model, cluster):
    return trace_frontier(model("llama-3.1-8b"), cluster("1x8xH100"), ServeRequest(input_len=1024, output_len=256))


def test_a_looser_limit_never_serves_fewer_tokens_per_gpu(frontier_8b):
    best = [p.best.goodput_per_gpu for p in frontier_8b.points]
    assert all(later >= earlier * (1 - 1e-9) for earlier, later in zip(best, best[1:], strict=False)), best
    assert best[-1] > 10 * best[0]  # from one lone request to the peak: the curve spans its range


def test_every_point_meets_its_limit(frontier_8b):
    for p in frontier_8b.points:
        for c in (p.aggregated, p.disaggregated):
            if c is not None:
                assert c.tpot_seconds <= p.tpot_limit_seconds * (1 + 1e-9)


def test_the_ends_are_the_plain_plans(frontier_8b, model, cluster):
    """The sweep runs from the fastest lone request (the latency plan at --batch 1) to the
    throughput plan's TPOT, and each aggregated point is what --max-tpot-ms at its limit plans."""
    m, c = model("llama-3.1-8b"), cluster("1x8xH100")
    request = ServeRequest(input_len=1024, output_len=256)
    peak = plan_serving(m, c, request).recommended
    assert frontier_8b.peak_tpot_seconds == peak.tpot_seconds
    # the last limit is the peak's TPOT rounded up to the printed 0.1 ms
    assert peak.tpot_seconds <= frontier_8b.points[-1].tpot_limit_seconds < peak.tpot_seconds + 1e-4
    assert frontier_8b.fastest_tpot_seconds == pytest.approx(
        plan_serving(m, c, replace(request, batch=1, objective="latency")).recommended.tpot_seconds)
    middle = frontier_8b.points[4]
    sla = plan_serving(m, c, replace(request, max_tpot_seconds=middle.tpot_limit_seconds)).recommended
    assert middle.aggregated.label == str(sla.layout)
    assert middle.aggregated.goodput_per_gpu == sla.goodput_per_gpu


def test_disaggregated_is_traced_beside(frontier_8b):
    assert frontier_8b.disaggregated_compared
    assert any(p.disaggregated is not None for p in frontier_8b.points)


def cli(*args: str):
    return CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--frontier", *args])


def test_cli_table():
    result = cli()
    assert result.exit_code == 0, result.output
    assert "Throughput against speed" in result.output
    assert "Pareto frontier" in result.output
    assert "No --max-ttft-ms" in result.output


def test_cli_json_keeps_every_sla():
    result = cli("--json", "--max-ttft-ms", "500", "--mode", "aggregated")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["workload"]["max_ttft_seconds"] == 0.5
    assert payload["disaggregated_compared"] is False
    assert payload["why_not_disaggregated"] == "--mode aggregated"
    assert len(payload["points"]) == 10
    for point in payload["points"]:
        assert point["disaggregated"] is None
        agg = point["aggregated"]
        assert agg["ttft_seconds"] <= 0.5 and agg["tpot_seconds"] <= point["tpot_limit_seconds"] * (1 + 1e-9)
        assert math.isclose(agg["tokens_per_second_per_user"], 1 / agg["tpot_seconds"])
    assert payload["pareto"]


@pytest.mark.parametrize(("args", "words"), [
    (["--batch", "8"], "--batch: --frontier sweeps the concurrency itself"),
    (["--request-rate", "4"], "--frontier: traces the steady state"),
    (["--top", "3"], "--top: not used by --frontier"),
    (["--objective", "latency"], "--objective: not used by --frontier"),
    (["--workload", "train"], "--frontier: a --workload serve option"),
    (["--max-concurrency", "10"], "--frontier: traces the steady state; drop --max-concurrency"),
    (["--mode", "disaggregated", "--layout", "tp=8"], "--layout: filters aggregated layouts"),
])
def test_cli_mistakes_are_one_line(args, words, one_line_error):
    result = cli(*args)
    assert words in one_line_error(result), result.output


def test_nothing_fits_answers_as_the_plan_does():
    result = CliRunner().invoke(app, ["--model", "llama-3.1-70b", "--cluster", "1x1xH100", "--frontier"])
    assert result.exit_code == 1
    assert "Throughput against speed" not in result.output


def test_a_tpot_limit_below_the_fastest_lone_request_answers_as_the_plan_does():
    """Llama-3.1-8B on 8 H100 decodes a lone request no faster than about 3 ms a token: at
    --max-tpot-ms 1 nothing meets the limit, so the frontier is the plain plan's answer (exit 1,
    what would fit), not one point at the fastest TPOT (exit 0; found by a CLI sweep)."""
    result = cli("--max-tpot-ms", "1")
    assert result.exit_code == 1
    assert "Throughput against speed" not in result.output
    assert "--max-tpot-ms" in result.output and "or more" in result.output


def test_disaggregated_mode_draws_no_aggregated_column():
    """--mode disaggregated traces no aggregated layout: its column read "none meets it"."""
    result = cli("--mode", "disaggregated")
    assert result.exit_code == 0, result.output
    assert "aggregated layout" not in result.output and "better" not in result.output
    assert "disaggregated workers" in result.output
    one_gpu = CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x1xH100", "--frontier", "--mode",
                                       "disaggregated"])
    assert one_gpu.exit_code == 2 and "needs at least 2 GPUs" in one_gpu.output


def test_each_column_never_falls_as_the_limit_loosens(model, cluster):
    """With a TTFT limit the disaggregated search can price a deployment lower at a looser TPOT
    limit (a fuller decode worker's first round eats the prefill's TTFT budget); the frontier
    keeps what a tighter limit found, since the looser one admits it."""
    frontier = trace_frontier(model("llama-3.1-8b"), cluster("1x4xL40S"), ServeRequest(max_ttft_seconds=0.1))
    for column in ("aggregated", "disaggregated"):
        values = [getattr(p, column).goodput_per_gpu for p in frontier.points if getattr(p, column) is not None]
        assert values == sorted(values), (column, values)
