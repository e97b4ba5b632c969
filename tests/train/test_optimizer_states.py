"""--optimizer-states bf16: Megatron's precision-aware optimizer (Transformer Engine's FusedAdam
inside the distributed optimizer) keeps Adam's moments in bf16 and, where TE keeps the master
weights of bf16 weights, only their low 16 bits (docs/cost-model.md#optimizer-states)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.training_memory import (
    MEGATRON_STATE_BYTES,
    megatron_state_bytes,
    optimizer_step_bytes,
    optimizer_step_bytes_per_param,
    precision_aware_master_remainders,
)
from planner.layout import TrainConfig
from planner.requests import TrainRequest
from planner.train import TrainEstimate, estimate, least_state_bytes_per_param, stage_memories
from planner.train_search import zero_options

TRAIN = ("--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
         "--seq-len", "4096")
LLAMA_8B_PARAMS = 8_030_261_248
"""Llama-3.1-8B's parameters (embedding and LM head untied)."""


def test_state_bytes_by_hand():
    """Megatron's default: 2 B of bf16 weights, 4 + 4 + 4 B of fp32 master weights and moments.
    bf16 moments: 2 + 2 B, and the master weights either whole (4 B: 8 in all) or as the low
    16 bits of each fp32 value, whose high 16 are the bf16 weight (2 B: 6 in all)."""
    assert megatron_state_bytes("fp32", master_remainders=True) == MEGATRON_STATE_BYTES
    assert (MEGATRON_STATE_BYTES.weights, MEGATRON_STATE_BYTES.optimizer) == (2, 12)
    assert (megatron_state_bytes("bf16", True).weights, megatron_state_bytes("bf16", True).optimizer) == (2, 6)
    assert megatron_state_bytes("bf16", False).optimizer == 4 + 2 + 2
    assert least_state_bytes_per_param("megatron", "bf16").optimizer == 6
    assert least_state_bytes_per_param("megatron").optimizer == 12


@pytest.mark.parametrize(("zero", "dtype", "precision", "recipe", "expected"), [
    (1, "bfloat16", "bf16", None, True),          # TE's FusedAdam keeps the master weights
    (1, "bfloat16", "fp8", "delayed", True),      # delayed scaling: still TE's
    (1, "bfloat16", "fp8", "tensorwise", False),  # Megatron keeps fp32 main params itself
    (1, "bfloat16", "fp8", "mxfp8", False),
    (1, "float16", "bf16", None, False),          # no remainder of an fp16 weight
    (3, "bfloat16", "bf16", None, False),         # Megatron-FSDP's fp32 main params
])
def test_where_the_master_weights_are_remainders(zero, dtype, precision, recipe, expected):
    assert precision_aware_master_remainders(zero, dtype, precision, recipe) is expected


def test_optimizer_step_traffic_by_hand():
    """Bytes the Adam step moves per parameter: read the fp32 gradient (4), read and write each
    optimizer state, write the bf16 weight, or read and write it where it is the master's upper
    half. fp32: 4 + 2 x 12 + 2 = 30; bf16 moments with remainders 4 + 2 x (2 + 4) + 2 x 2 = 20;
    with fp32 master weights 4 + 2 x (4 + 4) + 2 = 22."""
    assert optimizer_step_bytes_per_param(MEGATRON_STATE_BYTES, False) == 30
    assert optimizer_step_bytes_per_param(megatron_state_bytes("bf16", True), True) == 20
    assert optimizer_step_bytes_per_param(megatron_state_bytes("bf16", False), False) == 22
    model = resolve_model("llama-3.1-8b")
    config = TrainConfig(1, 1, 8, 1, "1f1b", 1, "none", False, 1)
    assert optimizer_step_bytes(config, model) == 30
    assert optimizer_step_bytes(config.with_(optimizer_states="bf16"), model) == 20
    assert optimizer_step_bytes(config.with_(optimizer_states="bf16", precision="fp8", fp8_recipe="tensorwise"),
                                model) == 22
    assert optimizer_step_bytes(config.with_(engine="torchtitan"), model) == 30
    # TE's FusedAdam reads bf16 main gradients as they are: 2 + 2 x 6 + 2 x 2 = 18
    assert optimizer_step_bytes(config.with_(optimizer_states="bf16", grad_reduce="bf16"), model) == 18


