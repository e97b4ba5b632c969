"""Anchor: the training estimate at long sequences with context parallelism, against NVIDIA
NeMo's "Long Sequence Performance" tables (tests/fixtures/nemo_long_context_perf.csv,
provenance in tests/fixtures/README.md; scored by bench/training_calibration.py --long-context).

Sources (NVIDIA/NeMo docs/source/performance/performance_long_sequence.md):
- Llama-2-7B, FP8, DGX-H100, container NeMo 24.03.01, 4K-1M tokens (tp, pp, dp, cp and the
  global batch as published; at commit 19fadb67b09b, which adds the batch column).
- Llama-3-8B, FP8, DGX-B200, container NeMo 25.04.rc2, 8K-1M tokens (at commit 14d427f575ee,
  whose GPU counts equal tp x cp x dp; the later table repeats the H100 table's counts).

The tables publish model TFLOP/s per GPU only; bench/training_calibration.py converts them to
tokens/s with NeMo's own llama2/llama3 FLOPs formula of those containers (the whole s x s
attention square, nemo_model_flops_per_token). Micro-batch 1, the distributed optimizer,
sequence parallelism where tp > 1 and the fp8 recipe "not stated" -> delayed are the harness's
assumptions (nothing else is published). No constant of the planner is fitted to these rows.

Today, with each GPU's measured flash kernels (--attention-kernel auto) and the share of its
kernels' rates a training step sustains (efficiency.TRAIN_SUSTAINED_RATE_FRACTION, fitted to the
8K rows of tests/fixtures/nemo_training_perf.csv, not to these): B200 (25.04) -2% to +3%, median
1.5%; H100 (24.03) +13% at 8K rising to +59% at 1M, where attention is nearly all of the step.
With FlashAttention-2's published H100 share (--attention-kernel fa2: 35% of the bf16 peak,
Shah et al. 2024) the eight H100 rows from 8K to 1M land within -10% to -1% (median -4%): NeMo
24.03's Hopper attention ran at FlashAttention-2's speed, today's kernels (FA3, cuDNN 9.x) at
0.61 of the peak. The 4K row needs full recompute in the planner (fp32 main gradients, 8 GiB
over without), -18% (auto) and -25% (fa2). Before the sustained share: B200 +6% to +11%, H100 at
fa2 -3% to +6%.

Bounds: each row's |error| today plus 5 points.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/nemo_long_context_perf.csv"
MARGIN = 0.05
"""Points of error above today's that a row may drift before its test fails."""

H100 = "24.03.01 DGX-H100 LLAMA2-7B"
B200 = "25.04.rc2 DGX-B200 LLAMA3-8B"
TODAY_AUTO = {
    f"{H100} 4K tp1 pp1 cp1 dp4": -0.182,
    f"{H100} 8K tp1 pp2 cp1 dp4": 0.132,
    f"{H100} 16K tp2 pp1 cp1 dp8": 0.266,
    f"{H100} 32K tp2 pp1 cp2 dp8": 0.382,
    f"{H100} 64K tp4 pp1 cp2 dp8": 0.446,
    f"{H100} 128K tp4 pp1 cp4 dp8": 0.520,
    f"{H100} 256K tp4 pp1 cp8 dp8": 0.553,
    f"{H100} 512K tp8 pp1 cp16 dp4": 0.527,
    f"{H100} 1024K tp8 pp1 cp32 dp4": 0.587,
    f"{B200} 8K tp1 pp1 cp1 dp2": -0.005,
    f"{B200} 16K tp1 pp1 cp1 dp4": -0.017,
    f"{B200} 32K tp1 pp1 cp2 dp4": 0.026,
    f"{B200} 64K tp1 pp1 cp4 dp4": 0.029,
    f"{B200} 128K tp2 pp1 cp4 dp4": 0.017,
    f"{B200} 256K tp4 pp1 cp4 dp4": 0.000,
    f"{B200} 512K tp4 pp1 cp8 dp4": -0.012,
    f"{B200} 1024K tp4 pp1 cp16 dp4": -0.002,
}
"""Predicted / published tokens/s per GPU - 1 today at --attention-kernel auto."""
TODAY_FA2_H100 = {
    f"{H100} 4K tp1 pp1 cp1 dp4": -0.253,
    f"{H100} 8K tp1 pp2 cp1 dp4": -0.037,
    f"{H100} 16K tp2 pp1 cp1 dp8": -0.014,
    f"{H100} 32K tp2 pp1 cp2 dp8": -0.020,
    f"{H100} 64K tp4 pp1 cp2 dp8": -0.046,
    f"{H100} 128K tp4 pp1 cp4 dp8": -0.055,
    f"{H100} 256K tp4 pp1 cp8 dp8": -0.069,
    f"{H100} 512K tp8 pp1 cp16 dp4": -0.095,
    f"{H100} 1024K tp8 pp1 cp32 dp4": -0.074,
}
"""The same at --attention-kernel fa2 (the H100 rows; B200's kernels are not FlashAttention-2)."""


@pytest.fixture(scope="module")
def scored(bench_module) -> dict[str, dict[str, dict]]:
    module = bench_module("training_calibration")
    rows = module.load_long_context_rows(FIXTURE)
    return {kernel: {r["id"]: r for r in module.score(rows, attention_kernel=kernel)["rows"]}
            for kernel in ("auto", "fa2")}


@pytest.mark.parametrize("key", sorted(TODAY_AUTO))
def test_row_error_at_the_gpus_measured_kernels(key, scored, within_todays_error_plus):
    within_todays_error_plus(MARGIN, key, scored["auto"], TODAY_AUTO)


