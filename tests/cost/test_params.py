"""Parameter counts, weight bytes and KV bytes, pinned to published sizes and to
arithmetic worked by hand in each docstring.

Llama-3.1-70B shape used throughout: L=80, h=8192, a=64 heads, k=8 KV heads, d=128,
f=28672 (SwiGLU), V=128256, untied. Per layer:
  Q = O = h*a*d = 8192*64*128 = 67,108,864
  K + V = 2*h*k*d = 2*8192*8*128 = 16,777,216
  MLP = 3*h*f = 3*8192*28672 = 704,643,072
  matmul weights = 2*67,108,864 + 16,777,216 + 704,643,072 = 855,638,016
  norms (2 RMSNorms) = 2*8192 = 16,384
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.catalog import resolve_model
from planner.cost.params import (
    kv_bytes_per_token,
    kv_heads_per_gpu,
    layer_weight_bytes_per_gpu,
    param_counts,
    weight_bytes,
)
from planner.specs import ModelSpec

LLAMA70_LINEAR_PER_LAYER = 855_638_016
LLAMA70_NORMS_PER_LAYER = 16_384


@pytest.fixture(scope="module")
def llama70b() -> ModelSpec:
    return resolve_model("llama-3.1-70b")


# --- published sizes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "published_total", "published_active"),
    [
        ("llama-3.1-8b", 8.03e9, None),  # Meta model card
        ("llama-3.1-70b", 70.6e9, None),  # Meta model card
        ("llama-3.1-405b", 405.9e9, None),  # Meta model card
        ("llama-3.1-70b-fp8", 70.6e9, None),  # quantization changes bytes, not counts
        ("llama-3.1-70b-awq", 70.6e9, None),
        ("llama-2-70b", 69.0e9, None),  # Touvron et al. 2023 / HF safetensors total
        ("llama-2-7b", 6.74e9, None),  # HF safetensors total of meta-llama/Llama-2-7b-hf (6,738,415,616)
        ("llama-2-13b", 13.0e9, None),  # HF safetensors total of meta-llama/Llama-2-13b-hf (13,015,864,320)
        ("nemotron-4-340b", 341.0e9, None),  # NVIDIA et al. 2024: 340B; 96 x 3.4546e9 per layer + 2 x 256,000 x 18,432
        ("qwen2.5-72b", 72.7e9, None),  # Qwen2.5 model card
        ("mistral-7b", 7.25e9, None),  # HF safetensors total of Mistral-7B-v0.1
        ("mixtral-8x7b", 46.7e9, 12.9e9),  # Mistral AI: 46.7B total, 12.9B active
        ("mixtral-8x22b", 141e9, 39e9),  # Mistral AI, "Cheaper, Better, Faster, Stronger" (2024)
        ("qwen3-235b-a22b", 235e9, 22e9),  # Qwen/Qwen3-235B-A22B model card; arXiv:2505.09388
        ("gpt3-175b", 175e9, None),  # Brown et al. 2020
    ],
)
def test_param_counts_match_published_sizes_within_one_percent(
    name: str, published_total: float, published_active: float | None
) -> None:
    counts = param_counts(resolve_model(name))
    assert counts.total == pytest.approx(published_total, rel=0.01)
    expected_active = published_total if published_active is None else published_active
    assert counts.active == pytest.approx(expected_active, rel=0.01)


def test_llama70b_param_count_exact(llama70b: ModelSpec) -> None:
    """80 * (855,638,016 + 16,384) = 68,452,352,000 in the blocks;
    embedding + untied head = 2 * 128256 * 8192 = 2,101,346,304; final norm 8192.
    Total = 70,553,706,496 (the model card's 70.6B)."""
    assert param_counts(llama70b).total == 70_553_706_496


def _gpt(
    num_layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048
) -> ModelSpec:
    """A Megatron GPT block: LayerNorm, biases everywhere, learned positions, 4h MLP, tied."""
    return ModelSpec(
        name=f"gpt-L{num_layers}-h{hidden}",
        num_hidden_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        gated_mlp=False,
        attention_bias=True,
        mlp_bias=True,
        norm_type="layernorm",
        position_embedding="learned",
        vocab_size=vocab,
        max_position_embeddings=seq,
        tie_word_embeddings=True,
        dtype="float16",
    )


def _narayanan_eq2(num_layers: int, hidden: int, vocab: int = 51200, seq: int = 2048) -> int:
    """Narayanan et al. 2021 eq. 2: P = 12*L*h^2 * (1 + 13/(12h) + (V+s)/(12*L*h)),
    expanded to integers: 12*L*h^2 + 13*L*h + (V+s)*h."""
    return 12 * num_layers * hidden**2 + 13 * num_layers * hidden + (vocab + seq) * hidden


def test_gpt3_175b_matches_narayanan_eq2() -> None:
    """L=96, h=12288, V=51200, s=2048:
    12*96*12288^2 = 173,946,175,488; 13*96*12288 = 15,335,424; (51200+2048)*12288 = 654,311,424;
    eq. 2 = 174,615,822,336. Our count adds the final LayerNorm (2h = 24,576), which eq. 2
    leaves out: 174,615,846,912 (Brown et al. call it 175B)."""
    model = _gpt(96, 12288, 96)
    eq2 = _narayanan_eq2(96, 12288)
    assert eq2 == 174_615_822_336
    counts = param_counts(model)
    assert counts.total - eq2 == 2 * 12288
    assert counts.total == pytest.approx(175e9, rel=0.01)
    assert param_counts(resolve_model("gpt3-175b")).total == counts.total


@pytest.mark.parametrize(
    ("num_layers", "hidden", "heads", "published"),
    [
        # Narayanan et al. 2021 Table 1 (V=51200, s=2048): rows the paper prints.
        (24, 2304, 24, 1.7e9),
        (36, 4096, 32, 7.5e9),
        (48, 8192, 64, 39.1e9),
        (80, 12288, 96, 145.6e9),
        (96, 16384, 128, 310.1e9),
        (128, 25600, 160, 1008.0e9),
    ],
)
def test_narayanan_table1_rows(num_layers: int, hidden: int, heads: int, published: float) -> None:
    """E.g. the 145.6B row, L=80, h=12288: 12*80*12288^2 = 144,955,146,240;
    13*80*12288 = 12,779,520; 53248*12288 = 654,311,424; eq. 2 = 145,622,237,184 (145.6B).
    The 1T row, L=128, h=25600: 12*128*25600^2 = 1,006,632,960,000; 13*128*25600 = 42,598,400;
    53248*25600 = 1,363,148,800; eq. 2 = 1,008,038,707,200 (1008.0B).
    The table prints one decimal, so the check is half a unit of that digit (0.05B): the
    1.7B row, L=24, h=2304, is 1,652,226,048 by eq. 2 (2.8% below the rounded 1.7)."""
    counts = param_counts(_gpt(num_layers, hidden, heads))
    assert counts.total - _narayanan_eq2(num_layers, hidden) == 2 * hidden  # final LayerNorm
    assert abs(counts.total - published) <= 0.05e9


def test_narayanan_worked_rows_exact() -> None:
    """The two rows worked in the docstring above, to the parameter."""
    assert _narayanan_eq2(80, 12288) == 145_622_237_184
    assert _narayanan_eq2(128, 25600) == 1_008_038_707_200


def test_mixtral_active_counts_two_of_eight_experts() -> None:
    """Mixtral-8x7B: h=4096, f=14336, L=32. One expert = 3*4096*14336 = 176,160,768.
    Total - active = L * (8 - 2) experts = 32 * 6 * 176,160,768 = 33,822,867,456."""
    counts = param_counts(resolve_model("mixtral-8x7b"))
    assert counts.total - counts.active == 33_822_867_456


# --- KV cache ----------------------------------------------------------------------------


def test_kv_bytes_per_token_llama70b(llama70b: ModelSpec) -> None:
    """2 (K and V) * L 80 * k 8 * d 128 * 2 bytes (bf16) = 327,680 B = 320 KiB per token."""
    assert kv_bytes_per_token(llama70b) == 327_680


def test_kv_bytes_per_token_fp8_halves_it(llama70b: ModelSpec) -> None:
    """2 * 80 * 8 * 128 * 1 byte = 163,840 B."""
    assert kv_bytes_per_token(llama70b, kv_cache_dtype="fp8") == 163_840


def test_kv_bytes_per_token_llama8b_and_gpt3() -> None:
    """Llama-3.1-8B: 2 * 32 * 8 * 128 * 2 = 131,072 B.
    GPT-3 175B (MHA, fp16): 2 * 96 * 96 * 128 * 2 = 4,718,592 B."""
    assert kv_bytes_per_token(resolve_model("llama-3.1-8b")) == 131_072
    assert kv_bytes_per_token(resolve_model("gpt3-175b")) == 4_718_592


@pytest.mark.parametrize(("tp", "expected"), [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1), (32, 1)])
def test_kv_heads_per_gpu_split_then_replicated(
    llama70b: ModelSpec, tp: int, expected: int
) -> None:
    """k = 8 KV heads: split k/t while t <= k (8, 4, 2, 1); for t > k each GPU keeps one
    replicated head (vLLM), so tp=16 and tp=32 still hold 1."""
    assert kv_heads_per_gpu(llama70b, tp) == expected


