"""`plan` with vllm bench serve's workload flags, end to end: --request-rate, --num-prompts,
--max-concurrency, --dataset, --random-range-ratio and --burstiness (planner/workload.py, planner/serve.py
burst_metrics), their JSON and their one-line errors."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import SpecError
from planner.requests import ServeRequest
from planner.serve import burst_metrics
from planner.workload import random_dataset_lengths

BASE = ["--model", "llama-3.1-8b", "--cluster", "1x1xH100", "--input-len", "1024", "--output-len", "128",
        "--max-model-len", "4096"]


def run(*args: str):
    return CliRunner().invoke(app, [*BASE, *args])


def test_random_range_ratio_bounds_by_hand():
    """L = 1024, r = 0.2: floor(819.2) = 819 to ceil(1228.8) = 1229; L = 128: 102 to 154;
    r = 0: every request of the mean lengths; the same seed draws the same lengths."""
    lengths = random_dataset_lengths(1024, 128, 0.2, 2000)
    assert min(i for i, _ in lengths) >= 819 and max(i for i, _ in lengths) <= 1229
    assert min(o for _, o in lengths) >= 102 and max(o for _, o in lengths) <= 154
    assert {i for i, _ in lengths} >= {819, 1229}  # both ends are drawn
    assert abs(sum(i for i, _ in lengths) / 2000 - 1024) < 10
    assert random_dataset_lengths(1024, 128, 0.0, 5) == ((1024, 128),) * 5
    assert random_dataset_lengths(1024, 128, 0.2, 50) == lengths[:50]


def test_outputs_are_at_least_one_token():
    assert min(o for _, o in random_dataset_lengths(100, 1, 0.9, 500)) == 1


@pytest.mark.parametrize("ratio", [1.0, -0.1, float("nan")])
def test_ratio_outside_zero_one_is_refused(ratio):
    with pytest.raises(SpecError, match=r"--random-range-ratio: must be in \[0, 1\)"):
        ServeRequest(random_range_ratio=ratio)


def test_ratio_with_a_dataset_is_refused():
    with pytest.raises(SpecError, match="--random-range-ratio: the lengths come from --dataset"):
        ServeRequest(random_range_ratio=0.5, dataset_lengths=((10, 10),))


def test_a_burst_without_a_rate_reports_it_sent_at_once():
    """--num-prompts without --request-rate simulates the burst at inf, as the text says and as
    vllm bench serve defaults; the JSON's request_rate had been null beside it (a review)."""
    burst = json.loads(run("--num-prompts", "16", "--json").stdout)["serve_workload"]
    steady = json.loads(run("--json").stdout)["serve_workload"]
    assert (burst["request_rate"], burst["num_prompts"]) == ("inf", 16)
    assert (steady["request_rate"], steady["num_prompts"]) == (None, None)


