"""Speculative decoding (planner/cost/speculative.py and its uses): the expected tokens per
step, the steady state with drafts, the drafter's memory and step cost, the burst simulation,
the plan's comparison and the emitted flags. Every number below is worked by hand in its
docstring; docs/cost-model.md (Serving: speculative decoding) has the derivation.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.continuous_batching import steady_state
from planner.cost.params import kv_bytes_per_token_per_layer_by_kind
from planner.cost.serving_sim import EngineLimits, SimRequest, bench_metrics, simulate
from planner.cost.serving_time import StepLoad
from planner.cost.speculative import (
    draft_memory,
    expected_tokens_per_step,
    mtp_draft_model,
    tokens_per_round_for,
)
from planner.emit.command import ServeArgs
from planner.emit.sglang import speculative_flags as sglang_flags
from planner.emit.vllm import speculative_flags as vllm_flags
from planner.engines import EngineVersions
from planner.errors import SpecError
from planner.layout import Layout, Rejected
from planner.requests import ServeRequest, Speculation
from planner.serve import ServeEstimate, estimate

# ---------------------------------------------------------------- tokens per step


def test_expected_tokens_per_step_by_hand():
    """a = (0.8, 0.6, 0.4): 1 + 0.8 + 0.8*0.6 + 0.8*0.6*0.4 = 1 + 0.8 + 0.48 + 0.192 = 2.472.
    i.i.d. a = 0.7, k = 3: (1 - 0.7^4) / (1 - 0.7) = (1 - 0.2401) / 0.3 = 2.533 (Leviathan et
    al. 2023, sec. 3.1)."""
    assert expected_tokens_per_step((0.8, 0.6, 0.4)) == pytest.approx(2.472)
    assert expected_tokens_per_step((0.7,) * 3) == pytest.approx(0.7599 / 0.3)
    assert expected_tokens_per_step(()) == 1.0


@given(st.lists(st.floats(0, 1), min_size=1, max_size=8), st.integers(0, 7), st.floats(0, 1))
def test_tokens_per_step_bounds_and_monotone(rates, position, bump):
    """1 <= e <= k + 1, and raising any position's acceptance never lowers e."""
    e = expected_tokens_per_step(tuple(rates))
    assert 1.0 <= e <= len(rates) + 1 + 1e-12
    i = position % len(rates)
    higher = list(rates)
    higher[i] = max(rates[i], bump)
    assert expected_tokens_per_step(tuple(higher)) >= e - 1e-12


def test_speculation_expands_one_rate_and_checks_its_inputs():
    assert Speculation("ngram", 3, (0.5,)).acceptance == (0.5, 0.5, 0.5)
    for args, words in (((("ngram", 2, (0.5, 0.5, 0.5)),), "one per drafted token"),
                        ((("ngram", 2, ()),), "needed"),
                        ((("eagle3", 2, (0.5,)),), "--draft-model"),
                        ((("medusa", 2, (0.5,)),), "--speculative-method")):
        with pytest.raises(SpecError, match=words.replace("-", r"\-")):
            Speculation(*args[0])


# ---------------------------------------------------------------- steady state


def test_steady_state_with_drafts_by_hand():
    """One client, I = 100, O = 101, B = 2048, k = 1 draft accepted with a = 0.8: e = 1.8.
    The synthetic round costs 10 ms + 1 ms per token it carries (decodes, drafts and prompt).
    D = 100 tokens after the first take D / e = 100 / 1.8 = 55.56 rounds; S_p = 1.
    lambda = 1 / (55.56 + 1) = 0.017682 requests per round; n_d = lambda * 55.56 = 0.98232.
    Decode round: 10 + (0.98232 + 0.98232 drafts) * 1 = 11.96464 ms.
    TPOT at C = 1 is the decode round over e: 11.96464 / 1.8 = 6.64702 ms.
    E2E = TTFT + 55.56 rounds * 11.96464 ms = TTFT + 664.70 ms (TPOT * D: 6.64702 * 100)."""
    def rounds(load: StepLoad, chunk: StepLoad | None) -> float:
        tokens = load.num_tokens + (chunk.num_tokens if chunk else 0.0)
        return 0.010 + 0.001 * tokens

    steady = steady_state(1, 100, 101, 2048, 1, rounds, 0.0, tokens_per_round=1.8, spec_tokens=1)
    d_rounds = 100 / 1.8
    rate = 1 / (d_rounds + 1)
    assert steady.decode_seqs == pytest.approx(rate * d_rounds)
    assert steady.decode_round_seconds == pytest.approx(0.010 + 0.001 * 2 * rate * d_rounds)
    assert steady.tpot_seconds == pytest.approx(steady.decode_round_seconds / 1.8)
    assert steady.tpot_seconds == pytest.approx(0.00664702, rel=1e-5)
    assert steady.e2e_seconds - steady.ttft_seconds == pytest.approx(100 * steady.tpot_seconds)


