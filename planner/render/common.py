"""Shared formatting: human units at display time only, from SI values."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner import units
from planner.emit.command import PER_NODE_VARIABLES, LaunchStep
from planner.errors import SpecError

if TYPE_CHECKING:  # rich is imported only to print, never for --json
    from rich.console import Console

    from planner.layout import Rejected

WIDE_COLUMNS = 160
"""Width used when output is not a terminal (pipes, files, tests), so tables stay whole."""


def console(stderr: bool = False, record: bool = False) -> Console:
    from rich.console import Console

    probe = Console(stderr=stderr)
    width = None if probe.is_terminal or os.environ.get("COLUMNS") else WIDE_COLUMNS
    return _console_class()(stderr=stderr, highlight=False, soft_wrap=False, width=width, record=record)


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console

    class QuietOnClosedPipe(Console):
        """A closed pipe (`plan ... | head`) silences the console and the command goes on
        to its own exit code; rich's default exits 1, which scripts read as "no feasible
        layout"."""

        def on_broken_pipe(self) -> None:
            self.quiet = True
            discard_stream(self.file)

    return QuietOnClosedPipe


def discard_stream(stream: Any) -> None:
    """Point a closed stdout/stderr at /dev/null (the Python docs' recipe for SIGPIPE), so
    what is still buffered does not raise again when the interpreter flushes at exit."""
    try:
        fileno = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (tests capture output)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fileno)
    os.close(devnull)


def write_stdout(text: str) -> None:
    """Write and flush; a closed pipe discards the rest (a full disk raises OSError, which
    the CLI reports in one line)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        discard_stream(sys.stdout)


def finish_output() -> str | None:
    """Flush stdout before exit: None when all went out (or the reader left), else why it
    could not be written (a full disk), with stdout discarded so the exit flush is quiet."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        discard_stream(sys.stdout)
    except OSError as exc:
        discard_stream(sys.stdout)
        return exc.strerror or str(exc)
    return None


MAX_REJECTED_SHOWN = 12
"""Rejected layouts listed when nothing fits and --show-rejected is not given (the closest
misses first); a 10**5-GPU cluster has thousands."""


def closest_misses(rejected: tuple[Rejected, ...], limit: int) -> tuple[list[Rejected], int]:
    """The rejections that came closest (layouts that fit but miss an SLA, the least miss first;
    then the smallest memory overshoot; then the rest in their order) and how many are left out.
    An SLA miss 4% over its limit had been left out behind eight memory failures (a CLI read)."""
    def key(i: int) -> tuple:
        r = rejected[i]
        if r.sla_miss_ratio > 0:
            return (0, r.sla_miss_ratio, i)
        return (1 if r.over_bytes > 0 else 2, r.over_bytes, i)

    order = sorted(range(len(rejected)), key=key)
    return [rejected[i] for i in order[:limit]], max(0, len(rejected) - limit)


def share_text(fraction: float) -> str:
    """A share (of a step, of a time breakdown): whole percent, one decimal below 1% but above 0
    (a 0.4% bubble read "bubble 0%" beside the table's 0.4%: a CLI read)."""
    if 0 < fraction < 0.0005:
        return "<0.1%"
    return f"{fraction:.1%}" if 0 < fraction < 0.01 - 0.0005 else f"{fraction:.0%}"


def gib(num_bytes: float) -> str:
    return f"{units.bytes_to_gib(num_bytes):.1f} GiB"


def ms(seconds: float) -> str:
    """us below a millisecond, ms to 10 s, seconds beyond (a queue's 4,718.9 s, not 4718911.2
    ms; a TTFT column of 77.6 s beside 179.0 s, not 77580.1 ms)."""
    if math.isinf(seconds):
        return "inf"
    if seconds >= MS_SHOWN_BELOW_SECONDS:
        return f"{seconds:,.1f} s"
    return f"{units.seconds_to_ms(seconds):.1f} ms" if seconds >= units.SECONDS_PER_MS else f"{units.seconds_to_us(seconds):.0f} us"


MS_SHOWN_BELOW_SECONDS = 10.0
"""ms() writes durations from this many seconds on in seconds."""


def ms_or_s(seconds: float, seconds_from: float = 1.0, decimals: int = 2) -> str:
    """A duration: ms (us below a millisecond) below `seconds_from`, else seconds with
    `decimals` places, thousands separated."""
    return ms(seconds) if seconds < seconds_from else f"{seconds:,.{decimals}f} s"


def us(seconds: float) -> str:
    return f"{units.seconds_to_us(seconds):.1f} us"


def billions(count: float) -> str:
    return f"{count / units.COUNT_PER_BILLION:.2f}B"


def gb_per_s(bytes_per_s: float) -> str:
    """Whole GB/s, or two significant digits below 10 (a measured host path: 0.055 GB/s, not 0)."""
    value = units.bytes_per_s_to_gb_per_s(bytes_per_s)
    return f"{value:.0f} GB/s" if value >= 10 else f"{value:.2g} GB/s"


def count(value: float) -> str:
    """A whole count with thousands separators; a positive value below one with its first
    significant digits (0.153 tok/s printed as 0 read as nothing served; found by a CLI sweep)."""
    if 0 < abs(value) < 1:
        return units.plain(value)
    return f"{value:,.0f}"


_PLAIN_JSON_TYPES = frozenset({str, int, bool, type(None)})


def to_jsonable(value: Any) -> Any:
    """Frozen dataclasses (and specs, planner.schema) to plain JSON, SI units as computed."""
    kind = type(value)
    if kind in _PLAIN_JSON_TYPES:  # most values of a plan: nothing to convert
        return value
    if kind is float:
        return None if math.isinf(value) or math.isnan(value) else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: to_jsonable(getattr(value, name)) for name in _field_names(kind)}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return None
    return value


