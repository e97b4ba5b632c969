"""Serving plan output: the ranked table, the reasoning, the launch command, JSON."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.cost.params import kv_cache_format
from planner.cost.serving_memory import max_num_batched_tokens
from planner.cost.serving_sim import Distribution, ServeMetrics
from planner.cost.serving_time import moe_kernel
from planner.cost.speculative import expected_tokens_per_step
from planner.emit.command import LaunchStep
from planner.layout import Rejected
from planner.model_summary import model_summary
from planner.render.catalog import describe_cluster, describe_model
from planner.render.common import (
    MAX_REJECTED_SHOWN,
    closest_misses,
    console,
    count,
    ms,
    ms_or_s,
    per_node_lines,
    print_json_rows,
    step_json,
    to_jsonable,
    us,
)
from planner.requests import (
    DEFAULT_ALL2ALL_BACKEND,
    DEFAULT_NUM_PROMPTS,
    MAX_SIMULATED_STEPS,
    MOE_BACKENDS,
    ServeRequest,
    Speculation,
)
from planner.serve import ServeEstimate
from planner.serve_search import (
    DBO_OFF,
    DBO_ON,
    NEAR_TIE_FRACTION,
    SPECULATION_OFF,
    SPECULATION_OFF_BEST,
    ServePlan,
)
from planner.units import BYTES_PER_GIB, plain, plural, seconds_to_ms

if TYPE_CHECKING:  # rich is imported only to draw tables, never for --json
    from rich.console import Console
    from rich.table import Table


@dataclass(frozen=True)
class Column:
    header: str
    get: Callable[[ServeEstimate, int, ServePlan], str]
    justify: str = "right"


ALLREDUCE_SOURCE_WORDS = {"measured": "measured", "model": "model",
                          "fused": "vLLM's fused all-reduce + RMSNorm, measured",
                          "engine": "vLLM's all-reduce, measured"}
ALLREDUCE_SOURCE_NOTE = {"measured": " (measured)", "fused": " (fused)", "engine": " (vllm)"}
"""How the table marks a TP all-reduce time: the probe's curve, vLLM's fused all-reduce +
RMSNorm kernel at its measured curve (serving_time.fused_allreduce_curve), or vLLM's unfused
all-reduce at its measured curve (serving_time.unfused_allreduce_curve); the ring model unmarked."""


def _link(r: ServeEstimate) -> str:
    link = r.placement.tp_link
    if link is None:
        return "-"
    return f"{us(r.tp_allreduce_seconds_per_layer)} {link.kind}" + ALLREDUCE_SOURCE_NOTE.get(r.allreduce_source, "")


def _ep_exchange(r: ServeEstimate) -> str:
    link = ep_exchange_link(r)
    if link is None:
        return "-"
    return f"{us(r.ep_exchange_seconds_per_moe_layer)} {link}" + (" (measured)" if ep_exchange_source(r) == "measured" else "")


def ep_exchange_source(r: ServeEstimate) -> str | None:
    """measured when the probe's curves priced the decode step's dispatch and combine, else
    model; None without an exchange."""
    ops = [c for c in r.collectives if c.phase == "decode" and c.name in ("MoE dispatch", "MoE combine")]
    if not ops:
        return None
    return "measured" if all(c.source == "measured" for c in ops) else "model"


def ep_exchange_link(r: ServeEstimate) -> str | None:
    """The slowest link of the EP group's dispatch and combine (None when there are none:
    no EP, or EP inside one replica's TP group)."""
    if r.placement.ep_link is None or r.layout.dp_per_ep_group <= 1:
        return None
    return r.placement.ep_link.kind


def _memory(r: ServeEstimate, p: ServePlan | None = None) -> str:
    pool = _sglang_pool(r, p)
    if pool is not None:  # SGLang's: its KV pool within --mem-fraction-static of the GPU
        weights, kv, static = pool
        return f"{_g(weights)}+{_g(kv)}/{_g(static)}"
    s = r.stages[r.worst_stage]
    return f"{_g(s.weights_bytes)}+{_g(s.kv_cache_bytes)}/{_g(s.budget_bytes)}"


def _sglang_pool(r: ServeEstimate, p: ServePlan | None) -> tuple[float, float, float] | None:
    """Under --emit sglang, emit/sglang.pool_figures of the estimate (SGLang's default reserve can
    leave a smaller pool than vLLM's budget, which the table had shown; a CLI read); None for vLLM."""
    if p is None or p.request.pool_engine != "sglang":
        return None
    from planner.emit.sglang import pool_figures

    return pool_figures(p.model, p.cluster, p.request, r)


def _pool_share(r: ServeEstimate, p: ServePlan) -> float:
    """The share of the plan's (vLLM's) KV cache SGLang's pool holds (the fullest stage's, as
    serve_launch_args sizes it): 1 under vLLM."""
    pool = _sglang_pool(r, p)
    fullest = max(r.stages, key=lambda s: s.weights_bytes + s.kv_cache_bytes)
    if pool is None or fullest.kv_cache_bytes <= 0:
        return 1.0
    return pool[1] / fullest.kv_cache_bytes


def _g(num_bytes: float) -> str:
    return f"{num_bytes / BYTES_PER_GIB:.1f}"


def ranking(request: ServeRequest) -> str:
    """What the table is ordered by: with an SLA, throughput at each layout's SLA-bound
    concurrency is its goodput."""
    if request.offered_rate_per_s is not None:
        return "those that keep up first, then " + ("TPOT" if request.objective == "latency" else "E2E latency")
    if request.objective == "throughput" and request.has_sla:
        return "goodput within the SLA"
    return request.objective


def unmeasured_moe_kernel_lines(plan: ServePlan, best: ServeEstimate) -> list[str]:
    """A note where the recommended layout's routed experts have no measured kernel on this GPU
    (serving_time.moe_kernel's dense fallback; JSON moe_kernel_source "model")."""
    model, cluster = plan.model, plan.cluster
    if not model.is_moe or moe_kernel(model, cluster, best.layout.ep).source != "model":
        return []
    experts = model.quantization or model.dtype
    return [f"Note: no measured MoE kernel for {experts} experts on {cluster.gpu.name}: the routed experts are "
            f"priced as dense GEMMs at the GPU's matmul rate, an estimate (docs/cost-model.md, Serving: the MoE "
            f"kernels)"]


def _notes(r: ServeEstimate, plan: ServePlan) -> str:
    marks = ["pareto"] if r.layout in plan.pareto else []
    if r.placement.tp_crosses_node:
        marks.append("TP crosses nodes")
    if any(n.startswith("KV-starved") for n in r.notes):
        marks.append("KV-starved")
    if any(n.startswith("SGLang-pool-bound") for n in r.notes):
        marks.append("SGLang pool")
    if r.sla.binding in ("ttft", "tpot", "e2e"):
        marks.append(f"{r.sla.binding.upper()}-bound")
    if r.sla.binding == "saturation":
        marks.append("saturated")
    if r.overloaded:
        marks.append("overloaded")
    if r.placement.num_pp_boundaries_crossing_nodes:
        marks.append(f"PP over {r.placement.pp_link.kind}")
    return ", ".join(marks)


