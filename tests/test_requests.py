"""The request dataclasses check their own values: a bad one raises SpecError naming the
flag it came from (the CLI turns that into one line and exit code 2). The training checks
that need the layout live beside the training search."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import resolve_cluster
from planner.errors import SpecError
from planner.requests import LayoutFilter, ServeRequest, TrainRequest
from planner.train_search import check_fixed_batch, resolve_fixed_dp

TRAIN = {"global_batch": 64, "seq_len": 2048}


@pytest.mark.parametrize("field, value, flag", [
    ("input_len", 0, "--input-len: must be positive (got 0)"),
    ("output_len", -1, "--output-len: must be positive"),
    ("batch", 0, "--batch: must be positive"),
    ("max_model_len", 0, "--max-model-len: must be positive"),
    ("max_num_batched_tokens", 0, "--max-num-batched-tokens: must be positive"),
    ("gpu_memory_utilization", 1.5, "--gpu-memory-utilization: must be in (0, 1] (got 1.5)"),
    ("gpu_memory_utilization", 0.0, "--gpu-memory-utilization: must be in (0, 1]"),
    ("max_tpot_seconds", -0.005, "--max-tpot-ms: must be positive (got -5.0)"),
])
def test_bad_serve_request_names_the_flag(field, value, flag):
    with pytest.raises(SpecError) as info:
        ServeRequest(**{field: value})
    assert str(info.value).startswith(flag)


@pytest.mark.parametrize("field, value, flag", [
    ("global_batch", 0, "--global-batch: must be positive"),
    ("seq_len", -2048, "--seq-len: must be positive"),
    ("micro_batch", 0, "--micro-batch: must be positive"),
    ("virtual_stages", 0, "--virtual-stages: must be positive"),
    ("virtual_stages", 1, "--virtual-stages: interleaving needs at least 2"),
    ("zero_stage", 4, "--zero: must be 0, 1, 2 or 3 (got 4)"),
])
def test_bad_train_request_names_the_flag(field, value, flag):
    with pytest.raises(SpecError) as info:
        TrainRequest(**{**TRAIN, field: value})
    assert str(info.value).startswith(flag)


def test_defaults_and_unset_values_pass():
    assert ServeRequest().input_len == 1024
    assert TrainRequest(**TRAIN, zero_stage=0).zero_stage == 0


def test_fixed_tp_pp_resolves_dp_and_checks_the_batch():
    """tp=8 pp=4 (and cp=1, given) on 64 GPUs: dp = 64 / 32 = 2. Without cp= a CP degree of 2
    could split those 2 ranks (2,048 tokens: 1,024 a rank), so dp is left to the search."""
    request = TrainRequest(global_batch=6, seq_len=2048, micro_batch=2, layout=LayoutFilter(tp=8, pp=4, cp=1))
    resolved = resolve_fixed_dp(request, resolve_cluster("8x8xA100"))
    assert resolved.layout == LayoutFilter(tp=8, pp=4, dp=2, cp=1)
    with pytest.raises(SpecError, match="--global-batch: 6 not divisible by micro-batch"):
        check_fixed_batch(resolved)
    free = replace(request, layout=LayoutFilter(tp=8, pp=4))
    assert resolve_fixed_dp(free, resolve_cluster("8x8xA100")).layout == LayoutFilter(tp=8, pp=4)
    # tp=8 pp=8: one rank left, nothing for CP to split: dp = 1 is fixed
    one = replace(request, layout=LayoutFilter(tp=8, pp=8))
    assert resolve_fixed_dp(one, resolve_cluster("8x8xA100")).layout == LayoutFilter(tp=8, pp=8, dp=1)


def test_tp_pp_not_dividing_the_gpus():
    request = TrainRequest(**TRAIN, layout=LayoutFilter(tp=8, pp=3))
    with pytest.raises(SpecError, match="--layout: tp\\*pp = 24 does not divide the 64 GPUs"):
        resolve_fixed_dp(request, resolve_cluster("8x8xA100"))


def test_virtual_stages_only_with_interleaving():
    with pytest.raises(SpecError, match="--virtual-stages: only with --schedule interleaved"):
        TrainRequest(**TRAIN, virtual_stages=2, schedule="gpipe")
    assert TrainRequest(**TRAIN, virtual_stages=2, schedule="interleaved").virtual_stages == 2


def test_fixed_dp_must_divide_the_global_batch():
    request = TrainRequest(global_batch=7, seq_len=2048, layout=LayoutFilter(dp=8))
    with pytest.raises(SpecError, match="--global-batch: 7 not divisible by dp=8"):
        check_fixed_batch(request)
