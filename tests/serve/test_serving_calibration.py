"""The planner's serving estimate scored on AIConfigurator's measured vLLM runs
(tests/fixtures/aiconfigurator_silicon/, scored by bench/serving_calibration.py).

The bounds sit just above what the planner achieved when they were last set; a change of the
serving model that improves the fit should tighten them. Errors are predicted / measured - 1.

Steady state (the planner's default answer) on all 590 runs, with the GPUs' measured flash
shares, the norms' / rotary / activation traffic, fp4 GEMMs for NVFP4, fp8 attention with an fp8
KV cache, fp8/NVFP4 GEMMs and the MoE experts at vLLM's measured kernels, the KV cache counted
at the running sequences' mean footprint with the clients beyond it waiting for a slot, and the
InferenceX rows' server settings (fp8 KV cache and max-model-len for Llama; vLLM 0.10.2's
unfused all-reduce for Llama on Hopper), the linear layers' weight stream measured per GPU and
vLLM's per-layer cost fitted with it (0 rejected, 8 KV-starved):

    group                               runs  TPOT |err| med  max   signed  TTFT |err| med  max   signed
    gpt-oss-120b B200-SXM-180GB           84          10%    32%    +5%            51%      85%   -51%
    gpt-oss-120b H100-SXM5-80GB           69           9%  1219%    +4%            45%     100%   -45%
    gpt-oss-120b H200-SXM-141GB           75           6%    25%    +6%            42%      77%   -42%
    llama-3.1-70b-fp8 B200-SXM-180GB      60           8%    21%    +8%            51%      89%   -51%
    llama-3.1-70b-fp8 H100-SXM5-80GB      45           4%    35%    -4%            28%      99%   -28%
    llama-3.1-70b-fp8 H200-SXM-141GB      60           3%    18%    +1%            36%      95%   -36%
    llama-3.1-70b-nvfp4 B200-SXM-180GB    60           2%    24%    -0%            56%      82%   -56%
    llama-3.1-8b-fp8 H200-SXM-141GB       21         130%   234%  +130%            38%      60%   -38%
    qwen3-235b-a22b-fp8 H200-SXM-141GB    26          37%    53%   -37%            51%      61%   -51%
    qwen3-32b H100-SXM5-80GB              90           5%    22%    -5%            69%      93%   -69%
    overall                              590           6%  1219%    +1%            51%     100%   -51%

The gpt-oss rows on Hopper are priced with the MoE kernel their scripts chose
(VLLM_MXFP4_USE_MARLIN=1: --moe-backend marlin), which moved their TTFT from -56% to -41..-44%
(steady) and their TPOT from +12..19% to +19..21%; the B200 rows carry their script's fp8 KV
cache and FlashInfer's MXFP4 kernel on MXFP8 activations (gptoss_fp4_b200.sh:
VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1, --moe-backend flashinfer_mxfp8), which took their TPOT
from +37% to +22% and their TTFT from -32% to -49%. TP all-reduces up to vLLM's fusion limit
are priced at vLLM's fused all-reduce + RMSNorm kernel, measured (catalog serving_allreduce):
TPOT gpt-oss 22/21/19% -> 20/16/16% (B200/H100/H200), the dense groups' bias down by 2-4
points (the fused kernel at 262,144 B, 16 sequences at tp 8 on H100, takes 10.2 us where the
ring model took 15.3); llama-3.1-8b-fp8 128% -> 135%. (The measured sizes count bf16
elements, not bytes: AIConfigurator's collector all-reduces message_size elements.)

Most of the TTFT gap is the benchmark, not the engine: the 453 InferenceX rows ran 10 x C
requests with at most C in flight, all C first ones sent at once, lengths drawn from
[0.8 L, L], and report means (bench/serving_calibration.py, --as-benchmarked). Simulating
exactly that (planner.serve.burst_metrics) on the InferenceX rows at concurrency <= 16 and
<= 1,024 output tokens (174 runs): TPOT 10% median |error| (+4%), TTFT 19% (-18%);
llama-3.1-70b-fp8 on H100 / H200 / B200: TTFT 10% / 5% / 13%. All 590 as benchmarked: TPOT
11%, TTFT 28% (38% before the Marlin kernel: gpt-oss Hopper TTFT -48..-50% -> -25..-24%;
gpt-oss B200 TTFT -9% -> -36% with its MXFP8-activation kernel, whose prompts run 2.9x
faster), worst TTFT 100% (3,035% when the KV cache reserved every sequence's full length).
On 8xH100 (the anchor below) every TTFT lands within 19% as benchmarked (+12% median), where
the steady state misses by up to 66% at C = 64.
What is left (docs/cost-model.md, Serving: calibration):
- TTFT stays underestimated for gpt-oss-120b (-24..-36% as benchmarked) and on B200 (NVFP4
  -26%); no constant is fitted to close either.
- llama-3.1-8b-fp8 (AIConfigurator's own harness, client settings unpublished) TPOT +162%;
  qwen3-235b (same harness) -33%. The +1300% outlier is gpt-oss-120b on H100 at concurrency
  512 (measured 5.5 ms per token at 8192 input tokens).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/aiconfigurator_silicon/vllm_agg.csv"

MEDIAN_ABS_BOUND = {"tpot": 0.08, "ttft": 0.55}
"""Overall median |error|, now 0.06 (TPOT) and 0.51 (TTFT)."""
MAX_ABS_BOUND = {"tpot": 16.0, "ttft": 4.0}
"""Overall max |error|, now 15.21 (gpt-oss-120b on H100 tp 4 at C 512, 8,192 input tokens:
measured 5.5 ms a token, below what one step of the ~100 sequences Little's law implies from
its TTFT costs; 12.19 while the window layers' blocks were counted as held for max_model_len
tokens: the planner ran half as many sequences) and 3.92 (TTFT: MiniMax-M2.5 on 4 H100 with EP,
1,024 / 8,192 tokens, 64 clients, KV-starved: measured 20 s, the steady state 98 s, the burst
simulation 65 s. vLLM admits a request once its prompt's blocks are free and preempts running
ones when decode outgrows the cache, so a waiting client gets its first token sooner than a slot
at the sequences' mean footprint would allow; 0.9997 before that run joined the set)."""
GROUP_MEDIAN_ABS_BOUND = {"tpot": 1.40, "ttft": 0.75}
"""Every group's median |error|, now at most 1.30 (llama-3.1-8b-fp8, unpublished client
settings) and 0.69 (qwen3-32b)."""
DENSE_TPOT_GROUPS = ("llama-3.1-70b-fp8 B200-SXM-180GB", "llama-3.1-70b-fp8 H100-SXM5-80GB",
                     "llama-3.1-70b-fp8 H200-SXM-141GB", "llama-3.1-70b-nvfp4 B200-SXM-180GB",
                     "qwen3-32b H100-SXM5-80GB")
DENSE_TPOT_MEDIAN_ABS_BOUND = 0.10
"""The dense groups: each within 10% at the median (now 2-5%, and B200 fp8 8%: its runs' per-step
intercept sits 0.4 ms below NVFP4's in the same scripts, which the step does not model)."""
GPT_OSS_TPOT_GROUPS = ("gpt-oss-120b B200-SXM-180GB", "gpt-oss-120b H100-SXM5-80GB",
                       "gpt-oss-120b H200-SXM-141GB")
GPT_OSS_TPOT_MEDIAN_ABS_BOUND = 0.12
"""gpt-oss-120b's TPOT, each GPU within 12% at the median (now H200 6%, H100 9%, B200 10%;
16-20% before vLLM's per-step cost was refitted, 25-38% before the MoE kernels were measured)."""
AS_BENCHMARKED_ANCHOR_BOUND = {"ttft": 0.24, "tpot": 0.13}
"""llama-3.1-70b-fp8 on 8xH100, InferenceX, 1,024 output tokens (10 runs: 1,024 and 8,192
input tokens at C = 4-64) simulated as benchmarked: every run's |error|, now at most 0.226
(TTFT, +17% median: vLLM 0.24.0's fp8 GEMM rate, +10% before async scheduling's round was
priced, which these runs had on, `async-scheduling: true` in 70b_fp8_h100_slurm.sh, and +14%
before the prompt's tokenization was, 2 ms + 1.7 us a token in vLLM 0.10.2's micro-batches,
14 ms at 8,192 tokens; 0.146 and 0.089 with the best-kernel rate before them) and 0.116 (TPOT, -6% median; 0.147 and -7% before
the Hopper weight stream was measured and vLLM's per-layer cost refitted with it; these runs
ran vLLM 0.10.2's unfused all-reduce)."""
MINIMAX_TPOT_MEDIAN_ABS_BOUND = 0.13
"""MiniMax-M2.5 fp8 on H200 (51 InferenceX runs, vLLM 0.16.0 at tp 4 and 0.18.0 at tp 8, added
without fitting anything to them): TPOT median |error| now 0.11 (-11%; tp 8 -5%, tp 4 -18%, worst
-39% at tp 4 with 4 clients), 0.12 before each layer's query / key norm all-reduce was priced
(ModelSpec.qk_norm_across_heads). TTFT is -52% (steady) and -36% (as benchmarked): the group
bound above only. On H100 (15 runs, vLLM 0.18.0, tp 4 with the experts spread over the four GPUs,
--enable-expert-parallel) 0.11 (+7%: -12% at 4 clients, +25-31% at 32-64), TTFT -13% steady and
-2% as benchmarked (3 runs KV-starved: their clients queue for the cache). NVFP4 on B200 (67 runs,
vLLM nightly and 0.19.0, tp 1-8, the fp8 KV cache their script asks for): 0.09 (-8%; tp 1 +3%,
tp 2-8 -8..-10%), TTFT -55% steady, -34% as benchmarked."""
KIMI_H200_TPOT_MEDIAN_ABS_BOUND = 0.17
"""Kimi-K2.5 INT4 on H200 (30 InferenceX runs, vLLM 0.16.0, tp 8, added without fitting):
TPOT median |error| now 0.14 (+14%, +23% at 32-64 clients; one run at 64 ms a token, 4x its
neighbours, is -71%), 0.32 (+28%) while its INT4 experts were priced as dense GEMMs instead of
at vLLM's Marlin MoE kernel (int4_marlin_experts). On B200 (15 runs, FlashInfer's INT4 kernel,
unmeasured) -17%: the group bound only."""
KIMI_NVFP4_TPOT_MEDIAN_ABS_BOUND = 0.07
"""Kimi-K2.5 NVFP4 on B200 (43 InferenceX runs, vLLM 0.17.0, tp 4 and 8, added without fitting):
TPOT median |error| now 0.04 (+2%), max 0.15; with the checkpoint's fp8 KV cache
(ModelSpec.checkpoint_kv_cache_dtype, which vLLM 0.17.0 takes for --kv-cache-dtype auto): at 16
bits the planner's cache held half the tokens, 7 runs came out KV-starved and one TTFT +18,989%
(measured 230 ms, priced 44 s). TTFT -50% steady, -40% as benchmarked: the group bound only."""
EXPECTED_REJECTED: set[str] = set()
"""Fixture ids the planner rejects (none now); each one must be named here."""


@pytest.fixture(scope="module")
def calibration(bench_module):
    return bench_module("serving_calibration")


@pytest.fixture(scope="module")
def summary(calibration) -> dict:
    return calibration.score(calibration.load_rows(FIXTURE))


def test_every_fixture_row_is_scored_or_listed_as_rejected(summary) -> None:
    with FIXTURE.open(newline="", encoding="utf-8") as handle:
        num_rows = sum(1 for _ in csv.DictReader(handle))
    rejected = {r["id"] for r in summary["rejected"]}
    assert summary["num_rows"] == num_rows == 811
    assert summary["num_scored"] == num_rows - len(rejected)
    assert rejected == EXPECTED_REJECTED
    assert all(r["rejected"] for r in summary["rejected"])


@pytest.mark.parametrize("quantity", ["tpot", "ttft"])
def test_overall_error_stays_within_the_recorded_bounds(summary, quantity) -> None:
    stats = summary["overall"][quantity]
    assert stats["median_abs"] < MEDIAN_ABS_BOUND[quantity]
    assert stats["max_abs"] < MAX_ABS_BOUND[quantity]


@pytest.mark.parametrize("quantity", ["tpot", "ttft"])
def test_every_group_median_stays_within_its_bound(summary, quantity) -> None:
    assert len(summary["groups"]) == 16
    worst = {group: stats[quantity]["median_abs"] for group, stats in summary["groups"].items()}
    assert max(worst.values()) < GROUP_MEDIAN_ABS_BOUND[quantity], worst


def test_a_malformed_row_raises_instead_of_being_skipped(tmp_path, calibration) -> None:
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    short = tmp_path / "short.csv"
    short.write_text(f"{lines[0]}\n{lines[1].rsplit(',', 2)[0]}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="cells"):
        calibration.load_rows(short)


def test_dense_groups_tpot_within_their_bound(summary) -> None:
    for group in DENSE_TPOT_GROUPS:
        assert summary["groups"][group]["tpot"]["median_abs"] < DENSE_TPOT_MEDIAN_ABS_BOUND, group


def test_gpt_oss_groups_tpot_within_their_bound(summary) -> None:
    for group in GPT_OSS_TPOT_GROUPS:
        assert summary["groups"][group]["tpot"]["median_abs"] < GPT_OSS_TPOT_MEDIAN_ABS_BOUND, group


def test_minimax_tpot_within_its_bound(summary) -> None:
    for group in ("minimax-m2.5 H200-SXM-141GB", "minimax-m2.5 H100-SXM5-80GB", "minimax-m2.5-nvfp4 B200-SXM-180GB"):
        assert summary["groups"][group]["tpot"]["median_abs"] < MINIMAX_TPOT_MEDIAN_ABS_BOUND, group


def test_kimi_on_h200_tpot_within_its_bound(summary) -> None:
    assert summary["groups"]["kimi-k2.5 H200-SXM-141GB"]["tpot"]["median_abs"] < KIMI_H200_TPOT_MEDIAN_ABS_BOUND


def test_kimi_nvfp4_tpot_within_its_bound(summary) -> None:
    stats = summary["groups"]["kimi-k2.5-nvfp4 B200-SXM-180GB"]
    assert stats["tpot"]["median_abs"] < KIMI_NVFP4_TPOT_MEDIAN_ABS_BOUND
    assert stats["ttft"]["max_abs"] < 1  # none starved for its cache


def anchor_runs(calibration) -> list:
    return [r for r in calibration.load_rows(FIXTURE)
            if r.benchmark == "inferencex" and r.spec == "llama-3.1-70b-fp8" and r.gpu == "H100-SXM5-80GB"
            and r.tp == 8 and r.output_len == 1024]


def test_inferencex_70b_on_8xh100_as_benchmarked_within_bounds(calibration) -> None:
    """The benchmark's own protocol (10 x C requests, C in flight, the first C at once, lengths
    in [0.8 L, L], means) simulated step by step: every run within the bounds; the steady
    state, blind to the first wave's queue, misses TTFT by a median of 21% on the same runs
    (-64% at C = 64, 8,192 input tokens), against the simulation's 18% (14% before the prompt's
    tokenization was priced: these runs' TTFT was already over-predicted, see the bound)."""
    runs = anchor_runs(calibration)
    assert len(runs) == 10 and {r.concurrency for r in runs} == {4, 8, 16, 32, 64}
    simulated = calibration.score(runs, as_benchmarked=True)
    assert {r["benchmark"] for r in simulated["runs"]} == {"simulated"}
    for run in simulated["runs"]:
        for quantity, bound in AS_BENCHMARKED_ANCHOR_BOUND.items():
            assert abs(run[f"{quantity}_error"]) < bound, (run["id"], quantity, run[f"{quantity}_error"])
    steady = calibration.score(runs)
    assert steady["overall"]["ttft"]["median_abs"] > 0.20
    assert steady["overall"]["ttft"]["max_abs"] > 0.60
    assert steady["overall"]["ttft"]["median_abs"] > simulated["overall"]["ttft"]["median_abs"] + 0.02


def test_benchmark_lengths_follow_the_random_dataset(calibration) -> None:
    """--random-range-ratio 0.8: each length uniform in [int(0.8 L), L]; 10 per client."""
    run = anchor_runs(calibration)[0]
    lengths = calibration.benchmark_lengths(run)
    assert len(lengths) == 10 * run.concurrency
    assert all(int(0.8 * run.input_len) <= i <= run.input_len for i, _ in lengths)
    assert all(int(0.8 * run.output_len) <= o <= run.output_len for _, o in lengths)
    assert lengths == calibration.benchmark_lengths(run)  # seeded: the same draw every time


def test_only_dated_dumps_are_inferencex(calibration) -> None:
    assert calibration.benchmark_of("source_file=2026-04-06.csv; model=Llama-3.1-70B") == "inferencex"
    assert calibration.benchmark_of("source_file=/Users/x/aic-auto-gap-analysis/a.csv") == "unknown"


def test_kv_cache_shared_at_the_mean_footprint_as_benchmarked(calibration) -> None:
    """Llama-3.1-70B fp8 on one H200, 1,024 + 8,192 tokens, 64 clients (InferenceX): vLLM ran
    all 64 (measured TPOT 46.3 ms, TTFT 5.3 s, preempting as contexts grew). Reserving each
    sequence's full length gave 38 and missed TPOT by -25% and TTFT by +3,035% as benchmarked;
    at the mean footprint (prompt + half the output) the planner runs 64 and the burst's
    preemptions are simulated: now +0.5% and -6.4%."""
    run = next(r for r in calibration.load_rows(FIXTURE)
               if r.id.startswith("2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_1024x8192_c64_tp1"))
    predicted = calibration.predict(run, as_benchmarked=True)
    assert predicted["batch"] == 64
    assert abs(predicted["tpot_error"]) < 0.05 and abs(predicted["ttft_error"]) < 0.12


DENSE_TPOT_BY_TP_BOUND = 0.10
"""Every dense group's signed median TPOT error at every TP degree (steady state): now -7% to
+10% (B200 fp8 tp 2 +9.5%, Qwen3-32B tp 8 -7%)."""
DENSE_TPOT_TP_SPREAD_BOUND = 0.06
"""Within a dense group, the largest minus the smallest of those per-TP medians: now at most 4.1%
(Qwen3-32B on H100; Llama-3.1-70B fp8 on H100 4.0%). It was 11% on H100 when every GPU's weight
stream was priced at 0.76 of HBM (the step's weight read shrank too fast with TP)."""


def test_dense_groups_tpot_has_no_tp_trend(summary) -> None:
    for group in DENSE_TPOT_GROUPS:
        by_tp = {tp: stats["tpot"]["median_signed"] for tp, stats in summary["groups_by_tp"][group].items()}
        assert len(by_tp) >= 3, group
        assert all(abs(error) < DENSE_TPOT_BY_TP_BOUND for error in by_tp.values()), (group, by_tp)
        assert max(by_tp.values()) - min(by_tp.values()) < DENSE_TPOT_TP_SPREAD_BOUND, (group, by_tp)


def test_the_engine_fit_set_is_the_full_graph_runs(bench_module) -> None:
    """bench/engine_step_fit.py's fit set (efficiency.ENGINE_STEP_SECONDS_PER_LAYER's docstring):
    811 runs less the 105 InferenceX Llama-3.1-70B runs on Hopper (vLLM 0.10.2's piecewise graphs),
    the 21 + 26 runs of AIConfigurator's harness outliers and the 66 + 67 MiniMax-M2.5 and 45 + 43
    Kimi-K2.5 runs added after the fit = 438."""
    fit = bench_module("engine_step_fit")
    rows = fit.load_rows()
    kept = fit.fit_rows(rows)
    assert len(rows) == 811 and len(kept) == 438
    assert not any(r.gpu.startswith("H") and r.spec.startswith("llama-3.1-70b") and r.benchmark == "inferencex"
                   for r in kept)
    assert {r.group for r in rows} - {r.group for r in kept} == {
        "llama-3.1-8b-fp8 H200-SXM-141GB", "qwen3-235b-a22b-fp8 H200-SXM-141GB", "minimax-m2.5 H200-SXM-141GB",
        "minimax-m2.5 H100-SXM5-80GB", "kimi-k2.5 H200-SXM-141GB", "kimi-k2.5 B200-SXM-180GB", "kimi-k2.5-nvfp4 B200-SXM-180GB",
        "minimax-m2.5-nvfp4 B200-SXM-180GB",
        "llama-3.1-70b-fp8 H100-SXM5-80GB", "llama-3.1-70b-fp8 H200-SXM-141GB"}