MOE_COLUMNS = ("ep", "EP comm")
"""Shown for MoE models only."""

COLUMNS = (
    Column("#", lambda r, i, p: str(i + 1)),
    Column("tp", lambda r, i, p: str(r.layout.tp)),
    Column("pp", lambda r, i, p: str(r.layout.pp)),
    Column("dp", lambda r, i, p: str(r.layout.dp)),
    Column("ep", lambda r, i, p: str(r.layout.ep)),
    Column("GiB/GPU W+KV/usable", lambda r, i, p: _memory(r, p)),
    Column("KV tokens", lambda r, i, p: count(math.floor(r.kv_cache_tokens * _pool_share(r, p)))),
    # sequences of --max-model-len tokens the KV cache holds (vLLM's startup log "Maximum
    # concurrency for N tokens per request"): not the concurrency the plan runs (batch)
    Column("seqs at max len", lambda r, i, p: f"{r.max_concurrency * _pool_share(r, p):.1f}"),
    Column("batch", lambda r, i, p: str(r.batch) if r.offered_rate_per_s is None else f"{r.concurrency:.1f}"),
    Column("TTFT", lambda r, i, p: ms(r.ttft_seconds)),
    Column("TPOT", lambda r, i, p: ms(r.tpot_seconds) if p.request.output_len > 1 else "-"),
    Column("tok/s", lambda r, i, p: count(r.throughput_tokens_per_second)),
    Column("all-reduce/layer", lambda r, i, p: _link(r)),
    Column("EP comm", lambda r, i, p: _ep_exchange(r)),
    Column("bubble", lambda r, i, p: f"{r.bubble_fraction:.0%}"),
    Column("notes", lambda r, i, p: _notes(r, p), "left"),
)


def render_table(plan: ServePlan, top: int) -> Table:
    from rich.table import Table

    total = len(plan.layouts) + len(plan.rejected) + plan.num_configs_bounded
    bounded = (f"; {plan.num_configs_bounded:,} more not estimated: bounded below row {plan.bounded_below_row}"
               if plan.num_configs_bounded else "")
    table = Table(title=f"Serving layouts ({len(plan.layouts)} feasible of {total}, ranked by "
                        f"{ranking(plan.request)}{bounded})")
    columns = [c for c in COLUMNS if plan.model.is_moe or c.header not in MOE_COLUMNS]
    # at a request rate the column is the mean requests in flight (JSON `concurrency`); JSON
    # `batch` stays the sequences the engine is launched for (--max-num-seqs)
    rated = plan.request.offered_rate_per_s is not None
    for column in columns:
        table.add_column("in flight" if rated and column.header == "batch" else column.header,
                         justify=column.justify)
    for index, result in enumerate(plan.layouts[:top]):
        table.add_row(*(column.get(result, index, plan) for column in columns))
    return table


def summary_layouts(plan: ServePlan) -> tuple[ServeEstimate, ServeEstimate, ServeEstimate]:
    """(lowest TPOT under load, lowest one-sequence TPOT, most tokens/s) over the listed
    layouts, ties to the smaller degrees: what the summary names beside the recommendation
    (serve_search.bounded_evaluation keeps the last two exact, and the first under the latency
    objective, where it is named)."""
    return (min(plan.layouts, key=lambda r: (r.tpot_seconds, r.layout.tp, r.layout.pp)),
            min(plan.layouts, key=lambda r: (r.tpot_batch1_seconds, r.layout.tp, r.layout.pp)),
            max(plan.layouts, key=lambda r: (r.throughput_tokens_per_second, -r.layout.tp)))


def summary_lines(plan: ServePlan, superseded: bool = False) -> list[str]:
    """superseded: a disaggregated deployment wins (--mode auto), so the aggregated best is
    headed as the alternative, not the recommendation."""
    best = plan.recommended
    assert best is not None
    fastest, lone, most = summary_layouts(plan)
    why = _why(plan, best, fastest, most)
    lines = [
        f"{'Best aggregated (disaggregated wins, below)' if superseded else 'Recommended'}: "
        f"{best.layout} ({why}; decode is {best.decode_bound}-bound; "
        f"TTFT {ms(best.ttft_seconds)}"
        + (f", TPOT {ms(best.tpot_seconds)})." if plan.request.output_len > 1 else "; one output token: no TPOT)."),
        ("" if plan.request.one_output_token else  # no token after the first: no TPOT to be fastest at
         f"Fastest per token: {lone.layout} ({ms(lone.tpot_batch1_seconds)} TPOT with one sequence per replica). ")
        + _most_line(plan, most),
        _placement_line(best, plan.request.pool_engine),
    ]
    lines += [f"Note: {note}" for note in best.notes]
    idle = plan.num_gpus - best.layout.num_gpus
    if idle > 0:
        lines.append(f"Note: {best.layout} uses {best.layout.num_gpus} of the {plan.num_gpus} GPUs ({idle} idle): "
                     f"no replica of it fits the rest")
    lines += unmeasured_moe_kernel_lines(plan, best)
    lines += moe_backend_lines(plan)
    lines += all2all_backend_lines(plan)
    lines += token_budget_lines(plan)
    lines += speculation_lines(plan)
    if plan.rejected:
        lines.append(f"{plural(len(plan.rejected), 'layout')} rejected (--show-rejected lists why).")
    return lines


def _most_line(plan: ServePlan, most: ServeEstimate) -> str:
    """The layout with the most tokens/s; under a finite --request-rate, how many keep up with it
    (they all serve the same tokens/s)."""
    rate = plan.request.offered_rate_per_s
    if rate is None:
        # the latency objective prices every layout at one sequence a replica: so is this
        lone = " at one sequence per replica" if plan.request.objective == "latency" and most.batch == 1 else ""
        return f"Most tokens/s{lone}: {most.layout} ({count(most.throughput_tokens_per_second)} tok/s)."
    keeping = sum(r.offered_rate_per_s is not None for r in plan.layouts)
    behind = sum(r.overloaded for r in plan.layouts)
    held = len(plan.layouts) - keeping - behind
    return (f"{keeping} of the {len(plan.layouts)} layouts keep up with --request-rate {rate:g}/s"
            + (f"; {behind} would queue without bound (overloaded)" if behind else "")
            + (f"; {held} run below it, held back by --max-concurrency {plan.request.max_concurrency:,}"
               if held else "") + ".")