def test_drafts_take_budget_from_prompts():
    """k = 3 drafts per decode: 4 budget tokens per decoding sequence. C = 16, I = 2000, O = 201,
    B = 1024, k rounds 1, flat 10 ms rounds.
    Without drafts: D = 200, lambda = 16/201, n_d = 15.92, room 1024 - 15.92 = 1008.1, S_p =
    ceil(2000/1008.1) = 2; lambda = 16/202, n_d = 15.84, room 1008.2: S_p = 2. Not bound:
    lambda (I + D) = 0.0792 * 2200 = 174 <= 1024.
    With e = 2: D / e = 100 rounds, lambda = 16/101, n_d = 15.84 taking 4 * 15.84 = 63.4 tokens,
    room 960.6, S_p = ceil(2000/960.6) = 3; lambda = 16/103, n_d = 15.53 (62.1 tokens), room
    961.9: S_p = 3. Not bound: 0.1553 * (2000 + 4 * 100) = 373 <= 1024. Each request also
    spends X = 15/16 rounds waiting for the round in progress (alignment, (C - 1) / C; flat
    rounds: nothing else outside its own), so lambda = 16 / (103 + 0.9375), n_d = 15.39 (61.6
    tokens), room 962.4: S_p = 3."""
    flat = lambda load, chunk: 0.01  # noqa: E731
    plain = steady_state(16, 2000, 201, 1024, 1, flat, 0.0)
    drafted = steady_state(16, 2000, 201, 1024, 1, flat, 0.0, tokens_per_round=2.0, spec_tokens=3)
    assert (plain.prefill_rounds, plain.budget_bound) == (2, False)
    assert (drafted.prefill_rounds, drafted.budget_bound) == (3, False)
    assert drafted.decode_seqs == pytest.approx(16 / 103.9375 * 100)


# ---------------------------------------------------------------- the drafter's memory and time


def test_mtp_draft_memory_by_hand(model):
    """Llama-3.1-8B shapes with one MTP layer, t = 1, bf16: the drafter holds one block and the
    h x 2h projection, and one layer of KV.
    Block: q 4096*4096 = 16,777,216; k, v 2*4096*1024 = 8,388,608; o 16,777,216 -> attention
    41,943,040; MLP 3*4096*14336 = 176,160,768; two norms 8,192 -> 218,112,000 params * 2 B
    = 436,224,000 B. Projection 2*4096*4096*2 B = 67,108,864 B. Total 503,332,864 B.
    KV: 2 (K, V) * 8 heads * 128 dims * 2 B = 4,096 B per token."""
    spec = model("llama-3.1-8b", num_mtp_layers=1)
    drafter = draft_memory(spec, Speculation("mtp", 1, (0.8,)), 1, 1, "auto")
    assert drafter.weights_bytes == 503_332_864
    assert drafter.kv_bytes_per_token == 4096 == kv_bytes_per_token_per_layer_by_kind(spec, 1, "auto")[0]
    draft = mtp_draft_model(model("deepseek-v3"))
    assert (draft.num_hidden_layers, draft.num_dense_layers, draft.is_moe) == (1, 0, True)
    # its one layer is an MoE layer: no dense positions carried over from the target's [0, 1, 2]
    assert draft.dense_layer_indices is None


