"""`plan explain` output: placement map, memory bars, collectives, Gantt, breakdown, sensitivity.

Everything is printed on one recording console, so --svg / --html save exactly what
was shown. Pictures are plain characters with styles on top: they read the same in a
pipe, a test, or an SVG.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from planner import units
from planner.cost.timeline import Block, Timeline
from planner.explain import (
    MAX_NODES_MAPPED,
    CollectiveRow,
    Explanation,
    GpuSlot,
    MemoryBar,
    PlacementMap,
    TimeBreakdown,
)
from planner.layout import Layout
from planner.render.common import (
    console,
    count,
    gib,
    ms_or_s,
    print_json,
    share_text,
    us,
    write_recording,
)
from planner.sensitivity import Flip, SensitivityReport

STAGE_STYLES = ("on dark_blue", "on dark_green", "on dark_red", "on purple4", "on dark_orange3",
                "on deep_sky_blue4", "on dark_olive_green3", "on grey35")
"""Background of a GPU cell by pipeline stage (cycled)."""
SEGMENT_CHARS = {"weights": "#", "gradients": "g", "optimizer": "o", "activations": "a",
                 "overhead": "x", "DeepEP buffers": "e", "drafter weights": "d", "KV cache": "k", "headroom": "-"}
SEGMENT_STYLES = {"weights": "bold white on blue", "gradients": "black on yellow", "optimizer": "white on magenta",
                  "activations": "black on cyan", "overhead": "white on grey39", "DeepEP buffers": "black on bright_white",
                  "drafter weights": "black on bright_yellow", "KV cache": "black on green",
                  "headroom": "grey50"}
BREAKDOWN_STYLES = {"compute": "black on cyan", "memory-bound work": "white on blue", "TP comm": "black on yellow",
                    "PP comm": "white on magenta", "DP comm exposed": "white on red", "bubble": "grey50",
                    "optimizer": "black on green"}
KIND_LETTER = {"forward": "F", "backward": "B", "decode": "D"}
KIND_STYLE = {"forward": "white on blue", "backward": "black on green", "decode": "white on blue"}
IDLE_CHAR = "."
BREAKDOWN_CHARS = "#=+*%~^&@$:;!?/o"
"""One per drawn breakdown segment, in order (a serving step has up to 9 besides the bubble, a
serving TTFT up to 14); beyond them they repeat (breakdown_lines)."""
MAX_NODES_DRAWN = MAX_NODES_MAPPED
"""Larger clusters repeat the pattern; the map shows the first nodes and says so."""
LABEL_GAP = 1
"""Columns between a block's label and the next block."""


def seconds(value: float) -> str:
    """ms below a second (us below a millisecond), else seconds."""
    return ms_or_s(value)


def heading(out: Console, title: str) -> None:
    out.print(Text(f"\n{title}", style="bold underline"))


# ---------------------------------------------------------------- placement map

def _slot_label(slot: GpuSlot, with_cp: bool, compact: bool) -> str:
    if slot.stage is None:
        return "unused"
    sep = "" if compact else " "
    cp = f"c{slot.cp_rank}{sep}" if with_cp else ""
    return f"s{slot.stage}{sep}{cp}t{slot.tp_rank}{sep}d{slot.dp_replica}"


def placement_lines(pm: PlacementMap, width: int) -> list[Text]:
    """One line of GPU cells per node, then a line of brackets under each TP group."""
    with_cp = pm.layout.cp > 1
    labels = [_slot_label(s, with_cp, False) for s in pm.slots]
    cell = max(len(label) for label in labels) + 2
    compact = 8 + pm.gpus_per_node * cell > width
    if compact:
        labels = [_slot_label(s, with_cp, True) for s in pm.slots]
        cell = max(len(label) for label in labels) + 1
    lines = []
    for node in range(min(pm.num_nodes, MAX_NODES_DRAWN)):
        slots = pm.slots[node * pm.gpus_per_node:(node + 1) * pm.gpus_per_node]
        row = Text(f"node {node:<3}")
        for slot, label in zip(slots, labels[node * pm.gpus_per_node:], strict=False):
            style = "grey50" if slot.stage is None else STAGE_STYLES[slot.stage % len(STAGE_STYLES)]
            row.append(label.center(cell - 1), style=style)
            row.append(" ")
        lines.append(row)
        lines.append(Text(" " * 8 + _brackets(pm, slots, cell), style="bold"))
    if pm.num_nodes > MAX_NODES_DRAWN:
        lines.append(Text(f"... {pm.num_nodes - MAX_NODES_DRAWN} more nodes, same pattern"))
    return lines