def _changes(best: ServeEstimate, other: ServeEstimate) -> str:
    """TTFT, TPOT and tok/s of `other` against `best`, and the concurrency where it differs (a
    halved TPOT beside fewer tok/s reads as a contradiction without it: DeepSeek-V3 under DeepEP's
    low-latency kernels runs 122 sequences a replica where the default runs 279; a CLI read)."""
    changes = ", ".join(
        f"{name} {fmt(getattr(best, field))} -> {fmt(getattr(other, field))} "
        f"({getattr(other, field) / getattr(best, field) - 1:+.0%})"
        for name, field, fmt in (("TTFT", "ttft_seconds", ms), ("TPOT", "tpot_seconds", ms),
                                 ("tok/s", "throughput_tokens_per_second", count)))
    if other.batch != best.batch:
        changes += f", at {other.batch:,} concurrent sequences per replica (not {best.batch:,})"
    return changes


def moe_backend_lines(plan: ServePlan) -> list[str]:
    """The recommended layout under each other measured --moe-backend, against this plan's."""
    best = plan.recommended
    return [f"MoE kernel: --moe-backend {option.value} ({MOE_BACKENDS[option.value]}) "
            f"on {best.layout}: {_changes(best, option.estimate)}."
            for option in plan.moe_backend_options]


TOKEN_BUDGET_NOTE_GAIN = 0.05
"""token_budget_lines speaks where another budget gives the recommended layout at least this
much more of what the plan ranks by (a display threshold, not fitted)."""


def token_budget_lines(plan: ServePlan) -> list[str]:
    """The token budget that does most for the recommended PP layout (serve_search.
    token_budget_options), where it beats the plan's by TOKEN_BUDGET_NOTE_GAIN or more in
    goodput (with an SLA) or tokens/s."""
    best = plan.recommended
    if not plan.token_budget_options:
        return []
    field = "goodput_tokens_per_second" if plan.request.has_sla else "throughput_tokens_per_second"
    top = max(plan.token_budget_options, key=lambda option: getattr(option.estimate, field))
    base = getattr(best, field)
    if base <= 0 or getattr(top.estimate, field) < (1 + TOKEN_BUDGET_NOTE_GAIN) * base:
        return []
    current = max_num_batched_tokens(plan.cluster, plan.request, best.layout, plan.model)
    goodput = (f", goodput {getattr(top.estimate, field) / base - 1:+.0%}" if plan.request.has_sla else "")
    return [f"Token budget: --max-num-batched-tokens {int(top.value):,} on {best.layout} (now {current:,}): "
            f"{_changes(best, top.estimate)}{goodput}; pipeline bubble "
            f"{best.bubble_fraction:.0%} -> {top.estimate.bubble_fraction:.0%}. A step that carries a prompt chunk "
            f"holds the micro-batches behind it at every stage, so smaller chunks keep the stages even "
            f"(the plan ranks layouts at the budget asked)."]


def options_json(key: str, options: tuple) -> list[dict[str, Any]]:
    """serve_search.BackendOption rows: the choice under `key` (or, for the dual-batch overlap
    switch, under enable_dbo) and what it gives."""
    def choice(value: str) -> dict[str, Any]:
        return {"enable_dbo": value == DBO_ON} if value in (DBO_ON, DBO_OFF) else {key: value}

    return [{**choice(o.value), "ttft_seconds": o.estimate.ttft_seconds, "tpot_seconds": o.estimate.tpot_seconds,
             "throughput_tokens_per_second": o.estimate.throughput_tokens_per_second} for o in options]


ALL2ALL_WORDS = {
    "allgather_reducescatter": "--all2all-backend allgather_reducescatter (vLLM's default all-gather + reduce-scatter)",
    "deepep_low_latency": "--all2all-backend deepep_low_latency (DeepEP's low-latency kernels)",
    "deepep_high_throughput": "--all2all-backend deepep_high_throughput (DeepEP's high-throughput kernels)",
    DBO_ON: f"{DBO_ON} (dual-batch overlap)",
    DBO_OFF: f"{DBO_OFF} (one batch per step)",
}


SGLANG_ALL2ALL_WORDS = {
    "allgather_reducescatter": "--all2all-backend allgather_reducescatter (SGLang's default exchange, "
                               "--moe-a2a-backend none)",
    "deepep_low_latency": "--all2all-backend deepep_low_latency (SGLang: --moe-a2a-backend deepep --deepep-mode "
                          "low_latency)",
    "deepep_high_throughput": "--all2all-backend deepep_high_throughput (SGLang: --moe-a2a-backend deepep "
                              "--deepep-mode normal)",
}
"""Under --emit sglang the what-if lines name the SGLang flags each choice is emitted as
(emit/sglang.DEEPEP_FLAGS), not vLLM's (a CLI read)."""


def all2all_backend_lines(plan: ServePlan) -> list[str]:
    """The recommended layout under each other --all2all-backend, against this plan's; or, when
    it exchanges no tokens, that the asked backend (and --enable-dbo) do not apply to it."""
    best, request = plan.recommended, plan.request
    layout = best.layout
    if layout.ep <= 1 or layout.dp_per_ep_group <= 1:
        asked = [flag for flag, on in ((f"--all2all-backend {request.all2all_backend}",
                                        request.all2all_backend != DEFAULT_ALL2ALL_BACKEND),
                                       ("--enable-dbo", request.enable_dbo)) if on]
        if asked:
            # "the recommended" read as the deployment where a disaggregated one won and carried
            # the flags (a CLI read): this is the aggregated search's best
            return [f"EP exchange: {' and '.join(asked)} not used by the best aggregated layout, {layout}: it has "
                    f"no expert-parallel group across DP ranks, so no tokens are exchanged (an aggregated one with "
                    f"it: --layout ep=..., dp=...; disaggregated decode workers take the flags where they have one)."]
    # vLLM turns CUDA graphs off under the high-throughput kernels with DP (serve.py's note on a
    # layout that runs them), and SGLang under deepep_mode normal (moe_hook.py at 0.5.23: "Cuda
    # graph is disabled because deepep_mode=`normal`"): the what-if line carries the caveat
    sglang = request.pool_engine == "sglang"
    engine = "SGLang" if sglang else "vLLM"
    eager = f" ({engine} runs its decode steps without CUDA graphs there, a host cost the plan does not price)"
    words = {**ALL2ALL_WORDS, **(SGLANG_ALL2ALL_WORDS if sglang else {})}
    return [f"EP exchange: {words[option.value]} on {best.layout}: {_changes(best, option.estimate)}"
            f"{eager if option.value == 'deepep_high_throughput' else ''}."
            for option in plan.all2all_backend_options]


