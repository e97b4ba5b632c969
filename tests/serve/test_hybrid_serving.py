"""Hybrid models in serving: each running sequence holds its recurrent state in the KV pool,
so concurrency is bounded by state + KV; a decode step reads and writes back each sequence's
state instead of a context-length KV read on the recurrent layers. Arithmetic in each
docstring."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from planner.cost.params import sublayers_per_layer
from planner.cost.serving_memory import (
    StageMemory,
    kv_limited_sequences,
    kv_tokens_with_state,
    stage_memory,
)
from planner.cost.serving_time import (
    StepLoad,
    stage_attention_pairs,
    stage_kv_bytes_read,
    stage_step_time,
    tp_allreduce_seconds_per_layer,
)
from planner.layout import Layout, place
from planner.requests import ServeRequest

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
NEMOTRON_H = str(CORPUS / "nvidia--Nemotron-H-56B-Base-8K" / "config.json")


def test_kv_tokens_with_state_by_hand() -> None:
    """Nemotron-H-56B at t = 8 on one GPU: KV 5,120 B per token (10 attention layers), state
    54 * 2,112,512 = 114,075,648 B per sequence. 10 GiB = 10,737,418,240 B free, sequences
    of 1,280 tokens: 1,280 * 5,120 + 114,075,648 = 120,629,248 B each -> 89.012 sequences;
    89.012 * 1,280 = 113,935.4 tokens -> 7,120 blocks of 16 = 113,920 tokens (89 sequences).
    Without the state the same bytes hold 2,097,152 tokens = 1,638 sequences."""
    tokens = kv_tokens_with_state(10 * 2**30, 5_120, 114_075_648, 1_280)
    assert tokens == 113_920 and tokens // 1_280 == 89
    assert 10 * 2**30 // 5_120 // 1_280 == 1_638


def test_hybrid_concurrency_is_bounded_by_state_and_kv(model, cluster) -> None:
    """Nemotron-H-56B, tp = 8 on 8 H100s: the stage's state is its 54 Mamba2 layers' and its KV
    the 10 attention layers'; a running sequence holds S = 1024 + 256/2 + 8 = 1,160 KV tokens on
    average (kv_tokens_per_running_sequence), so the sequences that run are kv_bytes / (S * kv +
    state), the cache's tokens // S, far fewer than kv_bytes / (S * kv). sequences_that_fit
    stays the full-length count vLLM reports for a 1,280-token request."""
    nemotron = model(NEMOTRON_H)
    request = ServeRequest(input_len=1024, output_len=256)
    stage = stage_memory(nemotron, cluster("1x8xH100"), Layout(8, 1, 1), request, 256)[0]
    assert (stage.kv_bytes_per_token, stage.state_bytes_per_sequence) == (5_120, 114_075_648)
    assert stage.num_attention_layers == 10
    running = stage.kv_cache_bytes / (1_160 * 5_120 + 114_075_648)
    assert kv_limited_sequences(stage.kv_cache_tokens, 1024, 256) == math.floor(running)
    fit = stage.kv_cache_bytes / (1_280 * 5_120 + 114_075_648)
    assert stage.sequences_that_fit(1_280) == fit
    assert fit < stage.kv_cache_bytes / (1_280 * 5_120) / 15
    assert stage.max_sequence_tokens == (stage.kv_cache_bytes - 114_075_648) // (5_120 * 16) * 16


def test_decode_reads_state_once_per_sequence_not_the_context() -> None:
    """A stage of 4 layers, 1 attention (kv 5,120 B/token) and 3 recurrent (state 6,000,000 B
    per sequence): 8 sequences decoding at 1,000 tokens of context each:
    (8,000 + 8) * 5,120 = 41,000,960 B of KV + 2 * 8 * 6,000,000 = 96,000,000 B of state read
    and written back = 137,000,960 B; a 1,024-token prompt chunk's 524,800 causal pairs count
    on the one attention layer only."""
    stage = StageMemory(0, 4, 0.0, 0.0, 0.0, 1e9, 5_120, 0, 80e9, num_layers_without_kv=3,
                        state_bytes_per_sequence=6_000_000)
    assert stage_kv_bytes_read(stage, StepLoad(8, 8_000)) == 137_000_960
    assert stage_attention_pairs(stage, StepLoad(0, 0, 1_024, 524_800)) == 524_800


@pytest.mark.parametrize("folder", ["nvidia--Nemotron-H-56B-Base-8K", "Qwen--Qwen3.5-27B"])
def test_plan_a_hybrid_prints_a_command(run_plan, folder: str) -> None:
    """`plan --model <config.json> --cluster 1x8xH100` plans a Mamba2 and a Gated DeltaNet hybrid."""
    result = run_plan("--model", str(CORPUS / folder / "config.json"), "--cluster", "1x8xH100",
                      "--max-model-len", "8192")
    assert result.returncode == 0, result.stderr
    assert "vllm serve MODEL --tensor-parallel-size" in result.stdout


def test_one_mixer_blocks_pay_half_a_layers_fixed_cost_and_all_reduces(model, cluster) -> None:
    """Nemotron-H's 118 blocks hold one mixer each: (2*118 - 54 MLP-only - 64 mixer-only) /
    (2*118) = 1/2 of a layer's two sublayers, so a tp = 8 stage of 118 blocks pays 118 * 0.5 *
    56 us = 3.304 ms of fixed per-layer cost and one all-reduce per block (half of the two a
    transformer layer has); Qwen3.5's layers have both sublayers (share 1)."""
    nemotron, qwen = model(NEMOTRON_H), model(str(CORPUS / "Qwen--Qwen3.5-27B" / "config.json"))
    assert (sublayers_per_layer(nemotron), sublayers_per_layer(qwen)) == (0.5, 1.0)
    c, layout = cluster("1x8xH100"), Layout(8, 1, 1)
    placement = place(c, layout)
    stage = stage_memory(nemotron, c, layout, ServeRequest(), 256)[0]
    step = stage_step_time(nemotron, c, layout, placement, stage, StepLoad(8, 8_000))
    assert step.overhead_seconds == pytest.approx(118 * 0.5 * 56e-6)
    both, _ = tp_allreduce_seconds_per_layer(c, layout, placement, 8 * 8192 * 2)
    assert step.allreduce_seconds_per_layer == pytest.approx(both / 2)