def _brackets(pm: PlacementMap, slots, cell: int) -> str:
    """[---- TP8 nvlink ----] under each run of GPUs of one TP group; < or > where the
    group continues on another node."""
    out, i = "", 0
    while i < len(slots):
        j = i
        key = (slots[i].dp_replica, slots[i].stage, slots[i].cp_rank)
        while j + 1 < len(slots) and (slots[j + 1].dp_replica, slots[j + 1].stage, slots[j + 1].cp_rank) == key:
            j += 1
        span = (j - i + 1) * cell - 1
        if slots[i].stage is None or pm.layout.tp == 1:
            out += " " * span + " "
        else:
            left = "<" if slots[i].tp_rank != 0 else "["
            right = ">" if slots[j].tp_rank != pm.layout.tp - 1 else "]"
            label = f" TP{pm.layout.tp} {pm.tp_link} "
            inner = label.center(span - 2, "-") if len(label) <= span - 2 else "-" * (span - 2)
            out += left + inner + right + " "
        i = j + 1
    return out


def ep_group_ranks_text(lay: Layout) -> str:
    """Whose ranks one EP group gathers: d = ep/tp TP groups, with CP the CP ranks first
    (Megatron's expert grid over a stage's tp*cp*dp ranks, Layout.ep)."""
    d = lay.dp_per_ep_group
    if lay.cp > 1:
        cp_ranks = min(d, lay.cp)
        dp_ranks = d // cp_ranks
        unit = f"{cp_ranks} CP ranks" + (f" x {dp_ranks} DP ranks" if dp_ranks > 1 else "")
    else:
        unit = f"{d} DP ranks"
    return f"the TP groups of {unit}" if lay.tp > 1 else unit


def placement_summary(pm: PlacementMap) -> list[str]:
    lay = pm.layout
    tp = "no tensor parallelism (tp=1)" if lay.tp == 1 else (
        f"TP groups of {lay.tp} {'span nodes' if pm.tp_crosses_node else 'inside each node'}, "
        f"all-reduces over {pm.tp_link}") + (
        " through host memory (no GPU peer-to-peer)"
        if pm.host_staged and lay.tp > 1 and not pm.tp_crosses_node else "")
    cells = "s<stage> c<cp rank> t<tp rank> d<dp replica>" if lay.cp > 1 else "s<stage> t<tp rank> d<dp replica>"
    titan = pm.training_engine == "torchtitan"
    order = (("torchtitan's device mesh (TP, then CP, then DP, stage outermost)" if titan else
              "Megatron's rank order (TP, then CP, then DP, stage outermost)") if pm.pp_outermost
             else "the serving engines' rank order (vLLM's and SGLang's: TP, then stage, DP outermost)")
    lines = [f"Cells are {cells}; colour = pipeline stage; {order}. {tp}."]
    if lay.cp > 1:
        kind = "CP groups" if titan else "CP rings"
        lines.append(f"{kind} of {lay.cp} ranks at stride {lay.tp} (each holds 1/{lay.cp} of every sequence).")
    if pm.ep_link is not None:
        d = lay.dp_per_ep_group
        ranks = ep_group_ranks_text(lay)
        where = (f"{pm.ep_ranks_per_node} GPUs on each of {pm.ep_num_nodes} nodes" if pm.ep_num_nodes > 1
                 else "inside one node")
        attention = ("; each DP rank attends its own sequences (data-parallel attention)" if d > lay.cp else "")
        groups = lay.num_ep_groups * lay.pp
        exchange = (f"every MoE layer's {pm.ep_exchange} over {pm.ep_link}" if pm.ep_exchange is not None
                    else "no exchange: every rank holds the TP group's tokens and the MLP's all-reduce sums the experts' outputs")
        lines.append(f"EP groups of {lay.ep} GPUs ({ranks}; {groups:,} group{'s' if groups > 1 else ''} over the stages), "
                     f"{where}: {exchange}{attention}.")
    if not pm.boundaries:
        lines.append("No pipeline boundaries (pp=1).")
        return lines
    total = pm.num_boundaries
    lines.append(f"{total:,} pipeline boundar{'y' if total == 1 else 'ies'} "
                 f"({lay.pp - 1} per replica x {lay.dp:,}{f' x {lay.cp} CP ranks' if lay.cp > 1 else ''}), "
                 f"{pm.num_boundaries_crossing_nodes:,} across nodes:")
    for b in pm.boundaries[:6]:
        where = f"node {b.from_node} -> node {b.to_node}" if b.from_node != b.to_node else f"inside node {b.from_node}"
        who = f"replica {b.dp_replica}" + (f" cp rank {b.cp_rank}" if lay.cp > 1 else "")
        lines.append(f"  {who}: stage {b.from_stage} -> {b.from_stage + 1}, {where}, over {b.link}")
    if total > 6:
        lines.append(f"  ... {total - 6:,} more")
    return lines