def test_burst_json_reports_the_workload_and_simulated_metrics():
    result = run("--request-rate", "inf", "--num-prompts", "64", "--max-concurrency", "8",
                 "--random-range-ratio", "0.5", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    workload = plan["serve_workload"]
    assert (workload["request_rate"], workload["num_prompts"], workload["max_concurrency"],
            workload["random_range_ratio"]) == ("inf", 64, 8, 0.5)
    best = plan["recommended"]
    assert best["metrics_source"] == "simulated burst"
    for name in ("ttft_seconds", "tpot_seconds", "itl_seconds", "e2e_seconds"):
        assert best["metrics"][name]["p99"] >= best["metrics"][name]["median"] > 0


def test_length_spread_changes_the_burst():
    """The same burst with every request alike and with lengths spread +-50%: the drawn lengths
    desynchronise the requests, so the TTFT distribution differs."""
    def ttft(*extra):
        result = run("--request-rate", "inf", "--num-prompts", "64", "--max-concurrency", "16", *extra, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["recommended"]["metrics"]["ttft_seconds"]

    assert ttft() != ttft("--random-range-ratio", "0.5")


@pytest.mark.parametrize(("args", "message"), [
    (["--random-range-ratio", "1"], "--random-range-ratio: must be in [0, 1)"),
    (["--workload", "train", "--random-range-ratio", "0.5"], "random-range-ratio"),
    (["--mode", "disaggregated", "--request-rate", "inf"], "--request-rate: the burst is simulated for aggregated"),
    # 3,000 x 1.5 = 4,500 and 128 x 1.5 = 192: requests of up to 4,692 tokens, above --max-model-len 4096
    (["--input-len", "3000", "--random-range-ratio", "0.5"], "draws requests of up to 4,692 tokens"),
    (["--mode", "disaggregated", "--num-prompts", "50"], "--num-prompts: the burst is simulated for aggregated"),
])
def test_mistakes_are_one_line_with_exit_code_2(args, message, one_line_error):
    result = run(*args)
    assert message in one_line_error(result), result.output
    assert "Traceback" not in result.output


def test_explain_refuses_what_only_the_burst_reads(one_line_error):
    result = CliRunner().invoke(app, ["explain", *BASE, "--num-prompts", "50"])
    assert one_line_error(result).startswith("--num-prompts: plan explain"), result.output


@pytest.mark.parametrize(("args", "message"), [
    # 100,000 prompts x 128 output tokens, one at a time: 12,800,000 steps, above 2,000,000
    (["--num-prompts", "100000", "--max-concurrency", "1"], "--num-prompts 100,000: the burst needs some 12,800,000"),
    # 10 prompts at 1e-15 req/s arrive over 1e16 s
    (["--request-rate", "1e-15", "--num-prompts", "10"], "more than a month"),
])
def test_bursts_beyond_the_simulation_are_refused(args, message, one_line_error):
    result = run(*args)
    assert message in one_line_error(result), result.output


def test_a_burst_that_misses_the_sla_says_so():
    """1,000 prompts at once on one H100 queue for tens of seconds: the steady state the SLA
    search sized meets --max-ttft-ms 200, the burst's mean does not, and the plan says which."""
    text = run("--max-ttft-ms", "200", "--request-rate", "inf", "--num-prompts", "1000")
    assert text.exit_code == 0, text.output
    assert "Note: the burst misses --max-ttft-ms 200 (mean" in text.output
    payload = json.loads(run("--max-ttft-ms", "200", "--request-rate", "inf", "--num-prompts", "1000", "--json").output)
    (miss,) = payload["layouts"][0]["metrics_sla_misses"]
    assert miss.startswith("--max-ttft-ms 200 (mean")
    # `sla` judges the steady state; `metrics_sla` the same limits on the burst's means
    assert payload["layouts"][0]["sla"]["ttft_ok"] is True
    assert payload["layouts"][0]["metrics_sla"] == {"ttft_ok": False, "tpot_ok": True, "e2e_ok": True}
    calm = json.loads(run("--max-ttft-ms", "2000", "--request-rate", "1", "--num-prompts", "20", "--json").output)
    assert calm["layouts"][0]["metrics_sla_misses"] == []
    assert calm["layouts"][0]["metrics_sla"] == {"ttft_ok": True, "tpot_ok": True, "e2e_ok": True}


def test_pipeline_bursts_agree_with_the_steady_state():
    """Llama-3.1-70B at tp=2 pp=4 on 8 H100, 1,024/256 tokens, 64 clients in a closed loop:
    the steady state puts each prompt's chunk whole in one of the 4 micro-batches (the round
    waits for that micro-batch's path through all 4 stages). A burst of 320 prompts at
    --max-concurrency 64 with lengths drawn apart (--random-range-ratio 0.5), stepped micro-batch
    by micro-batch as vLLM's batch queue runs them, falls out of step as the steady state
    assumes and agrees with it on output tokens/s (1,149 vs 1,149) and TPOT (55 vs 50 ms). With
    identical lengths the clients stay in waves: 64 prompts arrive together, fill consecutive
    micro-batches' budgets (a prompt's chunks go to consecutive micro-batches, as vLLM
    schedules them under PP), then decode without prompts riding along: more tokens/s (1,597)
    and a TPOT (34 ms) near the pure decode round."""
    common = ["--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--layout", "tp=2,pp=4,dp=1",
              "--input-len", "1024", "--output-len", "256", "--json"]
    steady = json.loads(CliRunner().invoke(app, [*common, "--batch", "64"]).output)["recommended"]
    burst_args = [*common, "--max-concurrency", "64", "--num-prompts", "320", "--request-rate", "inf"]
    mixed = json.loads(CliRunner().invoke(app, [*burst_args, "--random-range-ratio", "0.5"]).output)
    metrics = mixed["recommended"]["metrics"]
    tokens = metrics["output_throughput_tokens_per_second"] / steady["throughput_tokens_per_second"]
    tpot = metrics["tpot_seconds"]["mean"] / steady["tpot_seconds"]
    assert 0.9 < tokens < 1.1
    assert 0.85 < tpot < 1.1
    waves = json.loads(CliRunner().invoke(app, burst_args).output)["recommended"]["metrics"]
    assert waves["output_throughput_tokens_per_second"] > 1.15 * steady["throughput_tokens_per_second"]
    assert waves["tpot_seconds"]["mean"] < steady["tpot_seconds"]
    assert waves["tpot_seconds"]["mean"] > steady["tpot_batch1_seconds"]


def test_a_burst_line_keeps_one_unit():
    """E2E mean 12.4 s with a median of 7.2 s printed as "12.4 s, median 7228.0 ms" (found by a
    CLI sweep): once any of a line's three is 10 s or more, all three are in seconds; below, ms."""
    from planner.cost.serving_sim import Distribution, ServeMetrics
    from planner.render.serve import burst_lines

    short = Distribution(0.0354, 0.0354, 0.0354)
    metrics = ServeMetrics(short, short, short, Distribution(12.4, 7.228, 30.0), 60.0, 3.3, 800.0)
    lines = burst_lines(ServeRequest(num_prompts=200), metrics, "tp=1 pp=1 dp=8")
    assert "  E2E  mean 12.4 s, median 7.2 s, p99 30.0 s" in lines
    assert "TTFT mean 35.4 ms, median 35.4 ms, p99 35.4 ms" in " ".join(lines)


def test_the_clients_of_a_burst_are_what_the_layouts_are_ranked_under():
    """Llama-3.1-8B on 8 H100, 200 prompts at --max-concurrency 8: each layout's steady state
    runs ceil(8 / dp) clients per replica (the least-loaded front end spreads them), so dp = 8
    runs one sequence a replica and tp = 8 all eight on one; tp = 8 is recommended and its
    steady tokens/s match the burst's (it was dp = 8 ranked at 379 sequences a replica, 43,237
    tok/s, whose burst drained at 1,140 against tp = 8's 2,588; found by a CLI sweep). In
    --mode auto the disaggregated deployments are compared under the same clients: 8 over the
    copies, each copy at the rate Little's law gives (binding "clients"), far below the
    capacity an open loop would credit it with."""
    args = ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--request-rate", "inf", "--num-prompts", "200",
            "--max-concurrency", "8"]
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    best = data["recommended"]
    assert data["recommended_mode"] == "aggregated"
    assert best["tp"] * best["dp"] == 8 and best["dp"] * best["concurrency"] <= 8
    burst = best["metrics"]["output_throughput_tokens_per_second"]
    assert best["throughput_tokens_per_second"] == pytest.approx(burst, rel=0.05)
    dp8 = next(row for row in data["layouts"] if row["dp"] == 8)
    assert dp8["concurrency"] == 1 and any(note.startswith("Client-bound") for note in dp8["notes"])
    disagg = data["disaggregated"][0]
    assert disagg["binding"] == "clients"
    # Little's law per copy: clients = rate x E2E
    assert disagg["requests_per_second"] * disagg["e2e_seconds"] == pytest.approx(8 / disagg["copies"], rel=1e-3)
    assert "Client-bound: --max-concurrency 8" in data["comparison"]["reason"]


def test_fewer_clients_than_replicas_leave_replicas_idle():
    """C = q dp + r clients: r replicas run q + 1 of them, the rest q. 8B at dp = 8: with C = 4
    four replicas run one client each and four idle, half the tokens/s of C = 8's eight (it
    counted all eight replicas busy with one client, found on review); with C = 12 four run 2
    and four run 1."""
    def dp8(concurrency: int) -> dict:
        data = json.loads(CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                                   "--layout", "tp=1,pp=1,dp=8", "--request-rate", "inf",
                                                   "--num-prompts", "40", "--max-concurrency", str(concurrency),
                                                   "--json"]).output)
        return data["layouts"][0]
    four, eight, twelve, sixteen = dp8(4), dp8(8), dp8(12), dp8(16)
    assert four["throughput_tokens_per_second"] == pytest.approx(eight["throughput_tokens_per_second"] / 2, rel=1e-9)
    assert twelve["throughput_tokens_per_second"] == pytest.approx(
        (eight["throughput_tokens_per_second"] + sixteen["throughput_tokens_per_second"]) / 2, rel=1e-9)


