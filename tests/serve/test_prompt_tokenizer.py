"""The API server's tokenization of text prompts before the engine sees them
(planner/cost/ingress.py; its place in the step simulation and the steady state's TTFT)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost import efficiency as eff
from planner.cost.ingress import (
    MICROBATCH_WAIT_SECONDS,
    PromptTokenizer,
    TokenizerQueue,
)
from planner.cost.serving_sim import EngineLimits, SimRequest, StepLoad, simulate_replicas
from planner.engines import EngineVersions
from planner.layout import Layout
from planner.requests import LayoutFilter, ServeRequest

STEP = 0.01
BIG_KV = 10**7
US = 1e-6  # a tokenizer of 1 us a token: a 1,000-token prompt takes 1 ms


def const(_: StepLoad) -> float:
    return STEP


def test_a_serial_tokenizer_takes_prompts_one_after_another():
    """Three 1,000-token prompts sent at 0 on one thread of 1 us a token: ready at 1, 2 and 3 ms;
    a fourth sent at 10 ms finds the thread free: 11 ms. Asking (commit=False) takes nothing."""
    queue = TokenizerQueue(PromptTokenizer("serial", US))
    assert queue.done(0.0, 1000, commit=False) == pytest.approx(0.001)
    assert [queue.done(0.0, 1000) for _ in range(3)] == pytest.approx([0.001, 0.002, 0.003])
    assert queue.done(0.010, 1000) == pytest.approx(0.011)


def test_microbatches_wait_2_ms_and_tokenize_side_by_side():
    """1,000-token prompts sent at 0, 0.5 and 3 ms: the first opens a batch that closes at 2 ms
    (batch_wait_timeout_s); the second joins it; both tokenized side by side, ready at 2 + 1 = 3
    ms. The third comes after the close: its batch opens when the first returns (3 ms), closes
    at 5 ms, ready at 6 ms. Two API servers take sends in turn: two prompts at 0 on two serial
    threads are both ready at 1 ms, the third (back on the first) at 2 ms."""
    queue = TokenizerQueue(PromptTokenizer("microbatch", US))
    assert MICROBATCH_WAIT_SECONDS == 0.002
    assert [queue.done(t, 1000) for t in (0.0, 0.0005, 0.003)] == pytest.approx([0.003, 0.003, 0.006])
    two = TokenizerQueue(PromptTokenizer("serial", US, api_servers=2))
    assert [two.done(0.0, 1000) for _ in range(3)] == pytest.approx([0.001, 0.001, 0.002])


def test_steady_tokenization_is_m_d_1_for_a_serial_thread():
    """1,000 tokens at 1 us: S = 1 ms. One at a time: 1 ms. At 500 prompts/s on one thread
    rho = 0.5: S (1 + rho / (2 (1 - rho))) = 1.5 ms; over two API servers rho = 0.25:
    1 + 0.25 / 1.5 = 1.1667 ms. Microbatching: the 2 ms wait + 1 ms = 3 ms at any rate."""
    serial = PromptTokenizer("serial", US)
    assert serial.steady_seconds(1000) == pytest.approx(0.001)
    assert serial.steady_seconds(1000, 500.0) == pytest.approx(0.0015)
    assert replace(serial, api_servers=2).steady_seconds(1000, 500.0) == pytest.approx(0.001 * (1 + 0.25 / 1.5))
    assert PromptTokenizer("microbatch", US).steady_seconds(1000, 500.0) == pytest.approx(0.003)


@given(st.floats(0, 2000), st.floats(1, 100_000))
@settings(max_examples=60, deadline=None)
def test_steady_tokenization_grows_with_the_rate_and_never_beats_the_thread(rate, input_len):
    t = PromptTokenizer("serial")
    low, high = t.steady_seconds(input_len, rate), t.steady_seconds(input_len, rate * 1.5 + 1)
    assert t.service_seconds(input_len) <= low <= high


def test_a_burst_reaches_the_engine_as_its_prompts_are_tokenized():
    """Three requests (1,000 prompt tokens, 2 output) sent at 0, 10 ms steps, budget 4,096, no
    other first-token cost. Sent as token ids, one step [0, 10) takes all three prompts: TTFT 10
    ms each. Through a serial tokenizer of 1 us a token they reach the engine at 1, 2 and 3 ms:
    A's prompt runs alone [1, 11) (TTFT 11 ms); B and C wait for the next step [11, 21) beside
    A's last token (TTFT 21 ms, E2E 31 ms); A's E2E 21 ms."""
    requests = [SimRequest(0.0, 1000, 2)] * 3
    limits = EngineLimits(BIG_KV, 8, 4096)
    for replay in (True, False):
        plain = simulate_replicas(requests, 1, limits, const, replay_solos=replay)
        assert plain.ttft_seconds == pytest.approx((0.010,) * 3)
        tokenized = simulate_replicas(requests, 1, limits, const, replay_solos=replay,
                                      tokenizer=PromptTokenizer("serial", US))
        assert tokenized.ttft_seconds == pytest.approx((0.011, 0.021, 0.021)), replay
        assert tokenized.e2e_seconds == pytest.approx((0.021, 0.031, 0.031)), replay
        assert tokenized.first_arrival_seconds == 0.0


def test_a_closed_loop_sends_the_next_request_when_a_slot_frees():
    """One client slot, two requests (1,000, 2) at 0, 10 ms steps, a serial tokenizer of 1 us a
    token, 4 ms of other first-token cost (the request's way in after its send, and the response's
    way back: the slot frees at the end + 4 ms). A: sent at -4 ms, tokenized by -3 ms, at the
    engine at 1 ms, prompt [1, 11), last token [11, 21): TTFT 15 ms, E2E 25 ms. B is sent when
    A's slot frees, 21 + 4 - 4 = 21 ms, and runs the same: TTFT 15 ms, E2E 25 ms; the run lasts
    from -4 to 46 ms."""
    requests = [SimRequest(0.0, 1000, 2)] * 2
    for replay in (True, False):
        res = simulate_replicas(requests, 1, EngineLimits(BIG_KV, 8, 4096), const, 0.004, 1,
                                replay_solos=replay, tokenizer=PromptTokenizer("serial", US))
        assert res.ttft_seconds == pytest.approx((0.015, 0.015)), replay
        assert res.e2e_seconds == pytest.approx((0.025, 0.025)), replay
        assert res.makespan_seconds == pytest.approx(0.050), replay


@given(st.lists(st.tuples(st.floats(0, 0.2), st.integers(1, 3000), st.integers(1, 6)), min_size=1, max_size=12),
       st.sampled_from([None, 1, 3]), st.integers(1, 3), st.booleans())
@settings(max_examples=60, deadline=None)
def test_a_free_tokenizer_changes_nothing(rows, cap, dp, ahead):
    """A serial tokenizer that takes no time is the same as none, with or without a client limit,
    over one or more replicas."""
    requests = [SimRequest(t, i, o) for t, i, o in rows]
    limits = EngineLimits(BIG_KV, 4, 2048, schedules_ahead=ahead)
    plain = simulate_replicas(requests, dp, limits, const, 0.003, cap)
    for servers in (1, dp):
        free = simulate_replicas(requests, dp, limits, const, 0.003, cap,
                                 tokenizer=PromptTokenizer("serial", 0.0, api_servers=servers))
        assert free.ttft_seconds == pytest.approx(plain.ttft_seconds)
        assert free.e2e_seconds == pytest.approx(plain.e2e_seconds)
        assert free.makespan_seconds == pytest.approx(plain.makespan_seconds)


def test_a_burst_over_replicas_keeps_its_dispatch_when_each_has_its_api_server():
    """Six (1,000, 2) requests sent at once over 3 replicas, each with its API server (a serial
    thread, 1 us a token): request k is tokenized on server k mod 3 and goes to replica k mod 3,
    so each replica gets two prompts, at 1 and 2 ms. The first runs alone [1, 11) (TTFT 11 ms),
    the second in [11, 21) beside its last token (TTFT 21 ms): the same on every replica, and as
    the step-by-step dispatcher finds (one simulation serves all three replicas)."""
    requests = [SimRequest(0.0, 1000, 2)] * 6
    tokenizer = PromptTokenizer("serial", US, api_servers=3)
    limits = EngineLimits(BIG_KV, 8, 4096)
    fixed = simulate_replicas(requests, 3, limits, const, tokenizer=tokenizer)
    assert sorted(fixed.ttft_seconds) == pytest.approx([0.011] * 3 + [0.021] * 3)
    # the same arrivals handed to the dispatcher (least loaded at each arrival), the
    # tokenization added back
    shifted = [SimRequest(0.001, 1000, 2)] * 3 + [SimRequest(0.002, 1000, 2)] * 3
    stepped = simulate_replicas(shifted, 3, limits, const, replay_solos=False)
    assert sorted(t + r.arrival_seconds for t, r in zip(stepped.ttft_seconds, shifted, strict=True)) \
        == pytest.approx(sorted(fixed.ttft_seconds))


def test_a_burst_over_more_replicas_than_tokenizers_is_dealt_round_robin():
    """Eight (1,000, 2) requests sent at once over 4 replicas behind 2 tokenizers (SGLang: one
    TokenizerManager per server of 2 DP ranks; serial, 1 us a token): server s tokenizes
    requests s, s + 2, ... at 1, 2, 3, 4 ms and deals them out round robin, so replica 0 gets
    its server's prompts at 1 and 3 ms, replica 2 at 2 and 4 ms. The first of each runs alone
    (TTFT 11 or 12 ms), the second in the next 10 ms step beside its last token (21 or 22 ms),
    as the step-by-step dispatcher finds on the same arrivals (nothing completes before the
    last prompt is in)."""
    requests = [SimRequest(0.0, 1000, 2)] * 8
    tokenizer = PromptTokenizer("serial", US, api_servers=2)
    limits = EngineLimits(BIG_KV, 8, 4096)
    fixed = simulate_replicas(requests, 4, limits, const, tokenizer=tokenizer)
    assert sorted(fixed.ttft_seconds) == pytest.approx([0.011, 0.011, 0.012, 0.012, 0.021, 0.021, 0.022, 0.022])
    shifted = [SimRequest(t, 1000, 2) for t in (0.001, 0.001, 0.002, 0.002, 0.003, 0.003, 0.004, 0.004)]
    stepped = simulate_replicas(shifted, 4, limits, const, replay_solos=False)
    assert sorted(t + r.arrival_seconds for t, r in zip(stepped.ttft_seconds, shifted, strict=True)) \
        == pytest.approx(sorted(fixed.ttft_seconds))
    assert fixed.makespan_seconds == pytest.approx(stepped.makespan_seconds + 0.001)


def test_each_engine_tokenizes_as_its_release_does():
    """vLLM 0.33.0 and 0.6.6.post1: one prompt at a time; 0.22.0: AsyncMicrobatchTokenizer's
    batches; SGLang's TokenizerManager: one at a time; prompts as token ids: none."""
    assert ServeRequest().tokenizer == PromptTokenizer("serial")
    assert ServeRequest(engine_versions=EngineVersions(vllm="0.6.6.post1")).tokenizer.kind == "serial"
    assert ServeRequest(engine_versions=EngineVersions(vllm="0.22.0")).tokenizer.kind == "microbatch"
    assert ServeRequest(engine_versions=EngineVersions(vllm="0.22.0"), pool_engine="sglang").tokenizer.kind == "serial"
    assert ServeRequest(prompt_tokenizer="none").tokenizer is None
    assert ServeRequest(prompt_tokenizer="microbatch").tokenizer.kind == "microbatch"