# ---------------------------------------------------------------- memory

def memory_lines(bars: tuple[MemoryBar, ...], width: int) -> list[Text]:
    """A bar per (group of) stage(s): segments scaled to capacity, headroom as '-'."""
    bar_width = max(20, min(80, width - 4))
    lines = []
    for bar in bars:
        lines.append(Text(f"{bar.label}: {gib(bar.used_bytes)} of {gib(bar.capacity_bytes)}, "
                          f"headroom {gib(bar.headroom_bytes)}", style="bold"))
        segments = [(s.name, s.bytes) for s in bar.segments] + [("headroom", max(bar.headroom_bytes, 0.0))]
        lines.append(_stacked(segments, bar.capacity_bytes, bar_width, SEGMENT_CHARS, SEGMENT_STYLES))
        budget_col = round(bar.budget_bytes / bar.capacity_bytes * bar_width)
        if budget_col < bar_width:
            lines.append(Text(" " * budget_col + "^ usable budget " + gib(bar.budget_bytes), style="grey62"))
        legend = "  ".join(f"{SEGMENT_CHARS.get(s.name, '?')} {s.name} {gib(s.bytes)}" for s in bar.segments)
        lines.append(Text(legend + (f"   ({bar.note})" if bar.note else ""), no_wrap=False))  # wraps
    return lines


def _stacked(segments: list[tuple[str, float]], total: float, width: int, chars: dict, styles: dict) -> Text:
    """Cumulative rounding, so the bar is exactly `width` columns and no segment drifts."""
    text, done, cum = Text(), 0, 0.0
    for name, value in segments:
        cum += max(value, 0.0)
        end = min(width, round(cum / total * width)) if total > 0 else 0
        if end > done:
            text.append(chars.get(name, "?") * (end - done), style=styles.get(name, ""))
            done = end
    if done < width:
        text.append(" " * (width - done))
    return text


# ---------------------------------------------------------------- collectives

def collectives_table(rows: tuple[CollectiveRow, ...]) -> Table:
    measured = any(r.measured_seconds is not None for r in rows)
    # a message above the probe's sweep is the curve continued (comm.extrapolation_seconds_per_byte)
    beyond = ("; measured: the probe's curve at the message's size, continued above its largest size at "
              "the seconds per byte of its largest sizes") if measured else ""
    table = Table(title="Collectives per layer (and pipeline sends per stage)", title_justify="left",
                  caption="time / step: each collective's time over the step before any overlap with compute; "
                          f"what stays exposed is in the time breakdown{beyond}", caption_justify="left")
    for header in ("phase", "collective", "kind", "group", "message", "link", "latency term",
                   "bandwidth term", "model"):
        table.add_column(header, justify="left" if header in ("phase", "collective", "kind", "link") else "right")
    if measured:
        table.add_column("measured", justify="right")
    for header in ("per step", "time / step"):
        table.add_column(header, justify="right")
    for r in rows:
        model_total = r.latency_seconds + r.bandwidth_seconds
        cells = [r.phase, r.name, r.kind, str(r.group_size), _bytes(r.message_bytes), r.link,
                 _short(r.latency_seconds), _short(r.bandwidth_seconds), _short(model_total)]
        if measured:
            cells.append("-" if r.measured_seconds is None else _short(r.measured_seconds))
        count = f"{r.count_per_step:,.0f}" if r.count_per_step >= 100 else f"{r.count_per_step:.3g}"
        cells += [f"{count} x", f"{r.share_of_step:.1%}"]
        table.add_row(*cells)
    return table