def test_burstiness_shapes_the_simulated_arrivals_only():
    """--burstiness 0.25 at 8 req/s (vllm bench serve's gamma intervals of shape 0.25: the same
    mean rate, arrivals bunched): Llama-3.1-8B on one H100, 400 prompts. The burst's TTFT tail
    grows (p99 over 1.3x Poisson's) while the layouts' rows, priced for Poisson arrivals, stay
    the same; the JSON workload says which shape the burst drew (1 when not given)."""
    def plan(*extra):
        result = run("--request-rate", "8", "--num-prompts", "400", *extra, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    poisson, bunched = plan(), plan("--burstiness", "0.25")
    assert (poisson["serve_workload"]["burstiness"], bunched["serve_workload"]["burstiness"]) == (1.0, 0.25)
    ttft = [p["recommended"]["metrics"]["ttft_seconds"]["p99"] for p in (poisson, bunched)]
    assert ttft[1] > 1.3 * ttft[0], ttft
    assert [row["ttft_seconds"] for row in poisson["layouts"]] == [row["ttft_seconds"] for row in bunched["layouts"]]


def test_burstiness_draws_gamma_intervals_of_that_shape():
    """The intervals' mean stays 1/rate (before vLLM's rescale to N/rate) and their spread is
    the gamma's: coefficient of variation 1/sqrt(b), 2 at b = 0.25 and 0.5 at b = 4 (within
    10% over 20,000 draws)."""
    from planner.workload import arrival_times_seconds

    for shape, cv in ((0.25, 2.0), (1.0, 1.0), (4.0, 0.5)):
        times = arrival_times_seconds(20_000, 10.0, seed=1, burstiness=shape)
        gaps = [b - a for a, b in zip((0.0, *times), times, strict=False)]
        mean = sum(gaps) / len(gaps)
        spread = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
        assert mean == pytest.approx(0.1, rel=1e-9)  # rescaled: the last at 20,000 / 10 s
        assert spread / mean == pytest.approx(cv, rel=0.1), shape


def test_the_table_names_its_column_in_flight_at_a_rate() -> None:
    """At --request-rate the table's column is the mean requests in flight per replica (JSON
    `concurrency`), so it is headed "in flight", not "batch" (JSON `batch` is the --max-num-seqs
    the engine is launched for)."""
    from typer.testing import CliRunner

    from planner.cli import app

    rated = CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--request-rate", "20",
                                     "--mode", "aggregated", "--num-prompts", "100"])
    assert rated.exit_code == 0, rated.output
    assert "in flight" in rated.stdout and "┃ batch" not in rated.stdout
    steady = CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--mode", "aggregated"])
    assert "batch" in steady.stdout and "in flight" not in steady.stdout


