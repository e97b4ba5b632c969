"""`plan --frontier` output: output tokens/s per GPU against tokens/s per user, the table and JSON."""

from __future__ import annotations

from typing import Any

from planner.cost.params import kv_cache_format
from planner.frontier import Frontier, FrontierCandidate
from planner.render.catalog import describe_cluster, describe_model
from planner.render.common import console, ms, print_json_rows, to_jsonable
from planner.requests import ServeRequest
from planner.specs import ClusterSpec, ModelSpec
from planner.units import seconds_to_ms


def _cells(c: FrontierCandidate | None) -> tuple[str, ...]:
    if c is None:
        return ("none meets it", "", "", "", "")
    return (c.label, f"{c.concurrency:,.0f}", ms(c.ttft_seconds), f"{c.tokens_per_second_per_user:,.1f}",
            f"{c.goodput_per_gpu:,.0f}")


def other_limits(request: ServeRequest) -> str:
    """The SLAs every point keeps besides the swept TPOT limit."""
    kept = [f"{name} <= {seconds_to_ms(limit):,.0f} ms" for name, limit in
            (("TTFT", request.max_ttft_seconds), ("E2E", request.max_e2e_seconds)) if limit is not None]
    return f"; every point also within {' and '.join(kept)}" if kept else ""


def render_frontier(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, frontier: Frontier) -> None:
    from rich.table import Table

    out = console()
    out.print(describe_model(model, kv_cache_format(model, cluster.gpu, request.kv_cache_dtype)))
    out.print(describe_cluster(cluster))
    out.print(f"Workload: {request.input_len:,} prompt and {request.output_len:,} output tokens per request, "
              f"steady state{other_limits(request)}.")
    table = Table(title="Throughput against speed: the most output tokens/s per GPU within each TPOT limit")
    table.add_column("TPOT limit", justify="right")
    # --mode disaggregated traces no aggregated layout: no column for it (it read "none meets it")
    modes = (["aggregated"] if request.mode != "disaggregated" else []) + (
        ["disaggregated"] if frontier.disaggregated_compared else [])
    for mode in modes:
        table.add_column("aggregated layout" if mode == "aggregated" else "disaggregated workers")
        table.add_column("C" if mode == "aggregated" else "C_d", justify="right")
        table.add_column("TTFT", justify="right")
        table.add_column("tok/s/user", justify="right")
        table.add_column("tok/s/GPU", justify="right")
    if len(modes) > 1:
        table.add_column("better")
    for point in frontier.points:
        cells = [ms(point.tpot_limit_seconds)]
        for mode in modes:
            cells += _cells(point.aggregated if mode == "aggregated" else point.disaggregated)
        if len(modes) > 1:
            best = point.best
            cells.append(best.mode if best else "-")
        table.add_row(*cells)
    out.print(table)
    out.print(f"Fastest lone request: TPOT {ms(frontier.fastest_tpot_seconds)} "
              f"({1 / frontier.fastest_tpot_seconds:,.0f} tok/s per user); the most tokens per GPU (no TPOT "
              f"limit) at TPOT {ms(frontier.peak_tpot_seconds)}. C: sequences per replica (aggregated) or per "
              f"decode worker (C_d).")
    if request.max_ttft_seconds is None:
        out.print("No --max-ttft-ms: the TTFT columns show how long each point's prompts wait (queueing "
                  "included); give one to trace the frontier within it.")
    if not frontier.disaggregated_compared:
        out.print(f"Disaggregated prefill/decode not traced: {frontier.why_not_disaggregated}.")
    out.print("Pareto frontier (nothing beats these on both tok/s/user and tok/s/GPU):")
    for c in frontier.pareto:
        out.print(f"  {c.tokens_per_second_per_user:8,.1f} tok/s/user  {c.goodput_per_gpu:8,.0f} tok/s/GPU  "
                  f"{c.mode} {c.label}, C={c.concurrency:,.0f}, TTFT {ms(c.ttft_seconds)}")
    out.print("For a point's launch command, plan again with --max-tpot-ms set to its TPOT limit: the SLA "
              "search picks the same deployment.")


def candidate_json(c: FrontierCandidate | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"mode": c.mode, "deployment": c.label, "concurrency": c.concurrency, "gpus": c.gpus,
            "tpot_seconds": c.tpot_seconds, "ttft_seconds": c.ttft_seconds,
            "tokens_per_second_per_user": c.tokens_per_second_per_user,
            "goodput_tokens_per_second_per_gpu": c.goodput_per_gpu}


def frontier_json(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, frontier: Frontier) -> dict[str, Any]:
    return {
        "model": model.name,
        "cluster": cluster.name,
        "workload": to_jsonable({"input_len": request.input_len, "output_len": request.output_len,
                                 "max_ttft_seconds": request.max_ttft_seconds,
                                 "max_e2e_seconds": request.max_e2e_seconds,
                                 "max_tpot_seconds": request.max_tpot_seconds,
                                 "prompt_tokenizer": "none" if request.tokenizer is None else request.tokenizer.kind,
                                 "tokenizer_workers": request.tokenizer_workers}),
        "fastest_tpot_seconds": frontier.fastest_tpot_seconds,
        "peak_tpot_seconds": frontier.peak_tpot_seconds,
        "disaggregated_compared": frontier.disaggregated_compared,
        "why_not_disaggregated": frontier.why_not_disaggregated or None,
        "points": [{"tpot_limit_seconds": p.tpot_limit_seconds,
                    "aggregated": candidate_json(p.aggregated),
                    "disaggregated": candidate_json(p.disaggregated),
                    "best": p.best.mode if p.best else None} for p in frontier.points],
        "pareto": [candidate_json(c) for c in frontier.pareto],
    }


def print_frontier_json(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, frontier: Frontier) -> None:
    print_json_rows(frontier_json(model, cluster, request, frontier))
