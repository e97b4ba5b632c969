"""The real CLI (`python -m planner`, cwd = repository root) on good input: the main job on
shipped names, file paths and shorthand; every shipped spec plans; the listing commands,
--version and --help. The main job's output format belongs to the serving planner, so only
the exit code and the model's name are asserted here."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner import __version__
from planner.catalog import resolve_cluster, resolve_model, shipped_clusters, shipped_models
from planner.cli import EXAMPLES, app

MAIN_JOBS = {
    "names": ["--model", "llama-3.1-70b", "--cluster", "2x8xA100"],
    "paths": [
        "--model",
        "model_specs/llama-3.1-70b.yaml",
        "--cluster",
        "hardware_profiles/2x8xA100.yaml",
    ],
    "4x8xH100": ["--model", "llama-3.1-70b", "--cluster", "4x8xH100"],
    "shorthand-not-shipped": ["--model", "llama-3.1-70b", "--cluster", "3x8xH100"],
}
# Every shipped model on a cluster it fits (405B bf16 = 756 GiB of weights; 32 x 80 GB),
# every shipped profile with a model that fits its smallest member (8B: 15 GiB).
LONG_CONTEXT_ARGS = {"llama-4-scout": ["--max-model-len", "1048576"]}
"""llama-4-scout's default 10,485,760-token context does not fit 4 nodes of H100 once vLLM's
sampler warm-up is counted (10.35M KV tokens); a 1M context does."""
EVERY_MODEL = {
    f"model:{name}": ["--model", name, "--cluster", "4x8xH100", *LONG_CONTEXT_ARGS.get(name, [])]
    for name in shipped_models()
}
EVERY_CLUSTER = {
    f"cluster:{name}": ["--model", "llama-3.1-8b", "--cluster", name] for name in shipped_clusters()
}
LISTINGS = {
    "models": ["models"],
    "clusters": ["clusters"],
    "gpus": ["gpus"],
    "version": ["--version"],
    "help": ["--help"],
}


@pytest.fixture(scope="module")
def results(run_plan_many) -> dict[str, subprocess.CompletedProcess[str]]:
    return run_plan_many({**MAIN_JOBS, **LISTINGS})


def _model_name(args: list[str]) -> str:
    return resolve_model(args[args.index("--model") + 1]).name


@pytest.mark.parametrize("case", sorted(MAIN_JOBS))
def test_main_job_exits_zero_and_names_the_model(results, case: str) -> None:
    result = results[case]
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert _model_name(MAIN_JOBS[case]) in result.stdout


@pytest.mark.parametrize("case", sorted({**EVERY_MODEL, **EVERY_CLUSTER}))
def test_every_shipped_spec_plans(repo_root: Path, monkeypatch, case: str) -> None:
    """In process (typer's CliRunner) to keep the matrix fast; the subprocess runs above
    cover the entry point itself."""
    args = {**EVERY_MODEL, **EVERY_CLUSTER}[case]
    monkeypatch.chdir(repo_root)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert _model_name(args) in result.stdout


def test_plan_models_lists_every_shipped_model(results) -> None:
    result = results["models"]
    assert result.returncode == 0, result.stderr
    assert all(name in result.stdout for name in shipped_models())


def test_plan_clusters_lists_every_shipped_profile(results) -> None:
    result = results["clusters"]
    assert result.returncode == 0, result.stderr
    assert all(name in result.stdout for name in shipped_clusters())


def test_plan_gpus_lists_the_catalog(results) -> None:
    result = results["gpus"]
    assert result.returncode == 0, result.stderr
    for name in (
        "A100-SXM4-80GB",
        "H100-SXM5-80GB",
        "H200-SXM-141GB",
        "B200-SXM-180GB",
        "L40S",
        "MI300X",
        # GPU identity for `plan probe` (issue 17)
        "H800-SXM5-80GB",
        "A800-SXM4-80GB",
        "A800-PCIE-80GB",
        "H20",
        "L40",
        "RTX-6000-Ada",
        "GH200",
        "H200-NVL-141GB",
        # consumer and workstation cards
        "RTX-3090",
        "RTX-4090",
        "RTX-5090",
        "RTX-A6000",
        "A40",
        "RTX-PRO-6000",
    ):
        assert name in result.stdout
    assert "no P2P" in result.stdout  # the GeForce cards' fabric


def test_version(results) -> None:
    result = results["version"]
    assert result.returncode == 0
    assert __version__ in result.stdout


def test_help_shows_real_examples(results) -> None:
    result = results["help"]
    assert result.returncode == 0
    assert "plan --model llama-3.1-70b --cluster 2x8xA100" in result.stdout
    for option in ("--model", "--cluster", "--workload", "--layout", "--gpus"):
        assert option in result.stdout


def test_help_examples_name_real_specs(repo_root: Path) -> None:
    """Every shipped name, file and shorthand the examples use resolves (placeholder paths to
    a user's own config.json excepted)."""
    commands = [line.strip() for line in EXAMPLES.splitlines() if "--model" in line]
    assert commands
    for command in commands:
        argv = shlex.split(command)
        model, cluster = argv[argv.index("--model") + 1], argv[argv.index("--cluster") + 1]
        if not model.endswith("config.json"):
            resolve_model(model if "/" not in model else str(repo_root / model))
        resolve_cluster(cluster if "/" not in cluster else str(repo_root / cluster))


def test_console_script_help(repo_root: Path) -> None:
    """The installed `plan` entry point (beside this interpreter in the virtual environment)."""
    script = Path(sys.executable).parent / "plan"
    if not script.exists():
        pytest.skip("the plan console script is not installed next to this interpreter")
    result = subprocess.run(
        [str(script), "--help"], cwd=repo_root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert re.search(r"Usage: plan\b", result.stdout)


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--layout", "tp=3"],
    ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--request-rate", "4", "--num-prompts", "20", "--json"],
])
def test_the_forked_runner_answers_as_a_fresh_interpreter(run_plan, run_plan_process, argv):
    """Most CLI tests run `plan` in a child forked from the test worker (conftest run_plan, no
    interpreter start-up); it must print, exit and name the program (click's "python -m
    planner") exactly as `python -m planner` started afresh does."""
    forked, fresh = run_plan(*argv), run_plan_process(*argv)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
