"""--fp8-recipe delayed | tensorwise | mxfp8 | blockwise (docs/cost-model.md#training-fp8-recipes): the
casts and weight copies of each recipe by hand on Llama-3.1-8B, the request and CLI errors,
the Blackwell rule for MXFP8, the Hopper rule for block scaling, and each engine's launch flags."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.cost import efficiency
from planner.cost.training_memory import fp8_weight_cache_bytes
from planner.cost.training_time import fp8_cast_bytes_per_layer
from planner.emit.megatron import fp8_args
from planner.emit.torchtitan import job_sections
from planner.engines import RELEASES, EngineVersions
from planner.layout import TrainConfig
from planner.requests import TrainRequest
from planner.specs import SpecError
from planner.train import check_precision, estimate
from planner.train_cli import launchable as train_launchable
from planner.train_search import search

LLAMA8B = resolve_model("llama-3.1-8b")
# Llama-3.1-8B at t = 1, per token: h = 4096, a = 32, k = 8, d = 128, f = 14336 (gated).
# Forward casts: attention context a*d = 4,096 + MLP-down input f = 14,336 = 18,432 elements;
# layernorm outputs (QKV and MLP-up inputs) 2h = 8,192. Backward: output gradients of QKV
# (32 + 2*8)*128 = 6,144, projection 4,096, MLP up 2f = 28,672, down 4,096 = 43,008.
CAST_FORWARD, NORM_OUTPUTS, CAST_BACKWARD = 18_432, 8_192, 43_008
TOKENS = 8192  # b = 1, s = 8192


def test_delayed_casts_8b_by_hand():
    """Delayed: cast-transpose 4 B/element (read 2, write 1 + 1), norm outputs only
    transposed (2 B: the fused norm kernel already wrote the row-wise fp8).
    Forward 4 * 18,432 + 2 * 8,192 = 73,728 + 16,384 = 90,112 B; backward 4 * 43,008 = 172,032 B."""
    assert 4 * CAST_FORWARD + 2 * NORM_OUTPUTS == 90_112 and 4 * CAST_BACKWARD == 172_032
    assert fp8_cast_bytes_per_layer(LLAMA8B, TOKENS, 1, 1, "delayed") == (90_112 * TOKENS, 172_032 * TOKENS)


def test_tensorwise_casts_8b_by_hand():
    """Tensorwise (current scaling): delayed's plus an amax read (2 B) of every cast input and
    the norm outputs cast from a 16-bit copy, 2 + 2 + 4 - 1 - 2 = 5 B more per element:
    forward 90,112 + 2 * 18,432 + 5 * 8,192 = 90,112 + 36,864 + 40,960 = 167,936 B;
    backward 172,032 + 2 * 43,008 = 258,048 B."""
    assert 90_112 + 2 * CAST_FORWARD + 5 * NORM_OUTPUTS == 167_936
    assert 172_032 + 2 * CAST_BACKWARD == 258_048
    assert fp8_cast_bytes_per_layer(LLAMA8B, TOKENS, 1, 1, "tensorwise") == (167_936 * TOKENS, 258_048 * TOKENS)


def test_mxfp8_casts_8b_by_hand():
    """MXFP8: every tensor, the norm outputs included (the norm runs unfused), is read once
    (2 B) and written as both copies with one E8M0 byte per 32 values: 2 + 2 * (1 + 1/32) =
    4.0625 B/element, no amax pass. Forward 4.0625 * (18,432 + 8,192) = 4.0625 * 26,624 =
    108,160 B; backward 4.0625 * 43,008 = 174,720 B."""
    assert efficiency.TRAIN_MXFP8_CAST_BYTES_PER_ELEMENT == 4.0625
    assert 4.0625 * (CAST_FORWARD + NORM_OUTPUTS) == 108_160 and 4.0625 * CAST_BACKWARD == 174_720
    assert fp8_cast_bytes_per_layer(LLAMA8B, TOKENS, 1, 1, "mxfp8") == (108_160 * TOKENS, 174_720 * TOKENS)


def test_blockwise_casts_8b_by_hand():
    """Block scaling (Float8BlockScaling): every tensor read once (2 B) and written as both
    copies with one fp32 scale per 1x128 block: 2 + 2 * (1 + 4/128) = 4.0625 B/element, as
    MXFP8 (its 1-byte scales per 32 weigh the same): forward 108,160 B, backward 174,720 B."""
    assert efficiency.TRAIN_FP8_BLOCKWISE_CAST_BYTES_PER_ELEMENT == 4.0625
    assert fp8_cast_bytes_per_layer(LLAMA8B, TOKENS, 1, 1, "blockwise") == (108_160 * TOKENS, 174_720 * TOKENS)


def test_blockwise_gemm_rate_ratio_is_the_fixtures_median():
    """TRT-LLM's fp8_block over its fp8 latency on H100 at the 8B/70B layer shapes of
    tests/fixtures/aiconfigurator_silicon/training_gemm.csv (102 points): median 0.973,
    TRAIN_FP8_BLOCKWISE_GEMM_RATE_RATIO 0.97."""
    import csv
    import statistics
    from pathlib import Path
    rows = list(csv.DictReader((Path(__file__).resolve().parents[1]
                                / "fixtures/aiconfigurator_silicon/training_gemm.csv").open()))
    by_dtype = {d: {(r["m"], r["n"], r["k"]): float(r["latency_ms"]) for r in rows
                    if r["gpu"] == "h100_sxm" and r["gemm_dtype"] == d} for d in ("fp8", "fp8_block")}
    shapes = [s for s in by_dtype["fp8_block"] if s in by_dtype["fp8"]]
    assert len(shapes) == 102
    ratio = statistics.median(by_dtype["fp8"][s] / by_dtype["fp8_block"][s] for s in shapes)
    assert ratio == pytest.approx(0.973, abs=0.001)
    assert efficiency.TRAIN_FP8_BLOCKWISE_GEMM_RATE_RATIO == pytest.approx(ratio, abs=0.005)


def test_weight_copies_by_recipe_8b():
    """Per block at t = 1: linear weights 4096 * (4096 + 2 * 1024) QKV + 4096^2 projection
    + 3 * 4096 * 14336 MLP = 25,165,824 + 16,777,216 + 176,160,768 = 218,103,808.
    Delayed: 2 B each + 4 GEMMs * 20,520 B of amax history = 436,207,616 + 82,080;
    tensorwise: 2 B each, no history = 436,207,616; mxfp8: 2 * (1 + 1/32) = 2.0625 B each
    = 449,839,104."""
    weights = 218_103_808
    assert fp8_weight_cache_bytes(LLAMA8B, 1, 1, 1, 0, recipe="delayed") == 2 * weights + 82_080
    assert fp8_weight_cache_bytes(LLAMA8B, 1, 1, 1, 0, recipe="tensorwise") == 436_207_616
    assert fp8_weight_cache_bytes(LLAMA8B, 1, 1, 1, 0, recipe="mxfp8") == 2.0625 * weights == 449_839_104
    # blockwise: 2 * (1 + 4/16384) = 2.00048828125 B each = 436,314,112
    assert fp8_weight_cache_bytes(LLAMA8B, 1, 1, 1, 0, recipe="blockwise") == pytest.approx(436_314_112)


def test_estimate_prices_the_requested_recipe():
    """Same configuration on B200: the estimate carries the recipe, tensorwise is slower than
    delayed (more cast traffic), and mxfp8's weights are 0.0625 B/param - 20,520 B/GEMM more."""
    config = TrainConfig(1, 1, 8, 1, "1f1b", 1, "none", False, 1)
    cluster = resolve_cluster("1x8xB200")
    runs = {r: estimate(LLAMA8B, cluster, config, TrainRequest(global_batch=64, seq_len=8192,
                                                               precision="fp8", fp8_recipe=r))
            for r in ("delayed", "tensorwise", "mxfp8")}
    assert {r: e.config.fp8_recipe for r, e in runs.items()} == {r: r for r in runs}
    assert runs["tensorwise"].step_time_seconds > runs["delayed"].step_time_seconds
    assert runs["mxfp8"].memory.weights_bytes - runs["delayed"].memory.weights_bytes == pytest.approx(
        32 * (0.0625 * 218_103_808 - 4 * 20_520), rel=1e-12)