def speculation_words(speculation: Speculation) -> str:
    """`mtp, 3 drafted tokens per step at acceptance 0.8/0.6/0.4: 2.47 tokens per step`."""
    drafter = {"mtp": "the model's MTP layers", "ngram": "prompt lookup on the host"}.get(
        speculation.method, f"draft {getattr(speculation.draft, 'name', '?')}")
    rates = "/".join(f"{rate:g}" for rate in speculation.acceptance)
    return (f"{speculation.method} ({drafter}), {speculation.num_tokens} drafted token(s) per step at acceptance "
            f"{rates}: {expected_tokens_per_step(speculation.acceptance):.2f} tokens per sequence per step")


def speculation_lines(plan: ServePlan) -> list[str]:
    """What speculative decoding is priced as, and the recommended layout without it."""
    speculation, best = plan.request.speculation, plan.recommended
    if speculation is None or best is None:
        return []
    drafting = max((step.draft_seconds for step in best.decode_steps), default=0.0)
    cost = (f"the drafter takes {ms(drafting)} of each decode step" if speculation.method != "ngram"
            else "the drafts come from the host (their CPU time is not priced)")
    line = f"Speculative decoding: {speculation_words(speculation)}; {cost}"

    def describe(option) -> str:
        other = option.estimate
        if option.value == SPECULATION_OFF_BEST:
            head = f"{SPECULATION_OFF_BEST} is {other.layout}"
        elif option.value == SPECULATION_OFF:
            head = f"{SPECULATION_OFF} on {best.layout}"
        else:
            head = f"with --num-speculative-tokens {option.value} on {best.layout}"
        if isinstance(other, Rejected):
            return f"  {head}: {'; '.join(other.reasons)}."
        return f"  {head} ({other.batch} concurrent sequence(s) per replica): {_changes(best, other)}."

    return ([line + "; the plan's figures -> each alternative's:"]
            + [describe(option) for option in plan.speculation_options] + [break_even_line(plan)])


def break_even_line(plan: ServePlan) -> str:
    """Where the drafts stop paying on the recommended layout (serve_search.speculation_break_even)."""
    factor, speculation = plan.speculation_break_even, plan.request.speculation
    what = "TPOT" if plan.request.objective == "latency" else "goodput"
    if factor is None and max(speculation.acceptance) == 0:
        return "  break-even: none: at acceptance 0 the drafts only cost."
    if factor is None:
        return f"  break-even: the drafts lose on {what} here even if every one were accepted."
    rates = "/".join(f"{min(1.0, rate * factor):.2f}" for rate in speculation.acceptance)
    if factor > 1:
        return (f"  break-even: the drafts lose on {what} at these rates; they would pay above {factor:.0%} of them "
                f"({rates}).")
    return (f"  break-even: the drafts pay on {what} while the acceptance stays above {factor:.0%} of the given "
            f"rates ({rates}).")


def speculation_option_json(option: Any) -> dict[str, Any]:
    """One serve_search.speculation_options row: its draft length (0 = off), the layout, and
    its figures, or why it is rejected (it misses the SLA without the drafts)."""
    other = option.estimate
    row: dict[str, Any] = {
        "num_speculative_tokens": 0 if option.value in (SPECULATION_OFF, SPECULATION_OFF_BEST) else int(option.value),
        "tp": other.layout.tp, "pp": other.layout.pp, "dp": other.layout.dp, "ep": other.layout.ep}
    if isinstance(other, Rejected):
        return {**row, "rejected": list(other.reasons)}
    return {**row, "batch": other.batch, "ttft_seconds": other.ttft_seconds, "tpot_seconds": other.tpot_seconds,
            "throughput_tokens_per_second": other.throughput_tokens_per_second}


def speculation_json(speculation: Speculation | None) -> dict[str, Any] | None:
    if speculation is None:
        return None
    return {"method": speculation.method, "num_speculative_tokens": speculation.num_tokens,
            "acceptance": list(speculation.acceptance),
            "tokens_per_step": expected_tokens_per_step(speculation.acceptance),
            "draft_model": getattr(speculation.draft, "name", None),
            "served_draft_model": speculation.served_draft if speculation.draft is not None else None}


def _why(plan: ServePlan, best: ServeEstimate, fastest: ServeEstimate, most: ServeEstimate) -> str:
    """Why the recommendation wins, including when the near-tie rule picked it."""
    per_replica = f"at {best.batch} concurrent sequence(s) per replica"
    request = plan.request
    if best.overloaded:
        # the headline had read "highest throughput" with nothing about the queue (a CLI read);
        # "serves the most" only where it does (the latency objective ranks by TPOT: a review)
        served = count(best.throughput_tokens_per_second)
        serves = (f"serves the most, {served} output tok/s," if best.layout == most.layout else
                  f"serves {served} output tok/s (the most: {most.layout}, {count(most.throughput_tokens_per_second)})")
        return (f"OVERLOADED: no layout keeps up with --request-rate {request.offered_rate_per_s:g}/s; this one "
                f"{serves} and its queue grows without bound")
    if best.offered_rate_per_s is not None:
        load = (f"{count(best.throughput_tokens_per_second)} output tok/s at {best.concurrency:.1f} requests in "
                f"flight per replica on average")
        lowest = "TPOT" if request.objective == "latency" else f"mean E2E latency ({ms(best.e2e_seconds)})"
        return (f"keeps up with --request-rate {best.offered_rate_per_s:g}/s ({load}) at the lowest {lowest} of "
                f"the layouts that do" + (" within the SLA" if request.has_sla else ""))
    if request.objective == "throughput":
        if best.layout == most.layout:
            # under an SLA the concurrency is what meets it, so the tokens/s are goodput
            ranked = "highest goodput within the SLA" if request.has_sla else "highest throughput"
            return f"{ranked}, {count(best.throughput_tokens_per_second)} output tok/s {per_replica}"
        return (f"{count(best.throughput_tokens_per_second)} tok/s {per_replica}, within "
                f"{NEAR_TIE_FRACTION:.0%} of the most ({most.layout}, "
                f"{count(most.throughput_tokens_per_second)}), with {ms(best.tpot_seconds)} TPOT "
                f"instead of {ms(most.tpot_seconds)}")
    if best.layout == fastest.layout:
        return f"lowest TPOT, {ms(best.tpot_seconds)} {per_replica}"
    return (f"TPOT {ms(best.tpot_seconds)} {per_replica}, within {NEAR_TIE_FRACTION:.0%} of the "
            f"fastest ({fastest.layout}, {ms(fastest.tpot_seconds)}), with "
            f"{count(best.throughput_tokens_per_second)} tok/s instead of "
            f"{count(fastest.throughput_tokens_per_second)}")


def _norm_allreduce_words(r: ServeEstimate) -> str:
    """Where the query / key norms span every head, the layer's third all-reduce (their
    partial sums, included in the per-layer time)."""
    norms = [c for c in r.collectives if c.phase == "decode" and c.name == "query / key norms"]
    if not norms:
        return ""
    return f" and the query / key norms' {count(norms[0].message_bytes)} B"


