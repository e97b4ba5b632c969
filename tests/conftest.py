"""Shared fixtures. Tests run with --import-mode=importlib (pyproject.toml), so test
modules in different folders may share a basename and never import each other: share
through fixtures here, not through imports."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CLI_ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
"""Wide output so rich never wraps a name the tests look for."""


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def run_plan() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real CLI (`python -m planner ARGS`) from the repository root."""

    def run(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "planner", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            env=CLI_ENV,
        )

    return run


@pytest.fixture(scope="session")
def run_plan_many(
    run_plan: Callable[..., subprocess.CompletedProcess[str]],
) -> Callable[[Mapping[str, Sequence[str]]], dict[str, subprocess.CompletedProcess[str]]]:
    """Run many CLI invocations at once (each costs ~0.3 s of interpreter start-up)."""

    def run_many(
        cases: Mapping[str, Sequence[str]],
    ) -> dict[str, subprocess.CompletedProcess[str]]:
        with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
            futures = {key: pool.submit(run_plan, *args) for key, args in cases.items()}
            return {key: future.result() for key, future in futures.items()}

    return run_many
