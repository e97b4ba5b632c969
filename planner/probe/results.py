"""Raw worker results -> summarized rows, curves, fits and outlier flags.

Pure python (no torch). SI units throughout. Modes of a measurement:
``all_local_ranks`` (every local rank takes part at once) and
``one_rank_per_node`` (only local rank 0 of each node crosses the network),
``tp_groups`` (every group of consecutive ranks of one size at once, as TP runs).
A series is one (op, link, mode, num_ranks): the same op and link can be
measured at several group sizes.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from planner.probe.fit import AlphaBetaFit, fit_alpha_beta, slow_outliers
from planner.probe.sweep import ALL_REDUCE, summarize
from planner.probe.timing import slowest_rank_per_repeat

ALL_RANKS, ONE_RANK_PER_NODE, TP_GROUPS = "all_local_ranks", "one_rank_per_node", "tp_groups"
INTRA_NODE, INTER_NODE = "intra_node", "inter_node"
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
    host_median_seconds: float | None = None
    """CUDA: the same point on the host clock (launch overhead included), a cross-check of
    the event timing that median_seconds holds; None where the host clock is the figure."""


def slowest_by_point(raw_rows: list[dict], field: str) -> dict[tuple[int, int, int], list[float]]:
    """(phase, group, size) -> per repeat the slowest rank's seconds of that timing field."""
    by_rank: dict[tuple[int, int, int], list[list[float]]] = {}
    for row in raw_rows:
        if field in row:
            key = (row["phase"], row["group"], row["size_bytes"])
            by_rank.setdefault(key, []).append(row[field])
    return {key: slowest_rank_per_repeat(ranks) for key, ranks in by_rank.items()}


def summarize_rows(raw: dict) -> list[ResultRow]:
    slowest = slowest_by_point(raw["rows"], "repeat_seconds")
    host = slowest_by_point(raw["rows"], "host_repeat_seconds")  # CUDA: the cross-check
    rows = []
    for (phase_index, group_index, size_bytes), seconds in sorted(slowest.items()):
        host_seconds = host.get((phase_index, group_index, size_bytes))
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
                statistics.median(host_seconds) if host_seconds else None,
            )
        )
    return rows


def series_key(row: ResultRow) -> tuple[str, str, str, int]:
    return (row.op, row.link, row.mode, len(row.ranks))


def curve(
    rows: list[ResultRow], series: tuple[str, str, str, int], group_index: int | None = None
) -> dict[int, float]:
    """size -> median seconds of the series' slowest group (a ring is as fast as its slowest member)."""
    seconds_by_size: dict[int, float] = {}
    for row in rows:
        if series_key(row) == series and group_index in (None, row.group_index):
            seconds_by_size[row.size_bytes] = max(
                seconds_by_size.get(row.size_bytes, 0.0), row.median_seconds
            )
    return dict(sorted(seconds_by_size.items()))


def series_keys(rows: list[ResultRow]) -> list[tuple[str, str, str, int]]:
    """Distinct (op, link, mode, num_ranks) in measurement order."""
    return list(dict.fromkeys(series_key(r) for r in rows))


def fit_name(op: str, link: str, mode: str, num_ranks: int) -> str:
    """intra_node_all_reduce, inter_node_all_reduce_one_rank_per_node, intra_node_all_reduce_tp_groups_2 ..."""
    if mode == TP_GROUPS:
        return f"{link}_{op}_{mode}_{num_ranks}"
    return f"{link}_{op}" if mode == ALL_RANKS or link != INTER_NODE else f"{link}_{op}_{mode}"


def fit_all(rows: list[ResultRow]) -> dict[str, tuple[int, AlphaBetaFit]]:
    """fit name -> (num_ranks, alpha-beta fit of the slowest-group curve)."""
    fits = {}
    for series in series_keys(rows):
        points = curve(rows, series)
        if len(points) >= 2:
            op, _, _, num_ranks = series
            fits[fit_name(*series)] = (
                num_ranks,
                fit_alpha_beta(op, num_ranks, list(points), list(points.values())),
            )
    return fits


@dataclass(frozen=True)
class Outlier:
    """A group whose fitted bandwidth is below SLOW_FRACTION of the median of its peers in
    the same series, with where it sits: the nodes it touches and its ranks' local ranks
    (across nodes, a local rank is the GPU whose NIC, its rail, carries the traffic)."""

    op: str
    link: str
    num_ranks: int
    ranks: list[int]
    node_indices: list[int]
    hostnames: list[str]
    local_ranks: list[int]
    fraction_of_median: float

    def describe(self) -> str:
        where = ", ".join(
            f"node {i} ({h})" for i, h in zip(self.node_indices, self.hostnames, strict=True)
        )
        locals_ = ", ".join(map(str, self.local_ranks))
        what = (
            f"NIC of local rank {locals_}"
            if self.link == INTER_NODE
            else f"local rank(s) {locals_}"
        )
        return (
            f"slow {self.link} {self.op} ({self.num_ranks} ranks): ranks {self.ranks} on {where}, "
            f"{what}, at {self.fraction_of_median:.0%} of the median of their peers"
        )


