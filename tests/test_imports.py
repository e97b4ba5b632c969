"""Import hygiene: the planning path never imports torch, and cost/ stays pure."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import planner.cost

COST_DIR = Path(planner.cost.__file__).parent
FORBIDDEN_IN_COST = {"rich", "typer", "yaml", "torch", "os"}
# "import time:  self [us] | cumulative | imported package", nesting shown by indentation
IMPORTTIME_LINE = re.compile(r"^import time:\s+\d+\s+\|\s+\d+\s+\|\s+(?P<module>\S+)\s*$")


def _imported_modules(*args: str, cwd: Path) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    found = {
        m["module"] for line in result.stderr.splitlines() if (m := IMPORTTIME_LINE.match(line))
    }
    assert "planner.cli" in found or "planner" in found, "importtime output not parsed"
    return found


def _top_level(modules: set[str]) -> set[str]:
    return {module.split(".")[0] for module in modules}


@pytest.fixture(scope="module")
def cli_imports(repo_root: Path) -> set[str]:
    return _imported_modules("-c", "import planner.cli", cwd=repo_root)


def test_import_planner_cli_has_no_torch(cli_imports: set[str]) -> None:
    assert "torch" not in _top_level(cli_imports)


def test_import_planner_cli_has_no_numpy(cli_imports: set[str]) -> None:
    assert "numpy" not in _top_level(cli_imports)


def test_import_planner_cli_has_no_pydantic(cli_imports: set[str]) -> None:
    """`plan --help` stays fast: no pydantic (the specs validate themselves, planner.schema)."""
    assert "pydantic" not in _top_level(cli_imports)


@pytest.fixture(scope="module")
def planning_imports(repo_root: Path) -> set[str]:
    """The whole main job, not only the CLI module: search, serve, render, emit."""
    return _imported_modules(
        "-m", "planner", "--model", "llama-3.1-70b", "--cluster", "2x8xA100", cwd=repo_root
    )


def test_planning_run_imports_no_torch(planning_imports: set[str]) -> None:
    assert "torch" not in _top_level(planning_imports)


def test_planning_run_imports_no_pydantic(planning_imports: set[str]) -> None:
    """Specs are validated by planner.schema, not pydantic (~0.25 s of start-up), and typer
    is held below 0.29, which imports pydantic at every invocation."""
    assert "pydantic" not in _top_level(planning_imports)


def test_json_plans_import_no_rich(repo_root: Path) -> None:
    """--json writes data only: the table library stays unloaded (start-up time)."""
    for workload in (("--model", "llama-3.1-70b"), ("--workload", "train", "--model", "llama-3.1-8b",
                                                      "--global-batch", "64", "--seq-len", "2048")):
        modules = _imported_modules("-m", "planner", *workload, "--cluster", "1x8xH100", "--json", cwd=repo_root)
        assert "rich" not in _top_level(modules), workload


def test_serving_plans_load_neither_probe_nor_training(planning_imports: set[str]) -> None:
    """Start-up time: a serving plan loads neither `plan probe`'s launcher (its flags come from
    planner.probe.options) nor the training emitters and the training cost model they read,
    nor multiprocessing (the serving search runs in one process)."""
    unwanted = {"planner.probe.launcher", "planner.probe.runner", "planner.emit.megatron",
                "planner.emit.torchtitan", "planner.cost.activations", "planner.train", "multiprocessing"}
    assert not planning_imports & unwanted


def _cost_modules() -> list[Path]:
    return sorted(COST_DIR.glob("*.py"))


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", _cost_modules(), ids=lambda p: p.name)
def test_cost_modules_import_no_io_or_ui(path: Path) -> None:
    """cost/ is pure formulas: none of rich, typer, yaml, torch, os (anywhere in the module,
    function-local imports included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert not _imports(tree) & FORBIDDEN_IN_COST


@pytest.mark.parametrize("path", _cost_modules(), ids=lambda p: p.name)
def test_cost_modules_neither_print_nor_open_files(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert not calls & {"print", "open", "input", "exit"}


def test_cost_package_is_found() -> None:
    assert {"params.py", "comm.py", "pipeline.py"} <= {p.name for p in _cost_modules()}
