"""The CLI's options are declared once: `plan` and `plan explain` share them, their
defaults are the request dataclasses' defaults, and the CLI reaches typer only through its
public API. Also the closed-pipe exit code of `main()`."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import planner
from planner.cli import PlanOptions, app
from planner.requests import ServeRequest

PLANNER_DIR = Path(planner.__file__).parent
CLI = typer.main.get_command(app)
EXPLAIN = CLI.commands["explain"]
EXPLAIN_OWN = {"svg", "html", "sensitivity", "timeline_only", "stages", "micro_batches", "forward_only",
               "emit"}  # explain's --emit takes the serving engines only


def _help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())  # help wraps at the terminal width


def _params(command) -> dict:
    return {p.name: p for p in command.params}


def _defaulted_fields():
    """ServeRequest fields with a plain default that a flag of the same name sets (switches,
    whose default is their absence, apart: _switch_fields)."""
    return [f for f in dataclasses.fields(ServeRequest)
            if f.name in _params(CLI) and f.default is not None
            and not dataclasses.is_dataclass(f.default) and not isinstance(f.default, bool)]


def _switch_fields():
    return [f for f in dataclasses.fields(ServeRequest) if f.name in _params(CLI) and isinstance(f.default, bool)]


@pytest.mark.parametrize("field", _switch_fields(), ids=lambda f: f.name)
def test_switches_are_off_unless_given(field):
    """A switch flag (--enable-dbo) is off by default, as the request field it sets."""
    assert field.default is False
    assert _params(CLI)[field.name].default is False


def test_some_request_defaults_are_flags():
    assert {f.name for f in _defaulted_fields()} >= {
        "input_len", "output_len", "gpu_memory_utilization", "kv_cache_dtype", "objective"}


@pytest.mark.parametrize("command", [(), ("explain",)], ids=["plan", "plan explain"])
@pytest.mark.parametrize("field", _defaulted_fields(), ids=lambda f: f.name)
def test_help_shows_the_request_dataclass_default(command, field):
    flag = "--" + field.name.replace("_", "-")
    # the flag's own entry: up to the next option, never into it
    shown = re.search(rf"{flag} <[^>]*> (?:(?! --[a-z]).)*?\[default: ([^\]]+)\]", _help(*command))
    assert shown, f"{flag} has no default in the help"
    assert shown.group(1) == str(field.default)


def test_explain_help_lists_every_shared_option():
    text = _help("explain")
    for name in (f.name for f in dataclasses.fields(PlanOptions)):
        for flag in _params(EXPLAIN)[name].opts:
            assert flag in text, flag


def test_plan_and_explain_share_identical_options():
    """Same flags, help, type and default: one declaration, two commands."""
    shared = {f.name for f in dataclasses.fields(PlanOptions)}
    plan, explain = _params(CLI), _params(EXPLAIN)
    assert shared <= set(plan) and shared <= set(explain)
    assert set(explain) - shared == EXPLAIN_OWN
    for name in shared:
        a, b = plan[name], explain[name]
        assert (a.opts, a.secondary_opts, a.help, a.default, a.is_flag) == (
            b.opts, b.secondary_opts, b.help, b.default, b.is_flag), name


def test_help_does_not_say_the_seeds_example():
    assert "seeds'" not in _help() + _help("explain")


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted(PLANNER_DIR.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PLANNER_DIR)))
def test_no_private_typer_import(path: Path):
    private = {m for m in _imported_modules(path) if re.match(r"typer\._", m)}
    assert not private, f"{path}: imports {private}"


def test_cli_uses_no_signature_surgery():
    imported = {m.split(".")[0] for m in _imported_modules(PLANNER_DIR / "cli.py")}
    assert "inspect" not in imported
    assert "locals()" not in (PLANNER_DIR / "cli.py").read_text(encoding="utf-8")


def test_closed_pipe_exits_zero(repo_root: Path):
    """`plan ... --json | head -c 10`: the reader leaving is not an error (output > 64 KiB,
    more than a pipe buffers)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "planner", "--model", "llama-3.1-8b", "--cluster", "16x8xH100", "--json"],
        cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.read(10)
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == 0, stderr
    assert stderr == b""


def test_the_moe_host_help_names_the_constant_the_plan_uses():
    """--moe-host-ms's help states its default; the constant was refitted (7.3 -> 6.1 ms) and the
    help kept the old value (found by a CLI sweep)."""
    from planner.cli import MoeHostMsOpt
    from planner.cost.efficiency import MOE_LAYER_FORWARD_HOST_SECONDS

    (option,) = MoeHostMsOpt.__metadata__
    assert f"(default: {MOE_LAYER_FORWARD_HOST_SECONDS * 1e3:g}," in option.help


@pytest.mark.parametrize(("flag", "weights", "others", "lm_head"), [
    ("none", "bfloat16", None, None), ("fp8", "fp8", None, None), ("int4", "int4", None, None)])
def test_quantization_override_drops_the_checkpoints_mixed_formats(flag, weights, others, lm_head, tmp_path) -> None:
    """nvidia/Qwen3.6-27B-NVFP4 is NVFP4 MLPs beside FP8 attention and an NVFP4 LM head. Another
    --quantization on its spec plans another checkpoint (16-bit, or one the engine quantizes on
    load), so none of those formats stays: `none` weighs the 16-bit model's 26.9B parameters (its
    untied 1.27B-parameter LM head included) at 2 bytes, not with an NVFP4 head. (On its config.json
    the flag is refused: the command would serve that checkpoint, test_checkpoint_checks.py.)"""
    import json

    import yaml

    from planner.catalog import resolve_model

    config = Path(__file__).parent / "fixtures" / "hf_configs" / "nvidia--Qwen3.6-27B-NVFP4" / "config.json"
    spec = tmp_path / "qwen3.6-27b-nvfp4.yaml"
    spec.write_text(yaml.safe_dump(resolve_model(str(config)).model_dump(exclude_none=True)))
    result = CliRunner().invoke(app, ["--model", str(spec), "--cluster", "1x8xH100", "--quantization", flag,
                                      "--json", "--top", "1", "--mode", "aggregated"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["model_summary"]
    assert (summary["weight_dtype"], summary["secondary_weight_dtype"], summary["lm_head_weight_dtype"]) == (
        weights, others, lm_head)