SLOW_FRACTION = 0.7


def group_bandwidths(rows: list[ResultRow], series: tuple) -> dict[int, float]:
    """group index -> fitted bandwidth of that group alone; a group whose fit never left the
    latency regime is left out (its 0 had named the fastest group of a near-latency sweep as the
    slow one: a review)."""
    op, _, _, num_ranks = series
    bandwidth_by_group = {}
    for group_index in dict.fromkeys(r.group_index for r in rows if series_key(r) == series):
        points = curve(rows, series, group_index)
        if len(points) >= 2:
            fit = fit_alpha_beta(op, num_ranks, list(points), list(points.values()))
            if fit.bandwidth_bytes_per_s is not None:
                bandwidth_by_group[group_index] = fit.bandwidth_bytes_per_s
    return bandwidth_by_group


def locate(
    ranks: list[int], nodes: list[list[int]], hostnames: list[str]
) -> tuple[list, list, list]:
    """(node indices, their hostnames, distinct local ranks) of a group's ranks."""
    node_indices = [i for i, node in enumerate(nodes) if set(node) & set(ranks)]
    local_ranks = sorted({node.index(r) for node in nodes for r in ranks if r in node})
    return node_indices, [hostnames[i] for i in node_indices], local_ranks


def find_outliers(
    rows: list[ResultRow], hostnames: list[str], nodes: list[list[int]]
) -> list[Outlier]:
    """Per series (op, link, mode, group size) with several groups: the slow groups, located.

    Intra-node groups name a node (a slow NVLink/PCIe switch or GPU); inter-node groups of
    one local rank per node name that local rank's NIC, and a slow pair names the two nodes.
    """
    outliers = []
    for series in series_keys(rows):
        bandwidth_by_group = group_bandwidths(rows, series)
        ranks_by_group = {r.group_index: r.ranks for r in rows if series_key(r) == series}
        for group_index in slow_outliers(bandwidth_by_group, SLOW_FRACTION):
            others = [b for g, b in bandwidth_by_group.items() if g != group_index]
            ranks = ranks_by_group[group_index]
            op, link, _, num_ranks = series
            outliers.append(
                Outlier(
                    op,
                    link,
                    num_ranks,
                    ranks,
                    *locate(ranks, nodes, hostnames),
                    bandwidth_by_group[group_index] / statistics.median(others),
                )
            )
    return outliers


def outlier_flags(rows: list[ResultRow], hostnames: list[str], nodes: list[list[int]]) -> list[str]:
    return [o.describe() for o in find_outliers(rows, hostnames, nodes)]


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


def is_tp_shaped(ranks: list[int], nodes: list[list[int]]) -> bool:
    """A TP group is a run of consecutive ranks in node order (rank order DP x PP x TP,
    planner/layout.py), starting at a multiple of its size."""
    order = [rank for node in nodes for rank in node]
    start = order.index(ranks[0])
    return start % len(ranks) == 0 and order[start : start + len(ranks)] == ranks


def curve_link(ranks: list[int], nodes: list[list[int]]) -> str:
    """The scope the planner prices a group of these ranks on: inside one node or across nodes."""
    return INTRA_NODE if any(set(ranks) <= set(node) for node in nodes) else INTER_NODE


def curves_section(
    rows: list[ResultRow], nodes: list[list[int]], op: str = ALL_REDUCE
) -> list[dict]:
    """Curves of op the planner reads, one per (link, group size): only series whose groups
    are consecutive ranks, as a TP (or EP) group of that size is; a rank-j-of-every-node
    group is a data-parallel shape and feeds the inter-node link figure, not a curve."""
    curves: dict[tuple[str, int], dict] = {}
    for series in series_keys(rows):
        series_op, _, mode, num_ranks = series
        groups = [r.ranks for r in rows if series_key(r) == series]
        if series_op != op or num_ranks < 2 or not all(is_tp_shaped(g, nodes) for g in groups):
            continue
        link = curve_link(groups[0], nodes)
        points = curve(rows, series)
        curves.setdefault(
            (link, num_ranks),
            {
                "link": link,
                "num_ranks": num_ranks,
                "mode": mode,
                "sizes_bytes": list(points),
                "median_seconds": [rounded(s) for s in points.values()],
            },
        )
    return sorted(curves.values(), key=lambda c: (c["link"] != INTRA_NODE, c["num_ranks"]))


def results_section(rows: list[ResultRow]) -> list[dict]:
    return [
        {k: rounded(v) if isinstance(v, float) else v for k, v in asdict(row).items()}
        for row in rows
    ]