def _placement_line(r: ServeEstimate, engine: str = "vllm") -> str:
    """`engine`: the pool engine the commands are for; SGLang's TP all-reduces are priced at vLLM's
    measured kernels, and the line says so rather than name vLLM alone (a CLI read)."""
    p = r.placement
    source = ALLREDUCE_SOURCE_WORDS[r.allreduce_source]
    if engine == "sglang" and r.allreduce_source in ("fused", "engine"):
        source += ", SGLang priced alike"
    tp = "no TP" if p.tp_link is None else (
        f"TP all-reduces over {p.tp_link.kind} ({us(r.tp_allreduce_seconds_per_layer)} per layer at "
        f"{count(r.allreduce_message_bytes)} B{_norm_allreduce_words(r)}, {source})")
    pp = "no PP" if p.pp_link is None else (
        f"{plural(r.layout.pp - 1, 'PP boundary', 'PP boundaries')} ({p.num_pp_boundaries_crossing_nodes} across "
        f"nodes over "
        f"{p.pp_link.kind}), bubble {r.bubble_fraction:.0%} with {r.batches_in_flight} "
        f"batch{'es' if r.batches_in_flight != 1 else ''} in flight")
    return f"Placement: {tp}; {pp}."


def render_rejected(rejected: tuple[Rejected, ...] | list[Rejected], title: str = "Rejected layouts") -> Table:
    from rich.table import Table

    table = Table(title=title)
    with_ep = any(item.layout.ep > 1 for item in rejected)
    for header in ("tp", "pp", "dp", "ep")[:4 if with_ep else 3]:
        table.add_column(header, justify="right")
    table.add_column("why not", justify="left")
    for item in rejected:
        degrees = [str(item.layout.tp), str(item.layout.pp), str(item.layout.dp)] + ([str(item.layout.ep)] if with_ep else [])
        table.add_row(*degrees, "; ".join(item.reasons))
    return table


def render_plan(plan: ServePlan, steps: tuple[LaunchStep, ...], engine: str, top: int, show_rejected: bool,
                ray_steps: tuple[LaunchStep, ...] = (), notes: list[str] | None = None,
                metrics: ServeMetrics | None = None, superseded: bool = False) -> None:
    """superseded: summary_lines'; the launch is then the aggregated alternative's."""
    out = console()
    out.print(describe_model(plan.model, kv_cache_format(plan.model, plan.cluster.gpu, plan.request.kv_cache_dtype)))
    out.print(describe_cluster(plan.cluster))
    if plan.recommended is None:
        render_infeasible(plan, out, show_rejected)
        return
    out.print(render_table(plan, top))
    for line in summary_lines(plan, superseded):
        out.print(line)
    if metrics is not None and plan.request.simulates_burst:
        best = plan.recommended
        for line in burst_lines(plan.request, metrics, str(best.layout), superseded, best.layout.pp > 1,
                                best.offered_rate_per_s is not None and not best.overloaded, best.ttft_seconds,
                                best.request_latency_seconds):
            out.print(line, markup=False)
    if show_rejected and plan.rejected:
        out.print(render_rejected(plan.rejected))
    ray_title = f"Or with Ray ({engine.replace('vllm', 'vllm-ray', 1)})"
    launch_title = f"Launch the best aggregated layout instead ({engine})" if superseded else f"Launch ({engine})"
    for title, group in ((launch_title, steps), (ray_title, ray_steps)):
        if group:
            out.print(f"\n{title}:")
            for step in group:
                out.print(f"  # {step.where}", markup=False)
                out.print(f"  {step.shell()}", markup=False, soft_wrap=True)
    for line in per_node_lines((*steps, *ray_steps)):
        out.print(line, markup=False)
    for note in notes or []:
        out.print(f"Note: {note}")


def burst_lines(request: ServeRequest, metrics: ServeMetrics, layout: str, superseded: bool = False,
                pipeline: bool = False, keeps_up: bool = False, steady_ttft_seconds: float | None = None,
                steady_e2e_seconds: float | None = None) -> list[str]:
    """The recommended layout under the simulated burst, as vllm bench serve prints it, naming the
    layout (superseded: a disaggregated deployment is recommended, and the burst ran on the best
    aggregated layout, the only kind the simulation steps; pipeline: it has PP), a note where
    the burst falls behind a rate the plan says the layout keeps up with (keeps_up;
    ServeMetrics.backlog), and one where a closed loop's mean TTFT is well above the layout's
    steady state (`steady_ttft_seconds`; first_wave_note)."""
    rate = request.request_rate_per_s
    rate_text = "inf" if rate is None or not math.isfinite(rate) else f"{rate:g}"
    source = f"--dataset {request.dataset}" if request.dataset else f"{request.input_len}/{request.output_len} tokens"
    if request.random_range_ratio is not None:
        source += f" (--random-range-ratio {request.random_range_ratio:g})"
    limit = "" if request.max_concurrency is None else f", --max-concurrency {request.max_concurrency}"
    if request.burstiness is not None:  # the layouts' rows price Poisson arrivals (ServeRequest.burstiness)
        rate_text += f" --burstiness {request.burstiness:g}" + (
            "" if request.burstiness == 1 else ", the layouts priced for Poisson arrivals")
    where = (f"on the best aggregated layout {layout} (bursts are simulated for aggregated replicas only)"
             if superseded else f"on {layout}")
    prompts = metrics.num_prompts or request.num_prompts or DEFAULT_NUM_PROMPTS
    count_text = f"{prompts:,} prompts"
    if metrics.shortened_from is not None:
        count_text = (f"the first {prompts:,} of the default {metrics.shortened_from:,} prompts: all would take more "
                      f"than the simulation's {MAX_SIMULATED_STEPS:,} engine steps")
    lines = [f"Simulated burst {where} ({count_text}, {source}, "
             f"--request-rate {rate_text}{limit}): {metrics.duration_seconds:.1f} s, "
             f"{plain(metrics.request_throughput_per_second)} req/s, "
             f"{count(metrics.output_token_throughput_per_second)} output tok/s"]
    single = request.one_output_token or not metrics.decoded  # every request (drawn): one output token
    for name, d in (("TTFT", metrics.ttft_seconds), ("TPOT", metrics.tpot_seconds),
                    ("ITL", metrics.itl_seconds), ("E2E", metrics.e2e_seconds)):
        if single and name in ("TPOT", "ITL"):  # not 0 us: vllm bench serve has none to report
            lines.append(f"  {name:<4} none (one output token)")
            continue
        # one unit a line: seconds for all three once any is past LATENCY_IN_SECONDS_FROM
        unit_from = 0.0 if max(d.mean, d.median, d.p99) >= LATENCY_IN_SECONDS_FROM else LATENCY_IN_SECONDS_FROM
        shown = [ms_or_s(value, unit_from, 1) for value in (d.mean, d.median, d.p99)]
        # fewer than 1% of the gaps are long (a decode step that carries a prompt's chunk) but
        # they move the mean past the p99, as vllm bench serve computes both (a CLI read took
        # it for a slip)
        skew = " (a few long gaps, under 1% of them, lift the mean past the p99)" if d.mean > d.p99 else ""
        lines.append(f"  {name:<4} mean {shown[0]}, median {shown[1]}, p99 {shown[2]}{skew}")
    backlog = metrics.backlog
    if backlog is not None and backlog.growing and keeps_up:
        lines.append(f"Note: the simulated burst falls behind --request-rate {rate_text}, which the plan says {layout} "
                     f"keeps up with: from {backlog.from_seconds:,.0f} s in to the last arrival "
                     f"({backlog.to_seconds:,.0f} s) the requests "
                     + (f"waiting for a first token went from {backlog.waiting_from:,} to {backlog.waiting_to:,}"
                        if backlog.in_system_from is None else
                        f"in the system went from {backlog.in_system_from:,} to {backlog.in_system_to:,} and those "
                        f"waiting for a first token from {backlog.waiting_from:,} to {backlog.waiting_to:,}")
                     + ("" if backlog.planned_waiting is None else
                        f" (the plan's steady state: {plain(backlog.planned_waiting)} waiting)")
                     + ", completing "
                     f"{plain(backlog.completed_per_second)} req/s meanwhile, so its queue grows for as long as "
                     f"requests come; the layouts' rates are priced from the mean load"
                     + (" (with PP, vLLM's batch queue gathers the prompts that arrive during a long micro-batch "
                        "into the next one, and those convoys cost capacity the mean does not see)" if pipeline
                        else ""))
    wave = None if steady_ttft_seconds is None else first_wave_note(request, metrics, steady_ttft_seconds)
    if wave is not None:
        lines.append(wave)
    short = None if steady_e2e_seconds is None else short_burst_note(request, metrics, steady_e2e_seconds,
                                                                      steady_ttft_seconds)
    if short is not None:
        lines.append(short)
    missed = burst_sla_misses(request, metrics)
    if missed:
        lines.append(f"Note: the burst misses {'; '.join(missed)}: the SLA search sizes the steady state, and this "
                     f"burst queues its prompts beyond it (fewer prompts at once, a lower --request-rate or "
                     f"--max-concurrency would meet it)")
    return lines


