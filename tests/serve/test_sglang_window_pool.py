"""SGLang's KV pools for a model with window layers (sliding-window or Llama 4's chunked ones),
read from SGLang 0.5.23's source: for the architectures it lists (is_hybrid_swa_model) the full
layers' pool keeps every token of a request and the window layers' pool, r times as many tokens
(--swa-full-tokens-ratio, 0.8 unless set), keeps what each request's prefix-cache lock and its
own window hold; for any other architecture every layer keeps the whole context. The plan sizes
r to its sequences and emits it. Hand-worked against a pool fixed at 10 GiB."""

from __future__ import annotations

from dataclasses import replace

import pytest

import planner.emit.sglang as sglang
from planner.emit.command import ServeArgs
from planner.engines import EngineVersions

POOL = 10 * 2**30  # 10,737,418,240 B of KV pool per GPU, fixed for the arithmetic


@pytest.fixture(autouse=True)
def fixed_pool(monkeypatch):
    monkeypatch.setattr(sglang, "kv_pool_bytes", lambda a: POOL)


# Llama 4 Scout at tp 8: 12 full-attention layers and 36 chunked ones, 1 KV head a GPU of 128 x (K, V)
# x 2 B = 512 B a layer and token: B_f = 12 x 512 = 6,144 B, B_s = 36 x 512 = 18,432 B; window 8,192
SCOUT = ServeArgs(model="M", tp=8, pp=1, dp=1, gpus_per_node=8, gpu_memory_utilization=0.9, max_model_len=131072,
                  max_num_seqs=1024, quantization=None, kv_cache_dtype="auto", dtype="bfloat16",
                  engine_versions=EngineVersions(), max_num_batched_tokens=None, gpu_memory_bytes=80 * 2**30,
                  weights_and_kv_bytes_per_gpu=60 * 2**30, kv_bytes_per_sequence=1.0,
                  kv_window_bytes_per_token=18432, kv_full_bytes_per_token=6144, kv_window_tokens=8192,
                  prompt_tokens=32768, output_tokens=1024, context_tokens=32768 + 1024 / 2,
                  architecture="Llama4ForConditionalGeneration")


def test_the_prompt_chunks_a_lock_keeps_by_hand():
    # 0.5.10.post1: the lock walks back from the prompt's last chunk (a radix-tree node) until it
    # spans the window, whole chunks
    assert sglang.locked_prompt_tokens(1024, 128, 8192, trimmed=False) == 1024  # one chunk, all of it
    assert sglang.locked_prompt_tokens(32768, 8192, 8192, trimmed=False) == 8192  # four chunks: the last
    assert sglang.locked_prompt_tokens(20000, 8192, 8192, trimmed=False) == 3616 + 8192  # 20,000 - 2 x 8,192
    assert sglang.locked_prompt_tokens(100, 8192, 8192, trimmed=False) == 100
    # 0.5.23 trims the leaf to one window: the window, or a short last chunk and the window before it
    assert sglang.locked_prompt_tokens(1024, 128, 8192) == 128
    assert sglang.locked_prompt_tokens(32768, 8192, 8192) == 8192
    assert sglang.locked_prompt_tokens(20000, 8192, 8192) == 3616 + 8192
    assert sglang.locked_prompt_tokens(100, 8192, 8192) == 100


def test_the_ratio_and_the_sequences_of_a_hybrid_pool_by_hand():
    # an 80 GB GPU chunks prompts at 8,192 (GRAPH_TIERS_GIB); two chunks in flight: X = 16,384
    assert sglang.chunked_prefill_size(SCOUT) == 8192 and sglang.swa_reserve_tokens(SCOUT) == 16384
    # S = 8,192 locked + min(1,024 / 2, 8,192 + 128 / 2) = 8,704; F = 33,280
    assert sglang.swa_held_tokens(SCOUT) == 8704
    # r = (S/F + X B_f / P) / (1 - X B_s / P) = (0.2615385 + 0.009375) / (1 - 0.028125) = 0.278755 -> 0.28
    assert sglang.swa_full_tokens_ratio(SCOUT) == 0.28
    # T = P / (6,144 + 0.28 x 18,432) = 10,737,418,240 / 11,304.96 = 949,797 tokens a full layer
    assert sglang.full_pool_tokens(SCOUT) == pytest.approx(949_797.3, abs=1)
    # N = min(T / F, (0.28 T - X) / S) = min(28.540, (265,943.2 - 16,384) / 8,704 = 28.672)
    assert sglang.pool_sequences(SCOUT) == pytest.approx(949_797.3 / 33_280, rel=1e-6)
    assert sglang.max_running_requests(SCOUT) == 28
    flags = sglang.server_flags(SCOUT, 1)
    assert flags[flags.index("--swa-full-tokens-ratio") + 1] == "0.28"


