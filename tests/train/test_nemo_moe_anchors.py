"""A check, not a fit: the training estimate of MoE pre-training against NVIDIA's NeMo framework
performance archive (tests/fixtures/nemo_moe_training_perf.csv: DeepSeek-V3, GPT-OSS-120B,
Qwen3-30B-A3B, Qwen3-235B-A22B on DGX-H100 and DGX-B200, containers 25.09-26.06; provenance in
tests/fixtures/README.md; scored by `python bench/training_calibration.py --moe`, which builds
each row's exact configuration with its EP degree and, as NVIDIA ran them, balanced routing).

Today the MoE training model is far from these runs, and optimistic: median |error| 40% over 34
rows, 2 within 10%, 4 within 15%, mean +53%. Each row is priced as the planner would run it:
with the dispatcher it picks (DeepEP where it can run and prices faster, as NVIDIA's recipes run
Megatron's flex dispatcher for most of these models) and the least recompute that fits,
Megatron's output-discarding checkpoints ("outputs": moe_act, layernorm, mla_up_proj, which the
GPT-OSS and DeepSeek-V3 recipes run) among the levels. With NCCL all-to-alls only (--moe-
dispatcher alltoall) the rows read 37%, 8 within 15%, +33%; before either (NCCL, and full
recompute where none did not fit) 24%, 10 within 15%, +28%: the all-to-all's pessimism over
InfiniBand (one copy per expert where DeepEP sends one per node) and full recompute's extra
forward hid the optimism elsewhere.

Per family: Qwen3-30B on H100 +60% to +71% (+98% for 25.11's at full recompute, +183% against
26.02's 5,113, which 26.02.01 ran at 9,058 with the same configuration: a regression in that
container), GPT-OSS-120B on H100 +56% to +61% (+10% for 25.11's micro-batch 4 at full
recompute), Qwen3-235B on H100 (EP 32 over InfiniBand) +26% to +34%; on B200: Qwen3-30B +8% to
+10% at micro-batch 4 (+177% and +189% against 26.02's and 25.11's micro-batch-1 rows),
Qwen3-235B +55% to +56% (+67% for 25.11's), DeepSeek-V3 at PP 16 +31% to +38%, GPT-OSS +36% to
+43% at the recipe's outputs recompute (+37% for 26.02's at EP 64, +80% for 25.11's);
DeepSeek-V3 with EP 32 across nodes -23% (outputs recompute) and with EP 64 on H100 -16% (full
recompute), its tokens reaching at most 4 of 8 groups' nodes (group-limited routing). The time
missing per MoE layer and micro- batch is 1 to 10 ms and does not follow the tokens: host-bound
work (the dispatcher's host synchronisation per MoE layer, the router, eager launches) and GPT-
OSS's own kernels (its clamped activation, biases, head dim 64) are the likely causes, not yet
priced; docs/cost- model.md (Known limitations) keeps the numbers. No constant is fitted to
these rows; each bound below is today's |error| plus 5 points, so a change that moves a row
shows here, and a change that improves the MoE model should tighten them.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/nemo_moe_training_perf.csv"
MARGIN = 0.05
"""Points of error above today's that a row may drift before its test fails."""

TODAY_ERROR = {
    "26.06 DGX-H100 Qwen3_30B_a3B fp8 (recipe not stated)": 0.706,
    "26.04.01 DGX-B200 DeepSeekV3 fp8 mxfp8": -0.232,
    "26.04.01 DGX-B200 GPT OSS 120B bf16": 0.374,
    "26.04.01 DGX-H100 GPT OSS 120B bf16": 0.603,
    "26.04.01 DGX-B200 Qwen3_30B_a3B fp8 mxfp8": 0.085,
    "26.04.01 DGX-H100 Qwen3_30B_a3B fp8 (recipe not stated)": 0.681,
    "26.04.01 DGX-B200 Qwen3_235B_a22B fp8 mxfp8": 0.558,
    "26.04.01 DGX-H100 Qwen3_235B_a22B fp8 (recipe not stated)": 0.264,
    "26.04 DGX-B200 DeepSeekV3 fp8 mxfp8": 0.313,
    "26.04 DGX-B200 GPT OSS 120B bf16": 0.429,
    "26.04 DGX-H100 GPT OSS 120B bf16": 0.607,
    "26.04 DGX-B200 Qwen3_30B_a3B fp8 mxfp8": 0.096,
    "26.04 DGX-H100 Qwen3_30B_a3B fp8 (recipe not stated)": 0.692,
    "26.04 DGX-H100 Qwen3_235B_a22B fp8 (recipe not stated)": 0.283,
    "26.02.01 DGX-B200 DeepSeekV3 fp8 mxfp8": 0.325,
    "26.02.01 DGX-B200 GPT OSS 120B bf16": 0.358,
    "26.02.01 DGX-H100 GPT OSS 120B bf16": 0.560,
    "26.02.01 DGX-B200 Qwen3_30B_a3B fp8 mxfp8": 0.103,
    "26.02.01 DGX-H100 Qwen3_30B_a3B fp8 (recipe not stated)": 0.596,
    "26.02.01 DGX-H100 Qwen3_235B_a22B fp8 (recipe not stated)": 0.343,
    "26.02 DGX-B200 DeepSeekV3 fp8 mxfp8": 0.375,
    "26.02 DGX-B200 GPT OSS 120B bf16": 0.368,
    "26.02 DGX-H100 GPT OSS 120B bf16": 0.558,
    "26.02 DGX-B200 Qwen3_30B_a3B fp8 mxfp8": 1.773,
    "26.02 DGX-H100 Qwen3_30B_a3B fp8 (recipe not stated)": 1.827,
    "26.02 DGX-B200 Qwen3_235B_a22B fp8 mxfp8": 0.546,
    "26.02 DGX-H100 Qwen3_235B_a22B fp8 (recipe not stated)": 0.325,
    "25.11 DGX-B200 GPT OSS 120B bf16": 0.799,
    "25.11 DGX-B200 Qwen3_30B_a3B fp8 mxfp8": 1.890,
    "25.11 DGX-B200 Qwen3_235B_a22B fp8 mxfp8": 0.665,
    "25.11 DGX-H100 GPT OSS 120B bf16": 0.102,
    "25.11 DGX-H100 Qwen3_30B_a3B fp8 current scaling": 0.984,
    "25.11 DGX-H100 Qwen3_235B_a22B fp8 current scaling": 0.334,
    "25.09 DGX-H100 DeepSeekV3 (dropless) fp8 (recipe not stated)": -0.156,
}
"""Predicted / published tokens/s per GPU - 1 today, per fixture row."""
LAYOUT_STRING_ROWS = {
    "26.04.01 DGX-B200 DeepSeekV3 fp8 mxfp8": "--pipeline-model-parallel-layout",
    "25.09 DGX-H100 DeepSeekV3 (dropless) fp8 (recipe not stated)": "--pipeline-model-parallel-layout",
}
"""DeepSeek-V3's 61 layers at PP 8 with VP 2 or 4: neither Megatron's first/last flags nor the
embedding and loss counted as layers split them; the layout string does (a 6 | 8 x 6 | 7-style
split, its chunks uneven)."""
ALLOWED_SOURCE = "https://docs.nvidia.com/nemo/megatron-bridge/"


