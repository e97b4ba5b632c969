"""Gemma 4's two attention shapes, worked by hand for gemma-4-26B-A4B (text_config: h 2816,
a 16; 25 sliding layers of k 8, d 256; 5 full layers of global_head_dim 512 and, with
attention_k_eq_v, num_global_key_value_heads 2 and no v_proj; 128 experts of 704, top 8,
beside a dense MLP of 2112 in every layer; vocab 262,144, tied; bf16).
Sources: transformers models/gemma4/modeling_gemma4.py (Gemma4TextAttention,
Gemma4TextDecoderLayer); vllm/model_executor/models/gemma4.py (Gemma4Attention caches K and V
of every layer, k_eq_v ones included); vllm/v1/core/kv_cache_utils.py
unify_kv_cache_spec_page_size.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.params import (
    attention_linear_weights_of_kind,
    kv_bytes_per_token,
    kv_bytes_per_token_per_layer_by_kind,
    param_counts,
    tp_head_reasons,
)
from planner.cost.serving_memory import kv_cache_capacity, kv_limited_sequences, kv_running_capacity
from planner.hf_config import load_hf_config
from planner.specs import ModelSpec, SpecError

CONFIGS = Path(__file__).parents[1] / "fixtures" / "hf_configs"
GEMMA4_26B = CONFIGS / "google--gemma-4-26B-A4B"


@pytest.fixture(scope="module")
def gemma() -> ModelSpec:
    return load_hf_config(GEMMA4_26B / "config.json")


def test_the_import_reads_both_attention_shapes_and_the_moe_block(gemma: ModelSpec) -> None:
    assert (gemma.head_dim, gemma.num_key_value_heads, gemma.num_window_layers) == (256, 8, 25)
    assert (gemma.global_head_dim, gemma.num_global_key_value_heads, gemma.attention_k_eq_v) == (512, 2, True)
    assert (gemma.num_local_experts, gemma.num_experts_per_tok, gemma.expert_intermediate_size) == (128, 8, 704)
    assert (gemma.num_shared_experts, gemma.shared_expert_intermediate_size, gemma.gated_mlp) == (1, 2112, True)


def test_one_sliding_and_one_global_layer_attention_weights(gemma: ModelSpec) -> None:
    """Sliding: Q 2816*16*256 = 11,534,336, K and V 2*2816*8*256 = 11,534,336,
    O 16*256*2816 = 11,534,336: 34,603,008.
    Global: Q 2816*16*512 = 23,068,672, K (= V) 2816*2*512 = 2,883,584,
    O 16*512*2816 = 23,068,672: 49,020,928."""
    assert attention_linear_weights_of_kind(gemma, full=False) == 34_603_008
    assert attention_linear_weights_of_kind(gemma, full=True) == 49_020_928


def test_one_sliding_and_one_global_layer_kv_bytes_per_token(gemma: ModelSpec) -> None:
    """bf16, one GPU: sliding 2 (K, V) * 8 * 256 * 2 = 8,192; global 2 * 2 * 512 * 2 = 4,096
    (K and V both cached: V is k_proj(x) without k_norm's scale and the RoPE).
    Whole model: 25 * 8,192 + 5 * 4,096 = 225,280. tp=8: sliding 8/8 = 1 head, 2*1*256*2 =
    1,024; global 2 heads replicated to 1 per GPU, 2*1*512*2 = 2,048. fp8: one byte each."""
    assert kv_bytes_per_token_per_layer_by_kind(gemma, 1, "auto") == (4_096, 8_192)
    assert kv_bytes_per_token(gemma) == 225_280
    assert kv_bytes_per_token_per_layer_by_kind(gemma, 8, "auto") == (2_048, 1_024)
    assert kv_bytes_per_token_per_layer_by_kind(gemma, 1, "fp8") == (2_048, 4_096)


def test_total_and_active_match_googles_published_counts(gemma: ModelSpec) -> None:
    """Google's Gemma 4 model card: 26B A4B has 25.2B total and 3.8B active parameters
    (text model; the ~550M vision encoder is not counted here). Ours: 25,232,613,120 total,
    3,822,001,920 active (8 of 128 experts + the dense MLP + attention + the tied embedding)."""
    counts = param_counts(gemma)
    assert counts.total == pytest.approx(25.2e9, rel=0.02)
    assert counts.active == pytest.approx(3.8e9, rel=0.05)


def test_kv_pool_pages_unify_the_two_kinds(gemma: ModelSpec) -> None:
    """30 layers, 25 window: groups of 5 (kv_cache_groups), 1 full and 5 window groups.
    page = 16 tokens * 8,192 = 131,072 bytes; full layers (4,096 per token) get 32-token blocks.
    Per request at M = 262,144, no tokens in flight: 1 * 262,144/32 + 5 * (ceil(1,023/16) + 1)
    = 8,192 + 325 = 8,517 blocks; a pool of 8,517 * 5 * 131,072 bytes holds one such request."""
    kv_bytes = 8_517 * 5 * 131_072
    assert kv_cache_capacity(gemma, 30, 25, kv_bytes, 8_192, 262_144, 0, 4_096) == 262_144


def test_running_sequences_keep_only_their_window_in_the_window_layers(gemma: ModelSpec) -> None:
    """The same pool, 8,517 blocks of 5 layers' pages, running sequences of 1,024 + 256 tokens:
    S = 1,024 + 128 + 8 (half a block) = 1,160 tokens. Each holds 1,160/32 = 36.25 blocks in the
    full group and, in each of the 5 window groups, the blocks over its last window:
    min(1,160, 1,023 + 16)/16 = 64.9375; per sequence 36.25 + 5 * 64.9375 = 360.9375 blocks.
    8,517 / 360.9375 = 23.597 sequences, 23.597 * 1,160 = 27,372.5 -> 27,372 tokens: 23 running
    sequences, where the admission count (262,144 tokens, one max-length request) over S would
    say 225."""
    kv_bytes = 8_517 * 5 * 131_072
    running = kv_running_capacity(gemma, 30, 25, kv_bytes, 8_192, 1_160, 0, 4_096)
    assert running == 27_372
    assert kv_limited_sequences(running, 1_024, 256) == 23
    assert kv_limited_sequences(kv_cache_capacity(gemma, 30, 25, kv_bytes, 8_192, 262_144, 0, 4_096),
                                1_024, 256) == 225


def test_a_sequence_shorter_than_the_window_holds_every_token_in_every_layer(gemma: ModelSpec) -> None:
    """S = 512 tokens < the 1,024-token window: 512/32 + 5 * 512/16 = 176 blocks a sequence;
    8,517 / 176 = 48.392 sequences, 48.392 * 512 = 24,776.7 -> 24,776 tokens."""
    kv_bytes = 8_517 * 5 * 131_072
    assert kv_running_capacity(gemma, 30, 25, kv_bytes, 8_192, 512, 0, 4_096) == 24_776


def test_tokens_in_flight_keep_their_window_blocks_until_the_next_step(gemma: ModelSpec) -> None:
    """The same pool with 2 x 2,048 tokens in flight (p = 1, a 2,048-token budget): each of the 5
    window groups holds 4,096 / 16 = 256 blocks for them, 1,280 in all, so 7,237 blocks are left:
    7,237 / 360.9375 = 20.0506 sequences, 20.0506 * 1,160 = 23,258.7 -> 23,258 tokens."""
    kv_bytes = 8_517 * 5 * 131_072
    assert kv_running_capacity(gemma, 30, 25, kv_bytes, 8_192, 1_160, 4_096, 4_096) == 23_258


def test_the_running_batch_does_not_depend_on_max_model_len() -> None:
    """The concurrency a layout runs is set by the running sequences' blocks, not by the
    admission count at --max-model-len (which spreads each request's window layers over M
    tokens): the same tp=1 replica on an H100 runs the same batch at M = 4,096 and at the
    model's 262,144."""
    batches = []
    for extra in ([], ["--max-model-len", "4096"]):
        result = CliRunner().invoke(app, ["--model", str(GEMMA4_26B), "--cluster", "1x8xH100", "--gpus", "1",
                                          "--mode", "aggregated", "--json", *extra])
        assert result.exit_code == 0, result.output
        batches.append(json.loads(result.stdout)["layouts"][0]["batch"])
    assert batches[0] == batches[1]
    assert batches[0] < 256


def test_tp_checks_the_full_attention_kv_heads_too() -> None:
    fields = {"name": "g", "num_hidden_layers": 6, "hidden_size": 768, "num_attention_heads": 12,
              "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 1000,
              "max_position_embeddings": 512, "sliding_window": 64, "num_sliding_window_layers": 5,
              "global_head_dim": 128, "num_global_key_value_heads": 3, "attention_k_eq_v": True}
    model = ModelSpec(**fields)
    assert tp_head_reasons(model, 4) == ["full-attention KV heads 3 neither divisible by nor dividing tp=4"]
    assert tp_head_reasons(model, 2) == ["full-attention KV heads 3 neither divisible by nor dividing tp=2"]
    assert tp_head_reasons(model, 12) == []


def test_per_layer_inputs_are_refused_in_one_line(tmp_path: Path) -> None:
    text = (GEMMA4_26B / "config.json").read_text().replace(
        '"hidden_size_per_layer_input": 0', '"hidden_size_per_layer_input": 256')
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(SpecError, match="hidden_size_per_layer_input: per-layer input embeddings"):
        load_hf_config(tmp_path / "config.json")


def test_plan_gemma4_26b_on_8_h100s_prints_a_command() -> None:
    result = CliRunner().invoke(app, ["--model", str(GEMMA4_26B), "--cluster", "1x8xH100"])
    assert result.exit_code == 0, result.output
    assert "vllm serve" in result.stdout


@pytest.mark.parametrize(("update", "message"), [
    ({"num_global_key_value_heads": 5}, "num_global_key_value_heads: 5 does not divide"),
    ({"num_sliding_window_layers": 6}, "global_head_dim: full-attention layer shapes need"),
])
def test_global_attention_fields_are_validated(update: dict[str, int], message: str) -> None:
    fields = {"name": "g", "num_hidden_layers": 6, "hidden_size": 768, "num_attention_heads": 12,
              "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 1000,
              "max_position_embeddings": 512, "sliding_window": 64, "num_sliding_window_layers": 5,
              "global_head_dim": 128, "num_global_key_value_heads": 3, "attention_k_eq_v": True}
    with pytest.raises(ValueError, match=message):
        ModelSpec(**{**fields, **update})
