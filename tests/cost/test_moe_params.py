"""MoE, mixed dense/MoE layers, MLA and 4-bit float formats: the shipped specs pinned to
their publishers' figures, DeepSeek-V3's attention and KV cache worked by hand.

DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): L=61 (3 dense, 58 MoE), h=7168, a=128,
q_lora_rank r_q=1536, kv_lora_rank r_kv=512, qk_nope 128, qk_rope 64, v_head_dim 128,
256 routed experts (8 per token) + 1 shared, expert FFN 2048, dense FFN 18432, V=129280.
"""

from __future__ import annotations

import pytest

from planner.catalog import resolve_model
from planner.cost.params import (
    attention_params_per_layer,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    layer_weight_bytes_per_gpu,
    linear_bytes_per_weight,
    param_counts,
    weight_bytes,
)
from planner.specs import ModelSpec


@pytest.fixture(scope="module")
def deepseek() -> ModelSpec:
    return resolve_model("deepseek-v3")


@pytest.mark.parametrize(
    ("name", "total", "active", "total_rel", "active_rel"),
    [
        # arXiv:2412.19437 (DeepSeek-V3 technical report), abstract: 671B total, 37B activated
        ("deepseek-v3", 671e9, 37e9, 0.02, 0.05),
        # meta-llama/Llama-4-Scout-17B-16E-Instruct model card: 109B total (vision encoder
        # included; the text model is ~108B), 17B active
        ("llama-4-scout", 109e9, 17e9, 0.02, 0.05),
        # Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated (rounded)
        ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.02, 0.05),
    ],
)
def test_published_sizes(name: str, total: float, active: float, total_rel: float, active_rel: float) -> None:
    counts = param_counts(resolve_model(name))
    assert counts.total == pytest.approx(total, rel=total_rel)
    assert counts.active == pytest.approx(active, rel=active_rel)


def test_gpt_oss_120b_matches_the_model_card() -> None:
    """gpt-oss model card (arXiv:2508.10925) Table 1: 116.83B total, 5.13B active per token,
    counted without the embedding table (the unembedding is counted)."""
    model = resolve_model("gpt-oss-120b")
    counts = param_counts(model)
    assert counts.total == pytest.approx(116.83e9, rel=0.01)
    assert counts.active - counts.embedding == pytest.approx(5.13e9, rel=0.02)


def test_deepseek_v3_mla_attention_by_hand(deepseek: ModelSpec) -> None:
    """q_a 7168*1536 = 11,010,048; q_b 1536*128*(128+64) = 37,748,736;
    kv_a 7168*(512+64) = 4,128,768; kv_b 512*128*(128+128) = 16,777,216;
    o 128*128*7168 = 117,440,512; q_a/kv_a RMSNorms 1536 + 512: 187,107,328."""
    assert attention_params_per_layer(deepseek) == 187_107_328


def test_deepseek_v3_kv_cache_is_the_latent_by_hand(deepseek: ModelSpec) -> None:
    """61 layers x (512 + 64) x 2 bytes = 70,272 bytes per token in bf16; fp8 halves it."""
    assert kv_bytes_per_token(deepseek) == 70_272
    assert kv_bytes_per_token(deepseek, "fp8") == 35_136


@pytest.mark.parametrize("tp", [1, 2, 8, 16])
def test_mla_latent_is_replicated_under_tp(deepseek: ModelSpec, tp: int) -> None:
    assert kv_bytes_per_token_per_gpu(deepseek, 61, tp, "auto") == 70_272


def test_deepseek_v3_dense_layers_and_mtp_apart(deepseek: ModelSpec) -> None:
    """3 dense layers of 3*7168*18432 = 396,361,728 MLP weights each; 58 MoE layers of
    257 experts * 3*7168*2048 = 11,318,329,344 + router 7168*256 = 1,835,008. The MTP module
    (one more MoE block) is reported apart: 671B excludes it (report sec. 2.2)."""
    counts = param_counts(deepseek)
    assert counts.num_dense_layers == 3
    assert counts.dense_mlp_per_layer == 396_361_728
    assert counts.mlp_per_layer == 11_318_329_344 + 1_835_008
    assert 11e9 < counts.mtp < 14e9
    everything_moe = deepseek.model_copy(update={"num_dense_layers": 0, "dense_layer_indices": None})
    assert param_counts(everything_moe).total - counts.total == 3 * (
        counts.mlp_per_layer - counts.dense_mlp_per_layer)


