"""Sliding-window attention layers in the serving model: KV cache capacity as vLLM 0.33.0's
hybrid KV cache manager reports it, the KV a decode step reads and the prompt pairs a window
layer computes. Hand-worked numbers, arithmetic in each docstring.

gpt-oss-120b: L = 36 (18 sliding_attention with W = 128, 18 full_attention), k = 8, d = 64,
a = 64, bf16 KV: 2 * 8 * 64 * 2 = 2,048 B per token and layer.
mistral-7b (v0.1 style, W = 4096 on every layer): L = 32, k = 8, d = 128: 4,096 B per token
and layer.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.serving_memory import kv_cache_groups, stage_memory, stage_window_layer_counts
from planner.cost.serving_time import (
    StepLoad,
    causal_pairs,
    stage_kv_bytes_read,
    stage_step_time,
    window_capped_tokens,
)
from planner.layout import Layout, place
from planner.requests import ServeRequest

H100_HBM_DECODE = 3350e9 * 0.76
H100_FLASH = 989e12 * 0.61  # the H100 catalog entry's flash_attention_forward_fraction


def _stage(m, cluster, max_model_len: int | None = None):
    """The model's one stage on one H100."""
    c, layout = cluster("1x1xH100"), Layout(1, 1, 1)
    stage = stage_memory(m, c, layout, ServeRequest(max_model_len=max_model_len), max_num_seqs=256)[0]
    return m, c, layout, stage


def _full(model, name: str):
    """The same model with every layer attending in full."""
    return model(name, sliding_window=None, num_sliding_window_layers=None)


