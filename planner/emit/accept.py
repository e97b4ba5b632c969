"""What an engine release refuses at startup, applied to a plan: refused estimates leave the
ranking and become rejected layouts (the same `Rejected` value the search tallies), so the
recommendation is always one the chosen engine starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from planner.layout import Layout, Rejected
from planner.search import Plan

E = TypeVar("E")
R = TypeVar("R")


def without_refused(plan: Plan[E, R], layout_of: Callable[[E], Layout],
                    reasons_for: Callable[[E], list[str]]) -> Plan[E, R]:
    """`plan` less the estimates `reasons_for` refuses; a layout none of whose estimates is left
    joins the rejected list with the reasons of its first refused estimate."""
    kept: list[E] = []
    refused: dict[Layout, tuple[list[str], int]] = {}
    for estimate in plan.layouts:
        reasons = reasons_for(estimate)
        if not reasons:
            kept.append(estimate)
            continue
        layout = layout_of(estimate)
        first, count = refused.get(layout, (reasons, 0))
        refused[layout] = (first, count + 1)
    if not refused:
        return plan
    still_ranked = {layout_of(e) for e in kept}
    rejected = [Rejected(layout, tuple(reasons), num_configs_rejected=count)
                for layout, (reasons, count) in refused.items() if layout not in still_ranked]
    ordered = sorted((*plan.rejected, *rejected), key=lambda r: (r.layout.tp, r.layout.pp, r.layout.dp))
    return replace(plan, layouts=tuple(kept), rejected=tuple(ordered))