def test_the_steady_state_adds_the_prompts_tokenization_to_ttft():
    """Llama-3.1-8B tp=1 on one H100, 4,096 prompt tokens, one client: the first-token cost is
    10 ms + 4,096 x 1.7 us = 16.963 ms (0 ms of tokenizing when the prompts come as token ids),
    and TTFT grows by about those 6.96 ms (a longer cycle leaves the rounds a hair lighter)."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.serve import estimate

    model = resolve_model("llama-3.1-8b")
    cluster = resolve_cluster("1x1xH100")
    base = ServeRequest(input_len=4096, output_len=128, batch=1, layout=LayoutFilter(tp=1, pp=1, dp=1))
    with_text = estimate(model, cluster, Layout(1, 1, 1), base)
    as_ids = estimate(model, cluster, Layout(1, 1, 1), replace(base, prompt_tokenizer="none"))
    tokenize = 4096 * eff.TOKENIZE_SECONDS_PER_PROMPT_TOKEN
    assert tokenize == pytest.approx(0.0069632)
    assert with_text.steady.first_token_seconds == pytest.approx(eff.FIRST_TOKEN_SECONDS + tokenize)
    assert as_ids.steady.first_token_seconds == pytest.approx(eff.FIRST_TOKEN_SECONDS)
    assert 0.95 * tokenize <= with_text.ttft_seconds - as_ids.ttft_seconds <= 1.001 * tokenize


def test_a_busy_tokenizer_is_named_in_a_note():
    """SGLang's one TokenizerManager in front of 8 replicas: 20 prompts/s of 16,000 tokens keep
    its thread busy 20 x 16,000 x 1.7 us = 54% of the time; vLLM's 8 API servers each 6.8%, no
    note."""
    from planner.serve import api_server_tokenizer_note

    request = ServeRequest(input_len=16000, output_len=10, request_rate_per_s=20.0, pool_engine="sglang")
    note = api_server_tokenizer_note(request, Layout(1, 1, 8), 8)
    assert note is not None and "busy 54%" in note and "--tokenizer-worker-num" in note
    assert api_server_tokenizer_note(replace(request, pool_engine="vllm"), Layout(1, 1, 8), 8) is None


def test_the_cli_takes_the_tokenizer_and_the_json_carries_it():
    """`--prompt-tokenizer none` (token ids) drops the 4,096 x 1.7 us from the first-token cost;
    the JSON names the tokenizer and each layout's first-token cost; a bad choice is a one-line
    exit 2."""
    import json
    import subprocess
    import sys

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "planner", "--model", "llama-3.1-8b", "--cluster", "1x1xH100",
                               "--input-len", "4096", "--json", "--top", "1", *extra],
                              capture_output=True, text=True, check=False)

    plans = {choice: json.loads(run("--prompt-tokenizer", choice).stdout) for choice in ("auto", "none", "microbatch")}
    assert plans["auto"]["prompt_tokenizer"] == "serial" and plans["none"]["prompt_tokenizer"] == "none"
    first = {choice: plan["layouts"][0]["first_token_seconds"] for choice, plan in plans.items()}
    assert first["auto"] == pytest.approx(0.010 + 4096 * 1.7e-6)
    assert first["none"] == pytest.approx(0.010)
    assert first["microbatch"] == pytest.approx(0.010 + 0.002 + 4096 * 1.7e-6)
    bad = run("--prompt-tokenizer", "text")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--prompt-tokenizer" in bad.stderr


def test_more_tokenizer_threads_take_turns_and_split_the_rate():
    """Two threads on one API server of 1 us a token: three 1,000-token prompts sent at once are
    ready at 1, 1 and 2 ms (as two API servers of one thread); at 500 prompts/s each thread is
    busy 25% of the time: 1 + 0.25 / 1.5 = 1.1667 ms. Microbatches ignore the threads (one batch
    at a time)."""
    two = PromptTokenizer("serial", US, threads=2)
    queue = TokenizerQueue(two)
    assert [queue.done(0.0, 1000) for _ in range(3)] == pytest.approx([0.001, 0.001, 0.002])
    assert two.steady_seconds(1000, 500.0) == pytest.approx(0.001 * (1 + 0.25 / 1.5))
    assert PromptTokenizer("microbatch", US, threads=4).queues == 1
    assert ServeRequest(tokenizer_workers=3).tokenizer.threads == 3


@pytest.mark.parametrize("vllm", ["0.22.0", "0.33.0"])
def test_tokenizer_threads_are_launched_as_each_engine_takes_them(vllm, engine_check):
    """--renderer-num-workers 2: vLLM's own flag (ModelConfig.renderer_num_workers in 0.22.0
    and 0.33.0), SGLang's --tokenizer-worker-num; both accepted by the releases' parsers. The V0
    engine has no renderer pool: a one-line refusal."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.errors import SpecError
    from planner.requests import check_tokenizer_workers, for_vllm_release
    from planner.serve_cli import launch_steps, launchable
    from planner.serve_search import plan_serving

    versions = EngineVersions(vllm=vllm)
    plan = launchable(plan_serving(resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100"),
                                   ServeRequest(tokenizer_workers=2, engine_versions=versions)))
    best = plan.recommended
    for engine, flag in (("vllm", "--renderer-num-workers"), ("sglang", "--tokenizer-worker-num")):
        steps = launch_steps(plan, best, engine, "MODEL")
        argv = [a for step in steps for a in step.argv]
        assert argv[argv.index(flag) + 1] == "2", engine
        for step in steps:
            assert engine_check(step.argv, versions) == []
    old = ServeRequest(tokenizer_workers=2, engine_versions=EngineVersions(vllm="0.6.6.post1"))
    for_vllm_release(old)  # refused only where vLLM launches it
    for engine in ("vllm", "vllm-ray"):
        with pytest.raises(SpecError, match="--renderer-num-workers"):
            check_tokenizer_workers(old, engine)
    check_tokenizer_workers(old, "sglang")  # SGLang's --tokenizer-worker-num