def _short(value: float) -> str:
    return us(value) if value < units.SECONDS_PER_MS else seconds(value)


def _bytes(num_bytes: float) -> str:
    if num_bytes >= units.BYTES_PER_GIB:
        return gib(num_bytes)
    if num_bytes >= units.BYTES_PER_MIB:
        return f"{num_bytes / units.BYTES_PER_MIB:.1f} MiB"
    if num_bytes >= units.BYTES_PER_KIB:
        return f"{num_bytes / units.BYTES_PER_KIB:.1f} KiB"
    return f"{num_bytes:.0f} B"  # a norm's partial sums: 8 B a token


# ---------------------------------------------------------------- timeline

def block_label(block: Block, timeline: Timeline) -> str:
    """F3 = forward of micro-batch 3 (1-based, as in the GPipe and Megatron-LM schedule figures); interleaved adds the
    chunk letter (F3a, F3b); serving: b1 t2 = batch 1's 2nd token."""
    if block.kind == "decode":
        return f"b{block.micro_batch + 1} t{block.step + 1}"
    chunk = chr(ord("a") + block.chunk) if timeline.num_virtual_stages > 1 else ""
    return f"{KIND_LETTER[block.kind]}{block.micro_batch + 1}{chunk}"


def _is_unit(timeline: Timeline) -> bool:
    return timeline.time_unit == "unit"


def timeline_scale(timeline: Timeline, width: int) -> tuple[float, int, bool]:
    """(columns per time unit, cell width or 0, labelled). Unit schedules get one cell of
    the widest label + a gap per shortest block when that fits; otherwise (and for
    seconds) the span is scaled to the width, and blocks are labelled only if every one
    of them has room (else letters, alternating case from one micro-batch to the next)."""
    labels = [block_label(b, timeline) for row in timeline.stages for b in row]
    label_cols = max(len(label) for label in labels) + LABEL_GAP
    shortest = min(b.end - b.start for row in timeline.stages for b in row)
    if _is_unit(timeline) and timeline.span * label_cols / shortest <= width:
        return label_cols / shortest, label_cols, True
    scale = width / timeline.span
    return scale, 0, math.floor(shortest * scale) >= label_cols


MIN_COLUMNS_TO_ALTERNATE = 2
"""Below this many columns per block, alternating case only aliases: the chart then shows
phases (forward, backward, idle), not single micro-batches (large m is summarised)."""


def _letter(block: Block) -> str:
    """Upper case for even micro-batches, lower for odd (each block spans a few columns)."""
    letter = KIND_LETTER[block.kind]
    return letter.lower() if block.micro_batch % 2 else letter


MIXED_CHAR = "x"
"""A phases-only column in which forwards and backwards both run (1F1B's steady state)."""
MIXED_SHARE = 0.25
"""The lesser phase's share of a column's busy time from which the column is drawn mixed: at
t_b = 2 t_f a steady one-forward-one-backward column is 1/3 forward."""


def phases_only(timeline: Timeline, scale: float) -> bool:
    """Whether some block is under MIN_COLUMNS_TO_ALTERNATE columns: single blocks would alias
    (a column's centre lands on whichever block is there, drawing runs of F or B that are not
    in the schedule), so each column shows what fills it (phase_chars)."""
    shortest = min((b.end - b.start for row in timeline.stages for b in row), default=0.0)
    return shortest * scale < MIN_COLUMNS_TO_ALTERNATE


def phase_chars(blocks: tuple[Block, ...], scale: float, num_cols: int) -> list[str | None]:
    """Per column: None where idle fills at least half of it, MIXED_CHAR where forward and
    backward each fill at least MIXED_SHARE of its busy time, else the letter of the phase
    that fills most."""
    covered: list[dict[str, float]] = [{} for _ in range(num_cols)]
    for b in blocks:
        for col in range(max(0, math.floor(b.start * scale)), min(num_cols, math.ceil(b.end * scale))):
            overlap = min(b.end * scale, col + 1) - max(b.start * scale, col)
            if overlap > 0:
                covered[col][b.kind] = covered[col].get(b.kind, 0.0) + overlap
    chars: list[str | None] = []
    for kinds in covered:
        busy = sum(kinds.values())
        if busy < 0.5:
            chars.append(None)
            continue
        ranked = sorted(kinds.items(), key=lambda item: -item[1])
        mixed = len(ranked) > 1 and ranked[1][1] >= MIXED_SHARE * busy
        chars.append(MIXED_CHAR if mixed else KIND_LETTER[ranked[0][0]])
    return chars


