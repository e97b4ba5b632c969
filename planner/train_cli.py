"""Training entry for the CLI: search -> render (table or JSON) -> exit code."""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace

from planner.emit.command import LaunchStep
from planner.requests import DEFAULT_TOP_ROWS, TrainRequest
from planner.specs import ClusterSpec, ModelSpec, SpecError
from planner.train import (
    MOE_TRAINING_CAVEAT,
    TORCHTITAN_CAVEAT,
    TORCHTITAN_MOE_CAVEAT,
    TrainEstimate,
    check_precision,
    trained_model,
    training_caveats,
)
from planner.train_search import TrainPlan, constraint_flags, search, short_of_memory


def run_train(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, *, json_output: bool,
              top: int | None, show_rejected: bool, emit: str) -> int:
    """`top`: table rows (None: DEFAULT_TOP_ROWS) and JSON configurations (None: all)."""
    check_precision(cluster, request.precision, request.resolved_fp8_recipe, request.engine)
    with cyclic_gc_paused():
        return _search_and_print(model, cluster, request, json_output, top, show_rejected, emit)


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block, as it was after. A 16,384-GPU search
    allocates hundreds of thousands of small objects (key tuples, frozen dataclasses) and
    --json as many dicts, none in a reference cycle, which the collector would scan again and
    again as the estimates pile up (~7 % of the 131K-token training plan's run)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _search_and_print(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, json_output: bool,
                      top: int | None, show_rejected: bool, emit: str) -> int:
    from planner.emit import TRAIN_EMITTERS
    from planner.render.train import print_plan_json, render_plan

    # A serving --emit still prints the training engine's launch.
    emit = emit if emit == "none" or emit in TRAIN_EMITTERS else request.engine
    # the rows shown are all that is wanted unless every configuration is (--json without --top)
    # or every rejection (--show-rejected): the search may bound the rest out
    keep_top = None if show_rejected else (top if json_output else top or DEFAULT_TOP_ROWS)
    plan: TrainPlan = search(model, cluster, request, keep_top=keep_top, counts=launch_counts(model, request, emit))
    contradiction = contradictory_flags(request, plan)
    if contradiction is not None:
        raise SpecError(contradiction)
    request = plan.request  # with dp resolved when --layout fixed tp and pp
    emitter = None if emit == "none" else TRAIN_EMITTERS[emit]
    not_emitted = None
    trained = trained_model(model, request)  # the command builds the MTP modules the plan prices
    if emit == "megatron":
        from planner.emit.megatron import model_refusals

        wrong_model = model_refusals(trained, request.engine_versions.megatron_release)
        if wrong_model:  # the plan stands; no command would build this model
            emitter, not_emitted = None, "; ".join(wrong_model)
        else:
            plan = launchable(trained, plan)

    def steps_for(estimate: TrainEstimate) -> tuple[LaunchStep, ...]:
        if emitter is None:
            return ()
        if emit == "megatron":
            return emitter(trained, cluster, estimate.config, request.global_batch, request.seq_len,
                           request.engine_versions.megatron_release)
        return emitter(trained, cluster, estimate.config, request.global_batch, request.seq_len)

    pinned = pinned_zero_note(model, cluster, request, plan,
                              (lambda p: launchable(trained, p)) if emit == "megatron" and emitter is not None
                              else None)
    if json_output:
        print_plan_json(model, cluster, plan, request, steps_for, top, not_emitted,
                        () if pinned is None else (pinned,))
    else:
        best = plan.layouts[0] if plan.layouts else None
        render_plan(model, cluster, plan, () if best is None else steps_for(best), top or DEFAULT_TOP_ROWS,
                    show_rejected, launcher_title(emit, request))
        from planner.render.common import console

        if not_emitted is not None and best is not None:
            console().print(f"Launch: not emitted ({not_emitted}).")
        if best is not None and best.config.schedule == "gpipe" and best.config.pp > 1 and emit == "megatron" \
                and emitter is not None:
            console().print("Note: Megatron-LM has no GPipe schedule: the command runs 1F1B, which holds fewer "
                            "micro-batches; plan with --schedule 1f1b to see that priced (torchtitan runs GPipe).")
        elif best is not None and best.config.pp == 1 and request.schedule is not None \
                and any(rejected.layout.pp > 1 for rejected in plan.rejected):
            # the pinned schedule applies to no ranked row (found by a CLI sweep: "no PP" rows under
            # --schedule gpipe beside a note on GPipe)
            console().print(f"Note: --schedule {request.schedule}: no layout with pipeline stages is feasible under it "
                            f"(--show-rejected says why), so every row runs without a pipeline.")
        if pinned is not None:
            console().print(f"Note: {pinned}")
        for caveat in training_caveats(model, request, None if best is None else best.config.recompute):
            if best is not None or caveat not in (MOE_TRAINING_CAVEAT, TORCHTITAN_MOE_CAVEAT, TORCHTITAN_CAVEAT):
                console().print(f"Note: {caveat}")
    return 0 if plan.layouts else 1