def test_a_burst_that_falls_behind_a_rate_the_plan_says_is_kept_up_is_noted():
    """Llama-3.1-70B at tp=2 pp=8 on 16 H100, 32,000/16 tokens, 1,200 prompts at 1.62 req/s: the
    steady state says the replica keeps up (its capacity 1.73 req/s), while the burst stepped
    through vLLM's batch queue falls behind from about 1.5: over the arrivals' second half its
    queue for first tokens grows from 22 to 63 and it completes 1.57 req/s (over 600 prompts,
    28 to 40, a rise within chance of the plan's 14.9 waiting). The plan says so in
    a note, and the JSON carries the counts. (tp=2 pp=4 on 8 H100 at 12 req/s, 1,024/256, was
    this case until the plan priced its convoy: now the plan itself says overloaded, so there
    is nothing to note.) tp=8 at 10 req/s keeps up in both: no note."""
    common = ["--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--input-len", "1024", "--output-len", "256",
              "--num-prompts", "2000"]
    long_prompts = ["--model", "llama-3.1-70b", "--cluster", "2x8xH100", "--input-len", "32000", "--output-len", "16",
                    "--num-prompts", "1200", "--layout", "tp=2,pp=8", "--request-rate", "1.62"]
    behind = CliRunner().invoke(app, long_prompts)
    assert behind.exit_code == 0
    assert "Note: the simulated burst falls behind --request-rate 1.62, which the plan says tp=2 pp=8 dp=1 keeps up" \
        in " ".join(behind.output.split())
    as_json = json.loads(CliRunner().invoke(app, [*long_prompts, "--json"]).output)
    backlog = as_json["recommended"]["metrics"]["backlog"]
    assert backlog["growing"] and backlog["waiting_to"] > backlog["waiting_from"]
    convoy = CliRunner().invoke(app, [*common, "--layout", "tp=2,pp=4", "--request-rate", "12"])
    assert convoy.exit_code == 0
    assert "Overloaded (convoy)" in convoy.output and "falls behind" not in convoy.output
    kept = CliRunner().invoke(app, [*common, "--layout", "tp=8", "--request-rate", "10"])
    assert kept.exit_code == 0 and "falls behind" not in kept.output
    # 1,000 prompts at 13.2 req/s on tp=8: the system still filling at the arrivals' middle (117
    # in it) ends at 168, a 3-sigma rise but below the plan's 139 + 3 sqrt(139): not behind
    filling = json.loads(CliRunner().invoke(app, [*common[:-2], "--layout", "tp=8", "--request-rate", "13.2",
                                                  "--json"]).output)["recommended"]["metrics"]["backlog"]
    assert filling["in_system_to"] - filling["in_system_from"] > 3 * (filling["in_system_to"]
                                                                      + filling["in_system_from"]) ** 0.5
    assert filling["planned_in_system"] == pytest.approx(139, rel=0.05)
    assert not filling["growing"]


