"""Pipeline timelines, checked on the rendered text (the 4-stage forward example,
docs/cost-model.md#pipeline-bubble) and against the bubble formulas of cost/pipeline.py.

Worked example: 4 stages, 1 time unit per stage per micro-batch (forward).
1 micro-batch: 4 units in all, each device busy 1 (75% idle). 4 micro-batches:
4 + 4 - 1 = 7 units, every device busy 4, device d starts at unit d.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.pipeline import bubble_fraction
from planner.cost.timeline import decode_timeline, training_timeline
from planner.render.explain import timeline_text

CELL = 3
"""Columns per unit in the rendered 4-stage example: a label like F1 and one space."""


def rows_of(text: str) -> dict[int, list[str]]:
    """stage -> the chart's cells (CELL columns each), read back from the text."""
    lines = text.splitlines()
    start = lines[1].index("F") if "F" in lines[1] else lines[1].index(".")
    rows = {}
    for line in lines:
        if line.startswith("stage "):
            stage = int(line.split()[1])
            chart = line[start:line.index("  busy")]
            rows[stage] = [chart[i:i + CELL].strip() for i in range(0, len(chart), CELL)]
    return rows


def test_one_micro_batch_is_four_units_each_busy_one() -> None:
    text = timeline_text(training_timeline("gpipe", 4, 1, backward_units=0))
    rows = rows_of(text)
    assert rows == {
        0: ["F1", ".", ".", "."],
        1: [".", "F1", ".", "."],
        2: [".", ".", "F1", "."],
        3: [".", ".", ".", "F1"],
    }
    assert text.count("busy 1 of 4 units") == 4


def test_four_micro_batches_is_seven_units_each_busy_four() -> None:
    text = timeline_text(training_timeline("gpipe", 4, 4, backward_units=0))
    rows = rows_of(text)
    for d in range(4):
        expected = ["."] * d + ["F1", "F2", "F3", "F4"] + ["."] * (3 - d)
        assert rows[d] == expected, f"device {d}"
    assert text.count("busy 4 of 7 units") == 4
    assert text.splitlines()[0].split() == [str(u) for u in range(1, 8)]


def test_cli_timeline_only_draws_the_four_stage_example() -> None:
    result = CliRunner().invoke(app, ["explain", "--timeline-only", "--schedule", "gpipe", "--stages", "4",
                                      "--micro-batches", "4", "--forward-only"])
    assert result.exit_code == 0, result.output
    chart = "\n".join(line for line in result.output.splitlines() if line.startswith(("stage", "  ")))
    rows = rows_of(chart)
    assert rows[0] == ["F1", "F2", "F3", "F4", ".", ".", "."]
    assert rows[3] == [".", ".", ".", "F1", "F2", "F3", "F4"]


def test_cli_timeline_only_rejects_forward_only_1f1b() -> None:
    result = CliRunner().invoke(app, ["explain", "--timeline-only", "--schedule", "1f1b", "--forward-only"])
    assert result.exit_code == 2
    assert "--forward-only" in result.output


def test_one_f_one_b_steady_state_alternates() -> None:
    """p=4, m=8, t_b = 2 t_f: the last stage runs F1 B1 F2 B2 ...; step = (m+p-1)*3 = 33."""
    timeline = training_timeline("1f1b", 4, 8)
    last = [(b.kind[0], b.micro_batch + 1) for b in timeline.stages[3]]
    assert last[:4] == [("f", 1), ("b", 1), ("f", 2), ("b", 2)]
    assert timeline.span == pytest.approx(33)
    first = [(b.kind[0], b.micro_batch + 1) for b in timeline.stages[0]]
    assert first[:4] == [("f", 1), ("f", 2), ("f", 3), ("f", 4)], "p - s - 1 = 3 warm-up forwards, then F4"


def test_interleaved_shrinks_the_bubble_by_v() -> None:
    """p=4, m=8, v=2: idle (p-1)/(v*m + p-1) = 3/19; span = m*3 + (p-1)*3/v = 28.5."""
    timeline = training_timeline("interleaved", 4, 8, 2)
    assert timeline.span == pytest.approx(28.5)
    assert timeline.idle_fraction == pytest.approx(3 / 19)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 6), k=st.integers(1, 4), schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]),
       v=st.integers(2, 3))
