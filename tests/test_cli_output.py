"""Where the output goes: a closed pipe is quiet and keeps the command's own exit code, a
full disk is one line and exit 2, and --svg / --html paths are checked before any work
(and written whole)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
PLAN = ["--model", "llama-3.1-70b", "--cluster", "2x8xA100"]
TRAIN = ["--workload", "train", "--model", "llama-3.1-70b", "--cluster", "8x8xH100",
         "--global-batch", "512", "--seq-len", "4096"]
NOTHING_FITS = ["--model", "llama-3.1-405b", "--cluster", "1x1xH100"]


def _closed_pipe(repo_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run with stdout a pipe whose reader has already gone (what `| head` leaves behind
    once head exits): every write fails with EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "planner", *args], cwd=repo_root, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60, env=ENV)
    finally:
        os.close(write)


@pytest.mark.parametrize(("args", "code"), [
    (PLAN, 0), ([*PLAN, "--json"], 0), (TRAIN, 0), (["gpus"], 0),
    (["explain", *PLAN, "--no-sensitivity"], 0), (["explain", "--timeline-only"], 0),
    (NOTHING_FITS, 1),
], ids=["table", "json", "train", "gpus", "explain", "timeline", "nothing-fits"])
def test_closed_pipe_is_quiet_and_keeps_the_exit_code(repo_root, args, code) -> None:
    """rich's default turned the broken pipe into exit 1 ("no feasible layout" to a script)."""
    done = _closed_pipe(repo_root, *args)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    if code == 0:
        assert done.stderr == ""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [PLAN, [*PLAN, "--json"], ["gpus"], ["explain", "--timeline-only"]],
                         ids=["table", "json", "gpus", "timeline"])
def test_full_disk_is_one_line_exit_2(repo_root, args) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "planner", *args], cwd=repo_root, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60, env=ENV)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["plan: cannot write the output: No space left on device"]


def _output_path_cases(tmp: Path) -> dict[str, tuple[str, str, str]]:
    """case -> (flag, path, words of the message)."""
    return {
        "missing-directory": ("--svg", str(tmp / "no" / "such" / "x.svg"), "does not exist"),
        "under-a-file": ("--svg", str(tmp / "a-file" / "x.svg"), f"{tmp / 'a-file'} is not a directory"),
        "a-directory": ("--svg", str(tmp), "is a directory"),
        "proc": ("--html", "/proc/plan.html", "cannot write in /proc"),
        "proc-itself": ("--svg", "/proc", "is a directory"),
        "empty": ("--html", "", "empty"),
    }


@pytest.mark.parametrize("case", sorted(_output_path_cases(Path("/tmp"))))
@pytest.mark.parametrize("timeline_only", [False, True], ids=["explain", "timeline-only"])
def test_unwritable_svg_or_html_is_refused_before_any_work(run_plan, tmp_path, case, timeline_only) -> None:
    flag, path, words = _output_path_cases(tmp_path)[case]
    (tmp_path / "a-file").write_text("")  # a regular file where "under-a-file" wants a directory
    what = ["--timeline-only"] if timeline_only else [*PLAN, "--no-sensitivity"]
    done = run_plan("explain", *what, flag, path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "", "checked before rendering"
    (line,) = done.stderr.splitlines()
    assert line.startswith(flag) and words in line, line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_directory_is_refused(run_plan, tmp_path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        done = run_plan("explain", "--timeline-only", "--svg", str(locked / "x.svg"))
    finally:
        locked.chmod(0o755)
    assert done.returncode == 2 and done.stdout == ""
    assert "--svg" in done.stderr and "cannot write" in done.stderr


def test_svg_is_written_whole_and_replaces_an_old_file(run_plan, tmp_path) -> None:
    svg = tmp_path / "x.svg"
    svg.write_text("old")
    done = run_plan("explain", "--timeline-only", "--svg", str(svg))
    assert done.returncode == 0, done.stderr
    text = svg.read_text()
    assert text.startswith("<svg") and text.rstrip().endswith("</svg>")
    assert [p.name for p in tmp_path.iterdir()] == ["x.svg"], "no temporary file left behind"




@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_svg_and_html_are_written_both_or_neither(run_plan, tmp_path) -> None:
    """--html on a full device: exit 2 naming it, and the --svg beside it is not left written
    (it was, whole, before; found by a CLI sweep)."""
    svg = tmp_path / "x.svg"
    done = run_plan("explain", "--timeline-only", "--svg", str(svg), "--html", "/dev/full")
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["--html: /dev/full: cannot write: No space left on device"]
    assert list(tmp_path.iterdir()) == [], "no SVG, no temporary file"

HUGE_MODEL = """name: huge
num_hidden_layers: 4
hidden_size: 262144
num_attention_heads: 64
intermediate_size: 524288
vocab_size: 4194304
max_position_embeddings: 4096
"""


def test_nothing_fits_lists_the_closest_misses_and_counts_the_rest(run_plan, tmp_path) -> None:
    """72,072 GPUs have 1,638 serving layouts (1,620 whose degrees divide them, 18 of
    power-of-two replicas of 16-64 GPUs that leave some idle); with nothing feasible the table
    shows the 12 that miss by least (smallest overshoot first) and counts the rest;
    --show-rejected lists all."""
    model = tmp_path / "huge.yaml"
    model.write_text(HUGE_MODEL)
    done = run_plan("--model", str(model), "--cluster", "9009x8xH100")
    assert done.returncode == 1
    assert "the 12 closest of 1,638" in done.stdout and "1,626 more rejected" in done.stdout
    # the table's rows (the disaggregated clause names its largest worker's overshoot too)
    overshoots = [float(line.split(" by ")[1].split(" GiB")[0]) for line in done.stdout.splitlines()
                  if "exceed memory" in line and line.startswith("│")]
    assert len(overshoots) == 12 and overshoots == sorted(overshoots)
    every = run_plan("--model", str(model), "--cluster", "9009x8xH100", "--show-rejected")
    assert every.returncode == 1 and every.stdout.count("\n") > 1620


@pytest.mark.parametrize("args", [
    ("--model", "llama-3.1-405b", "--cluster", "1x1xL40S"),
    ("--workload", "train", "--model", "llama-3.1-405b", "--cluster", "1x1xL40S", "--global-batch", "8",
     "--seq-len", "2048"),
])
def test_no_feasible_layout_is_an_answer_on_stdout(repo_root: Path, args: tuple[str, ...]) -> None:
    """Nothing fits: serving and training both print why on stdout and exit 1; stderr stays
    for bad input (exit 2). One GPU is "1 GPU"."""
    done = subprocess.run([sys.executable, "-m", "planner", *args], cwd=repo_root, capture_output=True,
                          text=True, timeout=120, env=ENV)
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    assert "= 1 GPU," in done.stdout
    assert ("No feasible layout" in done.stdout) or ("No configuration fits" in done.stdout)
    assert "why not" in done.stdout
