"""Anchor: gpt-fast's published batch-1 decode rates (pytorch-labs/gpt-fast README,
"Benchmarks" and "Tensor Parallelism"): 8x A100-80GB (power-limited to 330 W), batch size 1,
a 5-token prompt, bf16/fp16 weights, torch.compile with CUDA graphs.

    Llama-2-7B   TP 1, 2, 4, 8: 104.9, 168.84, 254.02, 328.43 tok/s
    Llama-2-70B  TP 2, 4, 8:    21.32, 38.01, 62.50 tok/s

The serving model's decode step on the GPUs (bytes / (HBM * DECODE_HBM_UTILIZATION) + a
fixed cost per layer + the TP all-reduces; cost/serving_time.stage_step_time), with gpt-fast's
own fixed cost per layer (GPT_FAST_SECONDS_PER_LAYER, not vLLM's), must land within 10% of every
row: the fall of per-GPU bandwidth utilisation with TP must come out of the
physics, not a per-TP table. gpt-fast has no scheduler, sampler or server, so vLLM's
per-step engine cost (cost/serving_time.engine_step_seconds) is not part of this anchor; and
its all-reduce is torch.distributed's (NCCL), not vLLM's custom kernels, so the cluster here
has no measured vLLM all-reduce curve (the ring model prices it).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.cost import efficiency as eff
from planner.cost.serving_time import StepLoad, stage_step_time, step_constants
from planner.layout import Layout
from planner.requests import ServeRequest
from planner.serve import ServeEstimate, estimate
from planner.specs import ModelSpec

from .conftest import ring_only

LLAMA_2_7B = ModelSpec(  # meta-llama/Llama-2-7b-hf config.json
    name="llama-2-7b", num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
    intermediate_size=11008, vocab_size=32000, max_position_embeddings=4096, dtype="float16",
)
ROWS = [
    ("llama-2-7b", 1, 104.9), ("llama-2-7b", 2, 168.84), ("llama-2-7b", 4, 254.02),
    ("llama-2-7b", 8, 328.43), ("llama-2-70b", 2, 21.32), ("llama-2-70b", 4, 38.01),
    ("llama-2-70b", 8, 62.50),
]


@pytest.mark.parametrize("name,tp,measured_tokens_per_s", ROWS, ids=[f"{r[0]}-tp{r[1]}" for r in ROWS])
def test_batch1_decode_rate_within_10_percent(name, tp, measured_tokens_per_s):
    model = LLAMA_2_7B if name == "llama-2-7b" else resolve_model(name)
    request = ServeRequest(input_len=5, output_len=200, batch=1, max_model_len=4096)
    cluster = ring_only(resolve_cluster(f"1x{tp}xA100"))
    result = estimate(model, cluster, Layout(tp, 1, 1), request)
    assert isinstance(result, ServeEstimate)
    # one sequence at the mean context 5 + 200/2 = 105 tokens
    constants = replace(step_constants(model, cluster, result.layout), layer_seconds=eff.GPT_FAST_SECONDS_PER_LAYER)
    step = stage_step_time(model, cluster, result.layout, result.placement, result.stages[0], StepLoad(1, 105),
                           constants=constants)
    assert 1 / step.seconds == pytest.approx(measured_tokens_per_s, rel=0.10)