def test_blockwise_runs_its_gemms_at_the_block_rate():
    """Same configuration on H100: blockwise's step is slower than delayed's (its GEMMs at 0.97 of
    the fp8 rate, more cast traffic); the estimate carries the recipe."""
    config = TrainConfig(1, 1, 8, 1, "1f1b", 1, "full", False, 3)
    cluster = resolve_cluster("1x8xH100")
    runs = {r: estimate(LLAMA8B, cluster, config, TrainRequest(global_batch=64, seq_len=8192,
                                                               precision="fp8", fp8_recipe=r))
            for r in ("delayed", "blockwise")}
    assert runs["blockwise"].config.fp8_recipe == "blockwise", runs["blockwise"]
    assert runs["blockwise"].step_time_seconds > runs["delayed"].step_time_seconds


def test_blockwise_needs_hopper():
    """Transformer Engine's block-scaled GEMMs need compute capability 9.0: refused on L40S
    (8.9), allowed on H100 and B200; a profile without a compute capability is not refused."""
    with pytest.raises(SpecError, match=r"^--fp8-recipe blockwise: L40S \(compute capability 8.9\)"):
        check_precision(resolve_cluster("1x8xL40S"), "fp8", "blockwise")
    check_precision(resolve_cluster("1x8xH100"), "fp8", "blockwise")
    check_precision(resolve_cluster("1x8xB200"), "fp8", "blockwise")
    unknown = resolve_cluster("1x8xL40S")
    unknown = unknown.model_copy(update={"gpu": unknown.gpu.model_copy(update={"compute_capability": None})})
    check_precision(unknown, "fp8", "blockwise")


