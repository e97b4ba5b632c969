"""Fixed clients (vllm bench serve --max-concurrency, or --batch without a rate): the steady
state runs the clients, never more; where the engine runs fewer (an SLA cap, the KV cache,
--batch), the others wait in its queue for a slot, in TTFT and E2E as the benchmark times them
(docs/cost-model.md, Serving: bursts and request rates)."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.requests import ServeRequest
from planner.serve import Rejected, ServeEstimate
from planner.serve_search import plan_serving


def test_clients_below_batch_run_the_clients(serve_one):
    """--batch 100 with --max-concurrency 40 on one replica: the steady state ran 100 sequences
    (13,136 tok/s) where only 40 clients send requests (the burst simulation: 8,175 tok/s). It
    runs the 40: the same state as --batch 40."""
    both = serve_one("llama-3.1-8b", "1x8xH100", (8, 1, 1), batch=100, max_concurrency=40)
    forty = serve_one("llama-3.1-8b", "1x8xH100", (8, 1, 1), batch=40)
    assert isinstance(both, ServeEstimate) and both.batch == 40
    assert both.throughput_tokens_per_second == pytest.approx(forty.throughput_tokens_per_second, rel=1e-12)
    assert both.ttft_seconds == pytest.approx(forty.ttft_seconds, rel=1e-12)
    assert any("--max-num-seqs is --batch 100" in note for note in both.notes)
    # the command sets what the note says and the memory was priced for: --batch, not the clients
    assert both.max_num_seqs == 100 and forty.max_num_seqs == forty.batch == 40


def test_the_command_takes_the_engines_cap_not_the_clients():
    """--max-concurrency 16 without --batch: the steady state runs 16, the note says the engine
    would take more and --max-num-seqs is set to that; the command and the JSON carry it."""
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    argv = ["--model", "llama-3.1-8b", "--cluster", "1x2xH100", "--max-concurrency", "16", "--mode", "aggregated",
            "--num-prompts", "50"]
    text = " ".join(CliRunner().invoke(app, argv).output.split())
    cap = int(text.split("the engine would take ")[1].split(";")[0].replace(",", ""))
    assert cap > 16 and f"--max-num-seqs {cap}" in text
    best = json.loads(CliRunner().invoke(app, [*argv, "--json"]).output)["layouts"][0]
    assert best["batch"] == 16 and best["max_num_seqs"] == cap


def test_a_tpot_cap_below_the_clients_queues_the_rest(serve_one):
    """200 clients on tp=8 with a TPOT limit met only below 200 running: the engine runs n < 200
    and the other 200 - n wait for a slot. The engine finishes n / E2E(n) requests a second, so
    by Little's law each waits (200 - n) E2E(n) / n before admission (the state at --batch n)."""
    full = serve_one("llama-3.1-8b", "1x8xH100", (8, 1, 1), batch=200)
    lone = serve_one("llama-3.1-8b", "1x8xH100", (8, 1, 1), batch=1)
    limit_ms = 1e3 * (lone.tpot_seconds + full.tpot_seconds) / 2
    capped = serve_one("llama-3.1-8b", "1x8xH100", (8, 1, 1), max_concurrency=200, max_tpot_seconds=limit_ms / 1e3)
    assert isinstance(capped, ServeEstimate) and 1 < capped.batch < 200
    n = capped.batch
    running = serve_one("llama-3.1-8b", "1x8xH100", (8, 1, 1), batch=n)
    wait = (200 - n) * running.steady.e2e_seconds / n
    assert capped.ttft_seconds == pytest.approx(running.ttft_seconds + wait, rel=1e-9)
    assert capped.tpot_seconds == pytest.approx(running.tpot_seconds, rel=1e-12)
    assert capped.tpot_seconds <= limit_ms / 1e3
    assert any(f"other {200 - n} clients per replica wait" in note for note in capped.notes)


def test_a_ttft_limit_the_clients_cannot_meet_is_rejected_at_all_clients(serve_one):
    """--max-concurrency 200 and TTFT <= 30 ms on tp=4 dp=2 (100 clients a replica): the plan
    ran 50 a replica (TTFT 30.0 ms) and left the other 50 out of TTFT; with them waiting TTFT is
    1.7 s. Fewer running only queue the rest longer, so the layout is rejected at what all its
    clients running reach (the TTFT of --batch 100), which misses 30 ms."""
    result = serve_one("llama-3.1-8b", "1x8xH100", (4, 1, 2), max_concurrency=200, max_ttft_seconds=0.030)
    assert isinstance(result, Rejected)
    all_running = serve_one("llama-3.1-8b", "1x8xH100", (4, 1, 2), batch=100)
    assert all_running.ttft_seconds > 0.030
    assert f"TTFT {1e3 * all_running.ttft_seconds:.1f} ms exceeds --max-ttft-ms 30 (at concurrency 100)" in result.reasons[0]


