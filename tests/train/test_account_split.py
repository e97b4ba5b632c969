"""The third pipeline split: the embedding and the loss counted as one layer each
(Megatron's --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split;
get_num_layers_to_build in megatron/core/transformer/transformer_block.py, core_v0.19.0)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.cost import stage_split as split
from planner.emit.megatron import parallel_args
from planner.layout import Rejected, TrainConfig
from planner.requests import TrainRequest
from planner.train import config_reasons, estimate, stage_layers, stage_memories

LLAMA_405B = resolve_model("llama-3.1-405b")
H100_128 = resolve_cluster("128x8xH100")
PP8_VP8 = TrainConfig(8, 8, 16, 1, "interleaved", 8, "full", True, 1, account_for_embedding_and_loss=True)
"""NeMo / Megatron-Bridge's 405B layout without CP: tp 8, pp 8, vp 8, b 1."""


def megatron_chunk_layers(num_layers: int, pp: int, v: int) -> list[list[int]]:
    """Decoder layers of every (stage, chunk) as get_num_layers_to_build computes them with
    both account flags: (L+2)/pp per rank, /v per chunk, one fewer in the first chunk of the
    first rank (the embedding) and in the last chunk of the last rank (the loss)."""
    per_chunk = (num_layers + 2) // pp // v
    chunks = [[per_chunk] * v for _ in range(pp)]
    chunks[0][0] -= 1
    chunks[-1][-1] -= 1
    return chunks


def test_405b_pp8_vp8_split_by_hand():
    """126 layers + embedding + loss = 128 units; pp*v = 64 chunks of u = 2 units. Stage 0:
    chunk 0 = embedding + 1 layer, chunks 1-7 = 2 layers -> 1 + 7*2 = 15 layers; stages 1-6:
    8 chunks x 2 = 16; stage 7: chunks 0-6 = 14, chunk 7 = 1 layer + loss -> 15.
    15 + 6*16 + 15 = 126. No first/last split exists for v = 8 (126 is not a multiple of 8)."""
    assert split.account_split(126, 8, 8) == (15, 15)
    assert split.layers_per_stage(126, 8, (15, 15)) == (15,) + (16,) * 6 + (15,)
    assert stage_layers(LLAMA_405B, PP8_VP8) == (15, 16, 15)
    assert megatron_chunk_layers(126, 8, 8)[0] == [1] + [2] * 7
    assert megatron_chunk_layers(126, 8, 8)[-1] == [2] * 7 + [1]
    assert not split.has_split(126, 8, 8)
    assert config_reasons(LLAMA_405B, PP8_VP8, 1024) == []


def test_405b_pp8_vp8_memory_by_hand():
    """tp = 8, s = 8192, b = 1, full recompute, SP, m = 1024/(1*16) = 64. One layer per GPU:
    (Q + O 536,870,912 + K, V 33,554,432 + MLP 2,617,245,696) / 8 + norms 32,768 = 398,491,648
    params. Embedding and LM head, each V*h/t = 128,256*16,384/8 = 262,668,288.
    Stage 0: 15 layers + embedding = 6,240,043,008 params -> 12,480,086,016 B of 16-bit weights;
    stage 1: 16 layers = 6,375,866,368 -> 12,751,732,736 B; stage 7: 15 layers + LM head +
    final norm 16,384 = 6,240,059,392 -> 12,480,118,784 B.
    Activations (stored layer inputs 2*s*h/t = 33,554,432 B per layer per micro-batch) x
    micro-batches in flight p + (p - 2i - 1)/v: stage 0 8.875 x 15 = 133.125 layer-micro-batches
    = 4,466,933,760 B; stage 1 8.625 x 16 = 138 -> 4,630,511,616 B (the heaviest); both plus
    the same recompute working set (stage 0 also the embedding's dropout masks)."""
    stage0, stage1, stage7 = stage_memories(LLAMA_405B, PP8_VP8, 8192, 64, (0, 1, 7))
    assert (stage0.num_layers, stage1.num_layers, stage7.num_layers) == (15, 16, 15)
    assert stage0.weights_bytes == 12_480_086_016
    assert stage1.weights_bytes == 12_751_732_736
    assert stage7.weights_bytes == 12_480_118_784
    working = stage1.activation_bytes - 4_630_511_616
    mask = 8192 * 16384 // 8  # one byte per element, / t with SP
    assert stage0.activation_bytes == pytest.approx(working + 4_466_933_760 + mask * 8.875)