def short_burst_note(request: ServeRequest, metrics: ServeMetrics, steady_e2e_seconds: float,
                     steady_ttft_seconds: float | None = None) -> str | None:
    """Why a burst at a finite rate reports other times than the layout's row: its prompts all
    arrive in less time than one request takes at the steady state the row prices, so the
    system is still filling when the last one arrives (Qwen3-30B-A3B, 1,000 prompts at 100/s
    over 10 s against an 18 s E2E: TPOT 27 ms simulated, 71 ms priced; a CLI read). "Lighter"
    only where its mean E2E is below the row's: a burst's own prompt queue can outweigh the
    filling (70B tp=8, 300 prompts at 30/s: TTFT 1,488 ms against the row's 733; a review)."""
    rate = request.request_rate_per_s
    prompts = metrics.num_prompts or request.num_prompts or DEFAULT_NUM_PROMPTS
    if rate is None or not math.isfinite(rate) or request.max_concurrency is not None:
        return None
    span_seconds = prompts / rate
    if span_seconds >= steady_e2e_seconds:
        return None
    lighter = metrics.e2e_seconds.mean < steady_e2e_seconds  # else its own queueing outweighs it (a review)
    ttft_heavier = steady_ttft_seconds is not None and metrics.ttft_seconds.mean > steady_ttft_seconds
    return (f"Note: the burst's {prompts:,} prompts arrive over {span_seconds:,.1f} s, less than one request's E2E at the "
            f"layout's steady state ({steady_e2e_seconds:,.1f} s): it ends before the load builds up to that state, "
            + (("so its E2E is lighter than the row's" + (
                f", its TTFT ({seconds_to_ms(metrics.ttft_seconds.mean):,.0f} ms) not" if ttft_heavier else ""))
               if lighter else "so its times are not the row's steady state")
            + "; a larger --num-prompts reaches it")


FIRST_WAVE_NOTE_RATIO = 1.25
"""A closed loop's burst TTFT mean this many times the steady state's, or more, is explained
(first_wave_note); so is a later request's mean this far above it."""


def first_wave_note(request: ServeRequest, metrics: ServeMetrics, steady_ttft_seconds: float) -> str | None:
    """Why a closed loop's burst TTFT mean is well above the layout's steady state: vllm bench
    serve sends the first C requests at once (ServeMetrics.first_wave), and with every request
    of the same length the clients keep completing and resending together. Llama-3.1-70B fp8
    tp=4 on 4 H100, 1,024/1,024 tokens, 64 clients, 640 prompts: steady state 128 ms; the first
    64 average 2.1 s and the 576 after them 137 ms with lengths within 10% of the mean (mean
    336 ms), 1.1 s with every length the same (mean 1.2 s)."""
    wave = metrics.first_wave
    mean = metrics.ttft_seconds.mean
    if wave is None or mean < FIRST_WAVE_NOTE_RATIO * steady_ttft_seconds:
        return None
    text = (f"Note: the burst's mean TTFT, {latency(mean)}, averages its first {wave.num_first:,} requests, sent at "
            f"once ({latency(wave.first_ttft_mean_seconds)} on average: their prompts queue together for the step "
            f"budget), with the {wave.num_later:,} sent as others completed ({latency(wave.later_ttft_mean_seconds)} "
            f"on average")
    steady = f"the layout's steady state has {latency(steady_ttft_seconds)}"
    if wave.later_ttft_mean_seconds < FIRST_WAVE_NOTE_RATIO * steady_ttft_seconds:
        return text + f"; {steady})"
    if not request.dataset_lengths and not request.random_range_ratio:
        return text + (f"; {steady}: with every request of the same length the clients complete and resend in "
                       f"step, so their prompts keep queueing in waves; lengths that vary, as real traffic's do "
                       f"(--random-range-ratio, --dataset), spread them)")
    return text + f"; {steady}: the clients still complete in bunches)"


LATENCY_IN_SECONDS_FROM = 10.0
"""A burst's latencies from this many seconds on read in seconds (1,224.8 s, not 1224777.7 ms)."""


def latency(seconds: float) -> str:
    return ms_or_s(seconds, LATENCY_IN_SECONDS_FROM, 1)