def _row_chars(blocks: tuple[Block, ...], timeline: Timeline, scale: float, cell: int,
               labelled: bool, num_cols: int) -> Text:
    if phases_only(timeline, scale):
        phases = phase_chars(blocks, scale, num_cols)
        text = Text()
        for ch in phases:
            kind = next((k for k, letter in KIND_LETTER.items() if letter == ch), None)
            style = "grey50" if ch is None else ("black on cyan" if kind is None else KIND_STYLE[kind])
            text.append(IDLE_CHAR if ch is None else ch, style=style)
        return text
    owner: list[Block | None] = [None] * num_cols
    for b in blocks:
        for col in range(max(0, math.floor(b.start * scale)), min(num_cols, math.ceil(b.end * scale))):
            if b.start <= (col + 0.5) / scale < b.end:
                owner[col] = b
    chars = [(" " if cell and col % cell else IDLE_CHAR) if owner[col] is None else _letter(owner[col])
             for col in range(num_cols)]
    if labelled:
        for b in blocks:
            cols = [c for c in range(num_cols) if owner[c] is b]
            label = block_label(b, timeline).ljust(len(cols))
            for c, ch in zip(cols, label, strict=False):
                chars[c] = ch
    text = Text()
    for col, ch in enumerate(chars):
        text.append(ch, style="grey50" if owner[col] is None else KIND_STYLE[owner[col].kind])
    return text


