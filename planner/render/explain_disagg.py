"""`plan explain --mode disaggregated` output: P/D placement, the request's path, memory per
worker, rate matching. Printed on one recording console, so --svg / --html save what was shown."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from planner.disagg_search import E2E_BINDING, DisaggPlan
from planner.explain_disagg import DisaggExplanation, PathLeg, PdPlacement, PdSlot, RateMatching
from planner.render.common import console, print_json, write_recording
from planner.render.explain import (
    MAX_NODES_DRAWN,
    _print_all,
    _stacked,
    heading,
    memory_lines,
    seconds,
)

ROLE_STYLES = {"prefill": "white on dark_orange3", "decode": "white on dark_blue"}
PATH_CHARS = {"request overhead": "o", "queue at prefill": "q", "prefill": "P", "KV transfer (exposed)": "K",
              "decode step scheduled ahead": "d", "first decode round": "D"}
PATH_STYLES = {"request overhead": "white on grey39", "queue at prefill": "grey50", "prefill": ROLE_STYLES["prefill"],
               "KV transfer (exposed)": "black on yellow", "decode step scheduled ahead": "white on blue",
               "first decode round": ROLE_STYLES["decode"]}


def slot_label(s: PdSlot) -> str:
    """P<worker> s<stage> t<tp rank>, D likewise; `unused` when no worker holds the GPU."""
    if s.role is None:
        return "unused"
    return f"{s.role[0].upper()}{s.worker} s{s.stage} t{s.tp_rank}"


def pd_placement_lines(pm: PdPlacement) -> list[Text]:
    cell = max(len(slot_label(s)) for s in pm.slots) + 2
    lines = []
    for node in range(min(pm.num_nodes, MAX_NODES_DRAWN)):
        row = Text(f"node {node:<3}")
        for slot in pm.slots[node * pm.gpus_per_node:(node + 1) * pm.gpus_per_node]:
            row.append(slot_label(slot).center(cell - 1), style=ROLE_STYLES.get(slot.role or "", "grey50"))
            row.append(" ")
        lines.append(row)
    if pm.num_nodes > MAX_NODES_DRAWN:
        lines.append(Text(f"... {pm.num_nodes - MAX_NODES_DRAWN} more nodes (copies of this unit or unused)"))
    link = "NVLink inside each node" if pm.same_node else "the NICs (prefill and decode on different nodes)"
    lines.append(Text(f"Cells are P|D<worker> s<stage> t<tp rank>; colour = role. The KV moves over {link}."))
    return lines


def path_lines(e: DisaggExplanation, width: int) -> list[Text]:
    """Each leg with its time and the running total; a bar of the legs to the first token."""
    lines = []
    total = 0.0

    def leg_line(leg: PathLeg, running: float) -> Text:
        return Text(f"  {leg.name:<22} {seconds(leg.seconds):>10}   at {seconds(running):>10}   {leg.detail}")

    for leg in e.path.to_first_token:
        total += leg.seconds
        lines.append(leg_line(leg, total))
    lines.append(Text(f"  {'= TTFT':<22} {seconds(e.path.ttft_seconds):>10}", style="bold"))
    for leg in e.path.after_first_token:
        total += leg.seconds
        lines.append(leg_line(leg, total))
    lines.append(Text(f"  {'= E2E':<22} {seconds(e.path.e2e_seconds):>10}", style="bold"))
    bar_width = max(20, min(80, width - 4))
    lines.append(Text("TTFT: ") + _stacked([(leg.name, leg.seconds) for leg in e.path.to_first_token],
                                           e.path.ttft_seconds, bar_width, PATH_CHARS, PATH_STYLES))
    lines.append(Text("      " + "  ".join(f"{PATH_CHARS[leg.name]} {leg.name}" for leg in e.path.to_first_token)))
    return lines


LOADED_BY = {"clients": "the clients", "request-rate": "the request rate", E2E_BINDING: "the most that meets --max-e2e-ms"}


def rate_lines(r: RateMatching) -> list[str]:
    most = max(r.prefill_requests_per_second, r.decode_requests_per_second)
    out = []
    for side, value in (("prefill", r.prefill_requests_per_second), ("decode", r.decode_requests_per_second)):
        bar = "#" * round(value / most * 40)
        binds = "  <- binds" if side == r.binding else ""
        out.append(f"  {side:<8} {value:8.2f} req/s {bar}{binds}")
    matched = min(r.prefill_requests_per_second, r.decode_requests_per_second)
    if r.binding in ("prefill", "decode"):
        serves = f"The deployment serves min of the two: {r.requests_per_second:.2f} req/s"
    else:  # loaded below it: by the clients, a sent rate or the E2E limit (the notes say which)
        serves = (f"The deployment takes min of the two, {matched:.2f} req/s, and is loaded to "
                  f"{r.requests_per_second:.2f} ({LOADED_BY.get(r.binding, r.binding)})")
    out.append(f"  {serves}; the prefill workers run at {r.prefill_utilization:.0%} of their capacity.")
    return out


def render_disagg_explanation(e: DisaggExplanation, out: Console) -> None:
    out.print(Text(f"plan explain: {e.label} for {e.model} on {e.cluster} ({e.workload}; the recommended "
                   f"disaggregated deployment)", style="bold"))
    out.print(f"GPUs {e.gpus_used}, TTFT {seconds(e.ttft_seconds)}, TPOT {seconds(e.tpot_seconds)}, "
              f"E2E {seconds(e.e2e_seconds)}, goodput {e.goodput_per_gpu:,.0f} output tok/s per GPU.")
    for note in e.notes:
        out.print(f"Note: {note}", markup=False)
    heading(out, "Placement (prefill and decode workers)")
    _print_all(out, pd_placement_lines(e.placement))
    heading(out, "A request's path")
    _print_all(out, path_lines(e, out.width))
    heading(out, "Memory per GPU, by worker and stage")
    _print_all(out, memory_lines(e.memory, out.width))
    heading(out, "Rate matching (requests/s each fleet can take within the SLA)")
    _print_all(out, rate_lines(e.rate))


def show_disagg(e: DisaggExplanation, *, json_output: bool, svg: str | None, html: str | None) -> None:
    if json_output:
        print_json(e)
        return
    out = console(record=bool(svg or html))
    render_disagg_explanation(e, out)
    write_recording(out, svg, html)


def show_disagg_infeasible(plan: DisaggPlan, json_output: bool) -> None:
    """No deployment: why, and the rejections as `plan --mode disaggregated` tallies them."""
    if json_output:
        print_json({"disaggregated": None, "why_none": plan.why_none,
                    "disaggregated_rejected": [{"reason": r, "count": n} for r, n in plan.rejected],
                    "disaggregated_would_fit": list(plan.would_fit)})
        return
    out = console()
    out.print(f"No disaggregated deployment: {plan.why_none}.", markup=False)
    for line in plan.would_fit:
        out.print(f"What would fit (disaggregated): {line}", markup=False)
    for reason, num in plan.rejected:
        out.print(f"  rejected {num:,} P/D combinations: {reason}", markup=False)