def test_405b_pp8_vp8_estimate_paces_on_a_middle_stage_and_emits_the_flags():
    """The 16-layer middle stages pace the pipeline (the first and last hold 15 layers plus a
    small embedding / an LM head worth 0.26 of a layer); the command names both flags, v by
    --num-virtual-stages-per-pipeline-rank, and no first/last layer counts."""
    result = estimate(LLAMA_405B, H100_128, PP8_VP8, TrainRequest(global_batch=1024, seq_len=8192))
    assert not isinstance(result, Rejected), result
    assert result.num_layers_per_stage == (15,) + (16,) * 6 + (15,)
    assert result.slowest_stage == 1
    args = parallel_args(LLAMA_405B, result.config, 1024)
    assert "--account-for-embedding-in-pipeline-split" in args and "--account-for-loss-in-pipeline-split" in args
    assert args[args.index("--num-virtual-stages-per-pipeline-rank") + 1] == "8"
    assert "--decoder-first-pipeline-num-layers" not in args


def test_the_estimate_picks_the_split_where_v_does_not_divide():
    """pp 8, v 8 without the flag set: the estimate fills it in (no first/last split exists)."""
    config = TrainConfig(8, 8, 16, 1, "interleaved", 8, "full", True, 1)
    result = estimate(LLAMA_405B, H100_128, config, TrainRequest(global_batch=1024, seq_len=8192))
    assert not isinstance(result, Rejected) and result.config.account_for_embedding_and_loss


def test_pp32_v2_prefers_the_lighter_first_stage():
    """126 over 32 stages in chunks of 2: first/last split 4 | 4 x30 | 2 (slowest: the first
    stage, 4 layers + embedding) vs 128 units over 64 chunks, 3 | 4 x30 | 3 (slowest: 4 layers)."""
    costs = split.StageSeconds(1.0, 0.01, 0.26)
    assert split.best_split(126, 32, 2, costs) == (4, 2)
    config = TrainConfig(8, 32, 4, 1, "interleaved", 2, "full", True, 1)
    result = estimate(LLAMA_405B, H100_128, config, TrainRequest(global_batch=1024, seq_len=8192))
    assert result.config.account_for_embedding_and_loss and result.config.first_last_layers is None
    assert result.num_layers_per_stage == (3,) + (4,) * 30 + (3,)


def test_v1_keeps_the_first_last_split():
    """v = 1: the account split 15 | 16 x6 | 15 is a first/last split too; a tie keeps the
    first/last flags (the command the planner has always given)."""
    config = TrainConfig(8, 8, 16, 1, "1f1b", 1, "full", True, 1)
    result = estimate(LLAMA_405B, H100_128, config, TrainRequest(global_batch=1024, seq_len=8192))
    assert result.config.first_last_layers == (15, 15) and not result.config.account_for_embedding_and_loss


def test_explicit_account_split_megatron_refuses():
    """pp*v = 48 does not divide 128; and never with first/last layers."""
    bad = TrainConfig(8, 16, 8, 1, "interleaved", 3, "full", True, 1, account_for_embedding_and_loss=True)
    assert "not divisible by pp*v = 48" in config_reasons(LLAMA_405B, bad, 1024)[0]
    both = TrainConfig(8, 8, 16, 1, "1f1b", 1, "full", True, 1, (15, 15), account_for_embedding_and_loss=True)
    assert "cannot be combined" in config_reasons(LLAMA_405B, both, 1024)[0]
    assert "Megatron's split" in config_reasons(LLAMA_405B, PP8_VP8, 1024, engine="torchtitan")[0]


def test_json_names_the_split():
    result = CliRunner().invoke(app, ["--workload", "train", "--json", "--model", "llama-3.1-405b", "--cluster",
                                      "128x8xH100", "--global-batch", "1024", "--seq-len", "8192",
                                      "--layout", "tp=8,pp=8", "--virtual-stages", "8"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["recommended"]
    assert best["pipeline_split"] == "account"
    assert best["num_layers_per_stage"] == [15] + [16] * 6 + [15]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(num_layers=st.integers(2, 200), pp=st.integers(2, 64), v=st.integers(1, 16))
def test_every_split_sums_to_the_layers(num_layers, pp, v):
    """Every split the planner offers holds L decoder layers in all; the account split's chunks
    each hold (L+2)/(p*v) units (Megatron's own rule, megatron_chunk_layers, agrees per stage);
    a first/last split's stages are whole multiples of v."""
    account = split.account_split(num_layers, pp, v)
    if account is not None:
        stages = split.layers_per_stage(num_layers, pp, account)
        assert sum(stages) == num_layers and len(stages) == pp
        chunks = megatron_chunk_layers(num_layers, pp, v)
        assert [sum(c) for c in chunks] == list(stages)
        units = [list(c) for c in chunks]
        units[0][0] += 1  # the embedding
        units[-1][-1] += 1  # the loss
        assert {u for c in units for u in c} == {(num_layers + 2) // (pp * v)}
    for first, middle, last in split.candidate_splits(num_layers, pp, v):
        assert first + (pp - 2) * middle + last == num_layers
        assert first % v == middle % v == last % v == 0
