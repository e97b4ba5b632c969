"""`plan explain` entry for the CLI: build the explanation, render it, save the recording.

Like `plan`, it answers 1 when nothing fits (with the rejections and, for serving, what
would fit) and 2 for a user mistake; --svg / --html are checked before any work.
"""

from __future__ import annotations

from planner import sensitivity
from planner.cost.timeline import (
    MAX_TIMELINE_BLOCKS,
    MAX_TIMELINE_STAGES,
    num_blocks,
    training_timeline,
)
from planner.render.common import check_output_path
from planner.requests import (
    LayoutFilter,
    ServeRequest,
    TrainRequest,
    check_tokenizer_workers,
    for_checkpoint,
)
from planner.specs import ClusterSpec, ModelSpec, SpecError


def check_outputs(svg: str | None, html: str | None) -> None:
    for flag, path in (("--svg", svg), ("--html", html)):
        if path is not None:
            check_output_path(flag, path)


def for_serving_engine(request: ServeRequest, engine: str) -> ServeRequest:
    """The request as `plan --emit ENGINE` prices it: SGLang's own KV pool under sglang
    (serve_cli.run_serve), vLLM's otherwise."""
    from dataclasses import replace

    check_tokenizer_workers(request, engine)
    return replace(request, pool_engine="sglang") if engine == "sglang" else request


def run_explain(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest | TrainRequest, *,
                json_output: bool, svg: str | None, html: str | None, sensitivity_runs: bool = True,
                engine: str = "vllm") -> int:
    """`engine`: the serving engine the plan is for (--emit vllm | sglang): explain takes apart
    the layout `plan --emit ENGINE` recommends, among the layouts that engine launches."""
    from planner.render.explain import show

    check_outputs(svg, html)
    if isinstance(request, ServeRequest):
        request = for_serving_engine(request, engine)
        request = for_checkpoint(model, request)  # the KV format plan_serving prices
    settings = sensitivity.Settings() if sensitivity_runs else None
    if isinstance(request, TrainRequest):
        from planner.explain_train import explain_training
        from planner.train_cli import contradictory_flags
        from planner.train_search import search

        plan = search(model, cluster, request)
        contradiction = contradictory_flags(request, plan)
        if contradiction is not None:  # the request's own flags rule out everything: as `plan` says it
            raise SpecError(contradiction)
        if not plan.layouts:
            return show_train_infeasible(model, cluster, plan, json_output)
        explanation = explain_training(model, cluster, request, settings, plan)
    else:
        from planner.explain import explain_serving
        from planner.serve_cli import launchable
        from planner.serve_search import plan_serving

        plan = launchable(plan_serving(model, cluster, request), engine)  # as `plan` ranks them
        if plan.recommended is None:
            return show_serve_infeasible(plan, json_output)
        if request.mode == "auto" and request.layout == LayoutFilter() and explain_winning_disaggregated(
                model, cluster, request, plan.recommended, json_output, svg, html):
            return 0
        explanation = explain_serving(model, cluster, request, settings, plan)
    show(explanation, json_output=json_output, svg=svg, html=html)
    return 0


def explain_winning_disaggregated(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, aggregated,
                                  json_output: bool, svg: str | None, html: str | None) -> bool:
    """--mode auto, as `plan` decides it: when the disaggregated deployment wins the
    comparison, it is the one explained (the verdict first among its notes); False when the
    aggregated layout stays."""
    from dataclasses import replace

    from planner.disagg_cli import plan_both
    from planner.explain_disagg import explain_disaggregated
    from planner.render.explain_disagg import show_disagg

    disagg, verdict = plan_both(model, cluster, request, aggregated)
    if verdict.winner != "disaggregated" or disagg.recommended is None:
        return False
    explanation = explain_disaggregated(model, cluster, disagg.recommended, request.speculation)
    explanation = replace(explanation, notes=(f"--mode auto: {verdict.reason} (--mode aggregated explains the "
                                              f"best aggregated layout)", *explanation.notes))
    show_disagg(explanation, json_output=json_output, svg=svg, html=html)
    return True