# --- weight bytes ----------------------------------------------------------------------


def test_weight_bytes_bf16(llama70b: ModelSpec) -> None:
    """70,553,706,496 parameters * 2 bytes = 141,107,412,992 B (131.4 GiB)."""
    assert weight_bytes(llama70b) == 141_107_412_992


def test_weight_bytes_fp8() -> None:
    """Block matmuls 80 * 855,638,016 = 68,451,041,280 weights at 1 byte plus one fp32 scale
    per output channel (4/h per weight): 68,451,041,280 * (1 + 4/8192) = 68,484,464,640 B.
    The rest (embeddings 2,101,346,304 + norms 1,318,912 = 2,102,665,216) stays bf16:
    4,205,330,432 B. Total 72,689,795,072 B."""
    assert weight_bytes(resolve_model("llama-3.1-70b-fp8")) == pytest.approx(72_689_795_072)


def test_weight_bytes_int4_with_group_scales() -> None:
    """AWQ int4, group 128: 0.5 B per weight + (2 B fp16 scale + 0.5 B packed zero) / 128
    = 0.51953125 B = 66.5/128. 68,451,041,280 / 128 * 66.5 = 35,562,455,040 B, plus the
    bf16 rest 4,205,330,432 B: 39,767,785,472 B (37.0 GiB)."""
    assert weight_bytes(resolve_model("llama-3.1-70b-awq")) == pytest.approx(39_767_785_472)