def test_idle_fraction_matches_the_bubble_formula(p: int, k: int, schedule: str, v: int) -> None:
    m = k * p
    v = v if schedule == "interleaved" else 1
    timeline = training_timeline(schedule, p, m, v)
    assert timeline.idle_fraction == pytest.approx(bubble_fraction(p, m, v))
    for s in range(p):
        assert timeline.busy(s) == pytest.approx(3 * m)


def test_decode_round_is_the_serving_model() -> None:
    """k batches over p stages, step t, hop h: a round is max(k*t, p*(t+h)).
    p=2, k=2, t=1, h=0.1: stage 0 runs b1 at 0, b2 at 1; b1 is back after 1 + 0.1 + 1 + 0.1
    = 2.2, so its second token starts at 2.2 (round = 2 * 1.1 > 2 * 1). p=3, k=4: the
    stage is the bottleneck, round = 4 * 1 > 3 * 1.1."""
    timeline = decode_timeline((1.0, 1.0), 2, 0.1, 2)
    starts = [b.start for b in timeline.stages[0]]
    assert starts == pytest.approx([0.0, 1.0, 2.2, 3.2])
    assert [b.start for b in timeline.stages[1]] == pytest.approx([1.1, 2.1, 3.3, 4.3])
    busy_bound = decode_timeline((1.0, 1.0, 1.0), 4, 0.1, 3)
    rounds = [b.start for b in busy_bound.stages[0] if b.micro_batch == 0]
    assert rounds[2] - rounds[1] == pytest.approx(max(4 * 1.0, 3 * 1.1))


def test_large_m_is_summarised_to_the_width() -> None:
    text = timeline_text(training_timeline("1f1b", 8, 64), width=100)
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "busy 192 of 213 units" in text


def test_bad_schedules_are_value_errors() -> None:
    with pytest.raises(ValueError, match="at least as many micro-batches"):
        training_timeline("interleaved", 4, 3, 2)
    with pytest.raises(ValueError, match="backward"):
        training_timeline("1f1b", 4, 4, backward_units=0)


def test_interleaved_groups_when_stages_do_not_divide_the_micro_batches() -> None:
    """p = 4, m = 6, v = 2: Megatron's group is N = 6 (4 and 5 would leave a last group of 2 or 1,
    below p), so the table is micro-batches 0-5 on chunk 0, then 0-5 on chunk 1; stage 0 warms up
    (4-0-1)*2 + (2-1)*6 = 12 chunk forwards, all of them. Every chunk of every micro-batch runs
    once, forward and backward, on every stage (the planner recommends such schedules: --layout
    tp=8,pp=8 at 12 micro-batches; found by a CLI sweep)."""
    from planner.cost.timeline import interleaved_table

    assert interleaved_table(6, 2, 6) == [(mb, 0) for mb in range(6)] + [(mb, 1) for mb in range(6)]
    assert interleaved_table(4, 2, 4) == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (2, 1), (3, 1)]
    assert interleaved_table(5, 1, 2) == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0)]
    timeline = training_timeline("interleaved", 4, 6, 2)
    for stage in timeline.stages:
        done = sorted((b.kind, b.micro_batch, b.chunk) for b in stage)
        assert done == sorted((kind, mb, chunk) for kind in ("forward", "backward") for mb in range(6) for chunk in range(2))


def test_blocks_narrower_than_two_columns_draw_phases_not_aliases() -> None:
    """p = 2, m = 64, v = 4: 2 p m v = 1,024 blocks of 0.25 (chunk forward) and 0.5 units
    (chunk backward) over ~195 units in 94 columns (2.1 units each). Sampling each column's
    centre drew runs of six F columns and twelve B columns in the steady state, where every
    stage alternates one chunk forward and one chunk backward; each column now shows what fills
    it: warm-up forwards (stage 0 warms up (2-0-1)*2 + 3*2 = 8 chunk forwards, 2 units, one
    column), x where both run, the cool-down backwards at the end."""
    text = timeline_text(training_timeline("interleaved", 2, 64, 4), width=140)
    rows = [line.split()[2] for line in text.splitlines()[1:]]
    for row in rows:
        assert row[0] == "F" and row[-1] == "B"
        middle = row[len(row) // 10: -len(row) // 10]
        assert set(middle) == {"x"}, row
