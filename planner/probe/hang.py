"""Which collective a hung probe was in, named from the workers' point markers. No torch.

Before each timed point (its warm-up included) every rank prints ``POINT_PREFIX start {json}``
naming it (op, link, the group's ranks, message bytes, its own rank and host) and
``POINT_PREFIX end {rank}`` when the point is done. The launcher, which already follows
torchrun's output for the progress lines, keeps each rank's open point (InFlight). When the
run ends by its deadline, or a rank fails with a timeout (NCCL's watchdog), the one-line error
names the collective each lagging rank was in (describe_open_points).

With NCCL the workers also keep PyTorch's flight recorder, which dumps every rank's recent
collectives when the watchdog times one out (flight_recorder_env); the error names the dump
files when they exist.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass

POINT_PREFIX = "@@plan-probe-point"
MAX_POINTS_NAMED = 3
"""Open points named in the error; more are counted ("and N more")."""
LINK_WORDS = {"intra_node": "intra-node", "inter_node": "inter-node", "world": "world"}
TIMEOUT_PATTERN = re.compile(r"time(d)?[ _-]?out", re.IGNORECASE)

FLIGHT_RECORDER_FILE_PREFIX = "plan-probe-nccl-trace-rank"
"""The dump of rank R is FLIGHT_RECORDER_FILE_PREFIX + R, in the directory of --out."""
FLIGHT_RECORDER_BUFFER_ENTRIES = 2000
"""Ring-buffer entries (a collective's start or end each): PyTorch 2.13's own default."""


@dataclass(frozen=True)
class Point:
    """One timed point of the sweep: one collective over one group at one message size."""

    op: str
    link: str
    ranks: tuple[int, ...]
    size_bytes: int


@dataclass(frozen=True)
class OpenPoint:
    """A point one rank started and has not finished; started_s on the launcher's clock."""

    point: Point
    rank: int
    host: str
    started_s: float


def start_line(point: Point, rank: int, host: str) -> str:
    fields = dict(op=point.op, link=point.link, ranks=list(point.ranks), size_bytes=point.size_bytes)
    return f"{POINT_PREFIX} start {json.dumps(dict(fields, rank=rank, host=host))}"


def end_line(rank: int) -> str:
    return f"{POINT_PREFIX} end {rank}"


class InFlight:
    """Each rank's open point, from the marker lines seen so far (this node's ranks only)."""

    def __init__(self) -> None:
        self.open_points: dict[int, OpenPoint] = {}

    def feed(self, line: str, now_s: float) -> bool:
        """Take a marker line; False for any other line. A malformed marker is ignored."""
        if not line.startswith(POINT_PREFIX):
            return False
        try:
            _, kind, payload = line.rstrip("\n").split(" ", 2)
            if kind == "end":
                self.open_points.pop(int(payload), None)
            elif kind == "start":
                fields = json.loads(payload)
                point = Point(
                    fields["op"], fields["link"], tuple(fields["ranks"]), int(fields["size_bytes"])
                )
                rank = int(fields["rank"])
                self.open_points[rank] = OpenPoint(point, rank, str(fields["host"]), now_s)
        except (ValueError, KeyError, TypeError):
            pass
        return True

    def describe(self, now_s: float) -> str | None:
        return describe_open_points(list(self.open_points.values()), now_s)


def describe_open_points(open_points: list[OpenPoint], now_s: float) -> str | None:
    """`all_reduce over ranks [2, 3] (intra-node, 1,048,576 B) did not finish within 30 s on
    rank 3 (host node1); ...`, the longest-open point first; None when no rank is in a point
    (a hang in the rendezvous or a barrier between points)."""
    if not open_points:
        return None
    by_point: dict[Point, list[OpenPoint]] = {}
    for open_point in sorted(open_points, key=lambda o: (o.started_s, o.rank)):
        by_point.setdefault(open_point.point, []).append(open_point)
    parts = [_describe_point(point, ranks, now_s) for point, ranks in by_point.items()]
    if len(parts) > MAX_POINTS_NAMED:
        parts = [*parts[:MAX_POINTS_NAMED], f"and {len(parts) - MAX_POINTS_NAMED} more"]
    return "; ".join(parts)


def _describe_point(point: Point, open_points: list[OpenPoint], now_s: float) -> str:
    open_seconds = max(0.0, now_s - min(o.started_s for o in open_points))
    where = ", ".join(f"rank {o.rank} (host {o.host})" for o in sorted(open_points, key=lambda o: o.rank))
    link = LINK_WORDS.get(point.link, point.link)
    # under a second open it had just started when the deadline came ("did not finish within 0 s"
    # blamed a healthy collective; a CLI read)
    running = (f"was still running ({open_seconds:.1f} s in; a longer --timeout may let it finish)"
               if open_seconds < 1 else f"did not finish within {open_seconds:.0f} s")
    return (
        f"{point.op} over ranks {list(point.ranks)} ({link}, {point.size_bytes:,} B) "
        f"{running} on {where}"
    )


def timed_out_message(timeout_seconds: float, hung: str | None, dumps: list[str]) -> str:
    """The run's deadline passed: the collective each lagging rank was in, when one was."""
    cause = f": {hung}" if hung else " (a rank hung or a node never joined the rendezvous)"
    return (
        f"probe timed out after {timeout_seconds:g} s{cause}; stopped torchrun and its "
        f"workers{dumps_note(dumps)}"
    )


def failed_message(summary: str, hung: str | None, dumps: list[str]) -> str:
    """A rank failed; when it timed out (NCCL's watchdog) the collective that hung comes first."""
    if hung and is_timeout(summary):
        return f"probe failed: {hung}; {summary}{dumps_note(dumps)}"
    return f"probe failed: {summary}{dumps_note(dumps)}"


def is_timeout(summary: str) -> bool:
    """Whether a rank's failure reads as a timeout (NCCL's watchdog, gloo's, a store's)."""
    return TIMEOUT_PATTERN.search(summary) is not None


def flight_recorder_env(dump_directory: str) -> dict[str, str]:
    """PyTorch's NCCL flight recorder: a ring buffer of each rank's collectives, dumped to
    dump_directory/FLIGHT_RECORDER_FILE_PREFIX<rank> when the watchdog times one out.

    Names as torch 2.13 reads them (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp:
    TORCH_NCCL_DUMP_ON_TIMEOUT "must be set together with TORCH_NCCL_ENABLE_MONITORING=1 and
    TORCH_NCCL_TRACE_BUFFER_SIZE > 0"; FlightRecorder.hpp reads TORCH_FR_BUFFER_SIZE first),
    and the dump file prefix under its current name (TORCH_FR_DUMP_TEMP_FILE) and the older
    one (TORCH_NCCL_DEBUG_INFO_TEMP_FILE, both in torch 2.13's libtorch; torchtitan PR 1748
    moved from the old to the new), so earlier torch 2.x reads them too
    (docs.pytorch.org torch_nccl_environment_variables, 2.4).
    """
    prefix = os.path.join(dump_directory, FLIGHT_RECORDER_FILE_PREFIX)
    entries = str(FLIGHT_RECORDER_BUFFER_ENTRIES)
    return {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": entries,
        "TORCH_FR_BUFFER_SIZE": entries,
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
    }


def flight_recorder_dumps(env: dict[str, str], since_s: float) -> list[str]:
    """The dump files this run wrote (modified since since_s, wall clock), sorted."""
    prefix = env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if not prefix:
        return []
    found = []
    for path in glob.glob(glob.escape(prefix) + "*"):
        try:
            if os.path.isfile(path) and os.path.getmtime(path) >= since_s:
                found.append(path)
        except OSError:
            continue
    return sorted(found)


def dumps_note(paths: list[str]) -> str:
    """`; NCCL flight-recorder dumps: DIR/PREFIX0, DIR/PREFIX1 (read them with torchfrtrace)`."""
    if not paths:
        return ""
    shown = ", ".join(paths[:2]) + (f" and {len(paths) - 2} more" if len(paths) > 2 else "")
    return f"; NCCL flight-recorder dumps: {shown} (read them with torchfrtrace)"
