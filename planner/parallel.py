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

import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
U = TypeVar("U")


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def forking_available() -> bool:
    """Fork is safe and the default only on Linux (macOS forks badly with system frameworks)."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def map_in_workers(fn: Callable[[T], U], items: Sequence[T], num_workers: int | None = None) -> list[U]:
    """[fn(item) for item in items], on up to `num_workers` cores (default: every usable one).
    The first exception any item raises is raised here (a worker's is sent back pickled)."""
    items = list(items)
    workers = min(len(items), num_workers if num_workers is not None else usable_cpus())
    if workers <= 1 or not forking_available():
        return [fn(item) for item in items]
    context = multiprocessing.get_context("fork")
    next_index = context.Value("i", 0)
    sys.stdout.flush()  # a child must not inherit (and flush again) what is buffered here
    sys.stderr.flush()
    children = []
    finished = False
    try:
        for _ in range(workers - 1):
            receive, send = context.Pipe(duplex=False)
            child = context.Process(target=_child, args=(fn, items, next_index, send), daemon=True)
            child.start()
            send.close()
            children.append((receive, child))
        results = dict(_claim_and_run(fn, items, next_index))
        for receive, child in children:
            try:
                status, payload = receive.recv()
            except EOFError:
                raise RuntimeError(f"a worker process exited (code {child.exitcode}) before reporting") from None
            if status == "error":
                raise payload
            results.update(payload)
        finished = True
    finally:
        for receive, child in children:
            if not finished:  # an item failed: the others' work is not wanted
                child.terminate()
            child.join()
            receive.close()
    return [results[index] for index in range(len(items))]


def _claim_and_run(fn: Callable[[T], U], items: list[T], next_index: Any) -> list[tuple[int, U]]:
    """Take the next unclaimed item until none is left: (index, result) of each taken."""
    done = []
    while True:
        with next_index.get_lock():
            index = next_index.value
            next_index.value = index + 1
        if index >= len(items):
            return done
        done.append((index, fn(items[index])))


def _child(fn: Callable[[T], U], items: list[T], next_index: Any, send: Any) -> None:
    try:
        send.send(("ok", _claim_and_run(fn, items, next_index)))
    except BaseException as error:  # reported to the parent, which raises it
        try:
            send.send(("error", error))
        except Exception:  # an exception that does not pickle: its text
            send.send(("error", RuntimeError(f"{type(error).__name__}: {error}")))
    finally:
        send.close()