def test_llama_8b_optimizer_memory_by_hand():
    """Llama-3.1-8B, tp = pp = 1, dp = 8, ZeRO-1: every GPU holds P = 8,030,261,248 parameters,
    the optimizer's share P/8. fp32: 12 x P / 8 = 12,045,391,872 B; bf16 moments (remainders):
    6 x P / 8 = 6,022,695,936 B. Weights (2P) and gradients (4P) are unchanged."""
    model = resolve_model("llama-3.1-8b")
    config = TrainConfig(1, 1, 8, 1, "1f1b", 1, "none", False, 1)
    (fp32,) = stage_memories(model, config, 4096, 8, stages=(0,))
    (bf16,) = stage_memories(model, config.with_(optimizer_states="bf16"), 4096, 8, stages=(0,))
    assert fp32.optimizer_bytes == 12 * LLAMA_8B_PARAMS / 8 == 12_045_391_872
    assert bf16.optimizer_bytes == 6 * LLAMA_8B_PARAMS / 8 == 6_022_695_936
    assert (bf16.weights_bytes, bf16.gradient_bytes) == (fp32.weights_bytes, fp32.gradient_bytes)
    assert fp32.total_bytes - bf16.total_bytes == 6_022_695_936


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2, 4, 8]),
       zero=st.sampled_from([1, 2, 3]), b=st.sampled_from([1, 2]), fp8=st.booleans(),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_bf16_states_never_need_more_memory(tp, pp, dp, zero, b, fp8, recompute):
    """On any stage of any configuration the bf16 optimizer states hold no more than the fp32 ones,
    and no more than 8/12 of them; nothing else in the stage moves."""
    if pp > 1 and zero > 1:
        zero = 1  # Megatron-FSDP is planned without PP
    model = resolve_model("llama-3.1-8b")
    config = TrainConfig(tp, pp, dp, b, "1f1b", 1, recompute, tp > 1, zero,
                         precision="fp8" if fp8 else "bf16", fp8_recipe="delayed" if fp8 else None)
    for fp32, bf16 in zip(stage_memories(model, config, 4096, 8),
                          stage_memories(model, config.with_(optimizer_states="bf16"), 4096, 8), strict=True):
        assert bf16.optimizer_bytes <= fp32.optimizer_bytes * 8 / 12 * (1 + 1e-12)
        assert bf16.total_bytes - bf16.optimizer_bytes == pytest.approx(fp32.total_bytes - fp32.optimizer_bytes)


def test_the_search_runs_bf16_states_in_the_distributed_optimizer():
    """Megatron asserts --use-distributed-optimizer with --use-precision-aware-optimizer: the search
    drops ZeRO-0, also at dp = 1 (where ZeRO-1 shards over one rank), and an estimate at ZeRO-0
    says why."""
    request = TrainRequest(global_batch=64, seq_len=4096, optimizer_states="bf16")
    assert zero_options(request, 1, 1, 1) == [1]
    assert zero_options(request, 1, 1, 8) == [1, 2, 3]
    assert zero_options(request, 1, 2, 4) == [1]
    fp32 = TrainRequest(global_batch=64, seq_len=4096)
    assert zero_options(fp32, 1, 1, 1) == [0] and zero_options(fp32, 1, 2, 4) == [0, 1]
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    rejected = estimate(model, cluster, TrainConfig(8, 1, 1, 1, "1f1b", 1, "none", True, 0), request)
    assert not isinstance(rejected, TrainEstimate)
    assert rejected.reasons[0].startswith("--optimizer-states bf16 needs the distributed optimizer")


def test_bf16_states_through_the_cli(run_plan):
    """The plan names the states, the JSON records them, the command asks Megatron for them."""
    result = run_plan(*TRAIN, "--layout", "tp=1,pp=1", "--optimizer-states", "bf16", "--json", "--top", "1")
    assert result.returncode == 0, result.stderr
    best = json.loads(result.stdout)["recommended"]
    assert best["optimizer_states"] == "bf16" and best["zero_stage"] >= 1
    argv = best["command"][0]["argv"]
    i = argv.index("--use-precision-aware-optimizer")
    assert argv[i + 1:i + 5] == ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    assert "--use-distributed-optimizer" in argv
    text = run_plan(*TRAIN, "--layout", "tp=1,pp=1", "--optimizer-states", "bf16", "--top", "1").stdout
    assert "bf16 optimizer states (Adam's moments)" in text
    assert json.loads(result.stdout)["optimizer_states"] == "bf16"  # the request's, also where nothing fits
    default = json.loads(run_plan(*TRAIN, "--layout", "tp=1,pp=1", "--json", "--top", "1").stdout)["recommended"]
    assert default["optimizer_states"] == "fp32"
    assert "--use-precision-aware-optimizer" not in default["command"][0]["argv"]


@pytest.mark.parametrize(("extra", "message"), [
    (("--engine", "torchtitan"), "--optimizer-states bf16: torchtitan v0.2.2 keeps Adam's moments"),
    (("--zero", "0"), "--optimizer-states bf16 with --zero 0: Megatron's precision-aware optimizer runs only"),
])
def test_where_bf16_states_cannot_run_is_a_one_line_error(run_plan, extra, message):
    result = run_plan(*TRAIN, "--optimizer-states", "bf16", *extra)
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""