def test_a_default_burst_past_the_step_budget_is_cut_to_fit(serve_one, model, cluster, monkeypatch):
    """A burst of the default 1,000 prompts that would need more engine steps than the
    simulation's budget (tp=1 pp=8 with one sequence at a time needed 2,048,000 of 2,000,000, and
    the whole plan failed with exit 2) simulates the first prompts that fit, and says so; an
    explicit --num-prompts that does not fit is still refused. Here with the budget at 20,000:
    one sequence at a time, 64 output tokens, 1,000 prompts need 64,000 steps; 1,000 x 20,000 /
    64,000 = 312 prompts fit (19,968 steps)."""
    import planner.serve as serve

    monkeypatch.setattr(serve, "MAX_SIMULATED_STEPS", 20_000)
    request = dict(input_len=128, output_len=64, batch=1, request_rate_per_s=math.inf)
    estimate = serve_one("llama-3.1-8b", "1x1xH100", (1, 1, 1), **request)
    metrics = burst_metrics(model("llama-3.1-8b"), cluster("1x1xH100"), estimate, ServeRequest(**request))
    assert (metrics.num_prompts, metrics.shortened_from) == (312, 1000)
    assert metrics.request_throughput_per_second * metrics.duration_seconds == pytest.approx(312, rel=1e-9)
    with pytest.raises(SpecError, match=r"--num-prompts 1,000: the burst needs some 64,000 engine steps .* more "
                                        r"sequences at a time \(--batch, the engine's --max-num-seqs\)"):
        burst_metrics(model("llama-3.1-8b"), cluster("1x1xH100"), estimate, ServeRequest(**request, num_prompts=1000))


