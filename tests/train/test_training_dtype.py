"""A checkpoint's dtype is how its weights are stored; training runs the 16-bit mixed precision the
plan prices (params.training_dtype): a float32 checkpoint trains in bf16 (--bf16), a float16 one
in fp16 (--fp16, the same tensor-core rate). Before, a float32 spec was priced at TF32 with
2-byte memory and launched without either flag, which Megatron-LM runs in fp32: three runs in one
answer (found by a CLI sweep)."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.params import training_dtype
from planner.emit.megatron import megatron_steps
from planner.requests import LayoutFilter, TrainRequest
from planner.train import training_caveats
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