@pytest.mark.parametrize("key", sorted(TODAY_FA2_H100))
def test_h100_row_error_at_flashattention2s_rate(key, scored, within_todays_error_plus):
    within_todays_error_plus(MARGIN, key, scored["fa2"], TODAY_FA2_H100)


def test_every_row_is_scored(scored):
    for kernel in ("auto", "fa2"):
        assert set(scored[kernel]) == set(TODAY_AUTO)


def test_only_the_4k_row_needs_recompute(scored):
    """Every row but Llama-2-7B at 4K (tp 1, dp 4: 8 GiB over with fp32 main gradients) fits
    without recompute, the long ones because CP divides each rank's tokens."""
    for kernel in ("auto", "fa2"):
        for key, row in scored[kernel].items():
            assert row["recompute"] == ("full" if key.endswith("4K tp1 pp1 cp1 dp4") else "none"), key


def test_the_kernels_tell_the_two_containers_apart(scored):
    """The statistic the module docstring states: B200 within 15% at its measured kernels
    (median under 10%); H100 from 8K up within 10% at FlashAttention-2's share, and over 10%
    optimistic at the measured (FA3-class) one, over 40% from 64K."""
    b200 = [r["error"] for key, r in scored["auto"].items() if key.startswith(B200)]
    assert max(abs(e) for e in b200) <= 0.15 and sorted(abs(e) for e in b200)[len(b200) // 2] <= 0.10
    h100_long = [key for key in TODAY_FA2_H100 if not key.endswith("4K tp1 pp1 cp1 dp4")]
    assert all(abs(scored["fa2"][key]["error"]) <= 0.10 for key in h100_long)
    assert all(scored["auto"][key]["error"] > 0.10 for key in h100_long)
    assert all(scored["auto"][key]["error"] > 0.40 for key in h100_long if int(key.split()[3][:-1]) >= 64)


def test_tokens_per_second_from_nemos_tflops(bench_module):
    """NeMo's llama2 count for Llama-2-7B (L 32, h 4096, 32 heads and KV heads, FFN 11008,
    vocab 32000) at 4,096 tokens: 32 x 4096^2 x (12 + 12 x 32/32 + 18 x 11008/4096 + 12 x
    4096/4096 + 6 x 32000/(32 x 4096)) = 536,870,912 x 85.83984375 = 46,084,915,200 FLOPs per
    token, so the published 768 TFLOP/s per GPU is 768e12 / 46,084,915,200 = 16,664.9 tokens/s."""
    module = bench_module("training_calibration")
    from planner.catalog import resolve_model

    assert module.nemo_model_flops_per_token(resolve_model("llama-2-7b"), 4096, "llama2") == pytest.approx(
        46_084_915_200, rel=1e-12)
    first = module.load_long_context_rows(FIXTURE)[0]
    assert first.tokens_per_s_per_gpu == pytest.approx(768e12 / 46_084_915_200, rel=1e-12)


def test_fixture_holds_only_nemo_rows():
    with FIXTURE.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 17
    for row in rows:
        assert row["source_url"].startswith("https://github.com/NVIDIA/NeMo/blob/"), row["source_url"]
        assert int(row["num_gpus"]) % (int(row["tp"]) * int(row["pp"]) * int(row["cp"])) == 0, row
        # both tables keep 4M tokens per step: the batch halves as the sequence doubles
        assert int(row["gbs"]) * int(row["seq_len"]) == 4 * 1024 * 1024, row


def test_the_planners_best_without_cp_against_nvidias(bench_module):
    """A look at the search rather than one configuration: the tables' "Without CP" column is the
    best NVIDIA found without context parallelism (layout unpublished); the planner's best with
    cp = 1 that Megatron core_v0.14.0 would start (tp dividing the query groups, as the containers'
    Megatron-Core required) lands within 10% of it up to 64K tokens on both systems (H100 at
    FlashAttention-2's share: -1% to +3%, +18% at 128K; B200 -2% to +10%, +10% at 128K), and on
    B200 at 512K too with every layer recomputed (+2%: tp 8, pp 2, full recompute). Left to pick
    how many layers rerun, it recomputes 3 of each 4-layer chunk's (--recompute-method block), +22%:
    a configuration NVIDIA's column may not have tried (its layout is unpublished). Beyond, it
    reaches for layouts NVIDIA did not report (tp 16-32 across nodes on H100; tp 8 without
    recompute at 164 of 178 GiB on B200 at 256K, +31%)."""
    module = bench_module("training_calibration")
    looked = {r["id"]: r for kernel in ("fa2", "auto") for r in module.without_cp_rows(kernel)
              if r["id"].startswith(H100 if kernel == "fa2" else B200)}
    near = [key for key, r in looked.items() if r["gap"] is not None and int(key.split()[3][:-1]) <= 64]
    assert len(near) == 9  # H100 4K-64K, B200 8K-64K
    assert all(abs(looked[key]["gap"]) <= 0.10 for key in near), {k: looked[k]["gap"] for k in near}
    assert abs(looked[f"{B200} 128K tp2 pp1 cp4 dp4"]["gap"]) <= 0.15
    block = looked[f"{B200} 512K tp4 pp1 cp8 dp4"]
    assert "block" in block["best_config"] and 0.10 < block["gap"] <= 0.25, block
    (every_layer,) = module.without_cp_rows("auto", recompute="full", only=f"{B200} 512K tp4 pp1 cp8 dp4")
    assert every_layer["best_config"].endswith("full zero1") and abs(every_layer["gap"]) <= 0.10, every_layer
    assert looked[f"{B200} 1024K tp4 pp1 cp16 dp4"]["gap"] is None  # NVIDIA: no run without CP fits
