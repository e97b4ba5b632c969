"""Disaggregated serving output: the P/D table, the verdict against aggregated, the commands, JSON."""

from __future__ import annotations

from typing import Any

from planner.disagg_cli import Verdict
from planner.disagg_search import E2E_BINDING, DisaggEstimate, DisaggPlan
from planner.emit.command import LaunchStep
from planner.emit.disagg import COPY_PORT_SHIFT
from planner.render.common import console, ms, per_node_lines, step_json
from planner.requests import ServeRequest
from planner.units import BYTES_PER_MIB, sequences

COLUMNS = (
    ("#", lambda e, i: str(i)),
    ("prefill", lambda e, i: f"{e.prefill.workers} x {e.prefill.shape_label}"),  # an EP worker's dp and ep too
    ("decode", lambda e, i: f"{e.decode.workers} x {e.decode.shape_label}"),
    ("GPUs", lambda e, i: gpus_cell(e)),
    ("KV/request", lambda e, i: f"{e.kv.bytes_per_request / BYTES_PER_MIB:,.0f} MiB"),
    ("KV link", lambda e, i: f"{e.kv.link_kind} (+{ms(e.kv.exposed_seconds)})"),
    ("C_d", lambda e, i: sequences(e.decode.concurrency)),
    ("TTFT", lambda e, i: ms(e.ttft_seconds)),
    ("TPOT", lambda e, i: ms(e.tpot_seconds) if e.output_len > 1 else "-"),
    ("req/s/copy", lambda e, i: f"{e.requests_per_second:.2f}"),
    ("goodput/GPU", lambda e, i: f"{e.plan_goodput_per_gpu:,.0f}"),
    ("bound by", lambda e, i: e.binding),
)


def gpus_cell(e: DisaggEstimate) -> str:
    """The deployment's GPUs; 'copies x GPUs' when the planned GPUs run more than one copy,
    '/ planned' when some are idle."""
    cell = str(e.gpus_used) if e.copies == 1 else f"{e.copies}x{e.gpus_used}"
    return f"{cell}/{e.planned_gpus}" if e.idle_gpus else cell


def render_disagg(plan: DisaggPlan, verdict: Verdict, steps: tuple[LaunchStep, ...] | None, engine: str,
                  top: int, compared: bool = True, why_not_emitted: str | None = None,
                  launch_notes: tuple[str, ...] = ()) -> None:
    """`compared`: the aggregated plan was shown too (--mode auto), so the verdict weighs both.
    why_not_emitted: where steps is None, why (disagg_cli.why_not_emitted); launch_notes: what
    the commands run differently from the plan (disagg_cli.disagg_launch_notes)."""
    from rich.table import Table

    out = console()
    table = Table(title="Disaggregated prefill/decode (output tok/s per planned GPU within the SLA; idle ones count)")
    for header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for i, e in enumerate(plan.candidates[:top], 1):
        table.add_row(*(get(e, i) for _, get in COLUMNS))
    if plan.candidates:
        out.print(table)
    else:
        out.print(f"No disaggregated deployment: {plan.why_none}.", markup=False)
        for line in plan.would_fit:
            out.print(f"What would fit (disaggregated): {line}", markup=False)
    for reason, num in plan.rejected:
        out.print(f"  rejected {num:,} P/D combinations: {reason}", markup=False)
    best = plan.recommended
    if best is not None:
        for note in (*best.notes, *launch_cap_notes(best)):
            out.print(f"Note: {note}", markup=False)
    if not compared and best is not None:  # --mode disaggregated: the user asked for this kind
        out.print(f"Recommended (--mode disaggregated): {best.label}; against the best aggregated layout: "
                  f"{verdict.winner or 'neither'} wins: {verdict.reason}", markup=False)
    elif not compared:
        # --mode disaggregated: no aggregated plan was made, so only the deployments' reason applies
        out.print(f"Recommended: none: no disaggregated deployment: {plan.why_none}", markup=False)
    elif verdict.winner == "disaggregated" and best is not None:
        out.print(f"Recommended: {verdict.reason}", markup=False)  # "disaggregated <label>: its goodput vs ..."
    else:
        out.print(f"Aggregated or disaggregated: {verdict.winner or 'neither'} wins: {verdict.reason}", markup=False)
    if best is not None and steps is None:
        out.print(f"Launch: not emitted ({why_not_emitted or 'the engine cannot run this placement'}).", markup=False)
    elif best is not None and steps and (verdict.winner == "disaggregated" or not compared):
        out.print(f"\nLaunch disaggregated ({engine}):")
        for step in steps:
            out.print(f"  # {step.where}", markup=False)
            out.print(f"  {step.shell()}", markup=False, soft_wrap=True)
        for line in per_node_lines(steps):
            out.print(line, markup=False)
        if best.copies > 1:
            out.print(f"Note: {copies_note(best)}", markup=False)
        for note in launch_notes:
            out.print(f"Note: {note}", markup=False)
        if engine.startswith("vllm"):
            out.print("Note: the proxy is vLLM's example tests/v1/kv_connector/nixl_integration/toy_proxy_server.py; "
                      "it is not installed with the wheel: run it from a checkout of the release's tag "
                      "(or put NVIDIA Dynamo / llm-d's router in front instead)", markup=False)


