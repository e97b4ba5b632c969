"""Shared formatting: human units at display time only, from SI values."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import TYPE_CHECKING, Any

from planner import units
from planner.emit.command import PER_NODE_VARIABLES, LaunchStep

if TYPE_CHECKING:  # rich is imported only to print, never for --json
    from rich.console import Console

WIDE_COLUMNS = 160
"""Width used when output is not a terminal (pipes, files, tests), so tables stay whole."""


def console(stderr: bool = False, record: bool = False) -> Console:
    from rich.console import Console

    probe = Console(stderr=stderr)
    width = None if probe.is_terminal or os.environ.get("COLUMNS") else WIDE_COLUMNS
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width, record=record)


def gib(num_bytes: float) -> str:
    return f"{units.bytes_to_gib(num_bytes):.1f} GiB"


def ms(seconds: float) -> str:
    if math.isinf(seconds):
        return "inf"
    return f"{units.seconds_to_ms(seconds):.1f} ms" if seconds >= units.SECONDS_PER_MS else f"{units.seconds_to_us(seconds):.0f} us"


def us(seconds: float) -> str:
    return f"{units.seconds_to_us(seconds):.1f} us"


def billions(count: float) -> str:
    return f"{count / units.COUNT_PER_BILLION:.2f}B"


def gb_per_s(bytes_per_s: float) -> str:
    return f"{units.bytes_per_s_to_gb_per_s(bytes_per_s):.0f} GB/s"


def count(value: float) -> str:
    return f"{value:,.0f}"


def to_jsonable(value: Any) -> Any:
    """Frozen dataclasses (and pydantic models) to plain JSON, SI units as computed."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return None
    return value


def print_json(payload: Any) -> None:
    print(json.dumps(to_jsonable(payload), indent=2))


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
    sys.stdout.write("{\n" + ",\n".join(lines) + "\n}\n")


def _compact(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):  # a dataclass, or inf/nan: what to_jsonable makes of them
        return json.dumps(to_jsonable(value))


def step_json(step: LaunchStep) -> dict[str, Any]:
    """One launch step: its role, the nodes that run it (a range, or one repeated every
    `period` nodes, with its count), the argv and the shell line to paste."""
    nodes = step.nodes
    return {
        "role": step.role,
        "nodes": {"first": nodes.first, "length": nodes.length, "period": nodes.period,
                  "num_periods": nodes.num_periods, "count": nodes.count, "text": str(nodes)},
        "argv": list(step.argv),
        "shell": step.shell(),
    }


def per_node_lines(steps: tuple[LaunchStep, ...]) -> list[str]:
    """What each per-node shell variable in these steps stands for (nothing when none is used)."""
    used = {name for step in steps for name in step.variables()}
    if not used:
        return []
    return ["\nSet on each node before its command:"] + [
        f"  export {name}=...  # {meaning}" for name, meaning in PER_NODE_VARIABLES.items() if name in used]