def burst_sla_checks(request: ServeRequest, metrics: ServeMetrics) -> list[tuple[str, str, float | None, float]]:
    """(name, flag, limit or None, the metrics' mean) of each SLA."""
    return [("ttft", "--max-ttft-ms", request.max_ttft_seconds, metrics.ttft_seconds.mean),
            ("tpot", "--max-tpot-ms", request.max_tpot_seconds, metrics.tpot_seconds.mean),
            ("e2e", "--max-e2e-ms", request.max_e2e_seconds, metrics.e2e_seconds.mean)]


def burst_sla_misses(request: ServeRequest, metrics: ServeMetrics) -> list[str]:
    """Each SLA the simulated burst's mean misses, as `--max-ttft-ms 200 (mean 19,950 ms)`."""
    return [f"{flag} {seconds_to_ms(limit):g} (mean {latency(mean)})"
            for _, flag, limit, mean in burst_sla_checks(request, metrics) if limit is not None and mean > limit]


def render_infeasible(plan: ServePlan, out: Console, show_rejected: bool = False) -> None:
    """Why nothing fits (every rejection with --show-rejected, else the closest misses) and
    what would fit: the plan's answer, on stdout with the rest of it as training prints its
    own (exit 1 says no layout; stderr is for bad input)."""
    out.print(f"No feasible layout for {plan.model.name} on {plan.num_gpus} GPU{'s' if plan.num_gpus != 1 else ''} of {plan.cluster.name}.")
    if show_rejected:
        out.print(render_rejected(plan.rejected))
    else:
        shown, more = closest_misses(plan.rejected, MAX_REJECTED_SHOWN)
        title = "Rejected layouts" if not more else f"Rejected layouts: the {len(shown)} closest of {len(plan.rejected):,}"
        out.print(render_rejected(shown, title))
        if more:
            out.print(f"{more:,} more rejected (--show-rejected lists every one).")
    for suggestion in plan.suggestions:
        out.print(f"What would fit: {suggestion}")


def layout_json(r: ServeEstimate, rank: int, plan: ServePlan, steps: tuple[LaunchStep, ...],
                ray_steps: tuple[LaunchStep, ...]) -> dict[str, Any]:
    worst = r.stages[r.worst_stage]
    return {
        "tp": r.layout.tp, "pp": r.layout.pp, "dp": r.layout.dp, "ep": r.layout.ep, "rank": rank,
        "memory_per_gpu_bytes": worst.used_bytes,
        "capacity_per_gpu_bytes": plan.cluster.gpu.memory_bytes,
        "usable_per_gpu_bytes": worst.budget_bytes,
        "memory": {
            "weights_bytes": worst.weights_bytes, "kv_cache_bytes": worst.kv_cache_bytes,
            "activation_bytes": worst.activation_bytes, "overhead_bytes": worst.overhead_bytes,
        },
        "stages": [vars_of(s) for s in r.stages],
        "worst_stage": r.worst_stage,
        "kv_cache_tokens": r.kv_cache_tokens, "max_model_len": r.max_model_len,
        "max_concurrency": r.max_concurrency, "batch": r.batch, "max_num_seqs": r.max_num_seqs,
        "batches_in_flight": r.batches_in_flight,
        "tp_allreduce_seconds_per_layer": r.tp_allreduce_seconds_per_layer,
        "tp_allreduce_message_bytes": r.allreduce_message_bytes,
        "tp_allreduce_source": r.allreduce_source,
        "tp_link": None if r.placement.tp_link is None else r.placement.tp_link.kind,
        "tp_crosses_node": r.placement.tp_crosses_node,
        "ep_exchange_seconds_per_moe_layer": r.ep_exchange_seconds_per_moe_layer,
        "ep_exchange_link": ep_exchange_link(r),
        "ep_exchange_source": ep_exchange_source(r),
        "moe_kernel_source": moe_kernel(plan.model, plan.cluster, r.layout.ep).source if plan.model.is_moe else None,
        "pp_link": None if r.placement.pp_link is None else r.placement.pp_link.kind,
        "pp_hop_seconds": r.pp_hop_seconds,
        "bubble_fraction": r.bubble_fraction, "decode_bound": r.decode_bound,
        # one output token has no TPOT (vllm bench serve reports none; the table shows "-")
        "ttft_seconds": r.ttft_seconds, "tpot_seconds": r.tpot_seconds if plan.request.output_len > 1 else None,
        "tpot_batch1_seconds": r.tpot_batch1_seconds,
        # in TTFT, outside the engine's steps: the fixed first-token cost and the prompt's tokenization
        "first_token_seconds": None if r.steady is None else r.steady.first_token_seconds,
        "request_latency_seconds": r.request_latency_seconds, "e2e_seconds": r.e2e_seconds,
        "throughput_tokens_per_second": r.throughput_tokens_per_second,
        "concurrency": r.concurrency, "request_rate_per_second": r.offered_rate_per_s, "overloaded": r.overloaded,
        # PP whole prompts at a rate: the most one replica keeps up with in a convoy (none: no rate
        # given, or no convoy)
        "convoy_rate_per_second_per_replica": None if math.isinf(r.convoy_rate_per_s) else r.convoy_rate_per_s,
        "step_seconds": r.step_seconds,
        "prefill_tokens_per_step": r.prefill_tokens_per_step,
        "goodput_tokens_per_second": r.goodput_tokens_per_second,
        # per planned GPU: a layout that leaves some idle counts them, as the comparisons do
        "goodput_tokens_per_second_per_gpu": r.goodput_per_planned_gpu(plan.num_gpus),
        "sla": {"ttft_ok": r.sla.ttft_ok, "tpot_ok": r.sla.tpot_ok, "e2e_ok": r.sla.e2e_ok,
                "binding": r.sla.binding},
        "pareto": r.layout in plan.pareto, "notes": list(r.notes),
        "slowest_stage": r.slowest_stage,
        "decode_steps": [{**vars_of(step), "compute_or_memory_seconds": step.compute_or_memory_seconds}
                         for step in r.decode_steps],
        "prefill_stage_seconds": list(r.prefill_stage_seconds),
        "collectives": [vars_of(c) for c in r.collectives],
        "command": [step_json(step) for step in steps],
        "command_ray": [step_json(step) for step in ray_steps],
    }


def vars_of(stage: Any) -> dict[str, Any]:
    return {key: getattr(stage, key) for key in stage.__dataclass_fields__}


StepsFor = Callable[[ServeEstimate], tuple[LaunchStep, ...]]


