"""Anchor: the training estimate against NVIDIA's NeMo framework performance summary, dense
Llama pre-training on DGX-H100 and DGX-B200 (tests/fixtures/nemo_training_perf.csv, provenance
in tests/fixtures/README.md; scored by bench/training_calibration.py, which builds each row's
exact configuration).

Sources (read 2026-11-30):
- NeMo 24.07, "Performance Benchmarks / Pretraining", DGX-H100, FP8: NVIDIA/NeMo
  docs/source/performance/performance_summary.md at 9c5c5e9709407d3511005fc966e45374998bb478.
- NeMo containers 25.09 to 26.06, Megatron-Bridge "Performance Archive", pre-training tables
  (System: DGX-H100 / DGX-B200 for 25.09 and 25.11, Model: LLAMA3_70B / LLAMA3.1_405B from
  26.02): https://docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary-archive.html
  (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md at 4ab94dfad366).

Each bound is today's |error| (predicted / published tokens/s/GPU - 1) plus 5 points, so a
change that moves a row by more than that shows here; tighten the bound when a change improves
the fit. One constant is fitted to these rows, the share of its kernels' rates a training step
sustains (efficiency.TRAIN_SUSTAINED_RATE_FRACTION = 0.93, `python bench/training_calibration.py
--fit-sustained`); the kernel rates themselves are fitted to AIConfigurator's measured kernels
(tests/train/test_fp8_kernels.py). Today (all 26 rows scored, with TP communication overlap,
two-level DP collectives, the recipes' bf16 gradient reduction, Transformer Engine's fp8 casts by
each row's recipe, per-generation kernel rates, the pipeline split that counts the embedding and
loss as layers, and the sustained share): median |error| 3%, 25 within 10%, 26 within 15%, mean
+1%: 405B +4% to +10% on H100 and -1% to +8% on B200, 70B -3% to +6%, 8B -8% to +6%, Llama 2
7B / 13B / 70B +3% / -9% / -3%. Before the sustained share (every kernel at its measured rate):
median 7%, 16 within 10%, mean +8%, every row but three optimistic. Each row is priced with its
recipe (bench/training_calibration.py FP8_RECIPES: current scaling -> tensorwise, mxfp8 -> mxfp8,
not stated -> delayed). When the set was added the median was 22% over 15 rows (70B -22% to -24%
at the full recompute the planner then needed, B200 8B +36% to +42%) and the nine 405B rows were
rejected.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/nemo_training_perf.csv"
MARGIN = 0.05
"""Points of error above today's that a row may drift before its test fails."""

TODAY_ERROR = {
    "24.07 DGX-H100 LLAMA3-8B fp8 (recipe not stated)": -0.101,
    "24.07 DGX-H100 LLAMA3-70B fp8 (recipe not stated)": 0.064,
    "24.07 DGX-H100 LLAMA2-7B fp8 (recipe not stated)": 0.033,
    "24.07 DGX-H100 LLAMA2-13B fp8 (recipe not stated)": -0.094,
    "24.07 DGX-H100 LLAMA2-70B fp8 (recipe not stated)": -0.032,
    "25.09 DGX-H100 LLAMA3_8B fp8 (recipe not stated)": 0.062,
    "25.09 DGX-H100 LLAMA3_70B fp8 (recipe not stated)": -0.006,
    "25.09 DGX-H100 LLAMA3.1_405B fp8 (recipe not stated)": 0.086,
    "25.11 DGX-H100 LLAMA3_8B fp8 current scaling": 0.006,
    "25.11 DGX-H100 LLAMA3_70B fp8 current scaling": -0.026,
    "25.11 DGX-H100 LLAMA3.1_405B fp8 current scaling": 0.086,
    "26.02 DGX-H100 LLAMA3_70B fp8 (recipe not stated)": 0.004,
    "26.02 DGX-H100 LLAMA3.1_405B fp8 (recipe not stated)": 0.099,
    "26.02.01 DGX-H100 LLAMA3_70B fp8 (recipe not stated)": -0.007,
    "26.04 DGX-H100 LLAMA3_70B fp8 (recipe not stated)": -0.003,
    "26.04.01 DGX-H100 LLAMA3_70B fp8 (recipe not stated)": -0.022,
    "26.04.01 DGX-H100 LLAMA3.1_405B fp8 (recipe not stated)": 0.042,
    "26.06 DGX-H100 LLAMA3.1_405B fp8 (recipe not stated)": 0.049,
    "25.09 DGX-B200 LLAMA3_8B fp8 (recipe not stated)": -0.020,
    "25.09 DGX-B200 LLAMA3_8B fp8 mxfp8": -0.004,
    "25.09 DGX-B200 LLAMA3.1_405B fp8 (recipe not stated)": 0.015,
    "25.09 DGX-B200 LLAMA3.1_405B fp8 mxfp8": 0.077,
    "25.11 DGX-B200 LLAMA3_8B fp8 current scaling": -0.075,
    "25.11 DGX-B200 LLAMA3_8B fp8 mxfp8": -0.009,
    "25.11 DGX-B200 LLAMA3.1_405B fp8 current scaling": -0.008,
    "25.11 DGX-B200 LLAMA3.1_405B fp8 mxfp8": 0.073,
}
"""Predicted / published tokens/s per GPU - 1 today (each row at its fp8 recipe), per fixture row."""
FULL_RECOMPUTE_ROWS = {"24.07 DGX-H100 LLAMA3-8B fp8 (recipe not stated)"}
"""Rows the planner finds out of memory without recompute (nothing is published for 24.07's
recompute); they are scored at full recompute."""
ALLOWED_SOURCES = (
    "https://docs.nvidia.com/nemo/megatron-bridge/",
    "https://github.com/NVIDIA/NeMo/blob/",
)
"""The NeMo framework performance summaries: the only training source this set may hold."""
EXCLUDED_FRAGMENTS = ("gpt3", "gpt-3", "175b", "megatron-lm", "mosaicml", "llm-foundry", "torchtitan",
                      "korthikanti", "mt-nlg", "bloom", "dgx cloud", "dgx-cloud", "deepseek")
