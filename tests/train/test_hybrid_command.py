"""A hybrid (Mamba2 / Gated DeltaNet) model gets no Megatron command: pretrain_gpt.py would
build attention in every layer, another model than the one planned; --emit none plans it."""

from __future__ import annotations

from pathlib import Path

from planner.catalog import resolve_cluster, resolve_model
from planner.emit.megatron import refusals
from planner.engines import parse_engine_versions
from planner.layout import TrainConfig

NEMOTRON_H = Path(__file__).parent.parent / "fixtures" / "hf_configs" / "nvidia--Nemotron-H-56B-Base-8K"


def test_hybrid_gets_no_megatron_command():
    model = resolve_model(str(NEMOTRON_H))
    assert model.num_recurrent_layers > 0
    release = parse_engine_versions("megatron=core_v0.19.0").megatron_release
    config = TrainConfig(8, 1, 1, 1, "1f1b", 1, "none", True, 1)
    (why,) = refusals(model, config, release)
    assert "mamba2" in why and "another model" in why
    assert refusals(resolve_model("llama-3.1-8b"), config, release) == []
    assert resolve_cluster("1x8xH100")  # the shorthand the CLI test below plans on


def test_hybrid_trains_with_emit_none(run_plan):
    result = run_plan("--workload", "train", "--model", str(NEMOTRON_H), "--cluster", "4x8xH100",
                      "--global-batch", "256", "--seq-len", "4096", "--emit", "none", "--json")
    assert result.returncode == 0, result.stderr
    assert '"recommended": {' in result.stdout


def test_gemma4_gets_no_megatron_command():
    """Gemma 4's global layers (head dim 512, 2 KV heads, K = V projection) cannot be said in
    pretrain_gpt.py's flags: refused in one line, like the hybrids."""
    model = resolve_model(str(NEMOTRON_H.parent / "google--gemma-4-26B-A4B"))
    release = parse_engine_versions("megatron=core_v0.19.0").megatron_release
    config = TrainConfig(1, 1, 8, 1, "1f1b", 1, "none", False, 1)
    (why,) = refusals(model, config, release)
    assert "Gemma 4" in why and "another model" in why


def test_nas_blocks_get_no_megatron_command():
    """Nemotron-Super-49B (DeciLM block_configs): 31 of 80 layers without attention and
    per-layer FFN widths, which pretrain_gpt.py's uniform layers cannot build."""
    model = resolve_model(str(NEMOTRON_H.parent / "nvidia--Llama-3_3-Nemotron-Super-49B-v1"))
    assert model.num_mlp_only_layers == 31
    release = parse_engine_versions("megatron=core_v0.19.0").megatron_release
    config = TrainConfig(8, 1, 1, 1, "1f1b", 1, "none", True, 1)
    (why,) = refusals(model, config, release)
    assert "per layer" in why and "another model" in why


def test_llama4_chunked_attention_gets_no_megatron_command():
    """Llama-4-Scout's RoPE layers attend in 8,192-token chunks beside full-attention NoPE layers
    (config.json attention_chunk_size, read by the import and in the shipped spec): the command
    would give every layer full RoPE attention, another model; torchtitan builds it."""
    release = parse_engine_versions("megatron=core_v0.19.0").megatron_release
    config = TrainConfig(8, 1, 1, 1, "1f1b", 1, "none", True, 1)
    scout = resolve_model("llama-4-scout")
    imported = resolve_model(str(NEMOTRON_H.parent / "meta-llama--Llama-4-Scout-17B-16E-Instruct"))
    assert scout.attention_chunk_size == imported.attention_chunk_size == 8192
    (why,) = refusals(scout, config, release)
    assert "8,192-token chunks" in why and "another model" in why and "--engine torchtitan" in why


def test_value_heads_narrower_than_keys_get_no_megatron_command():
    """One attention shape whose values have 128 dims beside 192 for queries and keys:
    --kv-channels has one head dim, so the command would train another model."""
    base = resolve_model("llama-3.1-8b")
    narrow = base.model_copy(update={"head_dim": 192, "v_head_dim": 128})
    release = parse_engine_versions("megatron=core_v0.19.0").megatron_release
    config = TrainConfig(1, 1, 8, 1, "1f1b", 1, "none", False, 1)
    (why,) = refusals(narrow, config, release)
    assert "128 beside 192" in why and "another model" in why
    assert refusals(base.model_copy(update={"v_head_dim": base.head_dim}), config, release) == []


def test_a_model_megatron_cannot_build_is_planned_without_a_command(run_plan):
    """The plan stands (its sizes and times hold); only the launch is not emitted, and JSON says
    why: a hybrid, and gpt-oss's sliding-window layers (full attention in every layer would be
    another model)."""
    import json

    for model in (str(NEMOTRON_H), "gpt-oss-120b"):
        result = run_plan("--workload", "train", "--model", model, "--cluster", "4x8xH100",
                          "--global-batch", "256", "--seq-len", "4096", "--json")
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["recommended"] is not None and data["recommended"]["command"] == []
        assert "another model" in data["launch_not_emitted"]
    sliding = resolve_model("gpt-oss-120b")
    release = parse_engine_versions("megatron=core_v0.19.0").megatron_release
    (why,) = refusals(sliding, TrainConfig(8, 1, 1, 1, "1f1b", 1, "none", True, 1), release)
    assert "18 sliding-window layers (128 tokens)" in why