def test_one_output_token_has_no_tpot_line():
    """512/1 tokens: vllm bench serve reports no TPOT or ITL for one output token, and the burst
    block had printed "TPOT mean 0 us, median 0 us, p99 0 us" under a recommendation that says
    "one output token: no TPOT" (found by a CLI sweep)."""
    result = CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x1xH100", "--input-len", "512",
                                      "--output-len", "1", "--request-rate", "5", "--num-prompts", "50"])
    assert result.exit_code == 0, result.output
    assert "  TPOT none (one output token)" in result.output and "  ITL  none (one output token)" in result.output
    assert "TPOT mean 0 us" not in result.output


def test_a_closed_loops_first_wave_is_told_apart_from_the_rest():
    """vllm bench serve sends the first --max-concurrency requests at once: 32 prompts of 1,024
    tokens queue for 8,192-token steps, four steps for the wave, so the first 32 wait several
    times the steady state. With lengths drawn within +-20% the 288 sent later spread out and
    average near the steady state; with every request alike the clients complete and resend
    together, and the waves go on."""
    args = ("--max-concurrency", "32", "--num-prompts", "320")
    spread = json.loads(run(*args, "--random-range-ratio", "0.2", "--json").stdout)["recommended"]
    wave = spread["metrics"]["first_wave"]
    assert (wave["num_requests"], wave["num_later_requests"]) == (32, 288)
    assert wave["ttft_mean_seconds"] > 3 * spread["ttft_seconds"]
    assert wave["later_ttft_mean_seconds"] < 1.25 * spread["ttft_seconds"]
    mean = spread["metrics"]["ttft_seconds"]["mean"]
    assert mean == pytest.approx((32 * wave["ttft_mean_seconds"] + 288 * wave["later_ttft_mean_seconds"]) / 320)
    text = run(*args, "--random-range-ratio", "0.2").output
    assert "averages its first 32 requests, sent at once" in text and "in waves" not in text
    alike = run(*args)
    assert "so their prompts keep queueing in waves" in alike.output, alike.output
    later = json.loads(run(*args, "--json").stdout)["recommended"]["metrics"]["first_wave"]["later_ttft_mean_seconds"]
    assert later > 2 * wave["later_ttft_mean_seconds"]
    # at a finite rate no wave is sent at once
    rated = json.loads(run("--request-rate", "5", "--num-prompts", "40", "--json").stdout)["recommended"]
    assert rated["metrics"]["first_wave"] is None


def test_clients_below_the_kv_cache_are_not_kv_starved():
    """Llama-3.1-8B on 8 H100, 8,000/100 tokens: the KV cache of tp=2 holds 124 running sequences,
    fewer than vLLM's default --max-num-seqs 1,024, but 32 clients over 4 replicas run 8 each: the
    clients bind, not the cache, so no layout is called KV-starved (every one was, found by a CLI
    check); 2,000 clients are more than the caches hold, and then it is."""
    args = ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--input-len", "8000", "--output-len", "100",
            "--json"]
    few = json.loads(CliRunner().invoke(app, [*args, "--max-concurrency", "32", "--num-prompts", "32"]).output)
    assert not any(note.startswith("KV-starved") for row in few["layouts"] for note in row["notes"])
    assert all(any(note.startswith("Client-bound") for note in row["notes"]) for row in few["layouts"])
    many = json.loads(CliRunner().invoke(app, [*args, "--max-concurrency", "2000", "--num-prompts", "2000"]).output)
    assert any(note.startswith("KV-starved") for note in many["recommended"]["notes"])


