"""Rich rendering for `plan probe`: the progress bar and the results table.

Columns are declared explicitly (header, getter, formatter), as in the
core's render module; values arrive in SI and are formatted here only.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from planner import units
from planner.probe.results import ResultRow, curve, fit_name, series_key, series_keys
from planner.probe.runner import ProgressEvent
from planner.render.common import console as common_console


@contextlib.contextmanager
def progress_display() -> Iterator[Callable[[ProgressEvent], None]]:
    """A rich bar on a terminal; otherwise one stderr line per phase (readable in CI logs)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        last_phase = [""]

        def plain(event: ProgressEvent) -> None:
            phase = event.label.rsplit(" ", 2)[0]
            if phase != last_phase[0]:
                last_phase[0] = phase
                print(
                    f"plan probe: [{event.done_steps}/{event.total_steps}] {phase}",
                    file=sys.stderr,
                    flush=True,
                )

        yield plain
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("starting torchrun", total=None)

        def bar(event: ProgressEvent) -> None:
            progress.update(
                task, completed=event.done_steps, total=event.total_steps, description=event.label
            )

        yield bar


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{units.seconds_to_us(seconds):.1f}"


def _gb(bytes_per_s: float | None) -> str:
    return "-" if bytes_per_s is None else f"{units.bytes_per_s_to_gb_per_s(bytes_per_s):.3g}"


def print_report(rows: list[ResultRow], fits: dict, document: dict) -> None:
    console = common_console()
    table = Table(title="plan probe: medians at the largest size, and alpha-beta fits")
    columns = (
        ("link", lambda r, f: r.link),
        ("op", lambda r, f: r.op),
        ("mode", lambda r, f: r.mode),
        ("ranks", lambda r, f: str(len(r.ranks))),
        ("size B", lambda r, f: str(r.size_bytes)),
        ("time us", lambda r, f: _us(r.median_seconds)),
        ("algbw GB/s", lambda r, f: _gb(r.algbw_bytes_per_s)),
        ("busbw GB/s", lambda r, f: _gb(r.busbw_bytes_per_s)),
        ("spread", lambda r, f: f"{r.spread_fraction:.0%}"),
        ("fit alpha us", lambda r, f: _us(f.alpha_seconds) if f else "-"),
        ("fit beta GB/s", lambda r, f: _gb(f.bandwidth_bytes_per_s) if f else "-"),
    )
    for header, _ in columns:
        table.add_column(header, justify="left" if header in ("link", "op", "mode") else "right")
    for series in series_keys(rows):
        largest = max(curve(rows, series))
        row = max(
            (r for r in rows if series_key(r) == series and r.size_bytes == largest),
            key=lambda r: r.median_seconds,
        )
        fit = fits.get(fit_name(*series), (None, None))[1]
        table.add_row(*(getter(row, fit) for _, getter in columns))
    console.print(table)
    for key in ("intra_node", "inter_node"):
        if key in document:
            console.print(f"{key}: {document[key]}")
    for flag in document["measured"]["flags"]:
        console.print(f"[yellow]flag[/yellow]: {flag}", markup=True, highlight=False)
