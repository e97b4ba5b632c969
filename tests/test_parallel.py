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
