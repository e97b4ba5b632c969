"""The planner's serving estimate scored on AIConfigurator's measured vLLM runs
(tests/fixtures/aiconfigurator_silicon/, scored by bench/serving_calibration.py).

The bounds sit just above what the planner achieved when the set was added; a change of the
serving model that improves the fit should tighten them. Errors are predicted / measured - 1.
Numbers at that commit (590 runs, 0 rejected, 24 KV-starved):

    group                               runs  TPOT |err| med  max   signed  TTFT |err| med  max   signed
    gpt-oss-120b B200-SXM-180GB           84          20%     57%   -15%          84%       94%   -84%
    gpt-oss-120b H100-SXM5-80GB           69          22%    451%   -19%          85%      100%   -85%
    gpt-oss-120b H200-SXM-141GB           75          29%     52%   -29%          85%       93%   -85%
    llama-3.1-70b-fp8 B200-SXM-180GB      60          13%     59%   -12%          80%       95%   -80%
    llama-3.1-70b-fp8 H100-SXM5-80GB      45          10%     46%   -10%          63%      100%   -63%
    llama-3.1-70b-fp8 H200-SXM-141GB      60          12%     65%   -12%          64%       98%   -64%
    llama-3.1-70b-nvfp4 B200-SXM-180GB    60          21%     51%   -21%          59%       91%   -59%
    llama-3.1-8b-fp8 H200-SXM-141GB       21          31%     52%   -31%          77%       86%   -77%
    qwen3-235b-a22b-fp8 H200-SXM-141GB    26          50%     77%   -50%          82%       88%   -82%
    qwen3-32b H100-SXM5-80GB              90          34%     85%   -34%          81%      100%   -81%
    overall                              590          22%    451%   -21%          80%      100%   -80%

TPOT is underestimated by ~20% (decode steps faster than measured); TTFT by ~80%: the
planner's TTFT is one prompt's prefill on an idle replica, the measured one includes the
queueing of `concurrency` prompts arriving together. The 451% TPOT outlier is gpt-oss-120b on
H100 at concurrency 512 (measured 5.5 ms per token at 8192 input tokens).
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

MEDIAN_ABS_BOUND = {"tpot": 0.24, "ttft": 0.82}
"""Overall median |error|, now 0.219 (TPOT) and 0.802 (TTFT)."""
MAX_ABS_BOUND = {"tpot": 4.6, "ttft": 1.0}
"""Overall max |error|, now 4.51 and 0.99997 (an underestimate's |error| is below 1)."""
GROUP_MEDIAN_ABS_BOUND = {"tpot": 0.55, "ttft": 0.90}
"""Every group's median |error|, now at most 0.50 (qwen3-235b-a22b-fp8) and 0.85 (gpt-oss-120b)."""
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