def metrics_json(metrics: ServeMetrics, one_output_token: bool = False) -> dict[str, Any]:
    """`one_output_token`: no request decodes, so TPOT and ITL are null, not 0 (vllm bench serve
    reports none)."""
    def dist(d: Distribution) -> dict[str, float]:
        return {"mean": d.mean, "median": d.median, "p99": d.p99}
    per_token = None if one_output_token else dist(metrics.tpot_seconds), \
        None if one_output_token else dist(metrics.itl_seconds)
    return {
        "ttft_seconds": dist(metrics.ttft_seconds), "tpot_seconds": per_token[0],
        "itl_seconds": per_token[1], "e2e_seconds": dist(metrics.e2e_seconds),
        "duration_seconds": metrics.duration_seconds if math.isfinite(metrics.duration_seconds) else None,
        "request_throughput_per_second": metrics.request_throughput_per_second,
        "output_throughput_tokens_per_second": metrics.output_token_throughput_per_second,
        "backlog": None if metrics.backlog is None else {
            "from_seconds": metrics.backlog.from_seconds, "to_seconds": metrics.backlog.to_seconds,
            "in_system_from": metrics.backlog.in_system_from, "in_system_to": metrics.backlog.in_system_to,
            "waiting_from": metrics.backlog.waiting_from, "waiting_to": metrics.backlog.waiting_to,
            "completed_per_second": metrics.backlog.completed_per_second, "growing": metrics.backlog.growing,
            "planned_in_system": metrics.backlog.planned_in_system,
            "planned_waiting": metrics.backlog.planned_waiting},
        # the requests the burst simulated, and the default count it was cut from to fit the budget
        "num_prompts_simulated": metrics.num_prompts, "shortened_from_num_prompts": metrics.shortened_from,
        # a closed loop's first C requests, sent at once, apart from the later ones
        "first_wave": None if metrics.first_wave is None else {
            "num_requests": metrics.first_wave.num_first,
            "ttft_mean_seconds": metrics.first_wave.first_ttft_mean_seconds,
            "num_later_requests": metrics.first_wave.num_later,
            "later_ttft_mean_seconds": metrics.first_wave.later_ttft_mean_seconds},
    }


def serve_workload_json(request: ServeRequest) -> dict[str, Any]:
    rate = request.request_rate_per_s
    return {
        "input_len": request.input_len, "output_len": request.output_len,
        # a burst without a rate is sent all at once, as the text says (vllm bench serve's default)
        "request_rate": ("inf" if request.simulates_burst else None) if rate is None else (
            rate if math.isfinite(rate) else "inf"),
        "num_prompts": (request.num_prompts or DEFAULT_NUM_PROMPTS) if request.simulates_burst else None,
        "dataset": request.dataset, "max_concurrency": request.max_concurrency,
        "random_range_ratio": request.random_range_ratio,
        # the burst's arrival shape at a finite rate (1: Poisson, vllm bench serve's default)
        "burstiness": (request.burstiness or 1.0) if rate is not None and math.isfinite(rate) else None,
        "max_ttft_seconds": request.max_ttft_seconds, "max_tpot_seconds": request.max_tpot_seconds,
        "max_e2e_seconds": request.max_e2e_seconds,
    }


def plan_json(plan: ServePlan, steps_for: StepsFor, ray_steps_for: StepsFor,
              engine: str | None = None, top: int | None = None,
              metrics: ServeMetrics | None = None) -> dict[str, Any]:
    """`engine`: the engine and release the commands are for (`vllm 0.33.0`), None without
    commands; `top`: the best layouts to list (None: every feasible one); `metrics`: what vllm
    bench serve would report for the recommended layout."""
    layouts = [layout_json(r, i + 1, plan, steps_for(r), ray_steps_for(r))
               for i, r in enumerate(plan.layouts[:top])]
    for row in layouts:  # every row has the keys; only the recommended layout's are filled (below)
        row.update(metrics=None, metrics_source=None, metrics_sla_misses=None, metrics_sla=None)
    if layouts and metrics is not None:
        layouts[0]["metrics"] = metrics_json(metrics, plan.request.one_output_token or not metrics.decoded)
        layouts[0]["metrics_source"] = "simulated burst" if plan.request.simulates_burst else "steady state"
        layouts[0]["metrics_sla_misses"] = burst_sla_misses(plan.request, metrics)
        # the same limits on the metrics' means (`sla` judges the steady state the search sized)
        layouts[0]["metrics_sla"] = {f"{name}_ok": limit is None or mean <= limit
                                     for name, _, limit, mean in burst_sla_checks(plan.request, metrics)}
    return {
        "workload": "serve",
        "serve_workload": serve_workload_json(plan.request),
        "model": plan.model.name,
        "model_summary": to_jsonable(model_summary(
            plan.model, kv_cache_format(plan.model, plan.cluster.gpu, plan.request.kv_cache_dtype))),
        "cluster": plan.cluster.name,
        "num_gpus": plan.num_gpus,
        "objective": plan.request.objective,
        "moe_backend": plan.request.moe_backend,
        "moe_backend_options": options_json("moe_backend", plan.moe_backend_options),
        "all2all_backend": plan.request.all2all_backend,
        "enable_dbo": plan.request.enable_dbo,
        "async_scheduling": plan.request.schedules_ahead,
        "prompt_tokenizer": "none" if plan.request.tokenizer is None else plan.request.tokenizer.kind,
        "all2all_backend_options": options_json("all2all_backend", plan.all2all_backend_options),
        "token_budget_options": [{"max_num_batched_tokens": int(o.value), "ttft_seconds": o.estimate.ttft_seconds,
                                  "tpot_seconds": o.estimate.tpot_seconds,
                                  "throughput_tokens_per_second": o.estimate.throughput_tokens_per_second,
                                  "goodput_tokens_per_second": o.estimate.goodput_tokens_per_second,
                                  "bubble_fraction": o.estimate.bubble_fraction} for o in plan.token_budget_options],
        "speculation": speculation_json(plan.request.speculation),
        "speculation_options": [speculation_option_json(o) for o in plan.speculation_options],
        "speculation_break_even_factor": plan.speculation_break_even,
        "measured_links": plan.cluster.measured is not None,
        "engine_versions": vars_of(plan.request.engine_versions),
        "command_engine": engine,
        "recommended": layouts[0] if layouts else None,
        "layouts": layouts,
        "rejected": [{"tp": r.layout.tp, "pp": r.layout.pp, "dp": r.layout.dp, "ep": r.layout.ep,
                      "reasons": list(r.reasons),
                      # what the text's "closest" order reads (render.common.closest_misses)
                      "sla_miss_ratio": r.sla_miss_ratio or None, "over_bytes": r.over_bytes or None}
                     for r in plan.rejected],
        "num_layouts_bounded": plan.num_configs_bounded,
        "suggestions": list(plan.suggestions),
    }


def print_plan_json(plan: ServePlan, steps_for: StepsFor, ray_steps_for: StepsFor,
                    engine: str | None = None, top: int | None = None,
                    metrics: ServeMetrics | None = None, launch_notes: list[str] | None = None) -> None:
    payload = plan_json(plan, steps_for, ray_steps_for, engine, top, metrics)
    payload["launch_notes"] = list(launch_notes or [])
    print_json_rows(payload)
