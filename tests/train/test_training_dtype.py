"""A checkpoint's dtype is how its weights are stored; training runs the 16-bit mixed precision the
plan prices (params.training_dtype): a float32 checkpoint trains in bf16 (--bf16), a float16 one
in fp16 (--fp16, the same tensor-core rate). Before, a float32 spec was priced at TF32 with
2-byte memory and launched without either flag, which Megatron-LM runs in fp32: three runs in one
answer (found by a CLI sweep)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.params import training_dtype
from planner.emit.megatron import megatron_steps
from planner.requests import LayoutFilter, TrainRequest
from planner.train import trained_model, training_caveats
from planner.train_search import search

REQUEST = TrainRequest(global_batch=64, seq_len=4096, layout=LayoutFilter(tp=1, dp=8), zero_stage=1,
                       micro_batch=1)


@pytest.mark.parametrize("dtype, trained, flag", [("float32", "bfloat16", "--bf16"), ("bfloat16", "bfloat16", "--bf16"),
                                                  ("float16", "float16", "--fp16")])
def test_every_checkpoint_dtype_trains_in_16_bits(dtype, trained, flag):
    model = resolve_model("llama-3.1-8b").model_copy(update={"dtype": dtype})
    assert training_dtype(model) == trained
    cluster = resolve_cluster("1x8xH100")
    best = search(model, cluster, REQUEST).layouts[0]
    reference = search(resolve_model("llama-3.1-8b"), cluster, REQUEST).layouts[0]
    # the same run as the bf16 spec: memory, step (fp16 runs at bf16's tensor-core rate)
    assert best.memory.total_bytes == reference.memory.total_bytes
    assert best.step_time_seconds == pytest.approx(reference.step_time_seconds)
    (step,) = megatron_steps(model, cluster, best.config, 64, 4096)
    assert flag in step.argv and ({"--bf16", "--fp16"} - {flag}).isdisjoint(step.argv)


def test_a_float32_checkpoint_is_told_it_trains_in_bf16():
    model = resolve_model("llama-3.1-8b").model_copy(update={"dtype": "float32"})
    (note,) = [c for c in training_caveats(model, REQUEST) if "float32" in c]
    assert "bf16 mixed precision" in note and "not planned" in note
    assert not [c for c in training_caveats(resolve_model("llama-3.1-8b"), REQUEST) if "float32" in c]


def test_a_float16_checkpoint_trains_in_bf16_when_asked_or_under_torchtitan():
    """A float16 checkpoint trains in fp16 with Megatron by default (as the 2021 GPT-3 runs did),
    in bf16 with --precision bf16 given (a run from scratch has no checkpoint to follow; it had been
    replaced by --fp16 silently) and with torchtitan, whose mixed_precision_param takes bfloat16 or
    float32 only (the plan had printed Megatron's --fp16 flags beside a bf16 torchtitan run)."""
    model = resolve_model("llama-3.1-8b").model_copy(update={"dtype": "float16"})
    assert trained_model(model, REQUEST).dtype == "float16"
    assert trained_model(model, replace(REQUEST, bf16_asked=True)).dtype == "bfloat16"
    assert trained_model(model, replace(REQUEST, engine="torchtitan")).dtype == "bfloat16"


def test_the_cli_honours_precision_bf16_on_a_float16_checkpoint(run_plan):
    """Llama-2-7B's spec is float16 (so is gpt3-175b's, where a review found it): by default --fp16
    and the note saying so; with --precision bf16 --bf16 and no fp16 note; torchtitan says nothing
    of Megatron's flags and reports bfloat16."""
    args = ("--workload", "train", "--model", "llama-2-7b", "--cluster", "1x8xA100", "--global-batch", "64",
            "--seq-len", "4096", "--top", "1")
    default, asked = run_plan(*args), run_plan(*args, "--precision", "bf16")
    assert default.returncode == asked.returncode == 0, default.stderr + asked.stderr
    assert " --fp16" in default.stdout and "Precision: fp16 mixed precision" in default.stdout
    assert " --bf16" in asked.stdout and " --fp16" not in asked.stdout and "Precision: fp16" not in asked.stdout
    titan = run_plan(*args, "--engine", "torchtitan", "--json")
    assert titan.returncode == 0, titan.stderr
    assert json.loads(titan.stdout)["training_dtype"] == "bfloat16"
    text = run_plan(*args, "--engine", "torchtitan")
    assert "Precision: fp16" not in text.stdout and "--accumulate-allreduce-grads-in-fp32" not in text.stdout