def test_the_emitted_ratio_runs_more_than_sglangs_default():
    # at 0.8 the window pool is mostly idle: T = P / (6,144 + 14,745.6) = 514,017, N = T / F = 15.4
    default = 0.8
    tokens = POOL / (6144 + default * 18432)
    at_default = min(tokens / 33280, (default * tokens - 16384) / 8704)
    assert at_default == pytest.approx(15.45, abs=0.01)
    assert sglang.pool_sequences(SCOUT) > 1.8 * at_default


def test_an_architecture_sglang_does_not_list_keeps_every_token_in_every_layer():
    other = replace(SCOUT, architecture="Gemma3ForCausalLM")
    assert sglang.swa_full_tokens_ratio(other) is None
    assert "--swa-full-tokens-ratio" not in sglang.server_flags(other, 1)
    # N = P / ((B_f + B_s) F) = 10,737,418,240 / (24,576 x 33,280) = 13.13
    assert sglang.pool_sequences(other) == pytest.approx(13.128, abs=0.001)
    assert sglang.full_pool_tokens(other) == POOL / 24576


def test_the_older_release_frees_a_window_of_decode_at_a_time():
    # 0.5.10.post1 evicts every window's worth of decode steps, so a request holds up to 2 W there
    long = replace(SCOUT, output_tokens=20000, context_tokens=32768 + 10000)
    assert sglang.swa_held_tokens(long) == 8192 + min(10000, 8192 + 64)
    older = replace(long, engine_versions=EngineVersions(sglang="0.5.10.post1"))
    assert sglang.swa_held_tokens(older) == 8192 + min(10000, 8192 + 4096)


def test_short_requests_hold_their_whole_context_in_both_pools():
    # 1,024 prompt tokens in one chunk, 256 out: S = F = 1,152, so r = 1 (both pools alike)
    short = replace(SCOUT, prompt_tokens=1024, output_tokens=256, context_tokens=1152)
    assert sglang.swa_held_tokens(short) == 1152
    assert sglang.swa_full_tokens_ratio(short) == 1.0
    # N = (T - X) / F with T = P / 24,576 = 436,907: (436,906.7 - 16,384) / 1,152 = 365.0
    assert sglang.pool_sequences(short) == pytest.approx((POOL / 24576 - 16384) / 1152, rel=1e-9)


def test_a_context_longer_than_the_full_pool_is_refused():
    # Scout's 10,485,760-token context cannot start: T = 949,797 at the plan's ratio
    refused = sglang.pool_refusal(replace(SCOUT, max_model_len=10_485_760))
    assert refused is not None and "949,797 tokens" in refused and "--max-model-len 949,796" in refused
    assert sglang.pool_refusal(SCOUT) is None


def test_a_dp_attention_server_chunks_prompts_per_rank():
    # SGLang divides --chunked-prefill-size over its DP-attention ranks: 16 ranks of a 131,072 flag
    # chunk 8,192 each, so a rank's reserve is 2 x 8,192, not 2 x 131,072
    server = replace(SCOUT, max_num_batched_tokens=131072, ranks_per_server=16, max_num_seqs=16 * 1024)
    assert sglang.chunked_prefill_size(server) == 8192 and sglang.swa_reserve_tokens(server) == 16384
    assert sglang.pool_sequences(server) == pytest.approx(sglang.pool_sequences(SCOUT))
    assert sglang.max_running_requests(server) == 456  # floor(16 x 28.540)


def test_a_decode_server_sizes_its_window_pool_from_its_requests():
    # 0.5.23 without the radix cache (a disaggregated decode server) sizes the window pool from
    # --max-running-requests (SWARequestCapPoolConfigurator): w = 8,192 + 128 + 2 = 8,322 window tokens a
    # request, F = 33,280 full ones: 8,322 x 18,432 + 33,280 x 6,144 = 357,863,424 B, N = 30.0;
    # at most 32 a worker take two more windows each (8,193 x 18,432 x 2 = 302,026,752 B): N = 16.27
    decode = replace(SCOUT, radix_cache=False)
    assert sglang.request_capped_pool(decode) and sglang.swa_full_tokens_ratio(decode) is None
    assert sglang.pool_sequences(decode) == pytest.approx(POOL / (357_863_424 + 302_026_752), rel=1e-9)
    assert "--swa-full-tokens-ratio" not in sglang.server_flags(decode, 1)
    # 0.5.10.post1 keeps the ratio there; a request frees its own prompt's window tokens (no lock):
    # S = W + W/2 = 12,288, no prompt chunks in flight
    older = replace(decode, engine_versions=EngineVersions(sglang="0.5.10.post1"))
    assert not sglang.request_capped_pool(older)
    assert sglang.swa_held_tokens(older) == 8192 + 4096 and sglang.swa_reserve_tokens(older) == 0
    # r = S / F = 12,288 / 33,280 = 0.3692 -> 0.37
    assert sglang.swa_full_tokens_ratio(older) == 0.37
