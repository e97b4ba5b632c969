"""Run torchrun as a child, follow its progress lines, enforce a timeout.

No torch here. torchrun is started in its own session and starts each
worker in another session of its own, so stopping the run means signalling
torchrun's group and every descendant's group (found through /proc on
Linux): SIGTERM, a short grace period, then SIGKILL. A dead rank makes
torchrun exit non-zero; its failure summary is boiled down to one line.
"""

from __future__ import annotations

import collections
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

PROGRESS_PREFIX = "@@plan-probe-progress"  # must match planner.probe.worker.PROGRESS_PREFIX
GRACE_SECONDS = 3.0
TAIL_LINES = 400


class ProbeError(Exception):
    """A failure the user can act on: printed as one line, exit code 2."""


@dataclass(frozen=True)
class ProgressEvent:
    done_steps: int
    total_steps: int
    label: str


def parse_progress(line: str) -> ProgressEvent | None:
    if not line.startswith(PROGRESS_PREFIX):
        return None
    _, done, total, label = line.rstrip("\n").split(" ", 3)
    return ProgressEvent(int(done), int(total), label)


def descendant_pids(root_pid: int) -> list[int]:
    """All descendants of root_pid (Linux /proc); empty where /proc is unavailable."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children[int(fields[1])].append(int(entry))
    found, stack = [], [root_pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        for send in (lambda p: os.killpg(os.getpgid(p), signum), lambda p: os.kill(p, signum)):
            try:
                send(pid)
                break
            except (ProcessLookupError, PermissionError):
                continue


def stop_process_tree(process: subprocess.Popen) -> None:
    """SIGTERM torchrun and every descendant's process group, then SIGKILL what is left."""
    pids = [process.pid, *descendant_pids(process.pid)]
    _signal_all(pids, signal.SIGTERM)
    try:
        process.wait(timeout=GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    _signal_all([process.pid, *descendant_pids(process.pid), *pids], signal.SIGKILL)
    process.wait()


def failure_summary(lines: list[str], return_code: int) -> str:
    """One line from torchrun's ChildFailedError report (root cause rank, exit code, reason)."""
    text = "".join(lines)
    root = text.split("Root Cause", 1)[-1]
    rank = re.search(r"rank\s*:\s*(\d+)", root)
    host = re.search(r"host\s*:\s*(\S+)", root)
    exitcode = re.search(r"exitcode\s*:\s*(-?\d+)", root)
    signal_line = re.search(r"Signal \d+ \((\w+)\)", root)
    errors = re.findall(r"^\s*(\w+(?:Error|Exception|Timeout)\b:.*)$", text, re.MULTILINE)
    if rank and exitcode:
        where = f" on {host.group(1)}" if host else ""
        if signal_line:
            return f"rank {rank.group(1)}{where} died of {signal_line.group(1)}"
        reason = errors[-1].strip() if errors else f"exit code {exitcode.group(1)}"
        return f"rank {rank.group(1)}{where} failed: {reason}"[:400]
    if errors:
        return errors[-1].strip()[:400]
    return f"torchrun exited with code {return_code}"


def run_with_progress(
    argv: list[str],
    env: dict[str, str],
    timeout_seconds: float,
    on_progress: Callable[[ProgressEvent], None],
    on_output: Callable[[str], None] | None = None,
) -> list[str]:
    """Run argv; call on_progress per progress line; return the other output lines.

    Raises ProbeError when the run fails, times out or is interrupted; the
    whole process tree is stopped first in every case.
    """
    process = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_pump, args=(process, lines), daemon=True)
    reader.start()
    output: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    deadline = time.monotonic() + timeout_seconds
    try:
        finished, exited_at = False, 0.0
        while not finished:
            if time.monotonic() > deadline:
                stop_process_tree(process)
                raise ProbeError(
                    f"probe timed out after {timeout_seconds:g} s (a rank hung or a node never joined "
                    "the rendezvous); stopped torchrun and its workers"
                )
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                # torchrun gone but an orphaned worker still holds the pipe: stop waiting for EOF
                if process.poll() is not None:
                    exited_at = exited_at or time.monotonic()
                    finished = time.monotonic() - exited_at > GRACE_SECONDS
                continue
            if line is None:
                finished = True
            elif (event := parse_progress(line)) is not None:
                on_progress(event)
            else:
                output.append(line)
                if on_output:
                    on_output(line)
    except KeyboardInterrupt:
        stop_process_tree(process)
        raise ProbeError("probe interrupted; stopped torchrun and its workers") from None
    return_code = process.wait()
    if return_code != 0:
        stop_process_tree(process)
        raise ProbeError(f"probe failed: {failure_summary(list(output), return_code)}")
    return list(output)


def _pump(process: subprocess.Popen, lines: queue.Queue) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put(None)