def test_the_drafter_shares_the_kv_pool(model, cluster):
    """The pool holds target + draft KV per token: DeepSeek-V3 (61 MLA layers of 1,152 B at
    bf16: 70,272 B) with one MTP layer (1,152 B) keeps tokens = pool / 71,424 B, and the
    drafter's 1.55 GiB of weights come out of the pool first (its block split over t = 8, 1.36
    GiB, and its eh_proj replicated on every GPU: 2 * 7,168^2 * 2 B = 205,520,896 B)."""
    m, c = model("deepseek-v3"), cluster("1x8xH200")
    plain = estimate(m, c, Layout(8, 1, 1), ServeRequest(batch=8))
    mtp = estimate(m, c, Layout(8, 1, 1), ServeRequest(batch=8, speculation=Speculation("mtp", 1, (0.8,))))
    s0, s1 = plain.stages[0], mtp.stages[0]
    assert s1.draft_kv_bytes_per_token == 1152 and s1.kv_bytes_per_token == s0.kv_bytes_per_token == 70272
    assert s1.weights_bytes - s0.weights_bytes == pytest.approx(s1.draft_weights_bytes)
    assert s1.draft_weights_bytes / 2**30 == pytest.approx(1.55, abs=0.01)
    blocks = int(s1.kv_cache_bytes // ((70272 + 1152) * 16))
    assert s1.kv_cache_tokens == blocks * 16


def test_drafts_cost_steps_and_pay_back_in_tokens(model, cluster):
    """Llama-3.1-8B on one H100 at batch 1 with an EAGLE-3 head: the step grows by the
    drafter's passes (k = 3 passes of one block + a 32,000-token head) and by 3 verified rows,
    and emits 1 + 0.75 + 0.41 + 0.16 = 2.33 tokens; memory-bound decoding, so TPOT falls.
    With acceptance 0 the drafts are pure cost: TPOT rises."""
    target, c = model("llama-3.1-8b"), cluster("1x1xH100")
    head = model("llama-3.1-8b", num_hidden_layers=1, vocab_size=32000)
    plain = estimate(target, c, Layout(1, 1, 1), ServeRequest(batch=1))
    good = estimate(target, c, Layout(1, 1, 1),
                    ServeRequest(batch=1, speculation=Speculation("eagle3", 3, (0.75, 0.55, 0.4), head)))
    useless = estimate(target, c, Layout(1, 1, 1),
                       ServeRequest(batch=1, speculation=Speculation("eagle3", 3, (0.0,), head)))
    assert isinstance(good, ServeEstimate) and isinstance(useless, ServeEstimate)
    draft = good.decode_steps[0].draft_seconds
    assert draft > 0 and good.decode_round.seconds > plain.decode_round.seconds + draft * 0.99
    assert good.tpot_seconds < plain.tpot_seconds / 1.5
    assert useless.tpot_seconds > plain.tpot_seconds
    assert good.tpot_batch1_seconds == pytest.approx(good.tpot_seconds, rel=0.02)


def test_the_drafter_sits_on_the_last_pipeline_stage(model, cluster):
    """vLLM puts the drafter on the last PP rank (gpu_model_runner.py at 0.33.0): at tp=4 pp=2
    only stage 1 holds its weights and KV and runs its passes, and, away from the target's
    embedding, it loads its own: 128,256 * 8,192 * 2 B / 4 = 525,336,576 B on top of the
    head-less drafter it has at pp = 1."""
    head = model("llama-3.1-70b", num_hidden_layers=1, vocab_size=32000)
    speculation = Speculation("eagle3", 2, (0.7,), head)
    m, c = model("llama-3.1-70b"), cluster("1x8xH100")
    piped = estimate(m, c, Layout(4, 2, 1), ServeRequest(batch=32, speculation=speculation))
    flat = estimate(m, c, Layout(4, 1, 2), ServeRequest(batch=32, speculation=speculation))
    assert isinstance(piped, ServeEstimate)
    first, last = piped.stages
    assert first.draft_weights_bytes == 0 and last.draft_weights_bytes > 0
    assert last.draft_weights_bytes - flat.stages[0].draft_weights_bytes == 128_256 * 8192 * 2 / 4
    assert piped.decode_steps[0].draft_seconds == 0 and piped.decode_steps[1].draft_seconds > 0


# ---------------------------------------------------------------- burst simulation


def test_burst_with_drafts_by_hand():
    """Four requests of 100 + 101 tokens at once, budget 2,048, step = 10 ms + 1 ms per token.
    Step 1 prefills 400 tokens (410 ms) and emits every first token. Accepting every draft
    (k = 1, a = 1) each decode step emits 2 tokens: 100 more tokens take 50 steps of 4 + 4
    tokens, 18 ms each, so TPOT = 18 / 2 = 9 ms, ITL (one chunk per step) 18 ms, E2E = 410 +
    900 = 1,310 ms. With a = 0.5 (e = 1.5) the credit alternates 1 and 2 tokens: 100 / 1.5 =
    66.7 -> 67 steps."""
    requests = [SimRequest(0.0, 100, 101)] * 4

    def step(load: StepLoad) -> float:
        return 0.010 + 0.001 * load.num_tokens

    for acceptance, steps, tpot in (((1.0,), 51, 0.009), ((0.5,), 68, None)):
        result = simulate(requests, EngineLimits(100_000, 8, 2048, draft_acceptance=acceptance), step)
        metrics = bench_metrics(result)
        assert len(result.step_seconds) == steps
        assert result.step_loads[1].spec_tokens == 4
        if tpot is not None:
            assert metrics.tpot_seconds.mean == pytest.approx(tpot)
            assert metrics.itl_seconds.mean == pytest.approx(0.018)
            assert metrics.e2e_seconds.mean == pytest.approx(1.310)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=30),
       st.lists(st.floats(0, 1), min_size=1, max_size=4), st.integers(608, 4000))
