"""A torchrun worker ends when torchrun ends, even when torchrun dies of SIGKILL;
torchrun ends when `plan probe` does.

torchrun starts every worker in a session of its own, so when torchrun is
killed without cleaning up (kill -9, the OOM killer) nothing reaches its
workers: orphaned, they run on until a collective times out. Two watches,
armed first thing in the worker (no torch here):
- Linux: prctl(PR_SET_PDEATHSIG, SIGKILL), the kernel kills the worker as its
  parent exits (man 2 prctl; the parent is the thread that forked it, which
  for torchrun is its main thread);
- everywhere: a daemon thread polls os.getppid() and exits the process when
  it changed (re-parented to init or a subreaper). Collectives release the GIL,
  so the thread runs while the main thread waits in one.

The launcher starts torchrun through ``python -m planner.probe.lifeline PID
COMMAND...``, which sets the kernel watch on itself and execs COMMAND (the
watch survives exec), so torchrun dies with `plan probe` even of SIGKILL,
and its workers then die with it. Linux only: elsewhere the exec is plain.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import NoReturn

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_SECONDS = 0.5
EXIT_CODE_PARENT_GONE = 1


def set_parent_death_signal(signum: int = signal.SIGKILL) -> bool:
    """Ask Linux to send signum to this process when its parent exits; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # deferred: the launcher imports this module on every `plan` start

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(parent_pid: int, poll_seconds: float = POLL_SECONDS) -> None:
    """Exit this process as soon as its parent is no longer parent_pid.

    parent_pid is read at start-up (before slow imports), so a parent that died
    in the meantime is caught by the first check, which the kernel watch cannot do.
    """
    set_parent_death_signal()
    if os.getppid() != parent_pid:
        os._exit(EXIT_CODE_PARENT_GONE)
    threading.Thread(
        target=_poll_parent, args=(parent_pid, poll_seconds), name="lifeline", daemon=True
    ).start()


def _poll_parent(parent_pid: int, poll_seconds: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(poll_seconds)
    os._exit(EXIT_CODE_PARENT_GONE)


def watched_argv(argv: list[str]) -> list[str]:
    """argv, run so that it is killed when this process dies (see exec_watched)."""
    return [sys.executable, "-m", "planner.probe.lifeline", str(os.getpid()), *argv]


def exec_watched(args: list[str]) -> NoReturn:
    """PARENT_PID COMMAND...: exec COMMAND, killed by the kernel when PARENT_PID dies."""
    parent_pid, command = int(args[0]), args[1:]
    set_parent_death_signal()
    if os.getppid() != parent_pid:  # the launcher died before the watch was set
        os._exit(EXIT_CODE_PARENT_GONE)
    os.execv(command[0], command)


if __name__ == "__main__":
    exec_watched(sys.argv[1:])