def _axis(timeline: Timeline, scale: float, cell: int, num_cols: int) -> str:
    """Unit numbers (1-based, at each unit's first column) when cells are drawn, else a
    tick every few columns with the time."""
    if cell:
        marks = [(round(u * scale), str(u + 1)) for u in range(math.ceil(timeline.span - 1e-9))]
    else:
        every = max(12, num_cols // 6)
        marks = [(col, _time_label(col / scale, timeline)) for col in range(0, num_cols, every)]
    ticks, free = [" "] * num_cols, 0
    for col, label in marks:
        if col >= free and col + len(label) <= num_cols:
            ticks[col:col + len(label)] = label
            free = col + len(label) + 1
    return "".join(ticks)


def _time_label(t: float, timeline: Timeline) -> str:
    if timeline.time_unit == "s":
        return f"|{seconds(t)}"
    return f"|{t:.1f}"


BUSY_COLUMNS = 26
"""Room after the chart for "busy 192 of 213 units"."""


def timeline_width(timeline: Timeline, width: int) -> int:
    """Columns left for the chart itself."""
    return max(20, width - len(f"stage {timeline.num_stages - 1}") - 2 - BUSY_COLUMNS)


def timeline_lines(timeline: Timeline, width: int) -> list[Text]:
    """The Gantt chart: an axis, one row per stage, busy time at the row's end."""
    name_width = len(f"stage {timeline.num_stages - 1}") + 2
    scale, cell, labelled = timeline_scale(timeline, timeline_width(timeline, width))
    num_cols = math.ceil(timeline.span * scale - 1e-9)
    lines = [Text(" " * name_width + _axis(timeline, scale, cell, num_cols), style="grey62")]
    for s, row in enumerate(timeline.stages):
        line = Text(f"stage {s}".ljust(name_width))
        line.append_text(_row_chars(row, timeline, scale, cell, labelled, num_cols))
        line.append(f"  busy {_busy(timeline, s)}")
        lines.append(line)
    return lines


def _busy(timeline: Timeline, stage: int) -> str:
    busy, span = timeline.busy(stage), timeline.span
    if _is_unit(timeline):
        return f"{busy:g} of {span:g} units"
    return f"{busy / span:.0%} of {seconds(span)}"


def timeline_legend(timeline: Timeline, labelled: bool, phases: bool = False) -> str:
    """`phases`: phases_only at the drawn scale."""
    if timeline.schedule == "decode":
        legend = "bN tK = batch N's K-th token; . = idle (waiting for the other stages or a send)"
    else:
        chunk = ", a/b/.. = model chunk" if timeline.num_virtual_stages > 1 else ""
        legend = f"F/B = forward/backward, number = micro-batch{chunk}; . = idle (bubble)"
        legend += f"; idle {timeline.idle_fraction:.0%} of device-time"
    if phases:
        mixed = f", {MIXED_CHAR} = forwards and backwards alternating" if timeline.schedule != "decode" else ""
        legend += (f"; blocks under {MIN_COLUMNS_TO_ALTERNATE} columns: each column shows what fills most of it"
                   f"{mixed}")
    elif not labelled:
        legend += "; too narrow to label: letters alternate case from one micro-batch to the next"
    return legend


def timeline_text(timeline: Timeline, width: int = 120) -> str:
    """The Gantt chart as plain text (what tests read)."""
    return "\n".join(line.plain for line in timeline_lines(timeline, width))


def print_timeline(out: Console, timeline: Timeline | None, caption: str) -> None:
    heading(out, f"Pipeline timeline: {caption}")
    if timeline is None:
        return
    lines = timeline_lines(timeline, out.width)
    for line in lines:
        out.print(line, no_wrap=True, overflow="crop")
    scale, _, labelled = timeline_scale(timeline, timeline_width(timeline, out.width))
    out.print(timeline_legend(timeline, labelled, phases_only(timeline, scale)), style="grey62")


# ---------------------------------------------------------------- breakdown

def breakdown_lines(b: TimeBreakdown, width: int) -> list[Text]:
    bar_width = max(20, min(80, width - 4))
    shown = [s for s in b.segments if s.seconds > 1e-9 * b.total_seconds]
    chars = {s.name: BREAKDOWN_CHARS[i % len(BREAKDOWN_CHARS)] for i, s in enumerate(shown)}
    chars["bubble"] = IDLE_CHAR
    bar = _stacked([(s.name, s.seconds) for s in shown], b.total_seconds, bar_width, chars, BREAKDOWN_STYLES)
    # "[=] TP comm", not "= TP comm": a glyph beside a number reads as arithmetic
    legend = "  ".join(f"[{chars[s.name]}] {s.name} {seconds(s.seconds)} ({share_text(s.seconds / b.total_seconds)})"
                       for s in shown)
    return [Text(f"{b.what}: {seconds(b.total_seconds)}", style="bold"), bar, Text(legend, no_wrap=False)]


# ---------------------------------------------------------------- sensitivity

def _flip(flip: Flip | None, report: SensitivityReport, below: bool, unit: str, scan_high: float) -> str:
    if flip is None:
        return f"none down to {report.scan_low:g}x" if below else f"none up to {scan_high:.3g}x"
    to = "nothing fits" if flip.to_layout is None else str(flip.to_layout)
    return f"{flip.factor:.2f}x ({flip.value:.3g} {unit}) -> {to}"


def sensitivity_lines(report: SensitivityReport) -> list[Text | Table]:
    step = f"+/-{report.step:.0%}"
    if report.survives:
        verdict = Text(f"robust: the recommendation {report.recommended} survives every input moved by {step}.",
                       style="bold green")
    else:
        movers = [k.label for k in report.knobs
                  if k.at_low != report.recommended or k.at_high != report.recommended]
        verdict = Text(f"fragile: the recommendation {report.recommended} changes when "
                       f"{', '.join(movers)} moves by {step}.", style="bold yellow")
    out: list[Text | Table] = [verdict]
    if report.explained != report.recommended:
        out.append(Text(f"The explained layout {report.explained} is not the recommendation ({report.recommended})."))
    table = Table(title="Recommendation with each input moved (one at a time)", title_justify="left")
    for header in ("input", "model value", f"at -{report.step:.0%}", f"at +{report.step:.0%}",
                   "flips below", "flips above"):
        table.add_column(header)
    for k in report.knobs:
        high = _same(k.at_high, report)
        if k.high_factor < 1 + report.step - 1e-9:
            high += f" (at {k.high_factor - 1:+.0%}: capped at 1)"
        table.add_row(k.label, f"{k.base_value:.3g} {k.unit}", _same(k.at_low, report), high,
                      _flip(k.flip_down, report, True, k.unit, k.scan_high),
                      _flip(k.flip_up, report, False, k.unit, k.scan_high))
    out.append(table)
    for m in report.metrics:
        out.append(Text(f"{_metric_name(m.name)}: {_metric(m.name, m.base)} "
                        f"(range {_metric(m.name, m.low)} .. {_metric(m.name, m.high)} over the {step} runs)"))
    for case in report.infeasible_under:
        out.append(Text(f"The explained layout no longer fits with {case}.", style="yellow"))
    return out


def _same(layout, report: SensitivityReport) -> str:
    if layout == report.recommended:
        return "same"
    return "nothing fits" if layout is None else str(layout)


METRIC_NAMES = {"tpot_seconds": "TPOT", "ttft_seconds": "TTFT", "throughput_tokens_per_second": "throughput",
                "step_time_seconds": "step time", "tokens_per_second": "throughput", "mfu": "MFU"}


def _metric_name(name: str) -> str:
    return METRIC_NAMES.get(name, name)


def _metric(name: str, value: float) -> str:
    if name.endswith("_seconds"):
        return seconds(value)
    if name.endswith("per_second"):
        return f"{count(value)} tok/s"
    return f"{value:.1%}" if name == "mfu" else f"{value:.3g}"


# ---------------------------------------------------------------- whole

def _metric_text(name: str, value: float, unit: str, percent_digits: int | None = None) -> str:
    if unit == "s":
        return f"{name} {seconds(value)}"
    if unit == "tok/s":
        return f"{name} {count(value)} tok/s"
    if unit == "fraction" and percent_digits is not None:  # as `plan`'s table writes MFU
        return f"{name} {value:.{percent_digits}%}"
    if unit == "fraction":  # as `plan`'s summary writes a share (0.4%, not 0%: a CLI read)
        return f"{name} {share_text(value)}"
    if unit == "count" and value != int(value):  # a mean (requests in flight at a rate)
        return f"{name} {value:.1f}"
    return f"{name} {value:g}"


def render_explanation(e: Explanation, out: Console) -> None:
    # serving: the aggregated search's best (a disaggregated deployment may win over it, which
    # `plan` decides; it had been called "the recommended layout" there: a CLI read)
    best, other = (("the best aggregated layout", "not the best aggregated layout") if e.workload == "serve"
                   else ("the recommended layout", "not the overall recommendation"))
    which = best if e.is_recommended else other
    out.print(Text(f"plan explain: {e.layout} for {e.model} on {e.cluster} ({e.workload}, "
                   f"objective {e.objective}; {which})", style="bold"))
    out.print(", ".join(_metric_text(m.name, m.value, m.unit, m.percent_digits) for m in e.metrics) + ".")
    for note in e.notes:
        out.print(f"Note: {note}")
    heading(out, "Placement")
    _print_all(out, placement_lines(e.placement, out.width))
    _print_all(out, placement_summary(e.placement))
    heading(out, "Memory per GPU, by stage")
    _print_all(out, memory_lines(e.memory, out.width))
    heading(out, "Communication")
    if e.collectives:
        out.print(collectives_table(e.collectives))
    else:
        out.print("No collectives: one GPU per replica (tp=1, pp=1).")
    print_timeline(out, e.timeline, e.timeline_caption)
    heading(out, "Time breakdown")
    _print_all(out, breakdown_lines(e.breakdown, out.width))
    if e.ttft_breakdown is not None:
        _print_all(out, breakdown_lines(e.ttft_breakdown, out.width))
    if e.sensitivity is not None:
        heading(out, "How sure we are")
        _print_all(out, sensitivity_lines(e.sensitivity))


def _print_all(out: Console, items: Iterable) -> None:
    """Bars are cropped to the width (they are drawn to it); a Text made with no_wrap=False
    (a legend) and anything else wraps."""
    for item in items:
        crop = isinstance(item, Text) and item.no_wrap is not False
        out.print(item, no_wrap=crop, overflow="crop" if crop else None)


def show(e: Explanation | None, *, timeline: Timeline | None = None, caption: str = "",
         json_output: bool = False, svg: str | None = None, html: str | None = None,
         out: Console | None = None) -> Console:
    """Print an explanation (or just a timeline), then save the recording if asked."""
    if json_output:
        print_json(e if e is not None else timeline)
        return out or console()
    out = out or console(record=bool(svg or html))
    if e is not None:
        render_explanation(e, out)
    else:
        print_timeline(out, timeline, caption)
    write_recording(out, svg, html)
    return out