def test_fp4_formats_by_hand() -> None:
    """NVFP4: 4 bits + an E4M3 scale per 16 = 0.5 + 1/16 = 0.5625 bytes per weight.
    MXFP4 (OCP MX v1.0): 4 bits + an E8M0 scale per 32 = 0.5 + 1/32 = 0.53125."""
    model = resolve_model("gpt-oss-120b")
    assert linear_bytes_per_weight(model) == 0.53125
    assert linear_bytes_per_weight(model.model_copy(update={"quantization": "nvfp4"})) == 0.5625


def test_gpt_oss_keeps_attention_in_bf16() -> None:
    """Its checkpoint leaves self_attn, the router, embeddings and head unconverted
    (modules_to_not_convert): only the experts are MXFP4. The model card gives the
    checkpoint as 60.8 GiB = 65.3 GB."""
    model = resolve_model("gpt-oss-120b")
    everything = model.model_copy(update={"quantization_scope": "all"})
    assert weight_bytes(everything) < weight_bytes(model)
    assert weight_bytes(model) == pytest.approx(65.3e9, rel=0.1)


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b", "llama-4-scout"])
def test_per_gpu_layers_cover_the_model(name: str) -> None:
    """TP ranks together hold at least the mean block (replicated MLA down-projections or
    KV heads only add), and the mean block times L is every block's weights."""
    model = resolve_model(name)
    whole = layer_weight_bytes_per_gpu(model, 1)
    for tp in (2, 4, 8):
        assert layer_weight_bytes_per_gpu(model, tp) < whole
        assert tp * layer_weight_bytes_per_gpu(model, tp) >= whole * (1 - 1e-12)


def test_deepseek_v32_kv_adds_the_indexer_key_by_hand() -> None:
    """DeepSeek-V3.2 (DSA, index_head_dim 128): per layer the bf16 latent (512 + 64) * 2 =
    1,152 B plus the fp8 indexer key 128 + 128/128 * 4 = 132 B: 61 * 1,284 = 78,324 B."""
    from pathlib import Path

    folder = Path(__file__).parents[1] / "fixtures" / "hf_configs" / "deepseek-ai--DeepSeek-V3.2"
    model = resolve_model(str(folder / "config.json"))
    assert kv_bytes_per_token(model) == 78_324
    assert param_counts(model).total == pytest.approx(671e9 + 61 * 14e6, rel=0.002)


def test_deepseek_v32_fp8_cache_on_hopper_is_deepseeks_656_byte_layout() -> None:
    """vLLM 0.33.0 serves DSA's fp8 cache on Hopper through FLASHMLA_SPARSE as fp8_ds_mla: the
    512 latent values in fp8 (512 B), an fp32 scale per 128 of them (4 * 4 = 16 B) and the 64
    RoPE values in bf16 (128 B): 656 B, plus the indexer's 132 B: 61 * 788 = 48,068 B a token.
    On Blackwell FLASHINFER_MLA_SPARSE keeps plain fp8: 61 * (576 + 132) = 43,188 B. A model
    without DSA (DeepSeek-V3) keeps plain fp8 on Hopper too: 61 * 576 = 35,136 B."""
    from pathlib import Path

    from planner.catalog import resolve_gpu
    from planner.cost.params import FP8_DS_MLA, kv_cache_format

    folder = Path(__file__).parents[1] / "fixtures" / "hf_configs" / "deepseek-ai--DeepSeek-V3.2"
    model = resolve_model(str(folder / "config.json"))
    hopper, blackwell = resolve_gpu("H100"), resolve_gpu("B200")
    assert kv_cache_format(model, hopper, "fp8") == FP8_DS_MLA
    assert kv_bytes_per_token(model, kv_cache_format(model, hopper, "fp8")) == 48_068
    assert kv_bytes_per_token(model, kv_cache_format(model, blackwell, "fp8")) == 43_188
    assert kv_cache_format(model, hopper, "auto") == "auto"
    v3 = resolve_model("deepseek-v3")
    assert kv_bytes_per_token(v3, kv_cache_format(v3, hopper, "fp8")) == 35_136
