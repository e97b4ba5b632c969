"""A config.json names one checkpoint, and the launch command serves it: a --quantization that
differs from the checkpoint's own is refused as the engine refuses it, a family neither engine
knows is said on the model line, and a dense MLP that a TP degree cannot split is a rejected
layout (each found by a critical read of the CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import resolve_model
from planner.cost.serving_memory import structural_reasons
from planner.layout import Layout

LLAMA_8B = Path(__file__).parent / "fixtures/hf_configs/meta-llama--Meta-Llama-3.1-8B/config.json"
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}


def _config(tmp_path: Path, name: str, **change: object) -> Path:
    config = {**json.loads(LLAMA_8B.read_text()), **change}
    config = {key: value for key, value in config.items() if value is not None}
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("asked", ["fp8", "none"])
def test_a_quantization_other_than_the_checkpoints_is_refused(run_plan, tmp_path, asked):
    # vLLM 0.33.0 ModelConfig._verify_quantization raises on an AWQ checkpoint with --quantization fp8;
    # with none the command would still serve the 4-bit weights while the plan priced 16-bit ones
    path = _config(tmp_path, "awq", quantization_config=AWQ)
    result = run_plan("--model", str(path), "--cluster", "1x1xH100", "--quantization", asked)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"{path}: quantization_config: the checkpoint's weights are int4 already; "
                           f"--quantization {asked}"), line


def test_the_checkpoints_own_quantization_and_a_16_bit_one_plan(run_plan, tmp_path):
    awq = _config(tmp_path, "awq", quantization_config=AWQ)
    same = run_plan("--model", str(awq), "--cluster", "1x1xH100", "--quantization", "int4")
    assert same.returncode == 0, same.stderr
    assert "5.3 GiB of int4 weights" in same.stdout.splitlines()[0]
    on_load = run_plan("--model", str(LLAMA_8B), "--cluster", "1x1xH100", "--quantization", "fp8")
    assert on_load.returncode == 0, on_load.stderr
    assert "of fp8 weights" in on_load.stdout.splitlines()[0]
    # a shipped spec is a what-if: MODEL is the user's to pick, and a note says which checkpoint
    what_if = run_plan("--model", "llama-3.1-70b-awq", "--cluster", "1x8xH100", "--quantization", "fp8")
    assert what_if.returncode == 0, what_if.stderr
    assert "MODEL must be a 16-bit checkpoint" in what_if.stdout


def test_an_unknown_model_type_is_said_on_the_model_line(run_plan, tmp_path):
    unknown = _config(tmp_path, "unknown", model_type="foobar_lm", architectures=["FoobarForCausalLM"])
    result = run_plan("--model", str(unknown), "--cluster", "1x1xH100")
    assert result.returncode == 0, result.stderr
    assert "model_type 'foobar_lm': no configuration class in transformers 5.16.1 or vLLM 0.33.0" in \
        " ".join(result.stdout.split())
    assert resolve_model(str(_config(tmp_path, "missing", model_type=None))).unknown_model_type == ""
    assert resolve_model(str(LLAMA_8B)).unknown_model_type is None


def test_a_dense_mlp_that_tp_cannot_split_is_rejected(tmp_path):
    # vLLM's MergedColumnParallelLinear divides the 14,340 up-projection outputs by tp and asserts:
    # 14,340 = 4 x 3,585, so tp 4 splits it and tp 8 does not
    model = resolve_model(str(_config(tmp_path, "odd", intermediate_size=14340)))
    assert structural_reasons(model, Layout(8, 1, 1)) == ["MLP width 14340 not divisible by tp=8"]
    assert structural_reasons(model, Layout(4, 1, 2)) == []
    # routed experts floor their split (FusedMoEConfig), so an MoE model without dense layers is not checked
    moe = resolve_model("qwen3-30b-a3b").model_copy(update={"intermediate_size": 6001})
    assert moe.num_dense_layers == 0
    assert structural_reasons(moe, Layout(2, 1, 1)) == []
