"""Run torchrun as a child, follow its progress lines, enforce a timeout.

No torch here. torchrun is started in its own session and starts each
worker in another session of its own, so stopping the run means signalling
torchrun's group and every descendant's group (found through /proc on
Linux): SIGTERM, a short grace period, then SIGKILL. The run loop notes the
descendants as it goes, so workers orphaned by torchrun's death (kill -9,
the OOM killer) are still found; the workers also end themselves when
torchrun dies (planner.probe.lifeline). SIGINT, SIGTERM and SIGHUP are
recorded (deferred_stop_signals), never fatal mid-run: the loop stops the
tree and the caller cleans up. A dead rank makes torchrun exit non-zero; its
failure summary is boiled down to one line. The workers' point markers say which
collective each rank is in (planner.probe.hang): a run that ends by its deadline,
or by a rank's timeout, names the collective that hung.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from planner.probe import hang

PROGRESS_PREFIX = "@@plan-probe-progress"  # must match planner.probe.worker.PROGRESS_PREFIX
GRACE_SECONDS = 3.0
POLL_SECONDS = 0.2  # how soon the run loop sees a stop signal or torchrun's exit
NOTE_SECONDS = 1.0  # how often the run loop notes torchrun's descendants
TAIL_LINES = 400
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


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


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (field 3 onwards), or None when pid is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> str | None:
    """pid's start time (clock ticks since boot): with the pid it names one process, never a reused pid."""
    fields = _stat_fields(pid)
    return fields[19] if fields else None


def descendant_pids(root_pid: int) -> list[int]:
    """All descendants of root_pid (Linux /proc); empty where /proc is unavailable."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            children[int(fields[1])].append(int(entry))
    found, stack = [], [root_pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def note_descendants(process: subprocess.Popen, known: dict[int, str]) -> None:
    """Add torchrun's descendants to known (pid -> start time) while torchrun is not reaped:
    a reaped pid may be reused, and an orphaned worker is nobody's descendant any more."""
    if process.returncode is not None:
        return
    for pid in descendant_pids(process.pid):
        if pid not in known and (started := start_time(pid)) is not None:
            known[pid] = started


def _signal_groups(process: subprocess.Popen, known: dict[int, str], signum: int) -> None:
    """signum to torchrun's group (it leads a session) and to every known descendant's group
    (torchrun starts each worker in a session of its own)."""
    groups = {process.pid} if process.returncode is None else set()
    for pid, started in known.items():
        try:
            if start_time(pid) == started:
                groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    for group in groups:
        try:
            os.killpg(group, signum)
        except (ProcessLookupError, PermissionError):
            continue