def test_the_plan_names_bf16_states_where_they_recompute_less(run_plan):
    """Llama-3.1-405B on 16x8 H100 (global batch 512, 8,192 tokens): the recommendation, tp 8 x
    pp 16 at dp 1, holds its whole optimizer, 12 B a parameter (35.6 GiB a GPU), and reruns the
    first 6 layers of each chunk; with bf16 states 6 B (17.8 GiB) and 4 layers, more than
    BF16_STATES_NOTE_GAIN faster, which the plan says (text and JSON)."""
    from planner.train_search import BF16_STATES_NOTE_GAIN

    args = ("--workload", "train", "--model", "llama-3.1-405b", "--cluster", "16x8xH100", "--global-batch", "512",
            "--seq-len", "8192")
    data = json.loads(run_plan(*args, "--json", "--top", "1").stdout)
    best, bf16 = data["recommended"], data["bf16_optimizer_states_faster"]
    assert (best["recompute"], best["recompute_num_layers"], best["optimizer_states"]) == ("full", 6, "fp32")
    assert (bf16["recompute"], bf16["recompute_num_layers"]) == ("full", 4)
    assert bf16["optimizer_bytes"] == pytest.approx(best["memory"]["optimizer_bytes"] / 2)
    assert bf16["tokens_per_second"] > (1 + BF16_STATES_NOTE_GAIN) * best["tokens_per_second"]
    text = run_plan(*args, "--top", "1").stdout
    assert "Optimizer states: with bf16 Adam moments (--optimizer-states bf16" in " ".join(text.split())
    # asked for already, or under torchtitan (which has none): nothing to name
    asked = json.loads(run_plan(*args, "--json", "--top", "1", "--optimizer-states", "bf16").stdout)
    assert asked["bf16_optimizer_states_faster"] is None


def test_no_note_where_nothing_is_recomputed(run_plan):
    """Llama-3.1-8B on 8 H100 at 4,096 tokens recomputes nothing: no second search, no note."""
    data = json.loads(run_plan(*TRAIN, "--json", "--top", "1").stdout)
    assert data["recommended"]["recompute"] == "none" and data["bf16_optimizer_states_faster"] is None


def test_what_would_fit_names_bf16_states(run_plan):
    """NeMo 24.07's Nemotron-4 340B layout (tp 8, pp 8, v 12 on 128 H100, bf16 gradients) asked
    without recompute does not fit with fp32 states (11.0 GiB over); the plan says it fits with bf16
    ones."""
    result = run_plan("--workload", "train", "--model", "nemotron-4-340b", "--cluster", "16x8xH100",
                      "--global-batch", "32", "--micro-batch", "1", "--seq-len", "4096", "--layout", "tp=8,pp=8",
                      "--schedule", "interleaved", "--virtual-stages", "12", "--precision", "fp8",
                      "--recompute", "none", "--grad-reduce", "bf16", "--json")
    assert result.returncode == 1
    suggestions = json.loads(result.stdout)["suggestions"]
    assert any(s.startswith("these GPUs run tp=8 cp=1 pp=8 dp=2, recompute none, ZeRO-1, micro-batch 1 with bf16 "
                            "optimizer states (--optimizer-states bf16") for s in suggestions), suggestions


def test_the_in_node_shortfall_names_bf16_states_unless_zero_0_is_pinned(run_plan):
    """Llama-3.1-405B on 12x8 H100: no layout with TP inside a node fits with fp32 states (tp 8 x
    pp 12 at dp 1 holds its whole optimizer, 12 B a parameter: 49.0 GiB); the plan says bf16 states
    would free half of it (6 B: 24.5 GiB), and finds tp 8 x pp 12 with them. A pinned --zero 0,
    under which Megatron cannot run them, names neither (a review: the hint led to an exit 2)."""
    args = ("--workload", "train", "--model", "llama-3.1-405b", "--global-batch", "512", "--seq-len", "8192",
            "--cluster", "12x8xH100", "--json")
    data = json.loads(run_plan(*args).stdout)
    fixes = data["in_node_shortfall"]["fixes"]
    assert any(f.startswith("bf16 optimizer states (--optimizer-states bf16") and "would free 24.5 GiB of the "
               "optimizer's 49.0" in f for f in fixes), fixes
    assert (data["bf16_optimizer_states_faster"]["tp"], data["bf16_optimizer_states_faster"]["pp"]) == (8, 12)
    pinned = run_plan(*args, "--zero", "0")
    assert "--optimizer-states bf16" not in pinned.stdout
