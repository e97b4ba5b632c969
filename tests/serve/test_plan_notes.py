"""What the serving plan says beside the numbers when a request meets a layout it does not
fit: KV heads replicated past tp = k, an fp8 override of a pre-quantized checkpoint, an EP
backend the recommended layout never uses, --layout with the disaggregated comparison, and
--batch above what the KV cache runs (the emitted --max-num-seqs is what memory was sized for)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from planner.cli import app


def plan(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_tp_beyond_the_kv_heads_is_explained():
    """Llama-3.1-70B has 8 KV heads: at tp=16 every GPU holds one, each on 2 GPUs."""
    text = plan("--model", "llama-3.1-70b", "--cluster", "2x8xH100", "--layout", "tp=16", "--mode", "aggregated")
    assert "tp=16 is more than the 8 KV heads" in text and "each held by 2 GPUs" in text


def test_fp8_override_names_the_checkpoint_it_needs():
    text = plan("--model", "llama-3.1-70b-awq", "--cluster", "1x8xH100", "--quantization", "fp8", "--mode", "aggregated")
    assert "MODEL must be a 16-bit checkpoint" in text


def test_an_unused_ep_backend_is_said_not_dropped():
    text = plan("--model", "deepseek-v3", "--cluster", "1x8xH200", "--layout", "tp=8,ep=1",
                "--all2all-backend", "deepep_low_latency", "--enable-dbo", "--mode", "aggregated")
    assert "--all2all-backend deepep_low_latency and --enable-dbo not used" in text
    assert "--enable-dbo" not in text.split("Launch")[1]


def test_layout_skips_the_disaggregated_comparison():
    text = plan("--model", "llama-3.1-70b", "--cluster", "2x8xH100", "--layout", "tp=8,dp=2")
    assert "Disaggregated prefill/decode not compared: --layout fixes an aggregated layout" in text
    result = CliRunner().invoke(app, ["--model", "llama-3.1-70b", "--cluster", "2x8xH100", "--layout", "tp=8",
                                      "--mode", "disaggregated"])
    assert result.exit_code == 2 and "--layout" in result.output


def test_batch_above_the_kv_cache_sizes_memory_for_the_emitted_max_num_seqs():
    """--batch 5000 on one H100 with Llama-3.1-8B: the cache runs fewer; memory (the profile
    run's sampler pass) is sized with the --max-num-seqs emitted, the same as --batch 1024's."""
    results = []
    for batch in ("1024", "5000"):
        data = json.loads(CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x1xH100", "--batch", batch,
                                                   "--mode", "aggregated", "--json"]).output)
        best = data["recommended"]
        argv = best["command"][0]["argv"]
        results.append((best["memory"]["activation_bytes"], best["kv_cache_tokens"], best["batch"],
                        int(argv[argv.index("--max-num-seqs") + 1])))
    assert results[0] == results[1]
    assert results[0][2] == results[0][3] < 1024


def test_concurrency_never_exceeds_the_token_budget():
    """vLLM refuses --max-num-seqs above --max-num-batched-tokens (SchedulerConfig, 0.33.0): on
    A100 the default budget is 2,048, so --batch 4096 runs 2,048 per replica (the rest wait),
    the command says --max-num-seqs 2048, and a note says why; likewise a decode worker."""
    payload = json.loads(CliRunner().invoke(app, [
        "--model", "llama-3.1-8b", "--cluster", "1x8xA100", "--mode", "aggregated", "--layout", "tp=8",
        "--batch", "4096", "--max-model-len", "2048", "--json"]).output)
    best = payload["recommended"]
    assert best["batch"] == 2048
    assert "--max-num-seqs 2048" in best["command"][0]["shell"]
    assert any("Token-budget-bound" in note for note in best["notes"])


def test_a_budget_below_the_wanted_sequences_caps_them():
    """--max-num-batched-tokens 512 on H100 (default max_num_seqs 1024): the plan runs 512
    sequences per replica and says so, instead of refusing the budget."""
    payload = json.loads(CliRunner().invoke(app, [
        "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--mode", "aggregated", "--max-num-batched-tokens", "512",
        "--json"]).output)
    best = payload["recommended"]
    assert best["batch"] <= 512
    assert "--max-num-batched-tokens 512" in best["command"][0]["shell"]


def test_a_prompt_bound_default_runs_at_its_peak_throughput():
    """DeepEP low latency steps hold 256 tokens: 256 decoding sequences per rank would leave
    no room for prompts (TTFT over a minute). Without --batch or an SLA the plan runs the
    concurrency with the most output tok/s, fewer than 256, and says why."""
    payload = json.loads(CliRunner().invoke(app, [
        "--model", "deepseek-v3", "--cluster", "2x8xH200", "--layout", "tp=1,pp=1,dp=16,ep=16",
        "--all2all-backend", "deepep_low_latency", "--json"]).output)
    best = payload["recommended"]
    assert best["batch"] < 256 and best["ttft_seconds"] < 5
    assert any(note.startswith("Prompt-bound") for note in best["notes"])


def test_peak_concurrency_search_by_hand():
    """Tokens/s rise 10 per sequence to 1,000 at 100 sequences, fall 1.25 per sequence to 900
    at 180, rise again to 980 at 256 and ease to 950 at 300. Sampled at powers of sqrt(2)
    (..., 91, 128, 181, 256, 300) the samples peak at 128 (965) and 256 (980); refined, the
    first is the true peak, 100. With a 3% tie the fewest sequences within 970 tok/s: 97."""
    from types import SimpleNamespace

    from planner.serve import peak_throughput_concurrency

    def rate(c: int) -> float:
        if c <= 100:
            return 10.0 * c
        if c <= 180:
            return 1000.0 - 1.25 * (c - 100)
        if c <= 256:
            return 900.0 + 80.0 * (c - 180) / 76
        return 980.0 - 30.0 * (c - 256) / 44

    def steady(c: int):
        return SimpleNamespace(throughput_tokens_per_second=rate(c))

    assert peak_throughput_concurrency(steady, 300) == 100
    assert peak_throughput_concurrency(steady, 300, 0.03) == 97
    assert peak_throughput_concurrency(steady, 1, 0.03) == 1


def test_peak_concurrency_search_skips_plateaus_and_finds_the_exhaustive_knee(monkeypatch):
    """DeepSeek-V3 tp=1 pp=2 dp=8 ep=8 on 2x8 H100 at a 1,024-token budget (1,024/256 tokens,
    the default): the knee the search finds (the fewest sequences within 3% of the most tokens/s)
    is the one found by pricing every concurrency up to the cap, and it prices few of them
    (past the budget's knee tokens/s are flat to 0.1%: PEAK_FLAT_FRACTION)."""
    from dataclasses import replace

    import planner.serve as serve
    from planner.catalog import resolve_cluster, resolve_model
    from planner.layout import Layout
    from planner.requests import ServeRequest

    found: list[tuple] = []
    search = serve.peak_throughput_concurrency

    def watched(steady_at, upper, tie=0.0, bound=None):
        priced: set[int] = set()

        def counted(c):
            priced.add(c)
            return steady_at(c)

        knee = search(counted, upper, tie, bound)
        found.append((steady_at, upper, tie, knee, len(priced)))
        return knee

    monkeypatch.setattr(serve, "peak_throughput_concurrency", watched)
    request = replace(ServeRequest(), max_num_batched_tokens=1024)
    result = serve.estimate(resolve_model("deepseek-v3"), resolve_cluster("2x8xH100"), Layout(1, 2, 8, 8), request)
    assert isinstance(result, serve.ServeEstimate) and result.notes[0].startswith("Prompt-bound")
    (steady_at, upper, tie, knee, num_priced), = found
    rates = {c: steady_at(c).throughput_tokens_per_second for c in range(1, upper + 1)}
    bar = max(rates.values()) * (1 - tie)
    assert knee == min(c for c, rate in rates.items() if rate >= bar) == result.concurrency
    assert num_priced < 40 < upper


def test_notes_say_what_sets_tpot_and_the_default_concurrency():
    """Llama-3.1-70B NVFP4 on 4 L40S at 1,024 / 256: the steps carry about four prompt tokens
    per output token, so prompts take most of the TPOT, and the plan says so; its 256
    sequences are vLLM's default --max-num-seqs there, fewer than the KV cache runs, and the
    plan says that too. The checkpoint note is in the JSON's launch_notes."""
    payload = json.loads(CliRunner().invoke(app, [
        "--model", "llama-3.1-70b-nvfp4", "--cluster", "1x4xL40S", "--json"]).output)
    notes = payload["recommended"]["notes"]
    assert any(note.startswith("Prompts share the steps") for note in notes)
    assert any("vLLM's default --max-num-seqs on L40S" in note for note in notes)
    assert any("MODEL must be the nvfp4 checkpoint" in note for note in payload["launch_notes"])


def test_lockstep_peak_concurrency_by_hand():
    """Prompt chunks per rank and step q = c / 100 (so whole numbers at 100, 200, 300); tokens/s
    rise 10 per sequence to 1,000 at 100, dip, reach 1,500 at 200, dip, and end at 1,480 at
    250, the cap. Peaks tried: 100, 200 and the cap (q(250) = 2.5: k = 1, 2). Best 1,500: with
    no tie 200; with a 3% tie (bar 1,455) the fewest peak over the bar is still 200 (100 gives
    1,000); with a 40% tie (bar 900) it is 100."""
    from types import SimpleNamespace

    from planner.serve import lockstep_peak_concurrency

    def rate(c: int) -> float:
        return {100: 1000.0, 200: 1500.0, 250: 1480.0}.get(c, 0.0)

    priced: list[int] = []

    def steady(c: int):
        priced.append(c)
        return SimpleNamespace(throughput_tokens_per_second=rate(c))

    assert lockstep_peak_concurrency(steady, lambda c: c / 100, 250, 0.0) == 200
    assert sorted(set(priced)) == [100, 200, 250]  # only the peaks are priced
    assert lockstep_peak_concurrency(steady, lambda c: c / 100, 250, 0.03) == 200
    assert lockstep_peak_concurrency(steady, lambda c: c / 100, 250, 0.4) == 100
    # exactly two chunks at the cap: its own peak, not the sequence below it
    priced.clear()
    assert lockstep_peak_concurrency(steady, lambda c: c / 125, 250, 0.0) == 250
    assert sorted(set(priced)) == [125, 250]
    # below one chunk per step there is no dip: the cap itself
    assert lockstep_peak_concurrency(steady, lambda c: c / 1000, 250, 0.03) == 250


def test_lockstep_ranks_run_at_their_peak_not_past_it():
    """DeepSeek-V3 on 2x8xH200 at dp=16 ep=8 (8 ranks in lockstep): the KV cache allows 371
    sequences per rank, but past 256 (one prompt chunk per rank and step) the busiest rank
    carries two chunks while the mean is 1.45, and tokens/s are lower at 371 than at 256.
    Without --batch or an SLA the plan runs the peak and says why; each of 300 and 371 asked
    for with --batch gives fewer tokens/s."""
    args = ["--model", "deepseek-v3", "--cluster", "2x8xH200", "--layout", "tp=1,pp=1,dp=16,ep=8", "--json"]
    best = json.loads(CliRunner().invoke(app, args).output)["recommended"]
    assert best["batch"] == 256
    assert any(note.startswith("Lockstep-bound") for note in best["notes"])
    for batch in (300, 371):
        other = json.loads(CliRunner().invoke(app, [*args, "--batch", str(batch)]).output)["recommended"]
        assert other["throughput_tokens_per_second"] < best["throughput_tokens_per_second"]


def test_a_loose_sla_keeps_the_prompt_bound_knee():
    """Llama-3.1-8B on 8 H100 at dp=8 with a 64-token step budget: without limits the plan runs
    14 sequences per replica (within 3% of the most tok/s, TTFT 0.2 s); the 64 the budget allows
    add 0.5% tok/s and queue every prompt some 8 s. A TPOT limit that all of them meet (200 ms)
    must not drop the knee: same concurrency, binding "saturation"."""
    args = ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--max-num-batched-tokens", "64",
            "--layout", "tp=1,pp=1,dp=8", "--json"]
    free = json.loads(CliRunner().invoke(app, args).output)["recommended"]
    limited = json.loads(CliRunner().invoke(app, [*args, "--max-tpot-ms", "200"]).output)["recommended"]
    assert free["batch"] == limited["batch"] < 64
    assert limited["ttft_seconds"] < 1
    assert limited["sla"]["binding"] == "saturation"
    assert any(note.startswith("Prompt-bound") for note in limited["notes"])


def test_a_loose_sla_keeps_the_lockstep_peak():
    """DeepSeek-V3 on 2x8xH200 at dp=16 ep=8: a TPOT limit every concurrency meets keeps the
    lockstep peak of 256 (not the 371 the KV cache allows, fewer tok/s)."""
    args = ["--model", "deepseek-v3", "--cluster", "2x8xH200", "--layout", "tp=1,pp=1,dp=16,ep=8", "--json",
            "--max-tpot-ms", "1000"]
    best = json.loads(CliRunner().invoke(app, args).output)["recommended"]
    assert best["batch"] == 256
    assert any(note.startswith("Lockstep-bound") for note in best["notes"])


def test_a_missed_limit_prints_above_the_limit():
    """4.04 ms against --max-tpot-ms 4 read "4.0 ms exceeds 4": one decimal, or as many more as
    it takes (up to 4) to print above the limit."""
    from planner.serve import ms_above

    assert ms_above(0.00404, 0.004) == "4.04"
    assert ms_above(0.0041, 0.004) == "4.1"
    assert ms_above(0.0040001, 0.004) == "4.0001"
    assert ms_above(0.0123, 0.004) == "12.3"


def test_a_float32_checkpoint_is_served_and_priced_in_16_bits(tmp_path):
    """Gemma-2's config.json says float32; vLLM's --dtype auto loads it in bfloat16 on an H100
    (vllm/config/model.py at 0.33.0), so its weights take 2 bytes each, not 4: Llama-3.1-8B's
    8,030,261,248 parameters x 2 B = 14.96 GiB, not 29.9 GiB, and the command says so."""
    import yaml

    from planner.catalog import MODEL_SPECS_DIR

    spec = yaml.safe_load((MODEL_SPECS_DIR / "llama-3.1-8b.yaml").read_text())
    path = tmp_path / "fp32.yaml"
    path.write_text(yaml.safe_dump({**spec, "name": "llama-fp32", "dtype": "float32"}))
    text = plan("--model", str(path), "--cluster", "1x8xH100", "--mode", "aggregated")
    assert "15.0 GiB of bfloat16 weights" in text and "float32 weights" not in text.split("Launch")[0]
    assert "--dtype bfloat16" in text and "MODEL's float32 weights load in bfloat16" in text
    data = json.loads(plan("--model", str(path), "--cluster", "1x8xH100", "--mode", "aggregated", "--json"))
    assert data["model_summary"]["weight_dtype"] == "bfloat16"
    assert any("float32 weights load in bfloat16" in note for note in data["launch_notes"])


def test_the_latency_objective_says_its_command_runs_one_request_at_a_time():
    text = plan("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--mode", "aggregated", "--objective", "latency")
    assert "--max-num-seqs 1" in text and "every other request waits for the running one" in text
    assert "every other request waits" not in plan("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--mode",
                                                   "aggregated", "--objective", "latency", "--batch", "8")


def test_one_output_token_has_no_tpot_in_the_comparison():
    """--output-len 1: the aggregated table shows no TPOT; the disaggregated table and the
    verdict gave one (3.3 and 3.9 ms) though no second token exists."""
    text = plan("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--output-len", "1", "--request-rate", "10")
    verdict = text.split("Aggregated or disaggregated:")[1]
    assert "TPOT" not in verdict.split("(")[0] and "TTFT" in verdict
    assert "req/s/copy" in text


def test_durations_past_10_s_print_in_seconds():
    """4,718,911.2 ms read as 4718911.2 ms in the table beside seconds in the burst lines; a
    TTFT column held 179.0 s beside 77580.1 ms (found by a CLI sweep): from 10 s on, seconds."""
    from planner.render.common import ms

    assert (ms(4718.9112), ms(77.5801), ms(10.0), ms(9.99), ms(0.0123), ms(0.0004)) == (
        "4,718.9 s", "77.6 s", "10.0 s", "9990.0 ms", "12.3 ms", "400 us")


def test_a_float32_checkpoint_takes_bfloat16_by_compute_capability():
    """vLLM picks bfloat16 from compute capability 8.0, whatever peaks a profile gives."""
    from planner.catalog import resolve_cluster
    from planner.requests import served_dtype

    a10g = resolve_cluster("1x1xA10G").gpu
    assert served_dtype(a10g) == "bfloat16"
    assert served_dtype(a10g.model_copy(update={"compute_capability": 7.5})) == "float16"


def test_the_near_tie_band_leads_with_a_real_gain_only(serve_one):
    """Throughput objective: a layout within 3% of the most tokens/s leads only where its TPOT is
    more than 3% lower; DeepSeek-V3 on 16x8 B200 under --max-tpot-ms 50 had led with a layout 3%
    short on tokens/s and 69 ms longer in TTFT for a TPOT 0.01 ms lower ("with 49.6 ms TPOT
    instead of 49.6 ms"; found by a CLI sweep). Both directions, on synthetic estimates."""
    import dataclasses

    from planner.serve_search import rank

    base = serve_one("llama-3.1-8b", "1x8xH100", (1, 1, 8))

    def fake(tp, tokens, tpot):
        return dataclasses.replace(base, layout=dataclasses.replace(base.layout, tp=tp),
                                   throughput_tokens_per_second=tokens, tpot_seconds=tpot)

    most, close_same, close_faster = fake(4, 1000.0, 0.0496), fake(2, 980.0, 0.04959), fake(8, 975.0, 0.040)
    assert rank([close_same, most], "throughput")[0] is most
    assert rank([close_same, most, close_faster], "throughput")[0] is close_faster
    # latency: the band's most tokens/s leads only where it beats the lowest TPOT's by over 3%
    fastest, near_more, near_much_more = fake(4, 1000.0, 0.0400), fake(2, 1020.0, 0.0405), fake(8, 1100.0, 0.0410)
    assert rank([near_more, fastest], "latency")[0] is fastest
    assert rank([near_more, fastest, near_much_more], "latency")[0] is near_much_more


def test_a_lone_int4_decode_is_called_memory_bound():
    """AWQ 70B at one sequence: its int4 GEMMs' time is their compute at a one-row shape (tiles
    nearly empty), above the 4-bit weight read, but their FLOPs at the full rate are far below
    it: the decode is the weights' work, as fp8's is (it was called compute-bound; found by a
    CLI sweep). A full batch of short requests is compute-bound all the same (with 2,048 output
    tokens its KV reads outlast the GEMMs: test_kv_reads_longer_than_the_gemms_make_the_decode_memory_bound)."""
    lone = json.loads(plan("--model", "llama-3.1-70b-awq", "--cluster", "1x8xH100", "--objective", "latency",
                           "--mode", "aggregated", "--json"))
    assert lone["recommended"]["decode_bound"] == "memory"
    full = json.loads(plan("--model", "llama-3.1-8b", "--cluster", "1x1xH100", "--batch", "1024", "--input-len", "128",
                           "--output-len", "128", "--json"))
    assert full["recommended"]["decode_bound"] == "compute"


def test_kv_reads_longer_than_the_gemms_make_the_decode_memory_bound():
    """Llama-3.1-8B on one H100 at its default 1,024 / 256 tokens and full batch: the decode
    step's linear layers are compute-bound at this many rows, but its attention (the KV reads,
    HBM-bound) takes longer than they do, so the step is memory-bound (it was called
    compute-bound; a CLI read). The explain breakdown names the work the same way."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.requests import ServeRequest
    from planner.serve_search import plan_serving

    best = plan_serving(resolve_model("llama-3.1-8b"), resolve_cluster("1x1xH100"), ServeRequest()).recommended
    step = best.decode_round.stage_steps[0]
    assert step.bound == "compute" and step.attention_seconds > step.gemm_seconds
    assert best.decode_bound == "memory"


def test_with_pp_the_prompt_share_note_names_the_idle_stages_too():
    """Llama-3.1-405B tp=8 pp=2 on 2x8 H100: of TPOT's 399 ms past the decode work, explain
    splits 171 ms of prompt chunks from 137 ms of stages idling while a chunk's micro-batch paces
    the round; the note had called all of it prompt chunks (a CLI read). Without PP it does not
    speak of stages."""
    def notes(*args):
        return json.loads(CliRunner().invoke(app, [*args, "--json"]).output)["recommended"]["notes"]

    piped = next(n for n in notes("--model", "llama-3.1-405b", "--cluster", "2x8xH100", "--layout", "tp=8,pp=2")
                 if n.startswith("Prompts share the steps"))
    assert "the other stages idling while a chunk's micro-batch paces the round" in piped
    flat = next(n for n in notes("--model", "llama-3.1-70b-nvfp4", "--cluster", "1x4xL40S", "--layout", "tp=4")
                if n.startswith("Prompts share the steps"))
    assert "stages" not in flat


def test_sglang_plans_say_their_all_reduce_is_priced_as_vllms():
    """Under --emit sglang the placement line had named vLLM's fused all-reduce + RMSNorm alone
    (a CLI read): SGLang's TP all-reduces are priced at vLLM's measured kernels, and it says so."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.render.serve import ALLREDUCE_SOURCE_WORDS, _placement_line
    from planner.requests import LayoutFilter, ServeRequest
    from planner.serve_search import plan_serving

    plan = plan_serving(resolve_model("qwen3-235b-a22b-fp8"), resolve_cluster("1x8xH100"),
                        ServeRequest(layout=LayoutFilter(tp=8, pp=1, dp=1, ep=1)))
    best = plan.recommended
    assert best.allreduce_source in ("fused", "engine")  # vLLM's measured kernels, fused or not
    words = ALLREDUCE_SOURCE_WORDS[best.allreduce_source]
    assert f"{words})" in _placement_line(best) and words.startswith("vLLM's")
    assert f"{words}, SGLang priced alike)" in _placement_line(best, "sglang")


def test_a_skipped_sample_leaves_its_neighbours_peak_to_be_refined():
    """A rate bound the search skips a sample by (under the bar) must not hide a peak next to it:
    rates 5 below 16, a spike 10, 40, 70, 90, 101, 80, 50, 30 at 16-23, 25 above and 100 at the
    top (64); a valid bound of 50 up to 16 and 101 above. The sample at 16 is skipped (50 < 0.97 *
    100), the one at 23 (30) is a peak beside it and its refinement finds 20 (101): with the bound,
    without it and over every concurrency, 20 (a review's case: the first version had put the
    skipped sample's bound beside it and answered 64)."""
    from types import SimpleNamespace

    from planner.serve import peak_throughput_concurrency

    spike = {16: 10.0, 17: 40.0, 18: 70.0, 19: 90.0, 20: 101.0, 21: 80.0, 22: 50.0, 23: 30.0}

    def rate(c: int) -> float:
        return spike.get(c, 5.0 if c < 16 else 100.0 if c == 64 else 25.0)

    def steady(c: int):
        return SimpleNamespace(throughput_tokens_per_second=rate(c))

    def bound(c: int) -> float:
        return 50.0 if c <= 16 else 101.0

    assert all(rate(c) <= bound(c) for c in range(1, 65))
    for tie in (0.0, 0.03):
        assert peak_throughput_concurrency(steady, 64, tie, bound) == peak_throughput_concurrency(steady, 64, tie) == 20


def test_the_latency_objective_runs_the_clients_concurrency():
    """--objective latency with --max-concurrency 16: the clients set the load, so each replica
    runs them (vLLM's own --max-num-seqs, 16 in flight), and the layouts are ranked by TPOT at
    it; one sequence a replica (the objective's lone request) had queued the other 15 for a 42.5
    s TTFT (Llama-3.1-70B tp=8 on 8 H100, a CLI read)."""
    text = plan("--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--mode", "aggregated", "--objective",
                "latency", "--max-concurrency", "16")
    recommended = text.split("Recommended: ")[1].split("; decode is")[0]
    assert "lowest TPOT" in recommended and "at 16 concurrent sequence(s) per replica" in recommended
    assert "--max-num-seqs 1 " not in text and "every other request waits for the running one" not in text