@pytest.mark.parametrize("key", sorted(TODAY_ERROR))
def test_row_error_within_todays_plus_margin(key, nemo_scored, within_todays_error_plus):
    within_todays_error_plus(MARGIN, key, nemo_scored, TODAY_ERROR)


def test_every_row_is_scored(nemo_scored, nemo_summary):
    assert set(nemo_scored) == set(TODAY_ERROR)
    assert nemo_summary["rejected"] == []


def test_deepseek_v3_at_pp8_with_virtual_stages_runs_a_layout_string(bench_module):
    """The two DeepSeek-V3 rows at PP 8 with VP 2 and 4 are planned with an uneven first/last
    split that Megatron's flags cannot write (a stage's layers not a multiple of v): their
    command names every chunk with --pipeline-model-parallel-layout."""
    from planner.catalog import resolve_cluster
    from planner.emit.megatron import megatron_steps

    module = bench_module("training_calibration")
    rows = {row.id: row for row in module.load_rows(FIXTURE)}
    for key in LAYOUT_STRING_ROWS:
        row = rows[key]
        result = module.estimate_row(row, "full")
        assert result.config.first_last_layers is not None and result.config.virtual_stages == row.vp
        cluster = resolve_cluster(f"{row.num_gpus // 8}x8x{module.SYSTEM_GPU[row.system]}")
        argv = [a for step in megatron_steps(module.resolve_model(row.spec), cluster, result.config,
                                             row.global_batch, row.seq_len) for a in step.argv]
        assert "--pipeline-model-parallel-layout" in argv
        assert "--decoder-first-pipeline-num-layers" not in argv


def test_the_expert_parallel_degree_and_balanced_routing_reach_the_estimate(bench_module):
    """The row's EP is the configuration's, and routing is balanced (NVIDIA forces it): the
    busiest GPU's extra expert work is zero, so the EP share of the step is the exchange
    alone. Qwen3-235B on H100 at EP 32 spans four nodes: the planner runs it on DeepEP (the
    flex dispatcher NVIDIA's recipes use), whose one copy of a token per node hit leaves a
    smaller share of the step to the exchange than NCCL's one copy per expert (most of it)."""
    module = bench_module("training_calibration")
    rows = {row.id: row for row in module.load_rows(FIXTURE)}
    row = rows["26.04.01 DGX-H100 Qwen3_235B_a22B fp8 (recipe not stated)"]
    result = module.estimate_row(row, "none")
    nccl = module.estimate_row(row, "none", moe_dispatcher="alltoall")
    assert result.config.ep == nccl.config.ep == row.ep == 32
    assert (result.config.moe_dispatcher, nccl.config.moe_dispatcher) == ("deepep", "alltoall")
    assert result.layer_terms.ep.imbalance_seconds == 0.0
    share = {name: e.time_breakdown_seconds.ep_comm / e.time_breakdown_seconds.total
             for name, e in (("deepep", result), ("alltoall", nccl))}
    assert share["alltoall"] > 0.5 > share["deepep"] > 0


def test_fixture_holds_only_the_nemo_archive_and_moe_models():
    with FIXTURE.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 34
    for row in rows:
        assert row["source_url"].startswith(ALLOWED_SOURCE), row["source_url"]
        assert row["spec"] in ("deepseek-v3", "gpt-oss-120b", "qwen3-30b-a3b", "qwen3-235b-a22b"), row
        assert int(row["ep"]) > 1, row