def test_gpt_oss_120b_kv_bytes_per_token_and_kv_tokens_h100(model, cluster):
    """gpt-oss-120b on one H100, max_model_len = 131,072 (its max_position_embeddings),
    max_num_batched_tokens 8,192 (vLLM 0.33's H100 default).
    KV per token: 36 layers * 2,048 B = 73,728 B, of which the 18 window layers hold 36,864.
    vLLM's groups: 18 full and 18 window layers -> g = 18, one full and one window group; a
    block holds one 16-token page of 18 layers = 18 * 16 * 2,048 = 589,824 B.
    KV bytes left (0.9 of the CUDA-visible 79.11 GiB less weights, the profile peak and
    overhead): 8,843,277,823.3 B -> 14,993 blocks (the pool both groups draw from).
    A max-length request reserves ceil(131072 / 16) = 8,192 full blocks + ceil(min(127 +
    2 * 8192 in flight, 131072) / 16) + 1 = 1,032 + 1 = 1,033 window blocks = 9,225:
    concurrency 14,993 / 9,225 = 1.6253; KV tokens int(1.6253 * 131,072) = 213,025
    (all-full: 8,843,277,823.3 // (73,728 * 16) = 7,496 blocks = 119,936 tokens)."""
    m, _, _, stage = _stage(model("gpt-oss-120b"), cluster)
    assert (stage.kv_bytes_per_token, stage.window_kv_bytes_per_token) == (73_728, 36_864)
    assert (stage.num_window_layers, stage.sliding_window_tokens) == (18, 128)
    assert kv_cache_groups(18, 18) == (18, 1, 1)
    assert stage.kv_cache_bytes == pytest.approx(8_843_277_823.3, abs=1)
    assert int(stage.kv_cache_bytes // 589_824) == 14_993
    assert stage.kv_cache_tokens == int(14_993 / 9_225 * 131_072) == 213_025
    *_, full = _stage(_full(model, "gpt-oss-120b"), cluster)
    assert full.kv_cache_tokens == 119_936 and full.kv_bytes_per_token == 73_728


def test_gpt_oss_120b_short_max_model_len_gains_no_admission_room(model, cluster):
    """max_model_len 8,192 is below W - 1 + the 16,384 in-flight tokens, so vLLM reserves a
    window group as much as a full one, plus its extra block: 512 + 513 = 1,025 blocks per
    request; int(14,993 / 1,025 * 8,192) = 119,826, just under the all-full 119,936. (At run
    time the window layers free the blocks before the window; the admission bound does not.)"""
    *_, stage = _stage(model("gpt-oss-120b"), cluster, 8192)
    assert stage.kv_cache_tokens == int(14_993 / 1_025 * 8_192) == 119_826


def test_gpt_oss_120b_decode_reads_the_window_only(model, cluster):
    """64 sequences at context 1,152 on gpt-oss-120b, one H100: full layers read 64 * 1,152
    tokens and write 64, window layers read 64 * min(1,152, 128) = 8,192 and write 64:
    (73,728 + 64) * 36,864 + (8,192 + 64) * 36,864 = 2,720,268,288 + 304,349,184
    = 3,024,617,472 B -> 1.188 ms at 2.546 TB/s (all-full: 73,792 * 73,728 = 5,440,536,576 B)."""
    m, c, layout, stage = _stage(model("gpt-oss-120b"), cluster)
    load = StepLoad(64, 64 * 1152)
    assert stage_kv_bytes_read(stage, load) == 3_024_617_472
    step = stage_step_time(m, c, layout, place(c, layout), stage, load)
    assert step.attention_seconds == pytest.approx(3_024_617_472 / H100_HBM_DECODE, rel=1e-9)
    no_window = dataclasses.replace(stage, num_window_layers=0, sliding_window_tokens=None)
    assert stage_kv_bytes_read(no_window, load) == 73_792 * 73_728


def test_gpt_oss_120b_prompt_pairs_within_the_window(model, cluster):
    """A 2,048-token prompt alone: full layers pair 2,048 * 2,049 / 2 = 2,098,176, window
    layers at most 2,048 * 128 = 262,144 (the mean 1,024.5 keys per query capped at 128).
    Attention = 2,048 * 73,728 B written / HBM + 4 * (2,098,176 + 262,144) * 18 * 64 * 64
    FLOP / (989 TFLOP/s * 0.61, the H100's measured flash share at head dim 128, * 0.768908,
    its head-dim-64 factor (64/119) / (128/183)) = 0.0593 + 1.1517 / 0.768908 = 0.0593 + 1.4978 ms."""
    m, c, layout, stage = _stage(model("gpt-oss-120b"), cluster)
    step = stage_step_time(m, c, layout, place(c, layout), stage, StepLoad(0, 0, 2048, causal_pairs(2048), 1))
    head_dim_64 = (64 / 119) / (128 / 183)
    expected = (2048 * 73_728 / H100_HBM_DECODE
                + 4 * (2_098_176 + 262_144) * 18 * 64 * 64 / (H100_FLASH * head_dim_64))
    assert step.attention_seconds == pytest.approx(expected, rel=1e-9)


def test_mistral_7b_all_window_layers(model, cluster):
    """Mistral-7B v0.1 style: W = 4,096 on all 32 layers, max_model_len 32,768. One group (a
    uniform type) of 32 layers: a block is 32 * 16 * 4,096 = 2,097,152 B, as without a window.
    A request reserves ceil(min(4,095 + 16,384, 32,768) / 16) + 1 = 1,280 + 1 = 1,281 blocks
    instead of 2,048: KV tokens = int(blocks / 1,281 * 32,768), 1.6x the all-full blocks * 16.
    A decode step at context 8,192 reads min(8,192, 4,096) per sequence: for 8 sequences
    (8 * 4,096 + 8) * 131,072 B instead of (8 * 8,192 + 8) * 131,072 B."""
    m, c, layout, stage = _stage(model("mistral-7b", sliding_window=4096), cluster, 32768)
    assert kv_cache_groups(0, 32) == (32, 0, 1)
    assert (stage.kv_bytes_per_token, stage.window_kv_bytes_per_token) == (131_072, 131_072)
    blocks = int(stage.kv_cache_bytes // 2_097_152)
    assert stage.kv_cache_tokens == int(blocks / 1_281 * 32_768)
    assert stage.kv_cache_tokens == pytest.approx(blocks * 16 * 2048 / 1281, abs=1)
    load = StepLoad(8, 8 * 8192)
    assert stage_kv_bytes_read(stage, load) == (8 * 4096 + 8) * 131_072


@pytest.mark.parametrize(
    ("num_full", "num_window", "groups"),
    [
        (18, 18, (18, 1, 1)),  # gpt-oss-120b
        (10, 50, (10, 1, 5)),  # Gemma-3-style 5:1
        (13, 12, (13, 1, 1)),  # 12 sw + 13 full: padded to 13 (max < 1.5 min)
        (12, 33, (12, 1, 3)),  # Step-3.7: 33 window layers padded to 3 groups of 12
        (36, 0, (36, 1, 0)),
    ],
)
def test_kv_cache_groups_follow_vllm(num_full, num_window, groups):
    """vLLM 0.33.0 _get_kv_cache_groups_uniform_page_size: g = the smaller count, or the
    larger when it is under 1.5x the smaller; each type padded to whole groups of g."""
    assert kv_cache_groups(num_full, num_window) == groups


def test_stage_window_layers_split_in_proportion(model):
    """gpt-oss-120b's 18 of 36 over pp = 4 (9 layers each): floor(9*18/36) = 4, then 9 - 4 = 5,
    13 - 9 = 4, 18 - 13 = 5: 4 + 5 + 4 + 5 = 18."""
    assert stage_window_layer_counts(model("gpt-oss-120b"), [9, 9, 9, 9]) == [4, 5, 4, 5]
    assert stage_window_layer_counts(model("llama-3.1-8b"), [16, 16]) == [0, 0]


def test_window_capped_tokens():
    """count * min(total / count, W), never above the total; no window = the total."""
    assert window_capped_tokens(64 * 1152, 64, 128) == 64 * 128
    assert window_capped_tokens(64 * 100, 64, 128) == 6400
    assert window_capped_tokens(1000, 0, 128) == 1000
    assert window_capped_tokens(1000, 10, None) == 1000


@settings(max_examples=60, deadline=None)
@given(
    window=st.integers(1, 2**17),
    window_share=st.floats(0, 1),
    decode_seqs=st.integers(0, 512),
    mean_context=st.integers(1, 131_072),
    prefill_tokens=st.integers(0, 8192),
    name=st.sampled_from(["gpt-oss-120b", "llama-3.1-8b", "mistral-7b"]),
)
def test_a_window_never_adds_kv_bytes_or_step_time(model, cluster, window, window_share, decode_seqs,
                                                   mean_context, prefill_tokens, name):
    """The same stage with some layers in a window reads no more KV and takes no longer."""
    m, c = _full(model, name), cluster("1x1xH100")
    layout = Layout(1, 1, 1)
    full = stage_memory(m, c, layout, ServeRequest(), max_num_seqs=256)[0]
    windowed = dataclasses.replace(full, num_window_layers=math.floor(window_share * full.num_layers),
                                   sliding_window_tokens=window)
    load = StepLoad(decode_seqs, decode_seqs * mean_context, prefill_tokens,
                    causal_pairs(prefill_tokens, mean_context), 1 if prefill_tokens else 0)
    assert windowed.window_kv_bytes_per_token <= windowed.kv_bytes_per_token
    assert stage_kv_bytes_read(windowed, load) <= stage_kv_bytes_read(full, load)
    placement = place(c, layout)
    # to the last bits of a double: a window equal to the pairs' span prices the same terms summed
    # in another order
    assert (stage_step_time(m, c, layout, placement, windowed, load).seconds
            <= stage_step_time(m, c, layout, placement, full, load).seconds * (1 + 1e-12))


def test_llama4_chunked_layers_are_cached_as_a_window_of_the_chunk():
    """Llama 4 Scout: 36 of 48 layers chunked (all but every fourth), 8,192-token chunks; vLLM
    0.33.0's hybrid KV manager admits min(chunk + in flight, M) tokens a request for them, so only
    the 12 NoPE layers reserve the whole context: Scout plans at its 10.5M-token default on
    2x8 H100, which it had been refused (every layer reserving 10.5M tokens)."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.requests import ServeRequest
    from planner.serve_search import plan_serving

    scout = resolve_model("llama-4-scout")
    assert (scout.num_chunked_layers, scout.num_kv_window_layers, scout.kv_window_tokens) == (36, 36, 8192)
    assert resolve_model("llama-3.1-8b").num_kv_window_layers == 0
    plan = plan_serving(scout, resolve_cluster("2x8xH100"), ServeRequest())
    assert plan.recommended is not None and plan.recommended.max_model_len == scout.max_position_embeddings
    stage = plan.recommended.stages[0]
    assert stage.num_window_layers == stage.num_layers - stage.num_layers // 4


def test_the_longest_context_suggested_for_window_layers_is_the_longest_that_fits():
    """With window layers the KV cache's count at max-model-len M grows with M (a request's window
    blocks are a fixed part of it), so the count at the request's own 1,280 tokens (1,781,026 for
    Llama 4 Scout at tp 8 on 8 H100) had been suggested where about 7.1M fit: the suggestion is
    now the fixed point, which fits, and a little more does not (vLLM's count); under --emit
    sglang it is capped by SGLang's full layers' pool (emit/sglang.full_pool_tokens)."""
    from dataclasses import replace

    from planner.catalog import resolve_cluster, resolve_model
    from planner.requests import LayoutFilter, ServeRequest
    from planner.serve import ServeEstimate, estimate
    from planner.serve_search import longest_fitting_len

    model, cluster = resolve_model("llama-4-scout"), resolve_cluster("1x8xH100")
    request = ServeRequest(input_len=1024, output_len=256, layout=LayoutFilter(tp=8, pp=1, dp=1, ep=1))
    length, layout = longest_fitting_len(model, cluster, request)
    assert 7_000_000 < length < 7_140_655  # the count at the 10.5M context overstates it a little
    assert isinstance(estimate(model, cluster, layout, replace(request, max_model_len=length)), ServeEstimate)
    assert not isinstance(estimate(model, cluster, layout, replace(request, max_model_len=length + 20_000)),
                          ServeEstimate)
    sglang_length, _ = longest_fitting_len(model, cluster, replace(request, pool_engine="sglang"))
    assert sglang_length < length / 3
