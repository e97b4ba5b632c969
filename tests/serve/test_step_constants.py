"""The per-estimate constants of a serving step (serving_time.step_constants) change nothing:
a step priced with them is the step priced without them, bit for bit. They only spare the
search from looking the same model, cluster and layout terms up on every step."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.serving_memory import stage_memory
from planner.cost.serving_time import (
    StepLoad,
    round_time,
    stage_step_time,
    step_constants,
    with_moe_backend,
)
from planner.layout import Layout, place
from planner.requests import ServeRequest

CASES = [("llama-3.1-70b", "1x8xH100", Layout(4, 2, 1)), ("gpt-oss-120b", "1x8xB200", Layout(2, 1, 4)),
         ("qwen3-235b-a22b-fp8", "1x8xH200", Layout(1, 1, 8, 8)), ("deepseek-v3", "2x8xH200", Layout(8, 2, 1)),
         ("mixtral-8x7b", "1x8xA100", Layout(2, 2, 2)), ("llama-3.1-8b", "1x4xL40S", Layout(1, 1, 4))]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CASES), st.sampled_from(["auto", "marlin"]), st.floats(0, 512), st.floats(0, 8192),
       st.floats(0, 4096), st.integers(1, 4))
# a subnormal decode share over 2 micro-batches: its reciprocal overflowed to a NaN load; a tiny
# normal one beside a prompt scaled the prompt's tokens to infinity
@example(CASES[1], "auto", 2.225073858507203e-309, 0.0, 0.0, 2)
@example(CASES[1], "auto", 4.811779671784207e-307, 0.0, 11.0, 2)
def test_a_step_priced_with_the_constants_is_the_step_priced_without(case, backend, decode, context, prompt,
                                                                      in_flight):
    name, cluster_name, layout = case
    model = resolve_model(name)
    cluster = resolve_cluster(cluster_name)
    if backend == "marlin" and model.quantization == "mxfp4" and cluster.gpu.serving_moe_kernels.marlin_mxfp4:
        cluster = with_moe_backend(cluster, backend)
    placement = place(cluster, layout)
    stages = stage_memory(model, cluster, layout, ServeRequest(max_model_len=8192), 64)
    load = StepLoad(decode, decode * context, prompt, prompt * prompt / 2, 1.0 if prompt else 0.0)
    constants = step_constants(model, cluster, layout)
    for stage in stages:
        assert stage_step_time(model, cluster, layout, placement, stage, load) == stage_step_time(
            model, cluster, layout, placement, stage, load, constants=constants)
    assert round_time(model, cluster, layout, placement, stages, load, in_flight) == round_time(
        model, cluster, layout, placement, stages, load, in_flight, constants=constants)
