"""Raw worker results -> summarized rows, curves, fits and outlier flags.

Pure python (no torch). SI units throughout. Modes of a measurement:
``all_local_ranks`` (every local rank takes part at once) and
``one_rank_per_node`` (only local rank 0 of each node crosses the network).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.probe.fit import AlphaBetaFit, fit_alpha_beta, slow_outliers
from planner.probe.sweep import ALL_REDUCE, SEND_RECV, summarize

ALL_RANKS, ONE_RANK_PER_NODE = "all_local_ranks", "one_rank_per_node"
POOR_FIT_RELATIVE_RESIDUAL = 0.25


@dataclass(frozen=True)
class ResultRow:
    """One (op, link, group, size) point; times are the group's slowest rank per repeat, median over repeats."""

    op: str
    link: str
    mode: str
    group_index: int
    ranks: list[int]
    size_bytes: int
    median_seconds: float
    spread_fraction: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


def summarize_rows(raw: dict) -> list[ResultRow]:
    slowest: dict[tuple[int, int, int], list[float]] = {}
    for row in raw["rows"]:
        key = (row["phase"], row["group"], row["size_bytes"])
        previous = slowest.get(key, [0.0] * len(row["repeat_seconds"]))
        slowest[key] = [max(a, b) for a, b in zip(previous, row["repeat_seconds"], strict=True)]
    rows = []
    for (phase_index, group_index, size_bytes), seconds in sorted(slowest.items()):
        phase = raw["phases"][phase_index]
        ranks = phase["groups"][group_index]
        s = summarize(phase["op"], len(ranks), size_bytes, seconds)
        rows.append(
            ResultRow(
                phase["op"],
                phase["link"],
                phase["mode"],
                group_index,
                ranks,
                size_bytes,
                s.median_seconds,
                s.spread_fraction,
                s.algbw_bytes_per_s,
                s.busbw_bytes_per_s,
            )
        )
    return rows


def curve(
    rows: list[ResultRow], op: str, link: str, mode: str, group_index: int | None = None
) -> dict[int, float]:
    """size -> median seconds of the slowest group (a ring is as fast as its slowest member)."""
    seconds_by_size: dict[int, float] = {}
    for row in rows:
        if (row.op, row.link, row.mode) == (op, link, mode) and group_index in (
            None,
            row.group_index,
        ):
            seconds_by_size[row.size_bytes] = max(
                seconds_by_size.get(row.size_bytes, 0.0), row.median_seconds
            )
    return dict(sorted(seconds_by_size.items()))


def series_keys(rows: list[ResultRow]) -> list[tuple[str, str, str, int]]:
    """Distinct (op, link, mode, num_ranks) in measurement order."""
    return list(dict.fromkeys((r.op, r.link, r.mode, len(r.ranks)) for r in rows))


def fit_name(op: str, link: str, mode: str) -> str:
    return f"{link}_{op}" if mode == ALL_RANKS or link != "inter_node" else f"{link}_{op}_{mode}"


def fit_all(rows: list[ResultRow]) -> dict[str, tuple[int, AlphaBetaFit]]:
    """fit name -> (num_ranks, alpha-beta fit of the slowest-group curve)."""
    fits = {}
    for op, link, mode, num_ranks in series_keys(rows):
        points = curve(rows, op, link, mode)
        if len(points) >= 2:
            fits[fit_name(op, link, mode)] = (
                num_ranks,
                fit_alpha_beta(op, num_ranks, list(points), list(points.values())),
            )
    return fits


def outlier_flags(rows: list[ResultRow], hostnames: list[str], nodes: list[list[int]]) -> list[str]:
    """Flag a node (intra-node all-reduce) or a pair (send/recv) much slower than its peers."""
    flags = []
    for op, link, mode, num_ranks in series_keys(rows):
        if not (op == SEND_RECV or (op == ALL_REDUCE and link == "intra_node")):
            continue
        ranks_by_group = {
            r.group_index: r.ranks for r in rows if (r.op, r.link, r.mode) == (op, link, mode)
        }
        bandwidth_by_group = {}
        for group_index in ranks_by_group:
            points = curve(rows, op, link, mode, group_index)
            if len(points) >= 2:
                fit = fit_alpha_beta(op, num_ranks, list(points), list(points.values()))
                bandwidth_by_group[group_index] = fit.bandwidth_bytes_per_s or 0.0
        for group_index in slow_outliers(bandwidth_by_group):
            ranks = ranks_by_group[group_index]
            where = sorted({hostnames[i] for i, node in enumerate(nodes) if set(node) & set(ranks)})
            flags.append(
                f"slow {link} {op}: ranks {ranks} on {', '.join(where)} below 70% of the median of their peers"
            )
    return flags


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else float(f"{value:.{digits}g}")


def fits_section(fits: dict[str, tuple[int, AlphaBetaFit]]) -> dict:
    return {
        name: {
            "num_ranks": num_ranks,
            "alpha_seconds": rounded(fit.alpha_seconds),
            "bandwidth_bytes_per_s": rounded(fit.bandwidth_bytes_per_s),
            "rms_relative_residual": rounded(fit.rms_relative_residual, 3),
        }
        for name, (num_ranks, fit) in fits.items()
    }


def curves_section(rows: list[ResultRow]) -> list[dict]:
    """All-reduce curves the planner interpolates; inter-node uses the all-local-ranks mode when measured."""
    modes = {(r.link, r.mode) for r in rows if r.op == ALL_REDUCE}
    curves = []
    for op, link, mode, num_ranks in series_keys(rows):
        if op != ALL_REDUCE or (mode == ONE_RANK_PER_NODE and (link, ALL_RANKS) in modes):
            continue
        points = curve(rows, op, link, mode)
        curves.append(
            {
                "link": link,
                "num_ranks": num_ranks,
                "mode": mode,
                "sizes_bytes": list(points),
                "median_seconds": [rounded(s) for s in points.values()],
            }
        )
    return curves


def results_section(rows: list[ResultRow]) -> list[dict]:
    return [
        {k: rounded(v) if isinstance(v, float) else v for k, v in asdict(row).items()}
        for row in rows
    ]
