"""Independent computations spread over the machine's cores.

`plan explain`'s sensitivity analysis re-plans the whole search some 80 times, one input at a
time (sensitivity.analyze); the inputs are independent of each other, so each core takes the
next input not yet claimed. Workers are forked (Linux): they inherit the function and its
arguments as they are, nothing is pickled on the way in, and only each item's result comes
back through a pipe. Where fork is not the platform's way (macOS, Windows) or one core is
usable, the items run one after another in this process. Either way the results are the same
values, in the items' order: each item's computation is a pure function of that item.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
U = TypeVar("U")

_spread = False
"""True while this process takes part in a map over several workers (as a forked worker, or
as the parent of some): a map nested in it runs one item after another (forking again would
oversubscribe the cores the others already use)."""


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def forking_available() -> bool:
    """Fork is safe and the default only on Linux (macOS forks badly with system frameworks)."""
    import multiprocessing  # here, not at import: a plan that runs on one core never loads it

    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def map_in_workers(fn: Callable[[T], U], items: Sequence[T], num_workers: int | None = None) -> list[U]:
    """[fn(item) for item in items], on up to `num_workers` cores (default: every usable one).
    Each worker sends each result as soon as it has it, and this process, which takes items
    too, reads them between its own, so no worker waits on a full pipe and little is left to
    read at the end. The first exception any item raises is raised here (a worker's is sent
    back pickled)."""
    items = list(items)
    workers = min(len(items), num_workers if num_workers is not None else usable_cpus())
    if workers <= 1 or _spread or not forking_available():
        return [fn(item) for item in items]
    return _spread_over(fn, items, workers)


def _spread_over(fn: Callable[[T], U], items: list[T], workers: int) -> list[U]:
    global _spread
    import multiprocessing

    context = multiprocessing.get_context("fork")
    next_index = context.Value("i", 0)
    sys.stdout.flush()  # a child must not inherit (and flush again) what is buffered here
    sys.stderr.flush()
    children = []
    finished = False
    _spread = True
    try:
        for _ in range(workers - 1):
            receive, send = context.Pipe(duplex=False)
            # the worker closes every read end it inherits (its own and the earlier workers'):
            # a worker whose reader is gone then gets a broken pipe, never a write that blocks
            inherited = [receive, *(c.receive for c in children)]
            child = context.Process(target=_child, args=(fn, items, next_index, send, inherited, os.getpid()),
                                    daemon=True)
            try:
                child.start()
            except OSError:  # no process to be had (a limit): the ones started, or this one, do it all
                receive.close()
                send.close()
                break
            send.close()
            children.append(_Child(receive, child))
        results: dict[int, U] = {}
        while (index := _claim(next_index, len(items))) is not None:
            results[index] = fn(items[index])
            for child in children:
                child.read(results, block=False)
        for child in children:
            child.read(results, block=True)
        finished = True
    finally:
        _spread = False
        for child in children:
            if not finished:  # an item failed: the others' work is not wanted
                child.process.terminate()
            child.process.join()
            child.receive.close()
    return [results[index] for index in range(len(items))]


class _Child:
    """A worker process and the pipe its results come back on."""

    def __init__(self, receive: Any, process: Any) -> None:
        self.receive, self.process, self.done = receive, process, False

    def read(self, results: dict, block: bool) -> None:
        """Take what the worker has sent (block: until it says it is done) into `results`;
        raise what it reports."""
        while not self.done and (block or self.receive.poll()):
            try:
                message = self.receive.recv()
            except EOFError:
                raise RuntimeError(f"a worker process exited (code {self.process.exitcode}) "
                                   "before reporting") from None
            if message[0] == "error":
                raise message[1]
            if message[0] == "done":
                self.done = True
            else:
                results[message[1]] = message[2]


def _claim(next_index: Any, num_items: int) -> int | None:
    """The next unclaimed item's index, None when every item is taken."""
    with next_index.get_lock():
        index = next_index.value
        next_index.value = index + 1
    return index if index < num_items else None


def _child(fn: Callable[[T], U], items: list[T], next_index: Any, send: Any, inherited: list[Any],
           parent_pid: int) -> None:
    global _spread
    _spread = True
    for connection in inherited:
        connection.close()
    _die_with(parent_pid)
    _detach_output()
    try:
        while (index := _claim(next_index, len(items))) is not None:
            send.send(("item", index, fn(items[index])))
        send.send(("done",))
    except BaseException as error:  # reported to the parent, which raises it
        try:
            send.send(("error", error))
        except Exception:  # an exception that does not pickle: its text
            send.send(("error", RuntimeError(f"{type(error).__name__}: {error}")))
    finally:
        send.close()


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when its parent exits (Linux)."""


def _die_with(parent_pid: int) -> None:
    """Be killed when the parent exits, however it exits (a SIGKILL, the OOM killer): a
    worker's results have no other reader, and it would keep the parent's output open."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl: the broken pipe stops it at its next result
        pass
    if os.getppid() != parent_pid:  # the parent exited before the request took effect
        os._exit(1)


def _detach_output() -> None:
    """Point the worker's stdout and stderr at /dev/null: it reports through its pipe only, and a
    reader of the parent's output (`| tee`, a scheduler) must not wait on a worker's copy."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