def run_explain_disaggregated(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, *,
                              json_output: bool, svg: str | None, html: str | None, engine: str = "vllm") -> int:
    """The recommended disaggregated deployment in depth; 1 (with the rejections) when none
    meets the SLA. --layout filters aggregated layouts only, so it is refused here."""
    from planner.disagg_search import plan_disaggregated
    from planner.explain_disagg import explain_disaggregated
    from planner.render.explain_disagg import show_disagg, show_disagg_infeasible

    if request.layout != LayoutFilter():
        raise SpecError("--layout: filters aggregated layouts; `plan explain --mode disaggregated` "
                        "draws the recommended prefill/decode deployment")
    from planner.disagg_search import check_disaggregated_gpus

    check_disaggregated_gpus(request, cluster)  # as `plan --mode disaggregated` refuses it
    check_outputs(svg, html)
    request = for_checkpoint(model, for_serving_engine(request, engine))
    plan = plan_disaggregated(model, cluster, request)
    if plan.recommended is None:
        show_disagg_infeasible(plan, json_output)
        return 1
    show_disagg(explain_disaggregated(model, cluster, plan.recommended, request.speculation), json_output=json_output, svg=svg, html=html)
    return 0


def show_serve_infeasible(plan, json_output: bool) -> int:
    """What `plan` prints when nothing fits (the rejections, what would fit); exit code 1."""
    from planner.render.serve import print_plan_json, render_plan

    if json_output:
        print_plan_json(plan, lambda r: (), lambda r: ())
    else:
        render_plan(plan, (), "vllm", 0, False)
    return 1


def show_train_infeasible(model: ModelSpec, cluster: ClusterSpec, plan, json_output: bool) -> int:
    from planner.render.train import print_plan_json, render_plan

    if json_output:
        print_plan_json(model, cluster, plan, plan.request, lambda e: ())
    else:
        render_plan(model, cluster, plan, (), 0, False)
    return 1


def run_timeline(schedule: str | None, num_stages: int, num_micro_batches: int, virtual_stages: int | None,
                 forward_only: bool, json_output: bool, svg: str | None, html: str | None) -> int:
    """Just the Gantt chart of a schedule from p, m, v (unit forward time, backward 2 units)."""
    from planner.render.explain import show

    check_outputs(svg, html)
    name = "gpipe" if schedule is None else getattr(schedule, "value", schedule)
    v = timeline_chunks(name, virtual_stages)
    if forward_only and name != "gpipe":
        raise SpecError(f"--forward-only: only with --schedule gpipe ({name} interleaves backwards)")
    if name == "interleaved" and num_stages < 2:
        raise SpecError(f"--stages: interleaving needs at least 2 stages (got {num_stages}; the planner "
                        f"refuses it with pp=1 too)")
    check_timeline_size(num_stages, num_micro_batches, v, not forward_only)
    try:
        timeline = training_timeline(name, num_stages, num_micro_batches, v, backward_units=0 if forward_only else 2)
    except ValueError as exc:
        raise SpecError(f"plan explain --timeline-only: {exc}") from None
    what = "forward only" if forward_only else "forward 1 unit, backward 2 units"
    caption = f"{name}, {num_stages} stages, {num_micro_batches} micro-batches" + (
        f", {v} chunks per device" if v > 1 else "") + f" ({what})"
    show(None, timeline=timeline, caption=caption, json_output=json_output, svg=svg, html=html)
    return 0


def timeline_chunks(schedule: str, virtual_stages: int | None) -> int:
    """v: --virtual-stages for interleaved (2 when not given), 1 otherwise."""
    if virtual_stages is None:
        return 2 if schedule == "interleaved" else 1
    if schedule != "interleaved":
        raise SpecError(f"--virtual-stages: only with --schedule interleaved (got {schedule})")
    if virtual_stages < 2:
        raise SpecError(f"--virtual-stages: interleaving needs at least 2 chunks per device (got {virtual_stages})")
    return virtual_stages


def check_timeline_size(p: int, m: int, v: int, backward: bool) -> None:
    """Refuse a chart too large to draw (instead of simulating 10**10 blocks)."""
    for flag, value in (("--stages", p), ("--micro-batches", m)):
        if value < 1:
            raise SpecError(f"{flag}: must be at least 1 (got {value})")
    if p > MAX_TIMELINE_STAGES:
        raise SpecError(f"--stages: {p:,} is more than the {MAX_TIMELINE_STAGES} a chart draws")
    blocks = num_blocks(p, m, v, backward)
    if blocks > MAX_TIMELINE_BLOCKS:
        raise SpecError(f"--micro-batches: {p} stages x {m:,} micro-batches x {v} chunk(s) make "
                        f"{blocks:,} blocks, more than the {MAX_TIMELINE_BLOCKS:,} a chart draws")
