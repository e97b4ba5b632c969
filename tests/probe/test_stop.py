"""Nothing of a probe outlives `plan probe`: a stop signal to it, or SIGKILL to torchrun, mid-sweep.

Real torchrun, gloo on CPU. Each run gets a TMPDIR of its own, which holds the launcher's
temp dir; torchrun's argv and every worker's carry the result path inside it, so every
process of the run is found by that marker in /proc/PID/cmdline (a zombie's is empty: it
counts as gone), orphaned or not.
"""

import contextlib
import os
import signal
import sys
import time

import pytest

from .conftest import SAFETY_TIMEOUT_S, WAIT_S, interrupted_at_exit, probe_env, start_long_run

pytestmark = [
    pytest.mark.usefixtures("needs_torch"),
    pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds processes through /proc"),
]

GONE_WITHIN_S = 5.0
"""How soon after the signal torchrun and every worker must be gone."""


def marked_pids(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except (OSError, NotADirectoryError):
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def still_running_after(marker: str, deadline: float) -> list[int]:
    """The marked processes left at the deadline (empty as soon as none is left)."""
    while (left := marked_pids(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture
def run_in_own_tmpdir(tmp_path):
    """A long two-rank run whose TMPDIR (its marker) is tmp_path/tmp; whatever of it is
    left at the end (a failed test) is killed, found by the marker."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    process = start_long_run(tmp_path, SAFETY_TIMEOUT_S, probe_env(TMPDIR=str(tmpdir)))
    with interrupted_at_exit([process]):
        yield process, tmpdir
    for pid in marked_pids(str(tmpdir)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def torchrun_and_workers_mid_sweep(process, marker):
    """(torchrun's pid, the workers' pids) once the sweep runs.

    Readiness is the first progress line on stderr: torchrun started, both ranks
    imported torch, joined the rendezvous and began measuring.
    """
    first_line = process.stderr.readline()
    assert first_line.startswith("plan probe: ["), f"ended before the sweep began: {first_line}"
    pids = marked_pids(marker)
    torchrun = [pid for pid in pids if parent_pid(pid) == process.pid]
    assert len(torchrun) == 1, pids
    workers = [pid for pid in pids if parent_pid(pid) == torchrun[0]]
    assert len(workers) == 2, pids
    return torchrun[0], workers


def assert_clean_end(process, stderr, tmpdir, last_line):
    lines = stderr.strip().splitlines()
    assert lines[-1] == last_line, stderr
    assert all(line.startswith("plan probe: [") for line in lines[:-1]), stderr  # progress only
    assert "Traceback" not in stderr
    assert process.returncode == 2
    assert not list(tmpdir.iterdir()), "the temp dir (and torchrun's logs in it) removed"
    assert not (tmpdir.parent / "never.yaml").exists()


@pytest.mark.parametrize(
    "signum, words",
    [(signal.SIGTERM, "stopped"), (signal.SIGHUP, "stopped"), (signal.SIGINT, "interrupted")],
    ids=["SIGTERM", "SIGHUP", "SIGINT"],
)
def test_a_stop_signal_to_plan_probe_ends_torchrun_and_every_worker(
    run_in_own_tmpdir, signum, words
):
    process, tmpdir = run_in_own_tmpdir
    marker = str(tmpdir)
    torchrun_and_workers_mid_sweep(process, marker)
    process.send_signal(signum)
    sent = time.monotonic()
    left = still_running_after(marker, sent + GONE_WITHIN_S)
    _, stderr = process.communicate(timeout=WAIT_S)
    assert left == [], f"still running {GONE_WITHIN_S:g} s after {signum.name}"
    name = signal.Signals(signum).name
    assert_clean_end(
        process,
        stderr,
        tmpdir,
        f"plan probe: probe {words} by {name}; torchrun and its workers stopped, nothing written",
    )


def test_torchrun_killed_takes_its_workers_with_it(run_in_own_tmpdir):
    """kill -9 (or the OOM killer) gives torchrun no chance to stop its workers, which run in
    sessions of their own: they end themselves (planner.probe.lifeline) and the launcher,
    which noted them, stops them too."""
    process, tmpdir = run_in_own_tmpdir
    marker = str(tmpdir)
    torchrun, workers = torchrun_and_workers_mid_sweep(process, marker)
    os.kill(torchrun, signal.SIGKILL)
    killed = time.monotonic()
    left = still_running_after(marker, killed + GONE_WITHIN_S)
    _, stderr = process.communicate(timeout=WAIT_S)
    assert left == [], f"workers {workers} still running {GONE_WITHIN_S:g} s after torchrun died"
    assert_clean_end(process, stderr, tmpdir, "plan probe: probe failed: torchrun died of SIGKILL")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_plan_probe_killed_takes_torchrun_and_its_workers_with_it(run_in_own_tmpdir):
    """SIGKILL to `plan probe` leaves it no chance to clean up: torchrun, started under the
    kernel's parent-death signal, dies with it, and the workers with torchrun. (The temp
    dir stays: nothing is left to remove it.)"""
    process, tmpdir = run_in_own_tmpdir
    marker = str(tmpdir)
    torchrun_and_workers_mid_sweep(process, marker)
    process.kill()
    killed = time.monotonic()
    left = still_running_after(marker, killed + GONE_WITHIN_S)
    process.communicate(timeout=WAIT_S)
    assert left == [], f"still running {GONE_WITHIN_S:g} s after plan probe was killed"
