"""parallel.map_in_workers: the same values in the items' order as a plain loop, whatever the
number of workers; an item's exception reaches the caller; nothing printed before is printed
twice by a forked worker."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import SpecError
from planner.parallel import forking_available, map_in_workers, usable_cpus

needs_fork = pytest.mark.skipif(not forking_available(), reason="workers are forked on Linux only")


def square_with_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


@given(st.lists(st.integers(-1000, 1000), max_size=12), st.integers(1, 4))
@settings(max_examples=15, deadline=None)
def test_same_values_in_order_as_a_loop(items: list[int], num_workers: int) -> None:
    assert map_in_workers(lambda x: x * x - 3, items, num_workers) == [x * x - 3 for x in items]


@needs_fork
def test_items_run_in_other_processes_and_closures_need_no_pickling() -> None:
    """Three workers, six items, each item waiting at a barrier of three: the barrier only
    opens when three different processes hold an item, so the items must spread over three
    processes (two rounds of three). The work is a closure over a lambda, which pickle
    cannot carry: the forked workers inherit it."""
    import multiprocessing

    barrier = multiprocessing.get_context("fork").Barrier(3, timeout=60)
    shift = lambda x: x + 0  # noqa: E731 (the unpicklable closure cell)

    def work(x: int) -> tuple[int, int]:
        barrier.wait()
        return square_with_pid(shift(x))

    results = map_in_workers(work, list(range(6)), num_workers=3)
    assert [value for value, _ in results] == [0, 1, 4, 9, 16, 25]
    assert len({pid for _, pid in results}) == 3
    assert os.getpid() in {pid for _, pid in results}


def test_one_worker_runs_in_this_process() -> None:
    assert {pid for _, pid in map_in_workers(square_with_pid, [1, 2, 3], num_workers=1)} == {os.getpid()}


@needs_fork
def test_an_items_exception_reaches_the_caller() -> None:
    def work(x: int) -> int:
        if x == 4:
            raise SpecError("--thing: item 4 is bad")
        return x

    with pytest.raises(SpecError, match="item 4 is bad"):
        map_in_workers(work, list(range(8)), num_workers=2)


@needs_fork
def test_an_exception_that_does_not_pickle_arrives_as_its_text() -> None:
    class Local(Exception):  # a local class cannot be pickled
        pass

    def work(x: int) -> int:
        if x >= 1:
            raise Local(f"item {x}")
        return x

    with pytest.raises((Local, RuntimeError), match="item"):
        map_in_workers(work, [0, 1, 2, 3], num_workers=2)


def test_usable_cpus_is_positive() -> None:
    assert usable_cpus() >= 1


@needs_fork
def test_buffered_output_is_not_printed_twice() -> None:
    """A line printed (and still buffered, stdout being a pipe) before the workers fork
    appears once in the output."""
    code = ("import sys\nfrom planner.parallel import map_in_workers\n"
            "print('before', end='\\n')\n"
            "print(map_in_workers(lambda x: x + 1, list(range(6)), 3))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["before", "[1, 2, 3, 4, 5, 6]"]


@needs_fork
def test_a_map_inside_a_worker_runs_there_one_item_after_another():
    """Nested maps do not fork again: the inner items run in the process of the outer item."""

    def outer(x: int) -> tuple[int, set[int]]:
        return os.getpid(), {pid for _, pid in map_in_workers(square_with_pid, [1, 2, 3], 3)}

    for pid, inner in map_in_workers(outer, [0, 1, 2, 3], 2):
        assert inner == {pid}


def test_the_training_search_is_the_same_spread_over_cores_or_not(monkeypatch):
    """A 16,384-GPU training search (over PARALLEL_MIN_LAYOUTS candidates) gives the same plan,
    estimate for estimate and rejection for rejection, when its layouts are spread over the
    cores as when one process evaluates them all."""
    from planner import search as search_module
    from planner.catalog import resolve_cluster, resolve_model
    from planner.requests import TrainRequest
    from planner.train_search import search

    model, cluster = resolve_model("llama-3.1-405b"), resolve_cluster("2048x8xH100")
    request = TrainRequest(global_batch=2048, seq_len=131072)  # CP searched: 515 candidates
    spread_calls = []

    def spreading(fn, items):
        spread_calls.append(len(items))
        return map_in_workers(fn, items)

    monkeypatch.setattr(search_module, "map_in_workers", spreading)
    spread = search(model, cluster, request)
    assert spread_calls and spread_calls[0] >= search_module.PARALLEL_MIN_LAYOUTS
    monkeypatch.setattr(search_module, "PARALLEL_MIN_LAYOUTS", 10**9)
    alone = search(model, cluster, request)
    assert len(spread_calls) == 1
    assert len(alone.layouts) > 1000
    assert spread.layouts == alone.layouts
    assert spread.rejected == alone.rejected
    assert spread.num_configs_evaluated == alone.num_configs_evaluated


@needs_fork
def test_when_no_worker_can_start_this_process_does_it_all(monkeypatch):
    """A fork refused (a process limit) is not an error: the items run here."""
    import multiprocessing.process

    def refuse(self):
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    assert {pid for _, pid in map_in_workers(square_with_pid, [1, 2, 3, 4], 4)} == {os.getpid()}


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for a parent that no longer reaps it."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in status)
    except FileNotFoundError:
        return True


@needs_fork
def test_workers_die_with_a_killed_parent_and_do_not_hold_its_output():
    """A parent killed outright (SIGKILL: the OOM killer, a scheduler) takes its workers with it
    (PR_SET_PDEATHSIG), and the workers never held its stdout: a reader of that output sees
    end of file as soon as the parent is gone."""
    import signal
    import time

    code = ("import multiprocessing, os, sys, time\n"
            "from planner.parallel import map_in_workers\n"
            "MAIN = os.getpid()\n"
            "def work(x):\n"
            "    if os.getpid() == MAIN:  # the parent's first item, whichever it is\n"
            "        print(' '.join(str(p.pid) for p in multiprocessing.active_children()), flush=True)\n"
            "    time.sleep(60)\n"
            "map_in_workers(work, list(range(8)), 3)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    worker_pids = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(worker_pids) == 2
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert parent.stdout.read() == ""  # end of file: no worker holds the pipe
    deadline = time.monotonic() + 20
    while not all(_dead(pid) for pid in worker_pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_dead(pid) for pid in worker_pids)
