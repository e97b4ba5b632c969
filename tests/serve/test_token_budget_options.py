"""The token budget a PP layout runs at (serve_search.token_budget_options): a step that carries
a prompt chunk is longer at every stage and the micro-batches behind it cannot pass it, so
smaller chunks keep the pipeline's stages even. The plan prices the recommended PP layout at
every other budget of TOKEN_BUDGET_CHOICES and says which does most; checked against the step
simulation, which runs vLLM's batch queue stage by stage."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.render.serve import TOKEN_BUDGET_NOTE_GAIN, token_budget_lines
from planner.requests import LayoutFilter, ServeRequest
from planner.serve import burst_metrics
from planner.serve_search import TOKEN_BUDGET_CHOICES, plan_serving

PP4 = ServeRequest(layout=LayoutFilter(tp=1, pp=4), max_num_batched_tokens=2048, mode="aggregated", num_gpus=4)
"""Llama-3.1-70B tp=1 pp=4 on four H100s, 1,024/256 tokens, at a 2,048-token budget."""


@pytest.fixture(scope="module")
def llama70b():
    return resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100")


def test_every_other_budget_is_priced_and_smaller_chunks_even_the_stages(llama70b) -> None:
    """At 2,048 tokens a step the closed loop's 1,024-token prompts ride whole in one micro-batch
    each, and each such step holds the three behind it at every stage (bubble over 40%). At 512
    a prompt's chunks (512 less the step's decodes) fill consecutive micro-batches evenly: the
    bubble falls below 20% and the same layout serves more than 1.5 times the tokens/s."""
    model, cluster = llama70b
    plan = plan_serving(model, cluster, PP4)
    best = plan.recommended
    assert best.layout.pp == 4
    budgets = [int(option.value) for option in plan.token_budget_options]
    assert budgets == [b for b in TOKEN_BUDGET_CHOICES if b != 2048]
    at = {int(option.value): option.estimate for option in plan.token_budget_options}
    assert all(estimate.layout == best.layout for estimate in at.values())
    assert best.bubble_fraction > 0.4 and at[512].bubble_fraction < 0.2
    assert at[512].throughput_tokens_per_second > 1.5 * best.throughput_tokens_per_second
    (line,) = token_budget_lines(plan)
    assert line.startswith("Token budget: --max-num-batched-tokens 512 on tp=1 pp=4 dp=1 (now 2,048):")
    assert "pipeline bubble" in line


def test_the_step_simulation_agrees_on_the_direction(llama70b) -> None:
    """The same layout's burst of 800 requests of lengths spread +/-50% (--random-range-ratio
    0.5, so no cohort of equal requests finishes together), simulated step by step: 512 tokens
    a step serve at least 20% more output tokens/s than 2,048 (simulated 1,764 and 2,295 tok/s;
    the steady state prices 1,392 and 2,879: the same direction, twice the size)."""
    model, cluster = llama70b
    rates = {}
    for budget in (2048, 512):
        request = replace(PP4, max_num_batched_tokens=budget, num_prompts=800, random_range_ratio=0.5)
        best = plan_serving(model, cluster, request).recommended
        rates[budget] = burst_metrics(model, cluster, best, request).output_token_throughput_per_second
    assert rates[512] > 1.2 * rates[2048]


@pytest.mark.parametrize("change", [
    {"layout": LayoutFilter(tp=4, pp=1)},  # no pipeline
    {"request_rate_per_s": 2.0},  # an open loop: the rate sets the tokens/s
    {"objective": "latency"},  # one sequence
])
def test_no_options_without_a_pipeline_at_a_closed_loops_load(llama70b, change) -> None:
    model, cluster = llama70b
    plan = plan_serving(model, cluster, replace(PP4, **change))
    assert plan.token_budget_options == ()
    assert token_budget_lines(plan) == []


def test_the_line_stays_quiet_below_the_gain(llama70b) -> None:
    """At its best budget already no other does TOKEN_BUDGET_NOTE_GAIN better: no line."""
    model, cluster = llama70b
    plan = plan_serving(model, cluster, PP4)
    field = "throughput_tokens_per_second"
    top = max(plan.token_budget_options, key=lambda option: getattr(option.estimate, field))
    at_best = plan_serving(model, cluster, replace(PP4, max_num_batched_tokens=int(top.value)))
    assert all(getattr(o.estimate, field) < (1 + TOKEN_BUDGET_NOTE_GAIN) * getattr(at_best.recommended, field)
               for o in at_best.token_budget_options)
    assert token_budget_lines(at_best) == []


def test_json_lists_each_budget(plan_json) -> None:
    code, data = plan_json("--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--gpus", "4", "--layout",
                           "tp=1,pp=4", "--mode", "aggregated", "--max-num-batched-tokens", "2048")
    assert code == 0
    rows = data["token_budget_options"]
    assert [row["max_num_batched_tokens"] for row in rows] == [b for b in TOKEN_BUDGET_CHOICES if b != 2048]
    assert {"ttft_seconds", "tpot_seconds", "throughput_tokens_per_second", "goodput_tokens_per_second",
            "bubble_fraction"} <= set(rows[0])
    code, disagg = plan_json("--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--mode", "disaggregated")
    assert disagg["token_budget_options"] == []
