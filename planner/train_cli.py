"""Training entry for the CLI: search -> render (table or JSON) -> exit code."""

from __future__ import annotations

from planner.emit.command import LaunchStep
from planner.requests import TrainRequest
from planner.specs import ClusterSpec, ModelSpec, SpecError
from planner.train import TrainEstimate
from planner.train_search import TrainPlan, search


def check_fixed_batch(request: TrainRequest) -> None:
    """A fully fixed layout whose batch cannot divide is a usage error, not a search result."""
    f = request.layout
    if f.dp is not None and request.micro_batch is not None:
        step = request.micro_batch * f.dp
        if request.global_batch % step:
            raise SpecError(f"--global-batch: {request.global_batch} not divisible by "
                            f"micro-batch * dp = {request.micro_batch}*{f.dp} = {step}")
    if request.micro_batch is not None and request.global_batch % request.micro_batch:
        raise SpecError(f"--global-batch: {request.global_batch} not divisible by "
                        f"--micro-batch {request.micro_batch}")
    if request.micro_batch is not None and request.micro_batch > request.global_batch:
        raise SpecError(f"--micro-batch: {request.micro_batch} exceeds --global-batch {request.global_batch}")


def resolve_fixed_dp(request: TrainRequest, cluster: ClusterSpec) -> TrainRequest:
    """`--layout tp=..,pp=..` with the GPU count fixes dp too: check the batch against it."""
    f = request.layout
    num_gpus = request.num_gpus or cluster.num_gpus
    if f.tp is None or f.pp is None or f.dp is not None:
        return request
    if num_gpus % (f.tp * f.pp):
        raise SpecError(f"--layout: tp*pp = {f.tp * f.pp} does not divide the {num_gpus} GPUs")
    from dataclasses import replace

    return replace(request, layout=replace(f, dp=num_gpus // (f.tp * f.pp)))


def run_train(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, *, json_output: bool,
              top: int, show_rejected: bool, emit: str) -> int:
    from planner.emit import TRAIN_EMITTERS
    from planner.render.train import print_plan_json, render_plan

    request = resolve_fixed_dp(request, cluster)
    check_fixed_batch(request)
    plan: TrainPlan = search(model, cluster, request)
    # Megatron-LM is the one training engine: a serving --emit still prints it.
    emitter = None if emit == "none" else TRAIN_EMITTERS.get(emit, TRAIN_EMITTERS["megatron"])

    def steps_for(estimate: TrainEstimate) -> tuple[LaunchStep, ...]:
        if emitter is None:
            return ()
        return emitter(model, cluster, estimate.config, request.global_batch, request.seq_len)

    if json_output:
        print_plan_json(model, cluster, plan, request, steps_for)
    else:
        best = plan.layouts[0] if plan.layouts else None
        render_plan(model, cluster, plan, () if best is None else steps_for(best), top, show_rejected)
    return 0 if plan.layouts else 1