"""Rows that must never enter this file: NeMo's GPT-3 175B rows and the blind set's sources
(held out to check the planner, never to fit it)."""


@pytest.mark.parametrize("key", sorted(TODAY_ERROR))
def test_row_error_within_todays_plus_margin(key, nemo_scored, within_todays_error_plus):
    """The row's tokens/s per GPU against the published figure (source and container in the
    id; URLs in the fixture). Bound: today's |error| + 5 points."""
    within_todays_error_plus(MARGIN, key, nemo_scored, TODAY_ERROR)


NEMOTRON = "24.07 DGX-H100 Nemotron-340B fp8 (recipe not stated)"
"""The one row the harness cannot score (test_nemotron_340b_is_named_not_scored)."""


def test_every_row_is_scored_or_named(nemo_scored, nemo_summary):
    """26 of 27 rows scored, the 9 Llama 3.1 405B rows (25.09-26.06, H100 and B200; pp 8, vp 8)
    included: Megatron-Bridge's 405B recipe counts the embedding and the loss as pipeline
    layers (account_for_embedding/loss_in_pipeline_split), 128 units in 64 chunks, 15 | 16 x6 | 15.
    Named, not scored: NeMo 24.07's Nemotron-4 340B (below)."""
    assert set(nemo_scored) == set(TODAY_ERROR)
    assert [r["id"] for r in nemo_summary["rejected"]] == [NEMOTRON]


def test_nemotron_340b_is_named_not_scored(bench_module):
    """NeMo 24.07's Nemotron-4 340B (128 H100, tp 8, pp 8, vp 12, global batch 32, 4K; 326
    tokens/s per GPU; recompute and gradient dtype unpublished) does not fit as the harness prices
    24.x rows, with Megatron's fp32 main gradients: at no recompute stage 0 is 21.8 GiB over (12
    layers' activations for the micro-batches interleaving keeps in flight), at full recompute
    the last stage 1.2 GiB over (its 590M-parameter LM head share). With bf16 main gradients
    full recompute fits and lands -18%; priced at no recompute without the memory limit, -7%
    (fp32) and +1% (bf16): the time is right, what NVIDIA ran to fit it is not known."""
    from dataclasses import replace

    from planner.catalog import resolve_model
    from planner.train import TrainEstimate, estimate

    module = bench_module("training_calibration")
    row = next(r for r in module.load_rows(FIXTURE) if r.id == NEMOTRON)
    model, request = resolve_model(row.spec), module.request_for(row)
    full = estimate(model, module.cluster_for(row), module.config_for(row, "full"), request)
    assert not isinstance(full, TrainEstimate) and 0 < full.over_bytes < 2 * 2**30
    bf16 = estimate(model, module.cluster_for(row), module.config_for(row, "full"), replace(request, grad_reduce="bf16"))
    assert isinstance(bf16, TrainEstimate)
    assert abs(bf16.tokens_per_second / row.num_gpus / row.tokens_per_s_per_gpu - 1) < 0.25
    lifted = estimate(model, module.cluster_for(row, memory_gib=10_000), module.config_for(row, "none"), request)
    assert abs(lifted.tokens_per_second / row.num_gpus / row.tokens_per_s_per_gpu - 1) < 0.12