def launch_cap_notes(e: DisaggEstimate) -> list[str]:
    """Why the decode workers' launch cap (--max-num-seqs) is not the table's C_d: C_d is what
    they run at the matched rate, the cap what they were sized for."""
    d = e.decode
    # a TPOT-bound rank's note says what its cap and load are, and what a burst costs
    if d.max_num_seqs <= round(d.concurrency) or any(n.startswith("TPOT-bound") for n in e.notes):
        return []
    per = " per DP rank" if d.dp > 1 else ""
    load = {"clients": "at the clients' rate", "request-rate": "at the request rate",
            E2E_BINDING: "at the rate --max-e2e-ms allows"}.get(e.binding, "at the matched rate")
    flags = ("vLLM's --max-num-seqs, SGLang's --max-running-requests" if d.dp == 1 else
             f"vLLM's --max-num-seqs; SGLang's --max-running-requests counts a DP-attention server's ranks "
             f"together, {d.max_num_seqs * d.dp:,}")
    room = ("the room a burst above the rate can use" if e.binding != E2E_BINDING else
            f"but --max-e2e-ms holds only up to the {e.requests_per_second:.3g} req/s a copy is loaded to: a burst "
            f"above it runs more sequences, each round longer, and E2E goes over the limit")
    return [f"the decode workers run {sequences(d.concurrency)} sequences{per} {load} (C_d); they are "
            f"launched for {d.max_num_seqs}{per} ({flags}), the cap the search chose within the SLA limits, "
            f"the KV cache and the engine's default; {room}"]


def copies_note(e: DisaggEstimate) -> str:
    """What the commands above are when the plan runs several copies of them, and where each
    copy goes (plan_copies counts them node by node)."""
    head = (f"the commands above are one copy of the deployment ({e.gpus_used} GPUs); run {e.copies} copies on "
            f"{e.copies * e.gpus_used} of the {e.planned_gpus} GPUs, each with its own proxy, and balance the requests over "
            f"the proxies")
    per_node = e.gpus_per_node // e.gpus_used if e.same_node and e.num_nodes_used <= 1 else 0
    if per_node > 1:
        return (f"{head}: up to {per_node} copies a node, copy k of a node on GPUs {e.gpus_used}k to "
                f"{e.gpus_used}k+{e.gpus_used - 1} (shift CUDA_VISIBLE_DEVICES) with every port of its commands "
                f"moved by {COPY_PORT_SHIFT}k")
    return f"{head}: each copy on {e.num_nodes_used} node(s) of its own"


def estimate_json(e: DisaggEstimate, steps: tuple[LaunchStep, ...] | None,
                  why_not_emitted: str | None = None) -> dict[str, Any]:
    def worker(w) -> dict[str, Any]:
        return {"tp": w.tp, "pp": w.pp, "dp": w.dp, "ep": w.ep, "workers": w.workers, "gpus": w.gpus,
                "concurrency": w.concurrency, "max_num_seqs": w.max_num_seqs,
                "round_seconds": w.round_seconds, "kv_cache_tokens": w.kv_cache_tokens,
                "stages": [{"stage": s.stage, "weights_bytes": s.weights_bytes, "activation_bytes": s.activation_bytes,
                            "overhead_bytes": s.overhead_bytes, "kv_cache_bytes": s.kv_cache_bytes,
                            "budget_bytes": s.budget_bytes} for s in w.stages]}

    load, rate = e.prefill_load, e.rate

    return {
        "mode": "disaggregated",
        "prefill": worker(e.prefill),
        "decode": worker(e.decode),
        "gpus_used": e.gpus_used,
        "copies": e.copies,
        "plan_gpus": e.planned_gpus,
        "same_node": e.same_node,
        "kv_transfer_bytes": e.kv.bytes_per_request,
        "kv_transfer_seconds": e.kv.exposed_seconds,
        "kv_transfer_total_seconds": e.kv.transfer_seconds,
        "kv_transfer_link": e.kv.link_kind,
        "kv_transfer_source": e.kv.source,
        "first_token_seconds": e.first_token_seconds,
        "prefill_wait_seconds": load.wait_seconds,
        "prefill_seconds": load.prefill_seconds,
        "prefill_utilization": load.utilization,
        "prefill_steps_per_prompt": e.steps_per_prompt,
        # what the workers take within the TTFT / TPOT limits and their KV links (rate matching;
        # the prefill workers at most MAX_PREFILL_UTILIZATION of their capacity: the load the
        # plan picks itself, a sent --request-rate may run them up to the capacity below)
        "prefill_max_requests_per_second": rate.prefill_requests_per_second,
        "decode_max_requests_per_second": rate.decode_requests_per_second,
        # the prefill workers at full steps, no limit: N_p * k * n_max / (S_p * T(n_max))
        "prefill_capacity_requests_per_second": (e.prefill.workers * load.rate_per_second / load.utilization
                                                 if load.utilization > 0 else None),
        "ttft_seconds": e.ttft_seconds,
        "tpot_seconds": e.tpot_seconds,
        "e2e_seconds": e.e2e_seconds,
        "requests_per_second": e.requests_per_second,
        "throughput_tokens_per_second": e.throughput_tokens_per_second,
        "goodput_tokens_per_second": e.goodput_tokens_per_second,
        "goodput_per_gpu": e.goodput_per_gpu,
        # the copies on the planned GPUs, idle ones included: what ranks deployments
        "plan_goodput_tokens_per_second": e.plan_goodput_tokens_per_second,
        "plan_goodput_per_gpu": e.plan_goodput_per_gpu,
        # the aggregated layouts' key, the same quantity (over the planned GPUs): a reader of
        # `recommended` finds it whichever mode wins
        "goodput_tokens_per_second_per_gpu": e.plan_goodput_per_gpu,
        "binding": e.binding, "overloaded": e.overloaded,
        # why it does not serve a sent --request-rate within the limits (None where it does)
        "rate_shortfall": e.rate_shortfall or None,
        "notes": list(e.notes),
        "launch": None if steps is None else [step_json(s) for s in steps],
        **({"launch_not_emitted": why_not_emitted} if steps is None and why_not_emitted else {}),
    }