def test_a_rate_past_the_tokenizer_is_overloaded():
    """Qwen3-30B-A3B on 8 B200s, one replica a GPU: SGLang's one TokenizerManager thread takes
    1 / (4,000 x 1.7 us) = 147.06 prompts/s of 4,000 tokens, so at 170 req/s the layout is
    overloaded though its engines keep up, and says so (with the threads that bring the thread
    under 50%: 170 / 147.06 = 116% busy, 3 threads); behind vLLM's API server per DP replica (8,
    14% busy each) it keeps up; at 120 req/s (82%) SGLang's keeps up too, with a note."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.serve import api_server_tokenizer, estimate

    model, cluster = resolve_model("qwen3-30b-a3b"), resolve_cluster("1x8xB200")
    request = ServeRequest(input_len=4000, output_len=8, request_rate_per_s=170.0, pool_engine="sglang",
                           max_model_len=32768, layout=LayoutFilter(tp=1, pp=1, dp=8))
    assert api_server_tokenizer(request, Layout(1, 1, 8), 8).capacity_per_s(4000) == pytest.approx(1 / (4000 * 1.7e-6))
    sglang = estimate(model, cluster, Layout(1, 1, 8), request)
    assert sglang.overloaded
    assert any(n.startswith("Overloaded (tokenizer): --request-rate 170/s") for n in sglang.notes)
    assert any("busy 116%" in n and "--renderer-num-workers 3" in n for n in sglang.notes)
    vllm = estimate(model, cluster, Layout(1, 1, 8), replace(request, pool_engine="vllm"))
    assert not vllm.overloaded and not any("okenizer" in n for n in vllm.notes)
    threaded = estimate(model, cluster, Layout(1, 1, 8), replace(request, tokenizer_workers=3))
    assert not threaded.overloaded and not any("okenizer" in n for n in threaded.notes)
    slower = estimate(model, cluster, Layout(1, 1, 8), replace(request, request_rate_per_s=120.0))
    assert not slower.overloaded and any(n.startswith("Tokenizer-bound:") and "busy 82%" in n for n in slower.notes)


def test_each_sglang_server_has_its_tokenizer():
    """SGLang launches one server per node for replicas within a node (--dp-size the replicas on
    it), one per replica wider than a node, one per EP group of DP ranks (DP attention); each
    has its TokenizerManager. vLLM has an API server per DP replica."""
    from planner.serve import api_server_tokenizer, sglang_servers

    assert sglang_servers(Layout(1, 1, 32), 8) == 4  # 4 nodes of 8 replicas
    assert sglang_servers(Layout(2, 1, 6), 8) == 2  # 4 replicas a node: ceil(6 / 4)
    assert sglang_servers(Layout(8, 2, 3), 8) == 3  # a replica on 2 nodes: one server each
    assert sglang_servers(Layout(1, 1, 32, 16), 8) == 2  # EP groups of 16 DP ranks
    sglang = ServeRequest(pool_engine="sglang")
    assert api_server_tokenizer(sglang, Layout(1, 1, 32), 8).api_servers == 4
    assert api_server_tokenizer(ServeRequest(), Layout(1, 1, 32), 8).api_servers == 32