def stop_process_tree(process: subprocess.Popen, known: dict[int, str] | None = None) -> None:
    """SIGTERM torchrun's group and every descendant's (known ones included, orphaned or
    not), a grace period for torchrun, then SIGKILL to all of them."""
    known = dict(known or {})
    note_descendants(process, known)
    _signal_groups(process, known, signal.SIGTERM)
    try:
        process.wait(timeout=GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        note_descendants(process, known)
    _signal_groups(process, known, signal.SIGKILL)
    process.wait()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def failure_summary(lines: list[str], return_code: int) -> str:
    """One line from torchrun's ChildFailedError report (root cause rank, exit code, reason)."""
    if return_code < 0:  # torchrun itself was killed (kill -9, the OOM killer): no report
        return f"torchrun died of {signal_name(-return_code)}"
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


class StopRequest:
    """The first stop signal (SIGINT, SIGTERM, SIGHUP) received while deferred_stop_signals
    is active; None until one arrives."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def record(self, signum: int, frame: object = None) -> None:
        if self.signum is None:
            self.signum = signum

    def raise_if_requested(self) -> None:
        if self.signum is None:
            return
        what = "interrupted" if self.signum == signal.SIGINT else "stopped"
        raise ProbeError(
            f"probe {what} by {signal_name(self.signum)}; torchrun and its workers stopped, "
            "nothing written"
        )


@contextlib.contextmanager
def deferred_stop_signals() -> Iterator[StopRequest]:
    """Record SIGINT, SIGTERM and SIGHUP instead of acting on them, for the duration.

    Python dies on the spot of SIGTERM and SIGHUP (what `timeout`, a batch scheduler
    or a closed terminal sends) and raises KeyboardInterrupt at any line on SIGINT;
    either way torchrun, in a session of its own, ran on. Recorded, the run loop
    sees the signal within POLL_SECONDS, stops torchrun and its workers, and raises
    ProbeError, so the caller's `with` blocks remove the temp dir. A signal the
    process ignores (nohup, a background job) stays ignored. Main thread only, as
    Python's signal handlers are.
    """
    stop = StopRequest()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, stop.record)
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def run_with_progress(
    argv: list[str],
    env: dict[str, str],
    timeout_seconds: float,
    on_progress: Callable[[ProgressEvent], None],
    on_output: Callable[[str], None] | None = None,
    stop: StopRequest | None = None,
) -> list[str]:
    """Run argv; call on_progress per progress line; return the other output lines.

    Raises ProbeError when the run fails, times out or is stopped (a signal recorded
    in stop, or KeyboardInterrupt where signals could not be deferred); the whole
    process tree is stopped first in every case.
    """
    stop = stop or StopRequest()
    stop.raise_if_requested()
    started_wall_s = time.time()
    run = _TorchrunRun(argv, env)
    try:
        in_time = run.follow(time.monotonic() + timeout_seconds, on_progress, on_output, stop)
    except KeyboardInterrupt:
        stop.record(signal.SIGINT)
        in_time = True
    if stop.signum is not None or not in_time:
        hung = run.in_flight.describe(time.monotonic())
        stop_process_tree(run.process, run.known)
        stop.raise_if_requested()
        raise ProbeError(
            hang.timed_out_message(timeout_seconds, hung, hang.flight_recorder_dumps(env, started_wall_s))
        )
    return_code = run.process.wait()
    if return_code != 0:
        hung = run.in_flight.describe(time.monotonic())
        stop_process_tree(run.process, run.known)
        summary = failure_summary(list(run.output), return_code)
        raise ProbeError(
            hang.failed_message(summary, hung, hang.flight_recorder_dumps(env, started_wall_s))
        )
    return list(run.output)


class _TorchrunRun:
    """torchrun started in a session of its own, its output pumped into a queue, and every
    descendant it had (pid -> start time), so workers orphaned by its death can be found."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
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
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.known: dict[int, str] = {}
        self.in_flight = hang.InFlight()
        threading.Thread(target=_pump, args=(self.process, self.lines), daemon=True).start()

    def follow(self, deadline, on_progress, on_output, stop: StopRequest) -> bool:
        """Dispatch output lines until it ends or a stop is requested; False if the deadline came first."""
        exited_at, noted_at = None, -NOTE_SECONDS
        while stop.signum is None:
            now = time.monotonic()
            if now > deadline:
                return False
            if now - noted_at >= NOTE_SECONDS:
                note_descendants(self.process, self.known)
                noted_at = now
            try:
                line = self.lines.get(timeout=POLL_SECONDS)
            except queue.Empty:
                # torchrun gone but an orphaned worker still holds the pipe: stop waiting for EOF
                if self.process.poll() is not None:
                    exited_at = exited_at or now
                    if now - exited_at > GRACE_SECONDS:
                        return True
                continue
            if line is None:
                return True
            if self.in_flight.feed(line, now):
                continue
            if (event := parse_progress(line)) is not None:
                on_progress(event)
            else:
                self.output.append(line)
                if on_output:
                    on_output(line)
        return True


def _pump(process: subprocess.Popen, lines: queue.Queue) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put(None)