PINNED_ZERO_NOTE_FRACTION = 0.2
"""A pinned --zero is said to cost its speed where the search without it is this much faster."""


def pinned_zero_note(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, plan: TrainPlan,
                     launchable_only: Callable[[TrainPlan], TrainPlan] | None = None) -> str | None:
    """What a pinned --zero costs: the best configuration without it (one more search, only where
    --zero was given) where that steps at least PINNED_ZERO_NOTE_FRACTION faster. Llama-3.1-70B on
    2x8 H100 at --zero 3 had recommended tp=16 over InfiniBand at 65.7 s a step, with nothing
    saying tp=8 pp=2 runs 33.9 s without it (a CLI read). `launchable_only`: the filter the plan
    shown went through, applied to the search without the pin too."""
    if request.zero_stage is None or not plan.layouts:
        return None
    free = search(model, cluster, replace(request, zero_stage=None), keep_top=DEFAULT_TOP_ROWS)
    if launchable_only is not None:  # what the plan shown keeps (its command must build it)
        free = launchable_only(free)
    if not free.layouts:
        return None
    best, other = plan.layouts[0], free.layouts[0]
    if best.step_time_seconds < (1 + PINNED_ZERO_NOTE_FRACTION) * other.step_time_seconds:
        return None
    c = other.config
    return (f"--zero {request.zero_stage} costs {best.step_time_seconds / other.step_time_seconds:.1f}x the step: "
            f"without it the plan runs tp={c.tp} pp={c.pp} dp={c.dp}, micro-batch {c.micro_batch_size}, "
            f"ZeRO-{c.zero_stage}, recompute {c.recompute_label}, at {other.step_time_seconds:,.1f} s a step "
            f"against {best.step_time_seconds:,.1f} s.")


MAX_CONTRADICTION_REASONS = 3
"""Distinct reasons a contradictory request's one-line error quotes."""


def contradictory_flags(request: TrainRequest, plan: TrainPlan) -> str | None:
    """A one-line error (exit 2) when the request's own flags rule out every configuration: nothing
    fits, the search was narrowed by flags, and no configuration failed on memory (which more
    GPUs, recompute or ZeRO could change: that stays "nothing fits", exit 1, with what would fit).
    `--virtual-stages 3` on a 32-layer model, `--zero 3` with `--layout pp=2`, a torchtitan
    `--layout pp=2` for a model torchtitan cannot pipeline."""
    flags = constraint_flags(request)
    if plan.layouts or not plan.rejected or not flags or short_of_memory(plan):
        return None
    if request.engine != "megatron":
        flags.append(f"--engine {request.engine}")
    if request.precision != "bf16":  # context: some engines' rules depend on it
        flags.append(f"--precision {request.precision}"
                     + (f" --fp8-recipe {request.fp8_recipe}" if request.fp8_recipe else ""))
    # the reasons that refuse the most layouts first (one that refuses them all is the cause)
    counts = Counter(reason for r in plan.rejected for reason in dict.fromkeys(r.reasons))
    reasons = [reason for reason, _ in counts.most_common()]
    # a reason every rejected layout gives is the cause: the others only pad the line
    universal = [reason for reason in reasons if counts[reason] == len(plan.rejected)]
    reasons = universal or reasons
    shown = "; ".join(reasons[:MAX_CONTRADICTION_REASONS])
    more = f" (and {len(reasons) - MAX_CONTRADICTION_REASONS} more)" if len(reasons) > MAX_CONTRADICTION_REASONS else ""
    return (f"{' '.join(flags)}: no configuration runs with these settings on {plan.num_gpus} GPUs: "
            f"{shown}{more}")


def launcher_title(emit: str, request: TrainRequest) -> str:
    """The launch's title in the table output: the engine and its release."""
    if emit == "torchtitan":
        from planner.train_engines import TORCHTITAN_RELEASE

        return f"torchtitan {TORCHTITAN_RELEASE}"
    return f"Megatron-LM {request.engine_versions.megatron}"


def launch_counts(model: ModelSpec, request: TrainRequest, emit: str) -> Callable[[TrainEstimate], bool] | None:
    """Which estimates the shown plan keeps (`launchable`), for the bounded search's threshold:
    with a Megatron-LM launch (`emit`) that builds this model, those its release starts; else
    all (None)."""
    if emit != "megatron":
        return None
    from planner.emit.megatron import model_refusals, refusals

    trained = trained_model(model, request)
    release = request.engine_versions.megatron_release
    if model_refusals(trained, release):  # no launch at all: the plan keeps every estimate
        return None
    return lambda e: not refusals(trained, e.config, release)


def launchable(model: ModelSpec, plan: TrainPlan) -> TrainPlan:
    """The plan less the configurations the chosen Megatron-LM release refuses at startup."""
    from planner.emit.accept import without_refused
    from planner.emit.megatron import refusals

    release = plan.request.engine_versions.megatron_release
    return without_refused(plan, lambda e: e.config.layout,
                           lambda e: refusals(model, e.config, release))
