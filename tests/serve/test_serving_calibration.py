"""The planner's serving estimate scored on AIConfigurator's measured vLLM runs
(tests/fixtures/aiconfigurator_silicon/, scored by bench/serving_calibration.py).

The bounds sit just above what the planner achieved when the set was added; a change of the
serving model that improves the fit should tighten them. Errors are predicted / measured - 1.
Numbers with the continuous-batching model and gpt-oss-120b's sliding-window layers
(590 runs, 0 rejected, 22 KV-starved):

    group                               runs  TPOT |err| med  max   signed  TTFT |err| med  max   signed
    gpt-oss-120b B200-SXM-180GB           84          32%    139%   +32%          47%       84%   -47%
    gpt-oss-120b H100-SXM5-80GB           69          25%   1100%   +23%          56%      100%   -56%
    gpt-oss-120b H200-SXM-141GB           75          37%    111%   +37%          50%       82%   -50%
    llama-3.1-70b-fp8 B200-SXM-180GB      60           5%     41%    -1%          68%       94%   -68%
    llama-3.1-70b-fp8 H100-SXM5-80GB      45           4%     37%    +2%          43%      100%   -43%
    llama-3.1-70b-fp8 H200-SXM-141GB      60           5%     49%    +3%          50%       97%   -50%
    llama-3.1-70b-nvfp4 B200-SXM-180GB    60          16%     75%   +16%          43%       81%   -42%
    llama-3.1-8b-fp8 H200-SXM-141GB       21          88%    162%   +88%          52%       67%   -52%
    qwen3-235b-a22b-fp8 H200-SXM-141GB    26          43%     59%   -43%          69%       75%   -69%
    qwen3-32b H100-SXM5-80GB              90           6%     22%    -4%          73%      100%   -73%
    overall                              590          13%   1100%    +7%          57%      100%   -57%

(When the set was added, with the static prefill-then-decode model: TPOT 22% median, -21%
signed; TTFT 80%, -80%.) The dense groups' TPOT fits within 6% at the median (the engine's
per-step cost is fitted on them: cost/efficiency.py ENGINE_STEP_SECONDS). What is left:
- TTFT is still underestimated: a closed loop of identical requests stays in phase, so the
  prompts arrive in waves and share steps (and the first wave queues), which the steady
  state, built for independent arrivals, does not see.
- llama-3.1-8b-fp8 (outputs of 100-2000 tokens) is overestimated for the same reason
  mirrored: in waves the prompts' compute lands in TTFT, not in the decode steps.
- gpt-oss-120b (MXFP4 MoE) is overestimated by 25-37% and qwen3-235b underestimated by 43%:
  the MoE GEMMs (grouped, per expert) and the MXFP4 rate are not modelled beyond the dense
  shape rule. Reading only the 128-token window on its 18 sliding-window layers took its
  TPOT from 30-42% (median, per GPU) to 25-37%; its TTFT, already underestimated, moved from
  41-54% to 47-56% under (its prompts' window layers pair each query with 128 keys at most).
  The 1100% outlier is gpt-oss-120b on H100 at concurrency 512 (measured 5.5 ms per token at
  8192 input tokens).
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/aiconfigurator_silicon/vllm_agg.csv"

MEDIAN_ABS_BOUND = {"tpot": 0.15, "ttft": 0.60}
"""Overall median |error|, now 0.13 (TPOT) and 0.57 (TTFT)."""
MAX_ABS_BOUND = {"tpot": 11.5, "ttft": 1.0}
"""Overall max |error|, now 11.0 and 0.9998 (an underestimate's |error| is below 1)."""
GROUP_MEDIAN_ABS_BOUND = {"tpot": 0.95, "ttft": 0.75}
"""Every group's median |error|, now at most 0.88 (llama-3.1-8b-fp8) and 0.73 (qwen3-32b)."""
DENSE_TPOT_GROUPS = ("llama-3.1-70b-fp8 B200-SXM-180GB", "llama-3.1-70b-fp8 H100-SXM5-80GB",
                     "llama-3.1-70b-fp8 H200-SXM-141GB", "qwen3-32b H100-SXM5-80GB")
DENSE_TPOT_MEDIAN_ABS_BOUND = 0.07
"""The groups the engine's step cost is fitted on: each within 7% at the median (now 4-6%)."""
GPT_OSS_TPOT_GROUPS = ("gpt-oss-120b B200-SXM-180GB", "gpt-oss-120b H100-SXM5-80GB",
                       "gpt-oss-120b H200-SXM-141GB")
GPT_OSS_TPOT_MEDIAN_ABS_BOUND = 0.39
"""gpt-oss-120b's TPOT, each GPU within 39% at the median (now 25-37%; 30-42% before its
sliding-window layers were modelled)."""
EXPECTED_REJECTED: set[str] = set()
"""Fixture ids the planner rejects (none now); each one must be named here."""


@functools.cache
def load_calibration():
    spec = importlib.util.spec_from_file_location("serving_calibration", REPO / "bench/serving_calibration.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def summary() -> dict:
    calibration = load_calibration()
    return calibration.score(calibration.load_rows(FIXTURE))


def test_every_fixture_row_is_scored_or_listed_as_rejected(summary) -> None:
    with FIXTURE.open(newline="", encoding="utf-8") as handle:
        num_rows = sum(1 for _ in csv.DictReader(handle))
    rejected = {r["id"] for r in summary["rejected"]}
    assert summary["num_rows"] == num_rows == 590
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
    assert len(summary["groups"]) == 10
    worst = {group: stats[quantity]["median_abs"] for group, stats in summary["groups"].items()}
    assert max(worst.values()) < GROUP_MEDIAN_ABS_BOUND[quantity], worst


def test_a_malformed_row_raises_instead_of_being_skipped(tmp_path) -> None:
    calibration = load_calibration()
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    short = tmp_path / "short.csv"
    short.write_text(f"{lines[0]}\n{lines[1].rsplit(',', 2)[0]}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="cells"):
        calibration.load_rows(short)


def test_dense_groups_tpot_within_seven_percent(summary) -> None:
    for group in DENSE_TPOT_GROUPS:
        assert summary["groups"][group]["tpot"]["median_abs"] < DENSE_TPOT_MEDIAN_ABS_BOUND, group


def test_gpt_oss_groups_tpot_within_their_bound(summary) -> None:
    for group in GPT_OSS_TPOT_GROUPS:
        assert summary["groups"][group]["tpot"]["median_abs"] < GPT_OSS_TPOT_MEDIAN_ABS_BOUND, group