def test_a_rate_with_clients_is_rejected_at_the_rate(serve_one):
    """At 64 /s (32 a replica) with 200 clients, tp=4 dp=2 takes the rate only at 58 in flight,
    TTFT 39.1 ms (30.3 before async scheduling's round was priced, 37.3 before the prompt's
    1,024 x 1.7 us of tokenization was), past the 30 ms limit;
    capping it at the limit's concurrency fills the clients' queue instead. The reason is the
    miss at the rate, as without clients."""
    result = serve_one("llama-3.1-8b", "1x8xH100", (4, 1, 2), max_concurrency=200, max_ttft_seconds=0.030,
                       request_rate_per_s=64.0)
    assert isinstance(result, Rejected)
    assert "at --request-rate 64/s" in result.reasons[0] and "TTFT 39.1 ms" in result.reasons[0]


def test_batch_with_clients_at_a_rate_they_cannot_send_is_client_held():
    """--batch 16 --max-concurrency 64 at 200 /s: every layout was called overloaded (a queue
    growing without bound), but 64 clients bound it. None is overloaded; where a replica's
    clients outnumber its 16 slots the rest wait in the engine's queue (in TTFT)."""
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    plan = plan_serving(model, cluster, ServeRequest(mode="aggregated", batch=16, max_concurrency=64,
                                                     request_rate_per_s=200.0))
    assert plan.layouts and not any(r.overloaded for r in plan.layouts)
    assert all(any(note.startswith("Client-held") for note in r.notes) for r in plan.layouts)
    one_replica = [r for r in plan.layouts if r.layout.dp == 1]
    assert one_replica and all(any("other 48 clients per replica wait" in note for note in r.notes)
                               for r in one_replica)


def test_sla_reach_with_clients_is_at_their_load():
    """No layout meets TTFT <= 30 ms with 200 clients: the least TTFT offered is the best
    layout's with all its clients running (it read "at concurrency 1", 43 s, a state in which
    199 clients queue)."""
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    request = ServeRequest(mode="aggregated", max_concurrency=200, max_ttft_seconds=0.030)
    plan = plan_serving(model, cluster, request)
    assert not plan.layouts
    reach = [s for s in plan.suggestions if s.startswith("--max-ttft-ms")]
    assert len(reach) == 1 and reach[0].endswith("with the 200 clients of --max-concurrency")
    least_ms = float(reach[0].split()[1])
    free = plan_serving(model, cluster, ServeRequest(mode="aggregated", max_concurrency=200))
    assert least_ms == pytest.approx(1e3 * min(r.ttft_seconds for r in free.layouts), abs=0.1)


def test_clients_that_keep_up_with_the_rate_complete_the_rate(serve_one):
    """Qwen3-30B-A3B on 8 H100 replicas (tp=1, dp=8), 8 clients at 5 req/s: one client per
    replica, asked 0.625 req/s, completes 0.72 (one request at a time). The open loop's Poisson
    queue at a mean of one in flight would hold more than the client lets in (it completes
    0.58), so the layout was called Client-held and priced at 0.72 req/s: 1,476 tok/s where
    the burst simulation gives 1,274. It keeps up: 5 x 256 = 1,280 tok/s. The open loop, its
    decoding rounds capped at the one sequence a client lets run, now solves at 0.88 in flight
    (E2E 1,413 ms, its arrivals waiting out a round 1 - e^-0.88 of the time); least-loaded
    routing runs each request alone (the simulation: 1,388 ms, the one-request closed loop's),
    within 2% of it."""
    held = serve_one("qwen3-30b-a3b", "1x8xH100", (1, 1, 8), max_concurrency=8, request_rate_per_s=5.0)
    alone = serve_one("qwen3-30b-a3b", "1x8xH100", (1, 1, 8), max_concurrency=8)
    assert isinstance(held, ServeEstimate) and isinstance(alone, ServeEstimate)
    assert held.throughput_tokens_per_second == pytest.approx(5.0 * 256, rel=1e-9)  # 256 output tokens (the default)
    assert alone.steady.e2e_seconds <= held.steady.e2e_seconds <= 1.02 * alone.steady.e2e_seconds
    assert held.steady.concurrency == pytest.approx(0.625 * held.steady.e2e_seconds, rel=1e-3)
    assert not any(note.startswith("Client-held") for note in held.notes)
    assert any(note.startswith("Rate-bound") for note in held.notes)