def test_int4_group_size_changes_scale_overhead(llama70b: ModelSpec) -> None:
    """Group 64 doubles the scale bytes: 0.5 + 2.5/64 = 0.5390625 B per weight,
    68,451,041,280 / 64 * 34.5 = 36,899,389,440, + 4,205,330,432 = 41,104,719,872 B."""
    model = llama70b.model_copy(update={"quantization": "int4", "quantization_group_size": 64})
    assert weight_bytes(model) == pytest.approx(41_104_719_872)


@pytest.mark.parametrize(
    ("tp", "expected"),
    [
        # (855,638,016 weights) * 2 + norms 16,384 * 2 = 1,711,276,032 + 32,768
        (1, 1_711_308_800),
        # (855,638,016 - 16,777,216 KV) / 2 + 2*8192*4*128 = 419,430,400 + 8,388,608
        # = 427,819,008 weights -> 855,638,016 B + 32,768
        (2, 855_670_784),
        # 838,860,800 / 8 + 2*8192*1*128 = 104,857,600 + 2,097,152 = 106,954,752 weights
        # -> 213,909,504 B + 32,768
        (8, 213_942_272),
        # 838,860,800 / 16 + 2,097,152 (one KV head replicated per GPU) = 54,525,952 weights
        # -> 109,051,904 B + 32,768
        (16, 109_084_672),
    ],
)
def test_layer_weight_bytes_per_gpu_llama70b(llama70b: ModelSpec, tp: int, expected: int) -> None:
    """Matmuls split t ways except the KV projections, which hold max(1, k/t) heads per GPU;
    both RMSNorms (2*8192 bf16) are whole on every GPU. Arithmetic per case above."""
    assert layer_weight_bytes_per_gpu(llama70b, tp) == pytest.approx(expected)


def test_layer_weight_bytes_at_tp16_exceed_an_even_split(llama70b: ModelSpec) -> None:
    """Even split would be 855,638,016 / 16 = 53,477,376 weights; replication keeps 54,525,952."""
    even_split_bytes = LLAMA70_LINEAR_PER_LAYER / 16 * 2 + LLAMA70_NORMS_PER_LAYER * 2
    assert layer_weight_bytes_per_gpu(llama70b, 16) > even_split_bytes


# --- properties ------------------------------------------------------------------------


@st.composite
def models(draw: st.DrawFn) -> ModelSpec:
    num_kv_heads = draw(st.sampled_from([1, 2, 4, 8, 16]))
    num_heads = num_kv_heads * draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([64, 80, 128]))
    return ModelSpec(
        name="generated",
        num_hidden_layers=draw(st.integers(1, 128)),
        hidden_size=num_heads * head_dim,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=draw(st.integers(1, 65536)),
        gated_mlp=draw(st.booleans()),
        vocab_size=draw(st.integers(1, 256_000)),
        max_position_embeddings=4096,
        dtype=draw(st.sampled_from(["float32", "float16", "bfloat16"])),
        quantization=draw(st.sampled_from([None, "fp8", "int8", "int4"])),
        # int4 groups must tile the hidden size (ModelSpec.int4_group_problem): 128 or its
        # largest divisor that does
        quantization_group_size=math.gcd(num_heads * head_dim, 128),
    )


@given(model=models(), tp=st.integers(1, 256))
def test_layer_weight_bytes_per_gpu_never_grow_with_tp(model: ModelSpec, tp: int) -> None:
    assert layer_weight_bytes_per_gpu(model, tp + 1) <= layer_weight_bytes_per_gpu(model, tp)


@given(model=models(), tp=st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
def test_layer_weight_bytes_per_gpu_times_tp_cover_the_layer(model: ModelSpec, tp: int) -> None:
    """A TP group holds at least the whole layer (replication and whole norms only add)."""
    whole = layer_weight_bytes_per_gpu(model, 1)
    assert tp * layer_weight_bytes_per_gpu(model, tp) >= whole * (1 - 1e-12)


@given(model=models())
def test_quantization_never_adds_bytes(model: ModelSpec) -> None:
    """fp8/int8 < bf16/fp16 < fp32 per matmul weight, so quantized weights are smaller."""
    unquantized = model.model_copy(update={"quantization": None})
    assert weight_bytes(model) <= weight_bytes(unquantized)