def test_recompute_the_planner_needs(nemo_scored):
    """Megatron-Bridge's H100 FP8 70B recipe (TP 4, PP 8, VP 5, MBS 1, 8K) recomputes nothing
    and reduces gradients in bf16 (its Llama 3 perf scripts set grad_reduce_in_fp32 = False):
    with 2-byte main gradients the planner fits it without recompute too (with fp32 ones it was
    1.7 GiB out of memory and fell back to full recompute, -22%). Only the 24.07 8B row (CP 2,
    recipe unpublished) needs full recompute; the 25.11 H100 8B FP8-CS recipe recomputes the first
    5 of its 32 layers (--recompute-method block --recompute-num-layers 5) and is priced so."""
    for key, row in nemo_scored.items():
        block = key.startswith("25.11 DGX-H100 LLAMA3_8B")
        expected = "full" if key in FULL_RECOMPUTE_ROWS else "full (block 5)" if block else "none"
        assert row["recompute"] == expected, key


def test_each_row_runs_its_published_recipe(nemo_scored):
    """Current scaling rows are priced as --fp8-recipe tensorwise, MXFP8 rows as mxfp8 and the
    rows that do not state one as delayed (Megatron-LM's default)."""
    expected = {"fp8 current scaling": "tensorwise", "fp8 mxfp8": "mxfp8", "fp8 (recipe not stated)": "delayed"}
    for key, row in nemo_scored.items():
        assert row["fp8_recipe"] == expected[row["precision"]], key


def test_fixture_holds_only_allowed_sources_and_no_gpt3_175b():
    """Every row cites a NeMo framework performance summary; no GPT-3 175B row (excluded by
    the issue) and nothing from the blind set."""
    with FIXTURE.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 27
    for row in rows:
        assert row["source_url"].startswith(ALLOWED_SOURCES), row["source_url"]
        text = " ".join(row.values()).lower()
        assert not any(fragment in text for fragment in EXCLUDED_FRAGMENTS), row


PUBLISHED_MISSES = ("24.07 DGX-H100 LLAMA3-8B fp8 (recipe not stated)",
                    "24.07 DGX-H100 LLAMA2-13B fp8 (recipe not stated)")
"""The two published configurations more than 15% slower than the planner's best (below)."""
with FIXTURE.open(newline="", encoding="utf-8") as _handle:
    ROW_COUNT = sum(1 for _ in csv.DictReader(_handle))


@pytest.mark.parametrize("index", range(ROW_COUNT))
def test_published_configurations_against_the_planners_best(bench_module, index):
    """Issue 12's third statistic on these allowed rows (bench/training_calibration.py
    --vs-best): the planner's best for each row's workload on its GPUs, against the published
    configuration, both priced by the planner. Today 24 of 26 within 15% (median gap +3%); the
    misses are NeMo 24.07's Llama 3 8B at cp 2, which needs full recompute in the planner, against
    ZeRO-3 without it (+33%), and its Llama 2 13B at pp 4 with 10 virtual stages over two nodes,
    whose 2(vm + p - 1) pipeline sends the planner prices exposed (14% of the step) against
    ZeRO-3 over 16 GPUs (+30%). A gap is never negative: the published configuration is in the
    search space (a best below it would be a search that drops the optimum). One row a case, so
    the 27 searches spread over the test workers."""
    module = bench_module("training_calibration")
    row = module.load_rows(FIXTURE)[index]
    if row.id == NEMOTRON:
        pytest.skip("the one row the harness cannot score (test_nemotron_340b_is_named_not_scored)")
    gap = module.versus_best(row)["gap"]
    assert gap is not None and gap >= -1e-9, (row.id, gap)
    assert (gap > 0.15) == (row.id in PUBLISHED_MISSES), (row.id, gap)


def test_the_misses_are_rows_of_the_set(bench_module):
    ids = {row.id for row in bench_module("training_calibration").load_rows(FIXTURE)}
    assert set(PUBLISHED_MISSES) <= ids and len(ids) - len(PUBLISHED_MISSES) - 1 >= 24


def test_the_sustained_share_is_the_fit_and_carries_to_the_held_out_rows(bench_module):
    """bench/training_calibration.py --fit-sustained over its grid picks
    efficiency.TRAIN_SUSTAINED_RATE_FRACTION (0.93: median |error| 7.0% -> 3.3% over these 26
    rows), and NeMo's B200 long-sequence rows, not fitted, move from +7% to within 3%."""
    from planner.cost import efficiency

    fit = bench_module("training_calibration").fit_sustained()
    assert fit["best_fraction"] == efficiency.TRAIN_SUSTAINED_RATE_FRACTION
    by_fraction = {p["fraction"]: p for p in fit["grid"]}
    best, unscaled = by_fraction[fit["best_fraction"]], by_fraction[1.0]
    assert best["median_abs"] < 0.04 < 0.06 < unscaled["median_abs"]
    assert best["within_10"] >= 25 and abs(best["mean_signed"]) < 0.02
    assert best["held_out"]["median_abs"] < 0.03 < 0.06 < unscaled["held_out"]["median_abs"]