def test_burst_with_drafts_finishes_every_request(lengths, acceptance, kv_tokens):
    # the longest request, 300 + 300 - 1 = 599 KV tokens, takes 38 blocks of 16 = 608 (600 held 37: refused)
    """Whatever the acceptance and however tight the KV cache (preemptions included), every
    request gets exactly its output, and drafts never make a step carry more than the budget."""
    requests = [SimRequest(0.001 * i, p, o) for i, (p, o) in enumerate(lengths)]
    limits = EngineLimits(kv_tokens, 16, 512, draft_acceptance=tuple(acceptance))
    result = simulate(requests, limits, lambda load: 0.01 + 1e-5 * load.num_tokens)
    assert result.output_lens == tuple(o for _, o in lengths)
    assert all(math.isfinite(t) and t > 0 for t in result.e2e_seconds)
    assert all(load.num_tokens <= 512 for load in result.step_loads)


# ---------------------------------------------------------------- the plan and the commands


def test_plan_says_what_the_drafts_buy(serve_plan):
    plan = serve_plan("deepseek-v3", "1x8xH200", layout={"tp": 8, "ep": 1}, batch=16,
                      speculation=Speculation("mtp", 1, (0.8,)), mode="aggregated")
    (option,) = plan.speculation_options
    assert option.estimate.tpot_seconds > plan.recommended.tpot_seconds


def test_plan_prices_every_shorter_draft(serve_plan):
    """k = 3 at (0.8, 0.3, 0.1): the plan also prices k' = 1 (e = 1.8) and k' = 2 (e = 2.04)
    on the same layout; the third draft adds little (e = 2.064) and costs a row per sequence.
    (For the 255 tokens a default request emits after its first, a little less: the last step
    emits no more than is left, tokens_per_round_for.)"""
    plan = serve_plan("llama-3.1-8b", "1x1xH100", batch=64, mode="aggregated",
                      speculation=Speculation("ngram", 3, (0.8, 0.3, 0.1)))
    assert [o.value for o in plan.speculation_options] == ["without speculative decoding", "1", "2"]
    one = plan.speculation_options[1].estimate
    assert one.steady.tokens_per_round == pytest.approx(tokens_per_round_for((0.8,), 255), rel=1e-12)
    assert one.steady.tokens_per_round == pytest.approx(1.8, rel=0.005)
    two = plan.speculation_options[2].estimate.steady.tokens_per_round
    assert two == pytest.approx(tokens_per_round_for((0.8, 0.3), 255), rel=1e-12)
    assert two == pytest.approx(1 + 0.8 + 0.24, rel=0.005)


def _args(speculation: Speculation) -> ServeArgs:
    return ServeArgs(model="MODEL", tp=8, pp=1, dp=1, gpus_per_node=8, gpu_memory_utilization=0.9,
                     max_model_len=8192, max_num_seqs=64, quantization=None, kv_cache_dtype="auto", dtype="bfloat16",
                     engine_versions=EngineVersions(), max_num_batched_tokens=None, gpu_memory_bytes=80 * 2**30,
                     weights_and_kv_bytes_per_gpu=60 * 2**30, speculation=speculation)


