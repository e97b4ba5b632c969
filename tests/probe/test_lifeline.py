"""A watched process ends when its parent is killed -9, by either watch alone (no torch)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from .conftest import REPO_ROOT, probe_env

CHILD = textwrap.dedent(
    """
    import os, sys, time
    from planner.probe import lifeline
    if sys.argv[1] == "poll":  # the portable watch alone
        lifeline.set_parent_death_signal = lambda *args: False
    lifeline.watch_parent(os.getppid(), poll_seconds=0.1)
    print(os.getpid(), flush=True)
    time.sleep(600)
    """
)
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    time.sleep(600)
    """
)


def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")
@pytest.mark.parametrize("watch", ["kernel", "poll"])
def test_a_watched_child_dies_with_its_parent(watch):
    if watch == "kernel" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, watch],
        env=probe_env(),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = None
    try:
        child = int(parent.stdout.readline())  # printed once the watch is armed
        assert state(child) not in (None, "Z")
        parent.kill()
        parent.wait()
        give_up = time.monotonic() + 5
        while state(child) not in (None, "Z") and time.monotonic() < give_up:
            time.sleep(0.05)
        assert state(child) in (None, "Z"), f"child still {state(child)} 5 s after its parent died"
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        parent.stdout.close()
        if child is not None and state(child) not in (None, "Z"):
            os.kill(child, signal.SIGKILL)
