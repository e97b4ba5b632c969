"""The throughput-latency frontier: output tokens/s per GPU against tokens/s per user.

A serving deployment trades speed per user (1 / TPOT) for tokens per GPU: more concurrent
sequences per replica fill each step's weight read with more rows, and each of them waits
longer for its next token. `plan --frontier` answers the question AIConfigurator's Pareto
chart answers: for a sweep of TPOT limits, the deployment that serves the most output tokens
per GPU within each (and within every other SLA the user set), aggregated and disaggregated.

Every point is the planner's own SLA search (serve_search.evaluate, plan_serving's ranking, and
disagg_search.plan_disaggregated with --max-tpot-ms set to the target); nothing is priced here.
docs/cost-model.md (Serving: the throughput-latency frontier).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.disagg_search import (
    MIN_DISAGGREGATED_GPUS,
    DisaggEstimate,
    check_disaggregated_gpus,
    plan_disaggregated,
)
from planner.errors import SpecError
from planner.memo import Memo
from planner.requests import LayoutFilter, ServeRequest
from planner.search import non_dominated
from planner.serve import ServeEstimate
from planner.serve_search import ServePlan, disaggregated_preferred, evaluate
from planner.specs import ClusterSpec, ModelSpec
from planner.units import ceil_ms, ms_to_seconds

FRONTIER_TARGETS = 10
"""TPOT limits swept, geometrically spaced from the fastest lone request to the TPOT of the
peak-throughput layout: enough to draw the curve's knee, few enough that a sweep over a
large MoE cluster stays within seconds (each target is a full SLA search)."""

FASTEST_TARGET_MARGIN = 1.02
"""The first target sits 2% above the fastest lone request's TPOT, so that layout meets it
(the fastest TPOT itself is met only by that layout at one sequence, a degenerate point)."""


@dataclass(frozen=True)
class FrontierCandidate:
    """One deployment's answer to a TPOT target."""

    mode: str
    """aggregated | disaggregated"""
    label: str
    """The layout (aggregated) or the workers (disaggregated)."""
    tpot_seconds: float
    ttft_seconds: float
    goodput_per_gpu: float
    """Output tokens/s per GPU within every SLA."""
    concurrency: float
    """Sequences decoding at once per replica (aggregated) or per decode worker."""
    gpus: int
    e2e_seconds: float = 0.0
    """Mean E2E latency at that load (the tie rule of serve_search.disaggregated_preferred)."""

    @property
    def tokens_per_second_per_user(self) -> float:
        return 1.0 / self.tpot_seconds


@dataclass(frozen=True)
class FrontierPoint:
    tpot_limit_seconds: float
    aggregated: FrontierCandidate | None
    disaggregated: FrontierCandidate | None

    @property
    def best(self) -> FrontierCandidate | None:
        """The higher goodput per GPU, as `plan` chooses (disagg_cli.compare): disaggregated only
        with more than NEAR_TIE_FRACTION more (aggregated is the simpler deployment), or within
        that tie at a much shorter E2E (serve_search.disaggregated_preferred)."""
        a, d = self.aggregated, self.disaggregated
        if a is None or d is None:
            return a or d
        return d if disaggregated_preferred(d.goodput_per_gpu, a.goodput_per_gpu, d.e2e_seconds, a.e2e_seconds) else a


@dataclass(frozen=True)
class Frontier:
    points: tuple[FrontierPoint, ...]
    fastest_tpot_seconds: float
    """The lowest TPOT any layout reaches (one sequence per replica)."""
    peak_tpot_seconds: float
    """The TPOT of the aggregated layout with the most output tokens/s (no TPOT limit)."""
    disaggregated_compared: bool
    why_not_disaggregated: str = ""

    @property
    def pareto(self) -> tuple[FrontierCandidate, ...]:
        """Every candidate no other one beats on both axes, fastest per user first."""
        found = [c for p in self.points for c in (p.aggregated, p.disaggregated) if c is not None]
        return tuple(sorted(pareto_front(found), key=lambda c: -c.tokens_per_second_per_user))


def tpot_targets(fastest_seconds: float, peak_seconds: float, count: int = FRONTIER_TARGETS) -> tuple[float, ...]:
    """`count` limits from FASTEST_TARGET_MARGIN x fastest to peak, evenly spaced in log (a
    geometric series): the curve's interesting part, where tokens per GPU climb steeply, is
    near the fast end. One target when the two are that close."""
    low = fastest_seconds * FASTEST_TARGET_MARGIN
    if peak_seconds <= low or count < 2:
        return (printed_limit(max(low, peak_seconds)),)
    ratio = (peak_seconds / low) ** (1 / (count - 1))
    return tuple(printed_limit(t) for t in (*(low * ratio ** i for i in range(count - 1)), peak_seconds))


TARGET_DECIMALS_MS = 1
"""The frontier prints its TPOT limits to 0.1 ms; each limit is that printed number itself."""


def printed_limit(seconds: float) -> float:
    """`seconds` rounded up to the printed 0.1 ms, as `--max-tpot-ms` reads that number back
    (87.04 ms -> 87.1 ms): planning again with the printed limit finds the same point (the
    limits were unrounded: 86.96 ms printed as 87.0 ran 206 sequences, `--max-tpot-ms 87.0`
    205). Up, so the peak's own TPOT still meets its limit."""
    return ms_to_seconds(ceil_ms(seconds, TARGET_DECIMALS_MS))