def steady_metrics_json(e: DisaggEstimate) -> dict[str, Any]:
    """The deployment's steady state in the aggregated layouts' `metrics` keys: mean = median =
    p99 (every request alike), ITL one decode round (a streamed chunk per round)."""
    def alike(seconds: float) -> dict[str, float]:
        return {"mean": seconds, "median": seconds, "p99": seconds}
    one_token = e.output_len <= 1  # no decode round to time, as vllm bench serve reports none
    return {"ttft_seconds": alike(e.ttft_seconds), "tpot_seconds": None if one_token else alike(e.tpot_seconds),
            "itl_seconds": None if one_token else alike(e.decode.round_seconds), "e2e_seconds": alike(e.e2e_seconds),
            "duration_seconds": None, "request_throughput_per_second": e.plan_goodput_tokens_per_second / e.output_len
            if e.output_len else None,
            "output_throughput_tokens_per_second": e.plan_goodput_tokens_per_second}


def sla_json(e: DisaggEstimate, request: ServeRequest) -> dict[str, Any]:
    """The aggregated layouts' `sla` keys: each limit met by the deployment's steady state, and
    which side binds its rate (prefill | decode | kv-link | clients | request-rate)."""
    def ok(limit: float | None, value: float) -> bool:
        return limit is None or value <= limit
    return {"ttft_ok": ok(request.max_ttft_seconds, e.ttft_seconds),
            "tpot_ok": e.output_len <= 1 or ok(request.max_tpot_seconds, e.tpot_seconds),
            "e2e_ok": ok(request.max_e2e_seconds, e.e2e_seconds), "binding": e.binding}


def disagg_json(plan: DisaggPlan, verdict: Verdict, best_steps: tuple[LaunchStep, ...] | None,
                top: int | None, why_not_emitted: str | None = None,
                launch_notes: tuple[str, ...] = (), request: ServeRequest | None = None) -> dict[str, Any]:
    """`request`: its limits judge each deployment's `sla`, as the aggregated layouts' (None:
    no `sla`); the recommended (first) deployment gets `metrics`, its steady state as vllm bench
    serve would report it (every request alike: the burst is simulated for aggregated layouts
    only), the others null."""
    shown = plan.candidates[:top]
    entries = [estimate_json(e, best_steps if i == 0 else (), why_not_emitted if i == 0 else None)
               for i, e in enumerate(shown)]
    if entries:  # the recommended deployment's commands: what they run differently from the plan
        entries[0]["launch_notes"] = list(launch_notes)
    for i, (entry, e) in enumerate(zip(entries, shown, strict=True)):
        entry.update(metrics=steady_metrics_json(e) if i == 0 else None,
                     metrics_source="steady state" if i == 0 else None)
        if request is not None:
            entry["sla"] = sla_json(e, request)
    return {
        "disaggregated": entries,
        "disaggregated_rejected": [{"reason": r, "count": n} for r, n in plan.rejected],
        "disaggregated_why_none": plan.why_none or None,
        "disaggregated_would_fit": list(plan.would_fit),
        "comparison": {"winner": verdict.winner, "reason": verdict.reason},
    }