@functools.cache
def _field_names(dataclass_type: type) -> tuple[str, ...]:
    """A dataclass's field names in order (dataclasses.fields, asked once per class)."""
    return tuple(f.name for f in dataclasses.fields(dataclass_type))


def print_json(payload: Any) -> None:
    write_stdout(json.dumps(to_jsonable(payload), indent=2) + "\n")


def print_json_rows(payload: dict[str, Any]) -> None:
    """A plan as JSON: one top-level key per line, and one line per item of a list of
    objects (each layout, each rejection), compact inside (`jq` pretty-prints). Written by
    json's C encoder: the indenting encoder is pure Python and took most of the run time
    of a plan with a thousand layouts."""
    lines = []
    for key, value in payload.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            text = "[\n" + ",\n".join(f"    {_compact(item)}" for item in value) + "\n  ]"
        else:
            text = _compact(value)
        lines.append(f"  {json.dumps(key)}: {text}")
    write_stdout("{\n" + ",\n".join(lines) + "\n}\n")


def _compact(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):  # a dataclass, or inf/nan: what to_jsonable makes of them
        return json.dumps(to_jsonable(value))


def step_json(step: LaunchStep) -> dict[str, Any]:
    """One launch step: its role, the nodes that run it (a range, or one repeated every
    `period` nodes, with its count), the argv and the shell line to paste."""
    nodes = step.nodes
    out: dict[str, Any] = {
        "role": step.role,
        "nodes": {"first": nodes.first, "length": nodes.length, "period": nodes.period,
                  "num_periods": nodes.num_periods, "count": nodes.count, "text": str(nodes)},
        "argv": list(step.argv),
        "shell": step.shell(),
    }
    if step.files:  # only launchers that read a config file (torchtitan) carry the key
        out["files"] = [{"path": f.path, "text": f.text} for f in step.files]
    return out


def per_node_lines(steps: tuple[LaunchStep, ...]) -> list[str]:
    """What each per-node shell variable in these steps stands for (nothing when none is used)."""
    used = {name for step in steps for name in step.variables()}
    if not used:
        return []
    return ["\nSet on each node before its command:"] + [
        f"  export {name}=...  # {meaning}" for name, meaning in PER_NODE_VARIABLES.items() if name in used]


def check_output_path(flag: str, path: str) -> None:
    """Before any work: `path` can take the file (--svg, --html): not a directory, in a
    directory that exists and accepts a new file (a read-only directory or /proc does not).
    An existing non-regular file (/dev/stdout, a pipe) is written in place."""
    if not path.strip():
        raise SpecError(f"{flag}: empty (give the file to write)")
    try:
        _check_output_path(flag, path)
    except OSError as exc:  # a name the OS refuses (too long, a loop of links)
        raise SpecError(f"{flag}: {path[:80]}: cannot write: {exc.strerror}") from None


def _check_output_path(flag: str, path: str) -> None:
    target = Path(path)
    if target.is_dir():
        raise SpecError(f"{flag}: {path}: is a directory (give a file name)")
    if target.exists() and not target.is_file():
        if not os.access(target, os.W_OK):
            raise SpecError(f"{flag}: {path}: not writable")
        return
    parent = target.parent
    if parent.exists() and not parent.is_dir():
        raise SpecError(f"{flag}: {path}: {parent} is not a directory")
    if not parent.is_dir():
        raise SpecError(f"{flag}: {path}: directory {parent} does not exist")
    try:
        handle, probe = tempfile.mkstemp(dir=parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise SpecError(f"{flag}: {path}: cannot write in {parent}: {exc.strerror}") from None
    os.close(handle)
    os.unlink(probe)


def write_output_files(files: list[tuple[str, str, str]]) -> None:
    """Every (flag, path, text) whole, or none of them: each regular file is written to a
    temporary file beside it first; only once all are written (and any non-regular target such
    as /dev/stdout written in place) are they renamed over their paths. A full disk or a
    failing device leaves no file, half-written or whole (--svg written and --html failing
    left the SVG behind; found by a CLI sweep)."""
    staged: list[tuple[str, Path, str, str]] = []  # (temporary, target, flag, path)
    in_place = []
    try:
        for flag, path, text in files:
            target = Path(path)
            if target.exists() and not target.is_file():
                in_place.append((flag, path, text))
                continue
            with _reported(flag, path):
                handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            staged.append((temporary, target, flag, path))
            with _reported(flag, path):
                with os.fdopen(handle, "w", encoding="utf-8") as out:
                    out.write(text)
                os.chmod(temporary, target.stat().st_mode & 0o7777 if target.exists() else _new_file_mode())
        for flag, path, text in in_place:
            with _reported(flag, path), Path(path).open("w", encoding="utf-8") as out:
                out.write(text)
        while staged:
            temporary, target, flag, path = staged[0]
            with _reported(flag, path):
                os.replace(temporary, target)
            staged.pop(0)
    finally:
        for temporary, *_ in staged:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


@contextlib.contextmanager
def _reported(flag: str, path: str) -> Iterator[None]:
    """An OSError writing `path` as the one-line usage error (SpecError) naming the flag."""
    try:
        yield
    except OSError as exc:
        raise SpecError(f"{flag}: {path}: cannot write: {exc.strerror or exc}") from None


def write_recording(out: Console, svg: str | None, html: str | None) -> None:
    """plan explain's recorded report as --svg and --html: both or neither (write_output_files)."""
    files = []
    if svg:
        files.append(("--svg", svg, out.export_svg(title="plan explain", clear=False)))
    if html:
        files.append(("--html", html, out.export_html(clear=False)))
    write_output_files(files)


def _new_file_mode() -> int:
    """What open() would give a new file under the process umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