def test_speculative_flags_for_both_engines(model, engine_check):
    head = model("llama-3.1-8b", num_hidden_layers=1, vocab_size=32000)
    eagle = _args(Speculation("eagle3", 3, (0.7,), head, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"))
    flag, value = vllm_flags(eagle)
    assert flag == "--speculative-config"
    assert json.loads(value) == {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                 "num_speculative_tokens": 3}
    assert sglang_flags(eagle) == ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                   "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "--speculative-num-steps", "3",
                                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    mtp = _args(Speculation("mtp", 2, (0.8, 0.5)))
    assert json.loads(vllm_flags(mtp)[1]) == {"method": "mtp", "num_speculative_tokens": 2}
    assert sglang_flags(mtp)[:2] == ["--speculative-algorithm", "NEXTN"]
    assert sglang_flags(_args(Speculation("ngram", 3, (0.5,)))) == [
        "--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "1",
        "--speculative-num-draft-tokens", "4"]
    for argv in (["vllm", "serve", "MODEL", *vllm_flags(eagle)],
                 ["python", "-m", "sglang.launch_server", "--model-path", "MODEL", *sglang_flags(eagle)]):
        assert engine_check(argv, EngineVersions()) == [], argv


def test_json_records_the_speculation_and_the_comparison():
    """--json: `speculation` (method, k, acceptance, e = 1 + 0.8 = 1.8), the layout without it in
    `speculation_options`, and the command's --speculative-config."""
    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(app, ["--model", "deepseek-v3", "--cluster", "1x8xH200", "--layout", "tp=8,ep=1",
                                      "--batch", "16", "--mode", "aggregated", "--speculative-method", "mtp",
                                      "--draft-acceptance", "0.8", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["speculation"] == {"method": "mtp", "num_speculative_tokens": 1, "acceptance": [0.8],
                                   "tokens_per_step": pytest.approx(1.8), "draft_model": None,
                                   "served_draft_model": None}
    (off,) = data["speculation_options"]
    best = data["recommended"]
    assert off["num_speculative_tokens"] == 0 and off["tpot_seconds"] > best["tpot_seconds"]
    assert best["decode_steps"][0]["draft_seconds"] > 0
    argv = best["command"][0]["argv"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 1}


def test_the_drafter_runs_once_under_dual_batch_overlap(model, cluster):
    """vLLM micro-batches the model's forward under --enable-dbo; the proposer runs after it, on
    the whole step: the drafter's share of the step is the same with and without DBO."""
    m, c = model("deepseek-v3"), cluster("1x8xH200")
    steps = []
    for dbo in (False, True):
        request = ServeRequest(batch=64, all2all_backend="deepep_low_latency", enable_dbo=dbo,
                               speculation=Speculation("mtp", 3, (0.8,)))
        steps.append(estimate(m, c, Layout(1, 1, 8, 8), request).decode_steps[0].draft_seconds)
    assert steps[0] > 0 and steps[1] == pytest.approx(steps[0])


def test_disaggregated_ttft_waits_for_a_whole_decode_round(model, cluster):
    """The decode worker samples the first token after one round, which under speculative
    decoding lasts e = 2.47 tokens' TPOT, and under async scheduling (vLLM 0.33.0's default, kept
    with ngram) after the round it had scheduled ahead too: TTFT = first-token cost + prefill +
    exposed KV + 2 TPOT * e (1 without async scheduling); the first-token cost is 10 ms + the
    prompt's tokenization on the prefill and then the decode server, 2 x 1,024 x 1.7 us."""
    from planner.cost import efficiency as eff
    from planner.disagg_search import plan_disaggregated

    for ahead, rounds in ((None, 2), (False, 1)):
        request = ServeRequest(speculation=Speculation("ngram", 3, (0.8, 0.6, 0.4)), async_scheduling=ahead)
        best = plan_disaggregated(model("llama-3.1-70b-fp8"), cluster("1x8xH100"), request).recommended
        round_seconds = best.tpot_seconds * 2.472
        assert best.ttft_seconds == pytest.approx(eff.FIRST_TOKEN_SECONDS + 2 * 1024 * 1.7e-6 + best.prefill_load.prefill_seconds
                                                  + best.kv.exposed_seconds + rounds * round_seconds)


def test_the_plan_shows_the_best_layout_without_drafts_and_what_misses_the_sla(serve_plan, model, cluster):
    """When the layout with drafts is not the one the plan without them recommends, the options
    add that one (here the drafted layout is fixed at tp=2 dp=4 on 8 H100 with 70B; without
    drafts the plan ranks another first). A TPOT limit only the drafts meet: the layout without
    them is listed with why it misses."""
    from planner.serve_search import speculation_options

    m, c = model("llama-3.1-70b"), cluster("1x8xH100")
    request = ServeRequest(mode="aggregated", speculation=Speculation("ngram", 2, (0.7,)))
    drafted = estimate(m, c, Layout(2, 1, 4), request)
    plain = serve_plan("llama-3.1-70b", "1x8xH100", mode="aggregated").recommended
    assert plain.layout != drafted.layout
    options = {o.value: o.estimate for o in speculation_options(m, c, request, drafted)}
    assert options["without speculative decoding, the best layout"].layout == plain.layout
    tight = serve_plan("llama-3.1-8b", "1x1xH100", batch=1, max_tpot_seconds=0.004,
                       speculation=Speculation("ngram", 3, (0.6,)))
    off = tight.speculation_options[0].estimate
    assert isinstance(off, Rejected) and "--max-tpot-ms" in off.reasons[0]


def test_sglang_runs_drafts_over_pipeline_stages_for_eagle_only(model):
    """SGLang 0.5.23 (validation_hook.check_pipeline_parallel_compat): EAGLE / NEXTN over pipeline
    stages with SGLANG_ENABLE_PP_SPEC=1, no attention DP; NGRAM and EAGLE3 not at all."""
    from planner.emit.sglang import refusal, server_env

    assert refusal(Layout(8, 2, 1), Speculation("mtp", 1, (0.8,))) is None
    assert "EAGLE / NEXTN only" in refusal(Layout(8, 2, 1), Speculation("ngram", 2, (0.5,)))
    assert refusal(Layout(8, 1, 2), Speculation("ngram", 2, (0.5,))) is None
    assert "attention DP" in refusal(Layout(1, 2, 8, 8), Speculation("mtp", 1, (0.8,)))
    piped = replace(_args(Speculation("mtp", 1, (0.8,))), pp=2)
    assert server_env(piped) == {"SGLANG_ENABLE_PP_SPEC": "1"}
    assert server_env(_args(Speculation("mtp", 1, (0.8,)))) == {}


def test_explain_draws_the_drafter_apart(model, cluster):
    """plan explain's memory bar: the drafter's weights (1.55 GiB of DeepSeek-V3's MTP layer at
    t = 8) a segment of their own, the target's weights less them; the bar's parts still sum
    to the stage's memory."""
    from planner.explain import serve_memory

    request = ServeRequest(batch=8, speculation=Speculation("mtp", 1, (0.8,)))
    result = estimate(model("deepseek-v3"), cluster("1x8xH200"), Layout(8, 1, 1), request)
    (bar,) = serve_memory(model("deepseek-v3"), cluster("1x8xH200"), result, request)
    parts = {segment.name: segment.bytes for segment in bar.segments}
    stage = result.stages[0]
    assert parts["drafter weights"] == stage.draft_weights_bytes
    assert parts["weights"] + parts["drafter weights"] == stage.weights_bytes
    assert sum(parts.values()) == pytest.approx(stage.used_bytes)


def test_eagle3_head_memory_by_hand(model):
    """An EAGLE-3 head for Llama-3.1-8B at t = 1, bf16 (vLLM's llama_eagle3.py at 0.33.0):
    block 436,224,000 B (as the MTP test's); head 32,000 * 4,096 * 2 B = 262,144,000 B; fc
    3 * 4,096^2 * 2 B = 100,663,296 B (replicated); the first layer's qkv reads 2h, h more:
    4,096 * (32 + 2*8) * 128 * 2 B = 50,331,648 B. Total 849,362,944 B. At t = 2 the block's
    matmuls, the head and the extra qkv halve; the fc and the two norms (16,384 B) do not:
    (849,362,944 - 100,663,296 - 16,384) / 2 + 100,663,296 + 16,384 = 475,021,312 B."""
    head = model("llama-3.1-8b", num_hidden_layers=1, vocab_size=32000)
    speculation = Speculation("eagle3", 3, (0.7,), head)
    target = model("llama-3.1-8b")
    assert draft_memory(target, speculation, 1, 1, "auto").weights_bytes == 849_362_944
    assert draft_memory(target, speculation, 2, 1, "auto").weights_bytes == 475_021_312


def test_break_even_acceptance(serve_plan, model, cluster):
    """The factor f on every rate at which the drafts stop paying on the recommended layout: at
    f the goodput with drafts equals the layout's without them (to the bisection's 1/256 of
    the bracket), above it the drafts win, below it they lose."""
    from planner.serve_search import speculation_break_even

    request = ServeRequest(batch=64, mode="aggregated", speculation=Speculation("ngram", 3, (0.75, 0.55, 0.4)))
    m, c = model("llama-3.1-8b"), cluster("1x1xH100")
    plan = serve_plan("llama-3.1-8b", "1x1xH100", batch=64, mode="aggregated",
                      speculation=Speculation("ngram", 3, (0.75, 0.55, 0.4)))
    factor = plan.speculation_break_even
    assert factor is not None and 0 < factor < 1
    assert factor == speculation_break_even(m, c, request, plan.recommended)
    plain = estimate(m, c, plan.recommended.layout, replace(request, speculation=None)).goodput_tokens_per_second

    def goodput(f: float) -> float:
        rates = tuple(min(1.0, a * f) for a in (0.75, 0.55, 0.4))
        moved = replace(request, speculation=Speculation("ngram", 3, rates))
        return estimate(m, c, plan.recommended.layout, moved).goodput_tokens_per_second

    assert goodput(factor * 1.05) > plain > goodput(factor * 0.9)


def test_tokens_per_round_for_a_short_output_by_hand():
    """k = 1, a = 0.5: a step emits 1 or 2 tokens, each with 0.5 (e = 1.5). D = 1 left: one step
    (1 token a step). D = 2: R(2) = 1 + 0.5 R(1) + 0.5 R(0) = 1.5 steps, 2 / 1.5 = 1.333 tokens a
    step. D = 3: R(3) = 1 + 0.5 R(2) + 0.5 R(1) = 1 + 0.75 + 0.5 = 2.25, 3 / 2.25 = 1.333."""
    assert tokens_per_round_for((0.5,), 1) == 1.0
    assert tokens_per_round_for((0.5,), 2) == pytest.approx(2 / 1.5, rel=1e-12)
    assert tokens_per_round_for((0.5,), 3) == pytest.approx(3 / 2.25, rel=1e-12)
    assert tokens_per_round_for((0.5,), 0) == 1.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=0.99), min_size=1, max_size=8),
       st.integers(min_value=1, max_value=5000))
def test_tokens_per_round_never_exceed_the_tokens_left_or_the_mean(acceptance, decode_tokens):
    acceptance = tuple(acceptance)
    e = expected_tokens_per_step(acceptance)
    per_round = tokens_per_round_for(acceptance, decode_tokens)
    assert 1.0 - 1e-12 <= per_round <= min(e, decode_tokens) + 1e-9
    if decode_tokens > 2000:  # the truncation at the end fades
        assert per_round == pytest.approx(e, rel=0.01)


def test_two_output_tokens_with_eight_drafts_emit_one_a_step(serve_one):
    """Found by a sweep: output_len 2 with 8 drafts accepted at 0.99 (e = 8.6 tokens a step)
    priced TPOT as a step over 8.6, but the one token left after the first takes a whole step:
    TPOT = the decode round a request sees, the drafts' cost in it."""
    speculation = Speculation("ngram", 8, (0.99,))
    two = serve_one("llama-3.1-8b", "1x1xH100", (1, 1, 1), batch=4, input_len=512, output_len=2,
                    speculation=speculation)
    assert two.steady.tokens_per_round == 1.0
    assert two.tpot_seconds == pytest.approx(two.steady.decoding_round_seconds, rel=1e-12)
    long = serve_one("llama-3.1-8b", "1x1xH100", (1, 1, 1), batch=4, input_len=512, output_len=1024,
                     speculation=speculation)
    assert long.steady.tokens_per_round == pytest.approx(expected_tokens_per_step((0.99,) * 8), rel=0.01)
