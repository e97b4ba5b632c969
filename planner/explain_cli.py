"""`plan explain` entry for the CLI: build the explanation, render it, save the recording."""

from __future__ import annotations

from planner import sensitivity
from planner.cost.timeline import training_timeline
from planner.requests import ServeRequest, TrainRequest
from planner.specs import ClusterSpec, ModelSpec, SpecError


def run_explain(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest | TrainRequest, *,
                json_output: bool, svg: str | None, html: str | None, sensitivity_runs: bool = True) -> int:
    from planner.render.explain import show

    settings = sensitivity.Settings() if sensitivity_runs else None
    if isinstance(request, TrainRequest):
        from planner.explain_train import explain_training

        explanation = explain_training(model, cluster, request, settings)
    else:
        from planner.explain import explain_serving

        explanation = explain_serving(model, cluster, request, settings)
    show(explanation, json_output=json_output, svg=svg, html=html)
    return 0


def run_timeline(schedule: str | None, num_stages: int, num_micro_batches: int, virtual_stages: int | None,
                 forward_only: bool, json_output: bool, svg: str | None, html: str | None) -> int:
    """Just the Gantt chart of a schedule from p, m, v (unit forward time, backward 2 units)."""
    from planner.render.explain import show

    name = "gpipe" if schedule is None else getattr(schedule, "value", schedule)
    v = virtual_stages or (2 if name == "interleaved" else 1)
    if forward_only and name != "gpipe":
        raise SpecError(f"--forward-only: only with --schedule gpipe ({name} interleaves backwards)")
    try:
        timeline = training_timeline(name, num_stages, num_micro_batches, v, backward_units=0 if forward_only else 2)
    except ValueError as exc:
        raise SpecError(f"plan explain --timeline-only: {exc}") from None
    what = "forward only" if forward_only else "forward 1 unit, backward 2 units"
    caption = f"{name}, {num_stages} stages, {num_micro_batches} micro-batches" + (
        f", {v} chunks per device" if v > 1 else "") + f" ({what})"
    show(None, timeline=timeline, caption=caption, json_output=json_output, svg=svg, html=html)
    return 0
