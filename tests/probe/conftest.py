"""Helpers for the probe tests: run `python -m planner.probe probe ...` as a subprocess."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from planner.probe.runner import GRACE_SECONDS

REPO_ROOT = Path(__file__).resolve().parents[2]
# Tiny sweeps: the point is the plumbing, not the numbers.
TINY_SWEEP = [
    "--backend",
    "gloo",
    "--min-bytes",
    "8",
    "--max-bytes",
    "65536",
    "--step-factor",
    "8",
    "--warmup",
    "1",
    "--iterations",
    "2",
    "--repeats",
    "3",
]
SAFETY_TIMEOUT_S = 300
"""--timeout of runs whose subject is not the timeout: a net for a real hang only.

A loaded machine may take tens of seconds to start torchrun and import torch
in every rank; those runs must never end by their timeout, so it is generous.
"""
WAIT_S = SAFETY_TIMEOUT_S + 60
"""How long a test waits for a probe process: past its --timeout and the stop that follows."""


def probe_env(**overrides: str) -> dict:
    env = dict(os.environ, **overrides)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONWARNINGS"] = "ignore"
    return env


def probe_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "planner.probe", "probe", *args]


def run_probe_cli(*args: str, timeout: float = WAIT_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        probe_argv(*args),
        env=probe_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )


def default_stop_signals() -> None:
    """In the child, before exec: SIGINT, SIGTERM and SIGHUP at their default disposition.
    `plan probe` leaves a stop signal its parent ignored ignored (nohup, a background job),
    so a test suite run under nohup would otherwise hand it an ignored SIGHUP and the stop
    tests would test nohup, not the probe."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def probe_process(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        probe_argv(*args),
        env=env or probe_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_stop_signals,  # noqa: PLW1509 - only resets signal dispositions
    )


@contextlib.contextmanager
def interrupted_at_exit(processes):
    """Ctrl-C any probe still running when the test ends (a failed assert): the launcher then
    stops torchrun and every worker, stopped ones included, instead of leaving them to load
    the machine for the tests that follow."""
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.communicate(timeout=GRACE_SECONDS + 30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.communicate()


def start_long_run(tmp_path: Path, timeout_s: float, env: dict | None = None) -> subprocess.Popen:
    """Two ranks on a sweep long enough to be still running when the test acts on a rank."""
    args = [
        "--nproc-per-node",
        "2",
        "--backend",
        "gloo",
        "--max-bytes",
        "1048576",
        "--iterations",
        "50",
        "--repeats",
        "10",
        "--timeout",
        str(timeout_s),
        "--out",
        str(tmp_path / "never.yaml"),
    ]
    return probe_process(*args, env=env)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def needs_torch():
    pytest.importorskip("torch")