def test_fewer_clients_than_replicas_hold_the_rate_back(serve_one):
    """Qwen3-30B-A3B on 8 tp=1 replicas, 3 clients at 4 req/s: each replica was given one client
    (the ceiling of 3 / 8) and 0.5 req/s, so the layout claimed to keep up at 4 x 256 = 1,024
    tok/s, where only 3 requests are ever in flight (the burst simulation: 552 tok/s). Three
    replicas each run one request at a time, completing 1 / E2E(1) each: 3 / E2E(1) req/s in
    all (2.16 at E2E 1,388 ms), below the 4 asked, so the clients hold the rate back and the
    layout runs 3 x 256 / E2E(1) tok/s."""
    held = serve_one("qwen3-30b-a3b", "1x8xH100", (1, 1, 8), max_concurrency=3, request_rate_per_s=4.0)
    alone = serve_one("qwen3-30b-a3b", "1x8xH100", (1, 1, 8), max_concurrency=8)
    assert isinstance(held, ServeEstimate) and isinstance(alone, ServeEstimate)
    e2e = alone.steady.e2e_seconds
    assert held.throughput_tokens_per_second == pytest.approx(3 * 256 / e2e, rel=1e-9)
    assert 3 / e2e < 4.0
    note = next(note for note in held.notes if note.startswith("Client-held"))
    assert "1 in flight on 3 of the 8 replicas (the rest idle)" in note
    assert f"complete {3 / e2e:.3g} req/s in all" in note


def test_the_clients_bound_what_is_in_flight_over_all_replicas(serve_one):
    """The same 8 replicas and 3 clients at rates up to 3 req/s: a layout that keeps up holds at
    most the 3 clients' requests in flight over its 8 replicas (each replica's mean times 8),
    and one that is held back completes 3 / E2E(1) = 2.16 req/s in all (3 x 256 / E2E(1) tok/s).
    Before, each replica was given the ceiling, one client, so up to 8 were in flight."""
    alone = serve_one("qwen3-30b-a3b", "1x8xH100", (1, 1, 8), max_concurrency=8)
    for quarters in range(2, 13):
        rate = quarters / 4
        est = serve_one("qwen3-30b-a3b", "1x8xH100", (1, 1, 8), max_concurrency=3, request_rate_per_s=rate)
        assert isinstance(est, ServeEstimate)
        if any(note.startswith("Client-held") for note in est.notes):
            assert rate > 3 / alone.steady.e2e_seconds
            assert est.throughput_tokens_per_second == pytest.approx(3 * 256 / alone.steady.e2e_seconds, rel=1e-9)
        else:
            assert est.steady.concurrency * 8 <= 3 * (1 + 1e-9)
            assert est.throughput_tokens_per_second == pytest.approx(rate * 256, rel=1e-9)


def test_the_open_queue_never_prices_more_running_than_the_clients(serve_one):
    """Llama-3.1-8B on tp=8 with 8 clients at rates up to what they complete: the open loop
    priced a decoding request's rounds at n_d + 1 sequences, 8.9 at 7.9 in flight where the
    clients let at most 8 run, so TPOT rose to 3.097 ms at 9.85 req/s and fell to 3.027 ms at
    9.9 once the clients' closed loop took over. Capped at the 8: 3.058 ms at 9.9, within 1%
    of the 8 clients' closed loop (3.034 ms)."""
    closed = serve_one("llama-3.1-8b", "1x8xH100", (8, 1, 1), max_concurrency=8, request_rate_per_s=10.5)
    assert any(note.startswith("Client-held") for note in closed.notes)
    for tenths in range(90, 100):
        est = serve_one("llama-3.1-8b", "1x8xH100", (8, 1, 1), max_concurrency=8, request_rate_per_s=tenths / 10)
        assert est.tpot_seconds <= 1.01 * closed.tpot_seconds


def test_clients_beyond_the_engines_slots_complete_what_the_slots_do(serve_one):
    """64 clients at 100 req/s on tp=8 with --batch 16 (its --max-num-seqs): 16 run, 48 wait in
    the engine's queue, so the clients complete what 16 running complete (throughput / 256
    output tokens), not what a closed loop of 64 running would."""
    est = serve_one("llama-3.1-8b", "1x8xH100", (8, 1, 1), batch=16, max_concurrency=64, request_rate_per_s=100.0)
    assert isinstance(est, ServeEstimate) and est.batch == 16
    note = next(note for note in est.notes if note.startswith("Client-held"))
    assert f"complete {est.throughput_tokens_per_second / 256:.3g} req/s in all" in note