def test_recipe_defaults_per_engine():
    assert TrainRequest(global_batch=8, seq_len=1024).resolved_fp8_recipe is None
    assert TrainRequest(global_batch=8, seq_len=1024, precision="fp8").resolved_fp8_recipe == "delayed"
    assert TrainRequest(global_batch=8, seq_len=1024, precision="fp8",
                        engine="torchtitan").resolved_fp8_recipe == "tensorwise"


def test_recipe_without_fp8_is_a_spec_error():
    with pytest.raises(SpecError, match=r"^--fp8-recipe: only with --precision fp8"):
        TrainRequest(global_batch=8, seq_len=1024, fp8_recipe="tensorwise")


def test_mxfp8_needs_an_fp4_peak():
    """The catalog has no compute capability: MXFP8 is refused on GPUs whose entry has no fp4
    peak (H100), allowed on B200 and GB200."""
    with pytest.raises(SpecError, match=r"^--fp8-recipe mxfp8: H100.*no MX block-scaled"):
        check_precision(resolve_cluster("1x8xH100"), "fp8", "mxfp8")
    check_precision(resolve_cluster("1x8xB200"), "fp8", "mxfp8")
    check_precision(resolve_cluster("1x72xGB200"), "fp8", "mxfp8")
    check_precision(resolve_cluster("1x8xH100"), "fp8", "tensorwise")


def _train(*args: str):
    return CliRunner().invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--global-batch", "64",
                                    "--seq-len", "8192", *args])


@pytest.mark.parametrize("args, message", [
    (("--cluster", "1x8xH100", "--fp8-recipe", "tensorwise"),
     "--fp8-recipe: only with --precision fp8 (got --precision bf16)"),
    (("--cluster", "1x8xH100", "--precision", "fp8", "--fp8-recipe", "mxfp8"), "--fp8-recipe mxfp8: H100"),
    (("--cluster", "1x8xB200", "--precision", "fp8", "--fp8-recipe", "delayed", "--engine", "torchtitan"),
     "--fp8-recipe delayed: torchtitan"),
    (("--cluster", "1x8xH100", "--precision", "fp8", "--fp8-recipe", "blockwise", "--engine", "torchtitan"),
     "--fp8-recipe blockwise: torchtitan"),
    (("--cluster", "1x8xL40S", "--precision", "fp8", "--fp8-recipe", "blockwise"), "--fp8-recipe blockwise: L40S"),
])
def test_cli_errors_exit_2_one_line(args, message):
    result = _train(*args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_json_carries_the_recipe():
    result = _train("--cluster", "1x8xB200", "--precision", "fp8", "--fp8-recipe", "mxfp8", "--json", "--top", "1")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["recommended"]["fp8_recipe"] == "mxfp8"
    bf16 = _train("--cluster", "1x8xB200", "--json", "--top", "1")
    assert json.loads(bf16.stdout)["recommended"]["fp8_recipe"] is None


def test_megatron_flags_by_recipe():
    """--fp8-amax-history-len / --fp8-amax-compute-algo only for delayed scaling."""
    assert fp8_args("delayed") == ["--fp8-format", "hybrid", "--fp8-recipe", "delayed",
                                   "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"]
    assert fp8_args("tensorwise") == ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]
    assert fp8_args("mxfp8") == ["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"]
    assert fp8_args("blockwise") == ["--fp8-format", "hybrid", "--fp8-recipe", "blockwise"]


@pytest.mark.parametrize("recipe, converter, keys", [
    ("tensorwise", "quantize.linear.float8", {"recipe_name": "tensorwise", "filter_fqns": ["output"]}),
    ("mxfp8", "quantize.linear.mx", {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]}),
])
def test_torchtitan_converter_by_recipe(recipe, converter, keys):
    config = TrainConfig(1, 1, 8, 1, "1f1b", 1, "none", False, 3, precision="fp8", fp8_recipe=recipe)
    sections = job_sections(LLAMA8B, config, 64, 8192)
    assert sections["model"]["converters"] == [converter]
    assert sections[converter] == keys


@pytest.mark.parametrize("megatron", list(RELEASES["megatron"]))
@pytest.mark.parametrize("recipe, cluster_name", [("delayed", "1x8xH100"), ("tensorwise", "1x8xH100"),
                                                  ("mxfp8", "1x8xB200"), ("blockwise", "1x8xH100")])
def test_megatron_fp8_commands_parse_on_every_release(recipe, cluster_name, megatron, engine_check):
    """--fp8-recipe's choices: tensorwise, delayed, mxfp8, blockwise at core_v0.14.0 (+ custom
    at core_v0.19.0), tests/engine_flags/megatron-*.json."""
    from planner.emit.megatron import megatron_steps

    cluster, versions = resolve_cluster(cluster_name), EngineVersions(megatron=megatron)
    request = TrainRequest(global_batch=256, seq_len=8192, precision="fp8", fp8_recipe=recipe,
                           engine_versions=versions)
    plan = train_launchable(LLAMA8B, search(LLAMA8B, cluster, request))
    problems = [p for e in plan.layouts[:10] for step in megatron_steps(LLAMA8B, cluster, e.config, 256, 8192)
                for p in engine_check(step.argv, versions)]
    assert plan.layouts and problems == []