PARETO_USER_DECIMALS = 1
"""The Pareto list prints tokens/s per user to 0.1 and per GPU to whole tokens, and compares
them so (pareto_front)."""


def pareto_front(candidates: list[FrontierCandidate]) -> list[FrontierCandidate]:
    """Non-dominated in (higher tokens/s per user, higher tokens/s per GPU) as the list prints
    them (0.1 tok/s per user, whole tok/s per GPU), so that no listed point is beaten by another
    at the printed figures (26.5 tok/s/user at 187 and at 609 tok/s/GPU, TPOT 37.74 and 37.75
    ms, were both listed: a CLI read); of equal points the first is kept."""
    return non_dominated(candidates, lambda c: (round(c.tokens_per_second_per_user, PARETO_USER_DECIMALS),
                                                round(c.goodput_per_gpu)), drop_equal=True)


def check_frontier_request(request: ServeRequest) -> None:
    """The sweep sets concurrency and the TPOT limit itself, in the steady state."""
    if request.batch is not None:
        raise SpecError("--batch: --frontier sweeps the concurrency itself (drop --batch)")
    if request.simulates_burst:
        raise SpecError(f"--frontier: traces the steady state; drop {'/'.join(request.burst_flags)} "
                        f"(or plan the burst without --frontier)")


def aggregated_candidate(result: ServeEstimate, plan_gpus: int) -> FrontierCandidate:
    """Per planned GPU, as the disaggregated side (a layout may leave some idle)."""
    return FrontierCandidate("aggregated", str(result.layout), result.tpot_seconds, result.ttft_seconds,
                             result.goodput_per_planned_gpu(plan_gpus), result.batch,
                             max(plan_gpus, result.layout.num_gpus), result.e2e_seconds)


def disaggregated_candidate(result: DisaggEstimate) -> FrontierCandidate:
    return FrontierCandidate("disaggregated", result.label, result.tpot_seconds, result.ttft_seconds,
                             result.plan_goodput_per_gpu, result.decode.concurrency, result.copies * result.gpus_used,
                             result.e2e_seconds)


def better(kept: FrontierCandidate | None, found: FrontierCandidate | None) -> FrontierCandidate | None:
    """The one with more goodput per GPU (the one found on a tie). The disaggregated search
    prices a decode worker's first round at the most sequences the TPOT limit allows, so a
    looser limit can price the same deployment lower (disagg_search.DECODE_CAP_HALVINGS
    narrows that, but not to zero)."""
    if kept is None or (found is not None and found.goodput_per_gpu >= kept.goodput_per_gpu):
        return found if found is not None else kept
    return kept


def trace_frontier(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
                   launchable: Callable[[ServePlan], ServePlan] = lambda plan: plan,
                   count: int = FRONTIER_TARGETS, engine: str = "vllm") -> Frontier | None:
    """The frontier, or None when no aggregated layout fits at all or --max-tpot-ms is below every
    layout's lone-request TPOT (the plain plan says why).
    `launchable`: the plan less the layouts the chosen engine would not launch as planned
    (serve_cli.launchable), so that every point can be emitted; `engine` decides whether
    disaggregated decode workers may pipeline (plan_disaggregated)."""
    check_frontier_request(request)
    if request.mode == "disaggregated":  # too few GPUs: the plain plan's usage error (it traced an empty table)
        check_disaggregated_gpus(request, cluster)
    gpus = request.num_gpus or cluster.num_gpus
    unlimited = replace(request, max_tpot_seconds=None, objective="throughput")
    memo = Memo()  # the sweep's searches differ only in the TPOT limit: they share steady states
    peak = launchable(evaluate(model, cluster, unlimited, memo)).recommended
    lone = launchable(evaluate(model, cluster, replace(unlimited, batch=1, objective="latency", mode="aggregated"))).recommended
    if peak is None or lone is None:
        return None
    if request.max_tpot_seconds is not None and request.max_tpot_seconds < lone.tpot_seconds:
        # below the fastest lone request's TPOT no deployment meets the limit (a lone decoder is
        # as fast in a decode worker): the plain plan says what would (the sweep had traced one
        # point at the fastest TPOT instead, exit 0; found by a CLI sweep)
        return None
    ceiling = peak.tpot_seconds if request.max_tpot_seconds is None else min(peak.tpot_seconds,
                                                                              request.max_tpot_seconds)
    compared = request.mode != "aggregated" and request.layout == LayoutFilter() and gpus >= MIN_DISAGGREGATED_GPUS
    why = ("" if compared else
           "--mode aggregated" if request.mode == "aggregated" else
           "--layout fixes an aggregated layout" if request.layout != LayoutFilter() else
           f"fewer than {MIN_DISAGGREGATED_GPUS} GPUs")
    points = []
    aggregated = disaggregated = None
    for limit in tpot_targets(lone.tpot_seconds, ceiling, count):
        target = replace(request, max_tpot_seconds=limit)
        # a looser limit admits every deployment a tighter one found: keep the better
        if request.mode != "disaggregated":
            best = launchable(evaluate(model, cluster, target, memo)).recommended
            aggregated = better(aggregated, None if best is None else aggregated_candidate(best, gpus))
        if compared:
            best_d = plan_disaggregated(model, cluster, target, memo, engine).recommended
            disaggregated = better(disaggregated, None if best_d is None else disaggregated_candidate(best_d))
        points.append(FrontierPoint(limit, aggregated, disaggregated))
    return Frontier(tuple(points), lone.tpot_seconds, peak.tpot_seconds, compared, why)