def test_a_batch_the_prompt_budget_chose_below_the_cache_is_not_kv_starved():
    """Qwen3-30B-A3B on 4 L40S, 8,000/200 tokens: tp=2 pp=2's cache holds 123 running sequences
    and the prompt budget's knee runs 97; the row was marked KV-starved, its note saying
    "so concurrency is 123" beside the 97 chosen (found by a CLI read)."""
    data = json.loads(CliRunner().invoke(app, ["--model", "qwen3-30b-a3b", "--cluster", "1x4xL40S", "--input-len",
                                               "8000", "--output-len", "200", "--json"]).output)
    for row in data["layouts"]:  # a KV-starved row runs what its cache holds
        for note in row["notes"]:
            if note.startswith("KV-starved"):
                assert f"so concurrency is {row['batch']} " in note, (row["batch"], note)
    best = data["recommended"]
    assert best["notes"][0].startswith(f"Prompt-bound: {best['batch']} concurrent sequences")
    assert not any(note.startswith("KV-starved") for note in best["notes"])


def test_a_burst_shorter_than_one_request_says_it_never_fills():
    """1,000 prompts at 100/s arrive over 1,000 / 100 = 10 s: against an 18.2 s steady-state
    E2E the note says the burst ends before that load builds; at 40/s (25 s) it says nothing,
    nor at inf or under --max-concurrency (a CLI read found a 3x lighter TPOT unexplained)."""
    from types import SimpleNamespace

    from planner.render.serve import short_burst_note
    from planner.requests import ServeRequest

    metrics = SimpleNamespace(num_prompts=1000, e2e_seconds=SimpleNamespace(mean=9.0),
                              ttft_seconds=SimpleNamespace(mean=0.2))
    note = short_burst_note(ServeRequest(request_rate_per_s=100.0, num_prompts=1000), metrics, 18.2, 0.3)
    assert note is not None and "arrive over 10.0 s" in note and "(18.2 s)" in note
    assert "its E2E is lighter than the row's;" in note
    # "lighter" only where it is: a burst TTFT above the row's is named (70B tp=8 at 30/s, 300
    # prompts: 1,488 ms against the row's 733; a review), an E2E above it says neither
    heavier_ttft = SimpleNamespace(num_prompts=1000, e2e_seconds=SimpleNamespace(mean=9.0),
                                   ttft_seconds=SimpleNamespace(mean=1.488))
    assert "its TTFT (1,488 ms) not" in short_burst_note(ServeRequest(request_rate_per_s=100.0, num_prompts=1000),
                                                         heavier_ttft, 18.2, 0.733)
    heavier = SimpleNamespace(num_prompts=1000, e2e_seconds=SimpleNamespace(mean=20.0),
                              ttft_seconds=SimpleNamespace(mean=1.488))
    assert "not the row's steady state" in short_burst_note(ServeRequest(request_rate_per_s=100.0, num_prompts=1000),
                                                            heavier, 18.2, 0.733)
    assert short_burst_note(ServeRequest(request_rate_per_s=40.0, num_prompts=1000), metrics, 18.2) is None
    assert short_burst_note(ServeRequest(num_prompts=1000), metrics, 18.2) is None
    assert short_burst_note(ServeRequest(request_rate_per_s=100.0, num_prompts=1000, max_concurrency=64), metrics,
                            18.2) is None


