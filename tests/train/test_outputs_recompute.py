"""Recompute "outputs": Megatron's output-discarding checkpoints (--recompute-granularity selective
--recompute-modules moe_act layernorm [mla_up_proj]) for MoE and MLA models. Hand-worked
bytes and seconds; sources in planner/cost/activations.py and planner/cost/training_time.py."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.cost.activations import (
    activation_bytes_per_layer,
    discarded_output_bytes_per_token,
    outputs_recompute_modules,
    recompute_working_bytes,
)
from planner.cost.flops import layer_gemms_forward
from planner.cost.training_time import gemm_seconds, layer_seconds, outputs_recompute_seconds
from planner.layout import Rejected, TrainConfig
from planner.requests import LayoutFilter, TrainRequest
from planner.specs import SpecError
from planner.train import estimate, outputs_recompute_refusal, train_rates
from planner.train_search import recompute_levels, search

QWEN3_30B = resolve_model("qwen3-30b-a3b")
DEEPSEEK_V3 = resolve_model("deepseek-v3")
LLAMA_8B = resolve_model("llama-3.1-8b")


def test_the_modules_each_model_frees():
    assert outputs_recompute_modules(QWEN3_30B) == ("moe_act", "layernorm")
    assert outputs_recompute_modules(DEEPSEEK_V3) == ("moe_act", "layernorm", "mla_up_proj")
    assert outputs_recompute_modules(LLAMA_8B) == ()


def test_discarded_bytes_by_hand():
    """Qwen3-30B-A3B (h 2,048, k 8, f_x 768, 48 MoE layers of 48): the experts' MLP-down input
    8 * 768 and the pre-MLP norm output 2,048 per token, 2 B each: 16,384 B; with fp8 (1 B a
    saved GEMM input) 8,192 B; at t = 2 with SP both halve: 8,192 B.
    DeepSeek-V3 (h 7,168, k 8, f_x 2,048, 58 MoE layers of 61, MLA with 128 heads of 192 query
    and key and 128 value elements): the mean layer frees 58/61 * 2 * (16,384 + 7,168) = 44,787.4
    B of MoE outputs and, every layer, the input norm 2 * 7,168 and the up-projected queries,
    keys and values 2 * 128 * (192 + 192 + 128) = 131,072: 190,195.4 B per token."""
    assert discarded_output_bytes_per_token(QWEN3_30B, 1, False) == 16_384
    assert discarded_output_bytes_per_token(QWEN3_30B, 1, False, "fp8") == 8_192
    assert discarded_output_bytes_per_token(QWEN3_30B, 2, True) == 8_192
    assert discarded_output_bytes_per_token(DEEPSEEK_V3, 1, False) == pytest.approx(
        58 / 61 * 2 * (8 * 2_048 + 7_168) + 2 * 7_168 + 2 * 128 * (192 + 192 + 128))
    assert discarded_output_bytes_per_token(LLAMA_8B, 1, False) == 0


def test_the_layer_keeps_that_much_less_and_recomputes_it_once():
    """4,096 tokens of Qwen3-30B-A3B at t = 1: 16,384 * 4,096 = 67,108,864 B less per layer,
    and the same bytes as the transient working set of the layer being recomputed."""
    none = activation_bytes_per_layer(QWEN3_30B, 4096, 1, 1, False, "none", "flash")
    outputs = activation_bytes_per_layer(QWEN3_30B, 4096, 1, 1, False, "outputs", "flash")
    assert none - outputs == 16_384 * 4_096 == 67_108_864
    assert recompute_working_bytes(QWEN3_30B, 4096, 1, 1, False, "outputs", "flash") == 67_108_864


def test_recompute_seconds_by_hand():
    """Qwen3-30B-A3B, 4,096 tokens, t = 1, on H100 (elementwise 3.015 TB/s, 2.804 TB/s at the
    0.93 a training step sustains): the activation read gate + up, write the product, 3 * 2 * 8 *
    768 B, and the norm read + write 2 * 2 * 2,048 B per token: (36,864 + 8,192) * 4,096 =
    184,549,376 B, 65.8 us. DeepSeek-V3 adds the
    two up-projection GEMMs forward again (positions 0 and 6)."""
    rates = train_rates(QWEN3_30B, resolve_cluster("1x8xH100"))
    gemms = layer_gemms_forward(QWEN3_30B, 1, 4096, 1)
    seconds = outputs_recompute_seconds(QWEN3_30B, gemms, 4096, 1, 1, False, rates)
    assert seconds == pytest.approx(184_549_376 / rates.elementwise_bytes_per_s)
    assert seconds == pytest.approx(65.8e-6, rel=0.01)
    layer = layer_seconds(QWEN3_30B, 4096, 1, 1, False, "outputs", rates, "flash")
    assert layer.recompute == pytest.approx(seconds)
    deepseek_rates = train_rates(DEEPSEEK_V3, resolve_cluster("1x8xH100"))
    mla = layer_gemms_forward(DEEPSEEK_V3, 1, 4096, 1)
    up = gemm_seconds(mla[0], deepseek_rates) + gemm_seconds(mla[6], deepseek_rates)
    assert outputs_recompute_seconds(DEEPSEEK_V3, mla, 4096, 1, 1, False, deepseek_rates) > up > 0


def test_where_it_is_a_level():
    assert outputs_recompute_refusal(QWEN3_30B, TrainRequest(global_batch=64, seq_len=4096)) is None
    assert "neither MoE nor MLA" in outputs_recompute_refusal(LLAMA_8B, TrainRequest(global_batch=64, seq_len=4096))
    delayed = TrainRequest(global_batch=64, seq_len=4096, precision="fp8")
    assert "delayed scaling" in outputs_recompute_refusal(QWEN3_30B, delayed)
    current = TrainRequest(global_batch=64, seq_len=4096, precision="fp8", fp8_recipe="tensorwise")
    assert outputs_recompute_refusal(QWEN3_30B, current) is None
    assert recompute_levels(QWEN3_30B, current) == ["none", "outputs", "selective", "full"]
    assert recompute_levels(LLAMA_8B, current) == ["none", "selective", "full"]
    config = TrainConfig(1, 1, 8, 1, "1f1b", 1, "outputs", False, 1)
    rejected = estimate(LLAMA_8B, resolve_cluster("1x8xH100"), config, TrainRequest(global_batch=64, seq_len=4096))
    assert isinstance(rejected, Rejected) and rejected.reasons[0].startswith("recompute outputs: ")


def test_the_search_takes_it_between_none_and_full():
    """Qwen3-30B-A3B on 8 H100 at 2,048 tokens, tp 4, pp 2, b 2, interleaved over 2 chunks, no
    ZeRO, ep 1: no recompute runs out of memory and "outputs" fits (78.8 of 79.1 GiB), faster than
    full recompute would."""
    cluster = resolve_cluster("1x8xH100")
    fixed = dict(global_batch=32, seq_len=2048, layout=LayoutFilter(tp=4, pp=2, dp=1, ep=1), micro_batch=2,
                 zero_stage=0, schedule="interleaved", virtual_stages=2)
    chosen = search(QWEN3_30B, cluster, TrainRequest(**fixed)).layouts[0]
    assert chosen.config.recompute == "outputs"
    assert isinstance(estimate(QWEN3_30B, cluster, chosen.config.with_(recompute="none"),
                               TrainRequest(**fixed)), Rejected)
    full = search(QWEN3_30B, cluster, TrainRequest(**fixed, recompute="full")).layouts[0]
    assert chosen.step_time_seconds < full.step_time_seconds


def test_the_command_and_the_errors():
    runner = CliRunner()
    args = ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "1x8xH100", "--global-batch", "64",
            "--seq-len", "4096", "--recompute", "outputs", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["recommended"]
    argv = best["command"][0]["argv"]
    assert best["recompute"] == "outputs"
    i = argv.index("--recompute-granularity")
    assert argv[i:i + 5] == ["--recompute-granularity", "selective", "--recompute-modules", "moe_act", "layernorm"]
    dense = runner.invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                "--global-batch", "64", "--seq-len", "4096", "--recompute", "outputs"])
    assert dense.exit_code == 2 and "--recompute outputs: llama-3.1-8b has neither MoE nor MLA" in dense.output
    with pytest.raises(SpecError, match="delayed scaling"):
        search(QWEN3_30B, resolve_cluster("1x8xH100"),
               TrainRequest(global_batch=64, seq_len=4096, recompute="outputs", precision="fp8"))


def test_under_delayed_fp8_an_mla_model_keeps_its_up_projection_recompute():
    """Megatron refuses moe_act and layernorm recompute with fp8 delayed scaling
    (TransformerConfig.__post_init__, core_v0.19.0), not mla_up_proj: DeepSeek-V3's "outputs"
    level there discards only the up-projected queries, keys and values, 2 * 128 * (192 + 192 +
    128) = 131,072 B per token (against 190,195.4 with moe_act and layernorm), and the command
    names mla_up_proj alone. Qwen3-30B-A3B has no MLA: the level stays refused."""
    assert outputs_recompute_modules(DEEPSEEK_V3, fp8_delayed=True) == ("mla_up_proj",)
    assert outputs_recompute_modules(QWEN3_30B, fp8_delayed=True) == ()
    assert discarded_output_bytes_per_token(DEEPSEEK_V3, 1, False, "fp8", fp8_delayed=True) == 131_072
    delayed = TrainRequest(global_batch=64, seq_len=4096, precision="fp8")
    assert outputs_recompute_refusal(DEEPSEEK_V3, delayed) is None
    assert "delayed scaling" in outputs_recompute_refusal(QWEN3_30B, delayed)
    # the layer keeps the up-projections' bytes less than at no recompute, and reruns only them
    keep_none = activation_bytes_per_layer(DEEPSEEK_V3, 4096, 1, 1, False, "none", "flash", "fp8")
    keep_outputs = activation_bytes_per_layer(DEEPSEEK_V3, 4096, 1, 1, False, "outputs", "flash", "fp8",
                                              fp8_delayed=True)
    assert keep_none - keep_outputs == 131_072 * 4096
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "deepseek-v3", "--cluster", "128x8xH100",
                                      "--global-batch", "1024", "--seq-len", "4096", "--precision", "fp8",
                                      "--recompute", "outputs", "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    argv = json.loads(result.output)["recommended"]["command"][0]["argv"]
    i = argv.index("--recompute-modules")
    assert argv[i + 1] == "mla_up_proj" and not argv[i + 2].startswith(("moe_act", "layernorm"))