def test_an_overloaded_recommendation_says_so_in_its_headline():
    """One H100 serving Llama-3.1-8B at 40 req/s of 1,024 / 128 tokens cannot keep up: the
    Recommended line had read "highest throughput" with the queue told only further down (a CLI
    read); it now says OVERLOADED first."""
    result = run("--request-rate", "40")
    assert result.exit_code == 0, result.output
    headline = " ".join(line for line in result.output.splitlines() if line.startswith("Recommended"))
    assert "OVERLOADED: no layout keeps up with --request-rate 40/s" in headline


def test_an_itl_mean_past_its_p99_is_explained():
    """Llama-3.1-70B on 8 H100, 100 prompts at 16 clients: fewer than 1% of the inter-token gaps
    are the long ones (a decode step that carries a prompt's chunk), which lift the ITL's mean
    (13.2 ms) past its p99 (12.4 ms), as vllm bench serve computes both; the line says so (a CLI
    read took it for a slip). The JSON keeps the three figures as they are."""
    args = ["--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--max-concurrency", "16", "--num-prompts", "100"]
    text = " ".join(CliRunner().invoke(app, args).output.split())
    itl = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)["recommended"]["metrics"]["itl_seconds"]
    assert itl["mean"] > itl["p99"]
    assert "lift the mean past the p99" in text.split("ITL", 1)[1].split("E2E", 1)[0]
    assert text.count("lift the mean past the p99") == 1  # not on TTFT, TPOT or E2E


@pytest.mark.parametrize(("rate", "num_prompts"), [(0.5, 10), (2.0, 40), (20.0, 200)])
def test_a_finite_rate_burst_never_completes_faster_than_it_is_sent(serve_one, model, cluster, rate, num_prompts):
    """vllm bench serve sends N prompts over N / rate seconds from its clock's start (the arrivals
    rescaled so the last goes out at N / rate), so its duration is at least N / rate plus the
    last request's E2E and the request throughput at most the rate (a review: 10 prompts at
    0.5/s read 0.608 req/s, timed from the first send)."""
    request = dict(input_len=1024, output_len=256, request_rate_per_s=rate, num_prompts=num_prompts)
    estimate = serve_one("llama-3.1-8b", "1x8xH100", (8, 1, 1), **request)
    metrics = burst_metrics(model("llama-3.1-8b"), cluster("1x8xH100"), estimate, ServeRequest(**request))
    assert metrics.duration_seconds >= num_prompts / rate + min(metrics.e2e_seconds.mean, metrics.e2e_seconds.median) * 0.5
    assert metrics.request_throughput_per_second <= rate
    assert metrics.request_throughput_per_second * metrics.duration_seconds == pytest.approx(num_prompts, rel=1e-9)


def test_a_burst_drawing_only_one_token_outputs_has_no_tpot(tmp_path):
    """A --dataset of one-token and 2,000-token outputs, one prompt drawn: where the draw is a
    one-token row the burst has no TPOT or ITL (vllm bench serve reports none), as a dataset of
    one-token rows only says; it printed 0 us (a review). The decoding draw still reports both."""
    data = tmp_path / "mix.jsonl"
    data.write_text('{"input_len": 100, "output_len": 1}\n{"input_len": 100, "output_len": 2000}\n')
    outputs = {}
    for seed_prompts in ("1", "2", "3", "4"):
        result = CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x1xH100", "--max-model-len", "4096",
                                          "--dataset", str(data), "--request-rate", "inf", "--num-prompts",
                                          seed_prompts, "--json"])
        assert result.exit_code == 0, result.output
        plan = json.loads(result.stdout)
        metrics = plan["recommended"]["metrics"]
        drawn = metrics["output_throughput_tokens_per_second"] / metrics["request_throughput_per_second"]
        outputs[seed_prompts] = drawn
        if drawn == pytest.approx(1.0):
            assert metrics["tpot_seconds"] is None and metrics["itl_seconds"] is None
        else:
            assert metrics["tpot_seconds"]["mean"] > 0
    assert any(v == pytest.approx(1.0) for v in outputs.values()), outputs
